"""Partition filters: ``--filter "lang in ('en', 'de') and date >= '2024-01-01'"`` limits sampling to the files
whose partition values match, decided from the listing alone (paths or the table's log), so that no byte of a file
outside it is ever fetched, its footer included.

The grammar is SQL's WHERE clause over partition columns: ``=``/``==``, ``!=``/``<>``, ``<``, ``<=``, ``>``, ``>=``,
``in (...)``, ``not in (...)``, ``is null``, ``is not null``, ``and``, ``or``, ``not``, parentheses; literals are
'strings', numbers and null. A comparison with a null value is false (``is null`` finds it), as in SQL. Values
compare as their column's type (a literal is cast to it).
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pyarrow as pa

_QUOTED = re.compile(r"'(?:[^']|'')*'")
# SQL's spellings outside string literals -> Python's
_REWRITES = [(re.compile(r"\bis\s+not\s+null\b", re.I), " is not None "),
             (re.compile(r"\bis\s+null\b", re.I), " is None "), (re.compile(r"\bnull\b", re.I), " None "),
             (re.compile(r"<>"), " != "), (re.compile(r"(?<![<>!=])=(?!=)"), " == "),
             (re.compile(r"\band\b", re.I), " and "), (re.compile(r"\bor\b", re.I), " or "),
             (re.compile(r"\bnot\b", re.I), " not "), (re.compile(r"\bin\b", re.I), " in ")]
_OPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


class FilterError(ValueError):
    """A filter that cannot be parsed, or that names a column that is not a partition column."""


def _python(text: str) -> str:
    out, last = [], 0
    for m in _QUOTED.finditer(text):
        out.append(_sql_words(text[last:m.start()]))
        out.append(repr(m.group(0)[1:-1].replace("''", "'")))
        last = m.end()
    out.append(_sql_words(text[last:]))
    return "".join(out)


def _sql_words(part: str) -> str:
    for pattern, repl in _REWRITES:
        part = pattern.sub(repl, part)
    return part


def _check(node: ast.AST, text: str) -> set[str]:
    """The columns ``node`` names; FilterError for anything but the grammar."""
    if isinstance(node, ast.Expression):
        return _check(node.body, text)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_check(v, text) for v in node.values))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _check(node.operand, text)
    if isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _OPS and not isinstance(op, (ast.Is, ast.IsNot)):
                raise FilterError(f"filter {text!r}: operator {type(op).__name__} is not allowed")
        return set().union(*(_check(v, text) for v in [node.left, *node.comparators]))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return set()
    if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant) for e in node.elts):
        return set()
    raise FilterError(f"filter {text!r}: {ast.unparse(node)!r} is not a partition column, a literal or a "
                      f"comparison (see README: Tables and partitions)")


@dataclass(frozen=True)
class PartitionFilter:
    text: str
    tree: ast.Expression
    columns: frozenset[str]

    def check_columns(self, types: Mapping[str, pa.DataType]) -> None:
        """FilterError when the filter names a column that is no partition column of the source."""
        unknown = sorted(self.columns - set(types))
        if unknown:
            raise FilterError(f"filter {self.text!r} names {unknown}, which are not partition columns of the "
                              f"source (they are {sorted(types)}): a filter selects partitions only")

    def matches(self, values: Mapping[str, str | None], types: Mapping[str, pa.DataType]) -> bool:
        """Whether a file with these partition values (as text) is inside the filter."""
        return bool(self._eval(self.tree.body, values, types))

    def _eval(self, node: ast.AST, values: Mapping[str, str | None], types: Mapping[str, pa.DataType]) -> Any:
        if isinstance(node, ast.BoolOp):
            parts = (self._eval(v, values, types) for v in node.values)
            return all(parts) if isinstance(node.op, ast.And) else any(parts)
        if isinstance(node, ast.UnaryOp):
            return not self._eval(node.operand, values, types)
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                if not _compare(op, *_operands(left, right, values, types)):
                    return False
                left = right
            return True
        raise FilterError(f"filter {self.text!r}: cannot evaluate {ast.unparse(node)!r}")


def _typed(text: str | None, typ: pa.DataType) -> Any:
    return None if text is None else pa.scalar(text, pa.string()).cast(typ).as_py()


def _literal(node: ast.AST, typ: pa.DataType | None) -> Any:
    """A literal (or a tuple of them) as ``typ`` (the column it is compared with) where it is text."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(e, typ) for e in node.elts)
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, str) and typ is not None and not pa.types.is_string(typ):
        try:
            return _typed(value, typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise FilterError(f"filter literal {value!r} is not a {typ}: {e}") from None
    return value


def _operands(left: ast.AST, right: ast.AST, values: Mapping[str, str | None],
              types: Mapping[str, pa.DataType]) -> tuple[Any, Any]:
    typ = next((types.get(n.id) for n in (left, right) if isinstance(n, ast.Name)), None)

    def value(n: ast.AST) -> Any:
        if isinstance(n, ast.Name):
            return _typed(values.get(n.id), types.get(n.id, pa.string()))
        return _literal(n, typ)
    return value(left), value(right)


def _compare(op: ast.cmpop, a: Any, b: Any) -> bool:
    if isinstance(op, ast.Is):
        return a is b if b is None or a is None else a == b
    if isinstance(op, ast.IsNot):
        return a is not b if b is None or a is None else a != b
    if a is None or b is None:
        return False  # SQL: a comparison with null is not true
    return bool(_OPS[type(op)](a, b))


def parse_filter(text: str) -> PartitionFilter:
    """The filter of ``text`` (FilterError, naming what is wrong, when it is not one)."""
    try:
        tree = ast.parse(_python(text).strip(), mode="eval")
    except SyntaxError as e:
        raise FilterError(f"filter {text!r} cannot be parsed: {e.msg}") from None
    return PartitionFilter(text, tree, frozenset(_check(tree, text)))
