"""``samplecache.tf``: the cache as a ``tf.data.Dataset`` of dicts of tensors (the TensorFlow adapter).

    import samplecache.tf as sctf
    ds = sctf.dataset("http://127.0.0.1:8750", columns=["image", "label"], batch_size=256)
    model.fit(ds.map(lambda b: (b["image"], b["label"])), epochs=10)   # each epoch: the job's next epoch

Batches come whole from the core (``Reader.batches``: one vectorised gather per batch, read ahead by a thread)
through ``tf.data.Dataset.from_generator`` with an ``output_signature`` made from ``GET /v1/schema``, so a
batch costs one Python call, not one per sample; with fixed-shape columns only, one call hands over a chunk of
batches stacked [k, B, ...] that ``unbatch()`` cuts in C++ (TensorFlow's generator costs ~0.4 ms an element).

Column -> tensor (the ``element_spec``, ``B`` = the batch dimension: ``batch_size`` with ``drop_last``, else
``None``):

* fixed shape (numbers, bool): ``TensorSpec([B, *shape], dtype)``; timestamps and durations as int64 counts of
  their unit;
* ``string`` and ``binary``: ``TensorSpec([B], tf.string)`` (UTF-8 bytes for strings, a uuid's 16 bytes);
* variable shape (``list`` columns, shape with -1): ``RaggedTensorSpec([B, *dims], dtype)``, ragged up to the
  last variable dimension (the dimensions before it are ragged too; the ones after it stay fixed);
* ``nested`` (structs, maps, decimals, lists of strings): no tensor form. ``columns=None`` leaves them out
  (``Feed.left_out`` says why); naming one is a ``TypeError``.

Nulls are never silently replaced: a column named in ``masks`` (or every nullable column with ``masks=True``)
gets ``<name>__valid`` (bool, the column's batch shape for fixed columns, ``[B]`` for the others) and 0 / NaN /
``b""`` / an empty row under the nulls; a null in any other column stops the iteration with an error naming it.

Epochs: each iteration of the dataset (each Keras epoch) reads the job's next epoch; ``epoch=N`` reads job
epoch N at every iteration. Sharding: ``input_context`` (``tf.distribute.InputContext``) maps input pipeline
``i`` of ``n`` to rank ``i`` of ``n`` of the core's split (every sample of an epoch once over the pipelines;
``partial`` pads or drops so that every pipeline makes the same steps). Pipelines made from one ``Feed`` share
its job and epoch clock; processes (multi-worker training) share a job through ``job=`` and ``run=``.
Resume: ``Feed.state(batches)`` after ``batches`` batches of the current epoch, ``Feed.load_state(state)``
(or ``resume=``) on restart: the next iteration reads the rest of that epoch.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

try:
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    raise ImportError('samplecache.tf needs TensorFlow: pip install "samplecache[tf]" (tensorflow-cpu), '
                      f'or install tensorflow yourself ({e})') from e

from samplecache.core import (
    BatchOptions,
    CacheOptions,
    EpochPlan,
    MissingColumn,
    Options,
    Position,
    Reader,
    ResumeState,
    SplitOptions,
    epoch_number,
)
from samplecache.format.record import Column
from samplecache.reading.blocks.bufferpool import ALIGN  # noqa: F401 (ALIGN: re-exported)
from samplecache.reading.blocks.bufferpool import BufferPool as Buffers
from samplecache.reading.blocks.gather import default_threads
from samplecache.reading.blocks.reader import VALID_SUFFIX
from samplecache.reading.epoch_source import check_columns

__all__ = ["Feed", "dataset", "element_spec", "MissingColumn"]


# -- the element spec --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Col:
    """How one cache column becomes a tensor."""

    name: str
    form: str                 # "fixed" | "string" | "ragged"
    dtype: Any                # tf.DType
    shape: tuple[int | None, ...]  # per sample; None where ragged
    ragged_rank: int = 0      # "ragged": the per-sample dimensions that are ragged
    masked: bool = False      # <name>__valid in the element

    def spec(self, batch: int | None) -> dict[str, tf.TypeSpec]:
        if self.form == "ragged":
            out: dict[str, tf.TypeSpec] = {self.name: tf.RaggedTensorSpec(
                [batch, *self.shape], self.dtype, ragged_rank=self.ragged_rank)}
        else:
            out = {self.name: tf.TensorSpec([batch, *self.shape], self.dtype)}
        if self.masked:
            shape = [batch, *self.shape] if self.form == "fixed" else [batch]
            out[self.name + VALID_SUFFIX] = tf.TensorSpec(shape, tf.bool)
        return out


def _tensor_form(col: Column, masked: bool) -> _Col | str:
    """The tensor form of ``col``, or why it has none."""
    if col.kind in ("string", "binary"):
        return _Col(col.name, "string", tf.string, (), masked=masked)
    if col.kind == "nested":
        return f"{col.arrow or 'a nested type'}: no tensor form (read it with samplecache.core.Reader.samples)"
    dtype = np.dtype(col.dtype or "<f4")
    if dtype.kind in "Mm":
        dtype = np.dtype("<i8")  # the core's batches: int64 counts of the unit
    try:
        tf_dtype = tf.as_dtype(dtype)
    except TypeError:
        return f"dtype {dtype} has no TensorFlow dtype"
    if col.kind == "fixed":
        return _Col(col.name, "fixed", tf_dtype, tuple(int(d) for d in col.shape), masked=masked)
    last = max(i for i, d in enumerate(col.shape) if d < 0)
    shape = tuple(None if i <= last else int(d) for i, d in enumerate(col.shape))
    return _Col(col.name, "ragged", tf_dtype, shape, ragged_rank=last + 1, masked=masked)


def _plan_columns(schema: Mapping[str, Any], named: bool, masks: bool | Sequence[str]
                  ) -> tuple[list[_Col], dict[str, str]]:
    """The columns' tensor forms (and the left-out ones with why) from a ``/v1/schema`` answer."""
    cols = [Column.from_json(c) for c in schema["columns"]]
    if not isinstance(masks, bool):
        check_columns(list(masks), [c.name for c in cols], schema.get("skipped_columns"))
    forms, left_out = [], {}
    for col in cols:
        masked = (col.nullable if masks is True else False) if isinstance(masks, bool) else col.name in masks
        got = _tensor_form(col, masked)
        if isinstance(got, str):
            if named:
                raise TypeError(f"column {col.name!r} ({got}); leave it out of columns=")
            left_out[col.name] = got
        else:
            forms.append(got)
    return forms, left_out


def element_spec(schema: Mapping[str, Any], batch_size: int | None = None,
                 masks: bool | Sequence[str] = False) -> dict[str, tf.TypeSpec]:
    """The ``element_spec`` of the batches of a ``/v1/schema`` answer (every column with a tensor form);
    ``batch_size``: the static batch dimension (None: unknown)."""
    forms, _ = _plan_columns(schema, False, masks)
    return {k: v for c in forms for k, v in c.spec(batch_size).items()}


# -- a core batch as tensors --------------------------------------------------------------------------------
def _null_error(name: str) -> ValueError:
    return ValueError(f"column {name!r} holds a null in this batch: read it with masks=[{name!r}] (or masks=True) "
                      f"to get {name + VALID_SUFFIX!r} beside it")


def _ragged(col: _Col, values: list[Any]) -> tuple[tf.RaggedTensor, np.ndarray]:
    """A list of per-sample arrays (None: null) as one RaggedTensor: the flat values and row lengths."""
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    fixed = tuple(d for d in col.shape[col.ragged_rank:])
    cells = []
    for v in values:
        a = np.zeros((0,) * col.ragged_rank + fixed, col.dtype.as_numpy_dtype) if v is None else v
        if not isinstance(a, np.ndarray) or a.ndim != len(col.shape):
            raise ValueError(f"column {col.name!r}: a cell with null elements or ragged nesting ({type(a).__name__})"
                             f" has no tensor form")
        cells.append(a)
    shapes = np.array([a.shape[:col.ragged_rank] for a in cells], np.int64).reshape(len(cells), col.ragged_rank)
    lengths, counts = [], np.ones(len(cells), np.int64)
    for j in range(col.ragged_rank):
        lengths.append(np.repeat(shapes[:, j], counts))
        counts = counts * shapes[:, j]
    flat = (np.concatenate([a.reshape((-1,) + fixed) for a in cells]) if cells
            else np.zeros((0,) + fixed, col.dtype.as_numpy_dtype))
    return tf.RaggedTensor.from_nested_row_lengths(flat, lengths, validate=False), valid


def _convert(cols: list[_Col], batch: dict[str, Any]) -> dict[str, Any]:
    """One core batch (numpy arrays and lists) as the element: arrays stay as they are (TensorFlow takes them
    whole), lists become string / ragged tensors; nulls only where masks are asked for."""
    out: dict[str, Any] = {}
    for col in cols:
        v, name = batch[col.name], col.name
        valid_name = name + VALID_SUFFIX
        if col.form == "fixed":
            out[name] = v
            mask = batch.get(valid_name)
            if col.masked:
                out[valid_name] = mask if mask is not None else np.ones(v.shape, bool)
            elif mask is not None and not mask.all():
                raise _null_error(name)
        elif col.form == "string":
            valid = np.fromiter((x is not None for x in v), bool, len(v))
            if not col.masked and not valid.all():
                raise _null_error(name)
            # a uuid column's cells are uuid.UUID: tf.string takes their 16 bytes
            out[name] = np.array([b"" if x is None else x.bytes if isinstance(x, uuid.UUID) else x for x in v],
                                 dtype=object)
            if col.masked:
                out[valid_name] = valid
        else:
            out[name], valid = _ragged(col, v)
            if not col.masked and not valid.all():
                raise _null_error(name)
            if col.masked:
                out[valid_name] = valid
    return out


def _stack(batch: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """``k`` batches' rows [k x B, ...] as [k, B, ...] (views)."""
    return {name: v.reshape((k, len(v) // k) + v.shape[1:]) for name, v in batch.items()}


# -- the feed ---------------------------------------------------------------------------------------------
def _position(input_context: Any, position: Position | None) -> Position:
    if position is not None:
        return position
    if input_context is None:
        return Position()
    n, i = int(input_context.num_input_pipelines), int(input_context.input_pipeline_id)
    return Position(rank=i, world=n, local_rank=i, local_world=n)


class Feed:
    """One job read as ``tf.data`` datasets: the core's ``Reader``, the element spec and where each pipeline stands.

    ``dataset(input_context=...)`` may be called once per input pipeline (e.g. from the function given to
    ``strategy.distribute_datasets_from_function``): the pipelines share this feed's job and epoch clock.
    """

    def __init__(self, url: str | None = None, columns: Sequence[str] | None = None, *,
                 masks: bool | Sequence[str] = False, run: str | None = None,
                 resume: ResumeState | Mapping[str, Any] | None = None, cache: CacheOptions | None = None,
                 split: SplitOptions | None = None, batch: BatchOptions | None = None, **options: Any) -> None:
        """``columns`` None: every column with a tensor form. ``masks``: the columns (True: every nullable one)
        that come with ``<name>__valid``. ``job``/``run``: processes of one multi-worker run pass the same
        two (default: a new job and run). ``options``: the fields of the core's ``CacheOptions``,
        ``SplitOptions`` and ``BatchOptions`` by name (``batch_size`` is needed), over the objects when given.
        Raises ``MissingColumn`` for a column the cache lacks."""
        opts = Options.from_keywords("Feed", {"url": url, "columns": columns, **options}, cache=cache, split=split,
                                     batch=batch, fixed={"masks": True}, batched=True)
        self.batch = opts.batch
        self.reader = Reader(opts.cache, opts.split, run=run)
        self.schema = self.reader.schema()  # MissingColumn here, naming the column
        named = opts.cache.columns is not None
        self._cols, self.left_out = _plan_columns(self.schema, named, masks)
        if not self._cols:
            raise ValueError(f"no column with a tensor form to read (left out: {self.left_out})")
        if not named and self.left_out:  # read only the columns that have a tensor form
            self.reader.close()
            self.reader = Reader(replace(opts.cache, columns=[c.name for c in self._cols]), opts.split,
                                 run=self.reader.source.run)
        static = self.batch.batch_size if self.batch.drop_last else None
        self.element_spec = {k: v for c in self._cols for k, v in c.spec(static).items()}
        self._lock = threading.Lock()
        self._pending: ResumeState | None = None  # the loaded state: every pipeline's start in its epoch
        self._resumed: set[int] = set()  # pipelines that started from it
        self._at: dict[int, tuple[int, int]] = {}  # pipeline -> (epoch, first sample) of its current iteration
        self._iterations: dict[int, int] = {}  # pipeline -> iterations started (the epoch clock's key)
        if resume is not None:
            self.load_state(resume)

    @property
    def job(self) -> str:
        """The job this feed reads as."""
        return self.reader.job

    def set_epoch(self, epoch: int) -> None:
        """Read job epoch ``epoch`` at the next iteration (later iterations go on from there)."""
        self.reader.set_epoch(epoch)

    def dataset(self, input_context: Any = None, *, epoch: int | None = None,
                position: Position | None = None) -> tf.data.Dataset:
        """The batches of one input pipeline (``input_context``: a ``tf.distribute.InputContext``; None: the
        only one). ``epoch``: read that job epoch at every iteration (default: the next one each time).
        ``position``: the core's Position instead (several hosts, each with its own cache: with ``agreed``)."""
        pos = _position(input_context, position)
        fixed = None if epoch is None else epoch_number(epoch)
        if all(c.form == "fixed" for c in self._cols):
            # fixed shapes only: the generator hands over a chunk of batches at once, stacked [k, B, ...], and
            # unbatch() cuts it in TensorFlow's C++ (from_generator costs ~0.4 ms an element here: per batch,
            # that bounded a short epoch)
            stacked = {k: tf.TensorSpec([None, *v.shape], v.dtype) for k, v in self.element_spec.items()}
            return tf.data.Dataset.from_generator(lambda: self._generate(pos, fixed, stacked=True),
                                                  output_signature=stacked).unbatch()
        return tf.data.Dataset.from_generator(lambda: self._generate(pos, fixed),
                                              output_signature=self.element_spec)

    def _generate(self, pos: Position, fixed: int | None, stacked: bool = False) -> Iterator[dict[str, Any]]:
        """The elements of one iteration: batches, or with ``stacked`` chunks of whole batches [k, B, ...] (a
        short last batch alone, [1, n, ...])."""
        pipe = pos.rank
        with self._lock:
            n = self._iterations.get(pipe, 0)
            self._iterations[pipe] = n + 1
        epoch = fixed if fixed is not None else self.reader.take_epoch(key=(-2, n))
        with self._lock:
            pending = self._pending
            # every pipeline, however many there are now, goes on from the loaded position (once each)
            resumed = pending is not None and pending.epoch == epoch and pipe not in self._resumed
            if resumed:
                self._resumed.add(pipe)
        start = self.reader.resume_point(epoch, pos, consume=False) if resumed else 0  # checked: the same epoch
        with self._lock:
            self._at[pipe] = (epoch, start)
        buffers, b = Buffers(), self.batch.checked_batch_size()
        threads = self.batch.copy_threads or default_threads()

        def gather(plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, unit: int
                   ) -> Iterator[tuple[int, dict[str, Any]]]:  # the core's gather_batches, into Buffers
            got = plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols, buffers.alloc,
                                    threads, masks=True)
            n = len(idx)
            if stacked:
                try:  # a group is whole batches, or the short last batch alone
                    yield n, _stack(_convert(self._cols, got), max(1, n // b) if n % b == 0 else 1)
                    return
                except ValueError:
                    pass  # a null: the batches before it go out one by one, then the error
            for a in range(0, n, b):
                one = {k: v[a:a + b] for k, v in got.items()}
                yield min(b, n - a), _stack(_convert(self._cols, one), 1) if stacked else one

        items = self.reader.iterate(epoch, pos, start, self.batch, gather=gather)
        try:
            for _, batch in items:
                yield batch if stacked else _convert(self._cols, batch)
        finally:
            items.close()  # type: ignore[attr-defined]  # the lease goes now, not when collected

    def count(self, epoch: int, input_context: Any = None, position: Position | None = None) -> int:
        """Samples one pipeline reads in job epoch ``epoch`` (``steps = ceil(count / batch_size)``)."""
        return self.reader.count(epoch, _position(input_context, position))

    # -- resuming -------------------------------------------------------------------------------------
    def state(self, batches: int, input_context: Any = None, position: Position | None = None) -> ResumeState:
        """Where the job stands after the training loop took ``batches`` batches of a pipeline's current iteration
        (``tf.data`` reads ahead, so the loop's count is the one that matters; every pipeline takes as many per
        step, so one pipeline's state is the whole job's): save ``to_dict()``; it resumes with any number of
        pipelines and any batch size."""
        pos = _position(input_context, position)
        with self._lock:
            at = self._at.get(pos.rank)
        if at is None:
            raise RuntimeError("this pipeline has not started reading: there is no position to save")
        epoch, start = at
        done = self.reader.position_after(epoch, pos, start, int(batches), self.batch.checked_batch_size())
        state = self.reader.state(epoch, done)
        state.extra.update({"adapter": "tf", "pipelines": pos.world, "pipeline": pos.rank})
        return state

    def load_state(self, state: ResumeState | Mapping[str, Any]) -> None:
        """Take the saved job over (a state saved by any adapter, pipeline or topology); every pipeline reads its
        share of the rest of the saved epoch at its next iteration."""
        self.reader.load_state(state)
        loaded = self.reader.pending
        with self._lock:
            self._pending, self._resumed = loaded, set()
            self._iterations.clear()

    def close(self) -> None:
        """Release the leases now (also done when the feed is dropped)."""
        self.reader.close()

    def __enter__(self) -> "Feed":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dataset(url: str | None = None, columns: Sequence[str] | None = None, *, input_context: Any = None,
            epoch: int | None = None, **options: Any) -> tf.data.Dataset:
    """``Feed(url, columns, **options).dataset(input_context, epoch=epoch)``: a ``tf.data.Dataset`` of dicts of
    tensors (``batch_size=`` is needed); the feed is at ``.samplecache_feed`` (for ``state()``)."""
    feed = Feed(url, columns, **options)
    ds = feed.dataset(input_context, epoch=epoch)
    ds.samplecache_feed = feed
    return ds
