"""How each named source's blocks hold the columns a job reads (pure functions over schemas).

A manifest of several sources carries each source's schema. The job's columns are those of the manifest's main
schema; a source whose blocks hold them in another order (it has other columns besides) is read through a column
map, and a source that lacks one, or holds it as another type, cannot be read with the others: ``MixedColumns``
names both sources and both types. No value is ever cast to fit. With ``fill_missing``, a column a source lacks
reads as nulls from that source's blocks (with a mask in tensor batches, as for files that lack a column).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from samplecache.format.record import Column, Schema


class MixedColumns(ValueError):
    """A column the job reads that one of its sources lacks, or holds as another type."""


def _shown(col: Column) -> str:
    return col.arrow or f"{col.kind} {col.dtype or ''}{list(col.shape) if col.shape else ''}".strip()


def _same(a: Column, b: Column) -> bool:
    """Whether two sources' columns decode the same way (the type tree included)."""
    return (a.kind, a.dtype, a.shape, a.tz) == (b.kind, b.dtype, b.shape, b.tz) and \
        dict(a.type_node()) == dict(b.type_node())


def column_maps(main: Schema, main_name: str, cols: Sequence[int], schemas: Mapping[str, Schema],
                fill_missing: bool = False) -> tuple[dict[str, list[int] | None], dict[str, str]]:
    """For each source: the index in its schema of each main column read (a list over the main columns, -1 for
    those not read, or missing and filled with nulls; None: its blocks hold them where the main schema does), or
    why it cannot be read."""
    maps: dict[str, list[int] | None] = {}
    problems: dict[str, str] = {}
    for name, schema in schemas.items():
        where = [-1] * len(main.columns)
        wrong: list[str] = []
        for ci in cols:
            col = main.columns[ci]
            if col.name not in schema.names:
                if not fill_missing:
                    wrong.append(f"source {name!r} has no column {col.name!r}, which source {main_name!r} has "
                                 f"(fill_missing=True reads it as nulls there)")
                continue
            k = schema.index(col.name)
            if not _same(col, schema.columns[k]):
                wrong.append(f"column {col.name!r} is {_shown(schema.columns[k])} in source {name!r} and "
                             f"{_shown(col)} in source {main_name!r}")
            where[ci] = k
        if wrong:
            problems[name] = "; ".join(wrong)
        elif all(where[ci] == ci for ci in cols):
            maps[name] = None
        else:
            maps[name] = where
    return maps, problems


class MappedView:
    """A block of one source read through the main schema's column indices (``BlockView``'s reading methods); a
    column the source lacks (-1) reads as nulls."""

    __slots__ = ("_view", "_map", "_main", "buf", "nrows", "_table")

    def __init__(self, view: Any, where: list[int], main: Schema) -> None:
        self._view, self._map, self._main = view, where, main
        self.buf, self.nrows = view.buf, view.nrows
        self._table = [view._table[k] if k >= 0 else None for k in where]

    def _missing(self, ci: int) -> tuple[int, ...]:
        col = self._main.columns[ci]
        return (self.nrows, *col.shape)

    def column_array(self, ci: int) -> Any:
        k = self._map[ci]
        if k < 0:
            return np.zeros(self._missing(ci), np.dtype(self._main.columns[ci].dtype or "<f4"))
        return self._view.column_array(k)

    def column_mask(self, ci: int) -> Any:
        k = self._map[ci]
        return np.zeros(self._missing(ci), bool) if k < 0 else self._view.column_mask(k)

    def has_nulls(self, ci: int) -> bool:
        k = self._map[ci]
        return True if k < 0 else bool(self._view.has_nulls(k))

    def value(self, ci: int, row: int) -> Any:
        k = self._map[ci]
        return None if k < 0 else self._view.value(k, row)


__all__ = ["MixedColumns", "column_maps", "MappedView"]
