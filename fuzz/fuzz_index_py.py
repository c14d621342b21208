"""Atheris harness for the Python face of the index: ShardIndex.build/from_bytes.

Any input must either index cleanly (and then be fully usable) or raise
ShardFormatError; anything else is a bug. The extension is built without
coverage instrumentation, so this fuzzes blind on the C++ side; the libFuzzer
harness (fuzz_tar_scan.cc) covers that.

usage: python fuzz/fuzz_index_py.py [-atheris_runs=N | -max_total_time=S] [CORPUS_DIR...]
"""

from __future__ import annotations

import contextlib
import sys

import atheris

from fastload import ShardFormatError
from fastload.shards.index import ShardIndex


def check(index: ShardIndex) -> None:
    for i in range(len(index)):
        sample = index.sample(i)
        start, end = index.sample_range(i)
        assert 0 <= start <= end <= index.shard_size
        assert sample["__key__"] == index.key(i)
        assert len(index.fields(i)) == len(sample) - 1
    assert len(index.names) == index.num_members
    again = ShardIndex.from_bytes(index.to_bytes())
    assert again.to_bytes() == index.to_bytes()


def test_one_input(data: bytes) -> None:
    with contextlib.suppress(ShardFormatError):
        check(ShardIndex.build(data, name="fuzz.tar"))
    with contextlib.suppress(ShardFormatError):
        check(ShardIndex.from_bytes(data, name="fuzz.idx"))


def main() -> None:
    atheris.instrument_all()  # Python coverage of fastload and this harness
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
