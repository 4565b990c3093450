"""Where a job's reading stands, as documented JSON (README, "Resuming"): one position in the epoch's topology-free
global order (``ordering/order.py``), from which the rest is dealt to whatever topology resumes (``ordering/deal.py``),
with the
epoch's mixture when it has one."""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from samplecache.format.constants import MAX_NUMBER
from samplecache.reading.options import checked_mixture

STATE_VERSION = 3  # 3: with the epoch's mixture; 2: one position in the epoch's global order (elastic); 1: per-worker
# skip counts. A state with no mixture is written as version 2, which older clients read.


def epoch_number(value: Any, name: str = "epoch") -> int:
    """``value`` as an epoch number: an int with 0 <= value < 2**53 (the epoch clock counts in int64)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < MAX_NUMBER:
        raise ValueError(f"{name} must be an int with 0 <= {name} < 2**53, not {value!r}")
    return int(value)


class StaleState(ValueError):
    """A resume state this client cannot continue exactly (saved before elastic resume: per-worker counts)."""


class ForeignState(ValueError):
    """A resume state of another job (or of another cache's epoch) than the one it is loaded into."""


@dataclass
class ResumeState:
    """Where a job's reading stands (README, "Resuming"): ``position`` samples of job epoch ``epoch``'s one global
    order were consumed by every rank together. Topology-free: any topology resumes it. ``samples`` and
    ``daemon_epoch``: the epoch's manifest when it was saved (checked at the resume; None: not read yet).
    ``to_dict()`` is plain JSON; ``from_dict`` reads it back (and refuses a version 1 state, ``StaleState``)."""

    job: str | None
    epoch: int
    position: int
    seed: int
    shuffle: bool
    shuffle_buffer: int = 0
    samples: int | None = None
    daemon_epoch: int | None = None
    version: int = 0  # 0: the version it is written as (3 with a mixture, else 2)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # keys an adapter adds (e.g. batches)
    # the epoch's mixture (None: every source, as one source reads), and how it was mixed and cut
    mixture: Mapping[str, float] | None = None
    mix: str = "random"
    epoch_samples: int | None = None
    stratum: int = 0

    def __post_init__(self) -> None:
        self.epoch = epoch_number(self.epoch, "epoch")
        self.position = epoch_number(self.position, "position")
        if not self.version:
            self.version = STATE_VERSION if self.mixture is not None else 2
        if int(self.version) > STATE_VERSION:
            raise ValueError(f"this resume state has version {self.version}; this client reads up to "
                             f"{STATE_VERSION}: install a newer samplecache")

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra"}
        if self.mixture is None:  # as version 2 wrote it: an older client reads it
            for k in ("mixture", "mix", "epoch_samples", "stratum"):
                out.pop(k)
            out["version"] = min(int(self.version), 2)  # what it holds is version 2's
        return {**self.extra, **out}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ResumeState":
        known = ("job", "epoch", "position", "seed", "shuffle", "shuffle_buffer", "samples", "daemon_epoch",
                 "version", "mixture", "mix", "epoch_samples", "stratum")
        if "position" not in d and "skip" in d:
            raise StaleState(
                f"this resume state (job {d.get('job')!r}, epoch {d.get('epoch')}) was saved by a samplecache "
                f"client older than elastic resume: it holds per-worker counts ('skip') that only the topology "
                f"that saved it can use, and this client cannot continue it exactly. Finish that epoch with the "
                f"client that saved it, or start it again from its first sample with set_epoch({d.get('epoch')}) "
                f"(its samples already trained on are read again)")
        missing = [k for k in ("epoch", "position", "seed", "shuffle") if k not in d]
        if missing:
            raise ValueError(f"not a samplecache resume state: {missing} missing")
        return cls(job=d.get("job"), epoch=d["epoch"], position=d["position"], seed=int(d["seed"]),
                   shuffle=bool(d["shuffle"]), shuffle_buffer=int(d.get("shuffle_buffer", 0)),
                   samples=None if d.get("samples") is None else int(d["samples"]),
                   daemon_epoch=None if d.get("daemon_epoch") is None else int(d["daemon_epoch"]),
                   version=int(d.get("version", 0)),
                   mixture=None if d.get("mixture") is None else checked_mixture(d["mixture"]),
                   mix=str(d.get("mix", "random")),
                   epoch_samples=None if d.get("epoch_samples") is None else int(d["epoch_samples"]),
                   stratum=int(d.get("stratum", 0)),
                   extra={k: v for k, v in d.items() if k not in known})


__all__ = ["STATE_VERSION", "epoch_number", "StaleState", "ForeignState", "ResumeState"]
