"""``SampleCacheDataset``: a PyTorch IterableDataset over the daemon's epoch manifests."""

from __future__ import annotations

import copy
import itertools
import numbers
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from samplecache.collation import collate_into
from samplecache.epoch_clock import EpochClock
from samplecache.epoch_source import EpochPlan, EpochSource
from samplecache.gather import default_threads
from samplecache.partition import PARTIAL, part_range, rank_range, shard_order, spans_for
from samplecache.prefetch import prefetched
from samplecache.reader import split_batch
from samplecache.stream import Stream
from samplecache.topology import Topology, agreed_run, dist_rank_world, topology  # noqa: F401 (re-exported)
from samplecache.transport import Ring, ring_batch

AHEAD_BYTES = 8 << 20  # read ahead by the prefetch thread, beyond one chunk or batch
BATCH_ALONE_BYTES = 1 << 20  # a batch at least this large is gathered on its own
FIRST_CHUNK = 256  # the first read of an epoch is small: its first batch comes at once
MAX_EPOCH = 2 ** 53  # as the daemon's limit: exact as a float, far from int64's end (the shared clock adds to them)
PREFETCH_AT = 0.95  # fetch (so seal) the next epoch's manifest, and lease it, when this much is read


_DATASETS = itertools.count()  # the n-th dataset made in a process: the same n on every rank


def _epoch_number(value: Any, name: str) -> int:
    """``value`` as an epoch number: an int with 0 <= value < 2**53 (the epoch clock counts in int64)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < MAX_EPOCH:
        raise ValueError(f"{name} must be an int with 0 <= {name} < 2**53, not {value!r}")
    return int(value)


def _source_setting(name: str) -> property:
    """A constructor setting that the epoch source uses: read-only here (one copy of it)."""
    return property(lambda self: getattr(self._epochs, name), doc=f"``{name}`` as given to the constructor")


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

    def __init__(self, url: str = "http://127.0.0.1:8750", columns: Sequence[str] | None = None,
                 transform: Callable[[Any], Any] | None = None, shuffle: bool = True, seed: int = 0,
                 *, batch_size: int | None = None, drop_last: bool = False, shuffle_buffer: int = 0,
                 partial: str = "pad", min_samples: int = 1, wait: float = 60.0, token: str | None = None,
                 retries: int | None = None, lease: bool = True, prefetch_next: bool = True, prefetch: int = 2,
                 copy_threads: int | None = None, job: str | None = None, deadline: float | None = None) -> None:
        """``deadline``: seconds each call to the daemon (a manifest, a lease, the job) may take, all retries
        included, before a ``DaemonError`` (default: SAMPLECACHE_DEADLINE, else 60); waiting for an epoch's
        ``min_samples`` may add ``wait`` on top. ``retries``: at most this many retries per call (default: as
        many as the deadline allows). ``token``: default SAMPLECACHE_TOKEN, else the daemon's token file."""
        super().__init__()
        if partial not in PARTIAL:
            raise ValueError(f"partial must be one of {PARTIAL}, not {partial!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be a positive integer or None")
        if copy_threads is not None and copy_threads < 1:
            raise ValueError("copy_threads must be a positive integer or None (the usable cores, at most 4)")
        self.transform = transform
        self.shuffle = shuffle
        self.seed = int(seed)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle_buffer = int(shuffle_buffer)
        self.partial = partial
        self.prefetch_next = prefetch_next
        self.prefetch = int(prefetch)
        self.copy_threads = copy_threads
        self._clock = EpochClock(0)
        self._topology = topology()
        self._iterations = 0
        self._epochs = EpochSource(url, self._clock, columns, job=job, token=token, retries=retries,
                                   min_samples=min_samples, wait=wait, lease=lease, deadline=deadline)
        # every rank of a torch.distributed run (and every DataLoader worker, which gets a copy) must use
        # the same run id, so that they all read the same job: agreed once, here
        self._epochs.run = agreed_run(self._epochs.run, next(_DATASETS))
        self._resume: dict[str, Any] | None = None
        self._ring: Ring | None = None  # set by SampleCacheLoader before its workers fork
        self._position = (0, 0)  # (epoch, samples yielded) of an in-process iteration
        self._collate_rest = False  # set by SampleCacheLoader: list-valued columns through samplecache.collate

    url = _source_setting("url")
    columns = _source_setting("columns")
    token = _source_setting("token")
    retries = _source_setting("retries")
    min_samples = _source_setting("min_samples")
    wait = _source_setting("wait")
    lease = _source_setting("lease")
    deadline = _source_setting("deadline")

    # -- epochs ----------------------------------------------------------------------------
    def set_epoch(self, epoch: int, daemon_epoch: int | None = None) -> None:
        """Read the job's ``epoch`` on the next iteration (later iterations go on from there). With
        ``daemon_epoch``, that epoch replays the sealed daemon epoch of that number (a snapshot: exactly what
        an earlier run read, while it is still resident)."""
        epoch = _epoch_number(epoch, "epoch")
        if daemon_epoch is not None:
            daemon_epoch = _epoch_number(daemon_epoch, "daemon_epoch")
            self._epochs.replay(int(epoch), int(daemon_epoch))
        self._clock.set(int(epoch))
        self._position = (int(epoch), 0)
        if get_worker_info() is None:
            self.agree(int(epoch))  # several hosts: agree on the epoch's length (every rank calls set_epoch)

    def current_epoch(self) -> int | None:
        """The epoch the latest iteration (in any worker) read, if known."""
        return self._clock.current()

    @property
    def job(self) -> str:
        """The job this dataset reads as (given, or made for this run): its epochs are its own."""
        return self._epochs.job_name

    def plan(self, epoch: int) -> EpochPlan:
        """The manifest of job epoch ``epoch`` (fetched once per process; the job's first request seals it)."""
        return self._epochs.plan(epoch)

    def close(self) -> None:
        """Release this dataset's leases now (the one taken ahead for the next epoch too) and stop its
        threads. Dropping the last reference does the same."""
        self._epochs.close()

    def __enter__(self) -> "SampleCacheDataset":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_epoch(self) -> int:
        info = get_worker_info()
        base = -1 if info is None else info.seed - info.id
        key = (base, self._iterations)
        self._iterations += 1
        return self._clock.take(key)

    # -- splitting ----------------------------------------------------------------------------
    def stream(self, plan: EpochPlan, topo: Topology, worker: int, workers: int) -> Stream:
        """The samples (rank, worker) reads in ``plan``'s epoch, in order.

        Each host splits its own manifest over its local ranks. With several hosts
        (each with its own cache and manifest) every rank reads the count agreed
        for the epoch (``agree``): the largest host count with ``pad``, the smallest
        with ``drop``, so every rank of the job makes the same number of steps.
        """
        order = shard_order(len(plan.ids), self.seed, plan.epoch, self.shuffle)
        start, stop = rank_range(plan.total, topo.local_rank, topo.local_world, self.partial)
        agreed = self._clock.agreed(plan.epoch)
        if agreed is not None and self.partial != "uneven":
            stop = start + agreed
        elif topo.nodes > 1 and self.partial != "uneven":
            raise RuntimeError(
                f"this job spans {topo.nodes} hosts, each with its own cache, so ranks must agree on the length "
                f"of epoch {plan.epoch}: call ds.set_epoch(epoch) on every rank before each epoch (after "
                f"init_process_group), or iterate with samplecache.SampleCacheLoader")
        start, stop = part_range(start, stop, worker, workers)
        spans = spans_for(plan.rows, order, start, stop)
        return Stream(spans, plan.ids, plan.rows, self.seed, plan.epoch, self.shuffle, self.shuffle_buffer,
                      key=topo.rank * workers + worker)

    def agree(self, epoch: int) -> int | None:
        """Agree with every rank on this epoch's samples per rank (multi-host jobs; call in the main
        process before iterating — SampleCacheLoader does). Returns the agreed count."""
        topo = topology(self._topology)
        self._topology = topo
        if topo.nodes <= 1 or not (dist.is_available() and dist.is_initialized()) or self.partial == "uneven":
            return None
        plan = self.plan(epoch)
        start, stop = rank_range(plan.total, topo.local_rank, topo.local_world, self.partial)
        t = torch.tensor([stop - start], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if self.partial == "pad" else dist.ReduceOp.MIN)
        agreed = int(t.item())
        self._clock.set_agreed(epoch, agreed)
        return agreed

    def next_epoch(self) -> int:
        """The epoch the next iteration will read."""
        self._epochs.attach()  # a job restarted by name goes on at its next epoch
        return self._clock.peek()

    def _start(self, epoch: int, worker: int, workers: int) -> int:
        r = self._resume
        if r is None or int(r["epoch"]) != epoch:
            return 0
        if len(r["skip"]) != workers:
            raise ValueError(f"this state was saved with {len(r['skip'])} DataLoader workers; resume with "
                             f"the same number (now {workers})")
        if get_worker_info() is None:
            self._resume = None  # in-process: used once (a worker's copy goes away with the worker)
        return int(r["skip"][worker])

    # -- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._epochs.closed:
            raise RuntimeError("this SampleCacheDataset is closed")
        self._epochs.attach()
        epoch = self._next_epoch()
        plan = self.plan(epoch)
        topo = topology(self._topology)
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        stream = self.stream(plan, topo, worker, workers)
        start = self._start(epoch, worker, workers)
        holder = f"rank {topo.rank} worker {worker}"
        keeper = self._epochs.keeper(plan, holder)
        prefetch_at = int(PREFETCH_AT * stream.total) if self.prefetch_next else -1
        self._position = (epoch, start)
        try:
            items = self._batches(plan, stream, start) if self.batch_size else self._samples(plan, stream, start)
            for pos, item in items:
                if pos >= prefetch_at >= 0:
                    self._epochs.prefetch(epoch + 1, holder)
                    prefetch_at = -1
                self._position = (epoch, pos)
                if keeper is not None:
                    keeper.read = pos - start
                yield item if self.transform is None else self.transform(item)
        finally:
            self._epochs.done(keeper)

    def _threads(self) -> int:
        """Threads that copy a large batch: several in-process, one in a DataLoader worker (the workers
        already use the cores), unless ``copy_threads`` says otherwise."""
        if self.copy_threads is not None:
            return int(self.copy_threads)
        return default_threads() if get_worker_info() is None else 1

    def _ahead(self, item_bytes: int) -> int:
        """Chunks or batches read ahead by a thread: in-process reading only (workers are ahead already),
        and no more than ``AHEAD_BYTES`` (beyond one item): memory the consumer just freed is reused
        while it is still in the CPU's cache."""
        if get_worker_info() is not None or self.prefetch <= 0:
            return 0
        return max(1, min(self.prefetch, AHEAD_BYTES // max(1, item_bytes)))

    def _samples(self, plan: EpochPlan, stream: Stream, start: int) -> Iterator[tuple[int, Any]]:
        pos = start
        threads = self._threads()
        chunks = (plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols, threads=threads)
                  for idx, rows in stream.chunks(start, chunk=plan.chunk, first=FIRST_CHUNK))
        for chunk in prefetched(chunks, self._ahead(plan.chunk * plan.sample_bytes)):
            for sample in split_batch(chunk):
                pos += 1
                yield pos, sample

    def _batches(self, plan: EpochPlan, stream: Stream, start: int) -> Iterator[tuple[int, Any]]:
        ahead = self._ahead(int(self.batch_size or 1) * plan.sample_bytes)
        return prefetched(self._make_batches(plan, stream, start), ahead)

    def _pack(self) -> int:
        """Batches per item handed to DataLoader: several (one gather, one message) in a worker that
        writes into SampleCacheLoader's ring, else one."""
        if self._ring is not None and get_worker_info() is not None and self.transform is None:
            return self._ring.pack
        return 1

    def _make_batches(self, plan: EpochPlan, stream: Stream, start: int) -> Iterator[tuple[int, Any]]:
        """(position, item): an item is one batch, or in a ring worker a pack of ``_pack()`` batches
        (``pack_sizes`` says how a reader's batches fall into items)."""
        b = int(self.batch_size or 1)
        unit = self._pack() * b  # positions per item
        # small batches are gathered together (about CHUNK_BYTES at a time); large ones one by one, so
        # each is written into the memory the consumer's previous batch just freed (still in cache)
        per_chunk = max(1, plan.chunk // b) if b * plan.sample_bytes < BATCH_ALONE_BYTES else 1
        chunk = max(unit, per_chunk * b // unit * unit)
        pos = start
        pend_idx: list[np.ndarray] = []
        pend_rows: list[np.ndarray] = []
        pending = 0
        for idx, rows in stream.chunks(start, chunk=chunk, first=unit):
            pend_idx.append(idx)
            pend_rows.append(rows)
            pending += len(idx)
            if pending < unit:
                continue
            all_idx, all_rows = np.concatenate(pend_idx), np.concatenate(pend_rows)
            full = len(all_idx) // unit * unit
            for n, item in self._collate_many(plan, all_idx[:full], all_rows[:full], b, unit):
                pos += n
                yield pos, item
            pend_idx, pend_rows, pending = [all_idx[full:]], [all_rows[full:]], len(all_idx) - full
        if pending:  # fewer than one item's positions left: their whole batches as one item, then the rest
            idx, rows = np.concatenate(pend_idx), np.concatenate(pend_rows)
            whole = len(idx) // b * b
            if whole:
                for n, item in self._collate_many(plan, idx[:whole], rows[:whole], b, whole):
                    pos += n
                    yield pos, item
            if whole < len(idx) and not self.drop_last:
                pos += len(idx) - whole
                yield pos, self._collate(plan, idx[whole:], rows[whole:], b)

    def _collate_many(self, plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, b: int, unit: int
                      ) -> Iterator[tuple[int, Any]]:
        """(samples, item) for whole batches of ``b``: in a ring worker one item (a pack of batches) per
        ``unit`` positions, gathered into one slot; in-process one gather for all of them, each batch a
        slice (a view) of it."""
        if self._ring is not None and get_worker_info() is not None:
            for a in range(0, len(idx), unit):
                yield min(unit, len(idx) - a), self._collate(plan, idx[a:a + unit], rows[a:a + unit], b)
            return
        gathered = plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols,
                                     threads=self._threads(), masks=True)
        tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in gathered.items()}
        for a in range(0, len(idx), b):
            yield min(b, len(idx) - a), self._finish({k: v[a:a + b] for k, v in tensors.items()})

    def _finish(self, batch: dict[str, Any]) -> dict[str, Any]:
        """One batch as ``samplecache.collate`` makes it from the samples (``default_collate`` where that
        works), for a per-sample dataset batched by SampleCacheLoader: list-valued columns are collated."""
        if self._collate_rest:
            for k, v in list(batch.items()):
                if isinstance(v, list):
                    collate_into(batch, k, v)
        return batch

    def _collate(self, plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, b: int) -> Any:
        """One item: the batches of ``b`` of these positions (a pack when there are several)."""
        def produce(alloc: Any = None) -> dict[str, Any]:
            batch = plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols, alloc,
                                      self._threads(), masks=True)
            out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
            return self._finish(out) if len(idx) <= b else out  # packs: only when every column is fixed

        info = get_worker_info()
        if self._ring is not None and info is not None and self.transform is None:
            return ring_batch(self._ring, info.id, produce, b)  # handed out as views (SampleCacheLoader)
        return produce()

    def batched_like_collate(self, batch_size: int, drop_last: bool) -> "SampleCacheDataset":
        """A shallow copy that makes batches equal to what DataLoader's default collation makes of these
        samples (for SampleCacheLoader), sharing the epoch clock and manifests; its leases are its own."""
        twin = copy.copy(self)  # shares the epoch source: its job, manifests and leases
        twin.batch_size, twin.drop_last, twin._collate_rest = int(batch_size), bool(drop_last), True
        return twin

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ring"] = None  # only forked workers share the ring (inherited, never pickled)
        return state

    # -- resuming (in-process iteration; with DataLoader workers use SampleCacheLoader) ---------------
    def state_dict(self) -> dict[str, Any]:
        """Where an in-process iteration (no DataLoader workers) stands: resume with load_state_dict."""
        epoch, pos = self._position
        return {"epoch": epoch, "skip": [pos], "seed": self.seed, "shuffle": self.shuffle, "job": self.job}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the saved job's epoch at the saved position on the next iteration (this run takes the job
        over; the daemon answers 404, naming the jobs it knows, when it does not know the job)."""
        if state.get("seed", self.seed) != self.seed or state.get("shuffle", self.shuffle) != self.shuffle:
            raise ValueError("the state was saved with another seed or shuffle setting")
        self._epochs.resume_job(state.get("job"))
        self._resume = {"epoch": int(state["epoch"]), "skip": [int(s) for s in state["skip"]]}
        self.set_epoch(int(state["epoch"]))
        if len(self._resume["skip"]) == 1:
            self._position = (self._resume["epoch"], self._resume["skip"][0])


__all__ = ["SampleCacheDataset", "EpochPlan", "Topology", "topology", "dist_rank_world"]
