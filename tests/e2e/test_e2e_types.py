"""End to end, every Parquet type (issue 10): files whose schemas drift, nested and nullable columns through
batching, large row groups read in slices, files of thousands of tiny row groups. Each test uploads its own
files under a unique prefix of the real S3 server and starts a real daemon subprocess on them."""

from __future__ import annotations

import hashlib
import io
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from epoch_check import by_id, compare_table, read_epoch, upload
from PIL import Image
from torch.utils.data import DataLoader

import samplecache
from samplecache import SampleCacheDataset, SampleCacheLoader

pytestmark = pytest.mark.e2e


# --------------------------------------------------------------------------------------------- drifted files
def test_drifted_files_are_unified_and_the_odd_one_quarantined(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                                               get: Callable[..., Any],
                                                               until: Callable[..., Any]) -> None:
    rng = np.random.default_rng(10)
    n = 120
    files = {
        # a: int64, n: all None (Arrow null type)
        "a.parquet": pa.table({"id": pa.array(range(0, n), pa.int64()),
                               "a": pa.array(rng.integers(-10**6, 10**6, n), pa.int64()),
                               "n": pa.nulls(n)}),
        # b: float64 with NaN (how pandas writes a missing number), n: strings with some nulls
        "b.parquet": pa.table({"id": pa.array(range(n, 2 * n), pa.int64()),
                               "a": pa.array(np.where(np.arange(n) % 7 == 0, np.nan, rng.normal(size=n) * 1e3)),
                               "n": pa.array([None if i % 5 == 0 else f"s{i}" for i in range(n)], pa.string())}),
        # c: no column n at all
        "c.parquet": pa.table({"id": pa.array(range(2 * n, 3 * n), pa.int64()),
                               "a": pa.array(rng.integers(0, 100, n), pa.int64())}),
        # d: a as strings: cannot be unified with double
        "d.parquet": pa.table({"id": pa.array(range(3 * n, 4 * n), pa.int64()),
                               "a": pa.array([f"x{i}" for i in range(n)], pa.string()),
                               "n": pa.array([f"t{i}" for i in range(n)], pa.string())}),
    }
    local = tmp_path / "drift"
    local.mkdir()
    for name, table in files.items():
        pq.write_table(table, local / name, row_group_size=40)
        upload(s3, local / name, f"{prefix}/{name}")
    assert pa.types.is_null(pq.read_schema(local / "a.parquet").field("n").type)

    good = [local / f for f in ("a.parquet", "b.parquet", "c.parquet")]
    unified = pa.unify_schemas([pq.read_schema(p) for p in good], promote_options="permissive")
    assert unified.field("a").type == pa.float64() and unified.field("n").type == pa.string()
    want = pads.dataset([str(p) for p in good], schema=unified, format="parquet").to_table()
    assert want.num_rows == 3 * n and want.schema.equals(unified)

    d = daemon(source=f"s3://{prefix}")

    def quarantined() -> Any:
        s = get(d.url + "/v1/status").json()
        return s["quarantined"] or None

    q = until(quarantined, 60, "d.parquet quarantined")
    assert [Path(x["path"]).name for x in q] == ["d.parquet"], q
    reason = q[0]["reason"]
    assert "column 'a'" in reason and "string" in reason and "double" in reason, reason
    assert "cannot be unified" in reason, reason

    schema = get(d.url + "/v1/schema").json()
    cols = {c["name"]: (c["kind"], c["dtype"]) for c in schema["columns"]}
    assert cols.get("a") == ("fixed", "<f8"), cols
    assert cols.get("n", ("?",))[0] == "string", cols

    samples = read_epoch(d.url, 3 * n)
    got = by_id(samples)
    compare_table(got, want, "drifted files")
    assert not set(got) & set(range(3 * n, 4 * n)), "rows of the quarantined file were served"

    # the same epoch's samples through a plain DataLoader and samplecache.collate: batches, no exception
    ds = SampleCacheDataset(d.url, min_samples=3 * n, wait=60)
    try:
        seen: list[int] = []
        for batch in DataLoader(ds, batch_size=8, num_workers=0, collate_fn=samplecache.collate):
            assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64
            assert isinstance(batch["a"], torch.Tensor) and batch["a"].dtype == torch.float64, batch["a"]
            ids = batch["id"].tolist()
            assert batch["a"].numpy().tobytes() == np.array(
                [want.column("a")[i].as_py() if want.column("a")[i].is_valid else np.nan
                 for i in ids], np.float64).tobytes()
            assert isinstance(batch["n"], list) and len(batch["n"]) == len(ids)
            seen += ids
        assert sorted(seen) == list(range(3 * n))
    finally:
        ds.close()


# --------------------------------------------------------------------------------------------- nested types
def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def unbatch(batch: dict[str, Any], name: str) -> list[Any]:
    """One column of a batch back as cells (tensors as numpy, masked-out rows as None)."""
    v = batch[name]
    mask = batch.get(name + "__valid")
    if isinstance(v, torch.Tensor):
        arr = v.numpy()
        cells: list[Any] = [arr[j] for j in range(len(arr))]
    else:
        cells = [x.numpy() if isinstance(x, torch.Tensor) else x for x in v]
    if mask is not None:
        m = mask.numpy()
        cells = [c if m[j].any() else None for j, c in enumerate(cells)]
    return cells


def test_nested_types_through_the_loader(daemon: Any, s3: Any, prefix: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    n = 160
    pixels = [rng.integers(0, 256, (6 + i % 3, 5 + i % 4, 3), dtype=np.uint8) for i in range(n)]
    image_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    ints: list[Any] = []
    ragged: list[Any] = []
    maybe: list[Any] = []
    for i in range(n):
        ints.append(None if i % 9 == 0 else [None if (i + k) % 4 == 0 else int(rng.integers(-99, 99))
                                             for k in range(i % 5)])
        ragged.append([[float(x) for x in rng.normal(size=int(rng.integers(0, 4)))]
                       for _ in range(int(rng.integers(0, 4)))])
        maybe.append(None if i % 6 == 0 else float(rng.normal()))
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "image": pa.array([{"bytes": png(p), "path": f"img/{i}.png"} for i, p in enumerate(pixels)], image_t),
        "ints": pa.array(ints, pa.list_(pa.int64())),
        "ragged": pa.array(ragged, pa.list_(pa.list_(pa.float32()))),
        "maybe": pa.array(maybe, pa.float64()),
        "price": pa.array([None if i % 11 == 0 else Decimal(f"{i * 37 - 1000}.{i % 1000:03d}")
                           for i in range(n)], pa.decimal128(12, 3)),
        "tags": pa.array([None if i % 13 == 0 else [(f"k{k}", i * k) for k in range(i % 3)] for i in range(n)],
                         pa.map_(pa.string(), pa.int32())),
    })
    path = tmp_path / "nested.parquet"
    pq.write_table(table, path, row_group_size=40)
    upload(s3, path, f"{prefix}/nested.parquet")

    d = daemon(source=f"s3://{prefix}")
    ds = SampleCacheDataset(d.url, min_samples=n, wait=60)
    loader = SampleCacheLoader(ds, batch_size=8, num_workers=2)
    cells: dict[str, list[Any]] = {name: [] for name in table.column_names}
    masked_batches = 0
    try:
        for batch in loader:
            assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64, batch["id"]
            ids = batch["id"].tolist()
            m = batch["maybe"]
            assert isinstance(m, torch.Tensor) and m.dtype == torch.float64, m
            nulls = [i for i in ids if maybe[i] is None]
            if nulls:
                assert "maybe__valid" in batch, f"batch {ids} has nulls in 'maybe' but no mask: {sorted(batch)}"
            if "maybe__valid" in batch:
                masked_batches += 1
                valid = batch["maybe__valid"]
                assert valid.dtype == torch.bool and valid.shape == m.shape
                assert valid.tolist() == [maybe[i] is not None for i in ids]
                assert torch.isnan(m[~valid]).all(), m
            assert isinstance(batch["image"], list) and all(isinstance(c, dict) for c in batch["image"])
            for i, cell in zip(ids, batch["image"]):
                img = samplecache.decode_image(cell)
                assert img.dtype == np.uint8 and np.array_equal(img, pixels[i]), f"image of id {i}"
            for name in table.column_names:
                col = unbatch(batch, name)
                if name == "tags":  # DataLoader's default_convert makes a map entry's tuple a list (README)
                    assert all(c is None or all(type(e) is list for e in c) for c in col)
                    col = [None if c is None else [tuple(e) for e in c] for c in col]
                assert len(col) == len(ids), f"{name}: {len(col)} cells in a batch of {len(ids)}"
                cells[name] += col
    finally:
        ds.close()
    got = {int(i): {name: cells[name][j] for name in cells} for j, i in enumerate(cells["id"])}
    assert len(got) == len(cells["id"]), "a sample was delivered twice"
    assert masked_batches >= 1
    compare_table(got, table, "nested")


# --------------------------------------------------------------------------------------------- extension types
def test_canonical_extension_types_from_duckdb_and_pyarrow(daemon: Any, s3: Any, prefix: str,
                                                          tmp_path: Path) -> None:
    """A DuckDB file (UUID, JSON: pyarrow reads them as arrow.uuid / arrow.json) and a pyarrow file (bool8,
    fixed_shape_tensor, opaque) in one source: each sample as pyarrow reads it (a uuid as uuid.UUID), and in the
    loader's batches a list of uuid.UUID, a list of JSON texts, a bool tensor and a (B, 2, 3) tensor (issue 22, 6)."""
    import uuid

    duckdb = pytest.importorskip("duckdb")
    n = 100
    local = tmp_path / "ext"
    local.mkdir()
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET threads = 1")
        con.execute(f"""COPY (SELECT i AS id, CASE WHEN i % 7 = 1 THEN NULL ELSE md5(i::VARCHAR)::UUID END AS uid,
                        ('{{"i": ' || i || '}}')::JSON AS doc, [md5((i + 1)::VARCHAR)::UUID, NULL] AS uids
                        FROM range({n}) t(i)) TO '{local / "duck.parquet"}' (FORMAT PARQUET, ROW_GROUP_SIZE 40)""")
    finally:
        con.close()
    tensors = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 4
    flags = [None if i % 5 == 0 else i % 3 - 1 for i in range(n)]
    pq.write_table(pa.table({
        "id": pa.array(range(n, 2 * n), pa.int64()),
        "flag": pa.ExtensionArray.from_storage(pa.bool8(), pa.array(flags, pa.int8())),
        "grid": pa.FixedShapeTensorArray.from_numpy_ndarray(tensors),
        "blob": pa.ExtensionArray.from_storage(pa.opaque(pa.binary(), "geometry", "postgis"),
                                               pa.array([bytes([i % 256]) * (i % 4) for i in range(n)])),
    }), local / "arrow.parquet", row_group_size=40)
    files = [local / "duck.parquet", local / "arrow.parquet"]
    for f in files:
        upload(s3, f, f"{prefix}/{f.name}")
    unified = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    assert unified.field("uid").type == pa.uuid() and unified.field("doc").type == pa.json_()
    want = pads.dataset([str(f) for f in files], schema=unified, format="parquet").to_table()

    d = daemon(source=f"s3://{prefix}")
    samples = by_id(read_epoch(d.url, 2 * n))
    compare_table(samples, want, "extension types")
    assert samples[0]["uid"] == uuid.UUID(hashlib.md5(b"0").hexdigest()) and samples[1]["uid"] is None
    assert samples[n]["grid"].shape == (2, 3) and samples[n]["flag"] is None
    assert samples[n + 1]["flag"] == np.False_ and samples[n + 2]["flag"] == np.True_

    ds = SampleCacheDataset(d.url, min_samples=2 * n, wait=60)
    seen: list[int] = []
    try:
        for batch in SampleCacheLoader(ds, batch_size=16, num_workers=0):
            ids = batch["id"].tolist()
            assert [u.hex if u is not None else None for u in batch["uid"]] == [
                hashlib.md5(str(i).encode()).hexdigest() if i < n and i % 7 != 1 else None for i in ids]
            assert all(type(u) is uuid.UUID for u in batch["uid"] if u is not None)
            assert batch["doc"] == [f'{{"i": {i}}}' if i < n else None for i in ids]
            grid, valid = batch["grid"], batch.get("grid__valid")
            assert isinstance(grid, torch.Tensor) and grid.dtype == torch.float32 and grid.shape == (len(ids), 2, 3)
            for j, i in enumerate(ids):
                if i >= n:
                    assert torch.equal(grid[j], torch.from_numpy(tensors[i - n]))
                else:
                    assert valid is not None and not valid[j].any()
            flag = batch["flag"]
            assert isinstance(flag, torch.Tensor) and flag.dtype == torch.bool
            present = [i >= n and flags[i - n] is not None for i in ids]
            mask = batch.get("flag__valid")  # absent when no flag in the batch is null
            assert (mask.tolist() if mask is not None else [True] * len(ids)) == present
            assert flag.tolist() == [p and flags[i - n] != 0 for p, i in zip(present, ids)]
            seen += ids
    finally:
        ds.close()
    assert sorted(seen) == list(range(2 * n))


# --------------------------------------------------------------------------------------------- large row group
def shards_of(get: Callable[..., Any], url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        page = get(f"{url}/v1/shards?offset={len(out)}&limit=500").json()
        out += page["shards"]
        if len(out) >= page["total"] or not page["shards"]:
            return out


def test_a_large_row_group_is_read_in_slices(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                            get: Callable[..., Any]) -> None:
    rng = np.random.default_rng(12)
    n = 30_000
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "x": pa.array(rng.normal(size=n)),
        "blob": pa.array([rng.bytes(88) for _ in range(n)], pa.binary()),
    })
    assert table.nbytes > 3_000_000
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=n)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    upload(s3, path, f"{prefix}/big.parquet")

    d = daemon(source=f"s3://{prefix}", extra=["--unit-bytes", "1MiB", "--max-bytes", "256MiB"])
    samples = read_epoch(d.url, n)
    shards = [s for s in shards_of(get, d.url) if s["path"].endswith("big.parquet")]
    assert len(shards) >= 3, shards
    assert {(s["row_group"], s["row_groups"]) for s in shards} == {(0, 1)}, shards
    shards.sort(key=lambda s: s["first_row"])
    starts = [s["first_row"] for s in shards]
    assert starts[0] == 0, starts
    for a, b in zip(shards, shards[1:]):
        assert b["first_row"] == a["first_row"] + a["rows"], f"slices not contiguous: {starts}"
    assert sum(s["rows"] for s in shards) == n
    assert max(s["bytes"] for s in shards) < 2 * (1 << 20), [s["bytes"] for s in shards]
    compare_table(by_id(samples), table, "large row group")


# --------------------------------------------------------------------------------------------- tiny row groups
def test_tiny_row_groups_are_read_together(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                          get: Callable[..., Any]) -> None:
    groups, per = 2000, 5
    n = groups * per
    rng = np.random.default_rng(13)
    table = pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array(rng.integers(0, 1000, n), pa.int32()),
                      "s": pa.array([f"r{i}" for i in range(n)])})
    path = tmp_path / "tiny.parquet"
    pq.write_table(table, path, row_group_size=per)
    assert pq.ParquetFile(path).metadata.num_row_groups == groups
    upload(s3, path, f"{prefix}/tiny.parquet")

    d = daemon(source=f"s3://{prefix}")
    samples = read_epoch(d.url, n)
    compare_table(by_id(samples), table, "tiny row groups")

    status = get(d.url + "/v1/status").json()
    assert status["coverage"]["units"] <= groups // 10, status["coverage"]
    shards = shards_of(get, d.url)
    assert 1 <= len(shards) <= groups // 10 and status["shards"] == len(shards), len(shards)
    assert any(s["row_groups"] > 1 for s in shards)
    covered = sorted((s["row_group"], s["row_groups"]) for s in shards)
    nxt = 0
    for first, count in covered:  # the shards' row groups tile 0..groups-1 exactly
        assert first == nxt, f"row groups {nxt}..{first - 1} missing or overlapping: {covered[:10]}"
        nxt = first + count
    assert nxt == groups
    for s in shards:
        assert s["first_row"] == s["row_group"] * per and s["rows"] == s["row_groups"] * per, s
