"""Lease takes at scale: the time of one POST /v1/epochs/{n}/leases as the lease table grows, and /v1/status's size.

Runs the real daemon on a small generated dataset, seals epoch 0, then takes ``--leases`` leases over one
keep-alive connection. Prints, at each step, the median take time of the last 100 takes and the size and time of
``GET /v1/status``; then restarts the daemon and checks that every lease came back. A take writes one lease
record, so its time should stay flat however many leases there are; status lists the newest 50 only.

    python -m benchmarks.leases [--leases 4000] [--steps 1000,2000,4000] [--quick] [--json FILE] [--workdir DIR]
"""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .harness import cli, report, start_daemon, stop_daemon


def _call(conn: http.client.HTTPConnection, method: str, path: str, token: str, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", **({"Content-Type": "application/json"} if data else {})}
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    return r.status, r.read()


def main(argv: list[str] | None = None) -> None:
    ap = cli.parser(__doc__)
    cli.common(ap, quick="300 leases, reported at 100 and 300 (a smoke run)")
    ap.add_argument("--leases", type=int, default=4000)
    ap.add_argument("--steps", default="1000,2000,4000", help="lease counts to report at (comma-separated)")
    args = ap.parse_args(argv)
    if args.quick:
        args.leases, args.steps = 300, "100,300"
    rows: list[dict[str, Any]] = []
    steps = sorted(int(s) for s in args.steps.split(",") if int(s) <= args.leases)
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}), root / "data" / "part-0.parquet",
                       row_group_size=100)
        flags = ["--max-leases", str(args.leases + 10), "--max-leases-per-job", str(args.leases + 10),
                 "--lease-ttl", "3600"]
        d = start_daemon(f"file://{root / 'data'}", root / "cache", samplers=1, extra=flags)
        try:
            token = (root / "cache" / "api-token").read_text().strip()
            host, port = d.url.split("//")[1].split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            code, body = _call(conn, "GET", "/v1/epochs/0?min_samples=1000&timeout=60", token)
            assert code == 200, body
            took: list[float] = []
            print(f"{'leases':>8} {'take ms (median of last 100)':>30} {'status KB':>10} {'status ms':>10}")
            for i in range(1, args.leases + 1):
                t0 = time.perf_counter()
                code, body = _call(conn, "POST", "/v1/epochs/0/leases", token, {"holder": f"worker {i}"})
                took.append(time.perf_counter() - t0)
                assert code == 201, body
                if i in steps:
                    t0 = time.perf_counter()
                    code, raw = _call(conn, "GET", "/v1/status", token)
                    status_ms = (time.perf_counter() - t0) * 1e3
                    st = json.loads(raw)
                    assert st["leases_live"] == i, st["leases_live"]
                    rows.append({"leases": i, "take_ms": statistics.median(took[-100:]) * 1e3,
                                 "status_bytes": len(raw), "status_ms": status_ms})
                    print(f"{i:>8} {rows[-1]['take_ms']:>30.2f} {len(raw) / 1024:>10.1f} {status_ms:>10.1f}")
            conn.close()
        finally:
            stop_daemon(d)
        d = start_daemon(f"file://{root / 'data'}", root / "cache", samplers=1, extra=flags)
        try:
            conn = http.client.HTTPConnection(host, int(d.url.rsplit(":", 1)[1]), timeout=60)
            code, raw = _call(conn, "GET", "/v1/status", token)
            back = json.loads(raw)["leases_live"]
            conn.close()
            print(f"after a restart: {back} of {args.leases} leases live")
            assert back == args.leases, back
        finally:
            stop_daemon(d)
    report.write_report(args.json, rows)


if __name__ == "__main__":
    main()
