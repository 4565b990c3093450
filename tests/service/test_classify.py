"""remote.classify_error: only bytes pyarrow cannot parse are 'corrupt' (the one cause that may quarantine)."""

from __future__ import annotations

import errno
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache_service.remote.schemas import SchemaConflict
from samplecache_service.remote.stores import classify_error, signature


def _parse_error(data: bytes) -> BaseException:
    try:
        pq.ParquetFile(io.BytesIO(data)).read()
    except Exception as e:  # what pyarrow really raises on these bytes
        return e
    raise AssertionError("pyarrow parsed garbage")


@pytest.mark.parametrize("exc,kind", [
    (PermissionError(errno.EACCES, "Access Denied", "bucket/x.parquet"), "transient"),
    (FileNotFoundError(errno.ENOENT, "No such key", "bucket/x.parquet"), "transient"),
    (OSError(errno.EMFILE, "Too many open files"), "transient"),
    (MemoryError(), "transient"),
    (OSError(errno.ENOSPC, "No space left on device"), "disk"),
    (ConnectionResetError(errno.ECONNRESET, "reset by peer"), "unreachable"),
    (TimeoutError("read timed out"), "unreachable"),
    (SchemaConflict("values do not fit the dataset's schema"), "schema"),
    (type("ClientPayloadError", (Exception,), {})("Response payload is not completed"), "transient"),
    (type("SlowDown", (Exception,), {})("Please reduce your request rate"), "transient"),
    (RuntimeError("something unforeseen"), "transient"),
])
def test_causes(exc: BaseException, kind: str) -> None:
    assert classify_error(exc) == kind


def test_unparsable_bytes_are_corrupt() -> None:
    assert classify_error(_parse_error(b"not parquet at all " * 20)) == "corrupt"
    buf = io.BytesIO()
    pq.write_table(pa.table({"a": list(range(1000))}), buf)
    raw = bytearray(buf.getvalue())
    raw[100:140] = b"\xff" * 40  # a damaged page inside an intact frame
    e = _parse_error(bytes(raw))
    assert classify_error(e) == "corrupt", (type(e), e)


def test_signature_changes_with_size_or_etag() -> None:
    a = signature({"size": 10, "ETag": '"abc"'})
    assert a == signature({"size": 10, "ETag": "abc"})
    assert a != signature({"size": 11, "ETag": '"abc"'}) and a != signature({"size": 10, "ETag": '"abd"'})
    assert signature({"size": 5, "mtime": 1.5}) != signature({"size": 5, "mtime": 2.5})
