"""``samplecache.dali``: feeding NVIDIA DALI pipelines from the cache.

``DaliSource`` is a batch-mode ``fn.external_source`` callable over the core's columnar batches
(``Reader.batches``): one output per column, fixed-shape columns as numpy arrays ``[n, *shape]``, encoded images
(Hugging Face ``Image()`` cells), binary and string cells (a uuid's 16 bytes) as 1-D uint8 arrays (what
``fn.decoders.image`` takes), numeric list cells as arrays of their own shape. Each DALI shard (``shard_id`` of
``num_shards``) reads its own part of the epoch, and the source raises ``StopIteration`` at the epoch's end, so
``pipe.run()`` raises it too and ``pipe.reset()`` starts the next epoch: every sample once per epoch across the
shards.

``external_source(source)`` (inside a ``pipeline_def``) makes the ``fn.external_source`` node with the right
outputs, dtypes and dimensions and returns them by column name. README, "NVIDIA DALI".
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

try:
    from nvidia.dali import fn, types
except ImportError as e:  # pragma: no cover - the test checks it in a process without DALI
    raise ImportError('samplecache.dali needs NVIDIA DALI: pip install "samplecache[dali]" '
                      '(the nvidia-dali-cuda120 wheel, which runs CPU-only pipelines too)') from e

from samplecache.core import (
    BatchOptions,
    CacheOptions,
    MissingColumn,
    Options,
    Position,
    Reader,
    ResumeState,
    SplitOptions,
)
from samplecache.images import image_bytes
from samplecache.reading.blocks.reader import VALID_SUFFIX

Feed = Callable[[Any], Any]  # one column of a core batch -> what external_source takes for it


class UnsupportedColumn(TypeError):
    """A column DALI cannot take as tensors (strings of a nested type, maps, structs other than images...)."""


def _bytes_array(value: Any) -> np.ndarray:
    # a uuid column's cells are uuid.UUID: DALI takes their 16 bytes
    return np.frombuffer(value.bytes if isinstance(value, uuid.UUID) else value, dtype=np.uint8)


def _cells(name: str, convert: Callable[[Any], np.ndarray]) -> Feed:
    """A per-cell column as a list of arrays; a null cell is an error naming the column (DALI has no nulls)."""
    def feed(values: Sequence[Any]) -> list[np.ndarray]:
        out = []
        for j, v in enumerate(values):
            if v is None:
                raise ValueError(f"column {name!r} is null in sample {j} of this batch: DALI takes no nulls; "
                                 f"leave the column out (CacheOptions.columns) or clean the dataset")
            out.append(convert(v))
        return out
    return feed


def _is_image(node: Mapping[str, Any]) -> bool:
    """A Hugging Face ``Image()`` cell: a struct with a binary ``bytes`` field."""
    return node.get("t") == "struct" and any(n == "bytes" and f.get("t") == "binary" for n, f in node["fields"])


def _list_leaf(node: Mapping[str, Any]) -> tuple[str | None, int]:
    """The primitive dtype under a (nested) list type and its depth, or (None, depth) when it is not numeric."""
    depth = 0
    while node.get("t") == "list":
        node, depth = node["child"], depth + 1
    return (str(node["dtype"]) if node.get("t") == "prim" else None), depth


def column_feed(col: Mapping[str, Any], mask: bool = False) -> list[tuple[str, Any, int, Feed | None]]:
    """How one schema column (``/v1/schema``) reaches DALI: (output name, DALI dtype, ndim, feed) for the
    column and, with ``mask`` (fixed columns only), its ``<name>__valid`` mask (feed None: all valid when the
    batch has no mask). Raises ``UnsupportedColumn`` for what DALI cannot take."""
    name, kind = str(col["name"]), str(col["kind"])
    shape = tuple(int(s) for s in col.get("shape") or ())
    node = col.get("type") or {}
    if kind == "fixed":
        dtype = np.dtype(col.get("dtype") or "<f4")
        if dtype.kind in "Mm":
            dtype = np.dtype("<i8")  # datetime64/timedelta64: int64 counts of the unit (masked batches)
        out: list[tuple[str, Any, int, Feed | None]] = [(name, types.to_dali_type(dtype), len(shape),
                                                         np.ascontiguousarray)]
        if mask:
            out.append((name + VALID_SUFFIX, types.BOOL, len(shape), None))
        return out
    if kind in ("binary", "string"):
        convert = _bytes_array if kind == "binary" else (lambda s: _bytes_array(s.encode("utf-8")))
        return [(name, types.UINT8, 1, _cells(name, convert))]
    if kind == "nested" and _is_image(node):
        return [(name, types.UINT8, 1, _cells(name, lambda cell: _bytes_array(image_bytes(cell))))]
    if mask:
        raise ValueError(f"masks are for fixed-shape columns; {name!r} is a {kind} column (a null in it is an "
                         f"error)")
    leaf, depth = _list_leaf(node) if kind in ("list", "nested") else (None, 0)
    if leaf is not None and np.dtype(leaf).kind in "biuf":
        dt = np.dtype(leaf)
        return [(name, types.to_dali_type(dt), depth, _cells(name, lambda v: np.asarray(v, dtype=dt)))]
    raise UnsupportedColumn(
        f"column {name!r} ({kind}, {col.get('arrow') or node.get('t')}) cannot be fed to DALI, which takes "
        f"numeric tensors and encoded bytes: leave it out (CacheOptions.columns)")


class DaliSource:
    """A batch-mode ``fn.external_source`` callable that reads the cache (``external_source(source)`` makes
    the node). Each call returns the next batch, one entry per output (``outputs``); at the end of this
    shard's part of the epoch it raises ``StopIteration``. DALI calls it with ``BatchInfo`` (``batch_info=
    True``) or the iteration number; iteration 0 (and the first call after an epoch ended) starts the next
    epoch of the job.

    ``shard_id``/``num_shards`` split every epoch like DALI's readers (each shard reads a contiguous part of
    the shuffled epoch; with ``partial="pad"`` every shard the same number of samples). Shards in several
    processes (one per GPU) must read the same job epochs: give them all the same ``run`` (and ``job``).
    ``position`` replaces the shard split (several hosts: ``Position.agreed``). ``masks``: fixed-shape columns
    that may hold nulls, each followed by a ``<name>__valid`` bool output (NaN / 0 under the nulls in the
    column's own output); a null anywhere else is an error naming the column (DALI has no nulls)."""

    def __init__(self, cache: CacheOptions | None = None, batch_size: int | None = None, *, shard_id: int = 0,
                 num_shards: int = 1, run: str | None = None, position: Position | None = None,
                 masks: Sequence[str] = (), split: SplitOptions | None = None, batch: BatchOptions | None = None,
                 **options: Any) -> None:
        """``options``: the fields of ``CacheOptions``, ``SplitOptions`` and ``BatchOptions`` by name
        (``drop_last``, ``prefetch``, ``copy_threads``...), over the objects when given; ``batch_size`` is
        needed."""
        if num_shards > 1 and run is None and position is None:
            raise ValueError(
                "with num_shards > 1 every shard must read the same job epochs: pass the same run=... (any string, "
                "e.g. your launcher's job id) to the DaliSource of every shard")
        opts = Options.from_keywords("DaliSource", {"batch_size": batch_size, **options}, cache=cache, split=split,
                                     batch=batch, fixed={"masks": True}, batched=True)
        self.position = position or Position(rank=shard_id, world=num_shards, local_rank=shard_id,
                                             local_world=num_shards)
        self.batch = opts.batch
        self.reader = Reader(opts.cache, opts.split, run=run)
        try:
            columns = self.reader.schema()["columns"]  # MissingColumn now for a column the cache lacks
            unknown = sorted(set(masks) - {c["name"] for c in columns})
            if unknown:
                raise ValueError(f"masks {unknown} name columns this source does not read")
            self._outputs = [o for c in columns for o in column_feed(c, c["name"] in masks)]
        except BaseException:
            self.reader.close()
            raise
        self._batches: Iterator[dict[str, Any]] | None = None
        self._epoch: int | None = None  # the job epoch being fed
        self._start = 0  # the position it started at (resume)
        self._count = 0  # this shard's samples in that epoch
        self._sizes: list[int] = []  # samples of each batch fed in this epoch
        self._ended = False

    # -- what the pipeline sees ----------------------------------------------------------------------------
    @property
    def outputs(self) -> list[str]:
        """The output names, in order: the columns, each of ``masks`` followed by its ``<name>__valid``."""
        return [o[0] for o in self._outputs]

    @property
    def dtypes(self) -> list[Any]:
        """DALI data types of the outputs (``fn.external_source(dtype=...)``)."""
        return [o[1] for o in self._outputs]

    @property
    def ndims(self) -> list[int]:
        """Sample dimensions of the outputs (``fn.external_source(ndim=...)``); images are 1-D byte arrays."""
        return [o[2] for o in self._outputs]

    @property
    def job(self) -> str:
        return self.reader.job

    @property
    def run(self) -> str:
        """This source's run id: give it to the sources of the other shards of this training run."""
        return self.reader.source.run

    def __call__(self, info: Any = None) -> list[Any]:
        iteration = info if isinstance(info, int) else getattr(info, "iteration", None)
        if self._batches is None or (iteration == 0 and self._sizes):
            self._begin()
        assert self._batches is not None
        try:
            batch = next(self._batches)
        except StopIteration:
            self._finish(ended=True)
            raise
        unmasked = [k[:-len(VALID_SUFFIX)] for k in batch if k.endswith(VALID_SUFFIX) and k not in self.outputs]
        if unmasked:
            raise ValueError(f"column {unmasked[0]!r} holds nulls in this batch (epoch {self._epoch}): DALI takes "
                             f"no nulls; ask for its mask with DaliSource(..., masks=[{unmasked[0]!r}]), which "
                             f"adds the output {unmasked[0] + VALID_SUFFIX!r}")
        self._sizes.append(len(next(iter(batch.values()))))
        out = []
        for name, _, _, feed in self._outputs:
            if feed is None:  # a mask: the batch has one when the column holds a null in it
                got = batch.get(name)
                base = batch[name[:-len(VALID_SUFFIX)]]
                out.append(np.ascontiguousarray(got) if got is not None else np.ones(base.shape, dtype=bool))
            else:
                out.append(feed(batch[name]))
        return out

    def _begin(self) -> None:
        self._finish(ended=False)
        epoch = self.reader.take_epoch()
        start = self.reader.resume_point(epoch, self.position)
        self._epoch, self._start, self._sizes, self._ended = epoch, start, [], False
        self._count = self.reader.count(epoch, self.position, start, self.batch.checked_batch_size())
        self._batches = self.reader.batches(epoch, self.position, self.batch, start)

    def _finish(self, ended: bool) -> None:
        if self._batches is not None:
            self._batches.close()  # type: ignore[attr-defined]  # releases the epoch's lease
        self._batches, self._ended = None, ended

    # -- epochs and resuming ----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int, daemon_epoch: int | None = None) -> None:
        """Read job epoch ``epoch`` at the next epoch start (``pipe.reset()``); later epochs go on from there."""
        self.reader.set_epoch(epoch, daemon_epoch)

    def state_dict(self, consumed: int) -> dict[str, Any]:
        """Where this shard stands after the pipeline handed out ``consumed`` batches of the current epoch
        (DALI reads ``prefetch_queue_depth`` batches ahead, so the source cannot know it; 0 between epochs),
        as a ``ResumeState`` dict (README, "Resuming"). After an epoch's last batch, and between epochs, it is
        the start of the next epoch."""
        if self._epoch is None:
            epoch = self.reader.next_epoch()
            return self.reader.state(epoch, self.reader.resume_point(epoch, self.position, False)).to_dict()
        if not 0 <= consumed <= len(self._sizes):
            raise ValueError(f"consumed={consumed}, but {len(self._sizes)} batches of epoch {self._epoch} were "
                             f"fed to the pipeline")
        if sum(self._sizes[:consumed]) >= self._count or (self._ended and consumed == 0):
            # read to its end; or between epochs (the pipeline hands out a batch whenever it runs, so 0 batches
            # of an epoch that ended means the next one)
            return self.reader.state(self.reader.next_epoch(), 0).to_dict()
        # every shard of the pipeline hands out as many batches: this one's count is the whole job's
        at = self.reader.position_after(self._epoch, self.position, self._start, consumed,
                                        self.batch.checked_batch_size())
        return self.reader.state(self._epoch, at).to_dict()

    def load_state_dict(self, state: ResumeState | Mapping[str, Any]) -> None:
        """Go on where a saved state stood, at the next epoch start (build the pipeline after this, or call
        ``pipe.reset()``): the saved job is taken over, its epoch resumed at the saved sample."""
        self._finish(ended=False)
        self._epoch = None
        self.reader.load_state(state)

    # -- lifetime ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release this source's leases now (dropping it does the same)."""
        self._finish(ended=False)
        self.reader.close()

    def __enter__(self) -> "DaliSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def external_source(source: DaliSource, **kwargs: Any) -> dict[str, Any]:
    """Inside a ``pipeline_def``: the ``fn.external_source`` node fed by ``source`` (batch mode, with its
    outputs' dtypes and dimensions), as {output name: DataNode}. ``kwargs`` go to ``fn.external_source``
    (e.g. ``prefetch_queue_depth``); ``parallel=True`` is not supported (the source holds leases and reads
    ahead with threads of its own)."""
    if kwargs.get("parallel"):
        raise ValueError("samplecache.dali sources read in the pipeline's process: use parallel=False")
    nodes = fn.external_source(source=source, num_outputs=len(source.outputs), batch=True, batch_info=True,
                               dtype=source.dtypes, ndim=source.ndims, **kwargs)
    return dict(zip(source.outputs, nodes))


__all__ = ["DaliSource", "external_source", "column_feed", "UnsupportedColumn", "MissingColumn"]
