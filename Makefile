# Two commands for a new user:  `make demo`  and  `make test`.
# Each creates/updates .venv, installs PyTorch first (the pinned CPU build where this machine
# serves it, else whatever PyPI offers for the range in pyproject.toml), then paraxis itself.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test lint bench setup browser clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_PIN)" || $(BIN)/python -m pip install -q "torch>=2.4"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/paraxis demo

# Two workers (pytest-xdist): one core waits while the other runs a single-process test or a
# rank starts, about a third of a serial run on two cores; each worker computes on its share
# of the cores (tests/conftest.py).
test: setup browser
	$(BIN)/python -m pytest -q -n 2

# The lab's and the report's browser tests open their pages in Debian's chromium, driven by its
# chromedriver: installed here where this machine allows it (root and apt-get, as .ci/run
# does); elsewhere those tests are skipped, each saying how to install them.
browser:
	@(command -v chromium && command -v chromedriver) >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && echo "paraxis: installing chromium and chromium-driver for the browser tests" \
	       && apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null; } \
	  || echo "paraxis: chromium and chromedriver are not installed and cannot be here; the browser tests will be skipped (apt-get install -y chromium chromium-driver, then make test)"

lint: setup
	$(BIN)/ruff check paraxis tests bench validation tools

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) runs .pytest_cache
