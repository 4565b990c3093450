"""Where the settings come from: flags, then ``SAMPLECACHE_*`` environment, then a TOML config file, then defaults.

The config file is the one named by ``--config``, else by ``SAMPLECACHE_CONFIG``, else ``/etc/samplecache/
samplecache.toml`` when it exists. Its top-level keys are the setting names (``max_bytes = "500GB"``,
``[storage_options]`` as a table). A file that cannot be used raises :class:`ConfigError` naming the file, the line
and the key; the caller exits 2 at start, or keeps the old settings on a reload.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from samplecache_service.config.redact import HIDDEN, masked_options, redact
from samplecache_service.config.settings import Settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli backport has the same interface
    import tomli as tomllib

DEFAULT_CONFIG = Path("/etc/samplecache/samplecache.toml")
CONFIG_ENV = "SAMPLECACHE_CONFIG"
SECRETS = ("token", "storage_options", "iceberg_catalogs")
# a secret given as a flag is in /proc/PID/cmdline, which every local user can read (ps): where to keep it instead
SAFER = {"token": "--token-file FILE or SAMPLECACHE_TOKEN",
         "storage_options": "--storage-options-file FILE or SAMPLECACHE_STORAGE_OPTIONS",
         "iceberg_catalogs": "[iceberg_catalogs.NAME] in the config file or SAMPLECACHE_ICEBERG_CATALOGS"}


class ConfigError(Exception):
    """Settings that cannot be used; the message names where each bad value came from."""


@dataclass(frozen=True)
class ConfigFile:
    """The values of one config file and the line each key is on."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def where(self, key: str) -> str:
        return f"{self.path}:{self.lines[key]}" if key in self.lines else str(self.path)


@dataclass(frozen=True)
class Loaded:
    """Effective settings and, for each, where it came from (``flag --x``, ``env SAMPLECACHE_X``,
    ``config FILE:LINE`` or ``default``)."""

    settings: Settings
    sources: dict[str, str]
    config: ConfigFile


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return f"SAMPLECACHE_{name.upper()}"


def config_path(given: str | Path | None, environ: Mapping[str, str]) -> Path | None:
    """The config file to read: the one named (``--config``, then ``SAMPLECACHE_CONFIG``), else the default path
    when it exists, else none."""
    named = given if given not in (None, "") else environ.get(CONFIG_ENV) or None
    if named is not None:
        return Path(named)
    try:
        return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None
    except OSError:  # there but not readable (EACCES on /etc/samplecache): read_config says so, exit 2
        return DEFAULT_CONFIG


_NAME = r"(?:[A-Za-z0-9_\-]+|\"[^\"]*\")"


def _dotted(raw: str) -> str:
    return ".".join(part.strip().strip('"') for part in raw.split("."))


def _key_lines(text: str) -> dict[str, int]:
    """Line of each top-level key (``key = ...`` before the first table, or a ``[key]`` table header), and of each
    key in a table or a dotted key, as ``table.key`` (``storage_options.endpoint_url``)."""
    lines: dict[str, int] = {}
    table = ""
    for n, line in enumerate(text.splitlines(), 1):
        header = re.match(rf"\s*\[\s*({_NAME}(?:\s*\.\s*{_NAME})*)\s*\]", line)
        key = None if header else re.match(rf"\s*({_NAME}(?:\s*\.\s*{_NAME})*)\s*=", line)
        if header:
            table = name = _dotted(header.group(1))
        elif key:
            name = (table + "." if table else "") + _dotted(key.group(1))
        else:
            continue
        parts = name.split(".")
        for i in range(len(parts)):  # a.b.c names a, a.b and a.b.c: each at its first line
            lines.setdefault(".".join(parts[:i + 1]), n)
    return lines


def read_config(path: Path) -> ConfigFile:
    """Parse ``path``; unknown keys and TOML errors raise ConfigError with the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config file: {getattr(e, 'strerror', None) or e}") from None
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    lines = _key_lines(text)
    for key in values:
        if key not in Settings.model_fields:
            near = difflib.get_close_matches(key, list(Settings.model_fields), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{path}:{lines.get(key, '?')}: unknown setting {key!r}{hint}; the settings are "
                              f"listed by `samplecache config` and in the README")
    return ConfigFile(path, values, lines)


def _sources(flags: Mapping[str, Any], environ: Mapping[str, str], config: ConfigFile) -> dict[str, str]:
    upper = {k.upper() for k in environ}
    out = {}
    for name in Settings.model_fields:
        if flags.get(name) is not None:
            out[name] = f"flag {flag(name)}"
        elif env_name(name) in upper:
            out[name] = f"env {env_name(name)}"
        elif name in config.values:
            out[name] = f"config {config.where(name)}"
        else:
            out[name] = "default"
    return out


def _explain(e: ValidationError, sources: Mapping[str, str], config: ConfigFile) -> str:
    lines = []
    for err in e.errors():
        name = str(err.get("loc", ("settings",))[0]) if err.get("loc") else "settings"
        got = "<hidden>" if name in SECRETS else repr(err.get("input"))
        src = sources.get(name, "default")
        if src.startswith("config"):
            where = f"{config.where(name)}: {name}"
        elif name in Settings.model_fields:
            where = f"{flag(name)} / {env_name(name)}" + (" (set in the environment)" if src.startswith("env") else "")
        else:
            where = name
        lines.append(f"  {where}: {err.get('msg')} (got {got})")
    return "invalid settings:\n" + "\n".join(lines)


def load(flags: Mapping[str, Any], config: str | Path | None = None) -> Loaded:
    """Effective settings from ``flags`` (None: not given), the process environment and the config file, with
    their sources. Raises ConfigError naming the file, line and key of a bad value."""
    environ = os.environ
    path = config_path(config, environ)
    cfg = read_config(path) if path is not None else ConfigFile()
    given = {k: v for k, v in flags.items() if v is not None}
    sources = _sources(given, environ, cfg)
    try:
        settings = Settings.layered(given, cfg.values)
    except ValidationError as e:
        raise ConfigError(_explain(e, sources, cfg)) from None
    return Loaded(settings, sources, cfg)


def exposed_secrets(loaded: Loaded) -> list[str]:
    """Warnings, one per secret other local users can read: given as a flag, or in a file every user may read."""
    out = [f"{flag(name)} is on the command line, where every local user can read it (ps, /proc/PID/cmdline): "
           f"use {safer} instead" for name, safer in SAFER.items() if loaded.sources[name].startswith("flag")]
    source = loaded.settings.source
    if loaded.sources["source"].startswith("flag") and redact(source) != source:
        out.append("--source holds credentials (user:password or a signed query) on the command line, where every "
                   "local user can read it: use SAMPLECACHE_SOURCE or the config file instead")
    path = loaded.settings.storage_options_file
    try:
        mode = path.stat().st_mode & 0o777 if path is not None else 0
    except OSError:
        mode = 0
    if mode & 0o004:
        out.append(f"storage_options_file {path} can be read by every user (mode {mode:o}): chmod 600 it")
    return out


def table_traps(config: ConfigFile) -> list[str]:
    """Warnings for TOML's trap: every key below a ``[table]`` header belongs to that table, so a setting appended
    after ``[storage_options]`` becomes a storage option without complaint. One per key there named as a setting."""
    options = config.values.get("storage_options")
    if not isinstance(options, dict):
        return []
    return [f"{config.where(f'storage_options.{key}')}: {key!r} is a key of the [storage_options] table (every key "
            f"below a [table] header belongs to it), not the samplecache setting {key!r}: to set it, move it above "
            f"the first [table] of the file" for key in options if key in Settings.model_fields]


CATALOG_SHOWN = frozenset({"type", "uri", "warehouse"})


def shown(settings: Settings) -> dict[str, Any]:
    """Settings for people: secrets masked (the token, secret storage options, credentials in the source)."""
    d = settings.model_dump(mode="json")
    d["token"] = "<set>" if settings.token else None
    d["storage_options"] = masked_options(settings.storage_options)
    # a catalog's type, URI and warehouse are shown (credentials in a URI masked); any other property is hidden
    d["iceberg_catalogs"] = {n: {k: redact(str(v)) if k in CATALOG_SHOWN else HIDDEN for k, v in props.items()}
                             for n, props in settings.iceberg_catalogs.items()}
    if settings.source:
        d["source"] = redact(settings.source)
    return d


def option_sources(loaded: Loaded) -> dict[str, str]:
    """Where each storage option came from: its own line of the config file (not the table's header), else where
    storage_options as a whole came from."""
    whole = loaded.sources["storage_options"]
    cfg = loaded.config
    out = {}
    for key in loaded.settings.storage_options:
        line = cfg.lines.get(f"storage_options.{key}")
        out[key] = f"config {cfg.path}:{line}" if whole.startswith("config") and line else whole
    return out
