"""`python -m validation`: the planner's forecasts against published runs (docs/validation.md).

The same as `python -m validation.validate_planner`; `--check` also exits 1 when a run is off
by more than 20%.
"""

from validation.validate_planner import main

if __name__ == "__main__":
    raise SystemExit(main())
