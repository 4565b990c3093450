"""The nested layout of the record format: any Arrow value, with nulls at every level (stdlib + numpy).

A ``nested`` column, or one block of a ``fixed``/``list`` column whose rows have null elements or ragged
nesting, is stored as the buffers of its type tree, depth first, much like Arrow's own layout. Type nodes
(JSON, kept in the schema)::

    {"t": "prim", "dtype": "<i8"}               numbers, bool ("|b1"), datetime64/timedelta64 ("tz" if any)
    {"t": "string"} / {"t": "binary"}
    {"t": "fixed_binary", "width": w}           "ext": "uuid" on a (fixed_)binary node: the bytes of a UUID
    {"t": "decimal", "width": 16, "scale": s}  two's complement, little endian (decimal32..256)
    {"t": "null"}
    {"t": "list", "child": T}                   {"t": "list", "size": k, "child": T} for fixed size lists
    {"t": "struct", "fields": [[name, T], ...]}
    {"t": "map", "key": T, "value": T}

Buffers of a node of ``n`` elements: ``valid`` (n x u8, 0 = null; absent when none is null), then
prim: values (n x dtype) | string, binary: offsets (n + 1 x i64, from 0), bytes | fixed_binary, decimal:
bytes (n x width) | list: offsets (variable size only), then the child's | struct: each field's |
map: offsets, the keys', the values' | null: none.

Values come back as pyarrow's ``as_py()`` gives them, except in the documented lossless forms: temporal
values are ``numpy.datetime64`` / ``numpy.timedelta64`` with the column's unit (UTC instants; the time
zone is in the schema), maps are lists of ``(key, value)`` tuples, decimals are exact ``decimal.Decimal``.
Canonical extension types come as ``as_py()`` gives them (a uuid as ``uuid.UUID``), except a fixed_shape_tensor:
it is stored as the fixed-size lists of its shape, so it comes as those do.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping

import numpy as np

TypeNode = Mapping[str, Any]

# What an "ext" of a type node makes of a non-null value of its storage
EXTENSIONS: dict[str, Callable[[Any], Any]] = {"uuid": lambda raw: uuid.UUID(bytes=raw)}


def slots(node: TypeNode) -> int:
    """How many buffers a node and its children take in the layout."""
    t = node["t"]
    if t == "null":
        return 0
    own = {"prim": 2, "string": 3, "binary": 3, "fixed_binary": 2, "decimal": 2, "struct": 1, "map": 2}
    if t == "list":
        return (1 if "size" in node else 2) + slots(node["child"])
    if t == "struct":
        return 1 + sum(slots(f) for _, f in node["fields"])
    if t == "map":
        return 2 + slots(node["key"]) + slots(node["value"])
    return own[t]


def is_numeric_list(node: TypeNode) -> bool:
    """A list (of lists...) of numbers: such a cell can come back as one numpy array."""
    while node["t"] == "list":
        node = node["child"]
    return bool(node["t"] == "prim")


class Node:
    """One decoded level of the tree: numpy views of its buffers and its children."""

    __slots__ = ("t", "n", "valid", "offsets", "values", "children", "names", "size", "width", "scale", "ext")

    def __init__(self, t: str, n: int, ext: str | None = None) -> None:
        self.t, self.n, self.ext = t, n, ext
        self.valid: np.ndarray | None = None
        self.offsets: np.ndarray | None = None
        self.values: np.ndarray | None = None
        self.children: list[Node] = []
        self.names: list[str] = []
        self.size = self.width = self.scale = 0


def build(node: TypeNode, n: int, bufs: Iterator[tuple[Any, int, int]]) -> Node:
    """The decoded tree of ``n`` elements, from ``(buffer, offset, length)`` of each slot, depth first."""
    t = node["t"]
    out = Node(t, n, node.get("ext"))
    if t == "null":
        return out

    def take(dtype: Any, count: int | None = None) -> np.ndarray | None:
        buf, off, length = next(bufs)
        if not off and not length:
            return None
        dt = np.dtype(dtype)
        return np.frombuffer(buf, dt, length // dt.itemsize if count is None else count, off)

    out.valid = take(np.uint8, n)
    if t == "prim":
        out.values = take(node["dtype"], n)
        if out.values is None:
            out.values = np.zeros(n, node["dtype"])
    elif t in ("string", "binary"):
        out.offsets = take("<i8", n + 1)
        out.values = take(np.uint8)
        if out.values is None:
            out.values = np.zeros(0, np.uint8)
    elif t in ("fixed_binary", "decimal"):
        out.width, out.scale = int(node["width"]), int(node.get("scale", 0))
        out.values = take(np.uint8)
        if out.values is None:
            out.values = np.zeros(0, np.uint8)
    elif t == "list":
        if "size" in node:
            out.size = int(node["size"])
            out.children = [build(node["child"], n * out.size, bufs)]
        else:
            out.offsets = offsets = take("<i8", n + 1)
            out.children = [build(node["child"], int(offsets[-1]) if n and offsets is not None else 0, bufs)]
    elif t == "struct":
        out.names = [name for name, _ in node["fields"]]
        out.children = [build(f, n, bufs) for _, f in node["fields"]]
    elif t == "map":
        out.offsets = offsets = take("<i8", n + 1)
        m = int(offsets[-1]) if n and offsets is not None else 0
        out.children = [build(node["key"], m, bufs), build(node["value"], m, bufs)]
    return out


def _masked(node: Node, vals: list[Any], a: int, b: int) -> list[Any]:
    if node.valid is not None:
        ok = node.valid[a:b]
        if not ok.all():
            return [v if k else None for v, k in zip(vals, ok.tolist())]
    return vals


def _split(vals: list[Any], offs: np.ndarray) -> list[Any]:
    cuts = (offs - offs[0]).tolist()
    return [vals[x:y] for x, y in zip(cuts[:-1], cuts[1:])]


def to_py(node: Node, a: int, b: int) -> list[Any]:
    """The values of elements ``[a, b)``: as ``as_py()``, in the documented forms."""
    t = node.t
    if t == "null" or b <= a:
        return [None] * max(0, b - a)
    if t == "prim":
        v = node.values[a:b]  # type: ignore[index]
        vals = list(v) if v.dtype.kind in "Mm" else v.tolist()
    elif t in ("string", "binary"):
        offs = node.offsets[a:b + 1]  # type: ignore[index]
        raw = node.values[int(offs[0]):int(offs[-1])].tobytes()  # type: ignore[index]
        cuts = (offs - offs[0]).tolist()
        vals = [raw[x:y] for x, y in zip(cuts[:-1], cuts[1:])]
        if t == "string":
            vals = [s.decode("utf-8") for s in vals]
    elif t == "fixed_binary":
        w = node.width
        raw = node.values[a * w:b * w].tobytes()  # type: ignore[index]
        vals = [raw[i * w:(i + 1) * w] for i in range(b - a)]
    elif t == "decimal":
        w, scale = node.width, node.scale
        raw = node.values[a * w:b * w].tobytes()  # type: ignore[index]
        vals = [Decimal(f"{int.from_bytes(raw[i * w:(i + 1) * w], 'little', signed=True)}E{-scale}")
                for i in range(b - a)]
    elif t == "list":
        child = node.children[0]
        if node.size:
            k = node.size
            flat = to_py(child, a * k, b * k)
            vals = [flat[i * k:(i + 1) * k] for i in range(b - a)]
        else:
            offs = node.offsets[a:b + 1]  # type: ignore[index]
            vals = _split(to_py(child, int(offs[0]), int(offs[-1])), offs)
    elif t == "struct":
        cols = [to_py(c, a, b) for c in node.children]
        vals = [dict(zip(node.names, row)) for row in zip(*cols)] if cols else [{} for _ in range(b - a)]
    elif t == "map":
        offs = node.offsets[a:b + 1]  # type: ignore[index]
        lo, hi = int(offs[0]), int(offs[-1])
        pairs = list(zip(to_py(node.children[0], lo, hi), to_py(node.children[1], lo, hi)))
        vals = _split(pairs, offs)
    else:
        raise ValueError(f"unknown nested node {t!r}")
    vals = _masked(node, vals, a, b)
    if node.ext is not None:
        make = EXTENSIONS[node.ext]
        vals = [None if v is None else make(v) for v in vals]
    return vals


def cell(node: Node, i: int) -> Any:
    """Element ``i``: a numpy array when it is a rectangular list (of lists...) of non-null numbers,
    else its Python value (``to_py``)."""
    arr = cell_array(node, i)
    return arr if arr is not None else to_py(node, i, i + 1)[0]


def cell_array(node: Node, i: int) -> np.ndarray | None:
    """Element ``i`` of a numeric list tree as an owned array, or None if it is null, has a null inside
    or is ragged."""
    if node.valid is not None and not node.valid[i]:
        return None
    a, b = i, i + 1
    shape: list[int] = []
    cur = node
    while cur.t == "list":
        if cur.valid is not None and not cur.valid[a:b].all():
            return None
        if cur.size:
            shape.append(cur.size)
            a, b = a * cur.size, b * cur.size
        else:
            offs = cur.offsets[a:b + 1]  # type: ignore[index]
            lens = np.diff(offs)
            if len(lens) and (lens != lens[0]).any():
                return None  # ragged
            shape.append(int(lens[0]) if len(lens) else 0)
            a, b = int(offs[0]), int(offs[-1])
        cur = cur.children[0]
    if cur.t != "prim":
        return None
    if cur.valid is not None and not cur.valid[a:b].all():
        return None
    return np.array(cur.values[a:b]).reshape(shape)  # type: ignore[index]


def leaf_mask(node: Node) -> np.ndarray | None:
    """For a fixed-size list tree of numbers: which of the ``n x prod(sizes)`` leaf values are present
    (None when all are); a null at any level hides every value under it."""
    mask: np.ndarray | None = None
    cur = node
    reps = 1
    while True:
        if cur.valid is not None:
            level = cur.valid.astype(bool)
            mask = level if mask is None else (np.repeat(mask, reps) & level)
            reps = 1
        if cur.t != "list":
            break
        reps *= cur.size
        cur = cur.children[0]
    if mask is not None and reps > 1:
        mask = np.repeat(mask, reps)
    return mask


def leaf_values(node: Node) -> np.ndarray:
    """The flat leaf values of a (fixed size) numeric list tree."""
    while node.t == "list":
        node = node.children[0]
    return node.values  # type: ignore[return-value]
