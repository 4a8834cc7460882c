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
# opdump's native module (opdump/stats/native.py: the one-pass CPU statistics kernel, its memo,
# statistic.csv rows and cell text), compiled now into .venv/lib/opdump-native/ under a name
# carrying a digest of its sources, torch version and CPU kind, so that no run builds it or
# waits for a lock; without a compiler opdump warns and uses torch and Python.
if [ "${OPDUMP_CPU_KERNEL:-1}" != "0" ]; then
  .venv/bin/python -m opdump.stats.build_native build || true
fi
# Headless Chromium for the HTML reports' render tests (tests/test_triage.py,
# tests/test_analysis_watch_cli.py), as root on Debian only, never fatal: measured on this
# machine ~51 s, 103 MB downloaded, 398 MB on disk. OPDUMP_NO_CHROMIUM=1 skips it (the render
# tests are then skipped with their reason; the structural HTML tests still run).
if [ "${OPDUMP_NO_CHROMIUM:-0}" != "1" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
   && ! command -v chromium >/dev/null; then
  (apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
   || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }) \
   || echo "setup: headless Chromium not installed; the HTML render tests will be skipped" >&2
fi
