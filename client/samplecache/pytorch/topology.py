"""Where this process sits in the job: its global rank and world size, and its rank among its host's ranks.

torch.distributed is the source in the main process; inside DataLoader workers (where it is not usable)
the torchrun environment is.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import NamedTuple

import torch.distributed as dist
from torch.utils.data import get_worker_info

log = logging.getLogger("samplecache.topology")


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised here, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Topology(NamedTuple):
    """Where this process sits: global rank/world and its rank among the ranks of its host."""

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


def agreed_run(run: str, index: int) -> str:
    """The run id that every rank of this training run uses for its ``index``-th dataset: rank 0's (through
    torch.distributed's store) once the process group is up; before that, under torchrun, one made from
    the launch's environment (the same on every rank); else ``run`` (a single process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        key = f"samplecache/run/{index}"
        store = getattr(dist.distributed_c10d, "_get_default_store", None)
        if store is None:  # no store API: a collective (every rank makes its datasets in the same order)
            box = [run]
            dist.broadcast_object_list(box, src=0)
            return str(box[0])
        s = store()
        if s.add(key + "/n", 1) == 1:
            s.set(key, run)
        return s.get(key).decode()
    env = _env_topology()
    if env is not None and env.world > 1:
        keys = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")
        launch = "|".join(os.environ.get(k, "") for k in keys)
        if env.rank == 0:
            log.warning("samplecache: the dataset was made before torch.distributed.init_process_group, so the "
                        "ranks agree on their job through the torchrun environment (%s); a relaunch with the same "
                        "rendezvous id, address and port joins the same job. Make the dataset after "
                        "init_process_group, or pass job=", launch)
        return hashlib.sha256(f"{launch}|{index}".encode()).hexdigest()[:16]
    return run
