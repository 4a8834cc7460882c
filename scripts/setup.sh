#!/usr/bin/env bash
# One-time (idempotent) set-up on a fresh machine: a virtual environment in .venv
# with the pinned CPU build of torch, opdump itself (editable) and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  # Pinned: an unpinned torch would pull the CUDA build (gigabytes).
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test]"
# opdump's native module (opdump/stats/cpu_kernel.cpp: the one-pass CPU statistics kernel;
# stats_memo.cpp: its reuse for memory already read; row_sink.cpp: statistic.csv rows of
# CPU tensors; cell_text.cpp: statistic.csv cell text), compiled once per machine into
# ~/.cache/torch_extensions; without a compiler opdump warns and uses torch and Python.
.venv/bin/python - <<'PY'
from opdump.stats import cpu_kernel
if cpu_kernel.enabled_by_environment() and cpu_kernel.load() is None:
    print("opdump: the native module was not built (see the warning above); torch reductions and Python will be used")
PY
