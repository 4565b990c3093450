"""The S3 test server (both backends) and the Parquet data generators work end to end."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_data import make_learnable_table, make_raw_table, make_typed_table, write_dataset

from samplecache_tools.s3server import S3Server

HAVE_MOTO = importlib.util.find_spec("moto") is not None
BACKENDS = ["seaweedfs", pytest.param("moto", marks=pytest.mark.skipif(not HAVE_MOTO, reason="moto not installed"))]


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp(request.param), request.param) as srv:
        yield srv


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


# ------------------------------------------------------------------ data generators (no server)
def test_typed_table_types_and_shapes() -> None:
    t = make_typed_table(50, seed=1, id_offset=1000)
    s = t.schema
    assert s.names == ["id", "i8", "u16", "i32", "f16", "f32", "f64", "flag", "tensor", "vec", "const_list",
                       "var_list", "nested", "text", "blob", "maybe_text"]
    assert [s.field(n).type for n in ("id", "i8", "u16", "i32", "f16", "f32", "f64", "flag")] == [
        pa.int64(), pa.int8(), pa.uint16(), pa.int32(), pa.float16(), pa.float32(), pa.float64(), pa.bool_()]
    assert s.field("tensor").type == pa.list_(pa.list_(pa.float32(), 3), 4)
    assert s.field("vec").type == pa.list_(pa.int16(), 5)
    assert s.field("const_list").type == pa.list_(pa.float32())
    assert s.field("var_list").type == pa.list_(pa.int32())
    assert s.field("nested").type == pa.list_(pa.list_(pa.float64()))
    assert (s.field("text").type, s.field("blob").type, s.field("maybe_text").type) == (
        pa.utf8(), pa.binary(), pa.utf8())
    rows = t.to_pydict()
    assert rows["id"] == list(range(1000, 1050))
    assert all(np.asarray(r).shape == (4, 3) for r in rows["tensor"])
    assert {len(r) for r in rows["const_list"]} == {8}
    assert min(map(len, rows["var_list"])) == 0 and max(map(len, rows["var_list"])) > 3
    shapes = [np.asarray(r).shape if r else (0,) for r in rows["nested"]]
    assert shapes[:3] == [(2, 3), (1, 1), (0,)] and len(set(shapes)) > 3  # every row rectangular
    assert "" in rows["text"] and any(not x.isascii() for x in rows["text"])
    assert len({len(x) for x in rows["text"]}) > 3
    assert b"" in rows["blob"] and len({len(x) for x in rows["blob"]}) > 3
    assert 0 < t.column("maybe_text").null_count < 50


def test_generators_are_deterministic() -> None:
    assert make_typed_table(30, 7).equals(make_typed_table(30, 7))
    assert not make_typed_table(30, 7).equals(make_typed_table(30, 8))
    assert make_raw_table(4, 64, np.float32, seed=2).equals(make_raw_table(4, 64, np.float32, seed=2))


def test_learnable_table_is_learnable() -> None:
    train, test = make_learnable_table(4000, seed=1), make_learnable_table(1000, seed=2)
    assert train.schema.field("features").type == pa.list_(pa.float32(), 16)
    assert train.schema.field("label").type == pa.int64()

    def xy(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        return t.column("features").combine_chunks().values.to_numpy().reshape(-1, 16), t.column("label").to_numpy()

    (x, y), (xt, yt) = xy(train), xy(test)
    centroids = np.stack([x[y == c].mean(0) for c in range(4)])
    pred = ((xt[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    assert (pred == yt).mean() > 0.9


def test_raw_table() -> None:
    t = make_raw_table(8, 4096, np.uint8, seed=0)
    assert t.schema.field("x").type == pa.list_(pa.uint8(), 4096) and t.schema.field("y").type == pa.int64()
    t16 = make_raw_table(3, 4096, np.float16)
    assert t16.schema.field("x").type == pa.list_(pa.float16(), 2048)
    with pytest.raises(ValueError):
        make_raw_table(1, 3, np.float32)


def test_write_dataset_local(tmp_path: Path) -> None:
    truth = write_dataset(tmp_path, "ds", n_files=3, rows_per_file=100, row_group_size=32, seed=5)
    files = sorted(p.name for p in (tmp_path / "ds").iterdir())
    assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert pq.ParquetFile(tmp_path / "ds" / files[0]).num_row_groups == 4
    assert pq.read_table(tmp_path / "ds").equals(truth)
    assert truth.column("id").to_pylist() == list(range(300))


# ------------------------------------------------------------------ real servers
@pytest.mark.e2e
def test_dataset_roundtrip_through_s3(server: S3Server) -> None:
    bucket = server.make_bucket("roundtrip")
    fs = server.fs()
    truth = write_dataset(fs, f"{bucket}/data/v1", n_files=2, rows_per_file=200, row_group_size=50, seed=3)
    listed = sorted(fs.ls(f"{bucket}/data/v1"))
    assert listed == [f"{bucket}/data/v1/part-0000{i}.parquet" for i in range(2)]
    with fs.open(listed[1], "rb") as f:
        pf = pq.ParquetFile(f)
        assert pf.num_row_groups == 4 and pf.schema_arrow == truth.schema
        rg = pf.read_row_group(2)
    assert rg.equals(truth.slice(200 + 2 * 50, 50))


@pytest.mark.e2e
def test_env_configures_a_subprocess(server: S3Server) -> None:
    bucket = server.make_bucket("envcheck")
    server.fs().pipe(f"{bucket}/k", b"payload")
    # s3fs/botocore read AWS_ENDPOINT_URL; pyarrow.fs.S3FileSystem does not (apache/arrow#49643).
    code = ("import os, s3fs, pyarrow.fs as pf\n"
            "print(s3fs.S3FileSystem(skip_instance_cache=True).cat('envcheck/k').decode())\n"
            "fs = pf.S3FileSystem(endpoint_override=os.environ['AWS_ENDPOINT_URL'])\n"
            "print(fs.get_file_info('envcheck/k').size)\n")
    env = server.env({**os.environ, "AWS_DEFAULT_REGION": "eu-west-3"})
    assert "AWS_DEFAULT_REGION" not in env
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["payload", "7"]


@pytest.mark.e2e
def test_two_seaweedfs_servers_at_once(tmp_path: Path) -> None:
    with S3Server(tmp_path / "a") as a, S3Server(tmp_path / "b") as b:
        assert a.pid != b.pid
        assert not set(a.ports.values()) & set(b.ports.values())
        a.make_bucket("only-in-a")
        a.fs().pipe("only-in-a/x", b"1")
        assert b.fs().ls("") == [] and a.fs().cat("only-in-a/x") == b"1"
        assert a.startup_seconds is not None and a.startup_seconds < 60
        with pytest.raises(PermissionError):  # seaweedfs checks signatures: credentials are real
            a.fs(secret="wrong-secret").ls("only-in-a")


@pytest.mark.e2e
@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_leaves_no_process(tmp_path: Path, backend: str) -> None:
    srv = S3Server(tmp_path, backend).start()
    pid, ports = srv.pid, dict(srv.ports)
    srv.stop()
    srv.stop()  # idempotent
    assert _gone(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert subprocess.run(["pgrep", "-g", str(pid)], capture_output=True).returncode == 1
    assert all(_refused(p) for name, p in ports.items() if name != "debug")
    assert srv.log_path.is_file() and srv.log_path.stat().st_size > 0


def test_startup_failure_reports_log(tmp_path: Path) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'weed: cannot start, disk on fire' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="disk on fire"):
        S3Server(tmp_path / "d", weed=str(fake), startup_timeout=10).start()
