"""The planner: which remote unit (file, row group) to sample next.

Units are drawn uniformly at random *without replacement*: each pass ("cycle")
over this node's units follows a seeded permutation, and the cursor (cycle,
done positions) is persisted by the writer in the same transaction as the shard
it produced, so a restart continues where it stopped. With ``num_nodes > 1`` the
units are split into disjoint parts by a permutation every host derives from
the same seed.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np


@dataclass(frozen=True)
class Unit:
    path: str
    row_group: int
    rows: int


@dataclass(frozen=True)
class Pick:
    cycle: int
    position: int
    unit: Unit


def build_units(files: Mapping[str, Mapping[str, Any]]) -> list[Unit]:
    """All units of the usable (not quarantined) files, in a stable order."""
    units = []
    for path in sorted(files):
        info = files[path]
        if info.get("quarantined"):
            continue
        units.extend(Unit(path, i, int(n)) for i, n in enumerate(info.get("row_groups", [])))
    return units


def digest(units: list[Unit]) -> str:
    h = hashlib.sha256()
    for u in units:
        h.update(f"{u.path}\0{u.row_group}\0{u.rows}\n".encode())
    return h.hexdigest()[:16]


def node_units(units: list[Unit], seed: int, node_rank: int, num_nodes: int) -> list[Unit]:
    """This node's disjoint part of the units (the same split on every host)."""
    order = np.random.default_rng([seed, 0x5CA1AB1E]).permutation(len(units))
    return [units[i] for i in order[node_rank::num_nodes]]


def cycle_order(n: int, seed: int, node_rank: int, cycle: int) -> np.ndarray:
    return np.random.default_rng([seed, node_rank, cycle]).permutation(n)


class Planner:
    """Hands out units in permutation order; tracks which positions are done."""

    def __init__(self, units: list[Unit], seed: int = 0, node_rank: int = 0, num_nodes: int = 1,
                 cursor: Mapping[str, Any] | None = None) -> None:
        if not 0 <= node_rank < num_nodes:
            raise ValueError(f"node_rank must be in [0, {num_nodes})")
        self.seed, self.node_rank, self.num_nodes = seed, node_rank, num_nodes
        self.all_units = len(units)
        self.units = node_units(units, seed, node_rank, num_nodes)
        self.digest = digest(units)
        self._lock = threading.Lock()
        self.cycle, self.low, self.ahead = 0, 0, set()
        if cursor and cursor.get("digest") == self.digest:
            self.cycle = int(cursor["cycle"])
            self.low = int(cursor["low"])
            self.ahead = set(int(p) for p in cursor.get("ahead", ()))
        self._order = cycle_order(len(self.units), seed, node_rank, self.cycle)
        self._next = self.low
        self._handed: set[int] = set()
        self._retry: list[int] = []
        self.max_cycle_started = self.cycle

    def __len__(self) -> int:
        return len(self.units)

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
        self.cycle += 1
        self.low, self.ahead, self._next = 0, set(), 0
        self._order = cycle_order(len(self.units), self.seed, self.node_rank, self.cycle)

    def retry(self, pick: Pick) -> None:
        """Hand ``pick`` out again later (a transient failure)."""
        with self._lock:
            if pick.cycle == self.cycle and pick.position not in self._retry:
                self._retry.append(pick.position)

    def release(self, pick: Pick) -> None:
        """Forget that ``pick`` was handed out (it was never run)."""
        with self._lock:
            if pick.cycle == self.cycle:
                self._handed.discard(pick.position)
                self._next = min(self._next, pick.position)

    def cursor_after(self, cycle: int, position: int) -> dict[str, Any]:
        """The cursor once ``position`` of ``cycle`` is done (pure: nothing changes)."""
        with self._lock:
            low, ahead = self.low, set(self.ahead)
            if cycle == self.cycle:
                ahead.add(position)
                while low in ahead:
                    ahead.discard(low)
                    low += 1
            return {"cycle": self.cycle, "low": low, "ahead": sorted(ahead), "digest": self.digest}

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
            return {"cycle": self.cycle, "low": self.low, "ahead": sorted(self.ahead), "digest": self.digest}

    def coverage(self) -> dict[str, Any]:
        """Fraction of this node's units and rows sampled at least once."""
        with self._lock:
            total_rows = sum(u.rows for u in self.units)
            if self.cycle > 0:
                done_units, done_rows = len(self.units), total_rows
            else:
                done_pos = list(range(self.low)) + list(self.ahead)
                done_units = len(done_pos)
                done_rows = sum(self.units[self._order[p]].rows for p in done_pos)
            return {"cycle": self.cycle, "units": len(self.units), "units_sampled": done_units,
                    "rows": total_rows, "rows_sampled": done_rows,
                    "unit_fraction": done_units / len(self.units) if self.units else 0.0,
                    "row_fraction": done_rows / total_rows if total_rows else 0.0,
                    "remote_units": self.all_units}
