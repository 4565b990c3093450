"""Arrow types -> the cache's column schema: which columns a source has, how each is stored, and which are left
out and why (``infer_schema``)."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from samplecache.format.record import Column, Schema


class UnsupportedColumn(ValueError):
    pass


_TIME_UNITS = {"s", "ms", "us", "ns"}


def _prim_dtype(t: pa.DataType) -> str | None:
    """The numpy dtype of a fixed-width Arrow scalar type (temporal types keep their unit), else None."""
    if pa.types.is_boolean(t):
        return "|b1"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return str(np.dtype(t.to_pandas_dtype()).str)
    if pa.types.is_date32(t):
        return "<M8[D]"
    if pa.types.is_date64(t):
        return "<M8[ms]"
    if pa.types.is_timestamp(t):
        return f"<M8[{t.unit}]"
    if pa.types.is_time(t) or pa.types.is_duration(t):
        return f"<m8[{t.unit}]"
    return None


def _extension_node(t: pa.BaseExtensionType) -> dict[str, Any] | None:
    """The served form of a canonical extension type whose ``as_py()`` is not its storage's (README "What a sample
    holds"), else None: json, opaque and other extension types are served as their storage."""
    name = t.extension_name
    if name == "arrow.uuid":
        # 16 bytes on the wire; the client makes them uuid.UUID
        return {"t": "fixed_binary", "width": 16, "ext": "uuid"}
    if name == "arrow.bool8":
        return {"t": "prim", "dtype": "|b1"}  # the encoder stores int8 != 0
    if name == "arrow.fixed_shape_tensor":
        # an ndarray of the type's shape in stored order, as fixed-size lists are; a permutation is not applied
        node = type_node(t.value_type)
        for size in reversed(t.shape):
            node = {"t": "list", "size": int(size), "child": node}
        return node
    return None


def type_node(t: pa.DataType) -> dict[str, Any]:
    """The record format's type tree (``samplecache.format.nested``) of an Arrow type, or UnsupportedColumn."""
    while True:
        if pa.types.is_dictionary(t):
            t = t.value_type
        elif isinstance(t, pa.BaseExtensionType):
            served = _extension_node(t)
            if served is not None:
                return served
            t = t.storage_type
        else:
            break
    dtype = _prim_dtype(t)
    if dtype is not None:
        node: dict[str, Any] = {"t": "prim", "dtype": dtype}
        if pa.types.is_timestamp(t) and t.tz:
            node["tz"] = t.tz
        return node
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return {"t": "string"}
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return {"t": "binary"}
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        return {"t": "fixed_binary", "width": t.byte_width}
    if pa.types.is_decimal(t):
        return {"t": "decimal", "width": t.byte_width, "scale": t.scale}
    if pa.types.is_null(t):
        return {"t": "null"}
    if pa.types.is_fixed_size_list(t):
        return {"t": "list", "size": t.list_size, "child": type_node(t.value_type)}
    if pa.types.is_map(t):
        return {"t": "map", "key": type_node(t.key_type), "value": type_node(t.item_type)}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return {"t": "list", "child": type_node(t.value_type)}
    if pa.types.is_struct(t):
        return {"t": "struct", "fields": [[t.field(i).name, type_node(t.field(i).type)] for i in range(t.num_fields)]}
    raise UnsupportedColumn(f"type {t} is not supported")


def column_for(field: pa.Field, info: dict[str, Any] | None = None) -> Column:
    """The record column for one Arrow field, or UnsupportedColumn."""
    node = type_node(field.type)
    arrow = str(field.type)
    if node["t"] in ("string", "binary", "fixed_binary"):
        kind = "string" if node["t"] == "string" else "binary"
        # stored as variable-length bytes; "ext" (a uuid) tells the client what the bytes are
        top = {"t": kind, "ext": node["ext"]} if "ext" in node else {"t": kind}
        return Column(field.name, kind, None, (), field.nullable, top, None, arrow, info)
    shape: list[int] = []
    leaf = node
    while leaf["t"] == "list":
        shape.append(int(leaf.get("size", -1)))
        leaf = leaf["child"]
    if leaf["t"] != "prim":
        return Column(field.name, "nested", None, (), field.nullable, node, None, arrow, info)
    kind = "list" if -1 in shape else "fixed"
    return Column(field.name, kind, leaf["dtype"], tuple(shape), field.nullable, node, leaf.get("tz"), arrow, info)


def hf_features(arrow_schema: pa.Schema) -> dict[str, dict[str, Any]]:
    """{column: info} from the Hugging Face ``datasets`` features in the schema metadata: the feature's
    type (Image, Audio, ClassLabel, Sequence...) and a ClassLabel's names."""
    raw = (arrow_schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, feat in features.items():
        if not isinstance(feat, dict):
            continue
        info: dict[str, Any] = {"hf_feature": feat.get("_type", "Sequence" if "feature" in feat else "dict")}
        if feat.get("_type") == "ClassLabel" and "names" in feat:
            info["class_names"] = list(feat["names"])
        out[name] = info
    return out


def infer_schema(arrow_schema: pa.Schema, columns: Sequence[str] | None = None,
                 source_names: Sequence[str] | None = None) -> tuple[Schema, dict[str, str]]:
    """Record schema of the wanted columns, plus {column: reason} for columns left out. ``source_names``: the
    source's own columns, named when a wanted one is missing (``arrow_schema`` may hold only the wanted ones)."""
    wanted = list(columns) if columns else list(arrow_schema.names)
    missing = [c for c in wanted if c not in arrow_schema.names]
    if missing:
        names = list(source_names) if source_names is not None else arrow_schema.names
        raise UnsupportedColumn(f"columns {missing} are not in the source schema {names}")
    hf = hf_features(arrow_schema)
    cols, skipped = [], {}
    for name in wanted:
        try:
            cols.append(column_for(arrow_schema.field(name), hf.get(name)))
        except UnsupportedColumn as e:
            if columns:
                raise UnsupportedColumn(f"column {name!r} ({arrow_schema.field(name).type}): {e}") from None
            skipped[name] = f"{arrow_schema.field(name).type}: {e}"
    if not cols:
        raise UnsupportedColumn("no column can be served: "
                                + "; ".join(f"{k} ({v})" for k, v in skipped.items()))
    return Schema(tuple(cols)), skipped
