"""Flags into settings: one flag per setting, ``--source NAME=URL`` many times, and the settings they load."""

from __future__ import annotations

import argparse
import json
from typing import Any


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """``--config`` and one flag per setting (the default None: not given, so the next source decides)."""
    from samplecache_service.config.file import CONFIG_ENV, DEFAULT_CONFIG
    from samplecache_service.config.settings import Settings

    p.add_argument("--config", default=None, metavar="FILE",
                   help=f"TOML config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} if it exists); flags and "
                        f"SAMPLECACHE_* environment win over it")
    for name, field in Settings.model_fields.items():
        kw: dict[str, Any] = {"dest": name, "default": None, "help": field.description}
        if name in ("storage_options", "iceberg_catalogs"):
            kw["metavar"] = "JSON"
        if name in ("source", "share"):  # --source URL, or --source NAME=URL many times; --share NAME=F many times
            kw["action"] = "append"
        p.add_argument(flag_name(name), **kw)


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    from samplecache_service.config.settings import Settings, named_pairs

    flags = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    given = flags.pop("source", None) or []
    bare = [u for u in given if not _is_named(u)]
    if len(bare) > 1:
        raise SystemExit(f"samplecache: --source given {len(bare)} bare URLs; name each source: --source NAME=URL")
    if bare:
        flags["source"] = bare[0]
    named = [u for u in given if _is_named(u)]
    if named:
        flags["sources"] = {**_as_dict(flags.get("sources")), **named_pairs(named, "URL")}
    return flags


def _is_named(value: str) -> bool:
    """``NAME=URL``, not a URL (whose own ``=`` comes after its scheme or a ``/``)."""
    head, eq, _ = value.partition("=")
    return bool(eq) and all(c.islower() or c.isdigit() or c in "_-" for c in head) and 0 < len(head) <= 64


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        from samplecache_service.config.settings import named_pairs
        return dict(json.loads(value)) if value.strip().startswith("{") else named_pairs(value, "URL")
    return dict(value)


def load_settings(args: argparse.Namespace) -> Any:
    """The effective settings and their sources (service/samplecache_service/config/file.py); raises ConfigError."""
    from samplecache_service.config.file import load

    return load(given_flags(args), getattr(args, "config", None))


def settings_from(args: argparse.Namespace) -> Any:
    return load_settings(args).settings
