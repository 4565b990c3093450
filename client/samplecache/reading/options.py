"""What a reading of the cache is told, one object per concern; each option is declared here once.

``CacheOptions``: where the cache is and how to talk to the daemon. ``SplitOptions``: how an epoch is split and
ordered. ``BatchOptions``: how items are made (batches, or one sample at a time) and read ahead. Each validates
itself, once, when made. Every adapter takes these objects (``cache=``, ``split=``, ``batch=``) or their fields as
keyword arguments; ``Options.from_keywords`` sorts those into the objects, so no adapter declares them again.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Sequence

from samplecache.reading.ordering.deal import PARTIAL
from samplecache.reading.ordering.mixture import MIXES

DEFAULT_URL = "http://127.0.0.1:8750"


@dataclass(frozen=True)
class CacheOptions:
    """Where the cache is and how to talk to the daemon. ``token`` None: SAMPLECACHE_TOKEN, else the daemon's
    token file; ``deadline`` None: SAMPLECACHE_DEADLINE, else 60 s per call; ``retries`` None: as many as the
    deadline allows; ``min_samples``/``wait``: a process's first epoch waits up to ``wait`` s for that many cached
    samples (warm-up; later epochs do not wait);
    ``prefetch_next``: fetch and lease the next epoch's manifest when 95% of this one is read, or
    sooner when less than a second of it is left (at its pace so far)."""

    url: str = DEFAULT_URL
    columns: Sequence[str] | None = None
    job: str | None = None
    token: str | None = None
    deadline: float | None = None
    retries: int | None = None
    lease: bool = True
    min_samples: int = 1
    wait: float = 60.0
    prefetch_next: bool = True
    fill_missing: bool = False  # a column one source of a mixture lacks reads as nulls from it (else an error)

    def __post_init__(self) -> None:
        # plain numbers, whatever numeric type was given: they go into the daemon's query strings
        object.__setattr__(self, "min_samples", int(self.min_samples))
        object.__setattr__(self, "wait", float(self.wait))


@dataclass(frozen=True)
class SplitOptions:
    """How an epoch is split and ordered (``partial``: see ``samplecache.reading.ordering.partition``).
    ``mixture``: each named source's weight (normalised; None: every source in proportion to its resident samples,
    as one source reads), read as exact per-source counts per epoch (``samplecache.reading.ordering.mixture``);
    ``mix``: "random" or "stratified" (every global batch holds each source's share within one sample);
    ``epoch_samples``: the epoch's length with a mixture (None: the largest no source repeats a sample in; more
    upsamples); ``stratum``: a stratified epoch's block (0: the global batch, ranks x batch size)."""

    shuffle: bool = True
    seed: int = 0
    partial: str = "pad"
    shuffle_buffer: int = 0
    mixture: Mapping[str, float] | None = None
    mix: str = "random"
    epoch_samples: int | None = None
    stratum: int = 0

    def __post_init__(self) -> None:
        if self.mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, not {self.mix!r}")
        if self.mixture is not None:
            object.__setattr__(self, "mixture", checked_mixture(self.mixture))
        if self.epoch_samples is not None:
            if isinstance(self.epoch_samples, bool) or int(self.epoch_samples) < 1:
                raise ValueError(f"epoch_samples must be a positive integer or None, not {self.epoch_samples!r}")
            object.__setattr__(self, "epoch_samples", int(self.epoch_samples))
        if int(self.stratum) < 0:
            raise ValueError(f"stratum must be >= 0, not {self.stratum!r}")
        object.__setattr__(self, "stratum", int(self.stratum))
        if self.partial not in PARTIAL:
            raise ValueError(f"partial must be one of {PARTIAL}, not {self.partial!r}")
        if int(self.shuffle_buffer) < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, not {self.shuffle_buffer!r}")
        # stored as plain Python values: the order's seed is hashed, and a resume state compares them
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "shuffle_buffer", int(self.shuffle_buffer))


@dataclass(frozen=True)
class BatchOptions:
    """How items are made: batches of ``batch_size`` (None: one sample at a time, as PyTorch's per-sample dataset
    reads); ``masks`` adds ``<name>__valid`` bool arrays for fixed columns with nulls; ``prefetch`` items are read
    ahead by a thread (0: none); ``copy_threads`` copy a large batch (None: the usable cores, at most 4)."""

    batch_size: int | None
    drop_last: bool = False
    masks: bool = True
    prefetch: int = 2
    copy_threads: int | None = None

    def __post_init__(self) -> None:
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1):
            raise ValueError(f"batch_size must be a positive integer or None, not {b!r}")
        if self.copy_threads is not None and self.copy_threads < 1:
            raise ValueError("copy_threads must be a positive integer or None (the usable cores, at most 4)")
        if b is not None:
            object.__setattr__(self, "batch_size", int(b))
        object.__setattr__(self, "prefetch", int(self.prefetch))

    def checked_batch_size(self) -> int:
        """``batch_size``, where batches are the only items (NumPy, TensorFlow, DALI): None is refused there."""
        if self.batch_size is None:
            raise ValueError("batch_size must be a positive integer, not None")
        return self.batch_size


def checked_mixture(mixture: Mapping[str, float]) -> dict[str, float]:
    """A mixture as a plain dict of name -> weight (ValueError: not a mapping of names to weights >= 0, one > 0)."""
    if not isinstance(mixture, Mapping) or not mixture:
        raise ValueError(f"mixture must be a non-empty dict of source name -> weight, not {mixture!r}")
    out = {}
    for name, w in mixture.items():
        if not isinstance(name, str) or isinstance(w, bool) or not isinstance(w, numbers.Real) \
                or not math.isfinite(float(w)) or float(w) < 0:
            raise ValueError(f"mixture: {name!r}: {w!r} is not a weight (a finite number >= 0)")
        out[name] = float(w)
    if not any(out.values()):
        raise ValueError(f"mixture: every weight is 0 ({out}); give one source a weight > 0")
    return out


_CONCERNS: dict[str, type] = {"cache": CacheOptions, "split": SplitOptions, "batch": BatchOptions}
_FIELD_OF = {f.name: concern for concern, kind in _CONCERNS.items() for f in fields(kind)}


@dataclass(frozen=True)
class Options:
    """The three concerns of one adapter, made once from what it was given."""

    cache: CacheOptions
    split: SplitOptions
    batch: BatchOptions

    @classmethod
    def from_keywords(cls, owner: str, keywords: Mapping[str, Any], *, cache: CacheOptions | None = None,
                      split: SplitOptions | None = None, batch: BatchOptions | None = None,
                      fixed: Mapping[str, Any] | None = None, batched: bool = False) -> "Options":
        """Options from ``keywords`` (fields of the three objects; None: not given), over the objects given,
        if any, else the defaults. ``fixed``: fields ``owner`` sets itself (refused as keywords, as any unknown
        one is: Python's TypeError); ``batched``: ``owner`` makes batches only (a batch size is needed)."""
        fixed = dict(fixed or {})
        by_concern: dict[str, dict[str, Any]] = {c: {} for c in _CONCERNS}
        for name, value in keywords.items():
            if name not in _FIELD_OF or name in fixed:
                raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
            if value is not None:
                by_concern[_FIELD_OF[name]][name] = value
        for name, value in fixed.items():
            by_concern[_FIELD_OF[name]][name] = value
        given = {"cache": cache, "split": split, "batch": batch}
        made: dict[str, Any] = {}
        for concern, kind in _CONCERNS.items():
            base, changes = given[concern], by_concern[concern]
            if base is not None:
                made[concern] = replace(base, **changes) if changes else base
            else:
                # a batch size is the one field without a default: None (one sample at a time) unless given
                made[concern] = kind(**{**({"batch_size": None} if kind is BatchOptions else {}), **changes})
        if batched:
            made["batch"].checked_batch_size()
        return cls(**made)


__all__ = ["DEFAULT_URL", "CacheOptions", "SplitOptions", "BatchOptions", "Options", "checked_mixture"]
