#!/usr/bin/env bash
# The checks a lent GPU runs, prepared so that each fits one device call (under 10 minutes):
#   bash tools/probes/gpu_session.sh first        # the Llama slice's two sides, then the suite
#   bash tools/probes/gpu_session.sh first-fused  # the same with the --fused-loss side too
#   bash tools/probes/gpu_session.sh fused-suite  # the --fused-loss side alone, the whole suite
#                                                 # to its end, its failures again (590 s)
#   bash tools/probes/gpu_session.sh again        # the last suite's failures, alone
#   bash tools/probes/gpu_session.sh all          # the speed runs below in one call
#   bash tools/probes/gpu_session.sh fp8-sides    # the FP8 and fused-loss sides
#   bash tools/probes/gpu_session.sh llama-fused  # the Llama slice: compiled, the reference
#                                                 # and the fused loss in one run (250 s)
#   bash tools/probes/gpu_session.sh checks       # fp8, then the GPU machine's failing tests
#   bash tools/probes/gpu_session.sh fp8          # _scaled_mm against the CPU emulation
#   bash tools/probes/gpu_session.sh speed-gpt2   # bench.gpu, GPT-2 124M at 16 and 8 x 1024
#   bash tools/probes/gpu_session.sh speed-llama  # bench.gpu, the Llama 3 8B 8-layer slice
#   bash tools/probes/gpu_session.sh shared       # every axis on ranks sharing the GPU
#   bash tools/probes/gpu_session.sh peak         # what is alive at the Llama slice's peak
#   bash tools/probes/gpu_session.sh peak-eager   # and at the eager GPT-2 step's (8 x 1024)
#   bash tools/probes/gpu_session.sh parts        # kernels by class, Llama slice and GPT-2 8K
#                                                 # (planner_parts reads them)
#   bash tools/probes/gpu_session.sh host         # the host's time and kernels a block, eager
#                                                 # and compiled (LAYER_KERNELS, the constant)
#   bash tools/probes/gpu_session.sh kernels      # the CUDA master step, the Llama slice and
#                                                 # GPT-2 at 8 x 1024 beside the reference
#                                                 # (under 590 s: the last part gets the rest)
#   bash tools/probes/gpu_session.sh eager-parts  # the eager step's kernels by class, GPT-2
#   bash tools/probes/gpu_session.sh suite        # the whole suite, each outcome logged as it ends
#   bash tools/probes/gpu_session.sh autocast     # GPT-2 16 x 1024 under autocast-bf16 beside the
#                                                 # reference, kernel by kernel (its 0.92x)
# Output goes to $OUT (the device tool brings back at most 8 files); copy it into docs/gpu/
# with the command that made it. bench.gpu's "reference fp8" side needs torchao, which the
# GPU image lacks: before the call, here, `echo /.whl/ >> .git/info/exclude; python3 -m pip
# download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_28_x86_64 -d .whl torchao==0.18.0`, and name `.whl` in the call's
# carry; this script installs what it finds there.
set -o pipefail
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
log=$out/session.log  # every part's output, in order; each bench part's json beside it
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv | tee -a "$log"
bench() {  # bench() SECONDS NAME RUNS [SIDES]: one bench.gpu part, its json kept as NAME.json
  # (a warm machine keeps /tmp: a part that writes nothing must not return an earlier call's)
  rm -rf "/tmp/$2"
  timeout "$1" python3 -m bench.gpu --runs "$3" ${4:+--sides "$4"} --out "/tmp/$2" 2>&1 \
    | tee -a "$log"
  cp "/tmp/$2/gpu-step.json" "$out/$2.json" 2>/dev/null || true
}
hidden_gpus() {  # the forked CPU-rank tests that failed on a GPU machine, and the CUDA ones
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_packing.py \
    tests/test_tp_loss.py tests/test_harness.py 2>&1 | tee -a "$log"
}
suite() {  # suite() SECONDS: the whole suite, each outcome logged as it ends; SIGINT at the
  # limit prints the summary (-n 8: 97% of it in 350 s on a 16-core H100 machine). A file to
  # a worker, in conftest's order: xdist's default gives the first 65 tests, the slowest
  # files, all to one worker at -n 8 (on the third H200 run it ran them to 94% of the run).
  # Under torch 2.11 (the image's) a worker that traced can no longer fork ranks that run
  # autograd; the harness then starts them from the rank server (dist/testing.py).
  : > /tmp/suite.log  # this suite's outcomes alone (`again` reads them)
  timeout -s INT -k 20 "$1" python3 -m pytest -v -p no:cacheprovider -n 8 --dist loadfile \
    --no-loadscope-reorder --durations=15 -rfE tests 2>&1 | tee -a "$log" /tmp/suite.log
}
case ${1:-} in
  first)  # one call (about 510 s on an H100): the Llama slice, paraxis --compile beside the
    # reference (speed and peak memory), alone on the fresh machine; then the whole suite
    bench 200 llama 2 1,3
    suite 330 ;;
  first-fused)  # as first, with the --fused-loss side after the two (about 580 s)
    bench 250 llama 2 1,3,6
    suite 315 ;;
  fused-suite)  # one call of at most 590 s: the fused loss's peak on the fresh machine, then
    # the whole suite with the time it needs (it reached 97% in 350 s on the fourth H100 run),
    # then its failures again alone with whatever time is left
    bench 110 llama 2 6
    suite $(( 560 - SECONDS ))
    left=$(( 585 - SECONDS ))
    if (( left > 20 )); then
      grep -oE '\] (FAILED|ERROR) tests/[^ ]+' /tmp/suite.log | cut -d' ' -f3 | sort -u \
        | xargs -r timeout "$left" python3 -m pytest -q -p no:cacheprovider -n 4 -rfE 2>&1 \
        | tee -a "$log"
    fi ;;
  again)  # the tests the last suite failed, again and alone, each with its output
    # each outcome line of -v (the summary may be missing: a SIGINT can end xdist without it)
    grep -oE '\] (FAILED|ERROR) tests/[^ ]+' /tmp/suite.log | cut -d' ' -f3 | sort -u \
      | xargs -r timeout "${2:-150}" python3 -m pytest -q -p no:cacheprovider -n 4 -rfE 2>&1 \
      | tee -a "$log" ;;
  all)  # the speed runs first and alone: nothing else has run on the machine yet but the
    # masters' one-pass step on CUDA, which every bf16 paraxis side needs (in a spawned
    # rank: the suite's processes see no GPU); the last part gets what the call has left
    # each: eager, compiled, the reference, compiled under autocast-bf16 (fp32 state)
    timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/test_master_step.py \
      -k cuda 2>&1 | tee -a "$log"
    bench 150 gpt2 0 0,1,3,7         # GPT-2 124M at 16 x 1024
    bench 260 llama 2 0,1,3,7        # the Llama slice (8 layers of Llama 3 8B) at 2 x 4096
    bench $(( 588 - SECONDS )) gpt2-8 1 0,1,3,7 ;;  # GPT-2 124M at 8 x 1024
  llama-fused) bench 250 llama 2 1,3,6 ;;
  fp8-sides)  # both FP8 sides and the fused loss, as the second H200 run measured them
    bench 260 llama 2 6,2,5
    bench 150 gpt2-fp8 0 6,2,5 ;;
  checks)  # the FP8 GEMMs and the tests that failed on a GPU machine before
    timeout 120 python3 -m tools.probes.fp8_cuda 2>&1 | tee -a "$log"
    hidden_gpus 300 ;;
  fp8) timeout 570 python3 -m tools.probes.fp8_cuda 2>&1 | tee -a "$log" ;;
  shared)  # --share-gpu: the staged collectives on CUDA tensors, then every axis's run
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_shared_gpu.py 2>&1 \
      | tee -a "$log"
    timeout 420 python3 -m tools.probes.shared_gpu 2>&1 | tee -a "$log" ;;
  speed-gpt2) bench 570 gpt2 0,1 ;;
  speed-llama) bench 570 llama 2 ;;
  peak) timeout 540 python3 -m tools.probes.peak_memory 2>&1 | tee -a "$log" ;;
  peak-eager)  # 504 MB over the planner's on the fifth H200 run; compiled beside it
    timeout 300 python3 -m tools.probes.peak_memory --model gpt2-124m --batch 8 --seq 1024 \
      --sides "paraxis bf16 eager,paraxis bf16" 2>&1 | tee -a "$log" ;;
  parts)  # the compiled step's kernels by name, for the planner's parts (at most 380 s)
    for run in 2 1; do
      rm -rf "/tmp/parts-$run" && mkdir -p "/tmp/parts-$run"
      timeout $(( run == 2 ? 260 : 120 )) python3 -m tools.probes.gpu_sides_profile \
        --run "$run" --out "/tmp/parts-$run" 2>&1 | tee -a "$log"
      cp "/tmp/parts-$run/gpu-sides-profile.json" "$out/sides-profile-run$run.json" || true
    done ;;
  host)  # the host's seconds a kernel and a block, on steps too small for the GPU to
    # matter, each model at its depth and at half (140 s at one depth on the fourth H200 run)
    timeout 300 python3 -m tools.probes.host_per_kernel 2>&1 | tee -a "$log" ;;
  kernels)  # the masters' one-pass step on CUDA, then the runs it changes: the Llama
    # slice (its optimizer step 16 bytes a parameter lighter) and GPT-2 at 8 x 1024 (196
    # copy kernels a step fewer: 976 against the reference's 702 on the fifth H200 run)
    timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/test_master_step.py \
      tests/test_kernels.py -k "cuda or gpu" 2>&1 | tee -a "$log"
    bench 220 llama 2 1,3
    bench $(( 588 - SECONDS )) gpt2-8 1 0,1,3 ;;
  eager-parts)  # the eager step's kernels by name, GPT-2 at 8 and 16 x 1024: the planner
    # prices its GPU time 27% low at 16 x 1024 once the host is priced as measured
    for run in 1 0; do
      rm -rf "/tmp/eager-$run" && mkdir -p "/tmp/eager-$run"
      timeout 120 python3 -m tools.probes.gpu_sides_profile --run "$run" --sides paraxis \
        --out "/tmp/eager-$run" 2>&1 | tee -a "$log"
      cp "/tmp/eager-$run/gpu-sides-profile.json" "$out/eager-profile-run$run.json" || true
    done ;;
  suite) suite 560 ;;
  autocast)  # the side at 0.92x of the reference on GPT-2 at 16 x 1024, never profiled
    rm -rf /tmp/autocast && mkdir -p /tmp/autocast
    timeout 200 python3 -m tools.probes.gpu_sides_profile --run 0 --out /tmp/autocast \
      --sides "paraxis autocast-bf16 --compile,reference" 2>&1 | tee -a "$log"
    cp /tmp/autocast/gpu-sides-profile.json "$out/sides-profile-autocast.json" || true ;;
  *) echo "usage: gpu_session.sh first | first-fused | fused-suite | again | all | llama-fused |" \
          "fp8-sides | checks | peak-eager |" \
          "fp8 | shared | speed-gpt2 | speed-llama | peak | parts | host | kernels | eager-parts |" \
          "suite |" \
          "autocast" >&2
     exit 2 ;;
esac
