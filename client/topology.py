"""Where a reader sits in the job: its global rank and world size, and its rank among its host's ranks.

torch.distributed is the source in the main process; inside DataLoader workers (where it is not usable)
the torchrun environment is.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch.distributed as dist
from torch.utils.data import get_worker_info


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised here, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Topology(NamedTuple):
    """Where this reader sits: global rank/world and its rank among the ranks of its host."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))


def topology(saved: Topology | None = None) -> Topology:
    """torch.distributed in the main process; in DataLoader workers (where it is not usable) the
    torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), else what the main
    process saw when the dataset was made or the loader started."""
    if get_worker_info() is None and dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        env = _env_topology()
        if env is not None and env.rank == rank and env.world == world:
            return env
        return Topology(rank, world, rank, world)
    env = _env_topology()
    if env is not None:
        return env
    return saved or Topology(0, 1, 0, 1)


def _env_topology() -> Topology | None:
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return Topology(rank, world, local_rank, local_world)
