"""Two hosts on one machine: network namespaces, one daemon per host, a 2-node torchrun job over gloo.

The scenario (run once per module by the ``cluster`` fixture, everything torn down before the tests look):

* two network namespaces ``A`` (10.77.0.1) and ``B`` (10.77.0.2) joined by a veth pair, both made here and
  deleted at the end (also on failure); nothing else is ever addressed;
* a SeaweedFS S3 server inside ``A``, bound to 10.77.0.1: host B's daemon reaches it over the veth;
* a typed Parquet dataset (5 files x 4 row groups) uploaded from inside ``A``;
* on each host its own ``samplecache serve --node-rank r --num-nodes 2`` on the host's own 127.0.0.1:8750
  (the same port on both: they are different hosts), waited on until it cached every row group of its node;
* ``torchrun --nnodes 2 --nproc-per-node 1`` on each host (master 10.77.0.1, gloo over the veth), running
  ``tests/support/scripts/multinode_train.py``: ``SampleCacheDataset`` of the host's own daemon with 2 DataLoader
  workers, one all-reduce per step, a JSON record per rank; epochs 0-1 through ``SampleCacheLoader``
  (``partial="pad"``), epoch 2 through ``SampleCacheLoader`` (``"drop"``), epoch 3 through the README's loop (plain
  ``DataLoader``, ``set_epoch`` every epoch).

The split of this dataset's 20 row groups by ``node_of`` is 8 (node 0) / 12 (node 1): the two hosts' epochs
hold different numbers of samples, as they do whenever hosts cache different row groups.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import children_of, process_group
from parquet_data import make_typed_table
from paths import SCRIPTS

from samplecache_service.remote.planner import Unit, node_of
from samplecache_tools.launch import DaemonProcess
from samplecache_tools.s3server import S3Server

pytestmark = pytest.mark.e2e

NS_HELPER = SCRIPTS / "multinode_ns.py"
TRAIN = SCRIPTS / "multinode_train.py"

NODES = 2
ADDRS = ("10.77.0.1", "10.77.0.2")
PREFIX_LEN = 24
DAEMON_PORT = 8750          # each host's own loopback: the same port on both hosts
MASTER_PORT = 9511          # below the S3 server's ports (10000-32767, s3server._PORT_LO..): weed runs on host 0 too
BUCKET, PREFIX = "samplecache-mn", "data"
FILES, ROWS_PER_FILE, ROW_GROUP = 5, 120, 30   # 20 row groups: 8 on node 0, 12 on node 1
BATCH, WORKERS = 8, 2
# epochs 0-1: SampleCacheLoader, partial="pad"; epoch 2: SampleCacheLoader, "drop"; epoch 3: the README's loop
# (plain DataLoader, persistent workers, set_epoch every epoch, "pad"). The last goes last: it breaks the job.
PHASES = (("loader-pad", 2), ("loader-drop", 1), ("readme", 1))
PHASE_OF = {e: name for e, name in enumerate(n for n, k in PHASES for _ in range(k))}
LOADER_EPOCHS = [e for e, n in PHASE_OF.items() if n.startswith("loader")]
README_EPOCHS = [e for e, n in PHASE_OF.items() if n == "readme"]
BUDGET = 170.0              # the whole scenario, setup to teardown (s)
TEARDOWN_RESERVE = 30.0     # of which kept for what follows training: a last look at the caches, stopping
NS_PREFIX = "scmn-"         # namespaces of this test: scmn-<pytest pid>-<host>


# ----------------------------------------------------------------------------- namespaces
def ip(*args: str, check: bool = True, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=timeout)


def ns_pids(ns: str) -> list[int]:
    r = ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def kill_ns_processes(ns: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process in namespace ``ns`` (all of them were started by this test); returns their pids."""
    killed = ns_pids(ns)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while ns_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> None:
    """Namespaces of an earlier run of this test whose pytest is gone (a crash or SIGKILL before teardown)."""
    r = ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if name.startswith(NS_PREFIX) and len(parts) == 3 and parts[1].isdigit() and not pid_alive(int(parts[1])):
            kill_ns_processes(name)
            ip("netns", "del", name, check=False)


class Hosts:
    """Two network namespaces joined by a veth pair: ``names[r]`` has ``ADDRS[r]`` on ``devs[r]``."""

    def __init__(self) -> None:
        tag = os.getpid()
        self.names = [f"{NS_PREFIX}{tag}-{c}" for c in "ab"]
        self.devs = [f"scv{tag % 10**8}{c}" for c in "ab"]  # interface names: at most 15 characters
        self.made: list[str] = []

    def create(self) -> None:
        for ns in self.names:
            ip("netns", "add", ns)
            self.made.append(ns)
        ip("link", "add", self.devs[0], "type", "veth", "peer", "name", self.devs[1])
        for ns, dev, addr in zip(self.names, self.devs, ADDRS):
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/{PREFIX_LEN}", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def exec(self, r: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[r], *argv]

    def destroy(self) -> list[str]:
        """Kill what is left in the namespaces, delete them (the veth goes with them); returns problems."""
        problems = []
        for ns in self.made:
            left = kill_ns_processes(ns)
            if left:
                problems.append(f"namespace {ns} still had processes {left} at teardown (killed)")
            ip("netns", "del", ns, check=False)
        if ip("link", "show", self.devs[0], check=False).returncode == 0:  # never moved into a namespace
            ip("link", "del", self.devs[0], check=False)
        listed = ip("netns", "list", check=False).stdout
        problems += [f"namespace {ns} could not be deleted" for ns in self.made if ns in listed.split()]
        return problems


def namespaces_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed: apt-get install -y iproute2"
    probe = f"{NS_PREFIX}{os.getpid()}-probe"
    r = ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace here: {r.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def clean_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """No proxy: every connection of the hosts goes to the test's own addresses."""
    env = dict(os.environ if base is None else base)
    for k in list(env):
        if k.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            env.pop(k)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ----------------------------------------------------------------------------- S3 inside host A
class NamespacedS3(S3Server):
    """``S3Server`` (SeaweedFS) run inside a namespace and bound to that host's veth address."""

    def __init__(self, data_dir: Path, hosts: Hosts, r: int, deadline: float) -> None:
        super().__init__(data_dir, "seaweedfs", startup_timeout=60.0)
        self.hosts, self.r, self.deadline = hosts, r, deadline

    @property
    def endpoint(self) -> str:
        return f"http://{ADDRS[self.r]}:{self.port}"

    def _command(self) -> list[str]:
        cmd = super()._command()
        swap = {"-ip=127.0.0.1": f"-ip={ADDRS[self.r]}", "-ip.bind=127.0.0.1": f"-ip.bind={ADDRS[self.r]}"}
        assert all(k in cmd for k in swap), f"S3Server's weed command changed: {cmd}"
        return self.hosts.exec(self.r, [swap.get(c, c) for c in cmd])

    def _wait_ready(self) -> None:
        assert self.proc is not None
        timeout = min(self.startup_timeout, self.deadline - time.monotonic())
        probe = subprocess.Popen(self.hosts.exec(self.r, [sys.executable, str(NS_HELPER), "s3-ready", self.endpoint,
                                                          str(timeout)]),
                                 env=clean_env(self.env()), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while probe.poll() is None:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"weed exited with {self.proc.returncode} during startup in "
                                       f"{self.hosts.names[self.r]}:\n{self.log_tail()}")
                time.sleep(0.1)
            if probe.returncode != 0:
                raise RuntimeError(f"S3 in {self.hosts.names[self.r]} not ready: {probe.stderr.read()[-2000:]}\n"
                                   f"{self.log_tail()}")
        finally:
            if probe.poll() is None:
                probe.kill()
            probe.wait()


# ----------------------------------------------------------------------------- the scenario
@dataclass
class Cluster:
    tmp: Path
    shards: list[list[dict[str, Any]]] = field(default_factory=list)     # per node, after caching
    shards_after: list[list[dict[str, Any]]] = field(default_factory=list)  # per node, after training
    status: list[dict[str, Any]] = field(default_factory=list)
    records: dict[int, dict[str, Any]] = field(default_factory=dict)     # global rank -> JSON of the rank
    torchrun: list[dict[str, Any]] = field(default_factory=list)         # per node: code, hung, seconds, log
    daemon_stops: list[dict[str, Any]] = field(default_factory=list)
    teardown_problems: list[str] = field(default_factory=list)
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def unit_of_shard(self, node: int) -> dict[int, tuple[str, int]]:
        return {s["id"]: (s["path"], s["row_group"]) for s in self.shards_after[node] or self.shards[node]}

    def ranks_of(self, node: int) -> list[dict[str, Any]]:
        return [rec for rec in self.records.values() if rec["node"] == node]


def remaining(deadline: float, cap: float) -> float:
    left = deadline - time.monotonic()
    if left <= 1:
        raise TimeoutError("the multi-node scenario ran past its time budget")
    return min(cap, left)


def ns_json(hosts: Hosts, r: int, args: list[str], deadline: float, cap: float = 30.0,
            env: dict[str, str] | None = None) -> Any:
    """Run the helper inside host r and parse its JSON."""
    t = remaining(deadline, cap)
    try:
        p = subprocess.run(hosts.exec(r, [sys.executable, str(NS_HELPER), *args]), capture_output=True, text=True,
                           timeout=t + 10, env=clean_env(env))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"helper {args} in {hosts.names[r]} did not finish within {t + 10:.0f} s") from None
    if p.returncode != 0:
        raise AssertionError(f"helper {args} in {hosts.names[r]} failed ({p.returncode}): {p.stderr[-3000:]}")
    return json.loads(p.stdout)


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def kill_tree(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """Stop a torchrun and everything under it (its workers run in sessions of their own): SIGTERM to every
    process of the tree (a rank then writes its record), SIGKILL to what is left after ``grace`` seconds."""
    tree = [*reversed(descendants(proc.pid)), proc.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(pid_alive(pid) and pid != proc.pid for pid in tree) and time.monotonic() < deadline:
            proc.poll()  # reap the leader; the others are reaped by their parents
            time.sleep(0.05)
    proc.wait()


def stop_daemon(d: DaemonProcess) -> dict[str, Any]:
    assert d.proc is not None
    pgid = d.proc.pid  # `ip netns exec` execs the daemon: the pid is the daemon's, leader of its group
    t0 = time.monotonic()
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
    code = d.proc.poll()
    deadline = time.monotonic() + 5
    left = process_group(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = process_group(pgid)
    d.stop(grace=0.1)
    return {"code": code, "seconds": time.monotonic() - t0, "leftovers": left, "log": d.log_tail(3000)}


def run_scenario(c: Cluster, hosts: Hosts, deadline: float) -> None:
    t0 = time.monotonic()
    s3 = NamespacedS3(c.tmp / "s3", hosts, 0, deadline)
    daemons: list[DaemonProcess] = []
    trainers: list[subprocess.Popen[bytes]] = []
    try:
        s3.start(attempts=1)
        c.timings["s3_ready"] = time.monotonic() - t0
        env = clean_env(s3.env())
        up = ns_json(hosts, 0, ["upload", s3.endpoint, BUCKET, PREFIX, str(FILES), str(ROWS_PER_FILE),
                                str(ROW_GROUP)], deadline, env=env)
        assert up["rows"] == FILES * ROWS_PER_FILE, up

        source = f"s3://{BUCKET}/{PREFIX}"
        for r in range(NODES):
            d = DaemonProcess(source, c.tmp / f"cache-{r}", port=DAEMON_PORT, env=env,
                              log_path=c.tmp / f"daemon-{r}.log",
                              extra=["--samplers", "1", "--node-rank", str(r), "--num-nodes", str(NODES),
                                     "--discover-interval", "3600", "--retry-seconds", "1"])
            d.args = hosts.exec(r, d.args)  # the daemon listens on its own host's loopback
            daemons.append(d)
            d.start(ready=False)
        url = f"http://127.0.0.1:{DAEMON_PORT}"
        for r in range(NODES):
            try:
                c.status.append(ns_json(hosts, r, ["wait-covered", url, "60"], deadline, cap=60))
            except AssertionError as e:
                raise AssertionError(f"{e}\ndaemon {r} log:\n{daemons[r].log_tail()}") from None
            c.shards.append(ns_json(hosts, r, ["shards", url], deadline))
        c.timings["cached"] = time.monotonic() - t0

        out = c.tmp / "ranks"
        out.mkdir()
        for r in range(NODES):
            tenv = clean_env()
            tenv.update({"GLOO_SOCKET_IFNAME": hosts.devs[r], "OMP_NUM_THREADS": "1",
                         "TMPDIR": str(c.tmp)})  # torchrun's log dir, not the system temp dir
            for k in [k for k in tenv if k.startswith(("AWS_", "MASTER_", "TORCHELASTIC_", "PET_"))]:
                tenv.pop(k)
            cmd = hosts.exec(r, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES),
                                 "--nproc-per-node", "1", "--node-rank", str(r), "--master-addr", ADDRS[0],
                                 "--master-port", str(MASTER_PORT), "--max-restarts", "0",
                                 str(TRAIN), "--url", url, "--out", str(out),
                                 "--phases", ",".join(f"{n}:{k}" for n, k in PHASES),
                                 "--batch-size", str(BATCH), "--workers", str(WORKERS), "--dist-timeout", "30"])
            log = open(c.tmp / f"torchrun-{r}.log", "wb")
            trainers.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=tenv,
                                             start_new_session=True, cwd=c.tmp))
            log.close()
        t_train = time.monotonic()
        train_deadline = t_train + remaining(deadline, 100)
        for r, p in enumerate(trainers):
            hung = False
            try:
                p.wait(max(0.1, train_deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
                kill_tree(p)
            c.torchrun.append({"code": p.returncode, "hung": hung, "seconds": time.monotonic() - t_train,
                               "log": (c.tmp / f"torchrun-{r}.log").read_bytes()[-6000:].decode(errors="replace")})
        c.timings["trained"] = time.monotonic() - t0
        for f in sorted(out.glob("rank*.json")):
            rec = json.loads(f.read_text())
            c.records[rec["rank"]] = rec
        for r in range(NODES):
            c.shards_after.append(ns_json(hosts, r, ["shards", url], deadline + TEARDOWN_RESERVE, cap=10))
    finally:
        for p in trainers:
            if p.poll() is None:
                kill_tree(p)
        for d in daemons:
            if d.proc is not None:
                c.daemon_stops.append(stop_daemon(d))
        s3.stop(timeout=5)
        c.timings["total"] = time.monotonic() - t0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    remove_stale_namespaces()
    c = Cluster(tmp_path_factory.mktemp("multinode"))
    hosts = Hosts()
    deadline = time.monotonic() + BUDGET - TEARDOWN_RESERVE
    try:
        hosts.create()
        run_scenario(c, hosts, deadline)
    except Exception as e:  # noqa: BLE001 - every test reports it (see ready())
        c.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}"
    finally:
        c.teardown_problems = hosts.destroy()
    sys.stderr.write(f"\nmulti-node scenario timings (s): { {k: round(v, 1) for k, v in c.timings.items()} }\n")
    yield c


def ready(c: Cluster) -> Cluster:
    """The scenario ran to its end (whatever the trainers did); else the test fails, never xfails."""
    if c.error:
        pytest.fail(f"the multi-node scenario did not run to its end: {c.error}", pytrace=False)
    return c


# ----------------------------------------------------------------------------- ground truth
def unit_of_id(sample_id: int) -> tuple[str, int]:
    f, row = divmod(sample_id, ROWS_PER_FILE)
    return f"{BUCKET}/{PREFIX}/part-{f:05d}.parquet", row // ROW_GROUP


def ids_of_unit(unit: tuple[str, int]) -> range:
    f = int(unit[0].rsplit("-", 1)[1].split(".")[0])
    start = f * ROWS_PER_FILE + unit[1] * ROW_GROUP
    return range(start, start + ROW_GROUP)


ALL_UNITS = {(f"{BUCKET}/{PREFIX}/part-{f:05d}.parquet", g)
             for f in range(FILES) for g in range(ROWS_PER_FILE // ROW_GROUP)}


def expected_f32() -> dict[int, float]:
    out = {}
    for f in range(FILES):
        t = make_typed_table(ROWS_PER_FILE, f, f * ROWS_PER_FILE)
        for i, v in zip(t.column("id").to_pylist(), t.column("f32").to_pylist()):
            out[int(i)] = float(v)
    return out


def epoch_of(rec: dict[str, Any], epoch: int) -> dict[str, Any] | None:
    return next((e for e in rec["epochs"] if e["epoch"] == epoch), None)


def epoch_ids(rec: dict[str, Any], epoch: int) -> list[int]:
    ep = epoch_of(rec, epoch)
    return [i for step in ep["ids"] for i in step] if ep else []


def trainer_report(c: Cluster) -> str:
    lines = []
    for r, t in enumerate(c.torchrun):
        lines.append(f"host {r}: torchrun exit {t['code']} hung={t['hung']} after {t['seconds']:.1f} s")
    for rank, rec in sorted(c.records.items()):
        eps = ", ".join(f"epoch {e['epoch']} ({e['phase']}): {e['steps']} steps / {sum(map(len, e['ids']))} "
                        f"samples of a {e.get('manifest_samples')}-sample manifest, agreed {e.get('agreed')}"
                        f"{'' if e['complete'] else ' (NOT COMPLETE)'}"
                        for e in rec["epochs"])
        lines.append(f"rank {rank} (node {rec['node']}): {eps}; error: {(rec['error'] or '-').splitlines()[0]}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- tests
def test_namespaces_and_processes_are_gone(cluster: Cluster) -> None:
    assert not cluster.teardown_problems, cluster.teardown_problems
    listed = ip("netns", "list", check=False).stdout
    assert f"{NS_PREFIX}{os.getpid()}-" not in listed
    ready(cluster)
    for st in cluster.daemon_stops:
        assert st["code"] == 0 and not st["leftovers"], st
    assert cluster.timings["total"] < BUDGET, cluster.timings


def test_each_host_caches_only_its_own_row_groups(cluster: Cluster) -> None:
    ready(cluster)
    assert len(cluster.shards) == NODES
    for r, shards in enumerate(cluster.shards):
        units = [(s["path"], s["row_group"]) for s in shards]
        assert len(units) == len(set(units)), f"host {r} cached a row group twice: {sorted(units)}"
        wrong = [u for u in units if node_of(Unit(u[0], u[1], 0), NODES) != r]
        assert not wrong, f"host {r} cached row groups of another node: {wrong}"
        cov = cluster.status[r]["coverage"]
        assert (cov["node_rank"], cov["num_nodes"], cov["remote_units"]) == (r, NODES, len(ALL_UNITS)), cov
        assert cov["units"] == len(units) and cov["rows_sampled"] == sum(s["rows"] for s in shards), cov
    # host B read every one of its row groups from the S3 server of host A, over the veth
    assert cluster.status[1]["remote_errors"] == 0 and len(cluster.shards[1]) > 0


def test_remote_row_groups_are_disjoint_and_the_union_is_the_dataset(cluster: Cluster) -> None:
    ready(cluster)
    per_node = [{(s["path"], s["row_group"]) for s in shards} for shards in cluster.shards_after]
    assert per_node[0].isdisjoint(per_node[1]), f"both hosts cached {sorted(per_node[0] & per_node[1])}"
    assert per_node[0] | per_node[1] == ALL_UNITS, f"missing: {sorted(ALL_UNITS - (per_node[0] | per_node[1]))}"
    assert sum(len(p) for p in per_node) == len(ALL_UNITS)
    sizes = [sum(s["rows"] for s in shards) for shards in cluster.shards_after]
    assert sum(sizes) == FILES * ROWS_PER_FILE
    assert sizes[0] != sizes[1], "the scenario should give the hosts epochs of different sizes"


def test_every_rank_ran_and_wrote_its_record(cluster: Cluster) -> None:
    ready(cluster)
    assert sorted(cluster.records) == list(range(NODES)), trainer_report(cluster)
    for rank, rec in cluster.records.items():
        assert rec["world"] == NODES and rec["node"] == rank and rec["local_rank"] == 0, rec
        assert [e["epoch"] for e in rec["epochs"]] == list(PHASE_OF), trainer_report(cluster)
        for view in rec["worker_view"]:  # a DataLoader worker knows its rank among the ranks of its host
            assert view["topology"] == [rank, NODES, 0, 1], rec["worker_view"]


def test_samples_are_bit_identical_and_come_from_their_hosts_manifest(cluster: Cluster) -> None:
    ready(cluster)
    truth = expected_f32()
    for rank, rec in cluster.records.items():
        node = rec["node"]
        units = cluster.unit_of_shard(node)
        for ep in rec["epochs"]:
            manifest_units = {units[i] for i in ep["manifest_shards"]}
            assert manifest_units == {(s["path"], s["row_group"]) for s in cluster.shards[node]}, (
                f"rank {rank} epoch {ep['epoch']}: the manifest is not the host's whole cache")
            assert ep["manifest_samples"] == sum(len(ids_of_unit(u)) for u in manifest_units)
            for ids, vals in zip(ep["ids"], ep["f32"]):
                for i, v in zip(ids, vals):
                    assert unit_of_id(i) in manifest_units, f"rank {rank}: sample {i} is not in host {node}'s epoch"
                    assert v == truth[i], f"rank {rank}: sample {i} f32 {v} != {truth[i]}"


def host_samples(c: Cluster, node: int) -> set[int]:
    return {i for s in c.shards[node] for i in ids_of_unit((s["path"], s["row_group"]))}


def test_sample_cache_loader_gives_every_rank_the_same_steps(cluster: Cluster) -> None:
    ready(cluster)
    report = trainer_report(cluster)
    for epoch in LOADER_EPOCHS:
        eps = {rank: epoch_of(rec, epoch) for rank, rec in cluster.records.items()}
        assert all(ep is not None and ep["complete"] for ep in eps.values()), report
        steps = {rank: ep["steps"] for rank, ep in eps.items()}  # type: ignore[index]
        assert len(set(steps.values())) == 1, f"epoch {epoch}: steps per rank {steps}\n{report}"
        sizes = {ep["manifest_samples"] for ep in eps.values()}  # type: ignore[index]
        assert len(sizes) == NODES, f"epoch {epoch}: the hosts' epochs should differ in size ({sizes})"


def test_pad_delivers_each_hosts_whole_epoch_repeating_only_to_pad(cluster: Cluster) -> None:
    ready(cluster)
    sizes = [len(host_samples(cluster, n)) for n in range(NODES)]
    for epoch in [e for e in LOADER_EPOCHS if PHASE_OF[e] == "loader-pad"]:
        for node in range(NODES):
            ranks = cluster.ranks_of(node)
            got = [i for rec in ranks for i in epoch_ids(rec, epoch)]
            assert set(got) == host_samples(cluster, node), f"host {node} epoch {epoch}: samples missing"
            assert {epoch_of(r, epoch)["agreed"] for r in ranks} == {max(sizes)}  # type: ignore[index]
            # every sample once, plus the padding that brings this host up to the largest host's count
            assert len(got) == max(sizes) and len(got) - len(set(got)) == max(sizes) - sizes[node], (
                f"host {node} epoch {epoch}: {len(got)} samples, {len(got) - len(set(got))} repeated; "
                f"epoch sizes {sizes}")


def test_drop_delivers_no_sample_twice_within_a_hosts_epoch(cluster: Cluster) -> None:
    ready(cluster)
    sizes = [len(host_samples(cluster, n)) for n in range(NODES)]
    for epoch in [e for e in LOADER_EPOCHS if PHASE_OF[e] == "loader-drop"]:
        for node in range(NODES):
            got = [i for rec in cluster.ranks_of(node) for i in epoch_ids(rec, epoch)]
            assert len(got) == len(set(got)), f"host {node} epoch {epoch}: {len(got) - len(set(got))} repeated"
            assert len(got) == min(sizes) and set(got) <= host_samples(cluster, node), (node, epoch, len(got))


def test_readme_loop_gives_every_rank_the_same_steps(cluster: Cluster) -> None:
    """The README's plain DataLoader + set_epoch() loop: set_epoch agrees on the epoch length across hosts."""
    ready(cluster)
    report = trainer_report(cluster)
    if sorted(cluster.records) != list(range(NODES)) or any(
            epoch_of(rec, e) is None for rec in cluster.records.values() for e in README_EPOCHS):
        pytest.fail(f"the ranks never reached the README loop's epochs:\n{report}", pytrace=False)
    for epoch in README_EPOCHS:
        eps = {rank: epoch_of(rec, epoch) for rank, rec in cluster.records.items()}
        steps = {rank: ep["steps"] for rank, ep in eps.items()}  # type: ignore[index]
        assert all(ep["complete"] for ep in eps.values()) and len(set(steps.values())) == 1, (  # type: ignore[index]
            f"epoch {epoch}: steps per rank {steps}\n{report}")
    assert all(t["code"] == 0 and not t["hung"] for t in cluster.torchrun), report
    assert all(rec["done"] and rec["error"] is None for rec in cluster.records.values()), report
