"""The resident shards as numpy columns, in id (= age) order, kept beside the catalog's ``Shard`` records.

An epoch seal and an eviction plan read these columns, never a Python loop over every record: at 100k shards a
seal stays within milliseconds. The catalog updates the table under its lock as shards come and go; a shard's
``last_used_epoch`` is set here for all the shards of a seal at once (``used``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

import numpy as np

_INT_FIELDS = ("id", "rows", "bytes", "rows_per_block", "last_used")


class ShardFields(Protocol):
    id: int
    rows: int
    bytes: int
    rows_per_block: int
    last_used_epoch: int
    source: str
    path: str


@dataclass(frozen=True)
class Columns:
    """A snapshot of the table: one row per resident shard, in id order (arrays of the snapshot's own)."""

    id: np.ndarray  # int64
    rows: np.ndarray  # int64
    bytes: np.ndarray  # int64
    rows_per_block: np.ndarray  # int64
    last_used: np.ndarray  # int64: the newest epoch that named the shard (-1: none yet)
    source: np.ndarray  # int32: an index into ``sources``
    file: np.ndarray  # int32: an index into ``files``
    sources: tuple[str, ...]
    files: Mapping[str, int]  # path -> its index in ``file`` (the table's own: it only ever gains paths)

    def __len__(self) -> int:
        return len(self.id)

    def take(self, where: np.ndarray) -> "Columns":
        """The rows at ``where`` (a bool mask or ascending positions): still in id order."""
        return Columns(self.id[where], self.rows[where], self.bytes[where], self.rows_per_block[where],
                       self.last_used[where], self.source[where], self.file[where], self.sources, self.files)

    def of_source(self, name: str) -> np.ndarray:
        """A bool mask of the rows of source ``name``."""
        if name not in self.sources:
            return np.zeros(len(self), bool)
        mask: np.ndarray = self.source == self.sources.index(name)
        return mask

    def in_files(self, paths: Iterable[str]) -> np.ndarray:
        """A bool mask of the rows whose shard comes from one of ``paths``."""
        codes = [self.files[p] for p in paths if p in self.files]
        return np.isin(self.file, codes) if codes else np.zeros(len(self), bool)


class ShardTable:
    """Growable columns in id order; a removed shard is marked and the table compacted when a snapshot is taken.
    Not thread-safe: the catalog calls it under its lock."""

    def __init__(self) -> None:
        self._n = 0
        self._dead = 0
        self._cols: dict[str, np.ndarray] = {k: np.empty(1024, np.int64) for k in _INT_FIELDS}
        self._cols["source"] = np.empty(1024, np.int32)
        self._cols["file"] = np.empty(1024, np.int32)
        self._alive = np.empty(1024, bool)
        self._sources: dict[str, int] = {}
        self._files: dict[str, int] = {}

    def __len__(self) -> int:
        return self._n - self._dead

    def _code(self, codes: dict[str, int], name: str) -> int:
        got = codes.get(name)
        if got is None:
            got = codes[name] = len(codes)
        return got

    def _grow(self) -> None:
        cap = 2 * len(self._alive)
        for k, a in self._cols.items():
            grown = np.empty(cap, a.dtype)
            grown[:self._n] = a[:self._n]
            self._cols[k] = grown
        alive = np.empty(cap, bool)
        alive[:self._n] = self._alive[:self._n]
        self._alive = alive

    def add(self, s: ShardFields) -> None:
        if self._n == len(self._alive):
            self._grow()
        ids = self._cols["id"]
        at = self._n
        if at and ids[at - 1] > s.id:  # out of order (never from the writer, whose ids grow): shift to keep order
            at = int(np.searchsorted(ids[:self._n], s.id))
            for a in (*self._cols.values(), self._alive):
                a[at + 1:self._n + 1] = a[at:self._n].copy()
        values = (s.id, s.rows, s.bytes, s.rows_per_block, s.last_used_epoch,
                  self._code(self._sources, s.source), self._code(self._files, s.path))
        for k, v in zip((*_INT_FIELDS, "source", "file"), values):
            self._cols[k][at] = v
        self._alive[at] = True
        self._n += 1

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        """The live slots of ``ids`` (those not resident are left out)."""
        have = self._cols["id"][:self._n]
        at = np.searchsorted(have, ids)
        inside = at < self._n
        at, ids = at[inside], ids[inside]
        found: np.ndarray = at[have[at] == ids]
        return found

    def remove(self, shard_id: int) -> None:
        at = self._slots(np.array([shard_id], np.int64))
        at = at[self._alive[at]]
        if len(at):
            self._alive[at] = False
            self._dead += len(at)

    def resident(self, ids: np.ndarray) -> int:
        """How many of the distinct shard ids ``ids`` are resident."""
        at = self._slots(np.asarray(ids, np.int64))
        return int(np.count_nonzero(self._alive[at]))

    def used(self, ids: np.ndarray, epoch: int) -> None:
        """The shards ``ids`` were named by sealed ``epoch``."""
        at = self._slots(np.asarray(ids, np.int64))
        lu = self._cols["last_used"]
        lu[at] = np.maximum(lu[at], epoch)

    def last_used(self) -> dict[int, int]:
        """Shard id -> last used epoch, of every resident shard (for the records' own field)."""
        self._compact()
        return dict(zip(self._cols["id"][:self._n].tolist(), self._cols["last_used"][:self._n].tolist()))

    def _compact(self) -> None:
        if not self._dead:
            return
        keep = self._alive[:self._n]
        m = self._n - self._dead
        for a in self._cols.values():
            a[:m] = a[:self._n][keep]
        self._alive[:m] = True
        self._n, self._dead = m, 0

    def columns(self) -> Columns:
        self._compact()
        c = {k: a[:self._n].copy() for k, a in self._cols.items()}
        return Columns(**c, sources=tuple(self._sources), files=self._files)
