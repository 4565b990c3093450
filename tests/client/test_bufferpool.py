"""``samplecache.reading.blocks.bufferpool``: reused output buffers, never written while anything still holds them.

Unit tests of the pool (numpy arrays, torch tensors made with ``torch.from_numpy``, tensor-backed buffers as the
pinned ones are), then the in-process PyTorch path end to end against a real daemon on a real S3 server: a batch
the consumer holds keeps its values while the next ones are read into the pool, every value equals the Parquet
truth, and buffers are recycled.
"""

from __future__ import annotations

import json
import pickle
import time
import urllib.request
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from samplecache import SampleCacheDataset, SampleCacheLoader
from samplecache.reading.blocks.bufferpool import ALIGN, MIN_BYTES, BufferPool
from samplecache_tools.launch import DaemonProcess

F4 = np.dtype("<f4")
SHAPE = (8, 4096)  # 128 KiB: pooled


def test_small_outputs_are_left_to_numpy() -> None:
    pool = BufferPool()
    assert pool.alloc("x", (10,), F4) is None
    assert pool.alloc("x", (MIN_BYTES // 4 - 1,), F4) is None
    assert pool.kept() == 0


def test_buffers_are_aligned_and_shaped() -> None:
    pool = BufferPool()
    for dtype in (F4, np.dtype("<i8"), np.dtype(bool)):
        a = pool.alloc("x", (4, 64, 1024), dtype)
        assert a is not None and a.shape == (4, 64, 1024) and a.dtype == dtype and a.ctypes.data % ALIGN == 0


HOLDERS = {
    "slice": lambda a: a[2:5],
    "reshaped": lambda a: a.reshape(-1),
    "tensor": lambda a: torch.from_numpy(a),
    "tensor of a slice, sliced": lambda a: torch.from_numpy(a[:4])[1:3],
    "tensor view": lambda a: torch.from_numpy(a).view(torch.int32),
}


@pytest.mark.parametrize("allocate", ["numpy", "tensor-backed"])
@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_buffer_is_reused_only_once_nothing_holds_it(allocate: str, holder: str) -> None:
    """Held by a view, a slice, a torch tensor or a view of that tensor: never handed out again until dropped.
    ``tensor-backed``: buffers made as the pinned ones are (a torch tensor's memory viewed as numpy)."""
    pool = BufferPool(lambda n: torch.empty(n, dtype=torch.uint8).numpy()) if allocate != "numpy" else BufferPool()
    a = pool.alloc("x", SHAPE, F4)
    assert a is not None
    first = a.ctypes.data
    a[:] = 1.0
    held = HOLDERS[holder](a)
    del a
    for _ in range(3):
        b = pool.alloc("x", SHAPE, F4)
        assert b is not None and b.ctypes.data != first
        b[:] = 2.0
        del b
    assert float(np.asarray(held).view(F4).min() if holder != "tensor view" else held.view(torch.float32).min()) == 1
    del held
    c = pool.alloc("x", SHAPE, F4)
    assert c is not None and c.ctypes.data == first  # free again: reused, not allocated again


def test_holding_more_batches_than_kept_is_safe() -> None:
    pool = BufferPool(per_size=3)
    held = []
    for i in range(10):
        a = pool.alloc("x", SHAPE, F4)
        assert a is not None
        a[:] = i
        held.append(a)
    assert pool.kept() == 3 and pool.made == 10
    assert [float(a.mean()) for a in held] == list(range(10))
    assert len({a.ctypes.data for a in held}) == 10


# ------------------------------------------------------------------------------------------------ end to end
N, WIDTH, BATCH = 96, 32768, 8  # 128 KiB a sample, 1 MiB a batch: each batch gathered alone, into the pool


@pytest.fixture(scope="module")
def large(s3: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, np.ndarray]]:
    """A daemon over N samples of 128 KiB (``x`` = float32 [32768], ``id``), all cached; (url, x by id)."""
    rng = np.random.default_rng(13)
    xs = rng.standard_normal((N, WIDTH), dtype=np.float32)
    table = pa.table({"id": pa.array(np.arange(N, dtype=np.int64)),
                      "x": pa.FixedSizeListArray.from_arrays(pa.array(xs.reshape(-1)), WIDTH)})
    prefix = f"{bucket}/bufferpool-large"
    fs = s3.fs()
    for k in range(2):
        with fs.open(f"{prefix}/part-{k}.parquet", "wb") as f:
            pq.write_table(table.slice(k * N // 2, N // 2), f, row_group_size=12)
    work = tmp_path_factory.mktemp("bufferpool-daemon")
    d = DaemonProcess(f"s3://{prefix}", work / "cache", extra=["--samplers", "2"], env=s3.env(),
                      log_path=work / "daemon.log")
    try:
        d.start(timeout=60)
        deadline = time.monotonic() + 90
        while _cached(d.url) < N:
            assert time.monotonic() < deadline, d.log_tail()
            time.sleep(0.1)
        yield d.url, xs
    finally:
        d.stop()


def _cached(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/status", timeout=30) as r:
        return int(json.loads(r.read())["samples"])


def _check(batch: dict[str, Any], xs: np.ndarray) -> None:
    ids = batch["id"].numpy()
    np.testing.assert_array_equal(batch["x"].numpy(), xs[ids])


def test_a_held_batch_is_never_overwritten(large: tuple[str, np.ndarray]) -> None:
    url, xs = large
    with SampleCacheDataset(url, ["id", "x"], batch_size=BATCH, seed=3) as ds:
        for k in (0, 3, 6):
            ds.set_epoch(k)
            it = iter(ds)
            for _ in range(k):
                _check(next(it), xs)
            held = next(it)  # batch k
            x, ids = held["x"], held["id"]
            before = x.clone()
            _check(held, xs)
            for _ in range(5):  # k+1 .. k+5 are gathered while batch k is held
                b = next(it)
                _check(b, xs)
                assert b["x"].data_ptr() != x.data_ptr()
            assert torch.equal(x, before) and torch.equal(ids, held["id"])
            _check(held, xs)
            del held, b
            for b in it:
                _check(b, xs)
        pool = ds.buffers()
        assert 0 < pool.kept() <= pool.made < 3 * N // BATCH  # recycled: far fewer buffers than batches


def test_every_batch_kept_keeps_its_values(large: tuple[str, np.ndarray]) -> None:
    """The consumer keeps a whole epoch (more batches than the pool keeps): none is overwritten."""
    url, xs = large
    with SampleCacheDataset(url, ["id", "x"], batch_size=BATCH) as ds:
        ds.set_epoch(1)
        kept = list(ds)
        assert len(kept) == N // BATCH and len({int(b["x"].data_ptr()) for b in kept}) == len(kept)
        ids = sorted(i for b in kept for i in b["id"].tolist())
        assert ids == list(range(N))
        for b in kept:
            _check(b, xs)


def test_loader_in_process_holds_and_recycles(large: tuple[str, np.ndarray]) -> None:
    """SampleCacheLoader with 0 workers over a per-sample dataset (its batching copy uses the pool)."""
    url, xs = large
    with SampleCacheDataset(url, ["id", "x"]) as ds:
        loader = SampleCacheLoader(ds, batch_size=BATCH, num_workers=0)
        ds.set_epoch(2)
        it = iter(loader)
        held = next(it)
        before = held["x"].clone()
        rest = [next(it)["id"].tolist() for _ in range(5)]
        assert torch.equal(held["x"], before)
        _check(held, xs)
        ids = held["id"].tolist() + [i for r in rest for i in r]
        for b in it:
            _check(b, xs)
            ids += b["id"].tolist()
        assert sorted(ids) == list(range(N))
        loader.close()


def test_buffer_pool_is_not_pickled(large: tuple[str, np.ndarray]) -> None:
    url, _ = large
    with SampleCacheDataset(url, ["id", "x"], batch_size=BATCH) as ds:
        ds.set_epoch(4)
        next(iter(ds))
        assert ds.buffers().kept() > 0
        copy = pickle.loads(pickle.dumps(ds))
        assert copy.buffers() is not ds.buffers() and copy.buffers().kept() == 0
        copy.close()


# ------------------------------------------------------------------------------------------- device=
def test_loader_device_hands_out_batches_there_and_counts_what_the_consumer_took(
        large: tuple[str, np.ndarray]) -> None:
    """``device="cpu"`` (the generic path; the CUDA path, one batch ahead on a side stream, needs a GPU): the same
    batches as without, and ``state_dict`` counts the batches handed out."""
    url, xs = large
    got: dict[str, list[list[int]]] = {}
    states: dict[str, dict[str, Any]] = {}
    for device in (None, "cpu"):
        with SampleCacheDataset(url, ["id", "x"], batch_size=BATCH) as ds:
            loader = SampleCacheLoader(ds, batch_size=None, num_workers=0, device=device)
            ds.set_epoch(5)
            ids = []
            for i, b in enumerate(loader):
                assert b["x"].device == torch.device("cpu")
                _check(b, xs)
                ids.append(b["id"].tolist())
                if i == 4:
                    states[str(device)] = {k: v for k, v in loader.state_dict().items() if k != "job"}
            got[str(device)] = ids
            loader.close()
    assert got["None"] == got["cpu"] and len(got["cpu"]) == N // BATCH
    assert states["None"] == states["cpu"] and states["cpu"]["batches"] == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without CUDA")
def test_loader_device_cuda_without_cuda_is_a_clear_error(large: tuple[str, np.ndarray]) -> None:
    url, _ = large
    with SampleCacheDataset(url, ["id", "x"], batch_size=BATCH) as ds:
        with pytest.raises(ValueError, match="CUDA is not available"):
            SampleCacheLoader(ds, batch_size=None, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on the CI host)")
def test_loader_device_cuda_values_and_held_batches(large: tuple[str, np.ndarray]) -> None:
    """On a GPU host: CUDA batches equal the truth, pinned pool buffers, a held batch keeps its values."""
    url, xs = large
    with SampleCacheDataset(url, ["id", "x"], batch_size=BATCH) as ds:
        loader = SampleCacheLoader(ds, batch_size=None, num_workers=0, device="cuda")
        ds.set_epoch(6)
        it = iter(loader)
        held = next(it)
        before = held["x"].clone()
        ids = held["id"].tolist()
        for b in it:
            assert b["x"].is_cuda
            np.testing.assert_array_equal(b["x"].cpu().numpy(), xs[b["id"].cpu().numpy()])
            ids += b["id"].tolist()
        assert torch.equal(held["x"], before) and sorted(ids) == list(range(N))
        loader.close()
