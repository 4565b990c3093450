"""Shared fixtures of the end-to-end tests: a real S3 server on loopback, a typed dataset uploaded once, and a
factory of ``samplecache serve`` subprocesses that are always stopped (and checked for leftovers).

``SAMPLECACHE_TEST_S3`` picks the S3 backend: ``seaweedfs`` (default) or ``moto``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pytest
from http_source import http_source  # noqa: F401  (a fixture: a local HTTP source whose URL has a password)
from parquet_data import write_dataset

from samplecache_tools.launch import DaemonProcess
from samplecache_tools.s3server import S3Server

BUCKET = "samplecache-e2e"
TYPED_PREFIX = "typed"
TYPED_FILES, TYPED_ROWS_PER_FILE, TYPED_ROW_GROUP = 3, 600, 150  # 3 files x 4 row groups = 12 remote units


def pytest_configure(config: pytest.Config) -> None:
    # pyproject.toml registers it too; this keeps the marker known when the tests run from another rootdir.
    config.addinivalue_line("markers", "e2e: starts real servers and subprocesses")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # lets fixtures see whether the test failed
    return report


# ----------------------------------------------------------------------------- nothing left in the temp dir
_TEMP_ROOTS: list[Path] = []  # pytest's pytest-of-<user> dir of this run, removed at the end when empty


@pytest.fixture(scope="session", autouse=True)
def torch_caches_in_the_test_dir(tmp_path_factory: pytest.TempPathFactory,
                                 request: pytest.FixtureRequest) -> Iterator[None]:
    """torch's compile cache (made at the first optimizer step, in this process and in the subprocesses that
    inherit the environment) goes under this run's base temp dir, not <system temp>/torchinductor_<user>."""
    base = tmp_path_factory.getbasetemp()
    if request.config.option.basetemp is None:
        _TEMP_ROOTS.append(base.parent)
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("torchinductor"))
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton"))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pytest_unconfigure(config: pytest.Config) -> None:
    # pytest removes its base temp dir after a run that passed (tmp_path_retention_policy = "failed") but keeps
    # the pytest-of-<user> dir around it; rmdir removes that only when empty (another run's dir keeps it)
    for root in _TEMP_ROOTS:
        try:
            root.rmdir()
        except OSError:
            pass


# ----------------------------------------------------------------------------- S3 and the dataset
@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    backend = os.environ.get("SAMPLECACHE_TEST_S3", "seaweedfs")
    with S3Server(tmp_path_factory.mktemp(f"s3-{backend}"), backend) as srv:
        yield srv


@pytest.fixture(scope="session")
def bucket(s3: S3Server) -> str:
    return s3.make_bucket(BUCKET)


@dataclass
class TypedDataset:
    """The ground truth of a dataset uploaded to S3."""

    url: str                 # s3://bucket/prefix, what `serve --source` gets
    table: pa.Table          # every row, in file order
    files: int
    row_groups: int
    rows: int = field(init=False)
    _by_id: dict[int, dict[str, Any]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.rows = self.table.num_rows

    @property
    def by_id(self) -> dict[int, dict[str, Any]]:
        """id -> {column: expected value}, in the client's value types (numpy scalar/array, str, bytes, None)."""
        if self._by_id is None:
            self._by_id = expected_rows(self.table)
        return self._by_id


def expected_rows(table: pa.Table) -> dict[int, dict[str, Any]]:
    n = table.num_rows
    cols: dict[str, list[Any]] = {}
    for name in table.column_names:
        arr = table.column(name).combine_chunks()
        t = arr.type
        if pa.types.is_string(t) or pa.types.is_binary(t):
            cols[name] = arr.to_pylist()
        elif pa.types.is_fixed_size_list(t):
            shape: list[int] = []
            leaf: pa.Array = arr
            while pa.types.is_fixed_size_list(leaf.type):
                shape.append(leaf.type.list_size)
                leaf = leaf.flatten()
            vals = leaf.to_numpy(zero_copy_only=False).reshape((n, *shape))
            cols[name] = list(vals)
        elif pa.types.is_list(t):
            depth, vt = 0, t
            while pa.types.is_list(vt):
                depth, vt = depth + 1, vt.value_type
            dtype = np.dtype(vt.to_pandas_dtype())
            out = []
            for v in arr.to_pylist():
                a = np.asarray(v, dtype=dtype)
                if a.ndim < depth:  # an empty outer list of a list<list<..>>: every dimension is 0
                    a = a.reshape((0,) * depth)
                out.append(a)
            cols[name] = out
        else:
            vals = arr.to_numpy(zero_copy_only=False)
            mask = arr.is_null().to_numpy(zero_copy_only=False)
            cols[name] = [None if m else v for v, m in zip(vals, mask)]
    ids = table.column("id").to_numpy()
    return {int(ids[i]): {name: cols[name][i] for name in cols} for i in range(n)}


@pytest.fixture
def prefix(s3: S3Server, bucket: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh prefix of the bucket, named after the test module (test_e2e_types: e2e-types-<hex>), removed at
    the end."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    p = f"{bucket}/{name}-{uuid.uuid4().hex[:12]}"
    try:
        yield p
    finally:
        try:
            s3.fs().rm(p, recursive=True)
        except FileNotFoundError:
            pass


@pytest.fixture(scope="session")
def typed_dataset(s3: S3Server, bucket: str) -> TypedDataset:
    prefix = f"{bucket}/{TYPED_PREFIX}"
    table = write_dataset(s3.fs(), prefix, TYPED_FILES, TYPED_ROWS_PER_FILE, TYPED_ROW_GROUP, seed=0)
    return TypedDataset(url=f"s3://{prefix}", table=table, files=TYPED_FILES,
                        row_groups=TYPED_FILES * (TYPED_ROWS_PER_FILE // TYPED_ROW_GROUP))


# ----------------------------------------------------------------------------- processes
def process_group(pgid: int) -> list[tuple[int, str, str]]:
    """Live (not zombie) processes of group ``pgid``: (pid, state, command)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        comm_end = raw.rfind(")")
        fields = raw[comm_end + 2:].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            found.append((int(stat.parent.name), state, raw[raw.find("(") + 1:comm_end]))
    return found


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/*/stat ppid)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def sampler_pids(d: Any) -> list[int]:
    """The daemon's sampler processes (its spawn-context children; not multiprocessing's resource tracker)."""
    found = []
    for pid in children_of(d.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            found.append(pid)
    return found


@dataclass
class Stopped:
    code: int | None
    seconds: float
    leftovers: list[tuple[int, str, str]]


class ServedDaemon(DaemonProcess):
    """A daemon started by the fixture, with the token its requests that change state need."""

    @property
    def token(self) -> str:
        """Its ``--token``, else what it wrote to its token file (``--token-file``, default in its cache dir)."""
        for flag in ("--token", "--token-file"):
            if flag in self.args:
                value = self.args[self.args.index(flag) + 1]
                return value if flag == "--token" else Path(value).read_text().strip()
        return (self.cache_dir / "api-token").read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer <token>``, for raw HTTP calls that change state."""
        return {"Authorization": f"Bearer {self.token}"}


class Daemons:
    """Starts ``samplecache serve`` subprocesses; every one is stopped at teardown."""

    children_of = staticmethod(children_of)
    process_group = staticmethod(process_group)

    def __init__(self, s3: S3Server, dataset: TypedDataset, tmp_path: Path) -> None:
        self.s3, self.dataset, self.tmp_path = s3, dataset, tmp_path
        self.started: list[DaemonProcess] = []
        self.stopped: dict[int, Stopped] = {}

    def __call__(self, source: str | None = None, cache_dir: str | os.PathLike[str] | None = None, *,
                 samplers: int = 2, extra: Sequence[str] = (), env: dict[str, str] | None = None,
                 ready: bool = True, timeout: float = 60.0) -> ServedDaemon:
        n = len(self.started)
        d = ServedDaemon(source or self.dataset.url, cache_dir or self.tmp_path / "cache",
                          extra=["--samplers", str(samplers), *extra],
                          env=self.s3.env() if env is None else env, log_path=self.tmp_path / f"daemon-{n}.log")
        self.started.append(d)
        d.start(timeout=timeout, ready=ready)
        return d

    def stop(self, d: DaemonProcess, grace: float = 10.0) -> Stopped:
        """SIGTERM, wait up to ``grace`` s, then list what is left of the daemon's process group (waiting a
        little for children to follow their parent), and SIGKILL that. Idempotent."""
        assert d.proc is not None
        if d.proc.pid in self.stopped:
            return self.stopped[d.proc.pid]
        pgid = d.proc.pid
        t0 = time.monotonic()
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        seconds = time.monotonic() - t0
        code = d.proc.poll()
        deadline = time.monotonic() + 5.0
        leftovers = process_group(pgid)
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.05)
            leftovers = process_group(pgid)
        d.stop(grace=0.1)  # SIGKILLs whatever is left in the group and reaps the leader
        result = self.stopped[pgid] = Stopped(code, seconds, leftovers)
        return result

    def teardown(self) -> None:
        problems = []
        for d in self.started:
            if d.proc is None:
                continue
            st = self.stop(d)
            if st.code is None:
                problems.append(f"daemon {d.url} did not exit within 10 s of SIGTERM:\n{d.log_tail()}")
            if st.leftovers:
                problems.append(f"daemon {d.url} left processes in its group: {st.leftovers}")
        assert not problems, "\n".join(problems)


@pytest.fixture
def daemon(s3: S3Server, typed_dataset: TypedDataset, tmp_path: Path,
           request: pytest.FixtureRequest) -> Iterator[Daemons]:
    """``daemon(source=None, cache_dir=None, extra=(), env=None)`` starts a daemon (default: the typed dataset,
    ``--samplers 2``, cache under tmp_path) and returns its ``DaemonProcess``; ``daemon.stop(d)`` stops one
    politely and returns ``Stopped(code, seconds, leftovers)``. All are stopped at teardown, which fails when a
    daemon ignored SIGTERM or left a process behind in its process group."""
    daemons = Daemons(s3, typed_dataset, tmp_path)
    try:
        yield daemons
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            for d in daemons.started:  # shown with the failure as captured teardown output
                print(f"----- daemon {d.url} log ({d.log_path}):\n{d.log_tail(6000)}")
        daemons.teardown()


# ----------------------------------------------------------------------------- comparing with the truth
def same_value(got: Any, exp: Any) -> str | None:
    """None when ``got`` is bit-identical to ``exp`` (same type, dtype, shape and bytes), else why not."""
    if exp is None:
        return None if got is None else f"expected None (null), got {got!r}"
    if isinstance(exp, (str, bytes)):
        if type(got) is not type(exp):
            return f"expected {type(exp).__name__}, got {type(got).__name__} {got!r}"
        return None if got == exp else f"expected {exp!r}, got {got!r}"
    if isinstance(exp, np.generic):
        if not isinstance(got, np.generic):
            return f"expected a numpy scalar {exp.dtype}, got {type(got).__name__} {got!r}"
    elif not isinstance(got, np.ndarray):
        return f"expected an ndarray {exp.dtype}{exp.shape}, got {type(got).__name__} {got!r}"
    if got.dtype != exp.dtype or got.shape != exp.shape:
        return f"expected {exp.dtype}{exp.shape}, got {got.dtype}{got.shape}"
    if np.asarray(got).tobytes() != np.asarray(exp).tobytes():
        return f"values differ: expected {exp!r}, got {got!r}"
    return None


def check_samples(samples: Iterable[dict[str, Any]], by_id: dict[int, dict[str, Any]],
                  columns: list[str] | None = None) -> list[int]:
    """Every sample matches the ground truth of its id; returns the ids in delivery order."""
    ids, problems = [], []
    for s in samples:
        sid = int(s["id"])
        ids.append(sid)
        exp = by_id[sid]
        wanted = columns or list(exp)
        if sorted(s) != sorted(wanted):
            problems.append(f"id {sid}: columns {sorted(s)} != {sorted(wanted)}")
            continue
        for name in wanted:
            why = same_value(s[name], exp[name])
            if why:
                problems.append(f"id {sid} column {name}: {why}")
    assert not problems, f"{len(problems)} wrong values, first: " + "\n".join(problems[:10])
    return ids


def check_exactly_once(ids: list[int], total: int) -> None:
    dupes = len(ids) - len(set(ids))
    missing = set(range(total)) - set(ids)
    assert dupes == 0 and not missing and len(ids) == total, (
        f"{len(ids)} samples, {dupes} duplicates, {len(missing)} missing (e.g. {sorted(missing)[:5]})")


class Truth:
    """Ground-truth checks, handed to tests by the ``truth`` fixture."""

    expected_rows = staticmethod(expected_rows)
    same_value = staticmethod(same_value)
    check_samples = staticmethod(check_samples)
    check_exactly_once = staticmethod(check_exactly_once)


@pytest.fixture(scope="session")
def truth() -> type[Truth]:
    return Truth


# ----------------------------------------------------------------------------- HTTP helpers
@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(url: str, timeout: float = 30.0) -> Reply:
    """GET that returns 4xx/5xx replies instead of raising."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return Reply(r.status, r.read(), {k.lower(): v for k, v in r.headers.items()})
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read(), {k.lower(): v for k, v in e.headers.items()})


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def get() -> Callable[..., Reply]:
    return http_get


@pytest.fixture
def until() -> Callable[..., Any]:
    return wait_until
