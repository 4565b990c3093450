"""The daemon's bearer token, with no setup: given (``--token``), or kept in a token file it creates.

Every request that changes state needs ``Authorization: Bearer <token>`` unless ``--auth off``. With no
``--token`` the daemon reuses its token file (default ``<cache_dir>/api-token``) or creates one with a random
token, mode 0640 whatever the umask: the group that may train reads the cache dir, so it can read the token
(``GET /v1/status`` names the file). A symlink or anything but a regular file there stops the start.
``--auth off`` is refused on an address that is not loopback (``settings.py`` checks it).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from samplecache.format.constants import TOKEN_FILE_NAME
from samplecache_service.files import make_dir
from samplecache_service.store.cachedir import StartupError

if TYPE_CHECKING:
    from samplecache_service.config.settings import Settings

log = logging.getLogger(__name__)
MAX_TOKEN_BYTES = 4096  # a token file larger than this is not one of ours
TOKEN_MODE = 0o640  # the owner writes, the cache dir's group (the trainers) reads, nobody else


def token_path(settings: "Settings") -> Path:
    """Where the token file is (whether or not it is used)."""
    return settings.token_file if settings.token_file is not None else settings.cache_dir.resolve() / TOKEN_FILE_NAME


def uses_token_file(settings: "Settings") -> bool:
    return settings.auth != "off" and not settings.token


def auth_status(settings: "Settings") -> dict[str, Any]:
    """What ``/v1/status`` says: whether mutations need a token, and the file a client on this host reads."""
    return {"required": settings.auth != "off",
            "token_file": str(token_path(settings)) if uses_token_file(settings) else None}


def _read(path: Path) -> str | None:
    """The token in the regular file at ``path`` (None: no file, or an empty one); never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if path.is_symlink():
            raise StartupError(f"token file {path} is a symbolic link; the daemon does not follow links for its "
                               f"token: remove it (a new token file is created) or set --token-file") from None
        raise StartupError(f"cannot read the token file {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StartupError(f"token file {path} is not a regular file: remove it or set --token-file")
        raw = os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_BYTES:
        raise StartupError(f"token file {path} is larger than {MAX_TOKEN_BYTES} bytes: not a token file")
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise StartupError(f"token file {path} is not UTF-8 text: remove it (a new one is created)") from None
    if st.st_mode & 0o007:
        log.warning("token file %s can be read by every user (mode %o): chmod 640 it", path, st.st_mode & 0o777,
                    extra={"event": "token_file_readable", "path": str(path)})
    return token or None


def _create(path: Path) -> str:
    """A new random token in a new file at ``path`` (0640; fails if anything appeared there meanwhile)."""
    if not path.parent.exists():  # a dir not made yet: 0750 whatever the umask, so the group reaches the token
        make_dir(path.parent)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, TOKEN_MODE)
    except FileExistsError:
        raise StartupError(f"token file {path} appeared while the daemon created it: start again") from None
    except OSError as e:
        raise StartupError(f"cannot create the token file {path}: {e.strerror or e}") from None
    try:
        os.fchmod(fd, TOKEN_MODE)
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    log.info("created the API token file %s (mode 0640)", path,
             extra={"event": "token_file_created", "path": str(path)})
    return token


def resolve_token(settings: "Settings") -> str | None:
    """The token mutations need (None: ``--auth off``). Raises StartupError for a token file it cannot use."""
    if settings.auth == "off":
        return None
    if settings.token:
        return settings.token
    path = token_path(settings)
    token = _read(path)
    if token is not None:
        return token
    if path.exists() or path.is_symlink():  # an empty regular file: a start that died while writing it
        log.warning("token file %s is empty: writing a new token", path,
                    extra={"event": "token_file_empty", "path": str(path)})
        path.unlink()
    return _create(path)


WHERE = "the token is in the file GET /v1/status names as auth.token_file (or the daemon's --token)"
NO_TOKEN = f"this request changes state and needs 'Authorization: Bearer <token>', and it sent no token: {WHERE}"
NOT_BEARER = f"the Authorization header is not 'Bearer <token>', so no token was read from it: {WHERE}"
WRONG_TOKEN = (f"the bearer token sent is not this daemon's token (one from an earlier token file or another daemon "
               f"is refused): {WHERE}")


def token_problem(header: bytes | None, token: bytes) -> str | None:
    """None when an ``Authorization`` header (raw bytes, any encoding) carries ``Bearer <token>``; else the 401's
    detail: no token, not a bearer header, or a wrong token. It never shows the token sent or the daemon's."""
    scheme, _, given = (header or b"").strip().partition(b" ")
    if not scheme:
        return NO_TOKEN
    if scheme.lower() != b"bearer":
        return NOT_BEARER
    if not given.strip():
        return NO_TOKEN
    # constant time: the reply's timing tells nothing of how much of the token was right
    return None if hmac.compare_digest(given.strip(), token) else WRONG_TOKEN
