#!/usr/bin/env bash
# Measure the decode benchmark under stock Pillow (the project venv) and under
# Pillow-SIMD (a second venv built here from source), with the same script and
# the same synthetic images, and print both side by side.
#
# usage: benchmarks/pillow_simd.sh [extra bench_decode.py args, e.g. --images 200]
# env:   SIMD_VENV    where the second venv lives (default /tmp/fastload-simd-venv)
#        BASE_PYTHON  the project's python (default .venv/bin/python)
#        SIMD_CC      compiler command for pillow-simd (default "cc -mavx2")
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
simd_venv="${SIMD_VENV:-/tmp/fastload-simd-venv}"
base_python="${BASE_PYTHON:-$repo/.venv/bin/python}"
simd_cc="${SIMD_CC:-cc -mavx2}"
out="$(mktemp -d /tmp/fastload-bench-decode.XXXXXX)"

if ! "$simd_venv/bin/python" -c "import PIL, sys; sys.exit('.post' not in PIL.__version__)" 2>/dev/null; then
    echo "building pillow-simd into $simd_venv (CC='$simd_cc')" >&2
    # The project venv's base interpreter, so both runs use the same CPython.
    base_prefix="$("$base_python" -c 'import sys; print(sys.base_prefix)')"
    "$base_prefix/bin/python3" -m venv --clear "$simd_venv"
    "$simd_venv/bin/pip" install --quiet --upgrade pip
    "$simd_venv/bin/pip" install --quiet numpy
    CC="$simd_cc" "$simd_venv/bin/pip" install --quiet --no-cache-dir --no-binary :all: pillow-simd
fi

echo "Pillow:      $("$base_python" -c 'import PIL; print(PIL.__version__)')" >&2
echo "Pillow-SIMD: $("$simd_venv/bin/python" -c 'import PIL; print(PIL.__version__)')" >&2

# Same script; the first run writes the JPEGs to $out/images and the second reads
# them, so both decode byte-identical files (the two libjpeg builds encode differently).
PYTHONPATH=src "$base_python" benchmarks/bench_decode.py --json --cache "$out/images" "$@" \
    >"$out/pillow.json"
PYTHONPATH=src "$simd_venv/bin/python" benchmarks/bench_decode.py --json --cache "$out/images" "$@" \
    >"$out/simd.json"

"$base_python" benchmarks/bench_decode.py --compare "$out/pillow.json" "$out/simd.json"
echo "raw results: $out/pillow.json $out/simd.json" >&2
