"""Read amplification: the remote bytes a unit costs against the column-chunk bytes it needs.

Unit tests (a local directory through fsspec's ``file://``): the footer is read from exactly its bytes at the
file's end (one ranged read when its length is known, the 64 KiB tail and then the rest when it is longer), a
garbage or short file is 'corrupt', and ``chunk_bytes`` counts the needed columns' chunks (nested leaves
included). End to end: a daemon reaches a real S3 server only through a byte-counting proxy; row groups of
~200 KB with a column it does not sample; ``/v1/status`` reports the samplers' ratio at most 1.1 and the wire
agrees with what the daemon counted.
"""

from __future__ import annotations

import io
import json
import struct
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from byteproxy import ByteProxy

from samplecache_service.remote.stores import FOOTER_GUESS, FsspecRemote, chunk_bytes, classify_error


def write(path: Path, table: pa.Table, row_group_size: int) -> int:
    pq.write_table(table, path, row_group_size=row_group_size, compression="none", use_dictionary=False)
    data = path.read_bytes()
    return int(struct.unpack("<I", data[-8:-4])[0])


class Counting(FsspecRemote):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[tuple[int, int]] = []

    def _cat(self, path: str, start: int, end: int) -> bytes:
        self.reads.append((start, end))
        return super()._cat(path, start, end)


def test_a_known_footer_length_is_one_exact_read(tmp_path: Path) -> None:
    t = pa.table({"a": np.arange(1000), "b": [str(i) for i in range(1000)]})
    length = write(tmp_path / "f.parquet", t, 100)
    size = (tmp_path / "f.parquet").stat().st_size
    r = Counting(f"file://{tmp_path}")
    md = r.footer(str(tmp_path / "f.parquet"), size, length)
    assert md.num_row_groups == 10 and md.num_rows == 1000
    assert r.reads == [(size - length - 8, size)]
    assert r.bytes_read == length + 8
    assert r.footer(str(tmp_path / "f.parquet"), size, length) is md, "read again instead of kept"
    assert len(r.reads) == 1


def test_a_long_footer_of_unknown_length_takes_the_tail_then_the_rest(tmp_path: Path) -> None:
    cols = {f"c{i:03d}": np.arange(400, dtype=np.int32) for i in range(60)}
    length = write(tmp_path / "wide.parquet", pa.table(cols), 10)  # 40 row groups x 60 columns
    assert length > FOOTER_GUESS, length
    size = (tmp_path / "wide.parquet").stat().st_size
    r = Counting(f"file://{tmp_path}")
    r.list_files()
    info, schema = r.file_info(str(tmp_path / "wide.parquet"))
    assert info.footer == length and info.size == size and len(info.row_groups) == 40
    assert schema.names == list(cols)
    assert r.reads == [(size - FOOTER_GUESS, size), (size - length - 8, size - FOOTER_GUESS)]
    assert r.bytes_read == length + 8


@pytest.mark.parametrize("content", [b"", b"PAR1", b"not parquet at all, just text" * 10,
                                     b"PAR1" + b"\0" * 20 + struct.pack("<I", 10**6) + b"PAR1"])
def test_garbage_is_corrupt(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad.parquet").write_bytes(content)
    r = FsspecRemote(f"file://{tmp_path}")
    with pytest.raises(pa.ArrowInvalid) as e:
        r.footer(str(tmp_path / "bad.parquet"))
    assert classify_error(e.value) == "corrupt"
    assert "bad.parquet" in str(e.value)


def test_chunk_bytes_counts_the_needed_columns_only(tmp_path: Path) -> None:
    t = pa.table({"x": pa.array([[1.0, 2.0]] * 500, pa.list_(pa.float32())), "y": np.arange(500),
                  "s": pa.array([{"p": i, "q": str(i)} for i in range(500)])})
    write(tmp_path / "n.parquet", t, 100)
    md = pq.read_metadata(tmp_path / "n.parquet")
    per = {md.row_group(1).column(j).path_in_schema: md.row_group(1).column(j).total_compressed_size
           for j in range(md.num_columns)}
    assert set(per) == {"x.list.element", "y", "s.p", "s.q"}
    assert chunk_bytes(md, [1], ["x"]) == per["x.list.element"]
    assert chunk_bytes(md, [1], ["s", "y"]) == per["s.p"] + per["s.q"] + per["y"]
    assert chunk_bytes(md, [1, 2], ["y"]) == per["y"] + md.row_group(2).column(1).total_compressed_size
    assert chunk_bytes(md, [1], []) == 0


def test_read_unit_fetches_only_the_needed_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t = pa.table({"x": rng.random(20_000), "skip": rng.random(20_000), "y": np.arange(20_000)})
    write(tmp_path / "u.parquet", t, 5_000)
    r = FsspecRemote(f"file://{tmp_path}")
    r.list_files()
    path = str(tmp_path / "u.parquet")
    md = r.footer(path)
    before = r.bytes_read
    got = pa.concat_tables(r.read_unit(path, 1, 2, ["x", "y"], 64 << 20))
    assert got.column_names == ["x", "y"] and got.num_rows == 10_000
    assert got.column("y").to_pylist() == list(range(5_000, 15_000))
    assert r.bytes_read - before == chunk_bytes(md, [1, 2], ["x", "y"])


# ----------------------------------------------------------------------------------------------- end to end
ROWS_PER_GROUP, ROW_BYTES, GROUPS, FILES = 200, 1024, 6, 3  # ~200 KB row groups, as in the issue


@pytest.fixture
def proxy(s3: Any) -> Iterator[ByteProxy]:
    p = ByteProxy(s3.port)
    with p:
        yield p
    assert not p.alive


def status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/status", timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


@pytest.mark.e2e
def test_status_reports_the_ratio_and_the_wire_agrees(s3: Any, prefix: str, proxy: ByteProxy,
                                                      daemon: Callable[..., Any],
                                                      until: Callable[..., Any]) -> None:
    fs = s3.fs()
    rng = np.random.default_rng(7)
    needed = 0
    for i in range(FILES):
        n = ROWS_PER_GROUP * GROUPS
        x = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 256, n * ROW_BYTES, dtype=np.uint8)), ROW_BYTES)
        t = pa.table({"x": x, "y": np.arange(i * n, (i + 1) * n), "unused": rng.random(n)})
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=ROWS_PER_GROUP, compression="none", use_dictionary=False)
        md = pq.read_metadata(pa.BufferReader(buf.getvalue()))
        needed += chunk_bytes(md, range(GROUPS), ["x", "y"])
        with fs.open(f"{prefix}/part-{i}.parquet", "wb") as f:
            f.write(buf.getvalue())
    env = s3.env()
    env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
    d = daemon(f"s3://{prefix}", samplers=1, env=env, extra=["--columns", "x,y", "--max-bytes", "1GiB"])
    total = ROWS_PER_GROUP * GROUPS * FILES
    st = until(lambda: (s := status(d.url))["samples"] >= total and s["sampler"]["in_flight"] == 0 and s,
               90, "every sample cached")
    remote = st["remote"]
    assert remote["needed_bytes"] == needed, (remote, needed)
    assert remote["read_amplification"] is not None and remote["read_amplification"] <= 1.1, remote
    assert remote["read_amplification"] == pytest.approx(remote["sampler_bytes"] / needed, rel=1e-3)
    # the wire: every byte the daemon and its samplers fetched (listings, HTTP headers included)
    assert proxy.downloaded <= 1.15 * needed, (proxy.downloaded, needed, remote)
    assert remote["bytes_read"] <= proxy.downloaded
