"""daemon_scale part 2: the read rate against the cache's size (``benchmarks.daemon_scale``).

A cache of each size of 16 KiB samples (``x`` = fixed_size_list<uint8, 16384>, 64 samples = one 1 MiB block,
4 blocks per shard; ``--quick``: 4 KiB, 32 per shard, 2 blocks) is built without the remote
(``benchmarks.daemon_scale.cache``); epoch 0 is read with ``SampleCacheDataset(url, shuffle=True, batch_size=64)``
in this process and with a raw read-only LMDB scan of the same manifest (one warm-up pass, then ``passes``
timed passes, each verified: count and sum of ``y``). Every size's rate is compared with the smallest one's.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from samplecache.format.record import BlockView, Schema, shard_prefix

from ..harness import MB, http_json, human, log, stop_daemon
from .cache import CacheSpec, build_cache, start_idle


def read_spec(size: int, quick: bool) -> CacheSpec:
    width = 4096 if quick else 16384
    rows, blocks = (64, 4) if not quick else (32, 2)
    shard = rows * width
    return CacheSpec(name=f"read-{human(size).replace(' ', '')}", shards=max(2, size // shard), rows=rows,
                     blocks=blocks, width=width, files=1, per_txn=16)


def resident_fraction(path: Path) -> float | None:
    """The fraction of ``path`` in the page cache (util-linux ``fincore``), or None where it is missing."""
    exe = shutil.which("fincore")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=60).stdout.split()
        return int(out[0]) / max(1, int(out[1]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def client_pass(url: str, batch: int) -> tuple[int, int, float]:
    from samplecache import SampleCacheDataset

    ds = SampleCacheDataset(url, shuffle=True, batch_size=batch)
    ds.set_epoch(0)
    n = ysum = 0
    t0 = time.perf_counter()
    for b in ds:
        y = b["y"]
        n += int(y.shape[0])
        ysum += int(y.sum())
    return n, ysum, time.perf_counter() - t0


def lmdb_pass(m: dict[str, Any]) -> tuple[int, int, float]:
    """Raw read: shard by shard of the manifest, every block's x copied once."""
    from samplecache.reading.blocks.reader import open_cache

    schema = Schema.from_json(m["schema"])
    cx, cy = schema.index("x"), schema.index("y")
    env, db = open_cache(m["lmdb_path"], int(m["map_size"]), m.get("cache_id", ""))
    n = ysum = 0
    t0 = time.perf_counter()
    for sid, _rows, _b, _rpb in m["shards"]:
        prefix = shard_prefix(sid)
        with env.begin(buffers=True) as txn:
            cur = txn.cursor(db=db)
            if cur.set_range(prefix):
                for key, buf in cur:
                    if bytes(key[:8]) != prefix:
                        break
                    v = BlockView(buf, schema)
                    v.column_array(cx).copy()
                    ysum += int(v.column_array(cy).sum())
                    n += v.nrows
    return n, ysum, time.perf_counter() - t0


def run_read(sizes: list[int], root: Path, passes: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": [], "problems": []}
    for size in sizes:
        spec = read_spec(size, quick)
        sroot = root / spec.name
        try:
            built = build_cache(spec, sroot)
        except RuntimeError as e:
            out["sizes"].append({"size": size, "skipped": str(e)})
            log(f"read: {e}: skipped")
            continue
        row: dict[str, Any] = {"size": size, "spec": spec.params(), "data_bytes": built["data_bytes"],
                               "build_s": built["build_s"], "client": [], "lmdb": []}
        d, startup = start_idle(built["source"], sroot / "cache", built["max_bytes"])
        row["startup"] = startup
        try:
            m = http_json(d.url + "/v1/epochs/0", timeout=120)
            if m["samples"] != spec.samples or len(m["shards"]) != spec.shards:
                out["problems"].append(f"{spec.name}: manifest {m['samples']} samples / {len(m['shards'])} shards")
            payload = spec.samples * spec.width
            data_mdb = sroot / "cache" / "lmdb" / "data.mdb"
            row["page_cache_before"] = resident_fraction(data_mdb)
            passes_of = (("lmdb", lambda: lmdb_pass(m)), ("client", lambda: client_pass(d.url, spec.rows_per_block)))
            for kind, fn in passes_of:
                for i in range(passes + 1):
                    n, ysum, dt = fn()
                    ok = n == spec.samples and ysum == spec.y_sum()
                    if not ok:
                        out["problems"].append(f"{spec.name} {kind} pass {i}: {n} samples, y sum {ysum}")
                    row[kind].append({"warmup": i == 0, "seconds": dt, "ok": ok, "mb_per_s": payload / MB / dt,
                                      "page_cache_after": resident_fraction(data_mdb)})
                timed = [p["mb_per_s"] for p in row[kind] if not p["warmup"]]
                row[f"{kind}_mb_per_s"] = statistics.median(timed)
                row[f"{kind}_best_mb_per_s"] = max(timed)
                log(f"read: {spec.name} {kind}: {row[f'{kind}_mb_per_s']:,.0f} MB/s "
                    f"(passes {[round(x) for x in timed]})")
        finally:
            stop_daemon(d)
        out["sizes"].append(row)
    measured = [r for r in out["sizes"] if "client_mb_per_s" in r]
    if measured:
        base = measured[0]
        for r in measured:
            r["client_vs_smallest"] = r["client_mb_per_s"] / base["client_mb_per_s"]
            r["lmdb_vs_smallest"] = r["lmdb_mb_per_s"] / base["lmdb_mb_per_s"]
            r["client_best_vs_smallest"] = r["client_best_mb_per_s"] / base["client_best_mb_per_s"]
    out["verified"] = not out["problems"]
    return out
