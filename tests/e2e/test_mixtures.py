"""Several sources on one daemon and jobs that read exact weighted mixtures of them (issue 24), with real parts:
three prefixes of different sizes on the S3 server (their schemas differ: code has a column more, first, and math
two more, last; code holds x as float64 and math id as int32, which unify with the others' types), a daemon
subprocess, ``SampleCacheLoader`` with 2 workers, torchrun 2 ranks x 2 workers, and the fault proxy for a source
whose remote fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import client_common as cc  # noqa: E402
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from faultproxy import FaultProxy
from paths import SCRIPTS

from samplecache import SampleCacheDataset, SampleCacheLoader
from samplecache.reading.ordering.apportion import apportion, largest_epoch
from samplecache_tools.launch import DaemonProcess

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "mixture_train.py"
# name -> (files, rows per file, first id): ids tell the source (id // BASE)
SOURCES = {"web": (3, 400, 0), "code": (2, 150, 100_000), "math": (1, 90, 200_000)}
BASE = 100_000
ROWS = {n: f * r for n, (f, r, _) in SOURCES.items()}
NAMES = ["web", "code", "math"]  # by id // BASE
MIX = {"web": 0.7, "code": 0.2, "math": 0.1}
LAUNCH_TIMEOUT = 150


def _table(name: str, file: int, rows: int, first: int) -> pa.Table:
    ids = np.arange(first + file * rows, first + (file + 1) * rows, dtype=np.int64)
    cols: dict[str, Any] = {"id": ids, "x": (ids % 1000).astype(np.float32)}
    if name == "code":  # another layout (its columns come later), and x as float64: read widened from web
        cols = {"lang": pa.array(["py"] * rows), "id": ids, "x": cols["x"].astype(np.float64)}
    if name == "math":  # id as int32: read as int64 with the others; a lang that cannot unify with code's
        cols = {"id": ids.astype(np.int32), "x": cols["x"], "level": np.full(rows, 3, np.int8),
                "lang": np.full(rows, 7, np.int8)}
    return pa.table(cols)


def upload(s3: Any, bucket: str, tag: str) -> dict[str, str]:
    fs, urls = s3.fs(), {}
    for name, (files, rows, first) in SOURCES.items():
        prefix = f"{bucket}/{tag}/{name}"
        for f in range(files):
            with fs.open(f"{prefix}/part-{f}.parquet", "wb") as out:
                pq.write_table(_table(name, f, rows, first), out, row_group_size=50)
        urls[name] = f"s3://{prefix}/"
    return urls


def serve(s3: Any, urls: dict[str, str], workdir: Path, env: dict[str, str] | None = None,
          extra: tuple[str, ...] = ()) -> DaemonProcess:
    named = [a for n, u in urls.items() if n != "web" for a in ("--source", f"{n}={u}")]
    d = DaemonProcess(f"web={urls['web']}", workdir / "cache", extra=[*named, "--samplers", "2", *extra],
                      env=env or s3.env(), log_path=workdir / "daemon.log")
    d.start(timeout=60)
    return d


def sources(d: DaemonProcess) -> dict[str, Any]:
    return {s["name"]: s for s in cc.get_json(d.url + "/v1/sources")}


@pytest.fixture(scope="module")
def url(s3: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    urls = upload(s3, bucket, "mixtures")
    d = serve(s3, urls, tmp_path_factory.mktemp("mixtures-daemon"))
    try:
        cc.wait_for(lambda: all(sources(d)[n]["samples"] == ROWS[n] for n in NAMES), 90, "every source cached")
        yield d.url
    finally:
        d.stop()


def expected(weights: dict[str, float], epoch_samples: int | None = None) -> dict[str, int]:
    """Largest remainder over the sources in name order (a manifest's order: ties go to the first)."""
    names = sorted(NAMES)
    w = [weights.get(n, 0.0) for n in names]
    n = epoch_samples if epoch_samples is not None else largest_epoch([ROWS[s] for s in names], w)
    return {s: c for s, c in zip(names, apportion(n, w)) if weights.get(s, 0.0) > 0}


def by_source(ids: list[int] | np.ndarray) -> dict[str, int]:
    got = Counter(NAMES[int(i) // BASE] for i in ids)
    return {n: got[n] for n in NAMES if got[n]}


def read_epochs(loader: SampleCacheLoader, epochs: int) -> list[list[np.ndarray]]:
    """Each epoch's batches of ids."""
    return [[b["id"].numpy().ravel() for b in loader] for _ in range(epochs)]


@pytest.mark.parametrize("mix", ["random", "stratified"])
def test_every_epoch_holds_exact_per_source_counts(url: str, mix: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], mixture=MIX, mix=mix, job=f"exact-{mix}", seed=5)
    loader = SampleCacheLoader(ds, batch_size=32, num_workers=2)
    want = expected(MIX)
    assert want["math"] == ROWS["math"]  # math's 90 rows are the limit: no sample repeats
    for e, batches in enumerate(read_epochs(loader, 2)):
        ids = np.concatenate(batches)
        assert by_source(ids) == want, f"epoch {e}"
        assert len(set(ids.tolist())) == len(ids), "a sample read twice in one epoch"
        assert ds.mixture_counts(ds.current_epoch()) == want
        if mix == "stratified":
            for b in batches[:-1]:
                got = by_source(b)
                for n, w in MIX.items():
                    assert abs(got.get(n, 0) - 32 * w) < 1, (n, got)
    ds.close()
    # the job's record: each epoch's mixture and counts, and its samples read per source (reported by its leases)

    def recorded() -> Any:
        rows = cc.get_json(f"{url}/v1/jobs/exact-{mix}")["epochs"][:2]  # a third: the next, fetched ahead
        return all(r["samples_read_by_source"] == want for r in rows) and rows
    for row in cc.wait_for(recorded, 30, "the job's per-source reads"):
        assert row["mixture"] == {"mixture": MIX, "mix": mix, "epoch_samples": None, "counts": want}, row


def test_upsampling_repeats_each_sample_floor_or_ceil_times(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], mixture=MIX, epoch_samples=2000, job="upsampled")
    loader = SampleCacheLoader(ds, batch_size=50, num_workers=2)
    ids = np.concatenate(read_epochs(loader, 1)[0])
    want = expected(MIX, 2000)
    assert by_source(ids) == want == {"web": 1400, "code": 400, "math": 200}
    times = Counter(ids.tolist())
    for name in NAMES:
        k = want[name] / ROWS[name]
        got = Counter(times[i] for i in range(SOURCES[name][2], SOURCES[name][2] + ROWS[name]))
        assert set(got) <= {int(k), -(-want[name] // ROWS[name])}, (name, got)  # floor or ceil, never 0
        assert sum(c * n for c, n in got.items()) == want[name]
    ds.close()


def test_new_weights_take_effect_at_the_next_epoch(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], mixture=MIX, job="curriculum")
    loader = SampleCacheLoader(ds, batch_size=40, num_workers=2)
    first = np.concatenate([b["id"].numpy().ravel() for b in loader])
    ds.set_mixture({"code": 1.0, "math": 1.0})
    second = np.concatenate([b["id"].numpy().ravel() for b in loader])
    assert by_source(first) == expected(MIX)
    assert by_source(second) == expected({"code": 1.0, "math": 1.0}) == {"code": 91, "math": 90}
    ds.close()


def test_two_jobs_read_different_mixtures_at_once(url: str) -> None:
    a = SampleCacheDataset(url, columns=["id"], mixture={"web": 1, "math": 1}, job="mix-a", seed=1)
    b = SampleCacheDataset(url, columns=["id"], mixture={"code": 3, "math": 1}, mix="stratified", job="mix-b")
    got: dict[str, list[int]] = {"a": [], "b": []}
    iters = {"a": iter(SampleCacheLoader(a, batch_size=16, num_workers=2)),
             "b": iter(SampleCacheLoader(b, batch_size=16))}
    while iters:  # batch by batch, in turn: both jobs read (and lease) the same cached sources at once
        for k in list(iters):
            batch = next(iters[k], None)
            if batch is None:
                del iters[k]
            else:
                got[k] += batch["id"].ravel().tolist()
    assert by_source(got["a"]) == expected({"web": 1, "math": 1})
    assert by_source(got["b"]) == expected({"code": 3, "math": 1})
    for ids in got.values():
        assert len(set(ids)) == len(ids)
    for ds in (a, b):
        ds.close()


# -- torchrun: 2 ranks x 2 workers, stratified; a kill mid-epoch and a resume with other weights -----------
def launch(url: str, out: Path, ranks: int, cfg: dict[str, Any], state: Path | None = None
           ) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
           "--master-addr", "127.0.0.1", "--master-port", str(cc.free_port()), str(SCRIPT), url, str(out),
           json.dumps(cfg)] + ([str(state)] if state else [])
    log = open(out / f"log-{cfg['run']}.txt", "wb")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=cc.child_env({"TMPDIR": str(out)}))
    finally:
        log.close()


def lines(path: Path) -> list[list[Any]]:
    raw = path.read_bytes() if path.exists() else b""
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]


def finish(proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        assert proc.wait(LAUNCH_TIMEOUT) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_ddp_2x2_stratified_global_batches_and_a_curriculum(url: str, tmp_path: Path) -> None:
    cfg = {"run": "ddp", "job": "ddp-mix", "mixture": MIX, "mix": "stratified", "batch_size": 16, "workers": 2,
           "epochs": 2, "then_mixture": {"web": 1, "code": 1}}
    finish(launch(url, tmp_path, 2, cfg), tmp_path / "log-ddp.txt")
    ranks = [lines(tmp_path / f"ids-ddp-rank{r}.jsonl") for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]), "the ranks made different step counts"
    epochs = sorted({e for e, _ in ranks[0]})
    assert len(epochs) == 2
    for e, weights in zip(epochs, (MIX, {"web": 1, "code": 1})):
        steps = [(a[1], b[1]) for a, b in zip(*ranks) if a[0] == e]
        ids = [i for a, b in steps for i in a + b]
        assert by_source(ids) == expected(weights), f"epoch {e}"
        assert len(set(ids)) == len(ids)
        for a, b in steps[:-1]:  # every full global batch (both ranks' batches of one step)
            got = by_source(a + b)
            total = sum(weights.values())
            for n, w in weights.items():
                assert abs(got.get(n, 0) - 32 * w / total) < 1, (e, n, got)
    done = json.loads((tmp_path / "done-ddp-rank0.json").read_text())["counts"]
    assert done[str(epochs[1])] == expected({"web": 1, "code": 1})


def test_a_killed_run_resumed_with_other_weights_finishes_its_epoch_exactly(url: str, tmp_path: Path) -> None:
    cfg = {"run": "first", "job": "killed-mix", "mixture": MIX, "mix": "stratified", "batch_size": 16,
           "workers": 2, "checkpoint": 6, "sleep": 0.05}
    proc = launch(url, tmp_path, 2, cfg)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        while not (tmp_path / "state-first.json").exists() or len(lines(tmp_path / "ids-first-rank1.jsonl")) < 9:
            assert proc.poll() is None, (tmp_path / "log-first.txt").read_text()[-4000:]
            assert time.monotonic() < deadline, "the 2 x 2 run did not reach its checkpoint"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    state = json.loads((tmp_path / "state-first.json").read_text())
    assert state["mixture"] == MIX and state["stratum"] == 32 and state["version"] == 3
    before = [i for r in range(2) for _, b in lines(tmp_path / f"ids-first-rank{r}.jsonl")[:6] for i in b]
    # the restarted code passes other weights (and runs on 1 rank x 3 workers): the old epoch finishes as it began
    cfg = {"run": "resumed", "job": "killed-mix", "mixture": {"web": 0.5, "math": 0.5}, "batch_size": 16,
           "workers": 3}
    finish(launch(url, tmp_path, 1, cfg, tmp_path / "state-first.json"), tmp_path / "log-resumed.txt")
    after = [i for _, b in lines(tmp_path / "ids-resumed-rank0.jsonl") for i in b]
    union = before + after
    assert by_source(union) == expected(MIX)
    assert len(set(union)) == len(union), "a sample read twice across the resume"
    assert "finishes with the mixture it began with" in (tmp_path / "log-resumed.txt").read_text()


# -- the daemon side: shares under churn, and a source whose remote fails ---------------------------------
def test_a_failing_source_leaves_the_others_ingesting_within_their_shares(s3: Any, bucket: str,
                                                                          tmp_path: Path) -> None:
    urls = upload(s3, bucket, "mixtures-faults")
    row = 40  # bytes a row takes in the cache, about: the budget makes web roll within its share
    with FaultProxy(s3.port, seed=24) as proxy:
        env = s3.env()
        env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
        proxy.answer_error(r"mixtures-faults/code/", 3600, 403)  # code's remote refuses every read
        d = serve(s3, urls, tmp_path, env=env, extra=("--max-bytes", str(1200 * row), "--pacing", "off",
                                                      "--share", "web=0.5", "--retry-seconds", "0.5"))
        try:
            got = cc.wait_for(lambda: (s := sources(d))["math"]["samples"] == ROWS["math"] and s, 90,
                              "math cached while code fails")
            assert got["code"]["samples"] == 0 and got["code"]["problem"], got["code"]
            assert got["code"]["state"] == "remote error" and got["code"]["quarantined"] == 0, got["code"]
            # a job that asks for it waits ``wait`` s, then is told which source and why
            ds = SampleCacheDataset(d.url, columns=["id"], mixture={"web": 1, "code": 1}, wait=1.0, job="wants-code")
            with pytest.raises(LookupError, match=r"\['code'\], which hold no sample after waiting 1 s: code: "
                                                  r"failing \(remote error"):
                next(iter(ds))
            ds.close()
            health = cc.get_json(d.url + "/healthz")
            assert health["ok"] and health["sources"]["web"] == "ok" and health["sources"]["code"] != "ok"
            # web keeps rolling within its share while code fails; nobody's share is exceeded
            for _ in range(10):
                for s in sources(d).values():
                    assert s["bytes"] <= s["max_bytes"], s
                time.sleep(0.3)
            assert sources(d)["web"]["samples"] > 0
            proxy.clear_rules()  # code's remote is back: it fills its share
            cc.wait_for(lambda: sources(d)["code"]["samples"] > 0, 60, "code to ingest once its remote is back")
        finally:
            d.stop()


# -- changing sources while the daemon runs: SIGHUP (the config file) and PATCH /v1/config -----------------
def test_sources_added_and_removed_by_sighup_and_by_patch(s3: Any, bucket: str, tmp_path: Path) -> None:
    urls = upload(s3, bucket, "mixtures-reload")
    config = tmp_path / "samplecache.toml"
    config.write_text(f'[sources.web]\nurl = "{urls["web"]}"\n[sources.code]\nurl = "{urls["code"]}"\n')
    d = DaemonProcess(None, tmp_path / "cache", extra=["--config", str(config), "--samplers", "2"], env=s3.env(),
                      log_path=tmp_path / "daemon.log")
    d.start(timeout=60)
    try:
        cc.wait_for(lambda: sources(d).get("code", {}).get("samples") == ROWS["code"], 90, "code cached")
        # math added, code removed, by the config file and a SIGHUP
        config.write_text(config.read_text().replace("[sources.code]", "[sources.math]").replace(
            urls["code"], urls["math"]))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        cc.wait_for(lambda: sorted(sources(d)) == ["math", "web"], 30, "the reload to change the sources")
        cc.wait_for(lambda: sources(d)["math"]["samples"] == ROWS["math"], 90, "math cached after the reload")
        status = cc.get_json(d.url + "/v1/status")
        assert status["config"]["last_error"] is None
        # a job that asks for the removed source is told which sources there are
        ds = SampleCacheDataset(d.url, columns=["id"], mixture={"code": 1.0}, job="gone-source")
        with pytest.raises(LookupError, match=r"source\(s\) \['code'\], which the daemon does not have; its sources "
                                               r"are \['math', 'web'\]"):
            next(iter(ds))
        ds.close()
        # PATCH: code back, under another share; a local path is refused and changes nothing
        token = (tmp_path / "cache" / "api-token").read_text().strip()

        def patch(body: dict[str, Any]) -> tuple[int, Any]:
            req = urllib.request.Request(d.url + "/v1/config", data=json.dumps(body).encode(), method="PATCH",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        code, got = patch({"sources": {"web": {"url": "file:///etc/"}}})  # not a remote store's URL
        assert code == 409 and "path on the daemon's disk" in got["detail"] and "/etc" not in got["detail"], got
        code, got = patch({"sources": {"web": {"url": "s3://b/x::file:///etc/a.zip"}}})  # a chain to a local file
        assert code == 409 and "path on the daemon's disk" in got["detail"], got
        code, got = patch({"sources": {"web": {"url": urls["web"], "share": 0.5},
                                       "code": {"url": urls["code"], "share": 0.5}}})
        assert code == 200 and sorted(got["sources"]) == ["code", "web"], got
        assert got["sources"]["code"]["share"] == 0.5
        cc.wait_for(lambda: sorted(sources(d)) == ["code", "web"] and sources(d)["code"]["samples"] > 0, 60,
                    "code sampled again after the PATCH")
    finally:
        d.stop()


def test_a_column_one_source_lacks_is_named_or_filled_with_nulls(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id", "level"], mixture=MIX, job="lacks-level")
    with pytest.raises(ValueError, match=r"source '(code|web)' has no column 'level', which source 'math' has"):
        next(iter(SampleCacheLoader(ds, batch_size=32)))
    ds.close()
    ds = SampleCacheDataset(url, columns=["id", "level"], mixture=MIX, fill_missing=True, job="fills-level")
    ids, levels, valid = [], [], []
    for b in SampleCacheLoader(ds, batch_size=32, num_workers=2):
        ids += b["id"].ravel().tolist()
        levels += b["level"].ravel().tolist()
        valid += b["level__valid"].ravel().tolist()
    assert by_source(ids) == expected(MIX)
    for i, level, ok in zip(ids, levels, valid):
        from_math = i // BASE == NAMES.index("math")
        assert ok == from_math and (level == 3 if from_math else level == 0), (i, level, ok)
    ds.close()


def test_columns_held_as_narrower_types_are_read_widened_exactly(url: str) -> None:
    """web's x is float32 and code's float64; math's id is int32 and the others' int64: the job reads x as float64
    and id as int64 from every source (Arrow's rules, as across files), each value exactly as its source holds it."""
    ds = SampleCacheDataset(url, columns=["id", "x"], mixture=MIX, job="widened")
    ids, xs = [], []
    for b in SampleCacheLoader(ds, batch_size=32, num_workers=2):
        assert b["id"].dtype == torch.int64 and b["x"].dtype == torch.float64, (b["id"].dtype, b["x"].dtype)
        ids.append(b["id"].numpy().ravel())
        xs.append(b["x"].numpy().ravel())
    id_, x = np.concatenate(ids), np.concatenate(xs)
    assert by_source(id_) == expected(MIX) and len(set(id_.tolist())) == len(id_)
    assert np.array_equal(x, (id_ % 1000).astype(np.float64))  # float32 widened: the same numbers
    sample = next(iter(SampleCacheDataset(url, columns=["id", "x"], mixture={"math": 1}, job="widened-one")))
    assert np.asarray(sample["id"]).dtype == np.int64 and sample["id"] // BASE == 2, sample  # one by one too
    ds.close()


def test_a_column_whose_types_cannot_unify_names_both_sources_and_types(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id", "lang"], mixture={"code": 1, "math": 1}, job="lang-clash")
    with pytest.raises(ValueError, match=r"column 'lang' is int8 in source 'math' and (large_)?string in source "
                                         r"'code': they cannot be unified"):
        next(iter(SampleCacheLoader(ds, batch_size=32)))
    ds.close()


def test_the_numpy_and_tensorflow_adapters_read_the_same_exact_widened_mixture(url: str) -> None:
    """Through the shared core: exact per-source counts, and the unified types in the arrays and in the element
    spec that tf.data fixes before the first batch."""
    from samplecache.arrays import numpy_batches

    batches = list(numpy_batches(url, 32, columns=["id", "x"], mixture=MIX, mix="stratified", job="np-mix"))
    ids = np.concatenate([b["id"] for b in batches])
    assert {b["x"].dtype for b in batches} == {np.dtype(np.float64)} and ids.dtype == np.int64
    assert by_source(ids) == expected(MIX) and len(set(ids.tolist())) == len(ids)
    import tensorflow as tf

    import samplecache.tf as sctf

    with sctf.Feed(url, ["id", "x"], batch_size=32, mixture=MIX, job="tf-mix") as f:
        spec = f.element_spec
        assert spec["x"].dtype == tf.float64 and spec["id"].dtype == tf.int64, spec
        got = [(b["id"].numpy(), b["x"].numpy()) for b in f.dataset()]
    ids = np.concatenate([i for i, _ in got])
    assert by_source(ids) == expected(MIX) and len(set(ids.tolist())) == len(ids)
    assert np.array_equal(np.concatenate([x for _, x in got]), (ids % 1000).astype(np.float64))
