"""``SampleCacheLoader``: a DataLoader whose ``state_dict()`` resumes an epoch mid-way, with workers.

The epoch is one global order; every step, each rank takes the next batch of it in rank order
(``samplecache.reading.ordering.deal``), and its workers make its batches item by item, round-robin, which is the order
DataLoader hands them out in. So the batches this rank's training loop took (``k``) say where the whole job
stands: ``start + k x ranks x batch`` samples of the order (DDP ranks step in lockstep). That position resumes
on any number of ranks and workers, with any batch size: no sample repeated, none skipped. A batch a worker
made but the loop never took is not counted: it is read again after the resume.

``device=`` (e.g. ``"cuda"``) hands out batches on that device: each host batch (pinned memory in-process when
CUDA is available: the dataset's buffer pool) is copied with ``non_blocking=True`` on a side stream while the
consumer works on the previous batch; the host batch is let go (its buffer or ring slot recycled) only once its
copy is done.
"""

from __future__ import annotations

import multiprocessing as mp
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, default_convert

from samplecache.pytorch.dataset import SampleCacheDataset
from samplecache.pytorch.transport import Packed, Ring, materialize

PACK_BYTES = 1 << 20  # a worker gathers this many bytes of small batches into one slot, sent as one item
MAX_PACK = 16


def _moved(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """``batch`` with its tensors (in dicts, lists and tuples) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _moved(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not isinstance(batch, str):
        return type(batch)(_moved(v, device, non_blocking) for v in batch) if not hasattr(batch, "_fields") \
            else type(batch)(*(_moved(v, device, non_blocking) for v in batch))
    return batch


def _tensors_of(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors_of(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors_of(v)


def cuda_ahead(items: Iterator[tuple[Any, Any]], device: torch.device) -> Iterator[tuple[Any, Any]]:
    """(batch, tag) pairs with each batch's tensors copied to ``device`` on a side stream, one batch ahead of the
    consumer: batch k+1's copy is queued before batch k is handed out. The consumer's stream waits for the copy
    (``wait_event``, ``record_stream`` for the caching allocator); the host batch is dropped only after its copy
    is done (its memory may be reused at once: a buffer-pool buffer or a ring slot)."""
    stream = torch.cuda.Stream(device)
    pending: tuple[Any, Any, torch.cuda.Event, Any] | None = None

    def hand_over(host: Any, moved: Any, done: torch.cuda.Event, tag: Any) -> tuple[Any, Any]:
        current = torch.cuda.current_stream(device)
        current.wait_event(done)
        for v in _tensors_of(moved):
            if v.device.type == "cuda":
                v.record_stream(current)
        done.synchronize()  # the host copy source may be recycled once `host` is dropped
        return moved, tag

    try:
        for host, tag in items:
            with torch.cuda.stream(stream):
                moved = _moved(host, device, True)
                done = torch.cuda.Event()
                done.record(stream)
            if pending is not None:
                previous, pending = pending, None
                yield hand_over(*previous)
                del previous
            pending = (host, moved, done, tag)
            del host, moved
        if pending is not None:
            previous, pending = pending, None
            yield hand_over(*previous)
    finally:
        if pending is not None:
            pending[2].synchronize()  # stopped early: the copy in flight still reads the host batch


class SampleCacheLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` over a ``SampleCacheDataset`` with ``state_dict()`` / ``load_state_dict()``."""

    def __init__(self, dataset: SampleCacheDataset, *args: Any, transport: bool = True, device: Any = None,
                 **kwargs: Any) -> None:
        """``transport``: move the batched path's batches through a reused shared-memory ring. ``device``: hand
        batches out on this device (``"cuda"``: copied on a side stream, one batch ahead; module docstring)."""
        if kwargs.get("in_order") is False:
            raise ValueError("SampleCacheLoader needs in_order=True to know which worker made a batch")
        if args:
            raise TypeError("pass DataLoader options to SampleCacheLoader by keyword")
        batch = kwargs.get("batch_size", 1)
        self._source = dataset
        if (transport and dataset.batch.batch_size is None and batch is not None and kwargs.get("collate_fn") is None
                and dataset.transform is None):
            # A per-sample dataset with default collation: let the dataset make the batches (vectorised
            # gathers; with workers, straight into the shared-memory ring). The batches are the same dicts
            # of tensors, but cost no per-sample Python. A shallow copy does it, so the caller's dataset
            # stays per-sample; the copy shares its epoch clock (set_epoch), manifests and leases.
            dataset = dataset.batched_like_collate(int(batch), bool(kwargs.get("drop_last", False)))
            kwargs["batch_size"], kwargs["drop_last"] = None, False
        elif dataset.batch.batch_size is None and batch is not None:
            dataset.loader_batch = int(batch)  # the samples are dealt by this loader's batches
        super().__init__(dataset, **kwargs)
        self.transport = transport
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available to this torch ({torch.__version__})")
        self._ring: Ring | None = None
        self._taken = self._items = self._in_item = 0  # batches, items (one or a pack of batches), in the item
        self._packed = False
        self._start = 0  # the position this iteration started at (a loaded state's)
        self._finished = False  # this iteration read its epoch to the end
        self._epoch: int | None = None
        self._running: Callable[[], Any] = lambda: None  # the latest DataLoader iterator (a weak reference)

    def _ring_for(self, ds: SampleCacheDataset) -> Ring | None:
        """A shared-memory ring for the batched path with forked workers (else None)."""
        ctx = self.multiprocessing_context
        method = ctx.get_start_method() if ctx is not None else mp.get_start_method()
        if not self.transport or self.num_workers == 0 or method != "fork" or not ds.batch.batch_size \
                or ds.transform is not None or self.batch_size is not None:
            return None
        if self._ring is None:
            plan = ds.plan(ds.next_epoch())
            per_sample = max(1, int(plan.manifest.get("bytes", 0)) // max(1, plan.total))
            pack = max(1, min(MAX_PACK, PACK_BYTES // (per_sample * ds.batch.batch_size)))
            if ds.collate_rest and any(plan.schema.columns[c].kind != "fixed" for c in plan.cols):
                pack = 1  # such columns are collated batch by batch in the worker
            slot = int(per_sample * ds.batch.batch_size * pack * 1.25) + 64 * (len(plan.cols) + 1) + 4096
            self._ring = Ring(self.num_workers, (self.prefetch_factor or 2) + 2, slot, pack)
        return self._ring

    def _pack(self) -> int:
        return self._ring.pack if self._ring is not None else 1

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        host = self._host_batches()
        device = self.device
        if device is None:
            items: Iterator[tuple[Any, Any]] = host
        elif device.type == "cuda":
            items = cuda_ahead(host, device)
        else:
            items = ((_moved(b, device, False), at) for b, at in host)
        try:
            for batch, at in items:
                self._taken, self._items, self._in_item = at  # the consumer's count, not the read-ahead's
                yield batch
        finally:
            items.close()  # type: ignore[attr-defined]
            host.close()  # type: ignore[attr-defined]  # its workers and lease go now, not when collected

    def _host_batches(self) -> Iterator[tuple[Any, tuple[int, int, int]]]:
        """(batch, (batches, items, batches of the item) handed out once it is)."""
        ds: SampleCacheDataset = self.dataset  # type: ignore[assignment]
        core = ds.reader  # the caller's dataset and its batching copy share it (and a loaded resume state)
        resume = core.pending
        epoch = ds.next_epoch()
        if self.persistent_workers and self.num_workers > 0 and self._iterator is not None:
            # The running workers fetched and leased this epoch ahead and read it without the daemon: here
            # (for state_dict) its manifest is fetched in the background, so the boundary never waits on it.
            core.source.prefetch_next(epoch, "main process", lease=False)
        else:
            ds.plan(epoch)  # mapped (or refused, e.g. EpochGone) here, before the workers fork (they inherit it)
        if core.agreed(epoch) is None:
            ds.agree(epoch)  # several hosts: every rank makes the same number of steps
        ds.ring = self._ring_for(ds)
        self._packed = ds.ring is not None and self._pack() > 1  # the workers send packs of batches
        it = self._in_process(ds) if self._direct() else super().__iter__()
        self._running = weakref.ref(it)
        ds.ring = None  # the workers have forked with it; a plain DataLoader later must not see it
        self._taken = self._items = self._in_item = 0
        self._epoch = None
        self._start, self._finished = 0, False
        taken = items = 0
        try:
            for item in it:
                if self._epoch is None:
                    self._epoch = ds.current_epoch()
                    if resume is not None and resume.epoch == self._epoch:
                        self._start = resume.position
                got = materialize(item)
                batches = got if isinstance(got, Packed) else (got,)
                for j, batch in enumerate(batches):
                    taken += 1
                    yield batch, (taken, items, j + 1)
                items += 1
            if self._epoch is None:  # an epoch with nothing left for this rank
                self._epoch = epoch
                self._start = resume.position if resume is not None and resume.epoch == epoch else 0
            self._finished = True
        finally:
            core.pending = None

    def _direct(self) -> bool:
        """Whether the batches come straight from the dataset: no workers, nothing to pin, and the dataset
        makes the batches (DataLoader's own loop adds ~20 us a batch: a fifth of a small batch's time)."""
        return (self.num_workers == 0 and not self.pin_memory and self.batch_size is None
                and self.collate_fn is default_convert and isinstance(self.dataset, SampleCacheDataset))

    def _in_process(self, ds: SampleCacheDataset) -> Iterator[Any]:
        """What DataLoader's in-process loop yields for ``batch_size=None``: each item through ``default_convert``
        (a batch of tensors only needs no conversion)."""
        items = iter(ds)
        try:
            for item in items:
                if isinstance(item, dict) and all(type(v) is torch.Tensor for v in item.values()):
                    yield item
                else:
                    yield default_convert(item)
        finally:
            items.close()  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        """Where the job stands in the current epoch, for ``load_state_dict`` in a new process, on any topology:
        the batches this rank's loop took, as a position of the epoch's global order (every rank took as many:
        DDP steps in lockstep, so rank 0's state is the whole job's)."""
        ds: SampleCacheDataset = self.dataset  # type: ignore[assignment]
        if self._epoch is None:  # nothing read yet: the pending resume point, or the next epoch's start
            r = ds.reader.pending
            if r is not None:
                return {**ds.reader.state(r.epoch, r.position).to_dict(), "batches": 0}
            return {**ds.reader.state(ds.next_epoch(), 0).to_dict(), "batches": 0}
        pos = ds.position(self._epoch)
        if self._finished:
            at = ds.reader.end(self._epoch, pos, self._start)
        else:
            at = ds.reader.position_after(self._epoch, pos, self._start, self._taken, self._per_batch())
        return {**ds.reader.state(self._epoch, at).to_dict(), "batches": self._taken}

    def _per_batch(self) -> int:
        """Samples of one full batch handed out."""
        ds: SampleCacheDataset = self.dataset  # type: ignore[assignment]
        return (ds.batch.batch_size or 1) * (self.batch_size or 1)

    def close(self) -> None:
        """Stop the worker processes and release every lease of the dataset now (the one taken ahead for
        the next epoch too). Dropping the loader and its dataset does the same, later."""
        for it in (self._iterator, self._running()):
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._iterator = None
        self.dataset.close()  # type: ignore[attr-defined]
        self._source.close()

    def __enter__(self) -> "SampleCacheLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on where a saved state stood (saved by any rank of any topology, with any batch size): the next
        iteration reads the rest of its epoch, dealt over this run's ranks and workers."""
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
