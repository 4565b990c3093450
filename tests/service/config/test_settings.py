"""service/samplecache_service/config/settings.py + service/samplecache_service/cli/: one validated Settings
object from flags and SAMPLECACHE_* variables."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from paths import REPO
from pydantic import ByteSize, ValidationError

from samplecache_service.cli.flags import flag_name, settings_from
from samplecache_service.cli.main import build_parser, main
from samplecache_service.config import mapsize
from samplecache_service.config.settings import Settings

README = REPO / "README.md"
FIELDS = list(Settings.model_fields)
GiB = 2**30


def _env_var(name: str) -> str:
    return "SAMPLECACHE_" + name.upper()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k in list(os.environ):
        if k.startswith("SAMPLECACHE_"):
            monkeypatch.delenv(k)
    yield


def _clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SAMPLECACHE_")}


def _serve(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "samplecache_service", "serve", *args], cwd=tmp_path,
                          env={**_clean_environ(), **(env or {})}, capture_output=True, text=True, timeout=120)


# --- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,value", [
    ("500GB", 500 * 10**9),
    ("2GiB", 2 * GiB),
    ("1.5 GiB", int(1.5 * GiB)),
    ("1.5GiB", int(1.5 * GiB)),
    ("10 MB", 10 * 10**6),
    ("64KiB", 64 * 1024),
    ("123456789", 123456789),
    ("1TiB", 2**40),
])
def test_sizes_parse(text: str, value: int) -> None:
    s = Settings(max_bytes=text, min_free_disk=text, block_bytes=text if 4096 <= value <= GiB else "4KiB")
    assert int(s.max_bytes) == value
    assert int(s.min_free_disk) == value


def test_defaults() -> None:
    s = Settings()
    assert int(s.max_bytes) == 10 * GiB
    assert int(s.min_free_disk) == GiB
    assert int(s.block_bytes) == 2**20
    assert s.samplers >= 1
    assert s.host == "127.0.0.1" and s.port == 8750
    assert s.columns is None and s.token is None and s.storage_options == {}
    assert s.node_rank == 0 and s.num_nodes == 1


@pytest.mark.parametrize("field,value", [
    ("max_bytes", "nonsense"),
    ("max_bytes", "-1"),
    ("max_bytes", "-2GiB"),
    ("max_bytes", -5),
    ("max_bytes", "0"),
    ("max_bytes", ""),
    ("max_bytes", "12 parsecs"),
    ("min_free_disk", "-1"),
    ("min_free_disk", "lots"),
    ("block_bytes", "100"),
    ("block_bytes", "-1MiB"),
    ("samplers", 0),
    ("samplers", 257),
    ("samplers", "many"),
    ("port", 65536),
    ("port", -1),
    ("log_level", "loud"),
    ("eviction_policy", "mru"),
    ("lease_ttl", 0),
    ("max_leases", 0),
    ("max_leases_per_job", 0),
    ("epoch_max_samples", -1),
    ("discover_interval", 0),
    ("epoch_wait_max", -1),
    ("retry_seconds", 0),
    ("epochs_kept", 0),
    ("num_nodes", 0),
    ("max_body_bytes", "10"),
    ("auth", "maybe"),
    ("node_rank", -1),
    ("storage_options", "[1]"),
    ("pacing", "fast"),
    ("replace_per_epoch", -0.1),
    ("replace_per_epoch", 1.5),
    ("max_ingest_rate", "-1"),
    ("max_ingest_rate", "quick"),
])
def test_bad_values_fail(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as ei:
        Settings(**{field: value})
    text = str(ei.value)
    assert field in text or "must" in text


@pytest.mark.parametrize("field,text", [
    ("max_bytes", "1,5GiB"), ("max_bytes", "1.5.3GB"), ("max_bytes", "5 GB extra"), ("max_bytes", "10GiB;"),
    ("min_free_disk", "1,5GiB"), ("min_free_disk", "2GB free"), ("block_bytes", "1MiB please"),
])
def test_sizes_with_trailing_junk_fail(field: str, text: str) -> None:
    with pytest.raises(ValidationError):
        Settings(**{field: text})


def test_pacing_out_of_range_names_the_allowed_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replace-per-epoch", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "--replace-per-epoch" in err and "less than or equal to 1" in err
    assert main(["serve", "--pacing", "fast"]) == 2
    assert "'epoch' or 'off'" in capsys.readouterr().err


def test_node_rank_must_be_below_num_nodes() -> None:
    with pytest.raises(ValidationError, match="node_rank"):
        Settings(node_rank=2, num_nodes=2)
    assert Settings(node_rank=1, num_nodes=2).node_rank == 1


def test_unknown_setting_is_rejected() -> None:
    with pytest.raises(ValidationError):
        Settings(max_byte="1GB")  # type: ignore[call-arg]


def test_columns_and_log_level_normalised() -> None:
    assert Settings(columns="a, b,,c ").columns == ["a", "b", "c"]
    assert Settings(columns=" , ").columns is None
    assert Settings(columns=["x"]).columns == ["x"]
    assert Settings(log_level="WARNING").log_level == "warning"


def test_paths_and_public_view(tmp_path: Path) -> None:
    s = Settings(cache_dir=tmp_path / "c", token="s3cret", storage_options={"key": "AKIA", "secret": "xyz"})
    assert s.lmdb_path == (tmp_path / "c").resolve() / "lmdb"
    assert s.staging_dir == (tmp_path / "c").resolve() / "staging"
    pub = s.public()
    assert pub["token"] == "set"
    assert pub["storage_options"] == ["key", "secret"]
    assert "s3cret" not in repr(pub) and "AKIA" not in repr(pub) and "xyz" not in repr(pub)
    assert Settings().public()["token"] is None


# --- environment ---------------------------------------------------------------------------------


def test_env_vars_are_honoured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {
        "SOURCE": "s3://bucket/prefix/",
        "CACHE_DIR": str(tmp_path / "cache"),
        "MAX_BYTES": "3GiB",
        "MIN_FREE_DISK": "500MB",
        "SAMPLERS": "3",
        "HOST": "0.0.0.0",
        "PORT": "9999",
        "TOKEN": "tok",
        "STORAGE_OPTIONS": '{"anon": true, "endpoint_url": "http://x"}',
        "COLUMNS": "id,text",
        "SEED": "17",
        "EVICTION_POLICY": "lru",
        "LEASE_TTL": "12.5",
        "EPOCH_HEADROOM": "0.3",
        "EPOCH_MAX_SAMPLES": "1000",
        "DISCOVER_INTERVAL": "30",
        "NODE_RANK": "1",
        "NUM_NODES": "4",
        "BLOCK_BYTES": "256KiB",
        "EPOCH_WAIT_MAX": "5",
        "RETRY_SECONDS": "0.5",
        "LOG_LEVEL": "DEBUG",
        "LOG_FORMAT": "json",
        "PACING": "off",
        "REPLACE_PER_EPOCH": "0.5",
        "MAX_INGEST_RATE": "200MB",
        "UNIT_BYTES": "16MiB",
        "SCHEMA_FILE": str(tmp_path / "schema.parquet"),
        "AUTH": "token",
        "TOKEN_FILE": str(tmp_path / "token"),
        "MAX_BODY_BYTES": "64KiB",
        "EPOCHS_KEPT": "7",
        "MAX_LEASES": "100",
        "MAX_LEASES_PER_JOB": "10",
        "STORAGE_OPTIONS_FILE": str(tmp_path / "options.json"),
        "TABLE_VERSION": "5",
        "FILTER": "lang in ('en', 'de')",
        "TABLE_AS_OF": "2024-05-01T12:00:00+02:00",
        "SOURCES": "web=s3://bucket/web/,code=s3://bucket/code/",
        "SHARE": "web=0.5,code=0.25",
        "ICEBERG_CATALOGS": '{"lake": {"type": "rest", "uri": "https://catalog.example.com", "token": "t0k"}}',
    }
    (tmp_path / "options.json").write_text('{"key": "AKIA", "anon": false}')
    for k, v in env.items():
        monkeypatch.setenv("SAMPLECACHE_" + k, v)
    s = Settings()
    assert s.source == "s3://bucket/prefix/"
    assert s.cache_dir == tmp_path / "cache"
    assert int(s.max_bytes) == 3 * GiB
    assert int(s.min_free_disk) == 500 * 10**6
    assert s.samplers == 3
    assert (s.host, s.port, s.token) == ("0.0.0.0", 9999, "tok")
    # the file's options, under SAMPLECACHE_STORAGE_OPTIONS' keys
    assert s.storage_options == {"key": "AKIA", "anon": True, "endpoint_url": "http://x"}
    assert s.storage_options_file == tmp_path / "options.json"
    assert s.columns == ["id", "text"]
    assert s.seed == 17 and s.eviction_policy == "lru" and s.lease_ttl == 12.5 and s.epoch_headroom == 0.3
    assert s.epoch_max_samples == 1000 and s.discover_interval == 30
    assert (s.node_rank, s.num_nodes) == (1, 4)
    assert int(s.block_bytes) == 256 * 1024
    assert s.epoch_wait_max == 5 and s.retry_seconds == 0.5 and s.log_level == "debug" and s.epochs_kept == 7
    assert s.log_format == "json"
    assert (s.pacing, s.replace_per_epoch, int(s.max_ingest_rate)) == ("off", 0.5, 200 * 10**6)
    assert int(s.unit_bytes) == 16 * 2**20 and s.schema_file == tmp_path / "schema.parquet"
    assert s.table_version == 5 and s.filter == "lang in ('en', 'de')"
    assert s.table_as_of is not None and s.table_as_of.isoformat() == "2024-05-01T12:00:00+02:00"
    assert (s.auth, s.token_file, int(s.max_body_bytes)) == ("token", tmp_path / "token", 64 * 1024)
    assert (s.max_leases, s.max_leases_per_job) == (100, 10)
    assert s.iceberg_catalogs == {"lake": {"type": "rest", "uri": "https://catalog.example.com", "token": "t0k"}}
    assert s.public()["iceberg_catalogs"] == {"lake": ["token", "type", "uri"]}  # the token never shown
    # the bare source is "default", with what the named ones leave
    assert s.named_sources() == {"default": ("s3://bucket/prefix/", 0.25), "web": ("s3://bucket/web/", 0.5),
                                 "code": ("s3://bucket/code/", 0.25)}
    # the test covers every setting there is
    assert {k.lower() for k in env} == set(FIELDS)


def test_env_var_with_garbage_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAMPLECACHE_MAX_BYTES", "nonsense")
    with pytest.raises(ValidationError, match="max_bytes"):
        Settings()


def test_flags_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAMPLECACHE_MAX_BYTES", "1GiB")
    monkeypatch.setenv("SAMPLECACHE_SAMPLERS", "2")
    args = build_parser().parse_args(["serve", "--max-bytes", "2GiB", "--columns", "a,b",
                                      "--storage-options", '{"anon": true}'])
    s = settings_from(args)
    assert int(s.max_bytes) == 2 * GiB  # the flag
    assert s.samplers == 2  # the environment, where no flag is given
    assert s.columns == ["a", "b"]
    assert s.storage_options == {"anon": True}


# --- the serve command -----------------------------------------------------------------------------


def test_serve_with_bad_max_bytes_exits_2_naming_the_setting(tmp_path: Path) -> None:
    r = _serve(["--source", str(tmp_path), "--max-bytes", "nonsense"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--max-bytes" in r.stderr and "SAMPLECACHE_MAX_BYTES" in r.stderr
    assert "nonsense" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "samplecache-data").exists()  # nothing was started or created


def test_serve_with_bad_env_exits_2_naming_the_setting(tmp_path: Path) -> None:
    r = _serve(["--source", str(tmp_path)], tmp_path, env={"SAMPLECACHE_MAX_BYTES": "lots", "SAMPLECACHE_PORT": "x"})
    assert r.returncode == 2, r.stderr
    assert "SAMPLECACHE_MAX_BYTES" in r.stderr and "SAMPLECACHE_PORT" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("argv,flag", [
    (["--samplers", "0"], "--samplers"),
    (["--port", "99999"], "--port"),
    (["--log-level", "loud"], "--log-level"),
    (["--eviction-policy", "mru"], "--eviction-policy"),
    (["--pacing", "fast"], "--pacing"),
    (["--replace-per-epoch", "2"], "--replace-per-epoch"),
])
def test_serve_in_process_names_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and _env_var(flag[2:].replace("-", "_")) in err


@pytest.mark.parametrize("argv,flag", [
    (["--max-bytes", "0"], "--max-bytes"),
    (["--block-bytes", "100"], "--block-bytes"),
    (["--node-rank", "2", "--num-nodes", "2"], "--node-rank"),
])
def test_cross_field_errors_name_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and _env_var(flag[2:].replace("-", "_")) in err
    assert "--settings" not in err


NUMERIC = [n for n, f in Settings.model_fields.items() if f.annotation in (int, float, ByteSize)]
ABSURD = ["nan", "inf", "-inf", "Infinity", "-1", "1" + "0" * 30]


def test_the_numeric_settings_are_found() -> None:
    assert {"max_bytes", "retry_seconds", "epoch_wait_max", "seed", "samplers", "lease_ttl"} <= set(NUMERIC)


@pytest.mark.parametrize("value", ABSURD)
@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_setting_refuses_nan_inf_negative_and_absurd(name: str, value: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`samplecache config` (and so serve and a reload) exits 2 naming the setting: none is unbounded."""
    assert main(["config", f"{flag_name(name)}={value}"]) == 2, f"{name} = {value} was accepted"
    err = capsys.readouterr().err
    assert flag_name(name) in err and _env_var(name) in err, err


def test_config_refuses_a_budget_whose_map_this_machine_cannot_hold(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--max-bytes 30TB passed (exit 0) though serve could not map it (issue 21, item 8)."""
    monkeypatch.setattr(mapsize, "can_map", lambda size: size <= 85 * 2**40)  # this machine maps 85 TiB
    assert main(["config", "--max-bytes", "30TB"]) == 2
    err = capsys.readouterr().err
    assert "--max-bytes" in err and "largest budget that works here is" in err, err
    advised = err.rsplit("--max-bytes ", 1)[1].split(")")[0]
    assert main(["config", "--max-bytes", advised]) == 0
    assert main(["config", "--max-bytes", "70TiB"]) == 2  # more than any 64-bit process maps
    assert "at most 65535GiB" in capsys.readouterr().err


@pytest.mark.skipif(platform.machine() != "x86_64", reason="on x86-64 (128 TiB at most) a 40 TiB budget's map fails")
def test_serve_with_a_budget_lmdb_cannot_map_exits_2_with_the_largest_that_works(tmp_path: Path) -> None:
    """It died with a raw lmdb.MemoryError traceback, exit 1. The advised budget is one that opens."""
    r = _serve(["--cache-dir", str(tmp_path / "c"), "--max-bytes", "40TiB"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "--max-bytes" in r.stderr and "MemoryError" in r.stderr
    advised = r.stderr.rsplit("(--max-bytes ", 1)[1].split(")")[0]
    assert not list((tmp_path / "c").glob(".map-probe-*"))  # the probe's scratch dir is gone
    r = _serve(["--cache-dir", str(tmp_path / "c"), "--max-bytes", advised], tmp_path)
    assert "source is not set" in r.stderr and r.returncode == 1, r.stderr  # LMDB opened; it stopped later


def test_storage_options_file_holds_the_credentials_and_the_flag_wins_per_key(tmp_path: Path) -> None:
    f = tmp_path / "options.json"
    f.write_text('{"key": "AKIA", "secret": "s3cr3t", "anon": true}')
    s = Settings(storage_options_file=f, storage_options='{"anon": false, "endpoint_url": "http://x"}')
    assert s.storage_options == {"key": "AKIA", "secret": "s3cr3t", "anon": False, "endpoint_url": "http://x"}
    assert s.public()["storage_options"] == ["anon", "endpoint_url", "key", "secret"]  # names, never values


@pytest.mark.parametrize("content,why", [
    (None, "No such file"), ("AKIA-SECRET, not json", "is not JSON"), ('["AKIA-SECRET"]', "must hold a JSON object"),
    ("x" * (1 << 20) + "AKIA-SECRET", "larger than"),
])
def test_a_bad_storage_options_file_exits_2_without_quoting_it(content: str | None, why: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "options.json"
    if content is not None:
        f.write_text(content)
    assert main(["config", "--storage-options-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert why in err and str(f) in err and "AKIA-SECRET" not in err, err


def test_serve_with_bad_storage_options_env_exits_2(tmp_path: Path) -> None:
    r = _serve(["--source", str(tmp_path)], tmp_path, env={"SAMPLECACHE_STORAGE_OPTIONS": "notjson"})
    assert r.returncode == 2, r.stderr
    assert "SAMPLECACHE_STORAGE_OPTIONS" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_storage_options_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--storage-options", "{not json"]) == 2
    err = capsys.readouterr().err
    assert "--storage-options" in err and "not JSON" in err


@pytest.fixture(scope="module")
def serve_help(tmp_path_factory: pytest.TempPathFactory) -> str:
    r = subprocess.run([sys.executable, "-m", "samplecache_service", "serve", "--help"],
                       cwd=tmp_path_factory.mktemp("help"), env=_clean_environ(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_is_a_serve_flag(name: str, serve_help: str, tmp_path: Path) -> None:
    flag = flag_name(name)
    (tmp_path / "options.json").write_text('{"b": 2}')
    assert re.search(rf"(^|\s){re.escape(flag)}(\s|$)", serve_help, re.M), f"{flag} missing from serve --help"
    # and it reaches Settings under its own name
    value = {"source": "s3://x/", "cache_dir": "/tmp/x", "max_bytes": "2GiB", "min_free_disk": "1GB",
             "samplers": "255", "host": "::1", "port": "1234", "token": "t", "storage_options": '{"a": 1}',
             "columns": "a", "seed": "3", "eviction_policy": "random", "lease_ttl": "3", "epoch_headroom": "0.1",
             "epoch_max_samples": "7",
             "discover_interval": "9", "node_rank": "0", "num_nodes": "2", "block_bytes": "8KiB",
             "epoch_wait_max": "4", "epochs_kept": "9", "retry_seconds": "2", "log_level": "error", "pacing": "off",
             "replace_per_epoch": "0.5", "max_ingest_rate": "1MB", "unit_bytes": "16MiB",
             "schema_file": "/tmp/schema.parquet", "auth": "off", "token_file": "/tmp/token",
             "max_body_bytes": "2MiB", "log_format": "json", "max_leases": "99", "max_leases_per_job": "9",
             "table_version": "3", "filter": "lang = 'en'", "table_as_of": "2024-05-01T00:00:00Z",
             "storage_options_file": str(tmp_path / "options.json"), "sources": "web=s3://x/",
             "share": "web=0.5", "iceberg_catalogs": '{"lake": {"type": "sql"}}'}.get(name)
    if value is None:
        pytest.fail(f"new setting {name!r}: add a sample value to this test")
    named = ["--source", "web=s3://w/"] if name == "share" else []  # a share names a source
    args = build_parser().parse_args(["serve", *named, flag, value])
    s = settings_from(args)
    assert getattr(s, name) != Settings.model_fields[name].get_default(call_default_factory=True) or name == "node_rank"


def test_serve_help_mentions_the_environment(serve_help: str) -> None:
    assert "SAMPLECACHE_" in serve_help


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_is_documented_in_readme(name: str) -> None:
    if not README.exists():
        pytest.skip("README.md is not written yet")
    text = README.read_text()
    assert flag_name(name) in text, f"{flag_name(name)} is not in README.md"
    assert _env_var(name) in text, f"{_env_var(name)} is not in README.md"
