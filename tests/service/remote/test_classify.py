"""remote.classify_error: only bytes pyarrow cannot parse are 'corrupt' (the one cause that may quarantine)."""

from __future__ import annotations

import errno
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache_service.remote.schemas import SchemaConflict
from samplecache_service.remote.stores import FsspecRemote, RangeUnsupported, classify_error, signature


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


@pytest.mark.parametrize("rows", [10, 50_000], ids=["footer-guess-covers-the-file", "larger-than-the-guess"])
def test_a_server_that_ignores_range_is_named_and_no_file_is_blamed(rows: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A ranged read answered with the whole file (``python -m http.server``): the footer read says so, and
    the error is the source's (retried), never the file's (quarantined) — small files included."""
    remote = FsspecRemote(f"memory://ignores-range-{rows}/")
    with remote.fs.open(f"/ignores-range-{rows}/part.parquet", "wb") as f:
        pq.write_table(pa.table({"id": list(range(rows))}), f)
    path = remote.list_files()[0]
    whole = remote.fs.cat_file(path)
    try:
        assert remote.file_info(path)[0].row_groups == (rows,)  # a server that honours Range: read as before
        # the fs object is fsspec's cached instance: patched for this test only
        monkeypatch.setattr(remote.fs, "cat_file", lambda p, start=None, end=None: whole)
        for read in (lambda: remote.file_info(path), lambda: remote.footer(path, len(whole), 100)):
            with pytest.raises(RangeUnsupported, match="this server does not support HTTP Range requests") as got:
                read()
            assert classify_error(got.value) == "unreachable"
    finally:
        monkeypatch.undo()
        remote.fs.rm(f"/ignores-range-{rows}", recursive=True)
    fsspec_says = ValueError("The HTTP server doesn't appear to support range requests. Only reading this file "
                             "from the beginning is supported.")
    assert classify_error(fsspec_says) == "unreachable"
