"""The seeded permutations an epoch's global order is made of (pure numpy functions).

``shard_order``: the order of the manifest's shards; ``row_order``: the order of one shard's rows. Both depend
only on (seed, epoch) and the shard, never on the topology (``order.py`` composes them; ``deal.py`` splits the
result over ranks x workers).
"""

from __future__ import annotations

import numpy as np


def _rng(seed: int, epoch: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch, *extra])


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    return _rng(seed, epoch).permutation(n_shards) if shuffle else np.arange(n_shards)


def row_order(shard_id: int, rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order rows of one shard are read in (depends only on seed, epoch, shard)."""
    return _rng(seed, epoch, 1, shard_id).permutation(rows) if shuffle else np.arange(rows)
