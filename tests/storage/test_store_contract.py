"""One contract for ObjectStore, run over file://, memory:// and s3:// (SeaweedFS)."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.config import FetchConfig, RetryConfig
from fastload.errors import IntegrityError, StorageError
from fastload.storage import ObjectNotFoundError, ObjectStore, open_store
from support.seaweed import SeaweedServer

pytestmark = pytest.mark.usefixtures("no_thread_leaks")

# Small parts so a few hundred KB already take the parallel path.
FETCH = FetchConfig(
    part_size=64 * 1024,
    parallel_threshold=128 * 1024,
    concurrency=4,
    retry=RetryConfig(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=10),
)


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 131 + seed * 7 + (i >> 9)) & 0xFF for i in range(n))


class StoreContract:
    """Behaviour every backend must have. Subclasses provide the ``store`` fixture."""

    def test_write_read_size_round_trip(self, store: ObjectStore) -> None:
        data = payload(10_000)
        store.write_bytes("a/b/obj.bin", data)
        assert store.read("a/b/obj.bin") == data
        assert store.size("a/b/obj.bin") == len(data)
        assert store.exists("a/b/obj.bin")

    def test_read_range(self, store: ObjectStore) -> None:
        data = payload(5000, 1)
        store.write_bytes("r.bin", data)
        assert store.read_range("r.bin", 0, 10) == data[:10]
        assert store.read_range("r.bin", 1234, 4321) == data[1234:4321]
        assert store.read_range("r.bin", 4990, 5000) == data[4990:]
        assert store.read_range("r.bin", 4990, 9000) == data[4990:]
        assert store.read_range("r.bin", 100, 100) == b""
        with pytest.raises(StorageError, match="bad byte range"):
            store.read_range("r.bin", 10, 5)

    def test_empty_object(self, store: ObjectStore) -> None:
        store.write_bytes("empty", b"")
        assert store.read("empty") == b""
        assert store.size("empty") == 0
        buf = io.BytesIO()
        assert store.download("empty", buf) == 0
        assert buf.getvalue() == b""

    @pytest.mark.parametrize("n", [1000, 128 * 1024, 600_001])
    def test_download_to_path(self, store: ObjectStore, tmp_path: Path, n: int) -> None:
        data = payload(n, 2)
        store.write_bytes("d.bin", data)
        dest = tmp_path / "out.bin"
        dest.write_bytes(b"x" * (n + 999))  # longer leftovers must be truncated away
        assert store.download("d.bin", dest) == n
        assert dest.read_bytes() == data

    def test_parallel_download_uses_several_requests(self, store: ObjectStore) -> None:
        data = payload(600_001, 3)
        store.write_bytes("p.bin", data)
        before = store.stats()
        buf = io.BytesIO()
        assert store.download("p.bin", buf, expected_size=len(data)) == len(data)
        after = store.stats()
        assert buf.getvalue() == data
        assert after.requests - before.requests == 10  # ceil(600001 / 64 KiB), no HEAD
        assert after.bytes_read - before.bytes_read == len(data)
        assert after.retries == before.retries

    def test_download_into_open_file_at_offset(self, store: ObjectStore, tmp_path: Path) -> None:
        data = payload(300_000, 4)
        store.write_bytes("f.bin", data)
        with open(tmp_path / "f", "wb+") as f:
            f.write(b"HEADER")
            assert store.download("f.bin", f) == len(data)
            assert f.tell() == 6 + len(data)
            f.write(b"TAIL")
        assert (tmp_path / "f").read_bytes() == b"HEADER" + data + b"TAIL"

    def test_wrong_expected_size_is_an_integrity_error(self, store: ObjectStore) -> None:
        store.write_bytes("s.bin", payload(1000))
        with pytest.raises(IntegrityError, match=r"s\.bin"):
            store.download("s.bin", io.BytesIO(), expected_size=999)

    def test_missing_object_names_the_url(self, store: ObjectStore, tmp_path: Path) -> None:
        url = store.url("no/such/object")
        for call in (
            lambda: store.read("no/such/object"),
            lambda: store.size("no/such/object"),
            lambda: store.read_range("no/such/object", 0, 10),
            lambda: store.download("no/such/object", tmp_path / "x"),
        ):
            with pytest.raises(ObjectNotFoundError) as info:
                call()
            assert url in str(info.value)
            assert isinstance(info.value, StorageError)
            assert isinstance(info.value, FileNotFoundError)
        assert not store.exists("no/such/object")
        assert store.stats().retries == 0

    def test_open_write_round_trip(self, store: ObjectStore) -> None:
        data = payload(200_000, 5)
        with store.open_write("w/shard-000000.tar") as f:
            for i in range(0, len(data), 7000):
                f.write(data[i : i + 7000])
        assert store.read("w/shard-000000.tar") == data

    def test_list_and_delete(self, store: ObjectStore) -> None:
        for name in ("manifest.json", "shard-000000.tar", "sub/shard-000001.tar"):
            store.write_bytes(name, b"1")
        assert store.list() == ["manifest.json", "shard-000000.tar", "sub/shard-000001.tar"]
        assert store.list("sub") == ["sub/shard-000001.tar"]
        store.delete("manifest.json")
        assert not store.exists("manifest.json")

    def test_counters(self, store: ObjectStore) -> None:
        data = payload(4096)
        store.write_bytes("c.bin", data)
        before = store.stats()
        store.read("c.bin")
        after = store.stats()
        assert after.requests == before.requests + 1
        assert after.bytes_read == before.bytes_read + len(data)
        assert after.bytes_written == before.bytes_written
        assert store.sub("x").url("y") == store.url("x/y")


class TestFileStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> ObjectStore:
        return open_store(str(tmp_path / "root"), fetch=FETCH)

    def test_file_url_and_plain_path_agree(self, tmp_path: Path) -> None:
        open_store(f"file://{tmp_path}/root").write_bytes("x", b"abc")
        assert (tmp_path / "root" / "x").read_bytes() == b"abc"
        assert open_store(str(tmp_path / "root")).read("x") == b"abc"


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[ObjectStore]:
        root = f"memory://fastload-test-{uuid.uuid4().hex}"
        yield open_store(root, fetch=FETCH)
        import fsspec

        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


class TestS3Store(StoreContract):
    @pytest.fixture
    def store(self, seaweed: SeaweedServer) -> ObjectStore:
        return open_store(seaweed.new_url("prefix/data"), seaweed.storage_options, fetch=FETCH)

    def test_missing_bucket_names_the_url(self, seaweed: SeaweedServer) -> None:
        store = open_store("s3://no-such-bucket-fastload/x", seaweed.storage_options)
        with pytest.raises(ObjectNotFoundError, match="s3://no-such-bucket-fastload/x/k"):
            store.read("k")

    def test_bad_secret_is_denied_and_not_leaked(self, seaweed: SeaweedServer) -> None:
        url = seaweed.new_url()
        good = open_store(url, seaweed.storage_options)
        good.write_bytes("k", b"v")
        secret = "wrong-" + os.urandom(8).hex()
        bad = open_store(url, {**seaweed.storage_options, "secret": secret})
        with pytest.raises(StorageError) as info:
            bad.read("k")
        assert isinstance(info.value, PermissionError)
        assert secret not in str(info.value)
        assert secret not in repr(bad)
        assert bad.stats().retries == 0
