"""The failures of remote units, as the scheduler keeps them: failures in a row per unit (given up for the pass after
MAX_UNIT_ATTEMPTS), unparsable reads in a row (a file is quarantined after CORRUPT_CONFIRMATIONS), units a part of
which did not get into the cache (sampled again until every part is), and counts by kind for status and metrics.

Pure bookkeeping on the scheduler's thread: the scheduler decides what each answer means (retry, quarantine, give up).
"""

from __future__ import annotations

import collections

MAX_UNIT_ATTEMPTS = 8     # failures in a row before a unit is given up for this pass (tried again next pass)
CORRUPT_CONFIRMATIONS = 2  # unparsable bytes twice in a row (a fresh read each time) before a file is quarantined

Unit = tuple[str, int]  # (file path, row group)


class UnitFailures:
    def __init__(self) -> None:
        self.by_kind: collections.Counter[str] = collections.Counter()  # unreachable | transient | corrupt | ...
        self.units_given_up = 0  # units that failed MAX_UNIT_ATTEMPTS times in a row (retried the next pass)
        self.given_up: set[Unit] = set()  # those not sampled since: coverage leaves them out
        self._attempts: dict[Unit, int] = collections.defaultdict(int)
        self._corrupt: dict[Unit, int] = collections.defaultdict(int)
        # units with a part that failed to ingest while others are resident: sampled again (resident parts are
        # skipped by their keys) until every part is in, and never "resident" meanwhile
        self._incomplete: set[Unit] = set()
        self._part_failed: set[str] = set()  # task keys of this round whose part failed: not done with the last

    def attempts(self, unit: Unit) -> int:
        return self._attempts.get(unit, 0)

    def incomplete(self, unit: Unit) -> bool:
        return unit in self._incomplete

    def sampled(self, unit: Unit, task_key: str) -> None:
        """A sampler read the unit: its failed reads in a row end (its failed ingests still count), and a new round
        of its parts begins."""
        if unit not in self._incomplete:
            self._attempts.pop(unit, None)
        self._corrupt.pop(unit, None)
        self.given_up.discard(unit)
        self._part_failed.discard(task_key)

    def not_a_read(self, unit: Unit) -> None:
        """A failure that read none of the file's bytes (the remote unreachable, the local disk full): it breaks a
        run of unparsable reads."""
        self._corrupt.pop(unit, None)

    def failed_read(self, unit: Unit, unparsable: bool) -> int:
        """A read failed; returns the unparsable reads in a row (0 when this one was not unparsable)."""
        self._attempts[unit] += 1
        if not unparsable:
            self._corrupt.pop(unit, None)
            return 0
        self._corrupt[unit] += 1
        return self._corrupt[unit]

    def quarantined(self, unit: Unit) -> None:
        self._corrupt.pop(unit, None)
        self._attempts.pop(unit, None)

    def exhausted(self, unit: Unit) -> bool:
        return self._attempts.get(unit, 0) >= MAX_UNIT_ATTEMPTS

    def give_up(self, unit: Unit) -> None:
        """Stop retrying ``unit`` for this pass; coverage leaves it out until it is sampled again."""
        self._attempts.pop(unit, None)
        self.units_given_up += 1
        self.given_up.add(unit)

    def ingest_failed(self, unit: Unit, task_key: str, kind: str) -> bool:
        """A staged part of ``unit`` could not be ingested. Returns whether this is the round's first such part:
        the unit is retried once per round, however many of its parts failed."""
        self.by_kind[kind] += 1
        self._incomplete.add(unit)
        if task_key in self._part_failed:
            return False
        self._part_failed.add(task_key)
        self._attempts[unit] += 1
        return True

    def all_parts_in(self, unit: Unit, task_key: str) -> bool:
        """The round's last part is in: whether every part of the unit is (none of this round failed)."""
        if task_key in self._part_failed:
            self._part_failed.discard(task_key)  # an earlier part failed: its retry samples the unit again
            return False
        self._incomplete.discard(unit)
        self._attempts.pop(unit, None)
        return True
