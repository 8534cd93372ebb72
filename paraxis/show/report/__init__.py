"""`paraxis report`: one self-contained HTML file with the plan, its defence, the pictures,
and, given a run folder, what was measured next to what was forecast.

    build.py     the plan (shared inputs: paraxis.plan.inputs) and the page; write_report
    (which hardware a report prices: paraxis/train/run_hardware.py)
    text.py      units and the plan and defence sections
    pictures.py  the rank grid, TP split, memory and ring pictures
    pipeline.py  the schedules drawn where their lesson holds, and what the run used
    measured.py  the run: metrics and trace next to the forecast
    run_health.py   how a run ended: memory headroom and growth, loss and gradient norm
    slowdown.py     why a step got slower: the planner's parts before and after a move
                    (`paraxis diagnose`; the attribution: paraxis/plan/attribution.py)
    (the command: paraxis/commands/report.py)
"""
