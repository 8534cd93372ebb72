"""tools/probes/peak_memory.py's accounting: the running sum of a step's allocations and
frees, and what is alive at its largest."""

from tools.probes.peak_memory import Event, alive_at_peak


def test_alive_at_peak_counts_only_what_is_not_yet_freed_at_the_largest_sum():
    events = [Event(1, 100, "logits"), Event(2, 50, "grad"), Event(1, -100, ""),
              Event(3, 80, "grad"), Event(4, 30, "norm"), Event(4, -30, ""),
              Event(5, 10, "late")]
    peak, end, groups = alive_at_peak(events)
    assert peak == 160  # 50 + 80 + 30: after block 4, before its free; 150 earlier
    assert end == 140
    assert groups == {"grad": 130, "norm": 30}


def test_a_block_freed_then_reused_at_the_same_address_counts_once():
    events = [Event(7, 64, "a"), Event(7, -64, ""), Event(7, 64, "b")]
    assert alive_at_peak(events) == (64, 64, {"a": 64})


def test_a_side_ending_in_eager_is_built_uncompiled():
    """`--sides "paraxis fp32 eager"`: paraxis's engine without torch.compile, the precision
    read before the suffix (on CPU, fp32, a tiny model)."""
    import torch
    from torch._dynamo.utils import counters

    from bench import gpu
    from bench.common import token_batch
    from tools.probes.peak_memory import build

    cfg = gpu.model("gpt2-124m").replace(d_model=32, n_heads=2, n_kv_heads=2, d_ff=64,
                                         n_layers=1, vocab_size=64, max_seq_len=16)
    x, y = token_batch(cfg.vocab_size, 1, 16, torch.device("cpu"))
    forward_backward, rest = build("paraxis fp32 eager", cfg, x, y, torch.device("cpu"))
    counters.clear()  # what earlier compiles in this process counted
    forward_backward()
    rest()
    assert not counters["stats"]["calls_captured"]  # nothing traced: eager
