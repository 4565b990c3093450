"""The catalog: what the cache holds. LMDB named databases + an in-memory mirror.

Layout of the LMDB environment (``<cache-dir>/lmdb``):

* ``records``: record_key(shard id, block) -> encoded block (samplecache.format.record)
* ``shards``:  shard id (8 bytes BE) -> shard JSON
* ``epochs``:  epoch (8 bytes BE) -> sealed manifest JSON, its shard table packed (``shards_packed``; older
  versions stored the list of rows, ``shards``: both are read)
* ``files``:   remote path -> file JSON (row groups, quarantine: store/fileinfo.py)
* ``meta``:    b"format", b"source", b"schema", b"cursor", b"next_shard", b"pages_released" (the writer's tiny commit
  that lets freed pages be reused); a named source's own keys (schema, cursor...) as ``source/<name>/<key>``
  (``source_key``: the ``default`` source keeps the plain keys, so a one-source cache opens as its ``default``)

Only ``writer.py`` writes; this module reads the environment once at start and
keeps the mirror that the writer updates after each commit.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import lmdb
import numpy as np

from samplecache.format.manifest import Manifest, compact
from samplecache_service.config.settings import DEFAULT_SOURCE
from samplecache_service.store.envgate import EnvGate
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.shardtable import Columns, ShardTable

DBS = (b"records", b"shards", b"epochs", b"files", b"meta")
MANIFEST_CACHE = 8
LAST_USED_SCAN = 8  # newest manifests read at start for the shards' last_used_epoch


SUMMARY_PREFIX = "summary/"  # meta key of one epoch's summary: summary/<epoch>
LEASE_PREFIX = "lease/"  # meta key of one live lease: lease/<id> (a take writes one record, not the table)
JOB_PREFIX = "job/"  # meta key of one job: job/<name> (a save writes the jobs that changed, not the table)


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def source_key(source: str, key: str) -> str:
    """A source's own meta key (its schema, its sampling cursor...)."""
    return key if source == DEFAULT_SOURCE else f"source/{source}/{key}"


@dataclass
class Resident:
    """What one source holds in the cache."""

    shards: int = 0
    rows: int = 0
    bytes: int = 0
    units: int = 0


@dataclass
class Shard:
    id: int
    key: str
    path: str
    row_group: int
    unit: int
    cycle: int
    rows: int
    bytes: int
    rows_per_block: int
    blocks: int
    created: float
    last_used_epoch: int = -1
    row_groups: int = 1   # consecutive row groups of the unit, from ``row_group``
    first_row: int = -1   # the shard's first row in its file (-1: not recorded)
    source: str = DEFAULT_SOURCE  # the named source it was sampled from

    def to_json(self) -> builtins.bytes:  # ``bytes`` is a field of this class
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: builtins.bytes) -> "Shard":
        return cls(**json.loads(raw))


@dataclass
class CatalogState:
    shards: "OrderedDict[int, Shard]" = field(default_factory=OrderedDict)
    keys: set[str] = field(default_factory=set)
    epochs: list[int] = field(default_factory=list)
    files: dict[str, FileInfo] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class Catalog:
    """Thread-safe mirror of the shard table, epochs, files and meta."""

    def __init__(self, env: lmdb.Environment, dbs: dict[bytes, Any], gate: EnvGate | None = None) -> None:
        """``gate``: how threads other than the writer's read ``env`` (default: a gate of its own)."""
        self.env = env
        self.gate = gate or EnvGate(env)
        self.dbs = dbs
        self._lock = threading.RLock()
        self._state = CatalogState()
        self._manifests: "OrderedDict[int, bytes]" = OrderedDict()
        self._forms: dict[tuple[int, str], bytes] = {}  # (epoch, "packed" | "rows") -> the manifest in that form
        self.resident_bytes = 0
        self.resident_rows = 0
        self._units: Counter[tuple[str, str, int]] = Counter()
        self._sources: dict[str, Resident] = {}
        self.files_version = 0
        self._removed: tuple[int, frozenset[str]] = (-1, frozenset())  # (files_version, removed files' paths)
        self.shards_version = 0  # changes whenever a shard is added or removed
        self.removals = 0  # shards removed so far (ids are never reused: what an epoch misses changes only then)
        self._table = ShardTable()  # the resident shards as columns: what a seal reads
        self._used_stale = False  # the table's last-used epochs are newer than the records' (see shards())
        self._summaries: dict[int, dict[str, Any]] = {}  # kept epochs' summaries (status, jobs)
        self._manifest_sizes: dict[int, int] = {}
        self.manifest_total = 0  # bytes of the kept manifests: they count within the budget
        self._load()

    def _load(self) -> None:
        st = self._state
        with self.env.begin(buffers=False) as txn:
            for k, v in txn.cursor(db=self.dbs[b"meta"]):
                st.meta[k.decode()] = json.loads(v)
            for _, v in txn.cursor(db=self.dbs[b"shards"]):
                s = Shard.from_json(v)
                st.shards[s.id] = s
                st.keys.add(s.key)
            for k, v in txn.cursor(db=self.dbs[b"epochs"]):
                st.epochs.append(int.from_bytes(k, "big"))
                self._manifest_sizes[st.epochs[-1]] = len(v)
        self.manifest_total = sum(self._manifest_sizes.values())
        legacy = st.meta.pop("epoch_summaries", None) or {}  # before per-epoch keys: one blob of them all
        for key in [k for k in st.meta if k.startswith(SUMMARY_PREFIX)]:
            self._summaries[int(key[len(SUMMARY_PREFIX):])] = st.meta.pop(key)
        for e, summary in legacy.items():
            self._summaries.setdefault(int(e), summary)
        # before per-lease keys the table was one blob, "leases": read once, then written as records (Leasing)
        self.legacy_leases = "leases" in st.meta
        self.saved_leases: list[dict[str, Any]] = list(st.meta.pop("leases", None) or [])
        for key in [k for k in st.meta if k.startswith(LEASE_PREFIX)]:
            self.saved_leases.append(st.meta.pop(key))
        # the same for jobs: one blob, "jobs", before per-job keys (rewritten whole on every save). A blob beside
        # records was written by an older version after them (a save of records drops it): its jobs come last,
        # so that they win over the records of the same names
        self.legacy_jobs = "jobs" in st.meta
        self.saved_jobs: list[dict[str, Any]] = [st.meta.pop(k) for k in [k for k in st.meta
                                                                           if k.startswith(JOB_PREFIX)]]
        self.saved_jobs += list(st.meta.pop("jobs", None) or [])
        kept = set(st.epochs)
        self._summaries = {e: v for e, v in self._summaries.items() if e in kept}
        with self.env.begin(buffers=False) as txn:
            for k, v in txn.cursor(db=self.dbs[b"files"]):
                st.files[k.decode()] = FileInfo.from_json(v)
        self._last_used()
        self.resident_bytes = sum(s.bytes for s in st.shards.values())
        self.resident_rows = sum(s.rows for s in st.shards.values())
        for s in st.shards.values():
            self._count(s, 1)
            self._table.add(s)

    def _last_used(self) -> None:
        """Each shard's ``last_used_epoch`` (the lru policy's order): the newest kept epoch that names it, read back
        from the newest ``LAST_USED_SCAN`` manifests (a seal does not rewrite the records of the shards it names).
        A shard none of them names keeps its record's value: older than any of them."""
        st = self._state
        left = set(st.shards)
        with self.env.begin(buffers=False) as txn:
            for e in sorted(st.epochs, reverse=True)[:LAST_USED_SCAN]:
                if not left:
                    break
                raw = txn.get(u64(e), db=self.dbs[b"epochs"])
                ids = Manifest.from_json(json.loads(raw)).table()[:, 0].tolist() if raw is not None else ()
                for sid in ids:
                    if sid in left:
                        left.discard(sid)
                        s = st.shards[sid]
                        s.last_used_epoch = max(s.last_used_epoch, e)

    # -- reads ------------------------------------------------------------------------
    def meta(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._state.meta.get(key, default)

    def _catch_up(self) -> None:
        """Seals set the table's last-used epochs; the records catch up when one is read, once per seal (the
        caller holds the lock)."""
        if self._used_stale:
            for sid, epoch in self._table.last_used().items():
                self._state.shards[sid].last_used_epoch = epoch
            self._used_stale = False

    def shards(self) -> list[Shard]:
        with self._lock:
            self._catch_up()
            return list(self._state.shards.values())

    def columns(self) -> Columns:
        """The resident shards as columns, in id order (a snapshot)."""
        with self._lock:
            return self._table.columns()

    def resident_count(self, ids: np.ndarray) -> int:
        """How many of the distinct shard ids ``ids`` are resident (a search in the id column, not a lookup each)."""
        with self._lock:
            return self._table.resident(ids)

    def shard(self, shard_id: int) -> Shard | None:
        with self._lock:
            self._catch_up()
            return self._state.shards.get(shard_id)

    def _count(self, s: Shard, sign: int) -> None:
        """Add (1) or take away (-1) shard ``s`` from the unit and per-source counts (under the lock)."""
        unit = (s.source, s.path, s.row_group)  # each source's own: two filters of one table may hold one unit
        r = self._sources.setdefault(s.source, Resident())
        r.shards, r.rows, r.bytes = r.shards + sign, r.rows + sign * s.rows, r.bytes + sign * s.bytes
        self._units[unit] += sign
        if sign > 0 and self._units[unit] == 1:
            r.units += 1
        elif sign < 0 and self._units[unit] <= 0:
            del self._units[unit]
            r.units -= 1

    def resident(self, source: str) -> Resident:
        """What ``source`` holds now (a copy)."""
        with self._lock:
            r = self._sources.get(source)
            return Resident(r.shards, r.rows, r.bytes, r.units) if r else Resident()

    def resident_sources(self) -> dict[str, Resident]:
        """What each source that holds a shard holds now."""
        with self._lock:
            return {n: Resident(r.shards, r.rows, r.bytes, r.units) for n, r in self._sources.items() if r.shards}

    def unit_resident(self, path: str, row_group: int, source: str = DEFAULT_SOURCE) -> bool:
        """Whether ``source`` holds a shard of the unit."""
        with self._lock:
            return self._units[(source, path, row_group)] > 0

    def resident_units(self) -> int:
        with self._lock:
            return len(self._units)  # only units with a resident shard are kept

    def shard_count(self) -> int:
        with self._lock:
            return len(self._state.shards)

    def has_key(self, key: str) -> bool:
        with self._lock:
            return key in self._state.keys

    def epochs(self) -> list[int]:
        with self._lock:
            return list(self._state.epochs)

    def files(self) -> dict[str, FileInfo]:
        with self._lock:
            return dict(self._state.files)

    def compact_manifest(self, epoch: int) -> bytes | None:
        """The manifest with its shard table packed (samplecache.format.manifest): what the client fetches. This
        version stores it so; one sealed by an older version, with the list of rows, is packed once."""
        return self._shaped(epoch, "packed", lambda m: compact(m) if "shards" in m else None)

    def full_manifest(self, epoch: int) -> bytes | None:
        """The manifest with its shard table as the list of rows (the wire's plain JSON form), if it is sealed."""
        return self._shaped(epoch, "rows", lambda m: Manifest.from_json(m).to_json() if "shards" not in m else None)

    def _shaped(self, epoch: int, form: str, reshape: Callable[[dict[str, Any]], dict[str, Any] | None]
                ) -> bytes | None:
        """``epoch``'s manifest in one form: as stored when ``reshape`` gives None, else its JSON (kept for the
        next caller, as many as MANIFEST_CACHE per form)."""
        with self._lock:
            got = self._forms.get((epoch, form))
        if got is not None:
            return got
        raw = self.manifest_bytes(epoch)
        if raw is None:
            return None
        shaped = reshape(json.loads(raw))
        got = raw if shaped is None else json.dumps(shaped, separators=(",", ":")).encode()
        with self._lock:
            self._forms[(epoch, form)] = got
            if len(self._forms) > 2 * MANIFEST_CACHE:
                self._forms.pop(next(iter(self._forms)))
        return got

    def manifest_bytes(self, epoch: int) -> bytes | None:
        """The sealed manifest of ``epoch`` as stored (JSON bytes), or None."""
        with self._lock:
            if epoch in self._manifests:
                self._manifests.move_to_end(epoch)
                return self._manifests[epoch]
            if epoch not in self._state.epochs:
                return None
        raw: bytes | None = self.gate.read(lambda txn: txn.get(u64(epoch), db=self.dbs[b"epochs"]))
        if raw is not None:
            self._remember(epoch, bytes(raw))
        return raw

    # -- updates (called by the writer after a commit) -----------------------------------
    def _remember(self, epoch: int, raw: bytes) -> None:
        with self._lock:
            self._manifests[epoch] = raw
            self._manifests.move_to_end(epoch)
            while len(self._manifests) > MANIFEST_CACHE:
                self._manifests.popitem(last=False)

    def added_shard(self, s: Shard) -> None:
        with self._lock:
            self._state.shards[s.id] = s
            self._table.add(s)
            self._state.keys.add(s.key)
            self._count(s, 1)
            self.shards_version += 1
            self.resident_bytes += s.bytes
            self.resident_rows += s.rows

    def removed_shard(self, shard_id: int) -> None:
        with self._lock:
            s = self._state.shards.pop(shard_id, None)
            if s is not None:
                self._table.remove(shard_id)
                self.shards_version += 1
                self.removals += 1
                self._state.keys.discard(s.key)
                self._count(s, -1)
                self.resident_bytes -= s.bytes
                self.resident_rows -= s.rows

    def sealed(self, epoch: int, raw: bytes, summary: dict[str, Any] | None = None,
               dropped: Sequence[int] = (), named: np.ndarray | None = None) -> None:
        """``epoch`` was sealed as ``raw``, naming the shards ``named`` (now last used by it)."""
        with self._lock:
            if named is not None and len(named):
                self._table.used(named, epoch)
                self._used_stale = True
            if epoch not in self._state.epochs:
                self._state.epochs.append(epoch)
                self._state.epochs.sort()
                self._manifest_sizes[epoch] = len(raw)
            if summary is not None:
                self._summaries[epoch] = summary
            for e in dropped:
                if e in self._state.epochs:
                    self._state.epochs.remove(e)
                self._summaries.pop(e, None)
                self._manifest_sizes.pop(e, None)
                self._manifests.pop(e, None)
                for form in ("packed", "rows"):
                    self._forms.pop((e, form), None)
            self.manifest_total = sum(self._manifest_sizes.values())
        self._remember(epoch, raw)

    def summaries(self) -> dict[int, dict[str, Any]]:
        """Summaries of the kept epochs (samples, new_samples, bytes, shards, sealed_at, remote_bytes)."""
        with self._lock:
            return dict(self._summaries)

    def summary(self, epoch: int) -> dict[str, Any]:
        with self._lock:
            return dict(self._summaries.get(epoch) or {})

    def set_meta(self, key: str, value: Any) -> None:
        with self._lock:
            self._state.meta[key] = value

    def set_file(self, path: str, info: FileInfo) -> None:
        with self._lock:
            self._state.files[path] = info
            self.files_version += 1

    def removed_files(self) -> frozenset[str]:
        """Paths of the files no longer in the dataset (``FileInfo.removed``: they left their table or the filter),
        counted again only when the files change: asked at every ingest and seal."""
        with self._lock:
            if self._removed[0] != self.files_version:
                self._removed = (self.files_version,
                                 frozenset(p for p, i in self._state.files.items() if i.removed))
            return self._removed[1]

    def file(self, path: str) -> FileInfo:
        """``path``'s record; a path not discovered (yet) reads as an empty one."""
        with self._lock:
            return self._state.files.get(path) or FileInfo()
