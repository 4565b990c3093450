"""End to end, tables as data lakes store them (issue 23): Hive-partitioned folders, Delta Lake and Iceberg
tables. Each test writes its table under a unique prefix of the real S3 server and starts a real daemon subprocess
on it; every epoch is checked row by row against what pyarrow.dataset (or the table's own reader) reads."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from byteproxy import ByteProxy
from epoch_check import by_id, compare_table, read_epoch, upload
from lake_tables import (
    delete_delta,
    iceberg_catalog,
    iceberg_s3_properties,
    live_rows,
    s3_options,
    spark_hive,
    write_delta,
)

pytestmark = pytest.mark.e2e

# Spark's folders: nested keys, a URL-encoded value, a null (__HIVE_DEFAULT_PARTITION__)
HIVE_FOLDERS = ["lang=en/year=2023", "lang=en/year=2024", "lang=d%2Fe%20f/year=2024",
                "lang=__HIVE_DEFAULT_PARTITION__/year=2024"]


def test_hive_partition_columns_are_served(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                           get: Callable[..., Any]) -> None:
    local = tmp_path / "hive"
    rows = 0
    for k, folder in enumerate(HIVE_FOLDERS):
        (local / folder).mkdir(parents=True)
        t = pa.table({"id": pa.array(range(rows, rows + 40), pa.int64()), "x": pa.array([k * 0.5] * 40)})
        pq.write_table(t, local / folder / "part-00000.parquet", row_group_size=20)
        upload(s3, local / folder / "part-00000.parquet", f"{prefix}/{folder}/part-00000.parquet")
        rows += 40
    (local / "_SUCCESS").write_text("")
    upload(s3, local / "_SUCCESS", f"{prefix}/_SUCCESS")
    want = pads.dataset(local, format="parquet", partitioning="hive", exclude_invalid_files=True).to_table()
    assert want.schema.field("year").type == pa.int32() and want.num_rows == rows

    d = daemon(source=f"s3://{prefix}")
    schema = get(d.url + "/v1/schema").json()
    assert [c["name"] for c in schema["columns"]] == ["id", "x", "lang", "year"], schema
    cols = {c["name"]: (c["kind"], c["dtype"]) for c in schema["columns"]}
    assert cols["lang"] == ("string", None) and cols["year"] == ("fixed", "<i4"), cols
    compare_table(by_id(read_epoch(d.url, rows)), want, "hive partitions")
    # each shard names its file's partition values (its provenance)
    shards = get(d.url + "/v1/shards?limit=1000").json()["shards"]
    assert {(s["partitions"]["lang"], s["partitions"]["year"]) for s in shards} == {
        ("en", "2023"), ("en", "2024"), ("d/e f", "2024"), (None, "2024")}, shards
    assert all(s["partitions"]["lang"] == "en" for s in shards if "/lang=en/" in s["path"])


def test_a_dataset_spark_partitioned_is_served_as_spark_reads_it(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                                                  get: Callable[..., Any]) -> None:
    # pyspark (300 MB, and Java 17) is not in the test extra: scripts/test.sh installs it and requires this test
    if importlib.util.find_spec("pyspark") is None:
        why = "pyspark is not installed (pip install pyspark: scripts/test.sh does)"
        if os.environ.get("SAMPLECACHE_TEST_SPARK") == "require":
            pytest.fail(why + " (SAMPLECACHE_TEST_SPARK=require)")
        pytest.skip(why)
    out = tmp_path / "spark"
    # a value with '/', ':', '=', '%' (Spark escapes them), one with a space (it does not), and a null
    rows = [(i, i / 2, ["en", "d/e f", "a:b=c%", None][i % 4], 2023 + i % 2) for i in range(40)]
    spark = spark_hive(out, rows)
    assert spark["schema"] == "struct<id:bigint,x:double,lang:string,year:int>"
    names = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "_SUCCESS" for p in names) and any(p.name.endswith(".crc") for p in names)
    assert any("a%3Ab%3Dc%25" in str(p) for p in names) and any("__HIVE_DEFAULT_PARTITION__" in str(p) for p in names)
    for p in names:
        upload(s3, p, f"{prefix}/{p.relative_to(out)}")
    want = pa.Table.from_pylist(spark["rows"], schema=pa.schema([("id", pa.int64()), ("x", pa.float64()),
                                                                 ("lang", pa.string()), ("year", pa.int32())]))
    d = daemon(source=f"s3://{prefix}")
    compare_table(by_id(read_epoch(d.url, len(rows))), want, "Spark's partitions")
    files = get(d.url + "/v1/status").json()["files"]
    assert files["parquet"] == 4 and files["skipped"] == 6, files  # _SUCCESS and the .crc files


def delta_rows(start: int, n: int, langs: list[str | None]) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "x": pa.array([i * 0.25 for i in range(start, start + n)]),
                     "lang": pa.array([langs[i % len(langs)] for i in range(n)], pa.string())})


def test_delta_table_serves_its_live_rows_as_it_changes(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                                        get: Callable[..., Any], until: Callable[..., Any]) -> None:
    pytest.importorskip("deltalake")
    uri, opts = f"s3://{prefix}/table", s3_options(s3)
    # the case: 100 rows, overwritten with 50; the 100 stay on storage until a vacuum
    write_delta(uri, delta_rows(0, 100, ["en", "de"]), tmp_path, partition_by=["lang"], options=opts)
    write_delta(uri, delta_rows(100, 50, ["en", None]), tmp_path, mode="overwrite", partition_by=["lang"],
                options=opts)
    assert len(s3.fs().find(f"{prefix}/table", withdirs=False)) > 4  # the overwritten files are still there

    d = daemon(source=uri, extra=["--discover-interval", "1"])

    def status() -> Any:
        return get(d.url + "/v1/status").json()

    def epoch_matches(version: int, rows: int, where: str) -> None:
        until(lambda: (status()["table"] or {}).get("version") == version and status()["samples"] == rows, 60,
              f"version {version} and {rows} resident samples")
        want = live_rows(uri, opts)
        assert want.num_rows == rows
        compare_table(by_id(read_epoch(d.url, rows)), want, where)

    table = status()["table"]
    assert table["format"] == "delta" and table["files"] == 2 and table["rows"] == 50, table
    epoch_matches(1, 50, "after the overwrite")  # 50, not 150
    # an append while the daemon runs: its files become new units
    write_delta(uri, delta_rows(150, 30, ["fr"]), tmp_path, partition_by=["lang"], options=opts)
    epoch_matches(2, 80, "after an append")
    # a delete rewrites the files it touches: those leave the table, their shards are evicted, none is served
    delete_delta(uri, "id < 110 or id >= 175", opts)
    epoch_matches(3, 65, "after a delete")
    table = status()["table"]
    assert table["removed_files"] >= 1 and table["rows"] == 65, table
    shards = get(d.url + "/v1/shards?limit=1000").json()["shards"]
    assert sum(s["rows"] for s in shards) == 65
    assert {s["partitions"].get("lang") for s in shards} == {"en", None, "fr"}, shards


def test_iceberg_table_serves_its_live_rows_as_it_changes(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                                          get: Callable[..., Any], until: Callable[..., Any]) -> None:
    pytest.importorskip("pyiceberg")
    catalog = iceberg_catalog(tmp_path, f"s3://{prefix}/warehouse", iceberg_s3_properties(s3))
    table = catalog.create_table("ns.t", schema=delta_rows(0, 1, ["en"]).schema)
    with table.update_spec() as spec:
        spec.add_identity("lang")
    table.append(delta_rows(0, 100, ["en", "de"]))
    table.overwrite(delta_rows(100, 50, ["en", "fr"]))
    d = daemon(source=table.location(), extra=["--discover-interval", "1"])

    def status() -> Any:
        return get(d.url + "/v1/status").json()

    def epoch_matches(rows: int, where: str) -> None:
        table.refresh()
        snapshot = table.current_snapshot().snapshot_id
        until(lambda: (status()["table"] or {}).get("version") == snapshot and status()["samples"] == rows, 60,
              f"snapshot {snapshot} and {rows} resident samples")
        want = table.scan().to_arrow()
        assert want.num_rows == rows
        compare_table(by_id(read_epoch(d.url, rows)), want, where)

    assert status()["table"]["format"] == "iceberg"
    epoch_matches(50, "after the overwrite")  # 50, not 150
    table.append(delta_rows(150, 30, ["it"]))
    epoch_matches(80, "after an append")
    table.delete("id < 110")
    epoch_matches(70, "after a delete")
    assert status()["table"]["removed_files"] >= 1


def test_an_iceberg_table_named_through_its_catalog_serves_its_live_rows(
        daemon: Any, s3: Any, prefix: str, tmp_path: Path, get: Callable[..., Any], until: Callable[..., Any]) -> None:
    """``iceberg://test/ns.events`` with the SQL catalog (sqlite) in the config file's [iceberg_catalogs.test]: the
    catalog says where the table lies and which snapshot is current; the S3 endpoint and credentials come from the
    daemon's environment, as the samplers' do."""
    pytest.importorskip("pyiceberg")
    warehouse = f"s3://{prefix}/warehouse"
    catalog = iceberg_catalog(tmp_path, warehouse, iceberg_s3_properties(s3))
    table = catalog.create_table("ns.events", schema=delta_rows(0, 1, ["en"]).schema)
    table.append(delta_rows(0, 60, ["en", "de"]))
    table.overwrite(delta_rows(60, 40, ["fr"]))
    config = tmp_path / "samplecache.toml"
    config.write_text(f'[iceberg_catalogs.test]\ntype = "sql"\nuri = "sqlite:///{tmp_path / "iceberg-catalog.db"}"\n'
                      f'warehouse = "{warehouse}"\n')
    config.chmod(0o600)
    d = daemon(source="iceberg://test/ns.events", extra=["--config", str(config), "--discover-interval", "1"])

    def matches(rows: int, where: str) -> None:
        table.refresh()
        snapshot = table.current_snapshot().snapshot_id
        until(lambda: ((st := get(d.url + "/v1/status").json())["table"] or {}).get("version") == snapshot
              and st["samples"] == rows, 60, f"snapshot {snapshot} and {rows} resident samples")
        want = table.scan().to_arrow()
        assert want.num_rows == rows
        compare_table(by_id(read_epoch(d.url, rows)), want, where)

    status = get(d.url + "/v1/status").json()
    assert status["table"]["format"] == "iceberg" and status["source"] == "iceberg://test/ns.events", status["table"]
    assert status["settings"]["iceberg_catalogs"] == {"test": ["type", "uri", "warehouse"]}  # names, never values
    matches(40, "after the overwrite")
    table.append(delta_rows(100, 25, ["it"]))
    matches(65, "after an append")


def send(url: str, method: str, token: str, body: Any = None) -> Any:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


def test_a_leased_epoch_keeps_the_removed_files_shards_until_its_lease_ends(
        daemon: Any, s3: Any, prefix: str, tmp_path: Path, get: Callable[..., Any], until: Callable[..., Any]) -> None:
    pytest.importorskip("deltalake")
    uri, opts = f"s3://{prefix}/table", s3_options(s3)
    write_delta(uri, delta_rows(0, 60, ["en"]), tmp_path, options=opts)
    d = daemon(source=uri, extra=["--discover-interval", "1"])

    def status() -> Any:
        return get(d.url + "/v1/status").json()

    def shard_ids() -> set[int]:
        return {s["id"] for s in get(d.url + "/v1/shards?limit=1000").json()["shards"]}

    until(lambda: status()["samples"] == 60, 60, "60 samples resident")
    sealed = get(d.url + "/v1/epochs/0?min_samples=60&timeout=30").json()
    old = {int(s[0]) if isinstance(s, list) else int(s["id"]) for s in sealed["shards"]}
    lease = send(f"{d.url}/v1/epochs/0/leases", "POST", d.token, {"ttl": 300})
    write_delta(uri, delta_rows(100, 40, ["fr"]), tmp_path, mode="overwrite", options=opts)
    # the overwritten file's shards stay while epoch 0 is leased: its reader is never cut short
    until(lambda: status()["table"]["version"] == 1 and status()["samples"] == 100, 60, "version 1 sampled")
    assert old <= shard_ids()
    # a new epoch names only the live rows
    compare_table(by_id(read_epoch(d.url, 40)), live_rows(uri, opts), "while the old epoch is leased")
    send(f"{d.url}/v1/epochs/0/leases/{lease['id']}", "DELETE", d.token)
    until(lambda: status()["samples"] == 40, 30, "the removed file's shards evicted once the lease ended")
    assert not old & shard_ids()
    metrics = get(d.url + "/metrics").body.decode()
    assert f'samplecache_evictions_total{{reason="removed"}} {float(len(old))}' in metrics, metrics[:2000]


@pytest.fixture
def proxy(s3: Any) -> Iterator[ByteProxy]:
    """Set up before ``daemon``, so torn down after the daemons are stopped."""
    with ByteProxy(s3.port) as p:
        yield p
    assert not p.alive


def test_a_filter_fetches_nothing_of_the_partitions_it_leaves_out(proxy: ByteProxy, daemon: Any, s3: Any,
                                                                  prefix: str, tmp_path: Path,
                                                                  get: Callable[..., Any]) -> None:
    local = tmp_path / "hive"
    rng = np.random.default_rng(0)
    left_out = 0
    for lang, files, rows in (("en", 1, 40), ("de", 1, 40), ("fr", 20, 50)):
        for k in range(files):
            folder = local / f"lang={lang}"
            folder.mkdir(parents=True, exist_ok=True)
            # fr: 20 files of 200 KB of noise; reading only their footers would fetch 20 x 64 KiB
            blob = [rng.bytes(4096 if lang == "fr" else 8) for _ in range(rows)]
            t = pa.table({"id": pa.array(range(1000 * k + 100 * len(lang) + ord(lang[0]) * 10000,
                                               1000 * k + 100 * len(lang) + ord(lang[0]) * 10000 + rows), pa.int64()),
                          "blob": pa.array(blob, pa.binary())})
            pq.write_table(t, folder / f"part-{k}.parquet", compression="none")
            upload(s3, folder / f"part-{k}.parquet", f"{prefix}/lang={lang}/part-{k}.parquet")
            left_out += (folder / f"part-{k}.parquet").stat().st_size if lang == "fr" else 0
    assert left_out > 20 * 200_000
    env = s3.env()
    env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
    d = daemon(source=f"s3://{prefix}", env=env, extra=["--filter", "lang in ('en', 'de')"])
    want = pads.dataset(local, format="parquet", partitioning="hive").to_table(
        filter=pads.field("lang").isin(["en", "de"]))
    assert want.num_rows == 80
    compare_table(by_id(read_epoch(d.url, 80)), want, "filtered partitions")
    files = get(d.url + "/v1/status").json()["files"]
    assert (files["parquet"], files["outside_filter"], files["filter"]) == (22, 20, "lang in ('en', 'de')"), files
    # listings, the two files read and the HTTP around them: far less than one footer read of each fr file
    assert proxy.downloaded < 20 * 64 * 1024 / 4, proxy.downloaded


def test_a_warm_restart_serves_no_epoch_before_it_read_the_tables_version(
        daemon: Any, s3: Any, prefix: str, tmp_path: Path, get: Callable[..., Any], until: Callable[..., Any]) -> None:
    pytest.importorskip("deltalake")
    from samplecache_tools.launch import free_port

    uri, opts = f"s3://{prefix}/table", s3_options(s3)
    write_delta(uri, delta_rows(0, 60, ["en"]), tmp_path, options=opts)
    d = daemon(source=uri)
    until(lambda: get(d.url + "/v1/status").json()["samples"] == 60, 60, "60 samples resident")
    assert daemon.stop(d).code == 0
    # overwritten while the daemon is stopped; it comes back on its warm cache with the remote unreachable
    write_delta(uri, delta_rows(100, 40, ["fr"]), tmp_path, mode="overwrite", options=opts)
    env = s3.env()
    env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{free_port()}"
    d = daemon(source=uri, env=env)
    r = get(d.url + "/v1/epochs/0?min_samples=1&timeout=2")
    assert r.status == 503 and "not discovered yet" in r.json()["detail"], r.body  # not the 60 stale rows
    assert daemon.stop(d).code == 0
    d = daemon(source=uri)
    compare_table(by_id(read_epoch(d.url, 40)), live_rows(uri, opts), "after a warm restart")


def test_a_table_that_takes_on_deletion_vectors_is_not_served_until_it_drops_them(
        daemon: Any, s3: Any, prefix: str, tmp_path: Path, get: Callable[..., Any], until: Callable[..., Any]) -> None:
    pytest.importorskip("deltalake")
    uri, opts = f"s3://{prefix}/table", s3_options(s3)
    version = write_delta(uri, delta_rows(0, 30, ["en"]), tmp_path, options=opts)
    d = daemon(source=uri, extra=["--discover-interval", "1"])
    until(lambda: get(d.url + "/v1/status").json()["samples"] == 30, 60, "30 samples resident")
    # a writer turns deletion vectors on (Databricks' default): rows may now be deleted without a file changing
    s3.fs().pipe(f"{prefix}/table/_delta_log/{version + 1:020d}.json",
                 b'{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["deletionVectors"],'
                 b'"writerFeatures":["deletionVectors"]}}\n')
    status = until(lambda: (lambda s: s if "deletionVectors" in (s["sampler"]["reason"] or "") else None)(
        get(d.url + "/v1/status").json()), 30, "the refusal in the status")
    assert "deletionVectors" in status["last_error"], status["last_error"]
    r = get(d.url + "/v1/epochs/0?min_samples=1&timeout=2")
    assert r.status == 503 and "deletionVectors" in r.json()["detail"], r.body


def test_a_mixture_of_sources_that_are_filters_of_one_table(s3: Any, prefix: str, tmp_path: Path,
                                                           get: Callable[..., Any], until: Callable[..., Any]) -> None:
    """One Delta table on S3 (partitioned by lang), two sources in the config file that are filters of it: each
    holds exactly its partitions' live rows, and a job reads the exact mixture of the two (each epoch's rows of
    each lang are the mixture's count of its source, all live rows of the table, none twice)."""
    pytest.importorskip("deltalake")
    from samplecache import SampleCacheDataset, SampleCacheLoader
    from samplecache_tools.launch import DaemonProcess

    uri, opts = f"s3://{prefix}/table", s3_options(s3)
    write_delta(uri, delta_rows(0, 90, ["en", "en", "de"]), tmp_path, partition_by=["lang"], options=opts)
    write_delta(uri, delta_rows(1000, 30, ["fr"]), tmp_path, partition_by=["lang"], options=opts)
    live = live_rows(uri, opts)
    lang_of = dict(zip(live.column("id").to_pylist(), live.column("lang").to_pylist()))
    config = tmp_path / "samplecache.toml"
    config.write_text(f'[sources.en]\nurl = "{uri}"\nfilter = "lang = \'en\'"\n'
                      f'[sources.de]\nurl = "{uri}"\nfilter = "lang = \'de\'"\n')
    d = DaemonProcess(None, tmp_path / "cache", extra=["--config", str(config), "--samplers", "2"], env=s3.env(),
                      log_path=tmp_path / "daemon.log")
    d.start(timeout=60)
    try:
        def held() -> dict[str, Any]:
            return {s["name"]: (s["samples"], s["filter"]) for s in get(d.url + "/v1/sources").json()}
        until(lambda: held() == {"en": (60, "lang = 'en'"), "de": (30, "lang = 'de'")}, 90, "both filters cached")
        ds = SampleCacheDataset(d.url, columns=["id", "lang"], mixture={"en": 0.5, "de": 0.5}, job="two-filters")
        loader = SampleCacheLoader(ds, batch_size=10, num_workers=2)
        for epoch in range(2):
            ds.set_epoch(epoch)
            ids = [int(i) for b in loader for i in b["id"]]
            langs = [lang_of[i] for i in ids]
            # de's 30 rows are the limit: 30 of each source, no sample twice, never a row outside its filter
            assert sorted(set(langs)) == ["de", "en"] and langs.count("de") == langs.count("en") == 30, langs
            assert len(set(ids)) == len(ids) == 60
            assert ds.mixture_counts(epoch) == {"en": 30, "de": 30}
        ds.close()
        shards = get(d.url + "/v1/shards?limit=1000").json()["shards"]
        assert {(s["source"], s["partitions"]["lang"]) for s in shards} == {("en", "en"), ("de", "de")}, shards
    finally:
        d.stop()
