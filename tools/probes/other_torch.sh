#!/usr/bin/env bash
# The suite under another torch release on this CPU machine, by default the GPU image's 2.11:
#   bash tools/probes/other_torch.sh [VERSION] [pytest arguments]
# It builds a second virtual environment, .venv-torch-VERSION, with that release from PyPI
# (its CUDA build and CUDA's libraries, about 5 GB: they load without a GPU, and the suite
# hides GPUs anyway) and paraxis's test dependencies, then runs the suite as `make test` does.
# A failure here that the suite does not have under .venv's torch is the release's.
set -euo pipefail
version=${1:-2.11.0}
shift $(( $# > 0 ? 1 : 0 ))
venv=.venv-torch-$version
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q "torch==$version"
"$venv/bin/python" -m pip install -q -e ".[dev]"
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)"
PYTHONPATH=. exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 "$@"
