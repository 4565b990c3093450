"""Files and directories the daemon creates: private modes whatever the umask, never through a planted link.

Directories are 0750 and files 0640 (the group that may train reads the cache; nobody else does); LMDB's two
files are 0660, as readers in the group write their slot in lock.mdb. A new file is opened with
O_CREAT|O_EXCL|O_NOFOLLOW: a symlink or a file planted under its name makes the open fail instead of writing
through it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o750
FILE_MODE = 0o640
SHARED_FILE_MODE = 0o660  # data.mdb and lock.mdb: a reader in the group takes a reader slot in lock.mdb


def make_dir(path: Path, mode: int = DIR_MODE) -> None:
    """Create ``path`` (and its parents) if needed; the directory itself gets ``mode`` exactly."""
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link; the daemon does not follow links for its own directories")
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)


def open_new(path: Path, mode: int = FILE_MODE) -> int:
    """A new file for writing (fails with FileExistsError if anything, a link included, has that name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def fix_mode(fd: int, mode: int) -> None:
    """Give the open file ``fd`` exactly ``mode``: the umask applies to O_CREAT's mode. A file already so is left
    alone (it may be another user's)."""
    if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
        os.fchmod(fd, mode)


def set_mode(path: Path, mode: int) -> None:
    """Give a file that a library created under the umask (LMDB's) exactly ``mode``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        fix_mode(fd, mode)
    finally:
        os.close(fd)
