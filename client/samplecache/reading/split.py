"""The split of an epoch (pure functions): who reads (``Position``), the epoch's one global order under the split
(one source's ``EpochOrder``, or a mixture's ``MixedOrder``), where the ranks' reading ends, and the stream of
samples one rank's worker reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samplecache.reading.epoch_source import EpochPlan
from samplecache.reading.options import SplitOptions
from samplecache.reading.ordering.deal import epoch_end, rank_batches, single_rank_items, worker_batches
from samplecache.reading.ordering.mixture import MixedOrder, mixture_counts
from samplecache.reading.ordering.order import EpochOrder, GlobalOrder
from samplecache.reading.ordering.stream import Stream

LOOSE_RUN = 256  # samples per worker turn when no batch size is known (a plain DataLoader), at most a read chunk


@dataclass(frozen=True)
class Position:
    """Who reads: this process's share of an epoch. ``rank``/``world`` over all hosts, ``local_rank`` /
    ``local_world`` on this host (each host splits its own manifest), ``worker``/``workers`` the data-loading
    workers of this rank; ``agreed``: with several hosts, the samples per rank agreed for the epoch (the
    largest host's count with ``pad``, the smallest with ``drop``), so every rank makes the same steps."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    worker: int = 0
    workers: int = 1
    agreed: int | None = None

    def __post_init__(self) -> None:
        for name, of in (("rank", "world"), ("local_rank", "local_world"), ("worker", "workers")):
            if not 0 <= getattr(self, name) < getattr(self, of):
                raise ValueError(f"{name} {getattr(self, name)} is not in [0, {of}={getattr(self, of)})")

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))


class MissingSource(LookupError):
    """A mixture names a source the epoch holds no sample of."""


def check_mixture(plan: EpochPlan, split: SplitOptions) -> None:
    """Raise ``MissingSource`` when ``split``'s mixture gives a share to a source with no sample in ``plan``, and
    ``MixedColumns`` when a source read cannot be read with the others."""
    if split.mixture is None:
        if plan.source_problems:
            plan.check_read(plan.source_names)  # every source is read
        return
    held = plan.source_rows()
    weighted = [n for n, w in split.mixture.items() if w > 0]
    missing = [n for n in weighted if not held.get(n)]
    if missing:
        raise MissingSource(f"the mixture gives a share to source(s) {missing}, of which daemon epoch "
                            f"{plan.daemon_epoch} holds no sample; it holds {sorted(n for n in held if held[n])}")
    plan.check_read(weighted)


def epoch_total(plan: EpochPlan, split: SplitOptions) -> int:
    """The samples of ``plan``'s epoch under ``split``: the manifest's, or with a mixture its epoch's length."""
    if split.mixture is None:
        return plan.total
    check_mixture(plan, split)
    return sum(mixture_counts(plan.rows, plan.source_of, plan.source_names, split.mixture,
                              split.epoch_samples).values())


def order_of(plan: EpochPlan, split: SplitOptions, stratum: int = 0) -> GlobalOrder:
    """``plan``'s epoch's one global order under ``split`` (made once per plan and process). With a mixture, a
    stratified epoch's block is ``split.stratum``, else ``stratum`` (the global batch of the reading)."""
    if split.mixture is None:
        key: tuple[Any, ...] = (split.seed, split.shuffle, split.shuffle_buffer)
        got = plan.orders.get(key)
        if got is None:
            check_mixture(plan, split)
            got = plan.orders[key] = EpochOrder(plan.ids, plan.rows, split.seed, plan.epoch, split.shuffle,
                                                split.shuffle_buffer)
        return got  # type: ignore[no-any-return]
    block = max(1, split.stratum or stratum) if split.mix == "stratified" else 0
    key = (split.seed, split.shuffle, split.shuffle_buffer, tuple(split.mixture.items()), split.mix, block,
           split.epoch_samples)
    got = plan.orders.get(key)
    if got is None:
        check_mixture(plan, split)
        got = plan.orders[key] = MixedOrder(plan.ids, plan.rows, plan.source_of, plan.source_names, split.mixture,
                                            split.seed, plan.epoch, split.shuffle, split.shuffle_buffer, split.mix,
                                            block, split.epoch_samples)
    return got  # type: ignore[no-any-return]


def epoch_stop(plan: EpochPlan, split: SplitOptions, pos: Position, start: int = 0) -> int:
    """Where the ranks' reading of ``plan``'s epoch from position ``start`` ends (``partial``; past the manifest's
    samples: padding). Each host deals its own manifest over its own ranks; with several hosts every rank reads
    the agreed count (``pos.agreed``)."""
    if pos.agreed is None and pos.nodes > 1 and split.partial != "uneven":
        raise RuntimeError(
            f"this job spans {pos.nodes} hosts, each with its own cache, so ranks must agree on the length of "
            f"epoch {plan.epoch} (Position.agreed): with PyTorch call ds.set_epoch(epoch) on every rank before "
            f"each epoch (after init_process_group), or iterate with samplecache.SampleCacheLoader")
    agreed = pos.agreed if split.partial != "uneven" else None
    return epoch_end(epoch_total(plan, split), start, pos.local_world, split.partial, agreed)


def rank_share(plan: EpochPlan, split: SplitOptions, pos: Position, start: int = 0) -> int:
    """Samples this rank reads from its host's manifest before hosts agree (the input of that agreement)."""
    return (epoch_end(epoch_total(plan, split), start, pos.local_world, split.partial) - start) // pos.local_world


def loose_run(plan: EpochPlan) -> int:
    """Samples a worker reads in turn when no batch size is known (a plain DataLoader over a per-sample dataset):
    runs of neighbouring positions keep LMDB locality; at most a read chunk, so every worker gets turns."""
    return min(LOOSE_RUN, plan.chunk)


def stream_for(plan: EpochPlan, split: SplitOptions, pos: Position, start: int = 0, unit: int = 1,
               pack: int = 1) -> Stream:
    """The samples ``pos`` reads in ``plan``'s epoch from position ``start``, in order: the rest of the epoch's
    global order cut into steps of ``local_world x unit`` (``unit``: samples per batch of a rank), the rank's
    batch of each step, the batches of its worker (items of ``pack`` batches, round-robin)."""
    end = epoch_stop(plan, split, pos, start)
    if pos.local_world == 1:
        batches = single_rank_items(start, end, unit, pos.worker, pos.workers, pack)
    else:
        batches = rank_batches(start, end, pos.local_rank, pos.local_world, unit)
        if pos.workers > 1:
            batches = worker_batches(batches, unit, pos.worker, pos.workers, pack)
    return Stream(order_of(plan, split, unit * pos.local_world), batches)


__all__ = ["LOOSE_RUN", "Position", "MissingSource", "check_mixture", "epoch_total", "order_of", "epoch_stop",
           "rank_share", "loose_run", "stream_for"]
