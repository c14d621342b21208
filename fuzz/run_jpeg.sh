#!/usr/bin/env bash
# Build the JPEG region decoder's fuzz harness (csrc/jpeg_crop.cc against the
# system libjpeg-turbo) with sanitizers and run it, like fuzz/run.sh does the tar
# scanner's.
#
# usage: fuzz/run_jpeg.sh [SECONDS]   (default 30; exits non-zero on any crash or
#                                      sanitizer report; 2 without libjpeg headers)
# Working files go to fuzz/corpus-run/jpeg/ (git-ignored); set FUZZ_WORK to move it.
set -euo pipefail

budget="${1:-30}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
work="${FUZZ_WORK:-$here/corpus-run}/jpeg"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
mkdir -p "$work/seeds" "$work/corpus" "$work/bin"

if ! echo '#include <cstdio>
#include <jpeglib.h>
int main(){ jpeg_decompress_struct c; jpeg_crop_scanline(&c, nullptr, nullptr); }' |
   "${CXX:-g++}" -x c++ - -fsyntax-only 2>/dev/null; then
  echo "no libjpeg-turbo headers (jpeglib.h with jpeg_crop_scanline): nothing to fuzz" >&2
  exit 2
fi

PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" "$python" "$here/make_jpeg_seeds.py" "$work/seeds"

srcs=("$root/csrc/jpeg_crop.cc" "$here/fuzz_jpeg_crop.cc")
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -I"$root/csrc"
       -fsanitize=address,undefined -fno-sanitize-recover=all)
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

cxx="${CXX:-}"
if [[ -z "$cxx" ]] && command -v clang++ >/dev/null &&
   echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long){return 0;}' |
   clang++ -x c++ -fsanitize=fuzzer - -o "$work/bin/probe" 2>/dev/null; then
  bin="$work/bin/fuzz_jpeg_crop"
  clang++ "${flags[@]}" -fsanitize=fuzzer "${srcs[@]}" -ljpeg -o "$bin"
  echo "libFuzzer: running $bin for ${budget}s"
  "$bin" -max_total_time="$budget" -max_len=65536 -print_final_stats=1 -error_exitcode=77 \
    -artifact_prefix="$work/" "$work/corpus" "$work/seeds"
else
  bin="$work/bin/fuzz_jpeg_crop_standalone"
  "${cxx:-g++}" "${flags[@]}" "${srcs[@]}" "$here/standalone_driver.cc" -ljpeg -o "$bin"
  echo "standalone driver: running $bin for ${budget}s"
  (cd "$work" && "$bin" "$budget" "$work/seeds")
fi
