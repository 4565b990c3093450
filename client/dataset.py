"""``SampleCacheDataset``: a PyTorch IterableDataset over the daemon's epoch manifests."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from samplecache.daemon_api import fetch_manifest
from samplecache.epoch_clock import EpochClock
from samplecache.lease import LeaseKeeper
from samplecache.partition import PARTIAL, Span, part_range, rank_range, row_order, shard_order, spans_for
from samplecache.reader import ShardReader
from samplecache.record import Schema


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class EpochPlan:
    """One epoch's manifest, as this reader sees it."""

    def __init__(self, manifest: dict[str, Any], columns: Sequence[str] | None) -> None:
        self.manifest = manifest
        self.epoch = int(manifest["epoch"])
        self.schema = Schema.from_json(manifest["schema"])
        names = self.schema.names
        wanted = list(columns) if columns is not None else names
        unknown = [c for c in wanted if c not in names]
        if unknown:
            raise KeyError(f"columns {unknown} are not cached; the cache has {names}")
        self.cols = [self.schema.index(c) for c in wanted]
        shards = manifest["shards"]
        self.ids = np.array([s[0] for s in shards], dtype=np.int64)
        self.rows = np.array([s[1] for s in shards], dtype=np.int64)
        self.rows_per_block = np.array([s[3] for s in shards], dtype=np.int64)
        self.total = int(self.rows.sum())
        self.reader = ShardReader(manifest["lmdb_path"], int(manifest["map_size"]), self.schema)


class SampleCacheDataset(IterableDataset):  # type: ignore[type-arg]
    """Samples of the local samplecache, one epoch manifest at a time.

    Yields dicts of column -> numpy array / numpy scalar / str / bytes, ready for
    ``default_collate`` and ``pin_memory=True``. Every sample of the epoch is
    delivered once across DDP ranks x DataLoader workers; with ``partial="pad"``
    (default) or ``"drop"`` every rank gets the same count, so DDP never hangs.
    """

    def __init__(self, url: str = "http://127.0.0.1:8750", columns: Sequence[str] | None = None,
                 transform: Callable[[dict[str, Any]], Any] | None = None, shuffle: bool = True, seed: int = 0,
                 *, partial: str = "pad", min_samples: int = 1, wait: float = 60.0,
                 token: str | None = None, retries: int = 5, lease: bool = True) -> None:
        super().__init__()
        if partial not in PARTIAL:
            raise ValueError(f"partial must be one of {PARTIAL}, not {partial!r}")
        self.url = url.rstrip("/")
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self.shuffle = shuffle
        self.seed = int(seed)
        self.partial = partial
        self.min_samples = int(min_samples)
        self.wait = float(wait)
        self.token = token
        self.retries = retries
        self.lease = lease
        self._clock = EpochClock(0)
        self._iterations = 0
        self._plans: dict[int, EpochPlan] = {}

    # -- epochs ----------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` on the next iteration (later iterations go on from there)."""
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        self._clock.set(int(epoch))

    def plan(self, epoch: int) -> EpochPlan:
        """The manifest of ``epoch`` (fetched once per process)."""
        got = self._plans.get(epoch)
        if got is None:
            manifest = fetch_manifest(self.url, epoch, self.min_samples, self.wait, self.token, self.retries)
            got = self._plans[epoch] = EpochPlan(manifest, self.columns)
            for old in [e for e in self._plans if e < epoch - 1]:
                del self._plans[old]
        return got

    def _next_epoch(self) -> int:
        info = get_worker_info()
        base = -1 if info is None else info.seed - info.id
        key = (base, self._iterations)
        self._iterations += 1
        return self._clock.take(key)

    # -- splitting ----------------------------------------------------------------------------
    def spans(self, plan: EpochPlan, rank: int, world: int, worker: int, workers: int) -> list[Span]:
        order = shard_order(len(plan.ids), self.seed, plan.epoch, self.shuffle)
        start, stop = rank_range(plan.total, rank, world, self.partial)
        start, stop = part_range(start, stop, worker, workers)
        return spans_for(plan.rows, order, start, stop)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch()
        plan = self.plan(epoch)
        rank, world = dist_rank_world()
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        keeper = LeaseKeeper(self.url, epoch, self.token, holder=f"rank {rank} worker {worker}") if self.lease else None
        try:
            for span in self.spans(plan, rank, world, worker, workers):
                sid = int(plan.ids[span.index])
                order = row_order(sid, int(plan.rows[span.index]), self.seed, epoch, self.shuffle)
                rows = plan.reader.rows(sid, int(plan.rows_per_block[span.index]), order[span.start:span.stop],
                                        plan.cols)
                if self.transform is None:
                    yield from rows
                else:
                    for sample in rows:
                        yield self.transform(sample)
        finally:
            if keeper is not None:
                keeper.release()


__all__ = ["SampleCacheDataset", "EpochPlan", "dist_rank_world"]
