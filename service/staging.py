"""Staging files: a sampler's finished shard on disk, handed to the ingester.

Written as ``NAME.tmp`` -> fsync -> rename to ``NAME.shard`` (then the directory is
fsynced), so a ``.shard`` file is always complete; a ``.tmp`` file is garbage.
Layout: b"SCSTG001" | header length (u32 LE) | JSON header | blocks back to back.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

MAGIC = b"SCSTG001"
_LEN = struct.Struct("<I")
SUFFIX = ".shard"
TMP_SUFFIX = ".tmp"


class StagingError(ValueError):
    pass


@dataclass
class StagedShard:
    path: Path
    header: dict[str, Any]
    blocks: list[memoryview]
    _view: memoryview | None
    _mm: mmap.mmap | None

    def close(self) -> None:
        for b in self.blocks:
            b.release()
        self.blocks = []
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_staged(directory: Path, name: str, header: dict[str, Any], blocks: Sequence[bytes]) -> Path:
    """Write one shard atomically; returns the final ``.shard`` path."""
    header = dict(header, block_lengths=[len(b) for b in blocks])
    raw = json.dumps(header, separators=(",", ":")).encode()
    tmp = directory / (name + TMP_SUFFIX)
    final = directory / (name + SUFFIX)
    with open(tmp, "wb") as f:
        f.write(MAGIC + _LEN.pack(len(raw)) + raw)
        for b in blocks:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


def read_staged(path: Path) -> StagedShard:
    """Map a staging file; raises StagingError when it is not a complete shard."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < len(MAGIC) + _LEN.size:
            raise StagingError(f"{path.name}: truncated staging file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if mm[:len(MAGIC)] != MAGIC:
            raise StagingError(f"{path.name}: not a staging file")
        (hlen,) = _LEN.unpack_from(mm, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        header = json.loads(mm[start:start + hlen])
        lengths = header.get("block_lengths") if isinstance(header, dict) else None
        if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 0 for n in lengths):
            raise StagingError(f"{path.name}: bad staging header")
        pos = start + hlen
        view = memoryview(mm)
        blocks = []
        for n in lengths:
            if pos + n > size:
                raise StagingError(f"{path.name}: truncated staging file")
            blocks.append(view[pos:pos + n])
            pos += n
    except (StagingError, ValueError, KeyError, TypeError) as e:
        for b in locals().get("blocks", []):
            b.release()
        if "view" in locals():
            view.release()
        mm.close()
        if isinstance(e, StagingError):
            raise
        raise StagingError(f"{path.name}: {type(e).__name__}: {e}") from e
    return StagedShard(path=path, header=header, blocks=blocks, _view=view, _mm=mm)


def leftovers(directory: Path) -> Iterator[Path]:
    """Complete staging files left by a previous run; removes half-written ``.tmp`` files."""
    for p in sorted(directory.iterdir()):
        if p.suffix == TMP_SUFFIX:
            p.unlink(missing_ok=True)
        elif p.suffix == SUFFIX:
            yield p
