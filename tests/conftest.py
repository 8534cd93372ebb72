"""Shared fixtures: tiny random Hugging Face checkpoints made locally by `transformers`, and
what several test files read, made once per session (a plan's report, a torchrun job).

`transformers` is a test-only dependency: the fixtures skip the tests that use them when it
is missing. Models are saved once per session (safetensors, the default format).
"""

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from paraxis.dist.hidden_gpus import hide_gpus

# The suite forks CPU ranks, which a process that has run autograd on a GPU machine cannot do
# (paraxis/dist/hidden_gpus.py): it sees no GPU, from before torch is imported; the GPU tests
# spawn ranks that do.
hide_gpus()

import pytest  # noqa: E402
import torch  # noqa: E402

from paraxis.data.corpus import embedded_corpus  # noqa: E402
from paraxis.train.loop import RUN_IMPORTS  # noqa: E402

if torch.cuda._is_compiled() and torch._C._cuda_getDeviceCount():  # what autograd counts
    raise pytest.UsageError(
        "CUDA saw the GPUs before tests/conftest.py could hide them (a pytest plugin?), so "
        "the suite's forked CPU ranks could not run autograd; run it with them hidden from "
        "the start: CUDA_VISIBLE_DEVICES= make test (the GPU tests then skip)")

# Under pytest-xdist each worker computes on its share of the cores (ranks take one thread
# each already): torch's default, every core in every worker, oversubscribes a many-core
# machine and pushes the multi-rank tests past their deadlines.
# torch.compile's code generation likewise: inductor starts a pool of as many compile
# processes as the machine has cores in every worker that compiles (16 a worker at -n 8 on a
# 16-core GPU machine, where the compiled-blocks test took 186 s, and 46 s alone and cold
# on a 2-core machine).
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    share = max(1, len(os.sched_getaffinity(0)) // workers)
    torch.set_num_threads(share)
    torch._inductor.config.compile_threads = share

# The ranks a test forks (paraxis.dist.testing) inherit what this process imported: what a
# run imports as it runs is imported here once, not again in every rank of every launch.
for _module in RUN_IMPORTS:
    importlib.import_module(_module)
embedded_corpus()  # read once, the same way: what a run trains on by default

# The modules whose tests take longest (the demo, compiling, the bench, multi-rank training:
# 25-100 s each on a 2-core VM, measured with --durations), collected first and in this order,
# so that no worker starts one near the end while the others sit idle. Each module's tests
# stay together and in their order; the rest keep theirs.
FIRST = ("test_report.py", "test_precision.py", "test_bench_smoke.py", "test_cp.py",
         "test_faults.py", "test_moe_ep.py", "test_checkpoint.py", "test_viz_moe.py",
         "test_auto.py", "test_zero3_pp.py", "test_hybrid_shard.py", "test_kernels.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    place = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: place.get(item.path.name, len(FIRST)))  # stable


def _save(model: torch.nn.Module, path: Path, seed: int) -> str:
    # transformers starts norm gains at 1 and biases at 0; moving them makes a dropped or
    # swapped gain or bias change the logits, so the comparisons catch it. Its block weights
    # (std 0.02) leave a tied GPT-2 repeating one token forever; larger ones give greedy
    # decoding a varied sequence to compare.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.1 if param.ndim == 1 else 0.2 if ".h." in name or "layers." in name else 0
            param.add_(std * torch.randn(param.shape, generator=generator))
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Llama with grouped kv heads (4 heads, 2 kv heads), a non-default RoPE theta and eps."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=50000.0, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    model = transformers.LlamaForCausalLM(config)
    return _save(model, tmp_path_factory.mktemp("hf") / "llama", seed=1)


@pytest.fixture(scope="session")
def hf_gpt2(tmp_path_factory: pytest.TempPathFactory) -> str:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = transformers.GPT2LMHeadModel(config)
    return _save(model, tmp_path_factory.mktemp("hf") / "gpt2", seed=2)


@pytest.fixture(scope="session")
def hf_mixtral(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Mixtral: 4 experts of width 48, top 2, grouped kv heads, a non-default RoPE theta and
    aux loss coefficient, saved with the per-expert keys save_pretrained writes."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, rms_norm_eps=1e-5,
        rope_theta=50000.0, router_aux_loss_coef=0.02, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    model = transformers.MixtralForCausalLM(config)
    return _save(model, tmp_path_factory.mktemp("hf") / "mixtral", seed=3)


@pytest.fixture(params=["llama", "gpt2"])
def hf_dir(request: pytest.FixtureRequest) -> str:
    """Each of the two checkpoints in turn."""
    return request.getfixturevalue(f"hf_{request.param}")


def _logits(path: str, idx: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()  # fp32, as saved
    assert model.dtype == torch.float32
    with torch.no_grad():
        return model(idx).logits


@pytest.fixture(scope="session")
def hf_logits():  # noqa: ANN201
    """transformers' own logits: `hf_logits(path, idx)` (eval mode, fp32)."""
    pytest.importorskip("transformers")
    return _logits


TOKENIZER_TEXT = [
    "the cat sat on the mat and the dog sat on the log",
    "a cat and a dog ran to the hat on the mat",
    "the dog saw the cat sat in the sun on a hot day",
]


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Hugging Face tokenizer.json (BPE, 100 tokens) trained here on three sentences."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tokenizer.decoder = tokenizers.decoders.Metaspace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=100, special_tokens=["[UNK]"],
                                             show_progress=False)
    tokenizer.train_from_iterator(TOKENIZER_TEXT, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


@dataclass(frozen=True)
class TorchrunJob:
    """A `paraxis train` job torchrun ran on one host: its flags (`common`, then `layout`),
    its metrics records, and its folder (metrics.jsonl and the config.toml beside it)."""

    common: list[str]
    layout: list[str]
    records: list[dict]
    folder: Path


@pytest.fixture(scope="session")
def dp2_tp2_job(tmp_path_factory: pytest.TempPathFactory) -> TorchrunJob:
    """4 steps of tiny on dp=2 x tp=2 with ZeRO-1 and sequence parallelism, 4 torchrun ranks
    on this host, run once per session: test_tp_dp holds it against one device and
    test_two_hosts the same job on two hosts against it."""
    from paraxis.dist.testing import train_records

    common = ["--model", "tiny", "--steps", "4", "--global-batch", "4", "--seq-len", "32",
              "--device", "cpu", "--quiet", "--timeout-s", "60"]
    layout = ["--dp", "2", "--tp", "2", "--zero", "1", "--sequence-parallel"]
    folder = tmp_path_factory.mktemp("dp2_tp2")
    records = train_records([*common, *layout], folder / "metrics.jsonl", nproc=4)
    return TorchrunJob(common, layout, records, folder)
