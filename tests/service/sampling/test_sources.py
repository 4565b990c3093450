"""Several named sources on one daemon (in process, over local Parquet folders): each samples its own files into
its share of the budget, a failing one never stalls the others, a one-source cache opens as ``default``, a removed
source's shards go, and the manifest names each shard's source."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache.format.manifest import Manifest
from samplecache_service.config.settings import Settings
from samplecache_service.daemon import Daemon
from samplecache_service.http.status import sources_of
from samplecache_service.store.cachedir import StartupError

ROW_BYTES = 8 + 4 * 64  # id + a 64-float vector


def _write(root: Path, name: str, files: int, rows: int, first_id: int) -> Path:
    d = root / "data" / name
    d.mkdir(parents=True)
    for i in range(files):
        ids = np.arange(first_id + i * rows, first_id + (i + 1) * rows, dtype=np.int64)
        vec = np.random.default_rng(first_id + i).random((rows, 64), dtype=np.float32)
        t = pa.table({"id": ids, "v": pa.FixedSizeListArray.from_arrays(vec.ravel(), 64)})
        pq.write_table(t, d / f"part-{i}.parquet", row_group_size=200)
    return d


@pytest.fixture
def data(tmp_path: Path) -> dict[str, Path]:
    """web: 12000 rows (~3.1 MB), code: 2000, math: 400; ids apart by source."""
    return {"web": _write(tmp_path, "web", 6, 2000, 0), "code": _write(tmp_path, "code", 2, 1000, 10**6),
            "math": _write(tmp_path, "math", 1, 400, 2 * 10**6)}


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(**kw: Any) -> Daemon:
        settings = Settings(cache_dir=tmp_path / "cache", samplers=2, discover_interval=3600, retry_seconds=0.5,
                            min_free_disk=0, unit_bytes="64KiB", **kw)
        d = Daemon(settings)
        started.append(d)
        d.check_remote()
        d.start()
        return d

    try:
        yield start
    finally:
        for d in started:
            d.stop()


def _until(pred: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_each_source_fills_its_share_and_no_more(run: Callable[..., Daemon], data: dict[str, Path]) -> None:
    budget = 2_400_000  # web (3.2 MB) cannot fit its 0.5; code (0.53 MB) and math (0.1 MB) fit their 0.25 each
    d = run(sources={n: {"url": f"file://{p}/"} for n, p in data.items()}, share={"web": 0.5}, max_bytes=budget,
            pacing="off")
    assert {n: round(s.share.fraction, 3) for n, s in d.sources.items()} == {"web": 0.5, "code": 0.25, "math": 0.25}
    _until(lambda: d.catalog.resident("code").rows == 2000 and d.catalog.resident("math").rows == 400
           and d.catalog.resident("web").bytes > 0.8 * budget * 0.5, 60, "every source to fill")
    time.sleep(1.0)  # web keeps rolling within its share
    for name, src in d.sources.items():
        held = d.catalog.resident(name)
        assert held.bytes <= src.share.max_bytes, (name, held, src.share.max_bytes)
    # web's rolling never evicted the others: they still hold every row they have
    assert (d.catalog.resident("code").rows, d.catalog.resident("math").rows) == (2000, 400)
    # each shard is its source's own file
    for s in d.catalog.shards():
        assert f"/data/{s.source}/" in s.path, (s.source, s.path)


def test_each_source_is_paced_within_its_own_share(run: Callable[..., Daemon], data: dict[str, Path]) -> None:
    """pacing=epoch: once web's share is full it waits for an epoch; an epoch grants each source
    replace_per_epoch x its own share, and web's turnover never spends code's."""
    budget = 2_400_000
    d = run(sources={n: {"url": f"file://{data[n]}/"} for n in ("web", "code")}, share={"web": 0.5},
            max_bytes=budget, pacing="epoch", replace_per_epoch=0.25)
    _until(lambda: d.sources["web"].scheduler.paused_reason is not None
           and "cache full" in d.sources["web"].scheduler.paused_reason
           and d.catalog.resident("code").rows == 2000, 60, "web full and waiting, code cached whole")
    assert d.traffic.pacer.allowances.get("code", 0.0) == 0.0
    asyncio.run(d.epochs.manifest(0))
    assert d.epochs.grant(0)
    pacer = d.traffic.pacer
    assert pacer.allowances["code"] == pytest.approx(0.25 * 0.5 * budget)  # code fits: nothing to replace
    _until(lambda: pacer.allowances["web"] < 0.25 * 0.5 * budget and "cache full" in (
        d.sources["web"].scheduler.paused_reason or ""), 60, "web to spend its share and wait again")
    assert pacer.allowances["code"] == pytest.approx(0.25 * 0.5 * budget), "web spent code's share"
    assert d.catalog.resident("web").bytes <= 0.5 * budget


def test_the_manifest_names_each_shards_source_and_schema(run: Callable[..., Daemon], data: dict[str, Path]) -> None:
    d = run(sources={n: {"url": f"file://{p}/"} for n, p in data.items()})
    _until(lambda: sum(d.catalog.resident(n).rows for n in data) == 14400, 60, "the sources to be cached")
    m = Manifest.from_json(json.loads(asyncio.run(d.epochs.manifest(0))))
    names = m.source_names()
    assert names == ["code", "math", "web"]
    by_id = {s.id: s.source for s in d.catalog.shards()}
    got = [names[i] for i in m.source_of()]
    assert got == [by_id[int(sid)] for sid in m.table()[:, 0]]
    assert m.source_schema("math")["columns"][0]["name"] == "id"
    with pytest.raises(KeyError, match="no source 'nope'"):
        m.source_schema("nope")


def test_a_failing_source_leaves_the_others_sampling(run: Callable[..., Daemon], data: dict[str, Path],
                                                     tmp_path: Path) -> None:
    gone = tmp_path / "data" / "gone"
    d = run(sources={"web": {"url": f"file://{data['web']}/"}, "gone": {"url": f"file://{gone}/"}})
    _until(lambda: d.catalog.resident("web").rows == 12000, 60, "web to be cached")
    bad = d.sources["gone"]
    assert bad.scheduler.state() == "remote error" and "does not exist" in (bad.problem() or "")
    assert d.sources["web"].problem() is None
    assert d.epoch_shares() == {"web": 0.5}  # a new epoch names the source that can be served


def test_no_readable_source_stops_the_start(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", samplers=1,
                        sources={"a": f"file://{tmp_path}/a/", "b": f"file://{tmp_path}/b/"})
    d = Daemon(settings)
    try:
        with pytest.raises(StartupError, match="no source can be read: a .*; b "):
            d.check_remote()
    finally:
        d.stop()


def test_sources_within_each_other_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="'a' and 'b' lie one within the other"):
        Daemon(Settings(cache_dir=tmp_path / "cache", sources={"a": f"file://{tmp_path}/x/",
                                                               "b": f"file://{tmp_path}/x/y/"}))


def test_a_one_source_cache_opens_as_default_and_a_removed_source_goes(
        run: Callable[..., Daemon], data: dict[str, Path]) -> None:
    d = run(source=f"file://{data['math']}/")
    _until(lambda: d.catalog.resident("default").rows == 400, 60, "the one source to be cached")
    d.stop()
    d = run(source=f"file://{data['math']}/", sources={"code": {"url": f"file://{data['code']}/"}})
    assert d.catalog.resident("default").rows == 400  # the old data is the default source's, not sampled again
    _until(lambda: d.catalog.resident("code").rows == 2000, 60, "code to be cached")
    d.stop()
    d = run(sources={"code": {"url": f"file://{data['code']}/"}})  # default removed: its shards go
    _until(lambda: d.catalog.resident("default").shards == 0, 30, "the removed source's shards to go")
    assert d.catalog.resident("code").rows == 2000


def test_a_source_name_given_another_url_is_refused_while_its_sample_is_resident(
        run: Callable[..., Daemon], data: dict[str, Path], tmp_path: Path) -> None:
    d = run(sources={"code": {"url": f"file://{data['code']}/"}})
    _until(lambda: d.catalog.resident("code").rows == 2000, 60, "code to be cached")
    d.stop()
    with pytest.raises(StartupError, match="holds a sample of .* as source 'code'"):
        Daemon(Settings(cache_dir=tmp_path / "cache", sources={"code": f"file://{data['math']}/"}))


@pytest.mark.parametrize("kw, message", [
    ({"sources": {"a": "s3://x/", "b": "s3://y/"}, "share": {"a": 0.7, "b": 0.5}}, "add up to 1.2, more than 1: a=0.7"),
    ({"sources": {"a": "s3://x/", "b": "s3://y/"}, "share": {"a": 1.0}}, "leave nothing for ['b']"),
    ({"sources": {"A!": "s3://x/"}}, "source name 'A!'"),
    ({"source": "s3://x/", "sources": {"default": "s3://y/"}}, "which sources also names"),
    ({"sources": {"a": "s3://x/"}, "share": {"b": 0.5}}, "unknown source"),
])
def test_bad_sources_are_a_settings_error_naming_them(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings(**kw)


def test_source_flags_name_sources_and_a_bare_url_is_default() -> None:
    from samplecache_service.cli.flags import given_flags
    from samplecache_service.cli.main import build_parser
    args = build_parser().parse_args(["serve", "--source", "s3://b/k=v/", "--source", "web=s3://b/web/",
                                      "--share", "web=0.25"])
    s = Settings(**given_flags(args))
    assert s.named_sources() == {"default": ("s3://b/k=v/", 0.75), "web": ("s3://b/web/", 0.25)}
    args = build_parser().parse_args(["serve", "--source", "a=s3://b/a/", "--source", "c=s3://b/c/",
                                      "--share", "a=0.5,c=0.25"])  # comma-separated, as the help says
    assert Settings(**given_flags(args)).named_sources() == {"a": ("s3://b/a/", 0.5), "c": ("s3://b/c/", 0.25)}


def test_sources_are_added_reshared_and_removed_while_running(run: Callable[..., Daemon], data: dict[str, Path],
                                                              tmp_path: Path) -> None:
    from samplecache_service.errors import Conflict
    budget = 2_400_000
    d = run(sources={"web": {"url": f"file://{data['web']}/"}, "code": {"url": f"file://{data['code']}/"}},
            max_bytes=budget, pacing="off")
    _until(lambda: d.catalog.resident("code").rows == 2000, 60, "code to be cached")
    got = d.set_sources({"web": (f"file://{data['web']}/", 0.8), "math": (f"file://{data['math']}/", 0.2)})
    assert got == {"added": ["math"], "removed": ["code"], "reshared": ["web"]}
    assert sorted(d.sources) == ["math", "web"] and d.sources["web"].share.fraction == 0.8
    _until(lambda: d.catalog.resident("math").rows == 400, 60, "the added source to be cached")
    _until(lambda: d.catalog.resident("code").shards == 0, 30, "the removed source's shards to go")
    _until(lambda: d.catalog.resident("web").bytes > 0.5 * budget, 60, "web to grow into its larger share")
    assert d.epoch_shares() == {"web": 0.8, "math": 0.2}  # a new epoch no longer names code
    with pytest.raises(Conflict, match="would change URL"):
        d.set_sources({"web": (f"file://{data['code']}/", 1.0)})
    with pytest.raises(Conflict, match="lie one within the other"):
        d.set_sources({"web": (f"file://{data['web']}/", 0.5), "sub": (f"file://{data['web']}/x/", 0.5)})
    assert sorted(d.sources) == ["math", "web"]  # a refused change changes nothing


def test_a_reload_applies_the_config_files_sources(data: dict[str, Path], tmp_path: Path) -> None:
    from samplecache_service.config.file import load
    from samplecache_service.ops.reload import Reloader
    config = tmp_path / "samplecache.toml"
    config.write_text(f'max_bytes = "64MiB"\nsamplers = 1\nmin_free_disk = 0\ncache_dir = "{tmp_path / "c"}"\n'
                      f'[sources.web]\nurl = "file://{data["web"]}/"\n[sources.code]\nurl = "file://{data["code"]}/"\n')
    loaded = load({}, config)
    d = Daemon(loaded.settings)
    try:
        d.check_remote()
        d.start()
        reloader = Reloader({}, config, loaded, d, lambda level: None)
        config.write_text(config.read_text().replace("[sources.code]", "[sources.math]").replace(
            str(data["code"]), str(data["math"])) + "share = 0.25\n")
        got = reloader.reload()
        assert got["error"] is None and "sources" in got["applied"], got
        assert {n: s.share.fraction for n, s in d.sources.items()} == {"web": 0.75, "math": 0.25}
        _until(lambda: d.catalog.resident("math").rows == 400, 60, "the source added by the reload")
        config.write_text(config.read_text() + "[sources.bad]\nurl = \"file:///x/\"\nshare = 0.9\n")
        got = reloader.reload()  # shares over 1: refused whole, nothing changes
        assert "more than 1" in got["error"] and sorted(d.sources) == ["math", "web"]
    finally:
        d.stop()


def test_a_restart_reads_each_shards_last_use_back_from_the_manifests(run: Callable[..., Daemon],
                                                                      data: dict[str, Path]) -> None:
    """The lru policy's order survives a restart, though a seal no longer rewrites every shard's record."""
    d = run(source=f"file://{data['math']}/", eviction_policy="lru")
    _until(lambda: d.catalog.resident("default").rows == 400, 60, "the source to be cached")
    for e in (0, 1):
        named = Manifest.from_json(json.loads(asyncio.run(d.epochs.manifest(e)))).table()[:, 0].tolist()
        assert named and all(d.catalog.shard(s).last_used_epoch == e for s in named)  # type: ignore[union-attr]
    d.stop()
    d = run(source=f"file://{data['math']}/", eviction_policy="lru")
    assert {s.id: s.last_used_epoch for s in d.catalog.shards()} == {s: 1 for s in named}


def _lake(root: Path) -> Path:
    """A Hive-partitioned folder: lang=en (2 files), de, fr (1 each), 300 rows a file, ids apart by file."""
    t = root / "data" / "lake"
    for k, (lang, part) in enumerate([("en", 0), ("en", 1), ("de", 0), ("fr", 0)]):
        d = t / f"lang={lang}"
        d.mkdir(parents=True, exist_ok=True)
        ids = np.arange(k * 1000, k * 1000 + 300, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), d / f"part-{part}.parquet", row_group_size=100)
    return t


def test_sources_that_are_filters_of_one_table_each_keep_their_own(run: Callable[..., Daemon],
                                                                   tmp_path: Path) -> None:
    """Two sources on one table root, one filter inside the other: each samples exactly the files inside its
    filter (the shared one twice, once for each), neither marks the other's files removed, and a file appended
    while they run goes to both; the status shows each one's filter."""
    lake = _lake(tmp_path)
    d = run(sources={"en": {"url": f"file://{lake}/", "filter": "lang = 'en'"},
                     "ende": {"url": f"file://{lake}/", "filter": "lang in ('en', 'de')"}})
    _until(lambda: d.catalog.resident("en").rows == 600 and d.catalog.resident("ende").rows == 900, 60,
           "both sources to be cached")

    def langs(name: str) -> set[str]:
        return {Path(s.path).parent.name for s in d.catalog.shards() if s.source == name}
    assert langs("en") == {"lang=en"} and langs("ende") == {"lang=en", "lang=de"}
    assert not d.catalog.removed_files()
    assert {s.name: s.filter for s in sources_of(d)} == {"en": "lang = 'en'", "ende": "lang in ('en', 'de')"}
    m = Manifest.from_json(json.loads(asyncio.run(d.epochs.manifest(0))))
    names = m.source_names()
    assert sorted(names) == ["en", "ende"]
    rows = dict.fromkeys(names, 0)
    for i, r in zip(m.source_of(), m.table()[:, 1]):
        rows[names[i]] += int(r)
    assert rows == {"en": 600, "ende": 900}
    pq.write_table(pa.table({"id": np.arange(9000, 9100, dtype=np.int64)}), lake / "lang=en" / "part-2.parquet")
    for s in d.sources.values():
        s.scheduler.discover_soon()
    _until(lambda: d.catalog.resident("en").rows == 700 and d.catalog.resident("ende").rows == 1000, 60,
           "the appended file in both")
    # while running (SIGHUP, PATCH): a third filter of the table added; a kept source's filter cannot change
    from samplecache_service.errors import Conflict
    url, third = f"file://{lake}/", 1 / 3
    filters = {"en": "lang = 'en'", "ende": "lang in ('en', 'de')"}
    with pytest.raises(Conflict, match=r"\['en'\] would change filter"):
        d.set_sources({"en": (url, 0.5), "ende": (url, 0.5)}, {**filters, "en": "lang = 'de'"})
    got = d.set_sources({"en": (url, third), "ende": (url, third), "fr": (url, third)}, {"fr": "lang = 'fr'"})
    assert got["added"] == ["fr"]  # the kept sources named no filter: they keep their own
    assert {s.name: s.filter for s in sources_of(d)} == {**filters, "fr": "lang = 'fr'"}
    _until(lambda: d.catalog.resident("fr").rows == 300, 60, "the added filter of the table")
    assert d.catalog.resident("en").rows == 700 and d.catalog.resident("ende").rows == 1000


def test_sources_of_one_root_need_filters_of_their_own(tmp_path: Path) -> None:
    for specs in ({"a": {"url": f"file://{tmp_path}/x/"}, "b": {"url": f"file://{tmp_path}/x/", "filter": "k = 1"}},
                  {"a": {"url": f"file://{tmp_path}/x/", "filter": "k = 1"},
                   "b": {"url": f"file://{tmp_path}/x/", "filter": "k = 1"}}):
        with pytest.raises(StartupError, match="'a' and 'b' lie one within the other.*each its own filter"):
            Daemon(Settings(cache_dir=tmp_path / "cache", sources=specs))


def test_a_sources_own_filter_wins_over_the_flag(tmp_path: Path) -> None:
    from samplecache_service.config.file import load
    s = Settings(sources={"a": {"url": "s3://t/", "filter": "k = 1"}, "b": "s3://t2/"}, filter="k = 2")
    assert s.source_filters() == {"a": "k = 1", "b": "k = 2"}
    assert Settings(source="s3://t/", filter="k = 3").source_filters() == {"default": "k = 3"}
    config = tmp_path / "samplecache.toml"
    config.write_text('[sources.en]\nurl = "s3://lake/t/"\nfilter = "lang = \'en\'"\nshare = 0.5\n'
                      '[sources.de]\nurl = "s3://lake/t/"\nfilter = "lang = \'de\'"\n')
    got = load({}, config).settings
    assert got.source_filters() == {"en": "lang = 'en'", "de": "lang = 'de'"}
    assert got.named_sources() == {"en": ("s3://lake/t/", 0.5), "de": ("s3://lake/t/", 0.5)}
