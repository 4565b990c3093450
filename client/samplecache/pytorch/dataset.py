"""``SampleCacheDataset``: a PyTorch IterableDataset over the daemon's epoch manifests.

A thin adapter on ``samplecache.core``: the core's ``Reader`` owns the job's epochs, the split, the batches and
the resume state; this module adds what is PyTorch's (DataLoader workers, torch.distributed, tensors, the
shared-memory ring of ``SampleCacheLoader``).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import fields, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from samplecache.core import (
    BatchOptions,
    CacheOptions,
    EpochPlan,
    Options,
    Position,
    Reader,
    SplitOptions,
    gather_batches,
    stream_for,
)
from samplecache.pytorch.collation import collate_into
from samplecache.pytorch.topology import Topology, agreed_run, dist_rank_world, topology  # noqa: F401 (re-exported)
from samplecache.pytorch.transport import Ring, ring_batch
from samplecache.reading.blocks.bufferpool import BufferPool, plain
from samplecache.reading.blocks.gather import default_threads
from samplecache.reading.epoch_clock import EpochClock
from samplecache.reading.epoch_source import EpochSource
from samplecache.reading.ordering.stream import Stream

_DATASETS = itertools.count()  # the n-th dataset made in a process: the same n on every rank


def pinned(nbytes: int) -> np.ndarray:
    """Page-locked host memory as numpy (the buffer pool's, when CUDA is available)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()


def _tensors(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


class SampleCacheDataset(IterableDataset):  # type: ignore[type-arg]
    """Samples of the local samplecache, one epoch manifest at a time.

    Per-sample (default): yields dicts of column -> value in the README's table of
    representations (numpy array / numpy scalar / str / bytes / dict / list / None);
    batch them with ``SampleCacheLoader`` or ``collate_fn=samplecache.collate``.
    Batched (``batch_size=B``, use ``DataLoader(batch_size=None)``): yields
    ready batches, fixed-shape columns as tensors built by vectorised gathers
    (with ``<name>__valid`` masks where they hold nulls).

    Every sample of the epoch is delivered once across DDP ranks x DataLoader
    workers; with ``partial="pad"`` (default) or ``"drop"`` every rank gets
    the same number of samples and batches, so DDP never hangs.
    """

    def __init__(self, url: str | None = None, columns: Sequence[str] | None = None,
                 transform: Callable[[Any], Any] | None = None, shuffle: bool | None = None, seed: int | None = None,
                 *, cache: CacheOptions | None = None, split: SplitOptions | None = None,
                 batch: BatchOptions | None = None, **options: Any) -> None:
        """``url``, ``columns``, ``shuffle``, ``seed`` and ``options`` by name (``batch_size``, ``drop_last``,
        ``partial``, ``min_samples``, ``deadline``...) are the fields of ``CacheOptions``, ``SplitOptions`` and
        ``BatchOptions`` (None: not given), over the objects when given; ``batch_size`` None: one sample at a
        time. ``deadline``: seconds each call to the daemon (a manifest, a lease, the job) may take, all retries
        included, before a ``DaemonError`` (default: SAMPLECACHE_DEADLINE, else 60); waiting for the first epoch's
        ``min_samples`` (warm-up) may add ``wait`` on top. ``retries``: at most this many retries per call (default: as
        many as the deadline allows). ``token``: default SAMPLECACHE_TOKEN, else the daemon's token file."""
        super().__init__()
        given = {"url": url, "columns": columns, "shuffle": shuffle, "seed": seed, **options}
        # the tensors' batches always carry their null masks
        opts = Options.from_keywords("SampleCacheDataset", given, cache=cache, split=split, batch=batch,
                                     fixed={"masks": True})
        self.reader = Reader(opts.cache, opts.split)  # the job's epochs, the split, the batches, the resume state
        self.batch = opts.batch  # per iteration: read ahead in-process only, and copy threads by where it runs
        # every rank of a torch.distributed run (and every DataLoader worker, which gets a copy) must use
        # the same run id, so that they all read the same job: agreed once, here
        self.reader.source.run = agreed_run(self.reader.source.run, next(_DATASETS))
        self.transform = transform
        self.ring: Ring | None = None  # set by SampleCacheLoader before its workers fork
        self.collate_rest = False  # set by SampleCacheLoader: list-valued columns through samplecache.collate
        self._topology = topology()
        self._iterations = 0
        self._position = (0, 0, 0)  # (epoch, position it started at, items yielded) of an in-process iteration
        self.loader_batch: int | None = None  # set by SampleCacheLoader: samples per batch it makes of these samples
        self._pool: BufferPool | None = None  # in-process batches are gathered into its reused buffers

    @property
    def cache(self) -> CacheOptions:
        """Where the cache is and how this dataset talks to the daemon (as given)."""
        return self.reader.cache

    @property
    def split(self) -> SplitOptions:
        """How each epoch is split and ordered (as given)."""
        return self.reader.split

    @property
    def _epochs(self) -> EpochSource:  # older name, kept for scripts that read the run id
        return self.reader.source

    @property
    def _clock(self) -> EpochClock:  # older name, kept for scripts that read the agreed count
        return self.reader.clock

    # -- epochs ----------------------------------------------------------------------------
    def set_epoch(self, epoch: int, daemon_epoch: int | None = None) -> None:
        """Read the job's ``epoch`` on the next iteration (later iterations go on from there). With
        ``daemon_epoch``, that epoch replays the sealed daemon epoch of that number (a snapshot: exactly what
        an earlier run read, while it is still resident)."""
        self.reader.set_epoch(epoch, daemon_epoch)
        self._position = (int(epoch), 0, 0)
        if get_worker_info() is None:
            self.agree(int(epoch))  # several hosts: agree on the epoch's length (every rank calls set_epoch)

    def set_mixture(self, mixture: dict[str, float] | None, mix: str | None = None,
                    epoch_samples: int | None = None) -> None:
        """Read the next epochs with these source weights (a curriculum); the epoch in progress finishes with the
        weights it began with. With DataLoader workers, call it between epochs (persistent workers keep the
        weights they were started with)."""
        self.reader.set_mixture(mixture, mix, epoch_samples)

    def mixture_counts(self, epoch: int) -> dict[str, int] | None:
        """Job epoch ``epoch``'s samples per source (None: no mixture)."""
        return self.reader.mixture_counts(epoch)

    def current_epoch(self) -> int | None:
        """The epoch the latest iteration (in any worker) read, if known."""
        return self.reader.current_epoch()

    @property
    def job(self) -> str:
        """The job this dataset reads as (given, or made for this run): its epochs are its own."""
        return self.reader.job

    def plan(self, epoch: int) -> EpochPlan:
        """The manifest of job epoch ``epoch`` (fetched once per process; the job's first request seals it)."""
        return self.reader.plan(epoch)

    def close(self) -> None:
        """Release this dataset's leases now (the one taken ahead for the next epoch too) and stop its
        threads. Dropping the last reference does the same."""
        self.reader.close()

    def __enter__(self) -> "SampleCacheDataset":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_epoch(self) -> int:
        """The epoch the next iteration will read."""
        return self.reader.next_epoch()

    # -- splitting ----------------------------------------------------------------------------
    def topology(self) -> Topology:
        """Where this process sits: torch.distributed in the main process, the torchrun environment in a
        worker, else what the main process saw."""
        self._topology = topology(self._topology)
        return self._topology

    def position(self, epoch: int, worker: int = 0, workers: int = 1) -> Position:
        """This rank's ``worker``-th share of ``epoch`` (with the samples per rank agreed across hosts)."""
        t = self.topology()
        return Position(t.rank, t.world, t.local_rank, t.local_world, worker, workers, self.reader.agreed(epoch))

    def stream(self, plan: EpochPlan, topo: Topology, worker: int, workers: int, start: int = 0) -> Stream:
        """The samples (rank, worker) reads in ``plan``'s epoch from position ``start``, in order
        (``samplecache.core.stream_for``, dealt by this dataset's batches)."""
        pos = Position(topo.rank, topo.world, topo.local_rank, topo.local_world, worker, workers,
                       self.reader.agreed(plan.epoch))
        split = self.reader.pin_stratum(plan.epoch, self.deal_unit() * topo.local_world)
        return stream_for(plan, split, pos, start, self.deal_unit())

    def deal_unit(self) -> int:
        """Samples of one batch of this rank: what the epoch's rest is dealt by
        (``samplecache.reading.ordering.deal``)."""
        return int(self.batch.batch_size or self.loader_batch or 1)

    def agree(self, epoch: int) -> int | None:
        """Agree with every rank on this epoch's samples per rank (multi-host jobs; call in the main
        process before iterating — SampleCacheLoader does). Returns the agreed count."""
        topo = self.topology()
        partial = self.split.partial
        if topo.nodes <= 1 or not (dist.is_available() and dist.is_initialized()) or partial == "uneven":
            return None
        t = torch.tensor([self.reader.rank_share(epoch, self.position(epoch))], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if partial == "pad" else dist.ReduceOp.MIN)
        agreed = int(t.item())
        self.reader.set_agreed(epoch, agreed)
        return agreed

    # -- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        base = -1 if info is None else info.seed - info.id
        epoch = self.reader.take_epoch((base, self._iterations))
        self._iterations += 1
        self.reader.plan(epoch)  # mapped (or refused, e.g. EpochGone) before the resume point is used
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        pos = self.position(epoch, worker, workers)
        start = self.reader.resume_point(epoch, pos, consume=info is None)  # a worker's copy goes with it
        self._position = (epoch, start, 0)
        ahead = self.batch.prefetch if info is None else 0  # workers are ahead already
        batch = replace(self.batch, prefetch=ahead, copy_threads=self._threads())
        items = self.reader.iterate(epoch, pos, start, batch, unit=self._pack() * (self.batch.batch_size or 1),
                                    gather=self._gather, deal=self.batch.batch_size or self.loader_batch)
        try:
            for n, (_, item) in enumerate(items, 1):
                self._position = (epoch, start, n)
                yield item if self.transform is None else self.transform(item)
            self._position = (epoch, start, -1)  # read to its end (a short batch dropped too)
        finally:
            items.close()  # type: ignore[attr-defined]

    def _threads(self) -> int:
        """Threads that copy a large batch: several in-process, one in a DataLoader worker (the workers
        already use the cores), unless ``copy_threads`` says otherwise."""
        if self.batch.copy_threads is not None:
            return self.batch.copy_threads
        return default_threads() if get_worker_info() is None else 1

    def _pack(self) -> int:
        """Batches per item handed to DataLoader: several (one gather, one message) in a worker that
        writes into SampleCacheLoader's ring, else one."""
        if self.ring is not None and get_worker_info() is not None and self.transform is None:
            return self.ring.pack
        return 1

    def _gather(self, plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, unit: int) -> Iterator[tuple[int, Any]]:
        """(samples, item) for a group of whole batches (or the short last one): in a ring worker one item (a
        pack of batches) per ``unit`` positions, gathered into one slot; in-process one gather for all of
        them, each batch a view of it."""
        b = self.batch.batch_size or 1
        if self.ring is not None and get_worker_info() is not None:
            for a in range(0, len(idx), unit):
                yield min(unit, len(idx) - a), self._collate(plan, idx[a:a + unit], rows[a:a + unit], b)
            return
        pool = self.buffers() if get_worker_info() is None else None  # a worker's batches are sent away
        for n, batch in gather_batches(plan, idx, rows, b, self._threads(), True, pool and pool.alloc):
            yield n, self._finish(_tensors(batch))

    def buffers(self) -> BufferPool:
        """The reused output buffers of in-process batches (pinned when CUDA is available): a batch's tensors
        view one; it is written again only once no tensor or array of that batch is held."""
        if self._pool is None:
            self._pool = BufferPool(pinned if torch.cuda.is_available() else plain)
        return self._pool

    def _finish(self, batch: dict[str, Any]) -> dict[str, Any]:
        """One batch as ``samplecache.collate`` makes it from the samples (``default_collate`` where that
        works), for a per-sample dataset batched by SampleCacheLoader: list-valued columns are collated."""
        if self.collate_rest:
            for k, v in list(batch.items()):
                if isinstance(v, list):
                    collate_into(batch, k, v)
        return batch

    def _collate(self, plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, b: int) -> Any:
        """One item: the batches of ``b`` of these positions (a pack when there are several)."""
        def produce(alloc: Any = None) -> dict[str, Any]:
            batch = plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols, alloc,
                                      self._threads(), masks=True)
            out = _tensors(batch)
            return self._finish(out) if len(idx) <= b else out  # packs: only when every column is fixed

        info = get_worker_info()
        if self.ring is not None and info is not None and self.transform is None:
            return ring_batch(self.ring, info.id, produce, b)  # handed out as views (SampleCacheLoader)
        return produce()

    def batched_like_collate(self, batch_size: int, drop_last: bool) -> "SampleCacheDataset":
        """A shallow copy that makes batches equal to what DataLoader's default collation makes of these
        samples (for SampleCacheLoader), sharing the core's ``Reader``: its epoch clock, manifests, leases and
        resume state."""
        twin = copy.copy(self)
        twin.batch = replace(self.batch, batch_size=int(batch_size), drop_last=bool(drop_last))
        twin.collate_rest = True
        twin._pool = None
        return twin

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["ring"] = None  # only forked workers share the ring (inherited, never pickled)
        state["_pool"] = None  # in-process only
        return state

    # -- resuming (in-process iteration; with DataLoader workers use SampleCacheLoader) ---------------
    def state_dict(self) -> dict[str, Any]:
        """Where an in-process iteration (no DataLoader workers) stands (README: "Resuming"): resume with
        load_state_dict."""
        epoch, start, items = self._position
        unit = self.deal_unit()
        if items == 0:
            return self.reader.state(epoch, start).to_dict()
        if items < 0:
            return self.reader.state(epoch, self.reader.end(epoch, self.position(epoch), start)).to_dict()
        # every rank took as many batches (DDP steps in lockstep): this rank's count gives the whole job's
        batches = items if self.batch.batch_size else -(-items // unit)
        at = self.reader.position_after(epoch, self.position(epoch), start, batches, unit)
        return self.reader.state(epoch, at).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the saved job's epoch at the saved position on the next iteration (this run takes the job
        over; the daemon answers 404, naming the jobs it knows, when it does not know the job)."""
        self.reader.load_state(state)
        pending = self.reader.pending
        assert pending is not None
        self._position = (pending.epoch, pending.position, 0)
        if get_worker_info() is None:
            self.agree(pending.epoch)  # several hosts: agree on the epoch's length


def _option(holder: Callable[[SampleCacheDataset], Any], name: str) -> property:
    """One option read-only on the dataset (``ds.seed``): kept once, in ``holder(ds)``."""
    return property(lambda self: getattr(holder(self), name), doc=f"``{name}``")


# the daemon's URL, token and deadline as the epoch source settled them (checked; from the environment when not given)
_SETTLED = ("url", "token", "deadline")

# ds.url, ds.seed, ds.batch_size...: every option, derived once from the options' fields (the dataset's own
# attributes win: ``ds.job`` is the job read, given or made)
for _kind, _holder in ((CacheOptions, lambda ds: ds.cache), (SplitOptions, lambda ds: ds.split),
                       (BatchOptions, lambda ds: ds.batch)):
    for _field in fields(_kind):
        if not hasattr(SampleCacheDataset, _field.name):
            _from = (lambda ds: ds.reader.source) if _field.name in _SETTLED else _holder
            setattr(SampleCacheDataset, _field.name, _option(_from, _field.name))


__all__ = ["SampleCacheDataset", "EpochPlan", "Topology", "topology", "dist_rank_world"]
