"""benchmarks.harness in-process: size parsing, the missing-peer reporter, report helpers, the data's truth.
(The benchmarks themselves run end to end in tests/bench/test_benchmarks_smoke.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.harness import (
    Check,
    Row,
    Spec,
    arrow_xy,
    exit_code,
    human,
    missing,
    missing_lines,
    missing_report,
    parquet_files,
    parse_size,
    require,
    text_table,
    write_parquet,
)
from benchmarks.harness.needs import Missing


@pytest.mark.parametrize("text, value", [("200MB", 200 * 10**6), ("1GiB", 1 << 30), ("16MiB", 16 << 20),
                                         ("1.5 GB", 1_500_000_000), ("4096", 4096), ("64kib", 64 << 10)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MB", "ten GB", "1 XB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_human() -> None:
    assert [human(n) for n in (512, 64 << 20, 1 << 30)] == ["512 B", "64.0 MiB", "1.0 GiB"]


def test_missing_peer_names_it_and_its_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "webdataset", None)  # import webdataset now raises ImportError
    why = missing("webdataset")
    assert why is not None and why.startswith("not installed (ModuleNotFoundError: import of webdataset halted")
    assert why.endswith("install: bash benchmarks/install_peers.sh")
    with pytest.raises(Missing, match="webdataset: not installed"):
        require("webdataset")
    rep = missing_report({"webdataset": why})
    assert rep == [{"need": "webdataset", "name": "webdataset==1.0.2", "why": why,
                    "install": "bash benchmarks/install_peers.sh"}]
    assert missing_lines({"webdataset": why})[1] == f"  webdataset==1.0.2: {why}"
    assert missing_lines({}) == []


def test_missing_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    why = missing("fincore")
    assert why is not None and "fincore is neither beside" in why and why.endswith("apt-get install util-linux")


def test_rows_missing_are_reported_not_failed() -> None:
    ok = Row("a", "small", 0, 8, 1, {"samples": 1, "y_sum": 0, "x_check": 0},
             passes=[{"ok": True}], times_s=[1.0])
    gone = Row("b", "small", 0, 8, 1, dict(ok.expected), missing="not installed (...)")
    bad = Row("c", "small", 0, 8, 1, dict(ok.expected), passes=[{"ok": False}])
    assert (ok.status, gone.status, bad.status) == ("yes", "not installed", "NO")
    assert exit_code([ok, gone]) == 0 and exit_code([ok, gone, bad]) == 1


def test_text_table() -> None:
    got = text_table([("name", -6), ("n", 3)], [[("ab", -6), ("7", 3)]])
    assert got.splitlines() == ["name     n", "-" * 10, "ab       7"]


def test_write_parquet_truth(tmp_path: Path) -> None:
    """The truth of the written files equals what reading them back gives (count, sum of y, checksum of x)."""
    spec = Spec("small", 1000, 100, "uint8", 256, 64, seed=3, rows_per_file=400)
    truth = write_parquet(spec, lambda name: open(tmp_path / name, "wb"))
    files = sorted(tmp_path.glob("part-*.parquet"))
    assert truth["files"] == len(files) == 3
    check, n, ysum, xsum = Check(spec), 0, 0, 0
    for f in files:
        t = pq.read_table(f)
        xs = t.column("x").combine_chunks().values.to_numpy().reshape(-1, 256)
        n += t.num_rows
        ysum += int(t.column("y").to_numpy().sum())
        xsum += check.block(xs)
    assert n == 1000 and ysum > 0 and xsum > 0
    assert (n, ysum, xsum) == (truth["samples"], truth["y_sum"], truth["x_check"])


def test_read_back_matches_the_truth(tmp_path: Path) -> None:
    """``parquet_files`` + ``arrow_xy`` (what the suite's peers and tf_feed read) give back the written truth, also
    for a table sliced at an offset (the copying path)."""
    spec = Spec("small", 1000, 100, "uint8", 256, 64, seed=3, rows_per_file=400)
    truth = write_parquet(spec, lambda name: open(tmp_path / name, "wb"))
    files = parquet_files(tmp_path)
    assert [f.name for f in files] == sorted(f.name for f in tmp_path.glob("*.parquet")) and len(files) == 3
    check, n, ysum, xsum = Check(spec), 0, 0, 0
    for f in files:
        t = pq.read_table(f)
        for part in (t.slice(0, 7), t.slice(7)):
            xs, ys = arrow_xy(part, spec.width)
            assert xs.shape == (part.num_rows, 256) and ys.shape == (part.num_rows,)
            n, ysum, xsum = n + len(ys), ysum + int(ys.sum()), xsum + check.block(xs)
    assert (n, ysum, xsum) == (truth["samples"], truth["y_sum"], truth["x_check"])
