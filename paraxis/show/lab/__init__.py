"""The lab: the course's seven simulators, and two beyond it, as one interactive,
self-contained HTML page.

    paraxis lab --out DIR        # writes DIR/lab.html; open it from disk

Widgets: the scaling gap, data parallelism, ring all-reduce, a tensor-parallel MLP, pipeline
schedules (every kind, a slow stage), the ZeRO calculator and the 3D grid; beyond the
course, context parallelism (the zig-zag split, the ring, the three ways of moving K/V) and a
mixture of experts under expert parallelism (a real router's load, capacity, all-to-all).
Their figures are the library's: computed here over every slider setting and embedded
(`facts`, `schedule_facts`, `grid_facts`, `context_facts`, `expert_facts`), or computed in
the page by pure functions that tests/test_lab.py checks against the library in a real
browser (`browser`).
"""
