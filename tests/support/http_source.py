"""A local HTTP source for tests: static Parquet files served with Range support (what fsspec's HTTP filesystem
needs; ``http.server`` alone ignores Range), behind a URL that carries a password (``SECRET``), one file garbage."""

from __future__ import annotations

import http.server
import io
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

SECRET = "Pa55w0rd-sentinel"


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=a-b`` answered 206 (http.server alone ignores Range)."""

    def log_message(self, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            return super().send_head()
        try:
            data = Path(path).read_bytes()
        except OSError:
            self.send_error(404)
            return None
        m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if m:
            a = int(m.group(1))
            b = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
            body = data[a:b + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return io.BytesIO(body)


@pytest.fixture
def http_source(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "www"
    (root / "data").mkdir(parents=True)
    for i in range(3):
        table = pa.table({"id": pa.array(range(i * 200, (i + 1) * 200), pa.int64()),
                          "name": pa.array([f"row {j}" for j in range(200)])})
        pq.write_table(table, root / "data" / f"part-{i}.parquet", row_group_size=50)
    (root / "data" / "garbage.parquet").write_bytes(b"not parquet at all " * 100)
    def handler(*a: Any, **k: Any) -> RangeHandler:
        return RangeHandler(*a, directory=str(root), **k)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://reader:{SECRET}@127.0.0.1:{srv.server_port}/data/"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)
