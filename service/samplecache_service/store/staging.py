"""Staging files: a sampler's finished shard on disk, handed to the ingester.

Written as ``NAME.tmp`` -> rename to ``NAME.shard``, so while the machine stays up a ``.shard`` file is always
complete and a ``.tmp`` file is garbage. No fsync: the remote is the source of truth, so after a power cut a torn
staging file (a bad header, or a block that fails its checksum at ingest) is dropped and its unit sampled again.
The fsyncs cost 9% of a large unit's sampling time for a guarantee nobody needs.
Layout: b"SCSTG001" | header length (u32 LE) | JSON header | blocks back to back.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from samplecache_service.files import make_dir, open_new

log = logging.getLogger("samplecache.staging")

MAGIC = b"SCSTG001"
_LEN = struct.Struct("<I")
SUFFIX = ".shard"
TMP_SUFFIX = ".tmp"
REJECTED_DIR = "rejected"
REJECTED_KEPT = 8


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


Block = bytes | bytearray | memoryview | Sequence[memoryview]  # a block, or its pieces (blockenc.encode_pieces)


def block_length(block: Block) -> int:
    return len(block) if isinstance(block, (bytes, bytearray, memoryview)) else sum(len(p) for p in block)


def write_staged(directory: Path, name: str, header: dict[str, Any], blocks: Sequence[Block]) -> Path:
    """Write one shard atomically; returns the final ``.shard`` path. A block may come as its pieces: they are
    written one after the other, never joined in memory."""
    header = dict(header, block_lengths=[block_length(b) for b in blocks])
    raw = json.dumps(header, separators=(",", ":")).encode()
    tmp = directory / (name + TMP_SUFFIX)
    final = directory / (name + SUFFIX)
    if final.is_symlink():
        raise StagingError(f"{final}: a symbolic link is in the way of a staging file")
    try:
        fd = open_new(tmp)
    except FileExistsError:  # a leftover of a killed sampler (never a link: O_NOFOLLOW refuses those)
        if tmp.is_symlink():
            raise StagingError(f"{tmp}: a symbolic link is in the way of a staging file") from None
        tmp.unlink()
        fd = open_new(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + _LEN.pack(len(raw)) + raw)
            for b in blocks:
                for piece in ((b,) if isinstance(b, (bytes, bytearray, memoryview)) else b):
                    f.write(piece)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep the half-written file's space
        raise
    os.replace(tmp, final)
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
    """Complete staging files left by a previous run; removes half-written ``.tmp`` files and links."""
    for p in sorted(directory.iterdir()):
        if p.is_symlink() or p.suffix == TMP_SUFFIX:
            p.unlink(missing_ok=True)
        elif p.suffix == SUFFIX and p.is_file():
            yield p


def set_aside(path: Path) -> Path | None:
    """Move a staging file that could not be ingested into ``rejected/`` beside it (for a look; the newest
    ``REJECTED_KEPT`` are kept), or drop it when even that fails. Returns where it went."""
    where = path.parent / REJECTED_DIR
    try:
        make_dir(where)
        target = where / path.name
        os.replace(path, target)
        kept = sorted(where.iterdir(), key=lambda p: p.stat().st_mtime)
        for old in kept[:-REJECTED_KEPT]:
            old.unlink(missing_ok=True)
        return target
    except OSError:
        path.unlink(missing_ok=True)
        return None


def drop_failed(path: Path, damaged: bool) -> None:
    """A staging file whose ingest failed, before its unit is sampled again: a damaged one is set aside for a
    look (and logged), any other removed (a leftover would be ingested twice after a restart)."""
    if not damaged:
        path.unlink(missing_ok=True)
        return
    where = set_aside(path)
    log.error("the damaged staging file is %s", f"in {where}" if where else "dropped",
              extra={"event": "staging_set_aside", "path": str(where or path)})
