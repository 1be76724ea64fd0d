"""The safe evaluator for contract cost formulas (`flops`, `bytes_moved`, `memory.*`).

A formula is plain arithmetic over the sizes of one call, e.g. ``3 * lhs.numel * dtype_bytes`` or
``2 * out.dim[0] * out.dim[1] * out.dim[2] * out.dim[3] * (x.dim[1] / groups) * weight.dim[2] * weight.dim[3]``.
Contract files come from anywhere (`--contracts DIR` audits a stranger's draft), so the text is
parsed with `ast` and checked node by node against a whitelist; it is never handed to `eval`.

Allowed: int/float literals, names the caller provides, ``+ - * / // %``, unary ``+ -``,
parentheses, ``<tensor>.numel``, ``<tensor>.dim[<int literal>]``, ``<tuple name>[<int literal>]``
and ``a ** k`` with a literal integer exponent 0..8 whose base is not itself a power. Everything
else (calls, other attributes, comparisons, strings, comprehensions, lambdas, names not provided,
power towers) is rejected with an ExprError naming the construct.
"""
from __future__ import annotations

import ast
import dataclasses
import math
from typing import Any, Mapping

MAX_LENGTH = 2000
MAX_NODES = 400
MAX_EXPONENT = 8


class ExprError(ValueError):
    """A cost formula outside the safe arithmetic subset, or one that cannot be evaluated."""


@dataclasses.dataclass(frozen=True)
class Dims:
    """What a formula may know about a tensor of the call: its sizes and element count."""

    dim: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.dim)


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_UNARY = {ast.UAdd: lambda a: +a, ast.USub: lambda a: -a}
_TENSOR_ATTRS = ("numel", "dim")


def _describe(node: ast.AST) -> str:
    try:
        return f"`{ast.unparse(node)}` ({type(node).__name__})"
    except Exception:  # pragma: no cover - unparse handles every node the parser makes
        return type(node).__name__


class Expr:
    """One parsed, validated formula. `Expr(text).evaluate(names)` gives an int or float."""

    def __init__(self, text: str | int | float):
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ExprError(f"a cost formula is a string or a number, got {text!r}")
        self.text = str(text)
        if len(self.text) > MAX_LENGTH:
            raise ExprError(f"formula longer than {MAX_LENGTH} characters")
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as error:
            raise ExprError(f"not an arithmetic expression: {self.text!r} ({error.msg})") from None
        if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
            raise ExprError(f"formula has more than {MAX_NODES} syntax nodes")
        self._tree = tree.body
        self.names: set[str] = set()
        self._check(self._tree)

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ExprError(f"only numeric literals are allowed, got {_describe(node)}")
        elif isinstance(node, ast.Name):
            self.names.add(node.id)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            self._check(node.left)
            self._check(node.right)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
            if not (isinstance(exponent, ast.Constant) and type(exponent.value) is int
                    and 0 <= exponent.value <= MAX_EXPONENT):
                raise ExprError(f"`**` takes a literal integer exponent 0..{MAX_EXPONENT}, got {_describe(node)}")
            if isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Pow):
                raise ExprError(f"power towers are not allowed: {_describe(node)}")
            self._check(node.left)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            self._check(node.operand)
        elif isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name) or node.attr not in _TENSOR_ATTRS:
                raise ExprError(f"only <tensor>.numel and <tensor>.dim[i] are allowed, got {_describe(node)}")
            if node.attr == "dim":
                raise ExprError(f"`{ast.unparse(node)}` needs an index: {ast.unparse(node)}[i]")
            self.names.add(node.value.id)
        elif isinstance(node, ast.Subscript):
            if _literal_index(node.slice) is None:
                raise ExprError(f"an index must be an integer literal, got {_describe(node)}")
            base = node.value
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.attr == "dim":
                self.names.add(base.value.id)
            elif isinstance(base, ast.Name):
                self.names.add(base.id)
            else:
                raise ExprError(f"only <tensor>.dim[i] or <name>[i] may be indexed, got {_describe(node)}")
        else:
            raise ExprError(f"not allowed in a cost formula: {_describe(node)}")

    def evaluate(self, names: Mapping[str, Any]) -> int | float:
        missing = sorted(self.names - set(names))
        if missing:
            raise ExprError(f"{self.text!r} uses names this call does not provide: {missing}; "
                            f"known: {sorted(names)}")
        try:
            value = self._eval(self._tree, names)
        except ZeroDivisionError:
            raise ExprError(f"{self.text!r}: division by zero for this call") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ExprError(f"{self.text!r}: not finite for this call ({value})")
        return value

    def _eval(self, node: ast.AST, names: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return _number(names[node.id], node.id)
        if isinstance(node, ast.BinOp):
            left = self._eval(node.left, names)
            if isinstance(node.op, ast.Pow):
                return left ** node.right.value
            return _BINOPS[type(node.op)](left, self._eval(node.right, names))
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._eval(node.operand, names))
        if isinstance(node, ast.Attribute):  # .numel (validated)
            return _dims(names[node.value.id], node.value.id).numel
        if isinstance(node, ast.Subscript):
            base, index = node.value, _literal_index(node.slice)
            if isinstance(base, ast.Attribute):
                sizes, label = _dims(names[base.value.id], base.value.id).dim, f"{base.value.id}.dim"
            else:
                sizes, label = names[base.id], base.id
                if not isinstance(sizes, (tuple, list)):
                    raise ExprError(f"`{label}` is not a sequence and cannot be indexed")
            if not -len(sizes) <= index < len(sizes):
                raise ExprError(f"{label}[{index}] is out of range (it has {len(sizes)} entries)")
            return _number(sizes[index], f"{label}[{index}]")
        raise AssertionError(type(node))  # unreachable: _check admitted only the nodes above


def _literal_index(node: ast.AST) -> int | None:
    """An integer literal, optionally negated (`-1` parses as a unary minus applied to 1)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _literal_index(node.operand)
        return None if inner is None else -inner
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _dims(value: Any, name: str) -> Dims:
    if not isinstance(value, Dims):
        raise ExprError(f"`{name}` is not a tensor: .numel/.dim do not apply")
    return value


def _number(value: Any, name: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExprError(f"`{name}` is not a number here (a tensor needs .numel or .dim[i])")
    return value


def evaluate(text: str | int | float, names: Mapping[str, Any]) -> int | float:
    """Parse, validate and evaluate one formula."""
    return Expr(text).evaluate(names)
