# Two commands for a new user:  `make demo`  and  `make test`.
# Each creates/updates .venv, installs PyTorch first (the pinned CPU build where this machine
# serves it, else whatever PyPI offers for the range in pyproject.toml), then paraxis itself.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test lint bench setup clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_PIN)" || $(BIN)/python -m pip install -q "torch>=2.4"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/paraxis demo

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check paraxis tests bench validation tools

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) runs .pytest_cache
