#!/usr/bin/env bash
# The main job: set up, then train the built-in AlexNet with dump on and analyse the dump.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/opdump demo "$@"
