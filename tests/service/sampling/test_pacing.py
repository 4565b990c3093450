"""The pacer: free filling, a share of the budget per new epoch once full (in cached bytes), the remote rate cap,
settling estimates with real bytes."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock as Clock

from samplecache_service.sampling.pacing import Pacer

MB = 1_000_000


def test_filling_is_never_paced() -> None:
    p = Pacer("epoch", 0.2, 0)
    assert p.why_wait(5 * MB, 5 * MB, rolling=False, max_bytes=100 * MB) is None


def test_a_full_cache_fetches_nothing_until_an_epoch_then_one_share() -> None:
    p = Pacer("epoch", 0.2, 0)
    budget = 100 * MB
    reason = p.why_wait(5 * MB, 5 * MB, rolling=True, max_bytes=budget)
    assert reason is not None and "cache full" in reason and "0.2" in reason
    p.epoch_sealed(budget)
    cached = 0
    while p.why_wait(2 * MB, 5 * MB, rolling=True, max_bytes=budget) is None:  # compressed 2.5x on the remote
        p.charge(2 * MB, 5 * MB, rolling=True)
        cached += 5 * MB
        assert cached <= 20 * MB, "more than one share of the cache replaced"
    assert cached == 20 * MB  # the share counts cached bytes, not the (smaller) remote bytes
    assert p.reason is not None


def test_settling_with_the_real_bytes_keeps_the_share_on_average() -> None:
    p = Pacer("epoch", 0.2, 0)
    budget = 100 * MB
    p.epoch_sealed(budget)
    p.charge(10 * MB, 10 * MB, rolling=True)
    p.settle((10 * MB, 9 * MB), (10 * MB, 15 * MB), rolling=True)  # it held more than the footer said
    assert p.allowance == pytest.approx(5 * MB)
    p.charge(5 * MB, 5 * MB, rolling=True)
    p.settle((5 * MB, 5 * MB), (5 * MB, 2 * MB), rolling=True)  # less
    assert p.allowance == pytest.approx(3 * MB)
    p.charge(MB, MB, rolling=True)
    p.settle((MB, 0), (MB, 0), rolling=True)  # the unit failed: nothing cached, the charge comes back
    assert p.allowance == pytest.approx(3 * MB)


def test_the_remote_estimate_learns_remote_bytes_per_footer_byte() -> None:
    p = Pacer("epoch", 0.2, 0)
    assert p.estimate(1000) == 1000
    for _ in range(30):
        p.settle((0, 250), (1000, 1000), rolling=False)  # compressed 4x
    assert 240 <= p.estimate(1000) <= 270


def test_a_unit_larger_than_one_share_waits_for_a_whole_share() -> None:
    p = Pacer("epoch", 0.1, 0)
    budget = 100 * MB
    p.epoch_sealed(budget)
    p.charge(6 * MB, 6 * MB, rolling=True)  # 4 MB left of 10
    assert p.why_wait(30 * MB, 30 * MB, rolling=True, max_bytes=budget) is not None
    p.epoch_sealed(budget)  # a whole share again
    assert p.allowance == 10 * MB
    assert p.why_wait(30 * MB, 30 * MB, rolling=True, max_bytes=budget) is None


def test_an_unused_share_does_not_carry_over_and_an_overshoot_is_paid_back() -> None:
    p = Pacer("epoch", 0.5, 0)
    for _ in range(10):
        p.epoch_sealed(100 * MB)
    assert p.allowance == 50 * MB  # idle epochs bank nothing: the cache never turns over in one burst
    p.charge(MB, 70 * MB, rolling=True)
    p.epoch_sealed(100 * MB)
    assert p.allowance == 30 * MB  # -20 MB overshoot + a 50 MB share


def test_zero_share_keeps_the_sample_and_off_never_paces() -> None:
    keep = Pacer("epoch", 0.0, 0)
    keep.epoch_sealed(100 * MB)
    assert "replace_per_epoch is 0" in (keep.why_wait(MB, MB, True, 100 * MB) or "")
    off = Pacer("off", 0.2, 0)
    assert off.why_wait(MB, MB, True, 100 * MB) is None
    off.charge(MB, MB, rolling=True)
    assert off.allowance == 0


def test_the_rate_cap_holds_while_filling_too() -> None:
    clock = Clock(0.0)
    p = Pacer("epoch", 0.2, 10 * MB, clock=clock)
    sent = 0
    for step in range(100):  # 10 s in steps of 0.1 s, units of 1 MB
        clock.now = step * 0.1
        while p.why_wait(MB, MB, rolling=False, max_bytes=10**12) is None:
            p.charge(MB, MB, rolling=False)
            sent += MB
    assert 95 * MB <= sent <= 111 * MB  # 10 MB/s over 10 s, plus the first full bucket
    assert "max_ingest_rate" in (p.reason or "")


def test_no_cap_runs_up_no_debt_for_a_cap_set_later() -> None:
    clock = Clock(0.0)
    p = Pacer("epoch", 0.2, 0, clock=clock)
    for _ in range(1000):  # 100 GB fetched with no cap
        p.charge(100 * MB, 100 * MB, rolling=False)
        p.settle((100 * MB, 100 * MB), (100 * MB, 100 * MB), rolling=False)
    clock.now = 3600
    p.configure(max_rate=10 * MB)
    assert p.why_wait(MB, MB, rolling=False, max_bytes=10**12) is None  # a new cap starts with a full bucket


def test_configure_changes_the_pace_at_runtime() -> None:
    p = Pacer("off", 0.2, 0)
    p.configure(mode="epoch", replace_per_epoch=0.5, max_rate=MB)
    assert (p.mode, p.replace_per_epoch, p.max_rate) == ("epoch", 0.5, MB)
    p.configure()  # nothing given: nothing changes
    assert (p.mode, p.replace_per_epoch, p.max_rate) == ("epoch", 0.5, MB)


def test_each_source_replaces_its_own_share_of_the_epoch() -> None:
    """Two sources of 70 and 30 MB of a 100 MB budget, replace_per_epoch 0.2: web may replace 14 MB per epoch
    and code 6 MB; web spending all of its share leaves code's whole."""
    p = Pacer("epoch", 0.2, 0)
    for name, share in (("web", 70 * MB), ("code", 30 * MB)):
        p.epoch_sealed(share, name)
    assert p.allowance == pytest.approx(20 * MB)
    while p.why_wait(MB, MB, rolling=True, max_bytes=70 * MB, source="web") is None:
        p.charge(MB, MB, rolling=True, source="web")
    assert p.allowances["web"] == pytest.approx(0) and "this epoch's share is used" in (p.reason or "")
    assert p.why_wait(MB, 5 * MB, rolling=True, max_bytes=30 * MB, source="code") is None
    p.charge(MB, 5 * MB, rolling=True, source="code")
    assert p.why_wait(MB, 2 * MB, rolling=True, max_bytes=30 * MB, source="code") is not None  # 1 MB left of 6
    p.settle((MB, MB), (5 * MB, 0), rolling=True, source="code")  # the unit failed: code's charge comes back
    assert p.allowances == {"web": pytest.approx(0), "code": pytest.approx(6 * MB)}
