"""End to end: a real S3 server, the real daemon as a subprocess (2 sampler processes), real DataLoader workers.

Every test starts its own daemon on a fresh cache dir (the ``daemon`` fixture of conftest.py) against the typed
dataset uploaded once per session: 3 Parquet files x 600 rows, row groups of 150 (12 remote units, 1800 samples).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from samplecache import SampleCacheDataset

pytestmark = pytest.mark.e2e

EXPECTED_SCHEMA = {  # column -> (kind, dtype, shape)
    "id": ("fixed", "<i8", []),
    "i8": ("fixed", "|i1", []),
    "u16": ("fixed", "<u2", []),
    "i32": ("fixed", "<i4", []),
    "f16": ("fixed", "<f2", []),
    "f32": ("fixed", "<f4", []),
    "f64": ("fixed", "<f8", []),
    "flag": ("fixed", "|b1", []),
    "tensor": ("fixed", "<f4", [4, 3]),
    "vec": ("fixed", "<i2", [5]),
    "const_list": ("list", "<f4", [-1]),
    "var_list": ("list", "<i4", [-1]),
    "nested": ("list", "<f8", [-1, -1]),
    "text": ("string", None, []),
    "blob": ("binary", None, []),
    "maybe_text": ("string", None, []),
}


def keep(sample: Any) -> Any:
    """collate_fn that hands samples through untouched (default_convert would turn numpy into tensors)."""
    return sample


# --------------------------------------------------------------------------------------------- schema
def test_schema_lists_every_column_with_its_kind(daemon: Any, typed_dataset: Any, get: Callable[..., Any]) -> None:
    d = daemon()
    r = get(d.url + "/v1/schema")
    assert r.status == 200, r.body
    body = r.json()
    got = {c["name"]: (c["kind"], c["dtype"], c["shape"]) for c in body["columns"]}
    assert list(got) == typed_dataset.table.column_names  # every column, in source order
    assert got == EXPECTED_SCHEMA
    assert body["skipped_columns"] == {}
    assert body["format_version"] >= 1
    assert "tensor" in (body.get("arrow_schema") or "")


# --------------------------------------------------------------------------------------------- reading
def test_dataloader_two_epochs_every_sample_once_and_bit_identical(daemon: Any, typed_dataset: Any, truth: Any,
                                                                    get: Callable[..., Any]) -> None:
    d = daemon()
    total = typed_dataset.rows
    ds = SampleCacheDataset(d.url, min_samples=total, wait=60)  # seals epoch 0 once all 1800 are cached
    loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=keep)
    orders = []
    for epoch in range(2):
        ids = truth.check_samples(iter(loader), typed_dataset.by_id)
        truth.check_exactly_once(ids, total)
        orders.append(ids)
    assert orders[0] != orders[1], "epoch 1 was delivered in the same order as epoch 0 (no reshuffle)"
    status = get(d.url + "/v1/status").json()
    sealed = [e["epoch"] for e in status["epochs"]]
    # the whole dataset was cached before job epoch 0 was sealed, so later job epochs read that same daemon epoch
    assert sealed == [0], sealed
    job = get(f"{d.url}/v1/jobs/{ds.job}").json()
    assert [(e["job_epoch"], e["daemon_epoch"]) for e in job["epochs"]][:2] == [(0, 0), (1, 0)], job["epochs"]
    assert all(e["samples"] == total for e in status["epochs"]), status["epochs"]
    assert status["samples"] == total and status["shards"] == typed_dataset.row_groups
    assert status["quarantined"] == [] and status["remote_errors"] == 0


def test_default_collate_batches_of_a_numeric_projection(daemon: Any, typed_dataset: Any, truth: Any) -> None:
    d = daemon()
    total = typed_dataset.rows
    cols = ["id", "i8", "u16", "f16", "f64", "flag", "tensor", "vec"]
    ds = SampleCacheDataset(d.url, columns=cols, min_samples=total, wait=60)
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    by_id = typed_dataset.by_id
    ids: list[int] = []
    sizes = []
    for batch in loader:
        assert isinstance(batch, dict) and sorted(batch) == sorted(cols)
        b = batch["id"].shape[0]
        sizes.append(b)
        shapes = {k: (v.dtype, tuple(v.shape)) for k, v in batch.items()}
        assert shapes == {
            "id": (torch.int64, (b,)), "i8": (torch.int8, (b,)), "u16": (torch.uint16, (b,)),
            "f16": (torch.float16, (b,)), "f64": (torch.float64, (b,)), "flag": (torch.bool, (b,)),
            "tensor": (torch.float32, (b, 4, 3)), "vec": (torch.int16, (b, 5)),
        }
        for j in range(b):
            sid = int(batch["id"][j])
            ids.append(sid)
            for name in cols:
                got = batch[name][j].numpy()
                exp = np.asarray(by_id[sid][name])
                assert got.dtype == exp.dtype and got.shape == exp.shape and got.tobytes() == exp.tobytes(), (
                    f"id {sid} column {name}: {got!r} != {exp!r}")
    truth.check_exactly_once(ids, total)
    assert max(sizes) == 8 and all(1 <= s <= 8 for s in sizes)
    assert sum(s < 8 for s in sizes) <= 2  # at most one short last batch per worker


# --------------------------------------------------------------------------------------------- epochs
def test_epoch_numbering_and_sealed_manifests(daemon: Any, typed_dataset: Any, get: Callable[..., Any]) -> None:
    d = daemon()
    r = get(d.url + "/v1/epochs/5")
    assert r.status == 409, r.body
    detail = r.json()["detail"]
    assert "5" in detail and "next one is 0" in detail

    first = get(d.url + f"/v1/epochs/0?min_samples={typed_dataset.rows}&timeout=60")
    assert first.status == 200, first.body
    again = get(d.url + "/v1/epochs/0?min_samples=999999&timeout=0")  # sealed: min_samples no longer matters
    assert again.status == 200 and again.body == first.body, "a sealed manifest changed on a second request"
    m0 = first.json()
    assert m0["epoch"] == 0 and m0["samples"] == typed_dataset.rows
    assert sum(s[1] for s in m0["shards"]) == typed_dataset.rows and len(m0["shards"]) == typed_dataset.row_groups

    r = get(d.url + "/v1/epochs/2")
    assert r.status == 409 and "next one is 1" in r.json()["detail"], r.body
    m1 = get(d.url + "/v1/epochs/1").json()
    assert m1["epoch"] == 1 and m1["samples"] == typed_dataset.rows and m1["new_samples"] == 0
    assert get(d.url + "/v1/epochs/1").body == get(d.url + "/v1/epochs/1").body
    assert get(d.url + "/v1/epochs/0").body == first.body
    status = get(d.url + "/v1/status").json()
    assert status["epochs_sealed"] == 2 and status["last_epoch"] == 1


# --------------------------------------------------------------------------------------------- restart
def read_epoch(url: str, epoch: int | None, **kw: Any) -> list[dict[str, Any]]:
    """Epoch 0 of a new job: daemon epoch ``epoch`` replayed, or (None) sealed now."""
    ds = SampleCacheDataset(url, **kw)
    ds.set_epoch(0, daemon_epoch=epoch)
    return list(ds)


def test_restart_keeps_the_cache_and_the_sealed_manifests(daemon: Any, typed_dataset: Any, truth: Any, tmp_path: Path,
                                                          get: Callable[..., Any], until: Callable[..., Any]) -> None:
    cache = tmp_path / "cache"
    d = daemon(cache_dir=cache)
    total = typed_dataset.rows
    before = read_epoch(d.url, None, min_samples=total)  # seals daemon epoch 0
    order = truth.check_samples(before, typed_dataset.by_id)
    truth.check_exactly_once(order, total)
    status = get(d.url + "/v1/status").json()
    sealed = [e["epoch"] for e in status["epochs"]]  # 0, and 1 if the client prefetched it
    manifests = {n: get(d.url + f"/v1/epochs/{n}").body for n in sealed}

    stopped = daemon.stop(d)
    assert stopped.code == 0 and stopped.seconds < 10, (
        f"exit code {stopped.code} {stopped.seconds:.1f} s after SIGTERM (want 0 within 10 s):\n{d.log_tail()}")
    assert stopped.leftovers == [], f"processes left in the daemon's group: {stopped.leftovers}"

    d2 = daemon(cache_dir=cache)
    for n, raw in manifests.items():
        assert get(d2.url + f"/v1/epochs/{n}").body == raw, f"the sealed manifest of epoch {n} changed in a restart"
    s2 = get(d2.url + "/v1/status").json()
    assert (s2["shards"], s2["samples"], s2["bytes"]) == (status["shards"], status["samples"], status["bytes"])
    assert [e["epoch"] for e in s2["epochs"]][:len(sealed)] == sealed
    after = read_epoch(d2.url, 0)
    assert truth.check_samples(after, typed_dataset.by_id) == order, "epoch 0 read differently after the restart"
    # nothing is sampled twice: the restarted daemon sees every unit resident and goes idle
    idle = until(lambda: (s := get(d2.url + "/v1/status").json())["sampler"]["state"] == "paused" and s, 20,
                 "the restarted daemon to go idle")
    assert idle["sampler"]["reason"] == "the whole remote dataset is cached"
    assert idle["shards"] == status["shards"] and idle["samples"] == total


def test_sigterm_while_sampling_is_a_clean_exit(daemon: Any, until: Callable[..., Any],
                                                get: Callable[..., Any]) -> None:
    d = daemon()
    until(lambda: get(d.url + "/v1/status").json()["samples"] > 0, 30, "the first samples")  # samplers busy
    stopped = daemon.stop(d)
    assert stopped.seconds < 10 and stopped.leftovers == []
    assert stopped.code == 0, f"exit code {stopped.code} after SIGTERM:\n{d.log_tail()}"


# --------------------------------------------------------------------------------------------- no torch
TORCH_MARKS = ("libtorch", "torch/_C", "/torch/lib/")


def torch_mappings(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted({line.split()[-1] for line in maps.splitlines() if any(m in line for m in TORCH_MARKS)})


def test_the_daemon_and_its_samplers_never_load_torch(daemon: Any, typed_dataset: Any, get: Callable[..., Any],
                                                      until: Callable[..., Any]) -> None:
    assert torch_mappings(os.getpid()), (
        "the maps check cannot see torch even in the test process, which imported it")
    d = daemon()
    until(lambda: get(d.url + "/v1/status").json()["samples"] == typed_dataset.rows, 60, "the whole dataset cached")
    assert d.proc is not None
    pids, frontier = [d.proc.pid], [d.proc.pid]
    while frontier:
        kids = [k for p in frontier for k in daemon.children_of(p)]
        pids += kids
        frontier = kids
    assert len(pids) >= 3, f"expected the daemon and its 2 sampler processes, found {pids}"
    loaded = {pid: torch_mappings(pid) for pid in pids}
    assert not any(loaded.values()), f"torch is mapped into daemon processes: {loaded}"

    code = ("import sys, samplecache_service.http.app, samplecache_service.daemon, samplecache_service.cli, "
            "samplecache_service.sampling.sampler, samplecache_service.sampling.supervisor, samplecache.format.record; "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
