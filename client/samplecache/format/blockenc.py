"""The block encoder of the record format (``samplecache.format.record`` has the layout and the decoder).

Only the daemon's samplers encode; the encoder is kept apart so the module every reader imports stays small.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import xxhash

from samplecache.format import nested
from samplecache.format.record import ALIGN, DENSE, ENTRY, HEADER, MAGIC, NESTED, SUM_AT, FormatError, Schema


@dataclass
class ColumnData:
    """Encoder input for one column of one block (numpy arrays, no Python objects)."""

    data: np.ndarray                      # fixed: (nrows, *shape); others: flat values / uint8 bytes
    offsets: np.ndarray | None = None     # list/string/binary: int64, nrows + 1
    shapes: np.ndarray | None = None      # list: int32 (nrows, ndim)
    valid: np.ndarray | None = None       # optional bool/uint8 (nrows,)
    tree: list[np.ndarray | None] | None = None  # the nested layout: every buffer of the type tree, depth first


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def encode_block(schema: Schema, columns: Sequence[ColumnData], nrows: int) -> bytearray:
    """Encode one block; ``columns`` follows ``schema.columns`` order."""
    return bytearray().join(encode_pieces(schema, columns, nrows))


def encode_pieces(schema: Schema, columns: Sequence[ColumnData], nrows: int) -> list[memoryview]:
    """One block as its pieces, in order, never joined: the head (header and column table, checksum filled in),
    then each section (a view of the caller's array, not a copy) and the zero padding after it. A writer
    writes them one after the other; the block costs no copy of its payload before that."""
    if len(columns) != len(schema.columns):
        raise FormatError(f"block has {len(columns)} columns, schema has {len(schema.columns)}")
    parts: list[tuple[int, np.ndarray]] = []
    table: list[tuple[int, ...]] = []
    pos = _aligned(HEADER.size + ENTRY.size * len(columns))

    def place(arr: np.ndarray | None) -> tuple[int, int]:
        nonlocal pos
        if arr is None:
            return 0, 0
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        off = pos
        parts.append((off, raw))
        pos = _aligned(pos + raw.nbytes)
        return off, raw.nbytes

    for col, cd in zip(schema.columns, columns):
        if cd.tree is not None:
            if len(cd.tree) != nested.slots(col.type_node()):
                raise FormatError(f"column {col.name!r}: {len(cd.tree)} buffers for a type of "
                                  f"{nested.slots(col.type_node())}")
            where = np.array([place(b) for b in cd.tree], dtype="<u8").reshape(-1)
            aux_off, aux_len = place(where)
            table.append((NESTED, 0, 0, aux_off, aux_len, 0, int(where[0]) if len(where) else 0))
            continue
        data_off, data_len = place(cd.data)
        aux_off, aux_len = place(None if cd.offsets is None else cd.offsets.astype("<i8", copy=False))
        shape_off, _ = place(None if cd.shapes is None else cd.shapes.astype("<i4", copy=False))
        valid_off, _ = place(None if cd.valid is None else cd.valid.astype(np.uint8, copy=False))
        table.append((DENSE, data_off, data_len, aux_off, aux_len, shape_off, valid_off))

    head = bytearray(parts[0][0] if parts else pos)
    HEADER.pack_into(head, 0, MAGIC, len(columns), 0, nrows, 0, 0)
    for i, entry in enumerate(table):
        ENTRY.pack_into(head, HEADER.size + i * ENTRY.size, *entry)
    pieces, at = [memoryview(head)], len(head)
    for off, raw in parts:
        if off > at:
            pieces.append(memoryview(bytes(off - at)))
        pieces.append(raw.data)  # the array's own memoryview: no copy
        at = off + raw.nbytes
    if pos > at:
        pieces.append(memoryview(bytes(pos - at)))
    h = xxhash.xxh3_64(pieces[0][:SUM_AT])
    for i, piece in enumerate(pieces):
        h.update(piece[HEADER.size:] if i == 0 else piece)
    struct.pack_into("<Q", head, SUM_AT, h.intdigest())
    return pieces
