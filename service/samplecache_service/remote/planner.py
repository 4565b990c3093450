"""The planner: which remote unit (file, row group) to sample next.

Units are drawn uniformly at random *without replacement*: each pass ("cycle")
over this node's units follows a seeded permutation, and the cursor (cycle,
done positions) is persisted by the writer in the same transaction as the shard
it produced, so a restart continues where it stopped. Units of files discovered
mid-cycle join the current cycle as a new segment (its own permutation) after
the units already planned, so no unit is drawn twice in a cycle. With
``num_nodes > 1`` each unit belongs to the node its hash names: the split is
disjoint, identical on every host and stable when files are added.
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from samplecache_service.store.fileinfo import FileInfo


@dataclass(frozen=True)
class Unit:
    path: str
    row_group: int   # the first row group
    rows: int
    row_groups: int = 1  # how many consecutive row groups (tiny ones are read together)


COALESCE_MIN_GROUPS = 64  # only files of more row groups than this have their tiny row groups read together


def plan_units(rows: Sequence[int], sizes: Sequence[int], unit_bytes: int) -> list[list[int]]:
    """[first row group, row groups, rows] per unit of one file.

    A unit is one row group (a large one is read in slices by the sampler), except in files of more than
    ``COALESCE_MIN_GROUPS`` row groups: there consecutive row groups are read together while their footer
    sizes add up to at most ``unit_bytes / 64`` (1 MiB by default), so 10,000 tiny row groups are not
    10,000 tasks."""
    if len(rows) <= COALESCE_MIN_GROUPS:
        return [[g, 1, int(n)] for g, n in enumerate(rows)]
    limit = max(1, unit_bytes // 64)
    units: list[list[int]] = []
    for g, n in enumerate(rows):
        size = int(sizes[g]) if g < len(sizes) else limit
        if units and units[-1][3] + size <= limit:
            units[-1][1] += 1
            units[-1][2] += int(n)
            units[-1][3] += size
        else:
            units.append([g, 1, int(n), size])
    return [u[:3] for u in units]


class Slot(NamedTuple):
    """A unit's place in the plan, its pass and position: all that ``retry``, ``done`` and the cursor need."""

    cycle: int
    position: int


@dataclass(frozen=True)
class Pick:
    cycle: int
    position: int
    unit: Unit


def build_units(files: Mapping[str, FileInfo]) -> list[Unit]:
    """All units, in discovery order (files by discovery sequence, then path; row groups in order).

    Quarantined files keep their units (indices stay stable); the daemon skips them.
    """
    units: list[Unit] = []
    for path in sorted(files, key=lambda p: (files[p].seq, p)):
        planned = files[path].units
        if planned is None:
            planned = tuple((i, 1, n) for i, n in enumerate(files[path].row_groups))
        units.extend(Unit(path, g, n, c) for g, c, n in planned)
    return units


def node_of(unit: Unit, num_nodes: int) -> int:
    return zlib.crc32(f"{unit.path}\0{unit.row_group}".encode()) % num_nodes


def digest(units: Sequence[Unit]) -> str:
    h = hashlib.sha256()
    for u in units:
        h.update(f"{u.path}\0{u.row_group}\0{u.rows}\0{u.row_groups}\n".encode())
    return h.hexdigest()[:16]


def segment_order(sizes: Sequence[int], seed: int, node_rank: int, cycle: int) -> np.ndarray:
    """The cycle's order: each segment of units permuted on its own, segments one after another."""
    parts, offset = [], 0
    for k, n in enumerate(sizes):
        parts.append(offset + np.random.default_rng([seed, node_rank, cycle, k]).permutation(n))
        offset += n
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class Planner:
    """Hands out units in permutation order; tracks which positions are done."""

    def __init__(self, units: Sequence[Unit], seed: int = 0, node_rank: int = 0, num_nodes: int = 1,
                 cursor: Mapping[str, Any] | None = None) -> None:
        if not 0 <= node_rank < num_nodes:
            raise ValueError(f"node_rank must be in [0, {num_nodes})")
        self.seed, self.node_rank, self.num_nodes = seed, node_rank, num_nodes
        self.all_units = len(units)
        self.units = [u for u in units if node_of(u, num_nodes) == node_rank]
        self.paths = {u.path for u in units}  # the files planned, on any node
        self._lock = threading.Lock()
        self.cycle, self.low, self.ahead, self.segments = 0, 0, set(), [len(self.units)]
        self.cycle_seed = seed
        if cursor and "segments" in cursor:
            planned = sum(cursor["segments"])
            same_split = (cursor.get("node_rank", 0), cursor.get("num_nodes", 1)) == (node_rank, num_nodes)
            if same_split and planned <= len(self.units) and cursor.get("digest") == digest(self.units[:planned]):
                # the pass in progress keeps the order it started with, even if --seed changed since
                self.cycle_seed = int(cursor.get("seed", seed))
                self.cycle = int(cursor["cycle"])
                self.low = int(cursor["low"])
                self.ahead = set(int(p) for p in cursor.get("ahead", ()))
                self.segments = [int(n) for n in cursor["segments"]]
                if planned < len(self.units):
                    self.segments.append(len(self.units) - planned)
        self._order = segment_order(self.segments, self.cycle_seed, node_rank, self.cycle)
        self._first_pass_units = self.segments[0] if self.cycle > 0 else 0
        self._next = self.low
        self._handed: set[int] = set()
        self._retry: list[int] = []
        self._coverage: tuple[tuple[int, ...], dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self.units)

    def add_units(self, units: Sequence[Unit]) -> int:
        """Join newly discovered units (this node's share) to the current cycle; returns how many."""
        mine = [u for u in units if node_of(u, self.num_nodes) == self.node_rank]
        with self._lock:
            self.paths.update(u.path for u in units)
            self.all_units += len(units)
            if mine:
                self.units.extend(mine)
                self.segments.append(len(mine))
                self._order = segment_order(self.segments, self.cycle_seed, self.node_rank, self.cycle)
        return len(mine)

    def next(self) -> Pick | None:
        """The next unit to sample, or None when every unit of this cycle is handed out."""
        with self._lock:
            if not self.units:
                return None
            if self._retry:
                pos = self._retry.pop(0)
                return Pick(self.cycle, pos, self.units[self._order[pos]])
            while self._next < len(self.units) and (self._next in self.ahead or self._next in self._handed):
                self._next += 1
            if self._next >= len(self.units):
                if self._handed:
                    return None  # wait for the cycle's last units before starting the next
                self._new_cycle()
            pos = self._next
            self._next += 1
            self._handed.add(pos)
            return Pick(self.cycle, pos, self.units[self._order[pos]])

    def _new_cycle(self) -> None:
        self._first_pass_units = len(self.units)
        self.cycle_seed = self.seed
        self.cycle += 1
        self.low, self.ahead, self._next = 0, set(), 0
        self.segments = [len(self.units)]
        self._order = segment_order(self.segments, self.cycle_seed, self.node_rank, self.cycle)

    def retry(self, pick: Pick | Slot) -> None:
        """Hand ``pick`` out again later (a transient failure)."""
        with self._lock:
            if pick.cycle == self.cycle and pick.position not in self._retry:
                self._retry.append(pick.position)

    def _cursor(self, low: int, ahead: set[int]) -> dict[str, Any]:
        planned = sum(self.segments)
        return {"cycle": self.cycle, "low": low, "ahead": sorted(ahead), "segments": list(self.segments),
                "digest": digest(self.units[:planned]), "seed": self.cycle_seed, "node_rank": self.node_rank,
                "num_nodes": self.num_nodes}

    def cursor_after(self, cycle: int, position: int) -> dict[str, Any]:
        """The cursor once ``position`` of ``cycle`` is done (pure: nothing changes)."""
        with self._lock:
            low, ahead = self.low, set(self.ahead)
            if cycle == self.cycle:
                ahead.add(position)
                while low in ahead:
                    ahead.discard(low)
                    low += 1
            return self._cursor(low, ahead)

    def done(self, cycle: int, position: int) -> None:
        with self._lock:
            if cycle != self.cycle:
                return
            self._handed.discard(position)
            self.ahead.add(position)
            while self.low in self.ahead:
                self.ahead.discard(self.low)
                self.low += 1

    def cursor(self) -> dict[str, Any]:
        with self._lock:
            return self._cursor(self.low, self.ahead)

    def coverage(self, left_out: Callable[[Unit], bool] | None = None, version: int = 0,
                 removed: Callable[[Unit], bool] | None = None) -> dict[str, Any]:
        """Fraction of this node's units and rows sampled at least once (recomputed only on change). Units
        ``left_out`` says are unreadable (their file is quarantined) never count as sampled; units ``removed``
        says are no longer in the dataset (their file left its table) do not count at all; ``version`` changes
        whenever the answers of either may."""
        with self._lock:
            key = (self.cycle, self.low, len(self.ahead), len(self.units), version)
            if self._coverage is not None and self._coverage[0] == key:
                return dict(self._coverage[1])
            gone = {i for i, u in enumerate(self.units) if removed(u)} if removed is not None else set()
            total_rows = sum(u.rows for i, u in enumerate(self.units) if i not in gone)
            done_pos = set(range(self.low)) | self.ahead
            if self.cycle > 0:  # a whole earlier pass covered the units planned then
                covered = set(range(self._first_pass_units)) | {int(self._order[p]) for p in done_pos}
            else:
                covered = {int(self._order[p]) for p in done_pos}
            out = {i for i, u in enumerate(self.units) if left_out(u)} if left_out is not None else set()
            out -= gone
            covered -= out | gone
            units = len(self.units) - len(gone)
            done_units = len(covered)
            done_rows = sum(self.units[u].rows for u in covered)
            self._coverage = (key, {"cycle": self.cycle, "units": units, "units_sampled": done_units,
                    "rows": total_rows, "rows_sampled": done_rows,
                    "units_left_out": len(out), "rows_left_out": sum(self.units[u].rows for u in out),
                    "unit_fraction": done_units / units if units else 0.0,
                    "row_fraction": done_rows / total_rows if total_rows else 0.0,
                    "remote_units": self.all_units, "node_rank": self.node_rank, "num_nodes": self.num_nodes})
            return dict(self._coverage[1])


def unit_current(unit: Unit, info: FileInfo) -> bool:
    """Whether ``unit`` is still one of its file's units (a file that changed may have been re-planned)."""
    return info.units is None or (unit.row_group, unit.row_groups, unit.rows) in info.units
