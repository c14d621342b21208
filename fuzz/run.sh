#!/usr/bin/env bash
# Build the C++ scanner's fuzz harness with sanitizers and run it.
#
# usage: fuzz/run.sh [SECONDS]      (default 30; exits non-zero on any crash or
#                                    sanitizer report)
# With clang (+ its libFuzzer runtime) it is a libFuzzer binary; otherwise g++
# builds it with -fsanitize=address,undefined and a small mutation driver.
# Working files go to fuzz/corpus-run/ (git-ignored); set FUZZ_WORK to move it.
set -euo pipefail

budget="${1:-30}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
work="${FUZZ_WORK:-$here/corpus-run}"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
mkdir -p "$work/seeds" "$work/corpus" "$work/bin"

PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" "$python" "$here/make_seeds.py" "$work/seeds"

srcs=("$root/csrc/tar_scan.cc" "$root/csrc/index_format.cc" "$root/csrc/gather.cc" "$here/fuzz_tar_scan.cc")
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -I"$root/csrc"
       -fsanitize=address,undefined -fno-sanitize-recover=all)
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

cxx="${CXX:-}"
if [[ -z "$cxx" ]] && command -v clang++ >/dev/null &&
   echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long){return 0;}' |
   clang++ -x c++ -fsanitize=fuzzer - -o "$work/bin/probe" 2>/dev/null; then
  bin="$work/bin/fuzz_tar_scan"
  clang++ "${flags[@]}" -fsanitize=fuzzer "${srcs[@]}" -o "$bin"
  echo "libFuzzer: running $bin for ${budget}s"
  "$bin" -max_total_time="$budget" -max_len=65536 -dict="$here/tar.dict" \
    -print_final_stats=1 -error_exitcode=77 -artifact_prefix="$work/" \
    "$work/corpus" "$work/seeds"
else
  bin="$work/bin/fuzz_tar_scan_standalone"
  "${cxx:-g++}" "${flags[@]}" "${srcs[@]}" "$here/standalone_driver.cc" -o "$bin"
  echo "standalone driver: running $bin for ${budget}s"
  (cd "$work" && "$bin" "$budget" "$work/seeds")
fi
