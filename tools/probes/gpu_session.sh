#!/usr/bin/env bash
# The checks a lent GPU runs, prepared so that each fits one device call (under 10 minutes):
#   bash tools/probes/gpu_session.sh fp8          # _scaled_mm against the CPU emulation
#   bash tools/probes/gpu_session.sh speed-gpt2   # bench.gpu, GPT-2 124M at 16 and 8 x 1024
#   bash tools/probes/gpu_session.sh speed-llama  # bench.gpu, the Llama 3 8B 8-layer slice
#   bash tools/probes/gpu_session.sh suite        # the tests that need CUDA, then the suite
# Output goes to $OUT (the device tool brings it back); copy it into docs/gpu/ with the
# command that made it.
set -o pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.txt"
case ${1:-} in
  fp8) timeout 570 python3 -m tools.probes.fp8_cuda 2>&1 | tee "$out/fp8.log" ;;
  speed-gpt2) timeout 570 python3 -m bench.gpu --runs 0,1 --out "$out/gpt2" 2>&1 | tee "$out/gpt2.log" ;;
  speed-llama) timeout 570 python3 -m bench.gpu --runs 2 --out "$out/llama" 2>&1 | tee "$out/llama.log" ;;
  suite) timeout 570 python3 -m pytest -q -p no:cacheprovider -x -n 8 --durations=15 tests 2>&1 \
           | tee "$out/suite.log" ;;
  *) echo "usage: gpu_session.sh fp8 | speed-gpt2 | speed-llama | suite" >&2; exit 2 ;;
esac
