"""Small jobs that ``tests/e2e/test_multinode.py`` runs *inside* a network namespace (``ip netns exec NS python ...``).

The test process lives in the root namespace and cannot reach the namespaces' addresses, so everything that talks
to the S3 server on the veth or to a host's daemon on that host's loopback runs through here. Each sub-command
prints one JSON document on stdout and exits non-zero (with the reason on stderr) when it fails or times out.

    s3-ready ENDPOINT TIMEOUT                     wait until a signed S3 listing works (creds from AWS_* env)
    upload ENDPOINT BUCKET PREFIX FILES ROWS RG   create the bucket, write the typed Parquet dataset
    get URL [URL ...]                             HTTP GET each URL, print the parsed JSON bodies (a list)
    shards URL                                    every resident shard of the daemon at URL (all pages)
    wait-covered URL TIMEOUT                      wait until the daemon's coverage of its node's units is 1.0
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def _fs(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                             client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True,
                             use_listings_cache=False, default_block_size=5 << 20)


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def s3_ready(endpoint: str, timeout: float) -> Any:
    deadline, last = time.monotonic() + timeout, "no attempt"
    while time.monotonic() < deadline:
        try:
            _fs(endpoint).ls("")
            return {"ready": True}
        except Exception as e:  # noqa: BLE001 - anything means "not yet"
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise SystemExit(f"S3 at {endpoint} not ready after {timeout} s: {last}")


def upload(endpoint: str, bucket: str, prefix: str, files: int, rows: int, rg: int) -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: parquet_data
    from parquet_data import write_dataset

    fs = _fs(endpoint)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    table = write_dataset(fs, f"{bucket}/{prefix}", files, rows, rg, seed=0)
    return {"rows": table.num_rows, "files": sorted(fs.find(f"{bucket}/{prefix}"))}


def shards(url: str) -> Any:
    out: list[Any] = []
    while True:
        page = get_json(f"{url}/v1/shards?offset={len(out)}&limit=1000")
        out.extend(page["shards"])
        if not page["shards"] or len(out) >= page["total"]:
            return out


def wait_covered(url: str, timeout: float) -> Any:
    deadline, st = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            st = get_json(f"{url}/v1/status")
            cov = st.get("coverage") or {}
            if cov.get("units") and cov.get("unit_fraction") == 1.0 and st["sampler"]["in_flight"] == 0:
                return st
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"daemon at {url} did not cache all of its units within {timeout} s; last status: "
                     f"{json.dumps(st)[:3000] if st else None}")


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "s3-ready":
        res = s3_ready(args[0], float(args[1]))
    elif cmd == "upload":
        res = upload(args[0], args[1], args[2], int(args[3]), int(args[4]), int(args[5]))
    elif cmd == "get":
        res = [get_json(u) for u in args]
    elif cmd == "shards":
        res = shards(args[0])
    elif cmd == "wait-covered":
        res = wait_covered(args[0], float(args[1]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    json.dump(res, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
