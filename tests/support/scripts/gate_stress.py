"""Readers that open and drop read transactions through an EnvGate while the main thread closes it, ROUNDS times.

    python gate_stress.py DIR ROUNDS

A GIL switch every microsecond puts a reader's last transaction's death beside the close: with transactions
freed after the reader left the gate, this crashed (SIGSEGV or SIGBUS) within 200 rounds, every run. Exits 0 and
prints the rounds done when none crashed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import lmdb

from samplecache_service.store.envgate import EnvClosed, EnvGate


def main(base: Path, rounds: int) -> None:
    sys.setswitchinterval(1e-6)
    for r in range(rounds):
        gate = EnvGate(lmdb.open(str(base / f"env{r}"), map_size=1 << 20))

        def reader() -> None:
            while True:
                try:
                    gate.read(lambda txn: txn.stat())
                except EnvClosed:
                    return

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        assert gate.close(timeout=10)
        for t in threads:
            t.join()
    print(f"rounds={rounds}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
