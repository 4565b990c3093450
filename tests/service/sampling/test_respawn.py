"""service/samplecache_service/sampling/respawn.py: the backoff after a sampler fails to start, and the crash loop."""

from __future__ import annotations

from samplecache_service.sampling.respawn import Respawn, RespawnPolicy

POLICY = RespawnPolicy(first_delay=0.5, max_delay=4.0, loop_failures=3, loop_window=10.0)


def test_each_start_failure_in_a_row_doubles_the_delay_up_to_the_cap() -> None:
    r = Respawn(POLICY)
    delays = [r.failed(float(t), "exit code 1")[0] for t in range(40)]
    assert delays[:5] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert max(delays) == 4.0
    assert r.start_failures == 40 and r.in_a_row == 40


def test_a_crash_loop_needs_n_failures_within_the_window() -> None:
    r = Respawn(POLICY)
    assert r.failed(0.0, "e")[1] is False and r.failed(11.0, "e")[1] is False
    assert r.failed(22.0, "e")[1] is False  # three failures in a row, but never three within 10 s
    assert r.crash_loop() is None
    assert r.failed(25.0, "e")[1] is False
    assert r.failed(27.0, "exit code 1 before it was ready") == (4.0, True)  # 22, 25, 27: a crash loop begins
    assert r.failed(28.0, "e")[1] is False  # it began once
    loop = r.crash_loop()
    assert loop is not None and "6 start failures in a row" in loop and loop.endswith(": e")


def test_the_crash_loop_lasts_until_a_clean_start_then_everything_resets() -> None:
    r = Respawn(POLICY)
    for t in range(3):
        r.failed(float(t), "e")
    assert r.crash_loop() is not None
    # sparse failures later do not end it: only a clean start does
    r.failed(100.0, "e")
    assert r.crash_loop() is not None
    assert r.started() is True
    assert r.crash_loop() is None and r.in_a_row == 0
    assert r.started() is False  # no crash loop to end
    assert r.failed(200.0, "e") == (0.5, False)  # the backoff starts over
    assert r.start_failures == 5  # the counter for /metrics never goes back
