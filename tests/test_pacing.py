"""The pacer: free filling, a share of the budget per new epoch once full, the rate cap, settling."""

from __future__ import annotations

import pytest

from samplecache.service.pacing import Pacer

MB = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_filling_is_never_paced() -> None:
    p = Pacer("epoch", 0.2, 0)
    assert p.why_wait(5 * MB, rolling=False, max_bytes=100 * MB) is None


def test_a_full_cache_fetches_nothing_until_an_epoch_then_one_share() -> None:
    p = Pacer("epoch", 0.2, 0)
    budget = 100 * MB
    reason = p.why_wait(5 * MB, rolling=True, max_bytes=budget)
    assert reason is not None and "cache full" in reason and "0.2" in reason
    p.epoch_sealed(budget)
    fetched = 0
    while p.why_wait(5 * MB, rolling=True, max_bytes=budget) is None:
        p.charge(5 * MB, rolling=True)
        fetched += 5 * MB
        assert fetched <= 20 * MB, "more than one share fetched"
    assert fetched == 20 * MB
    assert p.reason is not None


def test_settling_with_the_real_bytes_keeps_the_share_on_average() -> None:
    p = Pacer("epoch", 0.2, 0)
    budget = 100 * MB
    p.epoch_sealed(budget)
    p.charge(10 * MB, rolling=True)
    p.settle(10 * MB, 15 * MB, rolling=True, uncompressed=10 * MB)  # it fetched more than estimated
    assert p.allowance == pytest.approx(5 * MB)
    p.charge(5 * MB, rolling=True)
    p.settle(5 * MB, 2 * MB, rolling=True, uncompressed=5 * MB)  # less
    assert p.allowance == pytest.approx(3 * MB)


def test_the_estimate_learns_remote_bytes_per_footer_byte() -> None:
    p = Pacer("epoch", 0.2, 0)
    assert p.estimate(1000) == 1000
    for _ in range(30):
        p.settle(0, 250, rolling=False, uncompressed=1000)  # compressed 4x
    assert 240 <= p.estimate(1000) <= 270


def test_a_unit_larger_than_one_share_waits_for_a_whole_share() -> None:
    p = Pacer("epoch", 0.1, 0)
    budget = 100 * MB
    p.epoch_sealed(budget)
    p.charge(6 * MB, rolling=True)  # 4 MB left of 10
    assert p.why_wait(30 * MB, rolling=True, max_bytes=budget) is not None
    p.epoch_sealed(budget)  # 14 MB >= one share
    assert p.why_wait(30 * MB, rolling=True, max_bytes=budget) is None


def test_allowance_banks_at_most_one_budget() -> None:
    p = Pacer("epoch", 0.5, 0)
    for _ in range(10):
        p.epoch_sealed(100 * MB)
    assert p.allowance == 100 * MB


def test_zero_share_keeps_the_sample_and_off_never_paces() -> None:
    keep = Pacer("epoch", 0.0, 0)
    keep.epoch_sealed(100 * MB)
    assert "replace_per_epoch is 0" in (keep.why_wait(MB, True, 100 * MB) or "")
    off = Pacer("off", 0.2, 0)
    assert off.why_wait(MB, True, 100 * MB) is None
    off.charge(MB, rolling=True)
    assert off.allowance == 0


def test_the_rate_cap_holds_while_filling_too() -> None:
    clock = Clock()
    p = Pacer("epoch", 0.2, 10 * MB, clock=clock)
    sent = 0
    for step in range(100):  # 10 s in steps of 0.1 s, units of 1 MB
        clock.now = step * 0.1
        while p.why_wait(MB, rolling=False, max_bytes=10**12) is None:
            p.charge(MB, rolling=False)
            sent += MB
    assert 95 * MB <= sent <= 111 * MB  # 10 MB/s over 10 s, plus the first full bucket
    assert "max_ingest_rate" in (p.reason or "")


def test_configure_changes_the_pace_at_runtime() -> None:
    p = Pacer("off", 0.2, 0)
    p.configure(mode="epoch", replace_per_epoch=0.5, max_rate=MB)
    assert (p.mode, p.replace_per_epoch, p.max_rate) == ("epoch", 0.5, MB)
    p.configure()  # nothing given: nothing changes
    assert (p.mode, p.replace_per_epoch, p.max_rate) == ("epoch", 0.5, MB)
