"""service/samplecache_service/sampling/failures.py: the failure bookkeeping of remote units, alone (the scheduler's
decisions on top of it are in test_scheduler.py)."""

from __future__ import annotations

from samplecache_service.sampling.failures import CORRUPT_CONFIRMATIONS, MAX_UNIT_ATTEMPTS, UnitFailures

U = ("s3://b/f.parquet", 3)


def test_failed_reads_in_a_row_exhaust_a_unit_and_a_good_read_ends_the_run() -> None:
    f = UnitFailures()
    for _ in range(MAX_UNIT_ATTEMPTS - 1):
        assert f.failed_read(U, unparsable=False) == 0
    assert not f.exhausted(U)
    f.sampled(U, "k")
    assert f.attempts(U) == 0
    for _ in range(MAX_UNIT_ATTEMPTS):
        f.failed_read(U, unparsable=False)
    assert f.exhausted(U)
    f.give_up(U)
    assert f.units_given_up == 1 and U in f.given_up and f.attempts(U) == 0
    f.sampled(U, "k")  # sampled in a later pass: no longer left out
    assert U not in f.given_up


def test_unparsable_reads_count_in_a_row_and_a_read_of_no_bytes_breaks_the_run() -> None:
    f = UnitFailures()
    assert f.failed_read(U, unparsable=True) == 1
    f.not_a_read(U)  # the remote unreachable in between
    assert f.failed_read(U, unparsable=True) == 1
    assert f.failed_read(U, unparsable=False) == 0  # a transient failure breaks it too
    for n in range(1, CORRUPT_CONFIRMATIONS + 1):
        assert f.failed_read(U, unparsable=True) == n


def test_a_unit_with_a_failed_part_is_incomplete_until_a_round_gets_every_part_in() -> None:
    f = UnitFailures()
    assert f.ingest_failed(U, "round", "ingest") is True
    assert f.ingest_failed(U, "round", "ingest") is False  # a second part of the same round: one retry
    assert f.incomplete(U) and f.by_kind["ingest"] == 2 and f.attempts(U) == 1
    assert not f.all_parts_in(U, "round")  # the round's last part: the unit is not done
    f.sampled(U, "round")  # the retry samples it again; its failed ingest still counts
    assert f.attempts(U) == 1
    assert f.all_parts_in(U, "round") and not f.incomplete(U) and f.attempts(U) == 0
