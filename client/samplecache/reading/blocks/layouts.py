"""How each named source's blocks hold the columns a job reads (pure functions over schemas).

A manifest of several sources carries each source's schema. The job's columns are those of the manifest's main
schema; a source whose blocks hold them in another order (it has other columns besides) is read through a column
map. Types are unified over the sources by the rules that unify files (Arrow's permissive promotion, README
"Schema across files"): integers widen, int with float becomes float, timestamps and durations take the finer
unit; a source whose column is narrower is read widened (``MappedView``). A cast that Arrow's rules allow but that
can lose a value (uint64 into int64, a 64-bit integer into float64) is checked on every block read and raises
``LossyValue`` naming the source, the column and the value, never a changed value. A column that one source lacks,
or holds as a type that cannot be unified, cannot be read with the others: ``MixedColumns`` names both sources and
both types. With ``fill_missing``, a column a source lacks reads as nulls from that source's blocks (with a mask
in tensor batches, as for files that lack a column).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from samplecache.format.record import Column, Schema


class MixedColumns(ValueError):
    """A column the job reads that one of its sources lacks, or holds as a type that cannot be unified."""


class LossyValue(ValueError):
    """A value of a source that its column's unified type cannot hold (e.g. 2**63 in a uint64 column read as
    int64 with another source's)."""


def _shown(col: Column) -> str:
    return col.arrow or f"{col.kind} {col.dtype or ''}{list(col.shape) if col.shape else ''}".strip()


def _retyped(node: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """A type tree with its numbers' dtype set to ``dtype`` (the form two widenable columns share)."""
    out = dict(node)
    if out.get("t") == "prim":
        out["dtype"] = dtype
    elif "child" in out:
        out["child"] = _retyped(out["child"], dtype)
    return out


def _float_for(i: np.dtype) -> np.dtype:
    """The narrowest float Arrow widens integer dtype ``i`` to: float16 holds 8-bit ints, float32 16-bit, else
    float64 (11 and 24 bits of mantissa)."""
    return np.dtype("<f2") if i.itemsize == 1 else np.dtype("<f4") if i.itemsize == 2 else np.dtype("<f8")


def _date(arrow: str | None) -> bool | None:
    return None if arrow is None else arrow.startswith("date")


def unified_dtype(a: str, b: str, arrow_a: str | None = None, arrow_b: str | None = None) -> str | None:
    """The dtype Arrow's permissive promotion gives two columns' dtypes (None: they cannot be unified);
    ``arrow_*``, their Arrow types as text where known, tell a date from a timestamp of the same unit."""
    x, y = np.dtype(a), np.dtype(b)
    kx, ky = x.kind, y.kind
    if kx in "Mm" or ky in "Mm":  # timestamps, dates, durations: the finer unit, never mixed with numbers
        if kx != ky or (kx == "M" and None not in (_date(arrow_a), _date(arrow_b)) and
                        _date(arrow_a) != _date(arrow_b)):
            return None  # a date with a timestamp: Arrow refuses them as it does across files
        return np.promote_types(x, y).str
    if x == y:
        return a
    if "b" in (kx, ky) or kx not in "iuf" or ky not in "iuf":
        return None
    if kx == ky:
        return max(x, y, key=lambda d: d.itemsize).str
    if "f" in (kx, ky):
        f, i = (x, y) if kx == "f" else (y, x)
        return max(f, _float_for(i), key=lambda d: d.itemsize).str
    s, u = (x, y) if kx == "i" else (y, x)  # signed with unsigned: a signed integer that holds both, at most int64
    return np.dtype(f"<i{min(8, max(s.itemsize, 2 * u.itemsize))}").str


def _unify(a: Column, b: Column) -> Column | None:
    """``a`` as read with ``b`` (``a`` itself when they decode alike), or None when they cannot be unified."""
    if (a.kind, a.dtype, a.shape, a.tz) == (b.kind, b.dtype, b.shape, b.tz) and \
            dict(a.type_node()) == dict(b.type_node()):
        return a
    if a.kind not in ("fixed", "list") or (a.kind, a.shape, a.tz) != (b.kind, b.shape, b.tz) \
            or a.dtype is None or b.dtype is None:
        return None
    if _retyped(a.type_node(), "") != _retyped(b.type_node(), ""):
        return None
    dtype = unified_dtype(a.dtype, b.dtype, a.arrow, b.arrow)
    if dtype is None:
        return None
    wider = a if dtype == a.dtype else b if dtype == b.dtype else None
    return replace(a, dtype=dtype, type=_retyped(a.type_node(), dtype), nullable=a.nullable or b.nullable,
                   arrow=wider.arrow if wider is not None else None)


@dataclass
class Layout:
    """How one source's blocks hold the columns read: ``where``, the index in its schema of each main column
    (-1: not read, or missing and filled with nulls; None: where the main schema has them), and ``casts``, the
    main columns it holds narrower, each with the dtype it is read as."""

    where: list[int] | None = None
    casts: dict[int, str] = field(default_factory=dict)

    @property
    def plain(self) -> bool:
        """Read as its blocks are: no map, no cast."""
        return self.where is None and not self.casts


def column_maps(main: Schema, main_name: str, cols: Sequence[int], schemas: Mapping[str, Schema],
                fill_missing: bool = False) -> tuple[Schema, dict[str, Layout], dict[str, str]]:
    """The schema the job reads (``main`` with each read column's type unified over the sources), each readable
    source's ``Layout``, and why each other source cannot be read with them."""
    unified = list(main.columns)
    by = {ci: main_name for ci in cols}  # the source whose type each read column has now
    problems: dict[str, list[str]] = {}
    found: dict[str, list[int]] = {}
    for name, schema in schemas.items():
        where = [-1] * len(main.columns)
        for ci in cols:
            col = unified[ci]
            if col.name not in schema.names:
                if not fill_missing:
                    problems.setdefault(name, []).append(
                        f"source {name!r} has no column {col.name!r}, which source {main_name!r} has "
                        f"(fill_missing=True reads it as nulls there)")
                continue
            k = schema.index(col.name)
            got = _unify(col, schema.columns[k])
            if got is None:
                problems.setdefault(name, []).append(
                    f"column {col.name!r} is {_shown(schema.columns[k])} in source {name!r} and {_shown(col)} in "
                    f"source {by[ci]!r}: they cannot be unified")
                continue
            if got.dtype != col.dtype:
                by[ci] = name
            unified[ci] = got
            where[ci] = k
        found[name] = where
    schema_out = replace(main, columns=tuple(unified))
    layouts: dict[str, Layout] = {}
    for name, where in found.items():
        if name in problems:
            continue
        own = schemas[name]
        casts = {ci: str(unified[ci].dtype) for ci in cols if where[ci] >= 0
                 and own.columns[where[ci]].dtype != unified[ci].dtype}
        same = all(where[ci] == ci for ci in cols)
        layouts[name] = Layout(None if same else where, casts)
    return schema_out, layouts, {n: "; ".join(w) for n, w in problems.items()}


_MANTISSA = {2: 11, 4: 24, 8: 53}  # bits of a float's significand, by its size


def exact(src: np.dtype, dst: np.dtype) -> bool:
    """Whether every value of ``src`` is a value of ``dst`` (numpy's "safe" casts take int64 to float64)."""
    if src.kind in "iu" and dst.kind in "iu":
        return bool(np.can_cast(src, dst, "safe"))
    if src.kind in "iu" and dst.kind == "f":
        return 8 * src.itemsize - (src.kind == "i") <= _MANTISSA[dst.itemsize]
    if src.kind == "f" == dst.kind:
        return dst.itemsize >= src.itemsize
    return False  # a finer time unit can overflow: checked


def read_schema(schemas: Mapping[str, Schema], wanted: Sequence[str], fill_missing: bool = False) -> Schema:
    """The schema a job reading ``wanted`` from these sources (name -> schema, in name order) gets: the first
    source's that holds every column, each read column's type unified over the sources (a source that cannot be
    read with the others is left to the read to name)."""
    first = next(iter(schemas))
    main = next((n for n, sc in schemas.items() if set(wanted) <= set(sc.names)), first)
    cols = [schemas[main].index(c) for c in wanted if c in schemas[main].names]
    return column_maps(schemas[main], main, cols, schemas, fill_missing)[0]


def _check_lossless(narrow: np.ndarray, wide: np.ndarray, valid: np.ndarray | None, what: str) -> None:
    """LossyValue when a value of ``narrow`` did not survive its cast to ``wide`` (values under nulls aside)."""
    with np.errstate(all="ignore"):
        back = wide.astype(narrow.dtype)
    bad = back != narrow
    if narrow.dtype.kind == "u" and wide.dtype.kind == "i":  # wrapped to a negative value and back
        bad |= narrow > np.array(np.iinfo(wide.dtype).max, narrow.dtype)
    if narrow.dtype.kind == "f":
        bad &= ~(np.isnan(narrow) & np.isnan(back))
    if valid is not None:
        bad &= valid
    if bad.any():
        value = np.atleast_1d(narrow)[np.atleast_1d(bad)][0].item()
        raise LossyValue(f"{what} holds {value!r}, which {wide.dtype} (its type unified with the mixture's other "
                         f"sources) cannot hold exactly: read this column from sources of one type, or leave the "
                         f"source out of the mixture")


class MappedView:
    """A block of one source read through the main schema's column indices (``BlockView``'s reading methods); a
    column the source lacks (-1) reads as nulls, one it holds narrower reads widened."""

    __slots__ = ("_view", "_map", "_main", "buf", "nrows", "_table", "casts", "_source", "_wide")

    def __init__(self, view: Any, layout: Layout, main: Schema, source: str = "") -> None:
        where = layout.where if layout.where is not None else list(range(len(main.columns)))
        self._view, self._map, self._main, self.casts, self._source = view, where, main, layout.casts, source
        self.buf, self.nrows = view.buf, view.nrows
        self._table = [view._table[k] if k >= 0 else None for k in where]
        self._wide: dict[int, np.ndarray] = {}

    def _missing(self, ci: int) -> tuple[int, ...]:
        col = self._main.columns[ci]
        return (self.nrows, *col.shape)

    def _cast(self, ci: int, arr: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
        dtype = np.dtype(self.casts[ci])
        wide = arr.astype(dtype)
        if not exact(arr.dtype, dtype):
            _check_lossless(arr, wide, valid, f"column {self._main.columns[ci].name!r} of source {self._source!r}")
        return wide

    def column_array(self, ci: int) -> Any:
        k = self._map[ci]
        if k < 0:
            return np.zeros(self._missing(ci), np.dtype(self._main.columns[ci].dtype or "<f4"))
        if ci not in self.casts:
            return self._view.column_array(k)
        got = self._wide.get(ci)
        if got is None:
            got = self._wide[ci] = self._cast(ci, self._view.column_array(k), self._view.column_mask(k))
        return got

    def column_mask(self, ci: int) -> Any:
        k = self._map[ci]
        return np.zeros(self._missing(ci), bool) if k < 0 else self._view.column_mask(k)

    def has_nulls(self, ci: int) -> bool:
        k = self._map[ci]
        return True if k < 0 else bool(self._view.has_nulls(k))

    def value(self, ci: int, row: int) -> Any:
        k = self._map[ci]
        if k < 0:
            return None
        v = self._view.value(k, row)
        if v is None or ci not in self.casts:
            return v
        return self._cast_cell(ci, v)

    def _cast_cell(self, ci: int, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, list):  # a cell with null elements (a fixed column's nested layout)
            return [self._cast_cell(ci, x) for x in v]
        wide = self._cast(ci, np.asarray(v), None)
        return wide if wide.ndim else wide[()]


__all__ = ["MixedColumns", "LossyValue", "Layout", "column_maps", "read_schema", "unified_dtype", "MappedView"]
