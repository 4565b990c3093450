"""Every DataLoader knob over ``SampleCacheDataset``, against one fully cached daemon (1191 samples, an odd total),
plus the client's errors on bad input (unreachable daemon, format version, invisible cache, refused epoch).

Exactly-once is always checked by ``id``; values are compared with the Parquet ground truth.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import client_common as cc  # noqa: E402
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate, get_worker_info

import samplecache.reading.epoch_source as epoch_source  # noqa: E402
from samplecache import DaemonError, SampleCacheDataset  # noqa: E402
from samplecache.api.client import fetch_manifest  # noqa: E402
from samplecache.format.record import FORMAT_VERSION, FormatError  # noqa: E402
from samplecache.reading.blocks.reader import CacheNotVisible  # noqa: E402

pytestmark = pytest.mark.e2e

TOTAL = cc.TOTAL
NUMERIC = ["id", "i8", "u16", "f16", "f32", "f64", "flag", "tensor", "vec"]


@pytest.fixture(scope="module")
def odd(s3: Any, bucket: str) -> cc.OddDataset:
    return cc.upload(s3, bucket)


@pytest.fixture(scope="module")
def by_id(odd: cc.OddDataset, truth: Any) -> dict[int, dict[str, Any]]:
    return truth.expected_rows(odd.table)


@pytest.fixture(scope="module")
def url(s3: Any, odd: cc.OddDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cc.cached_daemon(s3, odd, tmp_path_factory.mktemp("loader-daemon")) as d:
        yield d.url


def keep(x: Any) -> Any:
    return x


def batch_ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"].tolist()]


def check_batch_values(batch: dict[str, Any], by_id: dict[int, dict[str, Any]], cols: list[str]) -> None:
    for j, sid in enumerate(batch["id"].tolist()):
        for name in cols:
            got = batch[name][j]
            exp = by_id[int(sid)][name]
            got_np = got.numpy() if torch.is_tensor(got) else got
            assert np.asarray(got_np).tobytes() == np.asarray(exp).tobytes(), (sid, name, got, exp)


# --------------------------------------------------------------------------------------------- workers
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_num_workers_every_sample_once_with_default_collate(url: str, by_id: Any, truth: Any, workers: int) -> None:
    ds = SampleCacheDataset(url, columns=NUMERIC, seed=1)
    loader = DataLoader(ds, batch_size=16, num_workers=workers)
    ids: list[int] = []
    for batch in loader:
        assert sorted(batch) == sorted(NUMERIC)
        assert batch["tensor"].dtype == torch.float32 and batch["tensor"].shape[1:] == (4, 3)
        check_batch_values(batch, by_id, NUMERIC)
        ids += batch["id"].tolist()
    truth.check_exactly_once(ids, TOTAL)


def test_all_columns_per_sample_match_the_parquet_truth(url: str, by_id: Any, truth: Any) -> None:
    loader = DataLoader(SampleCacheDataset(url, seed=2), batch_size=None, num_workers=2, collate_fn=keep)
    truth.check_exactly_once(truth.check_samples(loader, by_id), TOTAL)


def test_pin_memory_on_a_cpu_only_build_warns_and_still_delivers_everything(url: str, truth: Any) -> None:
    """torch 2.13 CPU: DataLoader(pin_memory=True) needs an accelerator to pin; without one it warns once
    ("'pin_memory' argument is set as true but no accelerator is found") and hands out ordinary tensors."""
    ds = SampleCacheDataset(url, columns=["id", "tensor"], seed=3)
    loader = DataLoader(ds, batch_size=32, num_workers=2, pin_memory=True)
    if torch.accelerator.is_available():  # pragma: no cover - only on a GPU host
        batches = list(loader)
        assert all(b["tensor"].is_pinned() for b in batches)
    else:
        with pytest.warns(UserWarning, match="pin_memory"):
            batches = list(loader)
        assert not any(b["tensor"].is_pinned() for b in batches)
    truth.check_exactly_once([i for b in batches for i in b["id"].tolist()], TOTAL)


def test_pin_memory_on_the_batched_path(url: str, truth: Any) -> None:
    ds = SampleCacheDataset(url, columns=["id", "tensor"], seed=3, batch_size=32)
    loader = DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        truth.check_exactly_once(batch_ids(loader), TOTAL)


def test_persistent_workers_advance_the_epoch_without_set_epoch(url: str, truth: Any) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=4)
    loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)
    orders = []
    pids_before = None
    for epoch in range(3):
        ids = batch_ids(loader)
        truth.check_exactly_once(ids, TOTAL)
        assert ds.current_epoch() == epoch, f"iteration {epoch} read epoch {ds.current_epoch()}"
        pids = sorted(w.pid for w in loader._iterator._workers)  # type: ignore[union-attr]
        assert pids_before is None or pids == pids_before, "persistent workers were restarted"
        pids_before = pids
        orders.append(ids)
    assert len({tuple(o) for o in orders}) == 3, "two iterations delivered the same order"
    # each iteration is exactly what a fresh loader reading that epoch delivers
    for epoch, got in enumerate(orders):
        fresh = SampleCacheDataset(url, columns=["id"], seed=4)
        fresh.set_epoch(epoch)
        assert batch_ids(DataLoader(fresh, batch_size=16, num_workers=2)) == got, f"epoch {epoch}"


def test_non_persistent_workers_also_advance_the_epoch(url: str, truth: Any) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=4)
    loader = DataLoader(ds, batch_size=16, num_workers=2)
    seen = []
    for epoch in range(2):
        truth.check_exactly_once(batch_ids(loader), TOTAL)
        seen.append(ds.current_epoch())
    assert seen == [0, 1]


def test_prefetch_factor_4(url: str, truth: Any) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=5)
    loader = DataLoader(ds, batch_size=8, num_workers=2, prefetch_factor=4)
    truth.check_exactly_once(batch_ids(loader), TOTAL)


def collate_ids_and_text(samples: list[dict[str, Any]]) -> tuple[list[int], list[str], int]:
    return [int(s["id"]) for s in samples], [s["text"] for s in samples], len(samples)


def test_custom_collate_fn(url: str, by_id: Any, truth: Any) -> None:
    ds = SampleCacheDataset(url, columns=["id", "text"], seed=6)
    loader = DataLoader(ds, batch_size=10, num_workers=2, collate_fn=collate_ids_and_text)
    ids: list[int] = []
    for got_ids, texts, n in loader:
        assert n == len(got_ids) == len(texts) and 1 <= n <= 10
        assert all(isinstance(t, str) for t in texts)
        assert texts == [by_id[i]["text"] for i in got_ids]
        ids += got_ids
    truth.check_exactly_once(ids, TOTAL)


def record_pid(sample: dict[str, Any]) -> dict[str, Any]:
    sample["pid"] = os.getpid()
    sample["doubled"] = int(sample["id"]) * 2
    return sample


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_runs_in_the_workers(url: str, truth: Any, workers: int) -> None:
    ds = SampleCacheDataset(url, columns=["id"], transform=record_pid, seed=7)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=keep)
    samples = list(loader)
    truth.check_exactly_once([int(s["id"]) for s in samples], TOTAL)
    assert all(s["doubled"] == 2 * int(s["id"]) for s in samples)
    pids = {s["pid"] for s in samples}
    if workers == 0:
        assert pids == {os.getpid()}
    else:
        assert os.getpid() not in pids and len(pids) == workers, pids


def test_transform_on_the_batched_path_gets_whole_batches(url: str, truth: Any) -> None:
    def tag(batch: dict[str, Any]) -> dict[str, Any]:
        info = get_worker_info()
        batch["worker"] = None if info is None else info.id
        batch["pid"] = os.getpid()
        return batch

    ds = SampleCacheDataset(url, columns=["id"], transform=tag, seed=7, batch_size=50)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert {b["worker"] for b in batches} == {0, 1}
    assert os.getpid() not in {b["pid"] for b in batches}
    truth.check_exactly_once([i for b in batches for i in b["id"].tolist()], TOTAL)


@pytest.mark.parametrize("cols", [["id"], ["text", "id", "tensor"], ["maybe_text", "id", "var_list", "blob"]])
def test_columns_projection_yields_only_those_keys(url: str, by_id: Any, truth: Any, cols: list[str]) -> None:
    ds = SampleCacheDataset(url, columns=cols, seed=8)
    samples = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=keep))
    assert all(sorted(s) == sorted(cols) for s in samples)
    truth.check_exactly_once(truth.check_samples(samples, by_id, columns=cols), TOTAL)


def test_unknown_column_is_a_key_error_naming_the_cached_columns(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id", "nope"])
    with pytest.raises(KeyError, match="nope.*the cache has"):
        next(iter(ds))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("buffer", [7, 64, 5000])
def test_shuffle_buffer_keeps_exactly_once(url: str, truth: Any, workers: int, buffer: int) -> None:
    plain = SampleCacheDataset(url, columns=["id"], seed=9)
    plain.set_epoch(3)
    mixed = SampleCacheDataset(url, columns=["id"], seed=9, shuffle_buffer=buffer)
    mixed.set_epoch(3)
    a = batch_ids(DataLoader(plain, batch_size=16, num_workers=workers))
    b = batch_ids(DataLoader(mixed, batch_size=16, num_workers=workers))
    truth.check_exactly_once(b, TOTAL)
    assert a != b, "shuffle_buffer did not change the order"
    again = SampleCacheDataset(url, columns=["id"], seed=9, shuffle_buffer=buffer)
    again.set_epoch(3)
    assert batch_ids(DataLoader(again, batch_size=16, num_workers=workers)) == b, "not deterministic"


# --------------------------------------------------------------------------------------------- batched path
def unbatch(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A collated batch's samples, as DataLoader's collation had them (tensor rows, list items)."""
    return [{k: v[i] for k, v in batch.items()} for i in range(len(batch["id"]))]


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_path_tensors_dtype_shape_and_the_short_last_batch(url: str, by_id: Any, truth: Any,
                                                                   workers: int) -> None:
    b = 32
    cols = NUMERIC + ["text", "maybe_text"]
    ds = SampleCacheDataset(url, columns=cols, seed=10, batch_size=b)
    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    expected_types = {"id": torch.int64, "i8": torch.int8, "u16": torch.uint16, "f16": torch.float16,
                      "f32": torch.float32, "f64": torch.float64, "flag": torch.bool, "tensor": torch.float32,
                      "vec": torch.int16}
    shapes = {"tensor": (4, 3), "vec": (5,)}
    for batch in batches:
        n = len(batch["id"])
        assert sorted(batch) == sorted(cols)
        for name, dt in expected_types.items():
            assert torch.is_tensor(batch[name]) and batch[name].dtype == dt, (name, type(batch[name]))
            assert tuple(batch[name].shape) == (n, *shapes.get(name, ())), (name, batch[name].shape)
        assert isinstance(batch["text"], list) and len(batch["text"]) == n
        check_batch_values(batch, by_id, cols)
    sizes = [len(x["id"]) for x in batches]
    ids = [i for x in batches for i in x["id"].tolist()]
    truth.check_exactly_once(ids, TOTAL)
    # the epoch's one order is dealt in batches to the workers in turn: only its last batch is short
    shorts = sorted(s for s in sizes if s != b)
    assert shorts == ([TOTAL % b] if TOTAL % b else []), (shorts, sizes)


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_path_drop_last_drops_only_the_short_last_batch(url: str, workers: int) -> None:
    b = 32
    ds = SampleCacheDataset(url, columns=["id"], seed=10, batch_size=b, drop_last=True)
    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert {len(x["id"]) for x in batches} == {b}
    ids = [i for x in batches for i in x["id"].tolist()]
    assert len(ids) == len(set(ids)), "duplicates"
    assert len(ids) == TOTAL // b * b
    # the same samples as without drop_last, minus the short batches
    full = SampleCacheDataset(url, columns=["id"], seed=10, batch_size=b)
    assert set(ids) < set(batch_ids(DataLoader(full, batch_size=None, num_workers=workers)))


def test_batched_path_with_a_shuffle_buffer(url: str, truth: Any) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=12, batch_size=20, shuffle_buffer=100)
    truth.check_exactly_once(batch_ids(DataLoader(ds, batch_size=None, num_workers=2)), TOTAL)


@pytest.mark.parametrize("opts", [{}, {"prefetch_factor": 4}, {"persistent_workers": True}, {"pin_memory": True}])
def test_sample_cache_loader_batched_ring_path_values_survive_slot_reuse(url: str, by_id: Any, truth: Any,
                                                                         opts: dict[str, Any]) -> None:
    """SampleCacheLoader moves the batched path's batches through a reused shared-memory ring: every batch
    handed out must own its memory (kept batches stay intact while later batches reuse the slots)."""
    from samplecache import SampleCacheLoader

    cols = ["id", "f64", "tensor", "vec", "text"]
    ds = SampleCacheDataset(url, columns=cols, seed=14, batch_size=24)
    loader = SampleCacheLoader(ds, batch_size=None, num_workers=2, **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator
        for _epoch in range(2 if opts.get("persistent_workers") else 1):
            kept = list(loader)  # all of them held at once, checked only after the loop
            for batch in kept:
                assert isinstance(batch, dict) and sorted(batch) == sorted(cols), type(batch)
                assert batch["tensor"].dtype == torch.float32 and batch["tensor"].shape[1:] == (4, 3)
                assert batch["vec"].dtype == torch.int16 and isinstance(batch["text"], list)
                check_batch_values(batch, by_id, cols)
            truth.check_exactly_once([i for b in kept for i in b["id"].tolist()], TOTAL)


@pytest.mark.parametrize("cols", [["id", "f16", "f64", "tensor", "vec", "flag"],
                                  ["id", "const_list", "text", "tensor"]])
@pytest.mark.parametrize("workers", [0, 2])
def test_sample_cache_loader_batches_a_per_sample_dataset_exactly_like_default_collate(
        url: str, by_id: Any, workers: int, cols: list[str]) -> None:
    """A per-sample dataset through SampleCacheLoader is batched by the dataset (vectorised, through the ring
    with workers): the same batches, with the same types, as DataLoader's collation (a list column of equal
    lengths stacked, strings as lists). In-process they come in the same order; with workers each worker's
    small fixed-shape batches come in packs (one message for several). The caller's dataset stays per-sample."""
    from samplecache import SampleCacheLoader

    mine = SampleCacheDataset(url, columns=cols, seed=21)
    loader = SampleCacheLoader(mine, batch_size=40, num_workers=workers)
    plain = DataLoader(SampleCacheDataset(url, columns=cols, seed=21), batch_size=40, num_workers=workers)
    assert loader.dataset.batch_size == 40 and mine.batch_size is None  # a batching copy; the caller's untouched
    assert loader._direct() == (workers == 0)  # in-process: batches straight from the dataset, not DataLoader's loop
    got, want = list(loader), list(plain)
    assert len(got) == len(want) and len(got) > 2
    if workers:
        assert loader._packed == all(c not in ("const_list", "text") for c in cols)  # packs: fixed columns only
        # a plain DataLoader's workers take turns by runs of samples, the loader's by batches: the batches hold
        # other samples, so each of the loader's is compared with DataLoader's collation of its own samples
        samples = {int(x["id"]): x for batch in want for x in unbatch(batch)}
        assert sorted(samples) == sorted(i for a in got for i in a["id"].tolist())
        want = [default_collate([samples[i] for i in a["id"].tolist()]) for a in got]
    for a, b in zip(got, want):
        assert sorted(a) == sorted(b) == sorted(cols)
        for k in cols:
            assert type(a[k]) is type(b[k]), k
            if torch.is_tensor(b[k]):
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
                assert torch.equal(a[k], b[k]), k
            else:
                assert a[k] == b[k], k
    check_batch_values(got[0], by_id, [c for c in cols if c != "text"])
    # the caller's dataset is still per-sample: a plain DataLoader over it collates samples, not batches
    again = next(iter(DataLoader(mine, batch_size=8)))
    assert again["id"].shape == (8,)


def test_a_dataset_used_by_sample_cache_loader_still_works_in_a_plain_dataloader(url: str) -> None:
    from samplecache import SampleCacheLoader

    ds = SampleCacheDataset(url, columns=["id", "tensor"], seed=15, batch_size=16)
    assert all(isinstance(b, dict) for b in SampleCacheLoader(ds, batch_size=None, num_workers=2))
    plain = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert all(isinstance(b, dict) for b in plain), type(plain[0])


def test_per_sample_drop_last_in_the_dataloader(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=13)
    batches = list(DataLoader(ds, batch_size=32, num_workers=2, drop_last=True))
    ids = [i for x in batches for i in x["id"].tolist()]
    assert {len(x["id"]) for x in batches} == {32} and len(ids) == len(set(ids))
    # each of the 2 workers' last partial batch is dropped: fewer than 32 samples each
    assert TOTAL - 2 * 31 <= len(ids) <= TOTAL and len(ids) % 32 == 0, len(ids)


def live_leases(url: str) -> dict[str, dict[str, Any]]:
    return {lease["id"]: lease for lease in cc.get_json(url + "/v1/status")["leases"]}


def test_a_dropped_dataset_releases_the_lease_it_took_ahead(url: str) -> None:
    before = set(live_leases(url))
    ds = SampleCacheDataset(url, columns=["id"], seed=16)
    ds.set_epoch(6)
    assert len(list(ds)) == TOTAL
    # read here: the lambda must not keep a name that `del ds` below drops
    job = ds.job
    ahead = cc.wait_for(lambda: {k: v for k, v in live_leases(url).items()
                                 if k not in before and v["job"] == job and v["job_epoch"] == 7},
                        10, "the lease on job epoch 7 taken ahead")
    assert len(ahead) == 1, ahead
    del ds
    gc.collect()
    deadline = time.monotonic() + 5
    while set(ahead) & set(live_leases(url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(ahead) & set(live_leases(url)), "the dropped dataset still holds its lease on epoch 7"


def test_the_next_epoch_is_fetched_and_leased_ahead_exactly_once(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Epochs read back to back: each epoch is mapped and leased once in this process, ahead (while the epoch
    before it is read: a short epoch's next one at its start), never again at the boundary, and a daemon epoch's
    manifest is fetched once; closing releases every lease, the one taken for the epoch after the last too."""
    fetched: list[int] = []
    leased: list[int] = []
    real_fetch, real_keeper = epoch_source.fetch_manifest, epoch_source.LeaseKeeper

    def fetch(u: str, epoch: int, *a: Any, **k: Any) -> Any:
        fetched.append(epoch)
        return real_fetch(u, epoch, *a, **k)

    class Keeper(real_keeper):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            leased.append(int(k["job_epoch"]))
            super().__init__(*a, **k)

    monkeypatch.setattr(epoch_source, "fetch_manifest", fetch)
    monkeypatch.setattr(epoch_source, "LeaseKeeper", Keeper)
    before = set(live_leases(url))
    ds = SampleCacheDataset(url, columns=["id"], seed=17, batch_size=64)
    for epoch in range(3):
        ds.set_epoch(epoch)
        assert sum(len(b["id"]) for b in ds) == TOTAL
    # taken ahead on a thread: the Keeper counts it as its request starts, the daemon lists it once it answered
    cc.wait_for(lambda: len(leased) == 4 and any(v["job"] == ds.job and v["job_epoch"] == 3
                                                 for v in live_leases(url).values()) or None,
                10, "the lease on job epoch 3, taken ahead")
    assert sorted(leased) == [0, 1, 2, 3], leased  # once each: epochs 1-3 ahead, none again at their start
    # a manifest once per daemon epoch: job epochs of an idle cache read one sealed epoch, fetched once
    assert fetched and len(fetched) == len(set(fetched)) == len({ds.plan(e).daemon_epoch for e in range(4)}), fetched
    mine = {k for k, v in live_leases(url).items() if k not in before and v["job"] == ds.job}
    assert {live_leases(url)[k]["job_epoch"] for k in mine} == {3}  # the epochs read were released at their end
    ds.close()
    assert not mine & set(live_leases(url)), "close() left the lease taken ahead"


def test_a_loop_that_fails_mid_epoch_leaves_no_lease(url: str) -> None:
    """The training loop raises in the middle of an epoch (after the next one was leased ahead): the epoch's
    lease goes when its iterator is dropped, the one taken ahead when the dataset is closed."""
    before = set(live_leases(url))
    ds = SampleCacheDataset(url, columns=["id"], seed=18, batch_size=64)
    with pytest.raises(RuntimeError, match="the step failed"):
        for n, _ in enumerate(ds):
            if n == 5:
                raise RuntimeError("the step failed")
    job = ds.job
    ds.close()
    left = {k: v for k, v in live_leases(url).items() if k not in before and v["job"] == job}
    assert not left, left


# --------------------------------------------------------------------------------------------- bad input
def test_unreachable_daemon_is_a_daemon_error_naming_the_url_after_bounded_retries() -> None:
    dead = f"http://127.0.0.1:{cc.free_port()}"
    ds = SampleCacheDataset(dead, retries=1)
    t0 = time.monotonic()
    with pytest.raises(DaemonError) as info:
        next(iter(ds))
    took = time.monotonic() - t0
    msg = str(info.value)
    assert dead in msg and "2 attempts" in msg and "cannot connect" in msg, msg
    assert took < 10, f"retries=1 took {took:.1f} s"


def test_unreachable_daemon_with_workers_is_a_daemon_error_too() -> None:
    dead = f"http://127.0.0.1:{cc.free_port()}"
    loader = DataLoader(SampleCacheDataset(dead, retries=1), batch_size=None, num_workers=2)
    with pytest.raises(DaemonError, match=dead.replace(".", r"\.")):
        next(iter(loader))


class StubDaemon:
    """A tiny HTTP server in a thread that maps every job epoch to daemon epoch 0 and answers GET /v1/epochs/N
    with a given manifest."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        body = json.dumps(manifest).encode()
        job = json.dumps({"start_epoch": 0}).encode()
        mapped = json.dumps({"daemon_epoch": 0}).encode()

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, raw: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/v1/epochs/"):
                    self._reply(body)
                else:
                    self.send_error(404)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/jobs":
                    self._reply(job)
                elif self.path.startswith("/v1/jobs/"):
                    self._reply(mapped)
                else:
                    self.send_error(404)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "StubDaemon":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_format_version_mismatch_names_both_versions(url: str) -> None:
    """A daemon of a newer record format (v999 everywhere it says so) against this client (v1)."""
    manifest = fetch_manifest(url, 0)
    manifest["format_version"] = 999
    manifest["schema"]["format_version"] = 999
    with StubDaemon(manifest) as stub:
        ds = SampleCacheDataset(stub.url, lease=False, retries=0)
        with pytest.raises(FormatError) as info:
            next(iter(ds))
    msg = str(info.value)
    assert "999" in msg and f"v{FORMAT_VERSION}" in msg and "version mismatch" in msg, msg


def test_manifest_format_version_alone_is_checked(url: str) -> None:
    manifest = fetch_manifest(url, 0)
    manifest["format_version"] = 999  # the manifest layout changed; the schema block still says v1
    with StubDaemon(manifest) as stub:
        ds = SampleCacheDataset(stub.url, lease=False, retries=0)
        with pytest.raises((FormatError, ValueError, DaemonError)) as info:
            next(iter(ds))
    assert "999" in str(info.value) and str(FORMAT_VERSION) in str(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_invisible_cache_dir_is_cache_not_visible_naming_the_path_and_the_setting(
        url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workers: int) -> None:
    manifest = fetch_manifest(url, 0)
    missing = str(tmp_path / "not-mounted" / "lmdb")
    real = epoch_source.fetch_manifest

    def fake(*args: Any, **kwargs: Any) -> dict[str, Any]:
        m = real(*args, **kwargs)
        return {**m, "lmdb_path": missing}

    monkeypatch.setattr(epoch_source, "fetch_manifest", fake)  # epoch_source.py imported the name
    loader = DataLoader(SampleCacheDataset(url, columns=["id"]), batch_size=None, num_workers=workers)
    with pytest.raises(CacheNotVisible) as info:
        next(iter(loader))
    msg = str(info.value)
    assert missing in msg and "--cache-dir" in msg and "SAMPLECACHE_CACHE_DIR" in msg, msg
    assert manifest["lmdb_path"] != missing


def test_refused_request_is_a_daemon_error_with_the_daemons_message(url: str) -> None:
    """A run whose job was taken over by another run (same job name) is refused with the daemon's words."""
    ds = SampleCacheDataset(url, columns=["id"], job="loader-taken-over", retries=1, prefetch_next=False)
    assert len(list(ds)) == TOTAL
    newer = SampleCacheDataset(url, columns=["id"], job="loader-taken-over", retries=1)
    assert len(list(newer)) == TOTAL  # a new run of the job: it takes the job over
    with pytest.raises(DaemonError) as info:
        next(iter(ds))
    err = info.value
    msg = str(err)
    assert err.status == 409 and "taken over by a newer run" in msg and "'loader-taken-over'" in msg, msg
    assert "409" in msg and url in msg
    assert "Traceback" not in msg and "HTTPError" not in msg and "urllib" not in msg
    assert err.__cause__ is None and err.__suppress_context__, "the HTTP stack leaked into the error chain"
    ds.close()
    newer.close()


def test_refused_request_through_worker_processes(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], job="loader-taken-over-2", retries=1, prefetch_next=False)
    assert len(list(ds)) == TOTAL
    SampleCacheDataset(url, columns=["id"], job="loader-taken-over-2").close()
    newer = SampleCacheDataset(url, columns=["id"], job="loader-taken-over-2")
    newer.next_epoch()  # attaches: the job is the newer run's now
    with pytest.raises(DaemonError, match="taken over by a newer run"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=2)))
    ds.close()
    newer.close()


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="partial"):
        SampleCacheDataset("http://127.0.0.1:1", partial="even")
    with pytest.raises(ValueError, match="batch_size"):
        SampleCacheDataset("http://127.0.0.1:1", batch_size=0)
    with pytest.raises(ValueError, match="copy_threads"):
        SampleCacheDataset("http://127.0.0.1:1", copy_threads=0)
    with pytest.raises(ValueError, match="epoch"):
        SampleCacheDataset("http://127.0.0.1:1").set_epoch(-1)
