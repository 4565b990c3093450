"""``samplecache.core``: reading the cache with no framework (numpy and the standard library only).

One ``Reader`` per job and process: its epochs (job, manifests fetched once per process, the next one fetched
ahead, leases while reading), the split of an epoch over ranks x workers (``Position``), and the reading itself,
as per-sample dicts (``samples``) or columnar numpy batches (``batches``, vectorised gathers). The split's pure
functions are ``reading/split.py``'s and the resume state ``reading/resume.py``'s, re-exported here.
What it is told comes as one object per concern (``CacheOptions``, ``SplitOptions``, ``BatchOptions``:
``samplecache.reading.options``, re-exported here). The PyTorch, TensorFlow, JAX/NumPy and DALI adapters sit on
top.

Words: a "reader" is the LMDB ``CacheReader`` (``samplecache.reading.blocks.reader``; ``EpochPlan.reader``); ``Reader``
keeps its public name for the job read in one process, and adapters keep theirs at ``.reader``. One rank, or one
of its DataLoader workers, reading its share of an epoch is a "worker".
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from samplecache.api.client import DaemonError, EpochGone
from samplecache.reading.batching import ahead, batch_groups, batch_items, gather_batches
from samplecache.reading.blocks.bufferpool import BufferPool
from samplecache.reading.blocks.gather import default_threads
from samplecache.reading.blocks.layouts import MixedColumns
from samplecache.reading.blocks.reader import split_batch
from samplecache.reading.epoch_clock import EpochClock
from samplecache.reading.epoch_source import EpochPlan, EpochSource, MissingColumn
from samplecache.reading.options import (
    DEFAULT_URL,
    BatchOptions,
    CacheOptions,
    Options,
    SplitOptions,
)
from samplecache.reading.ordering.deal import position_after
from samplecache.reading.ordering.mixture import MixedOrder, mixture_counts
from samplecache.reading.ordering.stream import Stream
from samplecache.reading.prefetch import prefetched
from samplecache.reading.resume import ForeignState, ResumeState, StaleState, epoch_number
from samplecache.reading.source_reads import SourceReads
from samplecache.reading.sources import await_sources, job_schema
from samplecache.reading.split import (
    MissingSource,
    Position,
    check_mixture,
    epoch_stop,
    epoch_total,
    loose_run,
    order_of,
    rank_share,
    stream_for,
)

FIRST_CHUNK = 256  # the first read of an epoch is small: its first batch comes at once
PREFETCH_AT = 0.95  # fetch (so seal) the next epoch's manifest, and lease it, when this much is read
LEAD_S = 1.0  # or sooner, when the epoch's time left is less than this: fetching and leasing take milliseconds
EPOCH_SPLITS_KEPT = 8  # epochs whose split (their mixture) a reader remembers
_ONE_BY_ONE = BatchOptions(None)  # frozen, so one shared instance: samples, read ahead as by default

Gather = Callable[[EpochPlan, np.ndarray, np.ndarray, int], Iterator[tuple[int, Any]]]


def _items(counted: Iterator[tuple[int, Any]]) -> Iterator[Any]:
    """The items of (count, item) pairs; closing this closes ``counted`` (its lease goes at once)."""
    try:
        for _, item in counted:
            yield item
    finally:
        counted.close()  # type: ignore[attr-defined]


# -- the job, read ------------------------------------------------------------------------------------------
class Reader:
    """One job's epochs, split and read, in one process. Picklable: copies (DataLoader workers, forked or spawned
    processes) share the job and run, so every process of a run reads the same daemon epochs."""

    def __init__(self, cache: CacheOptions | None = None, split: SplitOptions | None = None, *,
                 run: str | None = None) -> None:
        """``cache``, ``split`` None: the defaults. ``run``: the run id every process of this training run shares
        (default: a new one); it ties the ranks' requests for one job together."""
        self.cache, self.split = cache or CacheOptions(), split or SplitOptions()
        self.clock = EpochClock(0)
        self.source = EpochSource(self.cache, self.clock)
        if run is not None:
            self.source.run = run
        self.pending: ResumeState | None = None  # loaded by load_state, used by the next read of its epoch
        self.epoch_splits: dict[int, SplitOptions] = {}  # epochs read under an earlier split (set_mixture)
        self._takes = 0
        self._pool: BufferPool | None = None

    def buffers(self) -> BufferPool:
        """The reused output buffers of this process's columnar batches (``samplecache.reading.blocks.bufferpool``:
        a buffer is written again only once no array of its batch is held)."""
        if self._pool is None:
            self._pool = BufferPool()
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}  # a copy (a worker, another process) makes its own

    # -- epochs -----------------------------------------------------------------------------------------------
    @property
    def job(self) -> str:
        """The job read (given, or made for this run): its epochs are its own."""
        return self.source.job_name

    def set_epoch(self, epoch: int, daemon_epoch: int | None = None) -> None:
        """Read job epoch ``epoch`` next (later reads go on from there). With ``daemon_epoch``, it replays that
        sealed daemon epoch (exactly what an earlier run read, while it is resident)."""
        epoch = epoch_number(epoch, "epoch")
        if daemon_epoch is not None:
            self.source.replay(epoch, epoch_number(daemon_epoch, "daemon_epoch"))
        self.clock.set(epoch)

    def next_epoch(self) -> int:
        """The epoch the next ``take_epoch`` returns (a job restarted by name goes on at its next epoch)."""
        self.source.attach()
        return self.clock.peek()

    def current_epoch(self) -> int | None:
        """The epoch of the latest ``take_epoch`` (in any process sharing the clock), if any."""
        return self.clock.current()

    def take_epoch(self, key: Any = None) -> int:
        """Advance the clock: the epoch this iteration reads. Processes that give the same ``key`` (a pair of
        ints: DataLoader workers of one iteration) get the same epoch; None is a new key each call."""
        if self.source.closed:
            raise RuntimeError("this samplecache reader is closed")
        self.source.attach()
        if key is None:
            key = (-1, self._takes)
            self._takes += 1
        return self.clock.take(key)

    def plan(self, epoch: int) -> EpochPlan:
        """Job epoch ``epoch``'s manifest (fetched once per process; the job's first request seals it):
        ``.total`` samples, ``.schema``. Raises ``MissingColumn`` for a column the cache lacks, ``EpochGone``
        for an epoch whose shards are gone (saying so when a loaded state was to resume it), ``MissingSource`` for
        a mixture's source that holds no sample after ``wait`` seconds (``await_sources``)."""
        split = self.split_for(epoch)
        if split.mixture is not None and self.source.cached_plan(epoch) is None:
            self.await_sources(split.mixture)
        try:
            return self.source.plan(epoch)
        except EpochGone as e:
            r = self.pending
            if r is None or r.epoch != epoch:
                raise
            raise EpochGone(f"{e} -- the resume state of job {r.job!r} stood at sample {r.position} of epoch "
                            f"{epoch}, whose shards the cache no longer holds, so it cannot go on exactly: go on "
                            f"with the epoch the daemon names", e.status, e.body, e.attempts) from e

    def await_sources(self, mixture: Mapping[str, float]) -> None:
        """Wait up to ``wait`` seconds for every source the mixture gives a share to (``reading.sources``)."""
        await_sources(self.source, mixture, self.cache.wait)

    def schema(self) -> dict[str, Any]:
        """``GET /v1/schema`` for the columns asked for, each column's type the one the batches come in
        (``reading.sources.job_schema``). Raises ``MissingColumn``."""
        return job_schema(self.source, self.cache.columns, self.cache.fill_missing, self.split.mixture)

    # -- the split ------------------------------------------------------------------------------------------------
    def split_for(self, epoch: int) -> SplitOptions:
        """The split job epoch ``epoch`` is read under: a loaded state's mixture for its epoch (whatever this
        reader was given: that epoch finishes exactly as it began), the split in force when ``set_mixture`` came
        during it, else the reader's."""
        got = self.epoch_splits.get(epoch)
        if got is not None:
            return got
        r = self.pending
        if r is not None and r.epoch == epoch:
            return replace(self.split, mixture=r.mixture, mix=r.mix, epoch_samples=r.epoch_samples,
                           stratum=r.stratum)
        return self.split

    def set_mixture(self, mixture: Mapping[str, float] | None, mix: str | None = None,
                    epoch_samples: int | None = None) -> None:
        """Read the next epochs with these weights (``mix``, ``epoch_samples``: as given, else as before); the
        epoch in progress, if any, finishes with the weights it began with."""
        current = self.current_epoch()
        if current is not None:
            self.epoch_splits.setdefault(current, self.split_for(current))
            for e in sorted(self.epoch_splits)[:-EPOCH_SPLITS_KEPT]:
                del self.epoch_splits[e]
        self.split = replace(self.split, mixture=mixture, mix=mix or self.split.mix,
                             epoch_samples=epoch_samples if epoch_samples is not None else self.split.epoch_samples)

    def pin_stratum(self, epoch: int, stratum: int) -> SplitOptions:
        """A stratified mixture's block for ``epoch`` when none was given: this reading's global batch
        (``stratum``), kept for the epoch (a resume state carries it: the epoch goes on in the same order on any
        topology). Returns the epoch's split."""
        split = self.split_for(epoch)
        if split.mixture is not None and split.mix == "stratified" and split.stratum == 0:
            split = self.epoch_splits[epoch] = replace(split, stratum=max(1, int(stratum)))
        return split

    def mixture_counts(self, epoch: int) -> dict[str, int] | None:
        """Job epoch ``epoch``'s samples per source (None: no mixture, every source as resident)."""
        split = self.split_for(epoch)
        if split.mixture is None:
            return None
        plan = self.plan(epoch)
        check_mixture(plan, split)
        return mixture_counts(plan.rows, plan.source_of, plan.source_names, split.mixture, split.epoch_samples)

    def agreed(self, epoch: int) -> int | None:
        """Samples per rank agreed across hosts for ``epoch`` (``set_agreed``), if any."""
        return self.clock.agreed(epoch)

    def set_agreed(self, epoch: int, per_rank: int) -> None:
        """Record the agreed samples per rank of ``epoch`` (shared with the workers forked after it)."""
        self.clock.set_agreed(epoch, int(per_rank))

    def rank_share(self, epoch: int, pos: Position) -> int:
        """This rank's samples in its host's manifest of ``epoch``: what hosts agree on (max: pad, min: drop)."""
        return rank_share(self.plan(epoch), self.split_for(epoch), pos,
                          self.resume_point(epoch, pos, consume=False))

    def count(self, epoch: int, pos: Position, start: int = 0, unit: int = 1) -> int:
        """Samples ``pos`` reads in job epoch ``epoch`` from position ``start``, dealt by ``unit``."""
        return stream_for(self.plan(epoch), self.split_for(epoch), pos, start, unit).total

    def end(self, epoch: int, pos: Position, start: int = 0) -> int:
        """Where the ranks' reading of ``epoch`` from ``start`` ends (a state there resumes to nothing)."""
        return epoch_stop(self.plan(epoch), self.split_for(epoch), pos, start)

    def position_after(self, epoch: int, pos: Position, start: int, batches: int, unit: int) -> int:
        """The position once every rank (in lockstep, as DDP steps) took ``batches`` batches of ``unit`` samples
        from position ``start``: ``start + batches x ranks x unit``, at most the end. Rank 0's count is enough."""
        self.pin_stratum(epoch, unit * pos.local_world)
        return position_after(start, self.end(epoch, pos, start), pos.local_world, unit, batches)

    # -- reading -----------------------------------------------------------------------------------------------
    def samples(self, epoch: int, pos: Position, start: int = 0, *, prefetch: int = 2,
                threads: int | None = None) -> Iterator[dict[str, Any]]:
        """Per-sample dicts of column -> value (README's representations), from sample ``start`` on
        (``prefetch``, ``threads``: ``BatchOptions.prefetch``, ``copy_threads``)."""
        return _items(self.iterate(epoch, pos, start, BatchOptions(None, prefetch=prefetch, copy_threads=threads)))

    def batches(self, epoch: int, pos: Position, opts: BatchOptions, start: int = 0) -> Iterator[dict[str, Any]]:
        """Columnar batches: fixed-shape columns as ``np.ndarray [n, *shape]``, others as lists."""
        opts.checked_batch_size()
        return _items(self.iterate(epoch, pos, start, opts))

    def iterate(self, epoch: int, pos: Position, start: int = 0, batch: BatchOptions | None = None, *,
                unit: int | None = None, gather: Gather | None = None, deal: int | None = None
                ) -> Iterator[tuple[int, Any]]:
        """(samples delivered so far, item): the loop under ``samples`` and ``batches`` from position ``start`` of
        the epoch's global order (items are batches when ``batch`` has a batch size, else samples; None: samples,
        as ``BatchOptions`` reads them by default), with this epoch's lease held and the next epoch's manifest
        fetched near the end. Adapters may group ``unit`` positions per item and make the items with
        ``gather(plan, index, rows, unit)`` yielding (samples, item). ``deal``: the samples of one batch of the
        rank (the deal's unit; default the batch size, else 1, with workers taking turns by ``loose_run``)."""
        batch = batch or _ONE_BY_ONE
        plan = self.plan(epoch)
        threads = batch.copy_threads or default_threads()
        b = batch.batch_size
        per = int(deal or b or 1)
        split = self.pin_stratum(epoch, per * pos.local_world)
        if b is not None:
            unit = int(unit or b)
            stream = stream_for(plan, split, pos, start, per, max(1, unit // b))
            masks = batch.masks
            make = gather or (lambda p, i, r, u: gather_batches(p, i, r, b, threads, masks, self.buffers().alloc))
            items = batch_items(plan, stream, 0, b, unit, batch.drop_last, make, batch.prefetch)
        else:
            stream = stream_for(plan, split, pos, start, per, 1 if deal else loose_run(plan))
            items = self._sample_items(plan, stream, 0, batch.prefetch, threads)
        holder = f"rank {pos.rank} worker {pos.worker}"
        keeper = self.source.keeper(plan, holder)
        mixed = stream.order if isinstance(stream.order, MixedOrder) else None
        if mixed is not None:  # the job's record of the epoch's mixture (GET /v1/jobs/{name}), and reads per source
            self.source.record_mixture(epoch, {"mixture": dict(mixed.weights), "mix": mixed.mix,
                                               "epoch_samples": split.epoch_samples, "counts": dict(mixed.counts)})
        done = 0
        reads = SourceReads(mixed, stream, keeper) if mixed is not None and keeper is not None else None
        prefetch_at = int(PREFETCH_AT * stream.total) if self.cache.prefetch_next else -1
        began = time.monotonic()
        try:
            for n, item in items:
                done += n
                # the next epoch is fetched and leased ahead: at 95%, or sooner when the time left in this one
                # (at the pace so far) is below LEAD_S, so that a short epoch's successor is ready when it ends
                if prefetch_at >= 0 and (done >= prefetch_at or (time.monotonic() - began) * (stream.total - done)
                                         < LEAD_S * done):
                    self.source.prefetch_next(epoch + 1, holder, ready=lambda p: self._warm(p, per * pos.local_world))
                    prefetch_at = -1
                if keeper is not None:
                    keeper.read = done
                    if reads is not None:
                        reads.read(done)
                yield done, item
        finally:
            if reads is not None:
                reads.count(done)
            self.source.done(keeper)

    def _warm(self, plan: EpochPlan, stratum: int) -> None:
        """Make the next epoch's order's first pieces ahead (nothing when its mixture cannot be read: its read
        says why)."""
        try:
            order_of(plan, self.split_for(plan.epoch), stratum).warm()
        except (MissingSource, MixedColumns, ValueError):
            pass

    @staticmethod
    def _sample_items(plan: EpochPlan, stream: Stream, start: int, prefetch: int, threads: int
                      ) -> Iterator[tuple[int, dict[str, Any]]]:
        size = plan.read_chunk(stream.order.spread)
        chunks = (plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols, threads=threads)
                  for idx, rows in stream.chunks(start, chunk=size, first=FIRST_CHUNK))
        for chunk in prefetched(chunks, ahead(prefetch, size * plan.sample_bytes)):
            for sample in split_batch(chunk):
                yield 1, sample

    # -- resuming -----------------------------------------------------------------------------------------------
    def state(self, epoch: int, position: int) -> ResumeState:
        """The state after ``position`` samples of job epoch ``epoch``'s global order were consumed by all ranks
        (with the epoch's manifest to check at the resume, when this process has it)."""
        plan = self.source.cached_plan(epoch)
        split = self.split_for(epoch)
        return ResumeState(self.job, epoch, int(position), split.seed, split.shuffle, split.shuffle_buffer,
                           None if plan is None else epoch_total(plan, split),
                           None if plan is None else plan.daemon_epoch, mixture=split.mixture, mix=split.mix,
                           epoch_samples=split.epoch_samples, stratum=split.stratum)

    def load_state(self, state: ResumeState | Mapping[str, Any]) -> None:
        """Take the saved job over and go on where it stood: the next read of its epoch, on any topology and
        with any batch size, starts at its ``position``. Refused: a state of another job than ``job=`` names
        (``ForeignState``), another seed, shuffle or shuffle buffer, a version 1 state (``StaleState``); the
        daemon answers 404 (naming the jobs it knows) when it does not know the job."""
        if not isinstance(state, ResumeState):
            state = ResumeState.from_dict({"seed": self.split.seed, "shuffle": self.split.shuffle,
                                           "shuffle_buffer": self.split.shuffle_buffer, **state})
        given = self.cache.job
        if given is not None and state.job is not None and state.job != given:
            raise ForeignState(f"this resume state is job {state.job!r}'s; this reader reads job {given!r} (job=): "
                               f"load the state of this job's own checkpoint, or make the reader with "
                               f"job={state.job!r} (or no job=) to go on with that job")
        split = (self.split.seed, self.split.shuffle, self.split.shuffle_buffer)
        if (state.seed, state.shuffle, state.shuffle_buffer) != split:
            raise ValueError(f"the state was saved with another order (seed, shuffle, shuffle_buffer = "
                             f"{(state.seed, state.shuffle, state.shuffle_buffer)}, this reader has {split}): "
                             f"resume with the settings that saved it")
        if state.mixture != self.split.mixture and state.position > 0:
            given = self.split.mixture or "every source"
            warnings.warn(f"job {state.job!r}: epoch {state.epoch} finishes with the mixture it began with "
                          f"({state.mixture or 'every source'}); the weights given ({given}) start at epoch "
                          f"{state.epoch + 1}", stacklevel=3)
        self.source.resume_job(state.job)
        self.pending = state
        self.set_epoch(state.epoch)

    def resume_point(self, epoch: int, pos: Position | None = None, consume: bool = True) -> int:
        """The position ``epoch``'s reading starts at (the loaded state's, else 0); ``consume``: used once.
        Raises ``ForeignState`` when the job's epoch is not the one the state was saved from."""
        r = self.pending
        if r is None or r.epoch != epoch:
            return 0
        if r.samples is not None:
            plan = self.plan(epoch)
            total = epoch_total(plan, self.split_for(epoch))
            if (total, plan.daemon_epoch) != (r.samples, r.daemon_epoch):
                raise ForeignState(
                    f"this resume state was saved while job {r.job!r} read epoch {epoch} as daemon epoch "
                    f"{r.daemon_epoch} ({r.samples} samples); the job's epoch {epoch} is now daemon epoch "
                    f"{plan.daemon_epoch} ({total} samples): the state is from another job or another "
                    f"cache. Load this job's own checkpoint, or start the epoch again with set_epoch({epoch})")
        if consume:
            self.epoch_splits.setdefault(epoch, self.split_for(epoch))  # the epoch goes on as it began
            self.pending = None
        return r.position

    # -- lifetime -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release every lease now (the one taken ahead for the next epoch too) and stop this process's threads."""
        self.source.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_URL", "CacheOptions", "SplitOptions", "BatchOptions", "Options", "Position", "ResumeState",
           "Reader", "EpochPlan", "DaemonError", "EpochGone", "MissingColumn", "stream_for", "rank_share",
           "batch_groups", "gather_batches", "epoch_number", "StaleState", "ForeignState", "order_of", "epoch_stop",
           "loose_run", "MissingSource", "MixedColumns", "epoch_total", "check_mixture"]
