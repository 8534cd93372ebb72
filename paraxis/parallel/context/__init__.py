"""Context parallelism: the sequence split across ranks, attention computed across them.

- `paraxis/spec/cp_balance.py` (plain Python, which the planner imports): which chunks each
  rank holds (the causal zig-zag split), which attention blocks it computes, how many
  (query, key) pairs; `PairCounter` counts them at run time.
- `chunks`: the split on tensors (a rank's local part, its tokens' global positions for
  RoPE, the whole sequence back from the parts).
- `kernel`: one block on the flash kernel, and the log-sum-exp merge of partial results.
- `ring`, `all_gather`: two ways of bringing K/V to the queries, as autograd functions;
  `all_to_all`: the third way, a head split around the kernel (DeepSpeed-Ulysses);
  `attention.context_parallel_attention` picks one by name.
- `packing`: document packing, attention and positions kept within each document.
"""
