#!/usr/bin/env bash
# GPU check for fastload: H2D bandwidth, DALI "mixed" decode, ResNet-50 data waits.
# Usage: benchmarks/gpu/run.sh [--dry-run] [gpu_check.py options]
# Writes ${OUT:-.}/gpu_check.json; the whole run is bounded to under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "${PYTHON:-}" ]]; then
  py="$PYTHON"
elif [[ -x .venv/bin/python ]]; then
  py=.venv/bin/python
else
  py=python3
fi
# without an installed fastload, use the source tree (the loader needs no extension)
if ! "$py" -c "import fastload.loader" >/dev/null 2>&1; then
  export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
fi
# gpu_check.py keeps a 450 s budget and a hard guard 30 s later; timeout is the last resort
exec timeout --kill-after=10 470 "$py" benchmarks/gpu/gpu_check.py --out "${OUT:-.}" "$@"
