"""What the catalog knows of one remote file: its footer's facts, its place in discovery order, its quarantine.

Stored as JSON under the file's path in the ``files`` database. The JSON is the one the daemon wrote before this
record was typed (the same keys, a key absent where it was absent then), so caches written before still open.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

# [first row group, row groups, rows] per unit (remote.planner.plan_units)
PlannedUnit = tuple[int, int, int]


@dataclass(frozen=True)
class FileInfo:
    row_groups: tuple[int, ...] = ()  # rows per row group
    # None: not read (a file quarantined before its footer parsed, or a record older than the field)
    row_group_bytes: tuple[int, ...] | None = None  # uncompressed bytes per row group (the footer's estimate)
    units: tuple[PlannedUnit, ...] | None = None  # None: one unit per row group
    size: int | None = None  # bytes of the file
    footer: int | None = None  # bytes of its serialized footer
    signature: str | None = None  # size/ETag/mtime at listing: a file that changes is read again
    seq: int = 0  # discovery sequence: files found later plan after files found earlier
    quarantined: bool = False
    reason: str = ""
    kind: str = "corrupt"  # remote.stores.ErrorKind: corrupt | schema
    at: float | None = None  # when it was quarantined (time.time())
    recheck: bool = False  # released by hand: read again at the next listing
    # no longer live in its table's version (an overwrite, delete or optimize removed it): never sampled again,
    # its shards named by no new epoch and evicted once no lease pins them
    removed: bool = False
    # partition column -> value as text (None: null), from its Hive folders or its table's log; empty: none
    partitions: dict[str, str | None] = field(default_factory=dict)

    def quarantine(self, reason: str, kind: str = "corrupt") -> FileInfo:
        """This file quarantined: its units are skipped until it changes (size, ETag or mtime) or it is
        released (``DELETE /v1/quarantine/{file}``)."""
        return replace(self, quarantined=True, reason=reason, kind=str(kind), at=time.time(), recheck=False)

    def release(self) -> FileInfo:
        """This quarantined file released by hand: read again at the next listing."""
        return replace(self, recheck=True)

    def to_dict(self) -> dict[str, Any]:
        """The stored form: the keys in the order the daemon wrote them, optional ones only when known."""
        out: dict[str, Any] = {"row_groups": list(self.row_groups)}
        if self.row_group_bytes is not None:
            out["row_group_bytes"] = list(self.row_group_bytes)
        if self.units is not None:
            out["units"] = [list(u) for u in self.units]
        if self.size is not None:
            out["size"] = self.size
        if self.footer is not None:
            out["footer"] = self.footer
        out.update(signature=self.signature, seq=self.seq)
        if self.quarantined:
            out.update(quarantined=True, reason=self.reason, kind=self.kind, at=self.at)
        if self.recheck:
            out["recheck"] = True
        if self.partitions:
            out["partitions"] = dict(self.partitions)
        if self.removed:
            out["removed"] = True
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FileInfo:
        """Read the stored form, of this version or an older one: an absent or null key takes its default."""
        return cls(**{k: READ[k](v) for k, v in d.items() if k in READ and v is not None})

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FileInfo:
        return cls.from_dict(json.loads(raw))


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in v)


def _partitions(v: Any) -> dict[str, str | None]:
    return {str(k): None if x is None else str(x) for k, x in v.items()}


def _units(v: Any) -> tuple[PlannedUnit, ...]:
    return tuple((int(g), int(c), int(n)) for g, c, n in v)


# how each stored key is read; a key not named here (none was ever written) is left out
READ: dict[str, Callable[[Any], Any]] = {
    "row_groups": _ints, "row_group_bytes": _ints, "units": _units, "size": int, "footer": int, "signature": str,
    "seq": int, "quarantined": bool, "reason": str, "kind": str, "at": float, "recheck": bool,
    "partitions": _partitions, "removed": bool}
