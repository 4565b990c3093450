"""The budget in force: what the cache may hold, the free disk it keeps, and which shards go first."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    """Shared by the scheduler, the writer's eviction and the control that changes it at run time (on the
    scheduler's thread); readers see a whole int or str, never half a change."""

    max_bytes: int
    min_free_disk: int
    policy: str


class ShareOf:
    """One named source's part of the budget in force: ``fraction`` of its bytes (it follows a change of the
    whole); the free disk kept and the policy are the whole's."""

    def __init__(self, whole: Budget, fraction: float) -> None:
        self.whole, self.fraction = whole, fraction

    @property
    def max_bytes(self) -> int:
        return int(self.whole.max_bytes * self.fraction)

    @property
    def min_free_disk(self) -> int:
        return self.whole.min_free_disk

    @property
    def policy(self) -> str:
        return self.whole.policy
