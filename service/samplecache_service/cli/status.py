"""``samplecache status``: the daemon's ``/v1/status`` as a table a person reads (a row per source too)."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"samplecache: {url} answered {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SystemExit(f"samplecache: cannot reach the daemon at {url}: {getattr(e, 'reason', e)}") from None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _files_row(files: dict[str, Any] | None) -> str:
    """``3 Parquet files, 2 other file(s) skipped: README.txt, data.csv`` (``-`` before the first listing)."""
    if not files:
        return "-"
    out = f"{files['parquet']} Parquet files" + (f", {files['skipped_text']}" if files["skipped"] else "")
    if files.get("filter"):
        out += f"; --filter {files['filter']} leaves out {files.get('outside_filter', 0)}"
    return out


def _table_row(t: dict[str, Any]) -> str:
    """``delta version 3 (newest), 4 live files, 150 rows; 2 files removed``."""
    pinned = "pinned" if t["pinned"] else "newest"
    return (f"{t['format']} version {t['version']} ({pinned}), {t['files']} live files, {t['rows']} rows; "
            f"{t['removed_files']} files removed")


def format_status(s: dict[str, Any]) -> str:
    cov = s.get("coverage") or {}
    rows = [
        ("source", s["source"]),
        ("cache dir", s["cache_dir"]),
        ("resident", f"{human(s['bytes'])} of {human(s['max_bytes'])} ({s['samples']} samples, {s['shards']} shards)"),
        ("disk free", human(s["disk_free"])),
        ("sampler", f"{s['sampler']['state']}" + (f" ({s['sampler']['reason']})" if s["sampler"]["reason"] else "")
         + f", {s['sampler']['processes']} processes, {s['sampler']['in_flight']} in flight"),
        ("ingest", f"{s['ingest']['samples_per_s']:.1f} samples/s, {human(s['ingest']['bytes_per_s'])}/s"),
        ("remote read", f"{human(s['remote']['bytes_read'])} ({human(s['remote']['bytes_since_last_epoch'])} since "
                        f"the last epoch)"),
        ("pacing", f"{s['pacing']['mode']}, {s['pacing']['replace_per_epoch']:g} x budget per epoch"
                   + (f", at most {human(s['pacing']['max_ingest_rate'])}/s" if s["pacing"]["max_ingest_rate"] else "")
                   + (f" ({s['pacing']['reason']})" if s["pacing"]["reason"] else "")),
        ("jobs", f"{s['jobs']} (GET /v1/jobs)"),
        ("files", _files_row(s.get("files"))),
        *([("table", _table_row(s["table"]))] if s.get("table") else []),
        ("coverage", f"{cov.get('units_sampled', 0)}/{cov.get('units', 0)} row groups, "
                     f"{100 * cov.get('row_fraction', 0):.1f}% of rows, pass {cov.get('cycle', 0)}" if cov else "-"),
        ("epochs sealed", f"{s['epochs_sealed']} (last {s['last_epoch']})"),
        ("remote errors", f"{s['remote_errors']}" + (f" (last: {s['last_error']})" if s["last_error"] else "")),
        ("quarantined", str(len(s["quarantined"]))),
    ]
    w = max(len(k) for k, _ in rows)
    out = [f"{k.ljust(w)}  {v}" for k, v in rows]
    if s["epochs"]:
        out.append("")
        out.append("epoch   samples     new  shards  remote read")
        out += [f"{e['epoch']:>5} {e['samples']:>9} {e['new_samples']:>7} {e['shards']:>7}  "
                f"{human(e.get('remote_bytes', 0)):>11}" for e in s["epochs"][-10:]]
    for q in s["quarantined"][:10]:
        out.append(f"quarantined: {q['path']}: {q['reason']}")
    for name, why in (s.get("skipped_columns") or {}).items():
        out.append(f"column left out: {name}: {why}")
    if s.get("sources"):
        out.append("")
        out += _sources_table(s["sources"])
    return "\n".join(out)


def _sources_table(sources: list[dict[str, Any]]) -> list[str]:
    """A row per named source: its share, what it holds of it, its state, and what is wrong (or why it waits)."""
    heads = ("name", "share", "resident", "samples", "shards", "state", "problem")
    rows = [(s["name"], f"{100 * s['share']:.1f}%", f"{human(s['bytes'])} of {human(s['max_bytes'])}",
             str(s["samples"]), str(s["shards"]), s["state"],
             " ".join(str(s.get("problem") or s.get("reason") or "-").split())) for s in sources]
    widths = [max(len(r[i]) for r in (heads, *rows)) for i in range(len(heads))]
    right = (1, 2, 3, 4)  # the numbers
    return ["  ".join(c.rjust(w) if i in right else c if i == len(heads) - 1 else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths))) for r in (heads, *rows)]


def cmd_status(args: argparse.Namespace) -> int:
    s = _get(args.url.rstrip("/") + "/v1/status")
    print(json.dumps(s, indent=2) if args.json else format_status(s))
    return 0
