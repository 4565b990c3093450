"""Reading blocks from the local LMDB cache: read-only, opened lazily once per process.

The environment is reopened when ``os.getpid()`` changes (a forked DataLoader
worker must never use its parent's handle), and read transactions last one chunk
of positions (``transactions.begin``: ``MapResizedError`` is absorbed there).

With ``verify`` (or ``SAMPLECACHE_VERIFY=1``) every block's checksum is checked the first time this process
reads it (blocks never change once written, so once per process is enough): a damaged block raises
``DamagedBlock`` naming its shard and block instead of serving wrong values.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import lmdb
import numpy as np

from samplecache.format.constants import CACHE_ID_KEY, MAX_READERS, META_DB
from samplecache.format.record import BlockView, Schema, check_block, record_key
from samplecache.reading.blocks.gather import PARALLEL_MIN_BYTES, copy_all, split
from samplecache.reading.blocks.layouts import Layout, MappedView
from samplecache.reading.blocks.transactions import begin

VALID_SUFFIX = "__valid"  # batches: the mask of a fixed column with nulls
LARGE_SAMPLE_BYTES = 64 << 10  # samples this large are copied one by one (over threads), smaller ones gathered
# a gather's temporary (numpy fancy indexing makes one before the copy into the batch) stays this small: a whole
# chunk's (12 MB) came in fresh pages each time, and gather plus copy took 1.5x their separate times (micro-benchmark)
PIECE_BYTES = 1 << 20
SMALL_BATCH = 64  # batches of up to this many samples find their blocks in Python, larger ones with numpy
READAHEAD = True  # lets the kernel map pages around a fault: a fresh process reads a warm cache ~2x faster
VERIFY_ENV = "SAMPLECACHE_VERIFY"
_ENVS: dict[str, tuple[int, lmdb.Environment, Any]] = {}
_OPENING = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().update(_OPENING=threading.Lock()))
_VERIFIED: dict[str, set[int]] = {}  # LMDB path -> (shard << 32 | block) checked by this process
_IDS: dict[str, str] = {}  # LMDB path -> the cache id found in this process's open environment there


class CacheNotVisible(RuntimeError):
    """The LMDB cache named by the manifest is not on this filesystem."""


class CacheReplaced(RuntimeError):
    """The cache at the manifest's LMDB path is not the cache the manifest was sealed from."""


def open_cache(path: str, map_size: int, cache_id: str = "") -> tuple[lmdb.Environment, Any]:
    """This process's read-only handle on the cache at ``path`` (and its records db). ``cache_id`` (a manifest's):
    raise ``CacheReplaced`` unless the cache this process reads there has that identity ("": no check)."""
    pid = os.getpid()
    got = _ENVS.get(path)
    if got is not None and got[0] == pid and (not cache_id or _IDS.get(path) == cache_id):
        return got[1], got[2]
    with _OPENING:  # read-ahead threads may open it at the same time: once
        env, db = _open(path, map_size, pid)
        if cache_id and _IDS.get(path) != cache_id:
            _check_identity(path, env, cache_id)
        return env, db


def _check_identity(path: str, env: lmdb.Environment, cache_id: str) -> None:
    """The cache's id is read again on every new id asked for: a process that kept an old cache open (its file
    unlinked and replaced) still finds the old id, and must not read the new manifest's shard ids from it."""
    with begin(env) as txn:
        try:
            meta = env.open_db(META_DB, txn=txn, create=False)
        except lmdb.NotFoundError:
            raw = None
        else:
            raw = txn.get(CACHE_ID_KEY.encode(), db=meta)
        found = json.loads(bytes(raw)) if raw is not None else None
    if found != cache_id:
        raise CacheReplaced(
            f"the samplecache cache at {path!r} is not the cache this epoch's manifest was sealed from: the "
            f"manifest names cache {cache_id}, this process reads cache {found or '(one without an id)'}. The cache "
            f"dir was removed or replaced under the daemon or this process, and the new cache numbers its shards "
            f"anew, so reading would serve other rows. Restart the samplecache daemon on its cache dir, then "
            f"restart the job")
    _IDS[path] = cache_id


def _open(path: str, map_size: int, pid: int) -> tuple[lmdb.Environment, Any]:
    got = _ENVS.get(path)
    if got is not None:
        if got[0] == pid:
            return got[1], got[2]
        # Inherited across fork: never use the parent's handle. Closing it here is safe
        # (LMDB only clears reader slots of the calling pid) and lets the path be reopened.
        del _ENVS[path]
        got[1].close()
    _IDS.pop(path, None)  # a new environment: its identity is checked anew
    if not (Path(path) / "data.mdb").exists():
        raise CacheNotVisible(
            f"the samplecache LMDB cache {path!r} is not visible from this process (pid {pid}): the client "
            f"must run on the daemon's host and see its --cache-dir (SAMPLECACHE_CACHE_DIR); in a container, "
            f"mount that directory at the same path")
    env = lmdb.open(path, readonly=True, lock=True, max_readers=MAX_READERS, max_dbs=8, subdir=True,
                    map_size=map_size, readahead=READAHEAD)
    db = env.open_db(b"records", create=False)
    _ENVS[path] = (pid, env, db)
    return env, db


def verify_from_env() -> bool:
    """SAMPLECACHE_VERIFY=1 (or true/yes/on) turns verification on read on."""
    return os.environ.get(VERIFY_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class CacheReader:
    """Reads samples by (shard id, row); one short read transaction per chunk of positions."""

    def __init__(self, path: str, map_size: int, schema: Schema, verify: bool = False, cache_id: str = "") -> None:
        """``verify``: check each block's checksum on its first read in this process (also on when the
        environment has SAMPLECACHE_VERIFY=1). ``cache_id``: the manifest's; reading a cache of another
        identity raises ``CacheReplaced`` ("": no check, a manifest sealed before caches had one)."""
        self.path, self.map_size, self.schema, self.cache_id = path, map_size, schema, cache_id
        # shard id -> its source's schema, layout (column map, casts: layouts.column_maps) and name, for the shards
        # of sources whose schema is not ``schema`` (a manifest of several sources); empty: every block is in it
        self.layouts: dict[int, tuple[Schema, Layout, str]] = {}
        self.verify = verify or verify_from_env()
        self._verified = _VERIFIED.setdefault(path, set())

    def _views(self, txn: lmdb.Transaction, db: Any, keys: np.ndarray, sids: np.ndarray,
               blocks: np.ndarray) -> dict[int, BlockView]:
        views: dict[int, BlockView] = {}
        for k, sid, b in zip(keys.tolist(), sids.tolist(), blocks.tolist()):
            if k in views:
                continue
            buf = txn.get(record_key(sid, b), db=db)
            if buf is None:
                raise KeyError(f"shard {sid} block {b} is missing from the cache: it was evicted while this "
                               f"epoch was read without a live lease (lease=False, or it expired)")
            if self.verify and k not in self._verified:
                check_block(buf, sid, b)
                self._verified.add(k)
            lay = self.layouts.get(sid) if self.layouts else None
            if lay is None:
                views[k] = BlockView(buf, self.schema)
            else:
                view = BlockView(buf, lay[0])
                views[k] = view if lay[1].plain else MappedView(view, lay[1], self.schema, lay[2])  # type: ignore[assignment]
        return views

    def batch(self, sids: np.ndarray, rpbs: np.ndarray, rows: np.ndarray, cols: Sequence[int],
              alloc: Callable[[str, tuple[int, ...], np.dtype], np.ndarray | None] | None = None,
              threads: int = 1, masks: bool = False) -> dict[str, Any]:
        """One collated batch: fixed columns as (n, *shape) arrays filled by vectorised gathers, others as lists.

        A fixed column with nulls in the batch comes as a list of values (None, or a list for a cell with
        null elements); with ``masks`` (batches for tensors) as an array with NaN / 0 under the nulls plus
        ``<name>__valid`` (bool, same shape, False where null), and datetime64/timedelta64 as int64 counts
        of the unit. ``alloc(name, shape, dtype)`` may supply the output arrays (e.g. in shared memory); a
        large batch's copies are split over ``threads`` threads (``gather.copy_all``)."""
        env, db = open_cache(self.path, self.map_size, self.cache_id)
        n = len(rows)
        blocks, local = np.divmod(rows, rpbs)
        keys = (sids << 32) | blocks
        uniq, first, inverse = _unique(keys)
        at = _Where(uniq.tolist(), inverse, local)
        out: dict[str, Any] = {}
        with begin(env) as txn:
            views = self._views(txn, db, uniq, sids[first], blocks[first])
            for ci in cols:
                col = self.schema.columns[ci]
                name = col.name
                nulls = col.kind == "fixed" and _has_nulls(views, ci)
                if col.kind == "fixed" and (masks or not nulls):
                    dtype = np.dtype(col.dtype or "<f4")
                    if masks and dtype.kind in "Mm":
                        dtype = np.dtype("<i8")
                    if not nulls and _per_sample(n, len(at.keys), math.prod(col.shape) * dtype.itemsize) \
                            and not (self.layouts and _widened(views, ci)):
                        out[name] = _copy_rows([views[u] for u in at.keys], ci, (n,) + col.shape, dtype, at,
                                               alloc and (lambda sh, dt: alloc(name, sh, dt)), threads)
                        continue
                    srcs = [views[u].column_array(ci).view(dtype) for u in at.keys]
                    out[name] = _gather(srcs, (n,) + col.shape, dtype, at,
                                        alloc and (lambda sh, dt: alloc(name, sh, dt)), threads)
                    if nulls:
                        ones = np.ones(col.shape, bool)
                        valid = [_or_ones(views[u].column_mask(ci), ones, views[u].nrows) for u in at.keys]
                        mask = _gather(valid, (n,) + col.shape, np.dtype(bool), at,
                                       alloc and (lambda sh, dt: alloc(name + VALID_SUFFIX, sh, dt)), 1)
                        # a bool column (bool8 too) takes False: numpy refuses to cast the int 0 to bool
                        np.copyto(out[name], np.nan if dtype.kind == "f" else np.zeros((), dtype), where=~mask)
                        out[name + VALID_SUFFIX] = mask
                else:
                    vals: list[Any] = [None] * n
                    for u, sel in zip(at.keys, at.groups()):
                        v = views[u]
                        for j in sel.tolist():
                            vals[j] = v.value(ci, int(local[j]))
                    out[name] = vals
        return out


def split_batch(batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The samples of a gathered chunk: each sample's arrays are views of the chunk's (owned) arrays,
    so a sample costs a dict, not a copy or any per-field decoding."""
    names = list(batch)
    columns = [batch[n] for n in names]
    n = len(columns[0]) if columns else 0
    if len(names) == 2:  # the common (input, label) case, without the inner loop
        (n0, n1), (c0, c1) = names, columns
        for i in range(n):
            yield {n0: c0[i], n1: c1[i]}
        return
    for i in range(n):
        yield {k: c[i] for k, c in zip(names, columns)}


class _Where:
    """Where a batch's samples come from: ``keys`` (the distinct blocks, sorted), ``inverse`` (the block of
    each sample, an index into ``keys``), ``local`` (its row in that block); the samples of each block (``groups``)
    are worked out when first needed."""

    __slots__ = ("keys", "inverse", "local", "_groups", "_pairs")

    def __init__(self, keys: list[int], inverse: np.ndarray, local: np.ndarray) -> None:
        self.keys, self.inverse, self.local = keys, inverse, local
        self._groups: list[np.ndarray] | None = None
        self._pairs: list[tuple[int, int]] | None = None

    def groups(self) -> list[np.ndarray]:
        if self._groups is None:
            n, k = len(self.inverse), len(self.keys)
            if k == 1:
                self._groups = [np.arange(n)]
            elif k == n:
                self._groups = [np.array([j]) for j in np.argsort(self.inverse)]
            else:
                self._groups = [np.flatnonzero(self.inverse == u) for u in range(k)]
        return self._groups

    def pairs(self) -> list[tuple[int, int]]:
        """(block index, row) of each sample, as Python ints."""
        if self._pairs is None:
            self._pairs = list(zip(self.inverse.tolist(), self.local.tolist()))
        return self._pairs


def _unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)``; in Python for a few keys (a tenth of the time)."""
    if len(keys) > SMALL_BATCH:
        return np.unique(keys, return_index=True, return_inverse=True)
    ks = keys.tolist()
    first: dict[int, int] = {}
    for j, k in enumerate(ks):
        first.setdefault(k, j)
    order = sorted(first)
    where = {k: i for i, k in enumerate(order)}
    return (np.array(order, np.int64), np.array([first[k] for k in order], np.int64),
            np.array([where[k] for k in ks], np.int64))


def _per_sample(n: int, blocks: int, row_bytes: int) -> bool:
    """Whether a batch's column is copied sample by sample: every sample in its own block, or large samples."""
    return blocks == n or (n * row_bytes >= PARALLEL_MIN_BYTES and row_bytes >= LARGE_SAMPLE_BYTES)


def _widened(views: dict[int, BlockView], ci: int) -> bool:
    """Whether a block of the batch holds column ``ci`` narrower than it is read (its bytes cannot be copied)."""
    return any(ci in getattr(v, "casts", ()) for v in views.values())


def _copy_rows(views: list[BlockView], ci: int, shape: tuple[int, ...], dtype: np.dtype, at: _Where,
               alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None, threads: int) -> np.ndarray:
    """A fixed column without nulls, one copy per sample straight from its block (over ``threads`` threads)."""
    arr = alloc(shape, dtype) if alloc else None
    if arr is None:
        arr = np.empty(shape, dtype)
    flat = arr.reshape(shape[0], -1)
    jobs = []
    for j, (u, r) in enumerate(at.pairs()):
        v = views[u]
        _, off, size, _, _, _, _ = v._table[ci]  # a dense column: nrows rows of ``size // nrows`` bytes at ``off``
        size //= v.nrows
        jobs.append((flat[j], np.frombuffer(v.buf, dtype, size // dtype.itemsize, off + r * size)))
    copy_all(jobs, threads)
    return arr


def _gather(srcs: list[np.ndarray], shape: tuple[int, ...], dtype: np.dtype, at: _Where,
            alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None, threads: int) -> np.ndarray:
    """Rows ``at.local`` of the blocks' (nrows, *shape) arrays ``srcs`` (one per ``at.keys``) into one (n, *shape)
    array."""
    n, k = shape[0], len(srcs)
    arr = alloc(shape, dtype) if alloc else None
    if arr is None:
        arr = np.empty(shape, dtype)
    if k == 1:  # one block: a single gather straight into the batch
        np.take(srcs[0], at.local, axis=0, out=arr)
    elif _gather_mapped(srcs, arr, at, threads):
        pass
    elif k == n:
        for j, (u, r) in enumerate(at.pairs()):
            arr[j] = srcs[u][r]
    else:
        for src, sel in zip(srcs, at.groups()):
            arr[sel] = src[at.local[sel]]
    return arr


def _gather_mapped(srcs: list[np.ndarray], arr: np.ndarray, at: _Where, threads: int = 1) -> bool:
    """Rows from several blocks in one vectorised gather (False: not possible here, nothing done).

    The blocks lie in one memory map (LMDB's, valid for the read transaction the caller holds), so one array
    whose items are whole rows, starting at every byte between the first block and the end of the last, reaches
    them all: a sample is the item at its block's offset plus its row times the row size. A fancy index per
    ``PIECE_BYTES`` gathers the batch; a loop over the blocks costs a numpy call or two per block (twice the time
    for 256-byte rows spread over 14 blocks). A large one is split over ``threads`` threads (numpy drops the GIL
    while it gathers: a 12 MB chunk of 1 KiB rows took 1.7-1.9 ms on two threads, 2.8-3.0 ms on one, here)."""
    row = arr.nbytes // max(1, len(arr))
    if not row or not arr.flags.c_contiguous or not all(s.flags.c_contiguous for s in srcs):
        return False
    starts = [s.__array_interface__["data"][0] for s in srcs]
    base = min(starts)
    span = max(a + s.nbytes for a, s in zip(starts, srcs)) - base
    if span < row:
        return False
    whole = (ctypes.c_char * span).from_address(base)
    items = np.ndarray((span - row + 1,), np.dtype((np.void, row)), whole, 0, (1,))
    first = np.array(starts, np.int64) - base
    at_bytes = first[at.inverse] + at.local * row
    dest = arr.reshape(len(arr), -1).view(np.dtype((np.void, row)))[:, 0]

    step = max(1, PIECE_BYTES // row)

    def part(a: int, b: int) -> None:
        for c in range(a, b, step):  # a piece at a time: numpy gathers into a temporary, then copies it in place
            d = min(b, c + step)
            dest[c:d] = items[at_bytes[c:d]]
    split(part, len(at_bytes), arr.nbytes, threads)
    return True


def _or_ones(mask: np.ndarray | None, ones: np.ndarray, nrows: int) -> np.ndarray:
    return mask if mask is not None else np.broadcast_to(ones, (nrows,) + ones.shape)


def _has_nulls(views: dict[int, BlockView], ci: int) -> bool:
    return any(v.has_nulls(ci) for v in views.values())
