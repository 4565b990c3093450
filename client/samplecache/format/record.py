"""The record/wire format: the one module the daemon and the client share.

Pure stdlib + numpy + xxhash. A shard's rows are stored as *blocks*: each block holds a
contiguous run of rows, column by column, so a batch is a vectorised gather and
a 1 MiB tensor decodes with a single ``np.frombuffer`` + copy.

Block layout (all integers little endian)::

    header   : magic b"SCB" + FORMAT_VERSION (u8) | ncols u16 | pad u16 | nrows u32 | pad u32 | checksum u64
               (24 bytes)
    table    : ncols x 7 u64 = (layout, data_off, data_len, aux_off, aux_len, shape_off, valid_off)
    sections : each aligned to ALIGN bytes

Per column kind, in the dense layout (0):

* ``fixed``  data = nrows x prod(shape) values of dtype, C order (numbers, bool, datetime64/timedelta64).
* ``list``   data = flat leaf values; aux = int64 offsets (nrows + 1) in leaf
             items; shape section = int32 (nrows, ndim) per-row shapes.
* ``string`` / ``binary`` data = concatenated bytes; aux = int64 offsets.
* any kind may carry ``valid`` = nrows uint8 (0 = null); offset 0 means none.

The nested layout (1, ``samplecache.format.nested``) holds any Arrow value with nulls at every level: always for
``nested`` columns (structs, maps, decimals, lists of strings...), and for the blocks of a ``fixed`` or
``list`` column whose rows have null elements or ragged nesting. Its aux section is a u64 table of
(offset, length) per buffer of the type tree, depth first; ``valid_off`` points at the root's validity.

``checksum`` is xxh3_64 (the ``xxhash`` package) of every byte of the block but its own 8: bytes
0-15, then 24 to the end (table, sections and the padding between them), so a flipped byte anywhere in a
block is found. The encoder computes it when it builds the block; the writer checks it when it ingests a
shard, ``samplecache verify`` over the whole cache, and the client on read when asked (``verify_block``).

The schema is stored once (in the daemon's catalog and in every manifest), never
per record. Keys sort by shard id, so age order is key order.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import xxhash

from samplecache.format import nested

FORMAT_VERSION = 3  # v3: a checksum in every block header
MAGIC = b"SCB" + bytes([FORMAT_VERSION])
ALIGN = 64
KINDS = ("fixed", "list", "string", "binary", "nested")
DENSE, NESTED = 0, 1  # block layouts of a column

HEADER = struct.Struct("<4sHHIIQ")
SUM_AT = 16  # offset of the checksum in the header (the header's last 8 bytes)
ENTRY = struct.Struct("<7Q")


class FormatError(ValueError):
    """A block or schema that this version of the format cannot read."""


class DamagedBlock(FormatError):
    """A stored block whose bytes are not the ones written (its checksum does not match)."""

    def __init__(self, shard: int, block: int, reason: str) -> None:
        super().__init__(f"shard {shard} block {block} of the cache is damaged ({reason}): the cache file does "
                         f"not hold the bytes written; run `samplecache verify` to list the damage and restart "
                         f"the daemon with --reset-cache to rebuild the cache")
        self.shard, self.block, self.reason = shard, block, reason


@dataclass(frozen=True)
class Column:
    """One column of the schema.

    ``shape`` is the per-sample shape for ``fixed`` columns (``()`` for a
    scalar); for ``list`` columns it has ``-1`` where a dimension varies by row.
    ``type`` is the column's type tree (``samplecache.format.nested``; derived from
    kind, dtype and shape when not given), ``tz`` a timestamp's time zone,
    ``arrow`` the remote's Arrow type as text and ``info`` what the dataset says
    about the column (e.g. Hugging Face ``ClassLabel`` names).
    """

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    nullable: bool = False
    type: Mapping[str, Any] | None = field(default=None, compare=False)
    tz: str | None = None
    arrow: str | None = field(default=None, compare=False)
    info: Mapping[str, Any] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "dtype": self.dtype,
               "shape": list(self.shape), "nullable": self.nullable, "type": dict(self.type_node())}
        for k in ("tz", "arrow", "info"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Column":
        kind = obj["kind"]
        if kind not in KINDS:
            raise FormatError(f"unknown column kind {kind!r}")
        return cls(name=obj["name"], kind=kind, dtype=obj.get("dtype"),
                   shape=tuple(obj.get("shape", ())), nullable=bool(obj.get("nullable", False)),
                   type=obj.get("type"), tz=obj.get("tz"), arrow=obj.get("arrow"), info=obj.get("info"))

    @functools.cached_property
    def ext(self) -> str | None:
        """The extension type a binary column's values decode to (``nested.EXTENSIONS``: uuid...), if any: looked
        up once, not per cell."""
        return self.type.get("ext") if self.type is not None else None

    def type_node(self) -> Mapping[str, Any]:
        """The type tree of the nested layout (``samplecache.format.nested``)."""
        if self.type is not None:
            return self.type
        if self.kind in ("string", "binary"):
            return {"t": self.kind}
        if self.kind == "nested":
            raise FormatError(f"nested column {self.name!r} has no type")
        node: dict[str, Any] = {"t": "prim", "dtype": self.dtype or "<f4"}
        for size in reversed(self.shape):
            node = {"t": "list", "child": node} if size < 0 else {"t": "list", "size": size, "child": node}
        return node

    @property
    def item_count(self) -> int:
        """Values per sample of a ``fixed`` column."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclass(frozen=True)
class Schema:
    columns: tuple[Column, ...]
    version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"format_version": self.version, "columns": [c.to_json() for c in self.columns]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Schema":
        version = int(obj.get("format_version", -1))
        if version != FORMAT_VERSION:
            raise FormatError(
                f"record format version mismatch: data has v{version}, this samplecache reads v{FORMAT_VERSION}")
        return cls(columns=tuple(Column.from_json(c) for c in obj["columns"]), version=version)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def index(self, name: str) -> int:
        for i, c in enumerate(self.columns):
            if c.name == name:
                return i
        raise KeyError(f"no column {name!r}; columns are {self.names}")


# --- keys ------------------------------------------------------------------------

def record_key(shard_id: int, block: int) -> bytes:
    """Key of one block: shard id (8 bytes BE) + block index (4 bytes BE)."""
    return shard_id.to_bytes(8, "big") + block.to_bytes(4, "big")


def shard_prefix(shard_id: int) -> bytes:
    return shard_id.to_bytes(8, "big")


def parse_key(key: bytes) -> tuple[int, int]:
    return int.from_bytes(key[:8], "big"), int.from_bytes(key[8:12], "big")


# --- checksums -------------------------------------------------------------------------------

def block_checksum(buf: memoryview | bytes | bytearray) -> int:
    """xxh3_64 of a block without its checksum field: bytes [0, 16) then [24, end)."""
    view = memoryview(buf)
    h = xxhash.xxh3_64(view[:SUM_AT])
    h.update(view[HEADER.size:])
    return h.intdigest()


def verify_block(buf: memoryview | bytes | bytearray, full: bool = True) -> str | None:
    """Why a stored block is damaged, or None when it is whole. ``full=False`` checks only its header
    (length, magic, version): no payload byte is read."""
    if len(buf) < HEADER.size:
        return f"{len(buf)} bytes, shorter than the {HEADER.size}-byte block header"
    magic = bytes(buf[:4])
    if magic != MAGIC:
        return f"bad magic {magic!r}" if magic[:3] != MAGIC[:3] else f"record format v{magic[3]}, not v{FORMAT_VERSION}"
    stored, got = struct.unpack_from("<Q", buf, SUM_AT)[0], block_checksum(buf) if full else None
    return None if got in (None, stored) else f"checksum mismatch: stored {stored:#018x}, computed {got:#018x}"


def check_block(buf: memoryview | bytes | bytearray, shard: int, block: int) -> None:
    """Raise DamagedBlock naming the shard and the block when the block is damaged."""
    reason = verify_block(buf)
    if reason is not None:
        raise DamagedBlock(shard, block, reason)


# --- decoding ------------------------------------------------------------------------

class BlockView:
    """Zero-copy view of one encoded block (e.g. an LMDB memoryview).

    Arrays returned by the ``*_array`` helpers alias ``buf``: copy before the
    buffer goes away (the LMDB read transaction ends). ``row`` and ``gather``
    return owned copies.
    """

    __slots__ = ("buf", "schema", "nrows", "_table", "_cache")

    def __init__(self, buf: memoryview | bytes, schema: Schema) -> None:
        magic, ncols, _, nrows, _, _ = HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            if bytes(magic[:3]) == MAGIC[:3]:
                raise FormatError(f"record format version mismatch: block is v{magic[3]}, "
                                  f"this samplecache reads v{FORMAT_VERSION}")
            raise FormatError("not a samplecache block (bad magic)")
        if ncols != len(schema.columns):
            raise FormatError(f"block has {ncols} columns, schema has {len(schema.columns)}")
        self.buf = buf
        self.schema = schema
        self.nrows = nrows
        self._table = [ENTRY.unpack_from(buf, HEADER.size + i * ENTRY.size) for i in range(ncols)]
        self._cache: dict[int, tuple[Any, ...]] = {}

    def _parts(self, ci: int) -> tuple[Any, ...]:
        """(data, offsets, shapes, valid, tree) of a column: numpy views of the block; ``tree`` is the
        ``nested.Node`` of a column stored in the nested layout (then data is its leaf values for a
        ``fixed`` column, else None)."""
        got = self._cache.get(ci)
        if got is not None:
            return got
        col = self.schema.columns[ci]
        layout, data_off, data_len, aux_off, aux_len, shape_off, valid_off = self._table[ci]
        n = self.nrows
        valid = np.frombuffer(self.buf, np.uint8, n, valid_off) if valid_off else None
        if layout == NESTED:
            where = np.frombuffer(self.buf, "<u8", aux_len // 8, aux_off).reshape(-1, 2).tolist()
            tree = nested.build(col.type_node(), n, ((self.buf, int(o), int(ln)) for o, ln in where))
            data = None
            if col.kind == "fixed":
                data = nested.leaf_values(tree).reshape((n,) + col.shape)
            got = (data, None, None, tree.valid, tree)
        elif col.kind == "fixed":
            dt = np.dtype(col.dtype)
            data = np.frombuffer(self.buf, dt, data_len // dt.itemsize, data_off).reshape((n,) + col.shape)
            got = (data, None, None, valid, None)
        else:
            offsets = np.frombuffer(self.buf, "<i8", n + 1, aux_off)
            if col.kind == "list":
                dt = np.dtype(col.dtype)
                data = np.frombuffer(self.buf, dt, data_len // dt.itemsize, data_off)
                shapes = np.frombuffer(self.buf, "<i4", n * len(col.shape), shape_off).reshape(n, len(col.shape))
                got = (data, offsets, shapes, valid, None)
            else:
                got = (np.frombuffer(self.buf, np.uint8, data_len, data_off), offsets, None, valid, None)
        self._cache[ci] = got
        return got

    def has_nulls(self, ci: int) -> bool:
        """Whether any cell of the column, or any element inside one, is null in this block."""
        return bool(self._table[ci][6]) or self._table[ci][0] == NESTED

    def column_array(self, ci: int) -> np.ndarray:
        """The whole ``fixed`` column as an (nrows, *shape) view (what lies under nulls is undefined)."""
        data: np.ndarray = self._parts(ci)[0]
        return data

    def column_mask(self, ci: int) -> np.ndarray | None:
        """For a ``fixed`` column: an (nrows, *shape) bool array, False where a value is null (at any
        level), or None when none is."""
        data, _, _, valid, tree = self._parts(ci)
        if tree is not None:
            mask = nested.leaf_mask(tree)
            return None if mask is None else mask.reshape(data.shape)
        if valid is None:
            return None
        return np.broadcast_to(valid.astype(bool).reshape((-1,) + (1,) * (data.ndim - 1)), data.shape)

    def value(self, ci: int, i: int) -> Any:
        """One cell as an owned Python/numpy value (None for null); the README's table of representations."""
        data, offsets, shapes, valid, tree = self._parts(ci)
        if valid is not None and not valid[i]:
            return None
        kind = self.schema.columns[ci].kind
        if tree is not None:
            if kind == "nested":
                return nested.to_py(tree, i, i + 1)[0]
            return nested.cell(tree, i)
        if kind == "fixed":
            v = data[i]
            return v.copy() if data.ndim > 1 else v
        a, b = int(offsets[i]), int(offsets[i + 1])
        if kind == "list":
            return data[a:b].reshape(tuple(shapes[i])).copy()
        raw = data[a:b].tobytes()
        if kind == "string":
            return raw.decode("utf-8")
        ext = self.schema.columns[ci].ext
        return raw if ext is None else nested.EXTENSIONS[ext](raw)

    def row(self, i: int, cols: Sequence[int]) -> dict[str, Any]:
        names = self.schema.columns
        return {names[ci].name: self.value(ci, i) for ci in cols}

    def gather(self, rows: np.ndarray, ci: int) -> Any:
        """Values of column ``ci`` at ``rows``: one array for fixed columns without nulls, else a list."""
        if self.schema.columns[ci].kind == "fixed" and not self.has_nulls(ci):
            return np.take(self._parts(ci)[0], rows, axis=0)
        return [self.value(ci, int(r)) for r in rows]


def decode_rows(buf: memoryview | bytes, schema: Schema, cols: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Decode every row of a block (convenience for tests and tools)."""
    view = BlockView(buf, schema)
    idx = list(range(len(schema.columns))) if cols is None else list(cols)
    return [view.row(i, idx) for i in range(view.nrows)]
