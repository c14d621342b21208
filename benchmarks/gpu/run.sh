#!/usr/bin/env bash
# GPU check for fastload, made for a bare GPU machine: the system python3 (torch,
# numpy, Pillow, maybe torchvision; no venv, no fastload install, no network).
#   benchmarks/gpu/run.sh [gpu_check.py options]      (e.g. --dry-run, --skip train)
# Writes $OUT/gpu_check.json (OUT defaults to benchmarks/gpu/out) after every section.
# gpu_check.py keeps a 300 s budget and a hard guard 20 s later; the timeout below
# (340 s + 10 s to kill) is the last resort, so the whole call ends within 6 minutes.
# pytest for the device tests: that machine has none. Carry its wheels, made here with
#   .venv/bin/pip download --no-deps -d benchmarks/gpu/.wheels pytest pluggy iniconfig packaging pygments
# (git-ignored); they are unpacked into a temporary directory, not installed.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
py="${PYTHON:-python3}"
out="${OUT:-$root/benchmarks/gpu/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$root/src:$root/benchmarks/gpu${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import pytest" >/dev/null 2>&1; then
  shopt -s nullglob
  wheels=(benchmarks/gpu/.wheels/*.whl)
  if (( ${#wheels[@]} )); then
    site="$(mktemp -d "${TMPDIR:-/tmp}/fastload-gpu-site.XXXXXX")"
    for w in "${wheels[@]}"; do "$py" -m zipfile -e "$w" "$site"; done
    export PYTHONPATH="$PYTHONPATH:$site"
    echo "run.sh: pytest unpacked from ${#wheels[@]} wheels into $site"
  else
    echo "run.sh: no pytest and no benchmarks/gpu/.wheels: the device tests are skipped"
  fi
fi
echo "run.sh: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])'); out=$out"
df -h /dev/shm 2>/dev/null | tail -1 || echo "run.sh: no /dev/shm"
timeout --signal=TERM --kill-after=10 340 "$py" -u benchmarks/gpu/gpu_check.py --out "$out" "$@"
rc=$?
echo "run.sh: gpu_check exit $rc; results in $out/gpu_check.json"
exit "$rc"
