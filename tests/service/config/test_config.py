"""The config file: precedence (flags > environment > file > defaults), `samplecache config`, errors that name the
file, line and key, the example config, and SIGHUP reloads of a live daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
import tomllib
from paths import REPO

from samplecache_service.config import file as config_mod
from samplecache_service.config.file import ConfigError, config_path, load, read_config
from samplecache_service.config.settings import Settings
from samplecache_service.ops.reload import RUNTIME, changes

EXAMPLE = REPO / "deploy" / "samplecache.toml"
README = REPO / "README.md"
FIELDS = list(Settings.model_fields)


@pytest.fixture(autouse=True)
def _no_samplecache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("SAMPLECACHE_"):
            monkeypatch.delenv(k)


def _clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("SAMPLECACHE_")}


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "samplecache_service", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**_clean_environ(), **(env or {})})


def test_precedence_flags_then_env_then_file_then_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('source = "s3://b/p/"\nmax_bytes = "3GiB"\nsamplers = 3\nseed = 9\n\n[storage_options]\nanon = true\n')
    monkeypatch.setenv("SAMPLECACHE_SAMPLERS", "5")
    monkeypatch.setenv("SAMPLECACHE_SEED", "11")
    got = load({"seed": "13", "port": None}, f)
    s = got.settings
    assert int(s.max_bytes) == 3 * 2**30 and s.source == "s3://b/p/" and s.storage_options == {"anon": True}
    assert s.samplers == 5 and s.seed == 13 and s.port == 8750
    assert got.sources["source"] == f"config {f}:1" and got.sources["max_bytes"] == f"config {f}:2"
    assert got.sources["storage_options"] == f"config {f}:6"
    assert got.sources["samplers"] == "env SAMPLECACHE_SAMPLERS"
    assert got.sources["seed"] == "flag --seed" and got.sources["port"] == "default"


def test_config_file_is_named_by_flag_then_env_then_default_path(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "etc.toml"
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", default)
    assert config_path(None, {}) is None  # no default file: no config
    default.write_text("seed = 1\n")
    assert config_path(None, {}) == default
    assert config_path(None, {"SAMPLECACHE_CONFIG": "/x.toml"}) == Path("/x.toml")
    assert config_path("/y.toml", {"SAMPLECACHE_CONFIG": "/x.toml"}) == Path("/y.toml")
    assert load({}).settings.seed == 1 and load({}).sources["seed"] == f"config {default}:1"
    with pytest.raises(ConfigError, match="no such config file"):
        load({}, tmp_path / "missing.toml")


@pytest.mark.parametrize("text,line,key,what", [
    ('source = "x"\n\nmax_byte = 5\n', 3, "max_byte", "unknown setting 'max_byte' (did you mean 'max_bytes'?)"),
    ('# c\nmax_bytes = "lots"\n', 2, "max_bytes", "not a size"),
    ('samplers = 0\n', 1, "samplers", "greater than or equal to 1"),
    ('[storage_options]\nx = 1\n[columns]\na = 1\n', 3, "columns", "list"),
    ('eviction_policy = "mru"\n', 1, "eviction_policy", "unknown eviction policy"),
])
def test_bad_config_file_exits_2_naming_file_line_and_key(tmp_path: Path, text: str, line: int, key: str,
                                                          what: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    r = _cli(["serve", "--config", str(f)], tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"{f}:{line}" in r.stderr and key in r.stderr and what in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "samplecache-data").exists()  # nothing was started


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.toml"
    f.write_text('source = "x"\nmax_bytes = \n')
    r = _cli(["config", "--config", str(f)], tmp_path)
    assert r.returncode == 2 and str(f) in r.stderr and "line 2" in r.stderr, r.stderr


def test_config_command_prints_every_setting_its_source_and_masks_secrets(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('source = "https://user:hunter2@example.com/data/"\ntoken = "sekrit-token"\n'
                 '[storage_options]\nkey = "AKIAXYZ"\nsecret = "s3cr3t"\n')
    catalogs = '{"lake": {"type": "rest", "uri": "https://u:pw9@cat.example.com", "credential": "c1ient:s3cret"}}'
    r = _cli(["config", "--config", str(f), "--port", "9000"], tmp_path,
             env={"SAMPLECACHE_SEED": "4", "SAMPLECACHE_ICEBERG_CATALOGS": catalogs})
    assert r.returncode == 0, r.stderr
    for secret in ("hunter2", "sekrit-token", "AKIAXYZ", "s3cr3t", "pw9", "c1ient"):
        assert secret not in r.stdout
    assert '"type": "rest"' in r.stdout and "cat.example.com" in r.stdout  # what is no secret is shown
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if not line.startswith("#")}
    assert set(rows) == set(FIELDS) - {"storage_options"} | {"storage_options.key", "storage_options.secret"}
    assert rows["port"].rstrip().endswith("flag --port") and "9000" in rows["port"]
    assert rows["seed"].rstrip().endswith("env SAMPLECACHE_SEED")
    assert rows["token"].rstrip().endswith(f"config {f}:2") and "<set>" in rows["token"]
    assert rows["samplers"].rstrip().endswith("default")
    j = _cli(["config", "--config", str(f), "--json"], tmp_path)
    doc = json.loads(j.stdout)
    assert doc["config_file"] == str(f) and set(doc["settings"]) == set(FIELDS)
    assert doc["settings"]["storage_options"] == {"value": {"key": "<hidden>", "secret": "<hidden>"},
                                                  "source": f"config {f}:3",
                                                  "sources": {"key": f"config {f}:4", "secret": f"config {f}:5"}}
    assert "hunter2" not in j.stdout


def test_a_setting_below_the_storage_options_table_is_warned_about(tmp_path: Path) -> None:
    """TOML's trap: the README's example ends with its table, and a setting appended to it lands in the table.
    The example keeps its table last; `samplecache config` (and serve, a reload) warn, naming the line."""
    example = re.search(r"```toml\n(.*?)```", README.read_text(), re.S)
    assert example is not None
    text = example.group(1)
    parsed = tomllib.loads(text)
    head = tomllib.loads(text[:text.index("\n[")])  # what comes before the first table's header
    assert set(parsed) <= set(FIELDS) and "storage_options" in parsed
    assert set(head) == {k for k, v in parsed.items() if not isinstance(v, dict)}, "the table must come last"
    f = tmp_path / "c.toml"
    f.write_text(text + "seed = 7\n")
    line = len(text.splitlines()) + 1
    got = load({}, f)
    assert got.settings.seed == 0 and got.settings.storage_options["seed"] == 7  # the trap itself
    assert config_mod.table_traps(got.config) == [
        f"{f}:{line}: 'seed' is a key of the [storage_options] table (every key below a [table] header belongs to "
        f"it), not the samplecache setting 'seed': to set it, move it above the first [table] of the file"]
    r = _cli(["config", "--config", str(f)], tmp_path)
    assert r.returncode == 0 and f"warning: {f}:{line}: 'seed' is a key of the [storage_options]" in r.stderr
    assert f"# warning: {f}:{line}: 'seed'" in r.stdout
    f.write_text(text)
    assert config_mod.table_traps(load({}, f).config) == []


def test_config_command_shows_the_endpoint_and_each_storage_option_at_its_own_line(tmp_path: Path) -> None:
    """endpoint_url is no secret: shown (a password in it masked); keys and unknown options stay hidden; each
    option's source is its own line, not the table's header."""
    f = tmp_path / "c.toml"
    f.write_text('source = "s3://b/p/"\n\n[storage_options]\nendpoint_url = "http://u:pw@127.0.0.1:8333"\n'
                 'key = "AKIAXYZ"\nmystery = "m1"\nclient_kwargs = { region_name = "eu", verify = false }\n'
                 'config_kwargs.s3.addressing_style = "path"\n')
    r = _cli(["config", "--config", str(f)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "AKIAXYZ" not in r.stdout and "m1" not in r.stdout and "pw@" not in r.stdout
    rows = {line.split()[0]: line.split(None, 1)[1] for line in r.stdout.splitlines() if not line.startswith("#")}
    assert rows["storage_options.endpoint_url"].split() == ['"http://***@127.0.0.1:8333"', "config", f"{f}:4"]
    assert rows["storage_options.key"].split() == ['"<hidden>"', "config", f"{f}:5"]
    assert rows["storage_options.mystery"].split() == ['"<hidden>"', "config", f"{f}:6"]
    assert rows["storage_options.client_kwargs"].rstrip().endswith(f"config {f}:7")
    assert '"region_name": "eu"' in rows["storage_options.client_kwargs"]
    assert rows["storage_options.config_kwargs"].rstrip().endswith(f"config {f}:8")
    assert '"addressing_style": "path"' in rows["storage_options.config_kwargs"]
    doc = json.loads(_cli(["config", "--config", str(f), "--json"], tmp_path).stdout)["settings"]
    assert doc["storage_options"]["value"]["endpoint_url"] == "http://***@127.0.0.1:8333"
    assert doc["storage_options"]["source"] == f"config {f}:3"  # the table as a whole
    assert doc["storage_options"]["sources"]["key"] == f"config {f}:5"
    env = _cli(["config"], tmp_path, env={"SAMPLECACHE_STORAGE_OPTIONS": '{"endpoint_url": "http://h:1", "key": "k"}'})
    rows = {line.split()[0]: line.split(None, 1)[1] for line in env.stdout.splitlines() if not line.startswith("#")}
    assert rows["storage_options.endpoint_url"].split() == ['"http://h:1"', "env", "SAMPLECACHE_STORAGE_OPTIONS"]


def test_config_warns_when_a_secret_is_a_flag_every_local_user_can_read(tmp_path: Path) -> None:
    """--token and --storage-options show in /proc/PID/cmdline (issue 21, item 12): said on stderr and in the
    output; the file and environment forms say nothing."""
    r = _cli(["config", "--token", "sekrit-token", "--storage-options", '{"secret": "s3cr3t"}'], tmp_path)
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warned) == 2 and "--token-file FILE or SAMPLECACHE_TOKEN" in warned[0], r.stderr
    assert "--storage-options-file FILE" in warned[1] and all("/proc/PID/cmdline" in w for w in warned)
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("# warning: ")] == [
        "# warning: " + w.split("warning: ", 1)[1] for w in warned]
    for secret in ("sekrit-token", "s3cr3t"):
        assert secret not in r.stdout + r.stderr
    doc = json.loads(_cli(["config", "--token", "t", "--json"], tmp_path).stdout)
    assert len(doc["warnings"]) == 1 and "--token " in doc["warnings"][0]

    options = tmp_path / "options.json"
    options.write_text('{"secret": "s3cr3t"}')
    options.chmod(0o600)
    r = _cli(["config", "--storage-options-file", str(options)], tmp_path, env={"SAMPLECACHE_TOKEN": "t"})
    assert r.returncode == 0 and "warning" not in r.stderr + r.stdout, r.stderr
    options.chmod(0o644)  # every user can read the file: said too
    r = _cli(["config", "--storage-options-file", str(options)], tmp_path)
    assert "can be read by every user (mode 644)" in r.stderr, r.stderr
    # a sibling: credentials in the source URL are on the command line too
    r = _cli(["config", "--source", "https://user:hunter2@example.com/data/"], tmp_path)
    assert "--source holds credentials" in r.stderr and "hunter2" not in r.stderr + r.stdout, r.stderr
    r = _cli(["config"], tmp_path, env={"SAMPLECACHE_SOURCE": "https://user:hunter2@example.com/data/"})
    assert "warning" not in r.stderr, r.stderr


def test_serve_logs_a_secret_given_as_a_flag_at_start(tmp_path: Path) -> None:
    r = _cli(["serve", "--cache-dir", str(tmp_path / "c"), "--log-format", "json", "--token", "sekrit-token"],
             tmp_path)
    assert r.returncode == 1  # no source: it stops after the start log
    lines = [json.loads(ln) for ln in r.stderr.splitlines() if ln.startswith("{")]
    exposed = [ln for ln in lines if ln["event"] == "secret_exposed"]
    assert len(exposed) == 1 and exposed[0]["level"] == "warning" and "--token" in exposed[0]["msg"], lines
    assert "sekrit-token" not in r.stderr


def _example_values() -> dict[str, Any]:
    """The example config with every commented ``# key = value`` line turned on."""
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^#\s?([a-z_]+ = .*)$", line)
        lines.append(m.group(1) if m else line)
    return tomllib.loads("\n".join(lines))


def test_every_setting_is_in_the_example_config_and_it_is_valid(tmp_path: Path) -> None:
    values = _example_values()
    assert set(values) == set(FIELDS), f"missing: {set(FIELDS) - set(values)}, unknown: {set(values) - set(FIELDS)}"
    read_config(EXAMPLE)  # the file as shipped parses, with no unknown key
    options = tmp_path / "storage-options.json"  # the example names a file of the host's; it is read at start
    options.write_text("{}")
    s = Settings.layered({}, {**values, "node_rank": 0, "storage_options_file": str(options)})
    assert int(s.max_bytes) == 500 * 2**30


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_is_documented_in_the_readme_with_its_config_key(name: str) -> None:
    text = README.read_text()
    flag = "--" + name.replace("_", "-")
    assert re.search(rf"`{re.escape(flag)}`", text), f"{flag} is not in README.md's settings table"
    assert f"SAMPLECACHE_{name.upper()}" in text, f"SAMPLECACHE_{name.upper()} is not in README.md"
    assert re.search(rf"`{name}`", text), f"config key `{name}` is not in README.md"


def test_reload_sorts_changes_into_runtime_and_restart() -> None:
    old = Settings.layered({"source": "s3://a/"}, {})
    new = Settings.layered({"source": "s3://a/", "max_bytes": "1GiB", "samplers": "7", "log_level": "debug",
                            "port": "9"}, {})
    runtime, restart = changes(old, new)
    assert runtime == {"max_bytes": 2**30, "log_level": "debug"} and sorted(restart) == ["port", "samplers"]
    assert RUNTIME >= {"max_bytes", "eviction_policy", "pacing", "replace_per_epoch", "max_ingest_rate",
                       "log_level"}
    # against the values in use: a PATCHed budget is put back to what the settings say, an equal one is left
    live = {"max_bytes": 2**29, "log_level": "debug"}
    runtime, restart = changes(old, new, live)
    assert runtime == {"max_bytes": 2**30} and sorted(restart) == ["port", "samplers"]
    assert changes(old, old, {"pacing": "off"}) == ({"pacing": "epoch"}, [])


# --- SIGHUP on a live daemon -----------------------------------------------------------------------


def _config(d: Any, get: Callable[..., Any]) -> dict[str, Any]:
    r = get(d.url + "/v1/status")
    assert r.status == 200
    return dict(r.json())


@pytest.mark.e2e
def test_sighup_reloads_runtime_settings_and_names_the_rest(daemon: Any, tmp_path: Path, get: Callable[..., Any],
                                                            until: Callable[..., Any]) -> None:
    f = tmp_path / "daemon.toml"
    f.write_text('max_bytes = "64MiB"\nreplace_per_epoch = 0.2\nlog_level = "info"\n')
    d = daemon(extra=["--config", str(f)])
    st = _config(d, get)
    assert st["config"]["file"] == str(f) and st["settings"]["max_bytes"] == 64 * 2**20
    f.write_text('max_bytes = "48MiB"\nreplace_per_epoch = 0.5\nlog_level = "debug"\ndiscover_interval = 30\n'
                 'eviction_policy = "lru"\n')
    os.kill(d.proc.pid, signal.SIGHUP)
    st = until(lambda: (s := _config(d, get))["config"].get("reloads") == 1 and s, 20, "the reload")
    assert st["config"]["last_error"] is None, st["config"]
    assert st["config"]["needs_restart"] == ["discover_interval"]  # samplers: the fixture's flag wins
    cfg = get(d.url + "/v1/config").json()
    assert (cfg["max_bytes"], cfg["replace_per_epoch"], cfg["eviction_policy"]) == (48 * 2**20, 0.5, "lru")
    assert st["settings"]["max_bytes"] == 48 * 2**20 and st["settings"]["log_level"] == "debug"
    log = until(lambda: "reloaded settings" in (t := d.log_tail(20000)) and t, 10, "the reload's log line")
    assert "need a restart to change: discover_interval" in log and "max_bytes = 50331648" in log
    # a broken file: nothing changes, the daemon keeps running and says why
    f.write_text('max_bytes = "lots"\n')
    os.kill(d.proc.pid, signal.SIGHUP)
    st = until(lambda: (s := _config(d, get))["config"].get("reloads") == 2 and s, 20, "the second reload")
    assert f"{f}:1: max_bytes" in st["config"]["last_error"]
    assert get(d.url + "/v1/config").json()["max_bytes"] == 48 * 2**20
    assert get(d.url + "/healthz").status == 200 and d.proc.poll() is None
    until(lambda: "reload failed, still running on the settings in use" in d.log_tail(20000), 10, "the error log")
    # a budget the cache cannot take is refused as a whole, and said
    f.write_text('max_bytes = 4096\nreplace_per_epoch = 0.9\n')
    until(lambda: _config(d, get)["shards"] > 0, 60, "a shard")
    os.kill(d.proc.pid, signal.SIGHUP)
    st = until(lambda: (s := _config(d, get))["config"].get("reloads") == 3 and s, 20, "the third reload")
    assert "smaller than one shard" in (st["config"]["last_error"] or ""), st["config"]
    cfg = get(d.url + "/v1/config").json()
    assert (cfg["max_bytes"], cfg["replace_per_epoch"]) == (48 * 2**20, 0.5)
    # a PATCH lasts until a reload: the reload makes the daemon match its file again
    req = urllib.request.Request(d.url + "/v1/config", data=json.dumps({"max_bytes": "40MiB"}).encode(),
                                 method="PATCH", headers={**d.headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.loads(r.read())["max_bytes"] == 40 * 2**20
    f.write_text('max_bytes = "48MiB"\nreplace_per_epoch = 0.5\nlog_level = "debug"\ndiscover_interval = 30\n'
                 'eviction_policy = "lru"\n')
    os.kill(d.proc.pid, signal.SIGHUP)
    st = until(lambda: (s := _config(d, get))["config"].get("reloads") == 4 and s, 20, "the fourth reload")
    assert st["config"]["last_error"] is None and get(d.url + "/v1/config").json()["max_bytes"] == 48 * 2**20
    time.sleep(0.2)
    assert d.proc.poll() is None


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    """`samplecache config | head` and friends: the reader goes away before the command writes, and the command
    stops with SIGPIPE's status (141), as Unix tools do, with no traceback."""
    p = subprocess.Popen([sys.executable, "-m", "samplecache_service", "config", "--source", "s3://b/p/"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read().decode()
    code = p.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 141, (code, err)
