"""The daemon's sources as a job sees them: waiting for a mixture's sources to hold samples, and the schema the
job's batches come in (each column's type unified over the sources it reads)."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from samplecache.api.client import DaemonError, request_json
from samplecache.format.record import Schema
from samplecache.reading.blocks.layouts import read_schema
from samplecache.reading.epoch_source import EpochSource, check_columns
from samplecache.reading.split import MissingSource

POLL_S = 0.5  # between two looks at the daemon's sources while a mixture waits for one


def await_sources(source: EpochSource, mixture: Mapping[str, float], wait: float) -> None:
    """Wait up to ``wait`` seconds until every source the mixture gives a share to holds a sample; then raise
    ``MissingSource`` naming each that does not, and why: unknown to the daemon (naming its sources), failing
    (its problem), or still empty (its state). A daemon without ``/v1/sources`` is not asked."""
    s = source
    wanted = [n for n, w in mixture.items() if w > 0]
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        try:
            listed = request_json(f"{s.url}/v1/sources", token=s.token, retries=s.retries, deadline=s.deadline,
                                  what="reading the daemon's sources")
        except DaemonError as e:
            if e.status == 404:
                return
            raise
        got = {x["name"]: x for x in listed}
        unknown = [n for n in wanted if n not in got]
        if unknown:
            raise MissingSource(f"the mixture gives a share to source(s) {unknown}, which the daemon does not "
                                f"have; its sources are {sorted(got)}")
        empty = [n for n in wanted if not got[n]["samples"]]
        if not empty:
            return
        if time.monotonic() >= deadline:
            why = "; ".join(f"{n}: " + (f"failing ({got[n]['problem']})" if got[n].get("problem") else
                                       f"still empty ({got[n]['state']}"
                                       + (f": {got[n]['reason']})" if got[n].get("reason") else ")"))
                            for n in empty)
            raise MissingSource(f"the mixture gives a share to source(s) {empty}, which hold no sample after "
                                f"waiting {wait:g} s: {why}")
        time.sleep(POLL_S)


def job_schema(source: EpochSource, columns: Sequence[str] | None, fill_missing: bool,
               mixture: Mapping[str, float] | None) -> dict[str, Any]:
    """``GET /v1/schema``, its ``columns`` narrowed to (and in the order of) ``columns``: each with ``name``,
    ``kind``, ``dtype``, ``shape``, ``nullable``. With several sources, the types the batches come in: each
    column's unified over the sources read (the mixture's, else every one). Raises ``MissingColumn``."""
    s = source

    def get(path: str, retries: int | None = s.retries) -> Any:
        return request_json(f"{s.url}{path}", token=s.token, retries=retries, deadline=s.deadline,
                            what="reading the cache's schema")
    got: dict[str, Any] = get("/v1/schema")
    by_name = {c["name"]: c for c in got["columns"]}
    names = sorted(x["name"] for x in get("/v1/sources") if not mixture or mixture.get(x["name"], 0) > 0)
    schemas: dict[str, Schema] = {}
    for n in names if len(names) > 1 else ():
        try:
            schemas[n] = Schema.from_json(get(f"/v1/schema?source={n}", retries=0))
        except DaemonError as e:  # a source not discovered yet (503) or just removed (404): its read says
            if e.status not in (404, 503):
                raise
    if len(schemas) > 1:
        read = read_schema(schemas, list(columns) if columns is not None else list(by_name), fill_missing)
        by_name = {c.name: {**by_name.get(c.name, {}), **c.to_json()} for c in read.columns}
    wanted = list(columns) if columns is not None else list(by_name)
    check_columns(wanted, list(by_name), got.get("skipped_columns"))
    return {**got, "columns": [by_name[c] for c in wanted]}


__all__ = ["POLL_S", "await_sources", "job_schema"]
