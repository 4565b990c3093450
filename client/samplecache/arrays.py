"""``samplecache.arrays``: numpy batches for any framework (JAX, NumPy, anything that takes arrays).

A plain iterator over the core's ``Reader``: each iteration of ``NumpyBatches`` reads the job's next epoch as
dicts of column -> ``np.ndarray [n, *shape]`` (fixed-shape columns; with ``<name>__valid`` masks where they
hold nulls) or list (strings, bytes, ragged lists...); ``state_dict()`` / ``load_state_dict()`` resume an
epoch mid-way in a new process (README: "Resuming"). ``numpy_batches(...)`` is the one-call form. No
framework is imported here.

Where this process sits comes from the arguments, else from the environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, as torchrun and most launchers set them), else one process. Every process of a
run reads the job under one run id: ``run=``, else one made from the launcher's environment (torchrun, SLURM).
A job over several hosts (each with its own cache) passes ``agree(epoch, samples) -> samples``: an all-reduce over every
process (max with ``partial="pad"``, min with ``"drop"``), e.g. through ``jax.experimental.multihost_utils``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Iterator, Mapping

from samplecache.core import BatchOptions, CacheOptions, Options, Position, Reader, SplitOptions

_ENV = {"rank": "RANK", "world": "WORLD_SIZE", "local_rank": "LOCAL_RANK", "local_world": "LOCAL_WORLD_SIZE"}
DEFAULT_BATCH = 256
_LAUNCH = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
           "SLURM_RESTART_COUNT")


def launch_run(world: int) -> str | None:
    """The run id every process of this launch shares: None for one process (a new one is made), else one
    made from the launcher's environment (the same on every rank); ValueError when there is none."""
    if world <= 1:
        return None
    launch = "|".join(os.environ.get(k, "") for k in _LAUNCH)
    if not launch.strip("|"):
        raise ValueError("several processes read one job: pass run= (the same 8-32 hex digits on every rank, "
                         "e.g. broadcast from rank 0), or launch with torchrun or SLURM")
    return hashlib.sha256(launch.encode()).hexdigest()[:16]


def position_from(rank: int | None = None, world: int | None = None, local_rank: int | None = None,
                  local_world: int | None = None) -> Position:
    """A ``Position`` from the arguments, else the launcher's environment, else rank 0 of 1. Unless told,
    every rank is taken to be on one host (local rank = rank)."""
    given = {"rank": rank, "world": world, "local_rank": local_rank, "local_world": local_world}
    got: dict[str, int | None] = {}
    for name, value in given.items():
        text = os.environ.get(_ENV[name], "").strip()
        if value is None and text:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{_ENV[name]}={text!r} is not an integer") from None
        got[name] = value
    r, w = got["rank"] or 0, got["world"] or 1
    lr = got["local_rank"] if got["local_rank"] is not None else r
    lw = got["local_world"] if got["local_world"] is not None else w
    return Position(r, w, lr, lw)


class NumpyBatches:
    """Iterable over the cache's epochs as numpy batches: each ``iter()`` reads the job's next epoch
    (``set_epoch`` picks one); a context manager (``close`` releases the leases)."""

    def __init__(self, url: str | None = None, batch_size: int | None = None, *, rank: int | None = None,
                 world: int | None = None, local_rank: int | None = None, local_world: int | None = None,
                 agree: Callable[[int, int], int] | None = None, run: str | None = None,
                 cache: CacheOptions | None = None, split: SplitOptions | None = None,
                 batch: BatchOptions | None = None, **options: Any) -> None:
        """``url`` None: ``cache``'s, else http://127.0.0.1:8750; ``batch_size`` None: ``batch``'s, else 256.
        ``options``: the fields of ``CacheOptions``, ``SplitOptions`` and ``BatchOptions`` by name (``columns``,
        ``seed``, ``drop_last``...), over the objects when given."""
        if batch_size is None and batch is None:
            batch_size = DEFAULT_BATCH
        opts = Options.from_keywords("NumpyBatches", {"url": url, "batch_size": batch_size, **options},
                                     cache=cache, split=split, batch=batch, batched=True)
        self.batch = opts.batch
        self.position = position_from(rank, world, local_rank, local_world)
        self.agree = agree
        self.reader = Reader(opts.cache, opts.split, run=run or launch_run(self.position.world))
        self._at: tuple[int, int, int] | None = None  # latest iteration: (epoch, start, batches; -1: all)

    @property
    def job(self) -> str:
        return self.reader.job

    def set_epoch(self, epoch: int, daemon_epoch: int | None = None) -> None:
        """Read job epoch ``epoch`` on the next iteration (``daemon_epoch``: replay that sealed daemon epoch)."""
        self.reader.set_epoch(epoch, daemon_epoch)

    def _position(self, epoch: int) -> Position:
        pos, split = self.position, self.reader.split
        if pos.nodes > 1 and split.partial != "uneven" and self.reader.agreed(epoch) is None:
            if self.agree is None:
                raise RuntimeError(f"this job spans {pos.nodes} hosts, each with its own cache: pass agree= (an "
                                   f"all-reduce of each rank's sample count, max for pad, min for drop) so every "
                                   f"rank reads as many samples")
            self.reader.set_agreed(epoch, int(self.agree(epoch, self.reader.rank_share(epoch, pos))))
        return Position(pos.rank, pos.world, pos.local_rank, pos.local_world, agreed=self.reader.agreed(epoch))

    def __len__(self) -> int:
        """Batches in the next epoch (what is left of it, when resuming)."""
        epoch = self.reader.next_epoch()
        pos = self._position(epoch)
        b = self.batch.checked_batch_size()
        left = self.reader.count(epoch, pos, self.reader.resume_point(epoch, pos, consume=False), b)
        return left // b if self.batch.drop_last else -(-left // b)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        epoch = self.reader.take_epoch()
        pos = self._position(epoch)
        start = self.reader.resume_point(epoch, pos)
        self._at = (epoch, start, 0)
        items = self.reader.iterate(epoch, pos, start, self.batch)
        try:
            for n, (_, batch) in enumerate(items, 1):
                self._at = (epoch, start, n)
                yield batch
            self._at = (epoch, start, -1)
        finally:
            items.close()  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        """Where the job stands (README: "Resuming"): every batch handed out so far counts as read, and every
        rank handed out as many (ranks step in lockstep), so any rank's state resumes on any topology."""
        pending = self.reader.pending
        if pending is not None:
            return self.reader.state(pending.epoch, pending.position).to_dict()
        if self._at is None:
            return self.reader.state(self.reader.next_epoch(), 0).to_dict()
        epoch, start, batches = self._at
        pos = self._position(epoch)
        if batches < 0:
            return self.reader.state(epoch, self.reader.end(epoch, pos, start)).to_dict()
        at = self.reader.position_after(epoch, pos, start, batches, self.batch.checked_batch_size())
        return self.reader.state(epoch, at).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the saved job over and go on where it stood on the next iteration."""
        self.reader.load_state(state)

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "NumpyBatches":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def numpy_batches(url: str | None = None, batch_size: int | None = None, epoch: int | None = None, *,
                  epochs: int = 1, state: Mapping[str, Any] | None = None, **options: Any
                  ) -> Iterator[dict[str, Any]]:
    """The batches of ``epochs`` epochs from job epoch ``epoch`` (None: the job's next), or from where
    ``state`` stood; ``options`` as ``NumpyBatches`` takes them. The leases go when this iterator ends or is
    closed."""
    with NumpyBatches(url, batch_size, **options) as batches:
        if state is not None:
            batches.load_state_dict(state)
        elif epoch is not None:
            batches.set_epoch(epoch)
        for _ in range(epochs):
            yield from batches


__all__ = ["NumpyBatches", "numpy_batches", "position_from", "launch_run"]
