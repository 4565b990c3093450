"""The token the client sends when none was given: found through the daemon, with no setup.

A daemon that authenticates its mutations names, in ``GET /v1/status``, a token
file in its cache dir (``auth = {"required": true, "token_file": path}``),
readable by the group that may train; trainers already read that cache dir, so
they can read the token too. The client asks once per daemon URL and process
(forked DataLoader workers inherit the answer), reads the file, and sends
``Authorization: Bearer <token>``. A 401 to that token makes it ask and read
again once: the daemon may have restarted with a new token. A daemon whose
status has no ``auth`` (or no ``/v1/status``) needs no token.

A token given as ``token=`` or in ``SAMPLECACHE_TOKEN`` is used as it is; no
discovery happens.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from samplecache.api.client import DaemonError, request_json
from samplecache.format.constants import TOKEN_FILE_NAME

_found: dict[str, str | None] = {}  # daemon base URL -> its token (None: it needs none)
_files: dict[str, str] = {}  # daemon base URL -> the token file it named
_lock = threading.Lock()


def _group_of(path: Path) -> str:
    """The group owning ``path`` or its nearest visible parent, by name where it has one."""
    for p in (path, *path.parents):
        try:
            gid = p.stat().st_gid
        except OSError:
            continue
        try:
            return f"'{grp.getgrgid(gid).gr_name}' (of {p})"
        except KeyError:
            return f"gid {gid} (of {p})"
    return "that owns the daemon's cache dir"


MAX_TOKEN_BYTES = 4096


def _loopback(base: str) -> bool:
    host = (urllib.parse.urlsplit(base).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(base: str, token_file: str) -> str:
    """The token in ``token_file`` (whitespace stripped), or a DaemonError that names the file and the fix.

    The file is named by the daemon, so it is trusted only so far: a regular file called ``api-token`` of at most
    4 KiB holding one printable line; anything else is refused (a fake daemon must not make the client read
    and send another file)."""
    path = Path(token_file)
    if path.name != TOKEN_FILE_NAME:
        raise DaemonError(f"the daemon at {base} names {token_file!r} as its token file, which is not an "
                          f"'{TOKEN_FILE_NAME}' file: refused; pass its token as token=... / SAMPLECACHE_TOKEN")
    try:
        st = path.lstat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) or st.st_size > MAX_TOKEN_BYTES:
            raise DaemonError(f"the daemon's token file {token_file} is not a regular file of at most "
                              f"{MAX_TOKEN_BYTES} bytes: refused; pass its token as token=... / SAMPLECACHE_TOKEN")
        token = path.read_text(encoding="utf-8").strip()
        if not token.isprintable():
            raise DaemonError(f"the daemon's token file {token_file} does not hold one printable line: refused")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise DaemonError(
            f"the samplecache daemon at {base} requires a token for requests that change state, kept in "
            f"{token_file}, but this process (uid {os.getuid()}) cannot read that file ({why}). Either join the "
            f"group {_group_of(path)} that can read the cache dir (e.g. `sudo usermod -aG <group> $USER`, then "
            f"log in again), or pass the daemon's token as token=... / SAMPLECACHE_TOKEN.") from None
    if not token:
        raise DaemonError(f"the samplecache daemon's token file {token_file} is empty; restart the daemon, or pass "
                          f"its token as token=... / SAMPLECACHE_TOKEN")
    return token


def _discover(base: str, until: float, retries: int | None, what: str) -> str | None:
    """Ask the daemon whether it needs a token and where it keeps it; read it from there."""
    try:
        status: Any = request_json(f"{base}/v1/status", deadline=max(0.05, until - time.monotonic()),
                                   retries=retries, discover=False,
                                   what=f"{what}: first asking /v1/status whether the daemon needs a token")
    except DaemonError as e:
        if e.status == 404:  # a daemon (or stand-in) without /v1/status: no auth to find
            return None
        raise
    auth = status.get("auth") if isinstance(status, dict) else None
    if not isinstance(auth, dict) or not auth.get("required"):
        return None  # a daemon that says nothing about auth needs none
    token_file = auth.get("token_file")
    if token_file and not _loopback(base):
        raise DaemonError(f"the samplecache daemon at {base} requires a token; a token file is read only for a daemon "
                          f"on this host (loopback): pass its token as token=... or SAMPLECACHE_TOKEN")
    if not token_file:
        raise DaemonError(f"the samplecache daemon at {base} requires a token and names no token file: pass its "
                          f"token as token=... or SAMPLECACHE_TOKEN")
    _files[base] = str(token_file)
    return read_token(base, str(token_file))


def token_for(base: str, until: float, retries: int | None = None, what: str = "a request") -> str | None:
    """The token for the daemon at ``base`` (None: none needed), found once per process by ``until`` (a
    ``time.monotonic()`` value) for the call ``what``."""
    with _lock:
        if base not in _found:
            _found[base] = _discover(base, until, retries, what)
        return _found[base]


def refresh(base: str, until: float, retries: int | None = None, what: str = "a request") -> str | None:
    """Ask again (after a 401): the token the daemon names now, or None when it still gives none."""
    with _lock:
        _found.pop(base, None)
        _found[base] = _discover(base, until, retries, what)
        return _found[base]


def forget(base: str | None = None) -> None:
    """Drop what was found (for ``base``, or for every daemon): the next request asks again."""
    with _lock:
        for url in [base] if base is not None else list(_found):
            _found.pop(url, None)
            _files.pop(url, None)


def hint(base: str) -> str:
    """What to do about a 401, for the error's message."""
    where = f" (read from {_files[base]})" if base in _files else ""
    return (f". The token sent{where} was refused: pass the daemon's token as token=... or SAMPLECACHE_TOKEN, "
            f"or leave both unset so the client reads the daemon's token file")
