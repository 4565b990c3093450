"""How each source of a mixture holds the columns a job reads (samplecache.reading.blocks.layouts): column maps, types
unified over the sources by Arrow's permissive rules (checked against pyarrow itself), and blocks read widened."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from samplecache.format.blockenc import ColumnData, encode_block
from samplecache.format.record import BlockView, Column, Schema
from samplecache.reading.blocks.layouts import Layout, LossyValue, MappedView, column_maps, unified_dtype
from samplecache_service.remote.columns import infer_schema


def schema(*cols: tuple[str, str]) -> Schema:
    return Schema(tuple(Column(name, "fixed", dtype) for name, dtype in cols))


MAIN = schema(("id", "<i8"), ("x", "<f4"))


def test_a_source_with_the_columns_elsewhere_is_read_through_a_map() -> None:
    sources = {"web": MAIN, "code": schema(("lang", "<i2"), ("id", "<i8"), ("x", "<f4")),
               "math": schema(("id", "<i8"), ("x", "<f4"), ("level", "<i1"))}
    unified, maps, problems = column_maps(MAIN, "web", [0, 1], sources)
    assert problems == {} and unified == MAIN
    assert maps == {"web": Layout(), "code": Layout([1, 2]), "math": Layout()}  # math holds them where web does
    _, maps, _ = column_maps(MAIN, "web", [1], sources)  # only x read: id is not mapped
    assert maps["code"] == Layout([-1, 2])


def test_narrower_types_are_read_widened_and_the_job_reads_the_unified_ones() -> None:
    sources = {"web": MAIN, "code": schema(("id", "<i4"), ("x", "<f8")), "math": schema(("id", "<u2"), ("x", "<i2"))}
    unified, maps, problems = column_maps(MAIN, "web", [0, 1], sources)
    assert problems == {}
    assert [c.dtype for c in unified.columns] == ["<i8", "<f8"]  # int64; float32 with float64 and int16: float64
    assert maps["web"] == Layout(None, {1: "<f8"}) and not maps["web"].plain
    assert maps["code"] == Layout(None, {0: "<i8"})
    assert maps["math"] == Layout(None, {0: "<i8", 1: "<f8"})
    _, maps, _ = column_maps(MAIN, "web", [0], sources)  # x not read: nothing of it is cast
    assert maps["web"].plain and maps["code"].casts == {0: "<i8"}


def test_a_column_lacking_or_of_a_type_that_cannot_unify_names_both_sources_and_types() -> None:
    sources = {"web": MAIN, "code": schema(("id", "|b1"), ("x", "<f4")), "math": schema(("id", "<i8")),
               "time": schema(("id", "<M8[us]"), ("x", "<f4"))}
    _, maps, problems = column_maps(MAIN, "web", [0, 1], sources)
    assert sorted(maps) == ["web"]
    assert problems["code"] == ("column 'id' is fixed |b1 in source 'code' and fixed <i8 in source 'web': they "
                                "cannot be unified")
    assert "column 'id' is fixed <M8[us] in source 'time'" in problems["time"]
    assert problems["math"].startswith("source 'math' has no column 'x', which source 'web' has")
    _, maps, problems = column_maps(MAIN, "web", [0, 1], sources, fill_missing=True)
    assert maps["math"] == Layout([0, -1]) and "math" not in problems and "code" in problems


def test_a_conflict_names_the_source_whose_type_the_column_took() -> None:
    sources = {"web": MAIN, "code": schema(("id", "<i8"), ("x", "<f8")), "math": schema(("id", "<i8"), ("x", "|b1"))}
    _, _, problems = column_maps(MAIN, "web", [0, 1], sources)
    assert problems == {"math": "column 'x' is fixed |b1 in source 'math' and fixed <f8 in source 'code': they "
                                "cannot be unified"}


@pytest.mark.parametrize("cols", [[0], [0, 1]])
def test_the_main_source_maps_to_itself(cols: list[int]) -> None:
    unified, maps, problems = column_maps(MAIN, "web", cols, {"web": MAIN})
    assert maps == {"web": Layout()} and problems == {} and unified == MAIN


ARROW_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
               pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.timestamp("s"), pa.timestamp("ms"),
               pa.timestamp("us"), pa.timestamp("ns"), pa.duration("s"), pa.duration("ms"), pa.duration("ns"),
               pa.date32(), pa.date64()]


def _column(t: pa.DataType) -> Column:
    return infer_schema(pa.schema([("c", t)]))[0].columns[0]


@pytest.mark.parametrize("a,b", list(itertools.combinations(ARROW_TYPES, 2)), ids=str)
def test_types_unify_as_arrow_unifies_files(a: pa.DataType, b: pa.DataType) -> None:
    """The dtype of two sources' column is the dtype of what pyarrow's permissive promotion makes of their
    Arrow types, or none where pyarrow refuses: the rules that unify files unify sources."""
    try:
        arrow = pa.unify_schemas([pa.schema([("c", a)]), pa.schema([("c", b)])],
                                 promote_options="permissive").field("c").type
        want = _column(arrow).dtype
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        want = None
    ca, cb = _column(a), _column(b)
    assert unified_dtype(ca.dtype or "", cb.dtype or "", ca.arrow, cb.arrow) == want


def _block(col: Column, arr: np.ndarray, valid: np.ndarray | None = None) -> BlockView:
    s = Schema((col,))
    return BlockView(encode_block(s, [ColumnData(data=arr, valid=valid)], len(arr)), s)


def test_a_block_reads_widened_values_exactly() -> None:
    narrow = Column("x", "fixed", "<f4", (3,))
    arr = np.arange(12, dtype=np.float32).reshape(4, 3) / 3
    main = Schema((Column("x", "fixed", "<f8", (3,)),))
    view = MappedView(_block(narrow, arr), Layout(None, {0: "<f8"}), main, "web")
    got = view.column_array(0)
    assert got.dtype == np.float64 and np.array_equal(got, arr.astype(np.float64))
    assert view.value(0, 2).dtype == np.float64 and np.array_equal(view.value(0, 2), arr[2].astype(np.float64))
    ts = Column("t", "fixed", "<M8[ms]")
    stamps = np.array([0, 1500, -7], dtype="<M8[ms]")
    view = MappedView(_block(ts, stamps), Layout(None, {0: "<M8[us]"}), Schema((Column("t", "fixed", "<M8[us]"),)))
    assert view.column_array(0).dtype == np.dtype("<M8[us]") and (view.column_array(0) == stamps).all()
    assert view.value(0, 1) == np.datetime64(1500, "ms")


@pytest.mark.parametrize("dtype,wide,value", [("<u8", "<i8", 2**63 + 5), ("<i8", "<f8", 2**53 + 1),
                                              ("<u8", "<f8", 2**64 - 1)])
def test_a_value_the_unified_type_cannot_hold_raises_naming_it(dtype: str, wide: str, value: int) -> None:
    arr = np.array([1, value, 3], dtype=dtype)
    main = Schema((Column("id", "fixed", wide),))
    view = MappedView(_block(Column("id", "fixed", dtype), arr), Layout(None, {0: wide}), main, "code")
    with pytest.raises(LossyValue, match=rf"column 'id' of source 'code' holds {value}\b"):
        view.column_array(0)
    with pytest.raises(LossyValue):
        view.value(0, 1)
    assert view.value(0, 2) == 3 and np.asarray(view.value(0, 2)).dtype == np.dtype(wide)


def test_values_under_nulls_are_not_checked() -> None:
    arr = np.array([1, 2**63 + 5, 3], dtype="<u8")
    valid = np.array([1, 0, 1], np.uint8)
    main = Schema((Column("id", "fixed", "<i8", nullable=True),))
    view = MappedView(_block(Column("id", "fixed", "<u8", nullable=True), arr, valid), Layout(None, {0: "<i8"}),
                      main, "code")
    got = view.column_array(0)
    assert got.dtype == np.int64 and got[0] == 1 and got[2] == 3
    assert view.value(0, 1) is None and view.has_nulls(0)
