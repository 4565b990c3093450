"""service/samplecache_service/store/fileinfo.py: the catalog's typed record of one remote file, and its JSON in the
``files`` database, which stays the one written before the record was typed (a cache from then still opens)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from samplecache_service.remote.planner import Unit, build_units, unit_current
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.fileinfo import READ, FileInfo
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.writer import Writer

# the files db's values as the daemon wrote them while the record was a dict (json.dumps of the dict)
FOOTER = (b'{"row_groups": [10, 10], "row_group_bytes": [400, 400], "units": [[0, 1, 10], [1, 1, 10]], '
          b'"size": 5000, "footer": 300, "signature": "5000:abc", "seq": 2')
OLD = {
    "read": FOOTER + b"}",
    # quarantined by the scheduler (after the units' bytes failed to parse), then released by hand
    "quarantined": FOOTER + b', "quarantined": true, "reason": "bad thrift", "kind": "corrupt", "at": 1700000000.5}',
    "released": FOOTER + b', "quarantined": true, "reason": "bad thrift", "kind": "corrupt", "at": 1700000000.5, '
                         b'"recheck": true}',
    # a record from before units, sizes and the footer's length were kept
    "oldest": b'{"row_groups": [5, 6], "signature": null, "seq": 1}',
}
# quarantined by discovery: the same keys as now, in another order
UNORDERED = {
    "unreadable": b'{"row_groups": [], "quarantined": true, "reason": "unreadable footer: ArrowInvalid: no magic", '
                  b'"kind": "corrupt", "at": 1700000001.25, "signature": "9:e", "seq": 3}',
    "schema": b'{"row_groups": [7], "row_group_bytes": [70], "units": [[0, 1, 7]], "size": 900, "footer": 80, '
              b'"quarantined": true, "reason": "schema: column \'x\' is string", "kind": "schema", '
              b'"at": 1700000002.0, "signature": "900:f", "seq": 4}',
}


def test_every_form_written_before_reads_and_writes_back_the_same() -> None:
    for name, raw in OLD.items():
        assert FileInfo.from_json(raw).to_json() == raw, name
    for name, raw in UNORDERED.items():
        assert json.loads(FileInfo.from_json(raw).to_json()) == json.loads(raw), name


def test_the_old_dict_form_reads_as_typed_fields() -> None:
    info = FileInfo.from_json(OLD["released"])
    assert info == FileInfo(row_groups=(10, 10), row_group_bytes=(400, 400), units=((0, 1, 10), (1, 1, 10)),
                            size=5000, footer=300, signature="5000:abc", seq=2, quarantined=True, reason="bad thrift",
                            kind="corrupt", at=1700000000.5, recheck=True)
    oldest = FileInfo.from_json(OLD["oldest"])
    assert (oldest.row_group_bytes, oldest.units, oldest.size, oldest.footer) == (None, None, None, None)
    assert not oldest.quarantined and oldest.kind == "corrupt" and oldest.reason == ""
    unreadable = FileInfo.from_json(UNORDERED["unreadable"])
    assert unreadable.quarantined and unreadable.row_groups == () and unreadable.units is None


def test_every_field_is_read_and_unknown_keys_are_left_out() -> None:
    assert set(READ) == {f.name for f in fields(FileInfo)}
    assert FileInfo.from_dict({"row_groups": [1], "seq": 2, "rows": 99}) == FileInfo(row_groups=(1,), seq=2)


def test_quarantine_keeps_the_file_s_facts_and_release_marks_it_for_a_second_look() -> None:
    info = FileInfo.from_json(OLD["read"])
    q = info.release().quarantine("schema: x", "schema")  # a quarantine clears an earlier release
    assert (q.row_groups, q.units, q.size, q.signature, q.seq) == (info.row_groups, info.units, 5000, "5000:abc", 2)
    assert q.quarantined and q.kind == "schema" and q.reason == "schema: x" and q.at is not None and not q.recheck
    assert q.release().recheck and q.release().quarantined
    stored = json.loads(q.release().to_json())
    assert list(stored)[-5:] == ["quarantined", "reason", "kind", "at", "recheck"]
    assert "recheck" not in json.loads(q.to_json()) and "quarantined" not in json.loads(info.to_json())


def test_a_cache_written_before_opens_with_typed_records_and_is_rewritten_byte_for_byte(tmp_path: Path) -> None:
    env, dbs = open_env(tmp_path / "lmdb", 1 << 24)
    with env.begin(write=True) as txn:
        for name, raw in {**OLD, **UNORDERED}.items():
            txn.put(name.encode(), raw, db=dbs[b"files"])
    env.close()

    env, dbs = open_env(tmp_path / "lmdb", 1 << 24)
    catalog = Catalog(env, dbs)
    writer = Writer(env, dbs, catalog)
    try:
        files = catalog.files()
        assert files["released"].recheck and files["quarantined"].reason == "bad thrift"
        assert catalog.file("oldest").row_groups == (5, 6) and catalog.file("not listed") == FileInfo()
        # the planner reads the old records: planned units where stored, one per row group where not
        units = build_units(files)
        assert Unit("oldest", 1, 6) in units and Unit("read", 1, 10) in units
        assert all(unit_current(u, files[u.path]) for u in units)
        writer.put_files(files).result()
        with env.begin() as txn:
            for name, raw in OLD.items():
                assert txn.get(name.encode(), db=dbs[b"files"]) == raw, name
    finally:
        writer.close()
        env.close()
