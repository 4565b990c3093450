"""Exact counts from weights: an epoch's samples per source (largest remainder, in exact arithmetic), the largest
epoch no source repeats a sample in, and how a mixture's counts spread over its chunks (random) and its blocks
(stratified). Pure functions: the same (counts, weights, seed) give the same numbers on every host."""

from __future__ import annotations

import math
from fractions import Fraction
from math import gcd
from typing import Sequence

import numpy as np

HYPERGEOMETRIC_LIMIT = 10**9  # numpy's multivariate hypergeometric draws from fewer items than this
LARGEST_SCAN = 1 << 16  # largest_epoch's search below its upper bound, at most


def rational(w: float) -> Fraction:
    """The simplest fraction the weight is the float of (0.7 -> 7/10, 1/3 -> 1/3), else its decimal: shares
    like 0.7 x 10 are then exactly 7, never 7.000000001 or 6.999999999."""
    w = float(w)
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"mixture weights must be finite and >= 0, not {w!r}")
    simple = Fraction(w).limit_denominator(10**6)
    return simple if float(simple) == w else Fraction(repr(w))


def integer_weights(weights: Sequence[float]) -> list[int]:
    """Weights as integers in the same ratios (exact arithmetic from here on)."""
    fr = [rational(w) for w in weights]
    if not any(fr):
        raise ValueError(f"mixture weights must have one > 0, not {list(weights)}")
    den = math.lcm(*(f.denominator for f in fr))
    return [int(f * den) for f in fr]


def hamilton(total: int, a: Sequence[int]) -> list[int]:
    A = sum(a)
    share = [total * x // A for x in a]
    left = total - sum(share)
    # the largest remainders get one more; sorted() is stable, so ties go to the lower index
    for s in sorted(range(len(a)), key=lambda s: -(total * a[s] % A))[:left]:
        share[s] += 1
    return share


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder (Hamilton) counts of ``total`` in the ratios of ``weights``: they sum to ``total``."""
    if total < 0:
        raise ValueError(f"cannot apportion a negative total ({total})")
    return hamilton(int(total), integer_weights(weights))


def largest(resident: Sequence[int], a: Sequence[int]) -> int:
    A = sum(a)
    weighted = [(r, x) for r, x in zip(resident, a) if x > 0]
    if any(r == 0 for r, _ in weighted):
        return 0
    # every N <= low fits (a source's share is below resident + 1 only when its remainder is > 0); none above
    # high does (a floor past resident). Between them Hamilton is not monotone (the Alabama paradox): search down
    low = min(r * A // x for r, x in weighted)
    high = min(((r + 1) * A - 1) // x for r, x in weighted)
    for n in range(high, max(low, high - LARGEST_SCAN), -1):
        if all(c <= r for c, r in zip(hamilton(n, a), resident)):
            return n
    return low


def largest_epoch(resident: Sequence[int], weights: Sequence[float]) -> int:
    """The largest N whose apportionment fits the resident samples of every weighted source (no repeats); the
    exact maximum unless a weight's share is below ``1 / LARGEST_SCAN``, where it may fall short by less than
    ``1 / share``. 0 if a weighted source has none resident."""
    if len(resident) != len(weights):
        raise ValueError(f"{len(resident)} resident counts for {len(weights)} weights")
    if any(r < 0 for r in resident):
        raise ValueError(f"resident counts must be >= 0, not {list(resident)}")
    return largest([int(r) for r in resident], integer_weights(weights))


def random_counts(n: Sequence[int], chunk: int, rng: np.random.Generator) -> np.ndarray:
    """(chunks, S) label counts of each chunk of a uniformly random arrangement of the multiset ``n``."""
    total = sum(n)
    sizes = np.full(-(-total // chunk), chunk, np.int64)
    if len(sizes):
        sizes[-1] = total - chunk * (len(sizes) - 1)
    out = np.zeros((len(sizes), len(n)), np.int64)
    # numpy draws from fewer than 10^9 items: past that, spans of chunks get their share of what is left
    # (exactly uniform within a span, and exactly uniform overall below 10^9 positions)
    per_span = max(1, (HYPERGEOMETRIC_LIMIT - 1) // chunk)
    left = list(n)
    for a in range(0, len(sizes), per_span):
        room = sizes[a:a + per_span].copy()
        take = hamilton(int(room.sum()), left) if sum(left) else [0] * len(n)
        # source by source: where its samples fall among the room the sources before it left
        for s, k in enumerate(take[:-1]):
            got = rng.multivariate_hypergeometric(room, k) if k else np.zeros_like(room)
            out[a:a + per_span, s] = got
            room -= got
        out[a:a + per_span, -1] = room
        left = [x - y for x, y in zip(left, take)]
    return out


def block_counts(n: Sequence[int], a: Sequence[int], stratum: int) -> np.ndarray:
    """(blocks, S) label counts of each block of ``stratum`` positions: floor or ceil of the source's share of a
    block, the ceil to the sources furthest behind (deficit: share so far minus given so far, times sum(a))."""
    S, A, B = len(a), sum(a), stratum
    full, rest = divmod(sum(n), B)
    floor = [B * x // A for x in a]
    extra = B - sum(floor)
    gain = [B * x - A * f for x, f in zip(a, floor)]  # a block of floors: each deficit grows by this
    deficit, left = [0] * S, list(n)
    blocks: list[list[int]] = []
    period, clamped = A // gcd(A, B), False  # after `period` blocks every share so far is a whole number
    while len(blocks) < full:
        if len(blocks) == period and not clamped and not any(deficit):
            # back where it started: the blocks repeat, as many whole periods as the counts allow
            per = [sum(col) for col in zip(*blocks)]
            reps = min([(full - period) // period] + [x // p for x, p in zip(left, per) if p])
            blocks.extend(blocks[:period] * reps)
            left = [x - reps * p for x, p in zip(left, per)]
        if len(blocks) == full:
            break
        behind = [d + g for d, g in zip(deficit, gain)]
        rank = sorted(range(S), key=lambda s: -behind[s])  # stable: ties to the lower index
        give = list(floor)
        for s in rank[:extra]:
            give[s] += 1
        if any(g > x for g, x in zip(give, left)):
            # the counts run short: never give a source more than it has left; the furthest behind fill the rest
            clamped = True
            give = [min(g, x) for g, x in zip(give, left)]
            short = B - sum(give)
            for s in rank:
                more = min(short, left[s] - give[s])
                give[s] += more
                short -= more
        blocks.append(give)
        deficit = [d + B * x - A * g for d, x, g in zip(deficit, a, give)]
        left = [x - g for x, g in zip(left, give)]
    if rest:
        blocks.append(left)
    return np.array(blocks, np.int64).reshape(len(blocks), S)


__all__ = ["HYPERGEOMETRIC_LIMIT", "LARGEST_SCAN", "apportion", "block_counts", "hamilton", "integer_weights",
           "largest", "largest_epoch", "random_counts", "rational"]
