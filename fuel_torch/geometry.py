"""The convolution geometry checks, from one table: contracts/convolution.geometry.yaml.

The table (its header says what it may contain) is compiled here into small postfix programs, one
per check and axis. The same programs are installed into C++ (fuel_torch._C.install_geometry, run
by csrc/convolution/geometry.cpp on every eager call) and run by `check()` below for the API and
the fake kernels, so both sides check the same rules in the same order with the same messages.
The output shape comes from the contracts' `shape_rule`; the table's `returns` then check the output
it gives (the contracts' `return.allocation`).

Symbolic sizes (torch.compile(dynamic=True), torch.export with a Dim): an overflow term never
becomes a guard. It fires only where the shape environment proves it broken; otherwise the C++
kernel checks the real sizes on every call. (A guard such as `batch * 32 * 8 * 8 * 4 <= ...` would
bound the batch of every compiled or exported program: torch.export refuses such a bound on an
open Dim.) Nor does a rule marked `guard: never` (the allocation rule): it too fails only where
provably broken. Any other rule is decided as torch's conv decides its own: a guard on sizes with a hint, a
runtime assertion on data-dependent ones.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_true, statically_known_true, sym_and, sym_or

from .contracts import ContractFormatError, ContractSet, _default_directory, _load_yaml
from .expr import MAX_LENGTH

TABLE_FILE = "convolution.geometry.yaml"
OPS = ("conv2d", "conv_transpose2d")
TENSORS = ("x", "weight", "bias")
LISTS = ("stride", "padding", "dilation", "output_padding")
# The variables of one call, in the order of the C++ twin's slots (geometry.cpp fills the same): the
# inputs, then the output dimensions, which the shape rule's steps fill (only `returns` may read them).
OUT_DIMS = [f"out.dim[{k}]" for k in range(4)]
SLOTS = ([f"x.dim[{k}]" for k in range(4)] + [f"weight.dim[{k}]" for k in range(4)] + ["bias.dim[0]"]
         + [f"{name}[{k}]" for name in LISTS for k in range(2)] + ["groups"] + [f"len({name})" for name in LISTS]
         + ["dtype_bytes", "physical_memory"] + OUT_DIMS)
SLOT = {name: index for index, name in enumerate(SLOTS)}
OUT_SLOT = SLOT["out.dim[0]"]
MAX_DEPTH = 16  # the C++ evaluator's stack; the compiler refuses a deeper expression
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
INT128_MAX, INT128_MIN = 2**127 - 1, -(2**127)
KEYS = frozenset({"ops", "when", "arg", "clause", "holds", "fits", "seen", "fix", "context", "guard"})

_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "div", ast.Mod: "mod"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_ARITHMETIC = frozenset(_BINARY.values()) | {"neg", "max", "min"}


class _Compiler:
    """One expression at one axis -> [(opcode, operand)]: a postfix program over SLOTS."""

    def __init__(self, text: str, axis: int, where: str, outputs: bool = False):
        self.text, self.axis, self.where = text, axis, where
        # The output dimensions exist only once the shape rule ran: after it, in `returns`.
        self.names = SLOTS if outputs else [name for name in SLOTS if name not in OUT_DIMS]
        self.code: list[tuple[str, int]] = []
        self.depth = self.max_depth = 0

    def fail(self, problem: str) -> ContractFormatError:
        return ContractFormatError(f"{self.where}: `{self.text}`: {problem}")

    def emit(self, opcode: str, operand: int = 0, pops: int = 0) -> None:
        self.code.append((opcode, operand))
        self.depth += 1 - pops
        self.max_depth = max(self.max_depth, self.depth)
        if self.max_depth > MAX_DEPTH:
            raise self.fail(f"needs a deeper stack than {MAX_DEPTH}")

    def compile(self, want: str) -> list[tuple[str, int]]:
        if len(self.text) > MAX_LENGTH:
            raise self.fail(f"longer than {MAX_LENGTH} characters")
        try:
            tree = ast.parse(" ".join(self.text.split()), mode="eval").body
        except SyntaxError as error:
            raise self.fail(f"not an expression ({error.msg})") from None
        if self.node(tree) != want:
            raise self.fail(f"expected {'a condition' if want == 'bool' else 'an integer expression'}")
        return self.code

    def index(self, node: ast.AST) -> int:
        """A list index: integer literals and the axis i, added or subtracted."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id == "i" and self.axis >= 0:
            return self.axis
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub):
            left, right = self.index(node.left), self.index(node.right)
            return left + right if isinstance(node.op, ast.Add) else left - right
        raise self.fail(f"an index is made of integers and i, got `{ast.unparse(node)}`")

    def variable(self, name: str) -> str:
        if name not in self.names:
            raise self.fail(f"unknown name `{name}` (known: {', '.join(self.names)})")
        self.emit("var", SLOT[name])
        return "int"

    def node(self, node: ast.AST) -> str:
        """Emits `node`; returns its type, 'int' or 'bool' (the evaluators never mix the two)."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if not INT64_MIN <= node.value <= INT64_MAX:
                raise self.fail(f"the literal {node.value} does not fit in int64")
            self.emit("const", node.value)
            return "int"
        if isinstance(node, ast.Name):
            if node.id == "i" and self.axis >= 0:
                self.emit("const", self.axis)
                return "int"
            return self.variable(node.id)
        if isinstance(node, ast.Subscript):
            base = ast.unparse(node.value)
            return self.variable(f"{base}[{self.index(node.slice)}]")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            name, args = node.func.id, node.args
            if name == "len" and len(args) == 1 and isinstance(args[0], ast.Name):
                return self.variable(f"len({args[0].id})")
            if name in ("max", "min") and len(args) == 2:
                self.operands(args, "int")
                self.emit(name, pops=2)
                return "int"
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            self.operands([node.left, node.right], "int")
            self.emit(_BINARY[type(node.op)], pops=2)
            return "int"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            kind = "int" if isinstance(node.op, ast.USub) else "bool"
            self.operands([node.operand], kind)
            self.emit("neg" if kind == "int" else "not", pops=1)
            return kind
        if isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
            for k, op in enumerate(node.ops):  # a < b < c is a < b and b < c (b is pure: evaluated twice)
                if type(op) not in _COMPARE:
                    raise self.fail(f"comparison `{type(op).__name__}` is not allowed")
                self.operands(operands[k:k + 2], "int")
                self.emit(_COMPARE[type(op)], pops=2)
                if k:
                    self.emit("and", pops=2)
            return "bool"
        if isinstance(node, ast.BoolOp):
            self.operands(node.values[:1], "bool")
            for value in node.values[1:]:
                self.operands([value], "bool")
                self.emit("and" if isinstance(node.op, ast.And) else "or", pops=2)
            return "bool"
        raise self.fail(f"`{ast.unparse(node)}` is not allowed here")

    def operands(self, nodes: Sequence[ast.AST], kind: str) -> None:
        for operand in nodes:
            if self.node(operand) != kind:
                raise self.fail(f"`{ast.unparse(operand)}` must be {'a condition' if kind == 'bool' else 'an integer'}")


def compile_expression(text: str, axis: int, where: str, want: str = "int",
                       outputs: bool = False) -> tuple[tuple[str, int], ...]:
    return tuple(_Compiler(text, axis, where, outputs).compile(want))


def compile_template(text: str, axis: int, where: str, outputs: bool = False) -> tuple[tuple, ...]:
    """A message part -> segments: ("text", s), ("shape", tensor), ("list", list), ("dtype", 0): x's
    dtype, or ("value", program)."""
    segments: list[tuple] = []
    for k, piece in enumerate(re.split(r"\{([^{}]*)\}", " ".join(text.split()))):
        if k % 2 == 0:
            if "{" in piece or "}" in piece:
                raise ContractFormatError(f"{where}: unbalanced braces in {text!r}")
            if piece:
                segments.append(("text", piece))
        elif piece in TENSORS:
            segments.append(("shape", TENSORS.index(piece)))
        elif piece in LISTS:
            segments.append(("list", LISTS.index(piece)))
        elif piece == "dtype":
            segments.append(("dtype", 0))
        else:
            segments.append(("value", compile_expression(piece, axis, where, outputs=outputs)))
    return tuple(segments)


def _axis_text(text: str, axis: int) -> str:
    """An expression as a message quotes it at one axis: `x.dim[2 + i]` -> `x.dim[2]`."""
    return re.sub(r"\[(\d+) \+ i\]", lambda m: f"[{int(m.group(1)) + axis}]", text).replace("[i]", f"[{axis}]")


@dataclasses.dataclass(frozen=True)
class Step:
    """One check at one axis. kind: 'rule' (fails where `program` is false) or 'fits' (where its
    value leaves int64); 'out' is a fits step that also gives output dimension `out`. needs_bias: only
    when a bias is passed; needs_allocation: only when the op allocates its output (not .out);
    never_guard: on symbolic sizes, fails only where provably false and never adds a guard."""

    kind: str
    name: str  # the check it comes from: its clause (a rule), `fits: <expression>` (a term), `out.dim[k]`
    arg: str
    clause: str
    program: tuple
    seen: tuple
    fix: tuple
    needs_bias: bool = False
    out: int = -1
    needs_allocation: bool = False
    never_guard: bool = False


class Table:
    """The compiled table: per op, the steps in order; and the clauses each op's rules quote."""

    def __init__(self, steps: dict[str, list[Step]], source: str):
        self.steps, self.source = steps, source

    def clauses(self, op: str) -> set[str]:
        return {s.clause for s in self.steps[op] if s.kind == "rule"}

    def without(self, name: str) -> "Table":
        """A copy with every step of one check left out (tests: a rule removed must be missed)."""
        return Table({op: [s for s in steps if s.name != name] for op, steps in self.steps.items()}, self.source)

    def for_cpp(self) -> dict:
        return {op: [dataclasses.asdict(step) for step in steps] for op, steps in self.steps.items()}


class _Builder:
    def __init__(self, source: str, overflow: str):
        self.source, self.overflow = source, overflow
        self.steps: dict[str, list[Step]] = {op: [] for op in OPS}

    def add(self, raw: Any, where: str, axes: Sequence[int], returns: bool = False) -> None:
        if not isinstance(raw, dict) or not set(raw) <= KEYS:
            raise ContractFormatError(f"{where}: expected a mapping with keys among {', '.join(sorted(KEYS))}")
        if not all(isinstance(value, str) for key, value in raw.items() if key != "ops"):
            raise ContractFormatError(f"{where}: every field but 'ops' is a string")
        ops = raw.get("ops", list(OPS))
        if not isinstance(ops, list) or not set(ops) <= set(OPS) or raw.get("when", "bias") not in ("bias", "allocates") \
                or raw.get("guard", "never") != "never":
            raise ContractFormatError(f"{where}: 'ops' is a list of {OPS}; 'when' is absent, 'bias' or 'allocates'; "
                                      "'guard' is absent or 'never'")
        if not isinstance(raw.get("arg"), str) or ("clause" in raw) == ("fits" in raw):
            raise ContractFormatError(f"{where}: a check has an 'arg' and either a 'clause' or 'fits'")
        if returns and not ("clause" in raw and "holds" in raw and raw["clause"].startswith("return.")):
            # The return clauses are prose ("out.numel * dtype_bytes <= physical memory; ..."), not expressions.
            raise ContractFormatError(f"{where}: a check of `returns` quotes a `return.` clause and states `holds`")
        for axis in axes:
            step = self.rule(raw, where, axis, returns) if "clause" in raw else self.term(raw, where, axis)
            for op in ops:
                self.steps[op].append(step)

    def rule(self, raw: dict, where: str, axis: int, returns: bool = False) -> Step:
        clause = raw["clause"]
        holds = raw.get("holds", clause.split(": ", 1)[-1])
        seen, fix = (compile_template(raw.get(key, ""), axis, where, returns) for key in ("seen", "fix"))
        return Step("rule", clause, raw["arg"], clause, compile_expression(holds, axis, where, "bool", returns), seen,
                    fix, raw.get("when") == "bias", needs_allocation=raw.get("when") == "allocates",
                    never_guard="guard" in raw)

    def term(self, raw: dict, where: str, axis: int) -> Step:
        text = " ".join(raw["fits"].split())
        seen = compile_template(f"{_axis_text(text, axis)} overflows int64 ({raw.get('context', '')})", axis, where)
        fix = compile_template(f"use a smaller {raw['arg']}", axis, where)
        return Step("fits", f"fits: {text}", raw["arg"], self.overflow, compile_expression(text, axis, where), seen,
                    fix, raw.get("when") == "bias")

    def outputs(self, op: str, shape_rule: str) -> None:
        """out = [d0, d1, out.dim[2], out.dim[3]], out.dim[2 + i] = <formula>: the contract's shape_rule."""
        match = re.fullmatch(r"\[(.*), out\.dim\[2\], out\.dim\[3\]\], out\.dim\[2 \+ i\] = (.*)", shape_rule)
        if not match or len(match.group(1).split(", ")) != 2:
            raise ContractFormatError(f"{self.source}: fuel::{op}: shape_rule {shape_rule!r} is not "
                                      "`[d0, d1, out.dim[2], out.dim[3]], out.dim[2 + i] = <formula>`")
        dims = [(text, -1) for text in match.group(1).split(", ")] + [(match.group(2), 0), (match.group(2), 1)]
        for k, (text, axis) in enumerate(dims):
            where = f"{self.source}: fuel::{op}: shape_rule"
            seen = compile_template(f"out.dim[{k}] = {_axis_text(text, axis)} overflows int64 "
                                    "(x shape {x}, weight shape {weight})", axis, where)
            program = compile_expression(text, axis, where)
            fix = compile_template("use a smaller x", axis, where)
            self.steps[op].append(Step("out", f"out.dim[{k}]", "x", self.overflow, program, seen, fix, out=k))


def contract_clauses(contracts: ContractSet, op: str) -> set[str]:
    """The shape_constraint, op_params and return.allocation clauses the registrable contracts of `op` state (all of them:
    a clause in one dtype's contract only is still a clause of the op). `int` kinds are the schema's."""
    clauses: set[str] = set()
    for contract in contracts.for_op(op):
        if contract.outputs[0].allocation is not None:
            clauses.add(f"return.allocation: {contract.outputs[0].allocation}")
        for clause in contract.inputs:
            parts = (clause.shape_constraint or "").split(";")
            clauses |= {f"shape_constraint: {part.strip()}" for part in parts if part.strip()}
        for name, field in contract.op_params.get("fields", {}).items():
            clauses.add(f"op_params.{name}: {field['constraint']}")
            if field["kind"] != "int":
                clauses.add(f"op_params.{name}: {field['kind']}")
    return clauses


def _one(contracts: ContractSet, op: str, read) -> str:
    """A text every registrable contract of `op` states alike (the shape rule, the overflow clause)."""
    values = {read(c) for c in contracts.for_op(op)}
    if len(values) != 1:
        raise ContractFormatError(f"{contracts.directory}: the contracts of fuel::{op} disagree: {sorted(values)}")
    return values.pop()


def load(contracts: ContractSet, path: str | Path | None = None, match_contracts: bool = True) -> Table:
    """Compile the table at `path` (default: the one shipped with the contracts) against `contracts`.
    With match_contracts, its clauses must be exactly the contracts' (a test turns that off to install a
    table with a rule missing)."""
    path = Path(path) if path is not None else _default_directory() / TABLE_FILE
    raw = _load_yaml(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(raw, dict) or set(raw) != {"checks", "each_axis", "returns"} or not all(
            isinstance(raw[key], list) for key in raw):
        raise ContractFormatError(f"{path}: expected the keys 'checks', 'each_axis' and 'returns', each a list of checks")
    overflow = {op: "op_params.overflow: " + _one(contracts, op, lambda c: c.op_params["overflow"]) for op in OPS}
    if len(set(overflow.values())) != 1:
        raise ContractFormatError(f"{path}: the convolutions state different overflow clauses")
    builder = _Builder(str(path), overflow["conv2d"])
    for k, check in enumerate(raw["checks"]):
        condition = next((check[key] for key in ("holds", "clause", "fits") if key in check), "") \
            if isinstance(check, dict) else ""
        uses_axis = re.search(r"\bi\b", str(condition))
        builder.add(check, f"{path}: checks[{k}]", (0, 1) if uses_axis else (-1,))
    for axis in (0, 1):
        for k, check in enumerate(raw["each_axis"]):
            builder.add(check, f"{path}: each_axis[{k}]", (axis,))
    for op in OPS:
        builder.outputs(op, _one(contracts, op, lambda c: c.outputs[0].shape_rule))
    for k, check in enumerate(raw["returns"]):  # after the shape rule: they read out.dim[k]
        builder.add(check, f"{path}: returns[{k}]", (-1,), returns=True)
    table = Table(builder.steps, str(path))
    for op in OPS if match_contracts else ():
        stated, checked = contract_clauses(contracts, op), table.clauses(op)
        if stated != checked:
            raise ContractFormatError(f"{path}: fuel::{op}: the contracts state clauses no check enforces: "
                                      f"{sorted(stated - checked)}; checks quote clauses no contract states: "
                                      f"{sorted(checked - stated)}")
    return table


@functools.cache
def installed() -> Table:
    from .contracts import installed as installed_contracts
    return load(installed_contracts())


_active: Table | None = None


def active() -> Table:
    """The table the fake kernels check with: the one installed into C++ (install() keeps them one)."""
    return _active if _active is not None else installed()


def install(table: Table) -> None:
    """Make `table` the one both C++ and the fake kernels check with."""
    global _active
    from . import _C
    _C.install_geometry(table.for_cpp())
    _active = table


# ---------------------------------------------------------------------------------------------
# Evaluation, for the API and the fake kernels (the C++ twin: csrc/convolution/geometry.cpp)


def _either(symbolic, plain):
    return lambda a, b: symbolic(a, b) if isinstance(a, torch.SymBool) or isinstance(b, torch.SymBool) else plain(a, b)


_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a // b, "mod": lambda a, b: a % b, "max": torch.sym_max, "min": torch.sym_min,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "and": _either(sym_and, lambda a, b: a and b), "or": _either(sym_or, lambda a, b: a or b),
}


def evaluate(program: Sequence[tuple[str, int]], slots: Sequence) -> tuple[Any, bool]:
    """(value, ok): ok is False where a step leaves 128 bits or divides by zero, as in C++ (which never
    wraps). Symbolic values are not range-checked here: the C++ kernel checks the real sizes."""
    stack: list = []
    for opcode, operand in program:
        if opcode == "const":
            stack.append(operand)
        elif opcode == "var":
            stack.append(slots[operand])
        elif opcode == "neg":
            stack.append(-stack.pop())
        elif opcode == "not":
            stack.append(torch.sym_not(stack.pop()))
        else:
            b, a = stack.pop(), stack.pop()
            if opcode in ("div", "mod") and isinstance(b, int) and b == 0:
                return None, False
            stack.append(_OPS[opcode](a, b))
        top = stack[-1]
        if opcode in _ARITHMETIC and isinstance(top, int) and not INT128_MIN <= top <= INT128_MAX:
            return None, False
    return stack[0], True


def beyond_int64(value) -> bool:
    """Whether `value` certainly leaves int64 (symbolic values: only where provable without a guard)."""
    if isinstance(value, int):
        return value > INT64_MAX or value < INT64_MIN
    return statically_known_true(sym_or(value > INT64_MAX, value < INT64_MIN))


def _holds(requirement) -> bool:
    """Whether the call meets a rule, decided as torch's conv meta function decides it: a guard on sizes
    with a hint (the same guard torch's conv adds), a runtime assertion on data-dependent ones."""
    if isinstance(requirement, bool):
        return requirement
    if not guard_or_true(requirement):
        return False
    torch._check(requirement)
    return True


def _provably_not_false(requirement) -> bool:
    """A `guard: never` rule: false only where the shape environment proves it so, without a guard
    (otherwise the C++ kernel checks the real sizes on every call)."""
    if isinstance(requirement, bool):
        return requirement
    return not statically_known_true(torch.sym_not(requirement))


def _render(segments, tensors: Sequence, lists: Sequence, slots: Sequence) -> str:
    from .enforce import dtype_str, shape_str
    parts = []
    for kind, what in segments:
        if kind == "text":
            parts.append(what)
        elif kind == "shape":
            parts.append(shape_str(tensors[what].shape))
        elif kind == "list":
            parts.append(shape_str(lists[what]))
        elif kind == "dtype":
            parts.append(dtype_str(tensors[0].dtype))
        else:
            value, ok = evaluate(what, slots)
            parts.append(str(value) if ok else "?")
    return "".join(parts)


@functools.cache
def physical_memory() -> int:
    """The machine's physical memory, as C++ reads it (sysconf's pages times the page size)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _slots(x, weight, bias, lists: Sequence[Sequence], groups) -> list:
    """The call's values in SLOTS order; list entries past a list's end (refused by its int[2] check
    before anything reads them) and an absent bias read 0, as do the output dimensions until the
    shape rule's steps give them."""
    values = list(x.shape) + list(weight.shape) + [bias.shape[0] if bias is not None else 0]
    for values_of in lists:
        values += [values_of[k] if k < len(values_of) else 0 for k in range(2)]
    values += [groups] + [len(values_of) for values_of in lists]
    return values + [x.dtype.itemsize, physical_memory()] + [0] * len(OUT_DIMS)


def check(op: str, kernel: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
          stride: Sequence, padding: Sequence, dilation: Sequence, output_padding: Sequence | None,
          groups, table: Table | None = None, allocates: bool = True) -> list:
    """Run the geometry checks of fuel::`op` on one call; returns the output shape. Raises the
    contract's ContractViolation with the message the C++ kernel gives. allocates: the op allocates its
    output (False for .out, whose `out` is checked instead)."""
    from .enforce import violation
    table = table if table is not None else active()
    lists = (stride, padding, dilation, output_padding if output_padding is not None else ())
    slots = _slots(x, weight, bias, lists, groups)
    shape: list = [None] * 4
    for step in table.steps[op]:
        if (step.needs_bias and bias is None) or (step.needs_allocation and not allocates):
            continue
        value, ok = evaluate(step.program, slots)
        if not ok:
            passes = False
        elif step.kind != "rule":
            passes = not beyond_int64(value)
        else:
            passes = _provably_not_false(value) if step.never_guard else _holds(value)
        if not passes:
            tensors = (x, weight, bias)
            raise violation(op, kernel, step.arg, step.clause, _render(step.seen, tensors, lists, slots),
                            _render(step.fix, tensors, lists, slots))
        if step.out >= 0:
            shape[step.out] = slots[OUT_SLOT + step.out] = value
    return shape
