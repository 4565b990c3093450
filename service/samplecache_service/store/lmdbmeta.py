"""LMDB's two meta pages, read from ``data.mdb`` with plain file reads (never mapped).

Opening a damaged data file with LMDB can kill the process: a file shorter than the pages its meta names
maps fine and dies of SIGBUS at the first read past its end. Reading the meta pages first finds that, and a
wrong magic or version, before ``lmdb.open``.

Layout (LMDB 0.9, ``mdb.c``; integers in the host's byte order, 64-bit ``size_t``): page 0 and page 1 are
meta pages, each a 16-byte page header (``mp_flags`` u16 at offset 10, ``P_META`` = 0x08) followed by
``MDB_meta``::

    mm_magic u32 (0xBEEFC0DE) | mm_version u32 (1) | mm_address u64 | mm_mapsize u64
    | mm_dbs[2] (2 x 48 bytes; the page size is the first one's md_pad u32) | mm_last_pg u64 | mm_txnid u64

The newer meta (larger txnid) is the current one; its ``mm_last_pg`` is the last page in use, so a whole
file holds at least ``(mm_last_pg + 1) * page_size`` bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
P_META = 0x08
PAGE_HEADER = 16
_META = struct.Struct("=IIQQ")          # magic, version, address, mapsize
_PSIZE_AT = PAGE_HEADER + 24             # mm_dbs[0].md_pad: the page size
_TAIL = struct.Struct("=QQ")            # mm_last_pg, mm_txnid
_TAIL_AT = PAGE_HEADER + 24 + 2 * 48
META_BYTES = _TAIL_AT + _TAIL.size      # what one meta page must hold to be read


class MetaError(ValueError):
    """The data file is not a whole LMDB file; the message says what is wrong."""


@dataclass(frozen=True)
class Meta:
    """The current meta page of an LMDB data file."""

    page_size: int
    map_size: int
    last_page: int
    txnid: int

    @property
    def min_file_size(self) -> int:
        return (self.last_page + 1) * self.page_size


def _meta(raw: bytes, which: int) -> tuple[int, int, int, int]:
    """(page size, map size, last page, txnid) of one meta page's bytes; MetaError when it is no meta page."""
    if len(raw) < META_BYTES:
        raise MetaError(f"meta page {which} is cut short ({len(raw)} of {META_BYTES} bytes)")
    magic, version, _, map_size = _META.unpack_from(raw, PAGE_HEADER)
    if magic != MAGIC:
        raise MetaError(f"meta page {which} has magic {magic:#010x}, not LMDB's {MAGIC:#010x}")
    if version != DATA_VERSION:
        raise MetaError(f"meta page {which} is LMDB data version {version}, not {DATA_VERSION}")
    if not struct.unpack_from("=H", raw, 10)[0] & P_META:
        raise MetaError(f"page {which} is not marked as a meta page")
    (psize,) = struct.unpack_from("=I", raw, _PSIZE_AT)
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise MetaError(f"meta page {which} names a page size of {psize} bytes")
    last, txnid = _TAIL.unpack_from(raw, _TAIL_AT)
    return psize, map_size, last, txnid


def read_meta(data_file: Path) -> Meta:
    """The current meta of ``data_file`` and a check that the file is as long as it says; MetaError if not."""
    with open(data_file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = _meta(f.read(META_BYTES), 0)
        f.seek(first[0])
        second = _meta(f.read(META_BYTES), 1)
    if second[0] != first[0]:
        raise MetaError(f"the meta pages disagree on the page size ({first[0]} and {second[0]})")
    psize, map_size, last, txnid = max(first, second, key=lambda m: m[3])
    meta = Meta(page_size=psize, map_size=map_size, last_page=last, txnid=txnid)
    if size < meta.min_file_size:
        raise MetaError(f"the file is {size} bytes, shorter than the {meta.min_file_size} bytes its meta page "
                        f"names ({last + 1} pages of {psize}): it was truncated")
    return meta
