"""One-off: move the flat service/ and client/ modules into packages by concept (issue 20), then rewrite the
imports and file paths that name them. Run once from the repository root; removed after the move."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SERVICE = {
    "__init__": "", "__main__": "", "cli": "", "daemon": "", "errors": "", "files": "",
    "settings": "config", "config": "config/file", "redact": "config",
    "catalog": "store", "writer": "store", "staging": "store", "eviction": "store", "diskspace": "store/disk",
    "verify": "store", "lmdbmeta": "store", "cachedir": "store",
    "remote": "remote/stores", "discovery": "remote", "schemas": "remote", "planner": "remote",
    "scheduler": "sampling", "supervisor": "sampling", "sampler": "sampling", "encoder": "sampling",
    "pacing": "sampling", "traffic": "sampling", "inbox": "sampling",
    "epochs": "epochs/manager", "leases": "epochs", "jobs": "epochs",
    "status": "ops", "metrics": "ops", "health": "ops", "history": "ops", "charts": "ops", "logfmt": "ops/logs",
    "control": "ops", "reload": "ops",
    "api": "http/app", "auth": "http", "gate": "http", "deps": "http", "models": "http", "apidocs": "http",
    "page": "http", "routes_control": "http/routes/control", "routes_epochs": "http/routes/epochs",
    "routes_jobs": "http/routes/jobs", "routes_quarantine": "http/routes/quarantine",
}
CLIENT = {
    "__init__": "", "core": "", "arrays": "", "tf": "", "dali": "", "images": "",
    "record": "format", "nested": "format", "blockenc": "format",
    "daemon_api": "api/client", "auth": "api", "job": "api", "lease": "api",
    "reader": "reading", "epoch_source": "reading", "epoch_clock": "reading", "partition": "reading",
    "batching": "reading", "gather": "reading", "bufferpool": "reading", "prefetch": "reading", "stream": "reading",
    "dataset": "pytorch", "loader": "pytorch", "transport": "pytorch", "collation": "pytorch", "topology": "pytorch",
    "demo": "@tools", "bench": "@tools", "launch": "@tools",
}


def target(old: str, where: str, root: str, top: str) -> tuple[str, str]:
    """(new file path, new dotted module) for a module ``old`` mapped to ``where``."""
    if where.startswith("@tools"):
        return f"client/samplecache_tools/{old}.py", f"samplecache_tools.{old}"
    parts = where.split("/") if where else []
    if parts and parts[-1] not in ("config", "store", "remote", "sampling", "epochs", "ops", "http", "format",
                                   "api", "reading", "pytorch", "routes"):
        name, pkg = parts[-1], parts[:-1]
    else:
        name, pkg = old, parts
    dotted = ".".join([top, *pkg] + ([] if name == "__init__" else [name]))
    return f"{root}/{'/'.join(pkg + [name])}.py".replace("//", "/"), dotted


def main() -> None:
    moves: dict[str, str] = {}  # old file -> new file
    dotted: dict[str, str] = {}  # old dotted -> new dotted
    for old, where in SERVICE.items():
        new_file, new_mod = target(old, where, "service/samplecache_service", "samplecache_service")
        moves[f"service/{old}.py"] = new_file
        dotted["samplecache.service" + ("" if old == "__init__" else f".{old}")] = new_mod
    for old, where in CLIENT.items():
        new_file, new_mod = target(old, where, "client/samplecache", "samplecache")
        moves[f"client/{old}.py"] = new_file
        if old != "__init__":
            dotted[f"samplecache.{old}"] = new_mod
    # the bare name is also the systemd unit's (deploy/samplecache.service): its module uses are fixed by hand
    del dotted["samplecache.service"]
    for old_file, new_file in moves.items():
        Path(new_file).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", old_file, new_file], check=True)
    subprocess.run(["git", "mv", "service/swagger_ui", "service/samplecache_service/http/swagger_ui"], check=True)
    for pkg in ["service/samplecache_service/" + p for p in
                ("config", "store", "remote", "sampling", "epochs", "ops", "http", "http/routes")] + \
               ["client/samplecache/" + p for p in ("format", "api", "reading", "pytorch")] + \
               ["client/samplecache_tools"]:
        init = Path(pkg) / "__init__.py"
        if not init.exists():
            init.write_text("")
    rewrite(moves, dotted)


def rewrite(moves: dict[str, str], dotted: dict[str, str]) -> None:
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    # longest first, so that samplecache.service.x wins over samplecache.service and samplecache.x
    mods = sorted(dotted, key=len, reverse=True)
    mod_re = re.compile(r"(?<![\w./])(" + "|".join(re.escape(m) for m in mods) + r")(?![\w])")
    paths = sorted(moves, key=len, reverse=True)
    path_re = re.compile(r"(?<![\w/.-])(" + "|".join(re.escape(p) for p in paths) + r")(?![\w])")
    from_pkg = re.compile(r"^(\s*)from samplecache(\.service)? import ([\w, ]+?)(\s*(#.*)?)$")
    for f in files:
        p = Path(f)
        if not p.is_file() or p.suffix in (".png", ".json", ".ico", ".gz", ".woff2", ".parquet") or \
                "swagger_ui" in f or f == "scripts/restructure.py":
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        out = []
        for line in text.splitlines(keepends=True):
            if "getLogger(" in line or "logger=" in line:
                out.append(line)
                continue
            m = from_pkg.match(line.rstrip("\n"))
            if m:
                line = split_from_import(m, dotted) + "\n"
            line = mod_re.sub(lambda mm: dotted[mm.group(1)], line)
            line = path_re.sub(lambda mm: moves[mm.group(1)], line)
            out.append(line)
        new = "".join(out)
        if new != text:
            p.write_text(new)


def split_from_import(m: re.Match[str], dotted: dict[str, str]) -> str:
    """``from samplecache import gather, prefetch`` -> one import line per new package."""
    indent, service, names, tail = m.group(1), m.group(2), m.group(3), m.group(4) or ""
    base = "samplecache.service" if service else "samplecache"
    lines = []
    for name in [n.strip() for n in names.split(",")]:
        key = f"{base}.{name.split(' as ')[0]}"
        if key not in dotted:
            return m.group(0)
        new = dotted[key]
        pkg, _, mod = new.rpartition(".")
        alias = name.split(" as ")[1] if " as " in name else name
        lines.append(f"{indent}from {pkg} import {mod}" + (f" as {alias}" if alias != mod else ""))
    lines[-1] += tail
    return "\n".join(lines)


if __name__ == "__main__":
    main()
