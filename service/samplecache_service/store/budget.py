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
