"""Quarantined remote files: list them, release one (it is read again at once)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from samplecache_service.http.deps import DaemonDep, TokenDep
from samplecache_service.http.models import Problem

router = APIRouter(tags=["quarantine"])
ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (401, 404, 422)}


class QuarantineEntry(BaseModel):
    id: str = Field(description="A stable id of the file: DELETE /v1/quarantine/{id} releases it")
    path: str = Field(description="The remote file, as the source lists it (credentials masked)")
    reason: str = Field(description="Why it was quarantined, in words")
    kind: str = Field(description="corrupt (pyarrow cannot parse its bytes) or schema (it does not fit the dataset)")
    at: float | None = Field(None, description="When (Unix time)")
    released: bool = Field(False, description="Released by hand: read again at the next turn")


class QuarantineList(BaseModel):
    total: int
    by_kind: dict[str, int] = Field(description="Quarantined files per reason kind")
    files: list[QuarantineEntry]


@router.get("/v1/quarantine", response_model=QuarantineList)
async def list_quarantine(d: DaemonDep) -> Any:
    """Files left out of sampling because their bytes cannot be parsed or their schema does not fit. A file
    leaves quarantine by itself when it changes (size, ETag or mtime)."""
    files = d.quarantined()
    kinds: dict[str, int] = {}
    for f in files:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    return {"total": len(files), "by_kind": kinds, "files": files}


@router.delete("/v1/quarantine/{file:path}", response_model=QuarantineEntry, responses=ERRORS,
               dependencies=[TokenDep])
async def release(d: DaemonDep,
                  file: Annotated[str, Path(min_length=1, max_length=4096,
                                            description="The file's id or path as GET /v1/quarantine lists them "
                                                        "(credentials masked)")]) -> Any:
    """Take a file out of quarantine: it is read again now (and quarantined again if it is still bad)."""
    # errors.NotFound: mapped to 404 in api.py. The reply is the entry as listed (masked), never the name as
    # sent: a real path may hold the source's password
    return await asyncio.wrap_future(d.release(file))
