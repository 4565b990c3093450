"""Jobs on a shared daemon: a new run on a warm, rolled cache, concurrent jobs, a SIGKILLed job resumed, torchrun,
close(), and the bad input around job names.

One daemon for the module caches the typed dataset (12 units of ~41 KB) under a budget of ~4 units with
``--pacing off``, so it keeps ingesting and evicting while the jobs read (jobs use their own names or runs, so
they do not meet): every job epoch is checked against the ids of the daemon epoch
it read, taken from LMDB while the job's lease pins them (tests/support/scripts/job_reader.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import client_common as cc  # noqa: E402
import pytest
import torch
from paths import SCRIPTS

from samplecache import DaemonError, EpochGone, SampleCacheDataset, SampleCacheLoader  # noqa: E402
from samplecache_tools.launch import DaemonProcess  # noqa: E402

pytestmark = pytest.mark.e2e

BUDGET = 170_000  # ~4 shards of the typed dataset
READER = SCRIPTS / "job_reader.py"


def status(d: Any) -> dict[str, Any]:
    return cc.get_json(d.url + "/v1/status")  # type: ignore[no-any-return]


def jobs(d: Any) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in cc.get_json(d.url + "/v1/jobs")}


@pytest.fixture(scope="module")
def rolled(s3: Any, typed_dataset: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One daemon for the module whose daemon epoch 0 was read by an earlier trainer and then evicted: the
    cache has rolled. A short lease TTL (10 s) lets unleased epochs go quickly."""
    work = tmp_path_factory.mktemp("jobs-daemon")
    d = DaemonProcess(typed_dataset.url, work / "cache", env=s3.env(), log_path=work / "daemon.log",
                      extra=["--samplers", "1", "--max-bytes", str(BUDGET), "--pacing", "off", "--lease-ttl", "10"])
    try:
        d.start(timeout=60)
        first = cc.get_json(f"{d.url}/v1/epochs/0?min_samples=1&timeout=30")
        gone = {int(e[0]) for e in first["shards"]}
        cc.wait_for(lambda: status(d)["evictions"] >= typed_dataset.row_groups and not gone & resident(d),
                    90, "the cache to roll past epoch 0", interval=0.2)
        for e in (1, 2):  # a few more daemon epochs: the global count is well past 0
            cc.get_json(f"{d.url}/v1/epochs/{e}?timeout=30")
        yield d
    finally:
        d.stop()


def resident(d: Any) -> set[int]:
    return {s["id"] for s in cc.get_json(d.url + "/v1/shards?limit=1000")["shards"]}


def run_reader(cfg: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(READER), json.dumps(cfg)], capture_output=True, text=True,
                          timeout=timeout, env=cc.child_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(Path(cfg["out"]).read_text())  # type: ignore[no-any-return]


def check_epochs(record: dict[str, Any], epochs: list[int]) -> None:
    """Each epoch delivered exactly the ids of the daemon epoch it read, each once."""
    assert sorted(int(e) for e in record["epochs"]) == epochs, record["epochs"].keys()
    for e in epochs:
        got = record["epochs"][str(e)]
        ids, expected = got["ids"], got["expected"]
        assert len(ids) == len(set(ids)), f"epoch {e}: {len(ids) - len(set(ids))} samples repeated"
        assert sorted(ids) == sorted(expected), (
            f"epoch {e}: {len(set(expected) - set(ids))} missing, {len(set(ids) - set(expected))} foreign")


def test_a_new_job_on_a_rolled_daemon_runs_the_readme_loop(rolled: Any, tmp_path: Path) -> None:
    # The README loop, unchanged: before jobs, this failed at once with "410: epoch 0 can no longer be read".
    record = run_reader({"url": rolled.url, "out": str(tmp_path / "job.json"), "epochs": 2, "workers": 2})
    assert record.get("done")
    check_epochs(record, [0, 1])
    daemon_epochs = [record["epochs"][e]["daemon_epoch"] for e in ("0", "1")]
    # today's sample (daemon epoch 0 is long gone); epoch 1 is sealed anew unless no shard came or went meanwhile
    assert daemon_epochs[0] >= 2 and daemon_epochs[1] >= daemon_epochs[0], daemon_epochs
    job = jobs(rolled)[record["job"]]
    assert [(e["job_epoch"], e["daemon_epoch"]) for e in job["epochs"]][:2] == [(0, daemon_epochs[0]),
                                                                             (1, daemon_epochs[1])]
    assert job["leases"] == [] and job["state"] == "idle"  # the loader closed: nothing pinned any more
    read = {e["job_epoch"]: e["samples_read"] for e in job["epochs"]}
    assert read[0] == len(record["epochs"]["0"]["expected"]) and read[1] == len(record["epochs"]["1"]["expected"])


def test_two_concurrent_jobs_and_a_third_started_midway(rolled: Any, tmp_path: Path) -> None:
    cfgs = [{"url": rolled.url, "out": str(tmp_path / f"job{i}.json"), "epochs": 2, "workers": 1, "delay": 0.05,
             "batch_size": 16} for i in range(3)]
    procs = [subprocess.Popen([sys.executable, str(READER), json.dumps(c)], stderr=subprocess.PIPE, text=True,
                              env=cc.child_env()) for c in cfgs[:2]]
    cc.wait_for(lambda: Path(cfgs[0]["out"]).exists() and Path(cfgs[1]["out"]).exists(), 60,
                "both jobs to deliver their first batch", interval=0.1)
    procs.append(subprocess.Popen([sys.executable, str(READER), json.dumps(cfgs[2])], stderr=subprocess.PIPE,
                                  text=True, env=cc.child_env()))
    live = cc.wait_for(lambda: [j for j in jobs(rolled).values() if j["state"] == "reading"], 30,
                       "a job holding leases")
    assert live and all(lease["job_epoch"] is not None for j in live for lease in j["leases"])
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-4000:]
    records = [json.loads(Path(c["out"]).read_text()) for c in cfgs]
    assert len({r["job"] for r in records}) == 3, "each run is its own job"
    for r in records:
        check_epochs(r, [0, 1])
    known = jobs(rolled)
    assert all(known[r["job"]]["next_epoch"] >= 2 for r in records)  # 3 when epoch 2 was fetched ahead
    assert status(rolled)["evictions"] > 0 and status(rolled)["bytes"] <= BUDGET


def test_a_job_killed_mid_epoch_resumes_from_its_state_without_repeats_or_gaps(daemon: Any, tmp_path: Path) -> None:
    # leases live 60 s; an epoch names half of an ~8-shard budget, so the cache churns beside the pinned epochs
    rolled = daemon(samplers=1, extra=["--max-bytes", str(2 * BUDGET), "--pacing", "off", "--epoch-headroom", "0.5"])
    cc.wait_for(lambda: status(rolled)["evictions"] > 0, 60, "the cache to fill and churn", interval=0.2)
    evictions = status(rolled)["evictions"]
    progress = tmp_path / "killed.json"
    cfg = {"url": rolled.url, "out": str(progress), "epochs": 2, "workers": 2, "delay": 0.1, "batch_size": 8}
    proc = subprocess.Popen([sys.executable, str(READER), json.dumps(cfg)], env=cc.child_env(),
                            start_new_session=True)
    try:
        cc.wait_for(lambda: progress.exists() and len(json.loads(progress.read_text())["epochs"]["0"]["ids"]) >= 64,
                    60, "the job to be well into epoch 0", interval=0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its DataLoader workers
    finally:
        proc.wait(30)
    saved = json.loads(progress.read_text())
    assert not saved.get("done") and saved["state"]["epoch"] == 0
    time.sleep(2)  # the killed job's leases (TTL 60 s) keep its epoch while the cache churns around it
    record = run_reader({**cfg, "resume": str(progress), "delay": 0})
    assert record["job"] == saved["job"]
    check_epochs(record, [0, 1])
    assert jobs(rolled)[saved["job"]]["runs"] == 2
    assert status(rolled)["evictions"] > evictions, "the daemon did not ingest and evict while the job lived"


def test_torchrun_ranks_and_workers_of_a_new_job_agree_on_its_epochs(rolled: Any, tmp_path: Path) -> None:
    cfg = {"url": rolled.url, "out": str(tmp_path / "ddp.json"), "epochs": 2, "workers": 2, "batch_size": 8,
           "ddp": True}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(cc.free_port()), str(READER), json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, start_new_session=True,
                          env=cc.child_env({"TMPDIR": str(tmp_path)}))  # torchrun's log dir: not /tmp
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    ranks = [json.loads((tmp_path / f"ddp-rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["job"] == ranks[1]["job"], "the ranks read as different jobs"
    for e in ("0", "1"):
        a, b = ranks[0]["epochs"][e], ranks[1]["epochs"][e]
        assert a["daemon_epoch"] == b["daemon_epoch"] and a["steps"] == b["steps"] and len(a["ids"]) == len(b["ids"])
        both = a["ids"] + b["ids"]
        expected = set(a["expected"])
        assert set(both) == expected, f"epoch {e}: the ranks together missed {len(expected - set(both))}"
        assert len(both) - len(set(both)) < 2, f"epoch {e}: more than world - 1 padding repeats"
    mapped = jobs(rolled)[ranks[0]["job"]]["epochs"]  # (epoch 2 may be mapped too: fetched ahead)
    assert [e["daemon_epoch"] for e in mapped[:2]] == [ranks[0]["epochs"][e]["daemon_epoch"] for e in ("0", "1")]
    for e in (0, 1):  # every rank's workers reported what they read
        assert mapped[e]["samples_read"] == sum(len(r["epochs"][str(e)]["ids"]) for r in ranks)


def samplecache_threads(job: str) -> list[str]:
    """Live lease and prefetch threads of ``job`` in this process (their names carry the job)."""
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("samplecache-") and f"-{job}-" in t.name and t.is_alive())


def test_close_releases_every_lease_at_once_and_stops_the_threads(rolled: Any) -> None:
    ds = SampleCacheDataset(rolled.url, columns=["id"], job="closing")
    loader = SampleCacheLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    for _ in range(2):
        n = sum(len(b["id"]) for b in loader)  # the second pass reads the epoch leased ahead
    assert n > 0
    cc.wait_for(lambda: any(lease["job_epoch"] == 2 for lease in jobs(rolled)["closing"]["leases"]), 30,
                "the workers to lease job epoch 2 ahead")
    assert jobs(rolled)["closing"]["state"] == "reading"
    loader.close()
    job = jobs(rolled)["closing"]  # at once: no wait for a TTL
    assert job["leases"] == [] and job["state"] == "idle", job
    assert not [lease for lease in status(rolled)["leases"] if lease["job"] == "closing"]
    assert samplecache_threads("closing") == [], samplecache_threads("closing")
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(ds))


def test_a_dataset_used_as_a_context_manager_releases_on_exit(rolled: Any) -> None:
    with SampleCacheDataset(rolled.url, columns=["id"], job="with-block") as ds:
        it = iter(ds)
        next(it)
        assert jobs(rolled)["with-block"]["state"] == "reading"
        assert samplecache_threads("with-block"), "no lease thread while reading"
    assert jobs(rolled)["with-block"]["leases"] == []
    assert samplecache_threads("with-block") == []
    del it


def test_resuming_an_unknown_job_names_the_known_ones(rolled: Any) -> None:
    SampleCacheDataset(rolled.url, job="known-one").next_epoch()  # attaches
    ds = SampleCacheDataset(rolled.url, columns=["id"], retries=0)
    ds.load_state_dict({"epoch": 0, "position": 0, "seed": 0, "shuffle": True, "job": "no-such-job"})
    with pytest.raises(DaemonError) as info:
        next(iter(ds))
    assert info.value.status == 404
    assert "'no-such-job'" in str(info.value) and "known-one" in str(info.value)


def test_a_job_epoch_whose_shards_were_evicted_is_epoch_gone_with_the_way_on(rolled: Any) -> None:
    ds = SampleCacheDataset(rolled.url, columns=["id"], job="long-outage", prefetch_next=False)
    assert len(list(ds)) > 0  # job epoch 0, released at its end
    d0 = jobs(rolled)["long-outage"]["epochs"][0]["daemon_epoch"]
    shards = {int(e[0]) for e in cc.get_json(f"{rolled.url}/v1/epochs/{d0}")["shards"]}
    cc.wait_for(lambda: not shards & resident(rolled), 60, "job epoch 0's shards to be evicted", interval=0.2)
    again = SampleCacheDataset(rolled.url, columns=["id"], retries=0, prefetch_next=False)
    again.load_state_dict({"epoch": 0, "position": 10, "seed": 0, "shuffle": True, "job": "long-outage"})
    with pytest.raises(EpochGone) as info:  # through DataLoader workers: only the message travels
        next(iter(torch.utils.data.DataLoader(again, batch_size=None, num_workers=1)))
    assert info.value.next_epoch == 1
    again.load_state_dict({"epoch": 0, "position": 10, "seed": 0, "shuffle": True, "job": "long-outage"})  # again
    with pytest.raises(EpochGone) as info:
        next(iter(again))
    err = info.value
    assert err.status == 410 and err.next_epoch == 1
    assert "can no longer be read" in str(err) and "set_epoch(1)" in str(err)
    assert "resume state of job 'long-outage' stood at sample 10 of epoch 0" in str(err)  # says what it means
    with pytest.raises(DaemonError) as gone:  # replaying that daemon epoch as another job epoch: refused too
        again.set_epoch(7, daemon_epoch=d0)
    assert gone.value.status == 410 and f"daemon epoch {d0} can no longer be read" in str(gone.value)
    again.set_epoch(err.next_epoch)  # the documented recovery, one line
    assert len(list(again)) > 0
    assert jobs(rolled)["long-outage"]["next_epoch"] == 2


def test_a_job_restarted_by_name_goes_on_at_its_next_epoch(rolled: Any) -> None:
    with SampleCacheDataset(rolled.url, columns=["id"], job="by-name", prefetch_next=False) as first:
        for _ in range(2):
            assert len(list(first)) > 0  # job epochs 0 and 1
    with SampleCacheDataset(rolled.url, columns=["id"], job="by-name", prefetch_next=False) as again:
        assert again.next_epoch() == 2  # a new run of the job: its epochs go on
        assert len(list(again)) > 0 and again.current_epoch() == 2
    job = jobs(rolled)["by-name"]
    assert job["runs"] == 2 and job["start_epoch"] == 2 and job["next_epoch"] == 3


def test_a_killed_job_expires_after_the_ttl_and_releases_what_it_pinned(daemon: Any, tmp_path: Path) -> None:
    d = daemon(samplers=1, extra=["--max-bytes", str(BUDGET), "--pacing", "off", "--lease-ttl", "3"])
    progress = tmp_path / "p.json"
    cfg = {"url": d.url, "out": str(progress), "epochs": 1, "workers": 1, "delay": 0.2, "batch_size": 8}
    proc = subprocess.Popen([sys.executable, str(READER), json.dumps(cfg)], env=cc.child_env(),
                            start_new_session=True)
    try:
        cc.wait_for(lambda: progress.exists(), 60, "the job's first batch", interval=0.05)
        name = json.loads(progress.read_text())["job"]
        job = jobs(d)[name]
        assert job["state"] == "reading" and job["last_heartbeat"] is not None
        pinned = job["epochs"][0]["daemon_epoch"]
        assert pinned in status(d)["pinned_epochs"]
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    t0 = time.monotonic()
    cc.wait_for(lambda: jobs(d)[name]["state"] == "expired", 20, "the killed job to expire", interval=0.2)
    assert time.monotonic() - t0 >= 1.0  # not before its TTL (3 s since the last heartbeat)
    assert jobs(d)[name]["leases"] == []
    cc.wait_for(lambda: pinned not in status(d)["pinned_epochs"], 10, "its epoch to be unpinned")


def test_leases_for_a_job_are_checked_against_its_run_and_epochs(rolled: Any) -> None:
    with SampleCacheDataset(rolled.url, columns=["id"], job="checked", prefetch_next=False) as ds:
        plan = ds.plan(0)
        run = ds._epochs.run

        def lease(body: dict[str, Any]) -> tuple[int, str]:
            req = urllib.request.Request(f"{rolled.url}/v1/epochs/{plan.daemon_epoch}/leases", method="POST",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "Authorization":
                                                  f"Bearer {(rolled.cache_dir / 'api-token').read_text().strip()}"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        assert lease({"job": "checked"})[0] == 422  # a job lease names its run and epoch
        code, body = lease({"job": "checked", "run": run, "job_epoch": 5})
        assert code == 409 and "does not read daemon epoch" in body  # job epoch 5 was never mapped there
        code, body = lease({"job": "checked", "run": "0123456789abcdef", "job_epoch": 0})
        assert code == 409 and "has not attached" in body
        code, body = lease({"job": "nobody", "run": run, "job_epoch": 0})
        assert code == 404 and "checked" in body
        assert lease({"job": "checked", "run": run, "job_epoch": 0})[0] == 201
        assert all("run" not in x for x in status(rolled)["leases"]), "run ids are credentials: not shown"
