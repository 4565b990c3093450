"""Which epoch an iteration reads when the user does not call ``set_epoch``.

Iterating again advances the epoch, also with non-persistent DataLoader workers
(fresh copies of the dataset every epoch). All workers of one DataLoader
iteration share a base seed, and a persistent worker counts its own
iterations; the pair is the iteration's key. A small shared-memory record, made
before the workers start and inherited by them, maps each new key to the next
epoch.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.context import get_spawning_popen
from typing import Any


class EpochClock:
    def __init__(self, start: int = 0) -> None:
        # [next epoch, has key, key part a, key part b, agreed epoch, agreed samples per rank, start fixed].
        # The fork context's lock is an unnamed semaphore (unlinked at once): nothing can be left in
        # /dev/shm, whatever kills the trainer. Workers started by spawn/forkserver get a local copy.
        self._shared: Any = mp.get_context("fork").Array("q", [start, 0, 0, 0, -1, 0, 0])
        self._local_next = start  # used when the shared record could not travel (pickled by hand)
        self._local_fixed = False

    def start_at(self, epoch: int) -> None:
        """Where the first iteration starts when ``set`` was not called (a job restarted by name goes on at
        its next epoch). Every process of the run gives the same value; the first call counts."""
        if self._shared is None:
            if not self._local_fixed:
                self._local_next, self._local_fixed = epoch, True
            return
        with self._shared.get_lock():
            s = self._shared
            if not s[6]:
                s[6] = 1
                if not s[1]:  # nothing read yet
                    s[0] = epoch

    def set(self, epoch: int) -> None:
        if self._shared is not None:
            with self._shared.get_lock():
                self._shared[0], self._shared[1], self._shared[6] = epoch, 0, 1
        self._local_next, self._local_fixed = epoch, True

    def peek(self) -> int:
        """The epoch the next iteration (a new key) will read."""
        if self._shared is None:
            return self._local_next
        with self._shared.get_lock():
            return int(self._shared[0])

    def set_agreed(self, epoch: int, per_rank: int) -> None:
        self._agreed_local = (epoch, per_rank)
        if self._shared is not None:
            with self._shared.get_lock():
                self._shared[4], self._shared[5] = epoch, per_rank

    def agreed(self, epoch: int) -> int | None:
        """Samples per rank agreed for ``epoch`` across hosts, if any."""
        if self._shared is not None:
            with self._shared.get_lock():
                if self._shared[4] == epoch:
                    return int(self._shared[5])
            return None
        got = getattr(self, "_agreed_local", None)
        return got[1] if got and got[0] == epoch else None

    def current(self) -> int | None:
        """The epoch of the latest iteration, if one has started."""
        if self._shared is None:
            return self._local_next - 1 if self._local_next > 0 else None
        with self._shared.get_lock():
            return int(self._shared[0]) - 1 if self._shared[1] else None

    def take(self, key: tuple[int, int]) -> int:
        """The epoch of the iteration with ``key``; a new key advances the clock."""
        a, b = (key[0] & 0x7FFFFFFFFFFFFFFF), key[1]
        if self._shared is None:
            self._local_next += 1
            return self._local_next - 1
        with self._shared.get_lock():
            s = self._shared
            if s[1] and s[2] == a and s[3] == b:
                return int(s[0]) - 1
            s[1], s[2], s[3] = 1, a, b
            s[0] += 1
            return int(s[0]) - 1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        popen = get_spawning_popen()
        if popen is None or not type(popen).__module__.endswith("popen_fork"):
            state["_shared"] = None  # only forked processes share it (pickled by hand, or spawn/forkserver)
            if self._shared is not None:
                with self._shared.get_lock():
                    state["_local_next"] = int(self._shared[0])
        return state
