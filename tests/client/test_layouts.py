"""How each source of a mixture holds the columns a job reads (samplecache.reading.layouts)."""

from __future__ import annotations

import pytest

from samplecache.format.record import Column, Schema
from samplecache.reading.layouts import column_maps


def schema(*cols: tuple[str, str]) -> Schema:
    return Schema(tuple(Column(name, "fixed", dtype) for name, dtype in cols))


MAIN = schema(("id", "<i8"), ("x", "<f4"))


def test_a_source_with_the_columns_elsewhere_is_read_through_a_map() -> None:
    sources = {"web": MAIN, "code": schema(("lang", "<i2"), ("id", "<i8"), ("x", "<f4")),
               "math": schema(("id", "<i8"), ("x", "<f4"), ("level", "<i1"))}
    maps, problems = column_maps(MAIN, "web", [0, 1], sources)
    assert problems == {}
    assert maps == {"web": None, "code": [1, 2], "math": None}  # math holds them where web does
    maps, _ = column_maps(MAIN, "web", [1], sources)  # only x read: id is not mapped
    assert maps["code"] == [-1, 2]


def test_a_column_lacking_or_typed_otherwise_names_both_sources_and_types() -> None:
    sources = {"web": MAIN, "code": schema(("id", "<i4"), ("x", "<f4")), "math": schema(("id", "<i8"))}
    maps, problems = column_maps(MAIN, "web", [0, 1], sources)
    assert sorted(maps) == ["web"]
    assert problems["code"] == "column 'id' is fixed <i4 in source 'code' and fixed <i8 in source 'web'"
    assert problems["math"].startswith("source 'math' has no column 'x', which source 'web' has")
    maps, problems = column_maps(MAIN, "web", [0, 1], sources, fill_missing=True)
    assert maps["math"] == [0, -1] and "math" not in problems and "code" in problems  # a type is never cast


@pytest.mark.parametrize("cols", [[0], [0, 1]])
def test_the_main_source_maps_to_itself(cols: list[int]) -> None:
    maps, problems = column_maps(MAIN, "web", cols, {"web": MAIN})
    assert maps == {"web": None} and problems == {}
