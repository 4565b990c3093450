"""An epoch's manifest: the one definition of what the daemon seals and persists and what the client reads."""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from samplecache.format.record import FORMAT_VERSION

# One shard table row: [shard id, rows, bytes, rows per block].
ShardRow = tuple[int, int, int, int]
DEFAULT_SOURCE = "default"  # the source of every shard of a manifest that names none (one source)


@dataclass(frozen=True)
class Manifest:
    """Sealed epoch ``epoch``: its shards in id (= age) order, and what a reader needs to open them.

    The JSON form (``to_json``) is stored in the catalog and served over HTTP, so its keys are the on-disk and
    wire format; ``from_json`` also reads manifests sealed by older daemons (missing keys take their defaults)."""

    epoch: int
    lmdb_path: str
    map_size: int
    schema: dict[str, Any]
    shards: Sequence[ShardRow] | np.ndarray  # an (n, 4) int64 array once parsed: a manifest may name 100k shards
    seed: int = 0
    source: str = ""
    sealed_at: float = 0.0
    samples: int = 0
    bytes: int = 0
    new_samples: int = 0  # samples of shards that the previous sealed epoch did not hold
    remote_bytes: int = 0  # fetched from the remote since the previous epoch was sealed
    skipped_columns: dict[str, str] = field(default_factory=dict)  # source columns left out, and why
    format_version: int = FORMAT_VERSION
    # the identity of the cache it was sealed from ("": sealed before caches had one; the reader then skips its check)
    cache_id: str = ""
    # the named sources of its shards: name -> {"schema", "skipped_columns", "url"}; empty: one source, "default",
    # whose schema is ``schema``
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    # each shard's source as an index into sorted(sources), packed (pack_indices); "": every shard is the first's
    shard_sources: str = ""

    def source_names(self) -> list[str]:
        """The sources its shards come from, in the order ``source_of`` indexes them."""
        return sorted(self.sources) if self.sources else [DEFAULT_SOURCE]

    def source_of(self) -> np.ndarray:
        """Each shard's source, as an index into ``source_names()`` (int64, one per shard table row)."""
        n = len(self.table())
        if not self.shard_sources:
            return np.zeros(n, np.int64)
        got = unpack_indices(self.shard_sources)
        if len(got) != n:
            raise ValueError(f"manifest of epoch {self.epoch}: {len(got)} shard sources for {n} shards")
        return got

    def source_schema(self, name: str) -> dict[str, Any]:
        """The schema of source ``name``'s shards (KeyError naming the sources it has)."""
        if not self.sources and name == DEFAULT_SOURCE:
            return self.schema
        if name not in self.sources:
            raise KeyError(f"epoch {self.epoch} holds no source {name!r}; it holds {self.source_names()}")
        return dict(self.sources[name]["schema"])

    def to_json(self, packed: bool = False) -> dict[str, Any]:
        """As JSON: the shard table as the ``shards`` list of rows, or ``packed`` as ``shards_packed`` (what the
        daemon stores and the client fetches: 100k shards in a few hundred KB, packed in milliseconds)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if packed:
            del out["shards"]
            out["shards_packed"] = pack_shard_table(self.table())
        else:
            out["shards"] = self.shards if isinstance(self.shards, list) else self.table().tolist()
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Manifest:
        """A manifest as JSON: its shard table as the ``shards`` list or packed as ``shards_packed``."""
        table = (unpack_shard_table(raw["shards_packed"]) if "shards_packed" in raw
                 else np.array(raw["shards"], dtype=np.int64).reshape(-1, 4))
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw and k != "shards"}
        return cls(**known, shards=table)

    def table(self) -> np.ndarray:
        """The shard table as an (n, 4) int64 array."""
        return np.asarray(self.shards, dtype=np.int64).reshape(-1, 4)


def compact(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON manifest with its shard table packed as ``shards_packed``: what the client fetches."""
    out = dict(raw)
    out["shards_packed"] = pack_shard_table(out.pop("shards"))
    return out


PACKED = "c2:"  # the prefix of a table packed in narrowed columns (pack_shard_table); none: all int64 (older)
_WIDTHS = (("<u1", 1 << 8), ("<u2", 1 << 16), ("<u4", 1 << 32))
_SIGNED, _ZLIB = 0x80, 0x40  # flags of a column's code byte, beside its byte width
_SAMPLE = 8192  # bytes of a column compressed first: a column that does not shrink is stored as it is


def _narrowest(col: np.ndarray) -> str:
    """The narrowest little-endian dtype that holds every value of ``col`` (int64 when one is negative)."""
    if not len(col) or col.min() < 0:
        return "<i8"
    top = int(col.max())
    return next((dt for dt, end in _WIDTHS if top < end), "<i8")


def _squeezed(raw: bytes) -> tuple[bytes, bool]:
    """``raw`` zlib'd (level 1) when a sample of it shrinks to less than 60%, else as it is (a column of shard
    sizes barely shrinks, and compressing it would cost most of a 100k-shard seal)."""
    if len(zlib.compress(raw[:_SAMPLE], 1)) >= 0.6 * min(len(raw), _SAMPLE):
        return raw, False
    return zlib.compress(raw, 1), True


def pack_shard_table(shards: Sequence[Sequence[int]] | np.ndarray) -> str:
    """A shard table as base64 of its columns, ids delta-encoded, each in the narrowest integer type that holds
    it and zlib'd when that pays: 5x smaller than the JSON list or more, packed in 2 ms for 100k shards.
    Layout: n (u64), then per column a code byte (byte width | signed 0x80 | zlib'd 0x40) and its length (u32),
    then the columns."""
    table = np.asarray(shards, dtype=np.int64).reshape(-1, 4).T.copy()
    if table.shape[1]:
        table[0, 1:] = np.diff(table[0])
    codes, lengths, parts = bytearray(), [], []
    for col in table:
        dt = _narrowest(col)
        part, zipped = _squeezed(col.astype(dt).tobytes())
        codes.append(np.dtype(dt).itemsize | (_SIGNED if dt == "<i8" else 0) | (_ZLIB if zipped else 0))
        lengths.append(len(part))
        parts.append(part)
    head = np.array([table.shape[1]], "<u8").tobytes() + bytes(codes) + np.array(lengths, "<u4").tobytes()
    return PACKED + base64.b64encode(head + b"".join(parts)).decode()


def pack_indices(values: Sequence[int] | np.ndarray) -> str:
    """Small non-negative ints (each shard's source) as base64 of zlib'd uint16."""
    return base64.b64encode(zlib.compress(np.asarray(values, dtype="<u2").tobytes(), 1)).decode()


def unpack_indices(packed: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(packed)), "<u2").astype(np.int64)


def unpack_shard_table(packed: str) -> np.ndarray:
    """The (n, 4) int64 shard table of ``pack_shard_table`` (or of the all-int64 form older daemons served)."""
    if not packed.startswith(PACKED):
        table = np.frombuffer(zlib.decompress(base64.b64decode(packed)), "<i8").reshape(4, -1).astype(np.int64)
    else:
        raw = base64.b64decode(packed[len(PACKED):])
        n = int(np.frombuffer(raw, "<u8", 1)[0])
        lengths = np.frombuffer(raw, "<u4", 4, 12).tolist()
        table = np.empty((4, n), np.int64)
        at = 28
        for i, (code, length) in enumerate(zip(raw[8:12], lengths)):
            part = raw[at:at + length]
            at += length
            table[i] = np.frombuffer(zlib.decompress(part) if code & _ZLIB else part,
                                     "<i8" if code & _SIGNED else f"<u{code & 0x0F}", n)
    table[0] = np.cumsum(table[0])
    return table.T
