"""How large an LMDB map a budget needs, and how large a map this machine lets a process hold.

LMDB maps its whole ``map_size`` at open: a budget whose map does not fit the address space fails there
(``lmdb.MemoryError``, or ``OverflowError`` past 64 bits). The settings refuse a budget no 64-bit process can
map; ``map_problem`` asks this machine (a reservation of address space, nothing written) and names the largest
budget that works.
"""

from __future__ import annotations

import mmap
from typing import Callable

GiB = 1 << 30
MAP_FACTOR = 4  # the budget, freed pages still held by old readers, and raising the budget at run time (up to 2x)
MAP_SLACK = GiB  # the catalog, manifests and small budgets
# the most a 64-bit Linux process maps without an address hint, as LMDB maps (x86-64: 2^47, arm64: 2^48)
ADDRESS_SPACE = 1 << 48
HEADROOM = 8  # a map fits when 1/HEADROOM more than it maps (see ``fits``)
Probe = Callable[[int], bool]  # whether a map of that many bytes can be made now
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python < 3.10 does not name it


def map_size_for(max_bytes: int) -> int:
    """LMDB map size from the budget. Only address space: the file grows as pages are used."""
    return int(max_bytes) * MAP_FACTOR + MAP_SLACK


def budget_for(map_size: int) -> int:
    """The largest budget whose map fits ``map_size``, in whole GiB (a value to pass as ``--max-bytes``)."""
    return max(0, (map_size - MAP_SLACK) // MAP_FACTOR) // GiB * GiB


MAX_BUDGET = budget_for(ADDRESS_SPACE)


def can_map(size: int) -> bool:
    """Whether this process can map ``size`` bytes now: reserve the address space (no access, no memory), free it."""
    try:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, prot=0)
    except (OSError, OverflowError, ValueError):
        return False
    m.close()
    return True


def largest_map(can: Probe | None = None, high: int = ADDRESS_SPACE) -> int:
    """The largest map ``can`` (default ``can_map``) accepts, to within 1 GiB (0 when not even 1 GiB maps)."""
    can = can or can_map
    low = 0
    while high - low > GiB:
        mid = (low + high) // 2
        if can(mid):
            low = mid
        else:
            high = mid
    return low


def fits(need: int, can: Probe | None = None) -> bool:
    """Whether a map of ``need`` bytes fits, with 1/``HEADROOM`` to spare: address-space layout randomisation
    moves the largest free range by up to about 1 TiB from one process to the next."""
    return (can or can_map)(need + need // HEADROOM)


def largest_budget(largest: int) -> int:
    """The largest budget whose map ``fits`` within a largest mappable range of ``largest`` bytes."""
    return budget_for(largest * HEADROOM // (HEADROOM + 1))


def too_large(max_bytes: int, largest: int) -> str:
    """Why a budget cannot be mapped, naming the setting and the largest budget that works."""
    best = largest_budget(largest) // GiB
    return (f"--max-bytes / SAMPLECACHE_MAX_BYTES {max_bytes}: its LMDB map would be {map_size_for(max_bytes)} "
            f"bytes ({MAP_FACTOR} x the budget + 1 GiB), more than this machine lets a process map (about "
            f"{largest} bytes); the largest budget that works here is {best}GiB (--max-bytes {best}GiB)")


def map_problem(max_bytes: int, can: Probe | None = None) -> str | None:
    """Why the map of ``max_bytes`` does not fit this machine, with the largest budget that does; None when it
    fits."""
    if max_bytes <= MAX_BUDGET and fits(map_size_for(max_bytes), can):
        return None
    return too_large(max_bytes, largest_map(can))


def restart_advice(max_bytes: int, in_use: int, can: Probe | None = None) -> str:
    """What to do about a budget beyond this run's map (``in_use`` bytes): restart with it, if a restart can map
    it; else the largest budget that works."""
    if max_bytes <= MAX_BUDGET and fits(map_size_for(max_bytes), can):
        return f"restart the daemon with --max-bytes {max_bytes}"
    return "a restart could not map it either: " + too_large(max_bytes, max(in_use, largest_map(can)))
