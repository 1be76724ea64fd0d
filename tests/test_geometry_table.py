"""The convolution geometry checks come from one table, contracts/convolution.geometry.yaml.

Every check of the table (each rule, each overflow term) has a triggering call below; the eager op,
the Python API and the fake kernel refuse it with one message, which names that check. A table
with one check left out, installed into C++ and the fake kernels alike, lets that call through:
the checks run nowhere else. No clause text is written in this file: the names come from the table.
"""
from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fuel_torch
from fuel_torch import _C, geometry
from fuel_torch.contracts import ContractFormatError, load_contracts

BIG = 2**62
T = "conv_transpose2d"

# (op, x, weight, bias, geometry): one call per check of the table, x's batch replaced by `n`.
TRIGGERS = [
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"stride": [1]}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"stride": [1, 0]}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": [1, 1, 1]}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": [0, -1]}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"dilation": []}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"dilation": 0}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"groups": 0}),
    ("conv2d", (1, 3, 8, 8), (4, 1, 3, 3), None, {"groups": 2}),
    ("conv2d", (1, 4, 8, 8), (5, 2, 3, 3), None, {"groups": 2}),
    ("conv2d", (1, 6, 8, 8), (4, 3, 3, 3), None, {}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 0, 3), None, {}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), (5,), {}),
    ("conv2d", (1, 4, 4, 9), (4, 4, 5, 5), None, {}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": [1, BIG]}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"dilation": BIG}),
    ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": BIG - 1}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"stride": [2, 2, 2]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"stride": [0, 1]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": [2]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": -1}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"dilation": [1, 1, 1]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"dilation": [1, -3]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"output_padding": []}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"stride": 2, "output_padding": [1, 2]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"groups": -2}),
    (T, (1, 3, 8, 8), (3, 2, 3, 3), None, {"groups": 2}),
    (T, (1, 6, 8, 8), (4, 2, 3, 3), None, {}),
    (T, (1, 0, 4, 4), (0, 4, 3, 3), None, {"groups": BIG}),
    (T, (1, 4, 8, 8), (4, 4, 3, 0), None, {}),
    (T, (1, 4, 8, 8), (4, 3, 3, 3), (3,), {"groups": 2}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"padding": [BIG, 1]}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"dilation": BIG}),
    (T, (1, 4, 8, 8), (4, 4, 3, 3), None, {"stride": BIG}),
    (T, (1, 4, 2, 2), (4, 4, 2, 2), None, {"stride": [BIG, 1], "dilation": [BIG, 1]}),
    (T, (1, 4, 1, 1), (4, 4, 1, 1), None, {"padding": 1}),
    # `returns`, the allocation rule: strides beyond int64 (so even with an empty batch).
    ("conv2d", (1, 1, 1, 1), (1, 1, 1, 1), None, {"padding": 2**40}),
    (T, (1, 1, 1, 1), (1, 1, 2, 2), None, {"dilation": 2**40}),
]
IDS = [f"{op}-{i}" for i, (op, *_) in enumerate(TRIGGERS)]


def call(trigger, n: int = 1, path: str = "eager", mode: FakeTensorMode | None = None) -> str | None:
    """The message `trigger` raises (None: it returned), through the op, the API or the fake kernel."""
    op, x_shape, w_shape, b_shape, kwargs = trigger
    tensors = [torch.randn((n,) + x_shape[1:]), torch.randn(w_shape), b_shape and torch.randn(b_shape)]
    if mode is not None:
        tensors = [t if t is None else mode.from_tensor(t) for t in tensors]
    fn = fuel_torch.convolution.API[op] if path == "api" else getattr(torch.ops.fuel, op)
    try:
        with mode if mode is not None else contextlib.nullcontext():
            fn(*tensors, **kwargs)
    except RuntimeError as error:
        return str(error)
    return None


def checks_of(op: str, table: geometry.Table) -> set[str]:
    return {step.name for step in table.steps[op] if step.kind != "out"}


def named_check(op: str, message: str | None, table: geometry.Table) -> str | None:
    """The table check a message comes from: a rule by its clause, a term by the expression it quotes."""
    match = re.match(r"fuel::\w+ \[\w+\]: argument '\w+' breaks `(.*?)`: saw (.*)\. Fix: ", message or "")
    if not match:
        return None
    for step in table.steps[op]:
        quoted = step.seen[0][1] if step.seen and step.seen[0][0] == "text" else None
        if step.kind == "rule" and step.clause == match.group(1):
            return step.name
        if step.kind != "rule" and step.clause == match.group(1) and quoted and match.group(2).startswith(quoted):
            return step.name
    return None


@contextlib.contextmanager
def installed_table(table: geometry.Table):
    """`table` in C++ and in the fake kernels for the block, then the shipped one again."""
    geometry.install(table)
    try:
        yield
    finally:
        geometry.install(geometry.installed())


def test_every_check_of_the_table_has_a_trigger():
    table = geometry.installed()
    for op in geometry.OPS:
        hit = {named_check(op, call(t), table) for t in TRIGGERS if t[0] == op}
        assert hit == checks_of(op, table), f"fuel::{op}: untested {checks_of(op, table) - hit}, unknown {hit}"


@pytest.mark.parametrize("trigger", TRIGGERS, ids=IDS)
def test_eager_api_and_fake_refuse_with_one_message(trigger):
    eager = call(trigger)
    assert named_check(trigger[0], eager, geometry.installed()), eager
    assert call(trigger, path="api") == eager
    assert call(trigger, mode=FakeTensorMode()) == eager
    assert call(trigger, path="api", mode=FakeTensorMode()) == eager


@pytest.mark.parametrize("trigger", TRIGGERS, ids=IDS)
def test_a_check_left_out_of_the_table_is_checked_nowhere(trigger):
    # An empty batch: whatever the call gets past, no kernel runs on it (nothing to compute).
    op, table = trigger[0], geometry.installed()
    name = named_check(op, call(trigger, n=0), table)
    assert name is not None
    with installed_table(table.without(name)):
        eager, fake = call(trigger, n=0), call(trigger, n=0, mode=FakeTensorMode())
    assert named_check(op, eager, table) != name, eager
    assert named_check(op, fake, table) != name, fake
    assert call(trigger, n=0) is not None  # the shipped table is back


def test_a_removed_rule_lets_a_bad_call_return():
    """The whole story for one rule: without it, a call it refused now returns a tensor."""
    trigger = next(t for t in TRIGGERS if t[0] == "conv2d" and t[4] == {"groups": 2} and t[1][1] == 3)
    name = named_check("conv2d", call(trigger), geometry.installed())
    with installed_table(geometry.installed().without(name)):
        assert call(trigger, n=0) is None
        assert call(trigger, n=0, mode=FakeTensorMode()) is None


# ---------------------------------------------------------------------------------------------
# The table and the contracts must state the same clauses; the table is refused at load otherwise.


@pytest.fixture
def draft(tmp_path) -> Path:
    target = tmp_path / "contracts"
    shutil.copytree(fuel_torch.installed().directory, target, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return target


def test_the_table_quotes_exactly_the_contracts_clauses():
    table, contracts = geometry.installed(), fuel_torch.installed()
    for op in geometry.OPS:
        assert table.clauses(op) == geometry.contract_clauses(contracts, op)
        assert len(table.clauses(op)) >= 12


def test_a_rule_deleted_from_the_table_is_refused_at_load(draft):
    path = draft / geometry.TABLE_FILE
    lines = path.read_text().splitlines(keepends=True)
    start = next(k for k, line in enumerate(lines) if "weight.dim[0] % groups == 0" in line)
    end = next(k for k in range(start + 1, len(lines)) if lines[k].startswith("  - "))
    path.write_text("".join(lines[:start] + lines[end:]))
    with pytest.raises(ContractFormatError, match=r"fuel::conv2d: the contracts state clauses no check enforces: "
                                                  r"\['shape_constraint: weight.dim\[0\] % groups == 0'\]"):
        geometry.load(load_contracts(draft), path)
    # What the test above installs: the same table, not compared with the contracts.
    loose = geometry.load(load_contracts(draft), path, match_contracts=False)
    assert checks_of("conv2d", geometry.installed()) - checks_of("conv2d", loose) == {
        "shape_constraint: weight.dim[0] % groups == 0"}


def test_a_clause_deleted_from_a_contract_is_refused_at_load(draft):
    path = draft / "convolution.fkc.md"
    text = path.read_text()
    start = text.index("kernel: conv_transpose2d_bf16\n")
    block = text[start:text.index("```", start)]
    path.write_text(text[:start] + block.replace("x.dim[1] % groups == 0; ", "", 1) + text[start + len(block):])
    # Still stated by the other dtypes' contracts: a clause of the op, so the table may keep it.
    geometry.load(load_contracts(draft), draft / geometry.TABLE_FILE)
    path.write_text(text.replace("; weight.dim[2 + i] >= 1", ""))
    with pytest.raises(ContractFormatError, match=r"checks quote clauses no contract states: "
                                                  r"\['shape_constraint: weight.dim\[2 \+ i\] >= 1'\]"):
        geometry.load(load_contracts(draft), draft / geometry.TABLE_FILE)


def test_a_changed_condition_changes_every_path(draft):
    """A rule's condition is its clause's text: edited in the table (and the contracts), it is what runs."""
    for name in ("convolution.fkc.md", geometry.TABLE_FILE):
        path = draft / name
        path.write_text(path.read_text().replace("groups >= 1", "groups >= 2"))
    table = geometry.load(load_contracts(draft), draft / geometry.TABLE_FILE)
    trigger = ("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"groups": 1})
    assert call(trigger) is None
    with installed_table(table):
        eager, fake = call(trigger), call(trigger, mode=FakeTensorMode())
    assert eager == fake and "breaks `op_params.groups: groups >= 2`: saw groups 1" in eager


def test_the_output_shape_is_the_contracts_shape_rule(draft):
    path = draft / "convolution.fkc.md"
    path.write_text(path.read_text().replace("- 1) / stride[i] + 1", "- 1) / stride[i] + 2"))
    table = geometry.load(load_contracts(draft), draft / geometry.TABLE_FILE)
    x, w = torch.randn(0, 4, 8, 8), torch.randn(4, 4, 3, 3)
    with installed_table(table):
        assert torch.ops.fuel.conv2d(x, w).shape == (0, 4, 7, 7)
        with FakeTensorMode() as mode:
            assert torch.ops.fuel.conv2d(mode.from_tensor(x), mode.from_tensor(w)).shape == (0, 4, 7, 7)
    assert torch.ops.fuel.conv2d(x, w).shape == (0, 4, 6, 6)


@pytest.mark.parametrize("text, problem", [
    ("__import__('os').system('true')", "is not allowed"),
    ("x.dim[1] ** 2 >= 1", "is not allowed"),
    ("x.shape[1] >= 1", "unknown name `x.shape"),
    ("x.dim[j] >= 1", "an index is made of integers and i"),
    ("x.dim[1] + 1", "expected a condition"),
    ("(x.dim[1] >= 1) + 1 >= 1", "must be an integer"),
    ("1 + (" * 16 + "1" + ")" * 16 + " >= 0", "deeper stack"),
    ("x.dim[1] < 9223372036854775808", "does not fit in int64"),
    ("1" * 2001, "longer than 2000 characters"),
])
def test_expressions_outside_the_language_are_refused(text, problem):
    with pytest.raises(ContractFormatError, match=re.escape(problem)):
        geometry.compile_expression(text, 0, "test", "bool")


def test_cpp_refuses_a_malformed_program_and_keeps_its_table():
    steps = geometry.installed().for_cpp()
    for program in ([("var", len(geometry.SLOTS))], [("add", 0)], [("const", 1), ("const", 2)], [("const", 1)] * 17):
        broken = {op: [dict(s) for s in ss] for op, ss in steps.items()}
        broken["conv2d"][0]["program"] = tuple(program)
        with pytest.raises(RuntimeError, match="malformed or deeper"):
            _C.install_geometry(broken)
    assert "groups >= 1" in call(("conv2d", (1, 4, 8, 8), (4, 4, 3, 3), None, {"groups": 0}))


def test_evaluation_never_wraps():
    """Floor division and modulo as Python's, and a value beyond 128 bits is a refusal, not a wrap."""
    slots = [0] * len(geometry.SLOTS)
    for text, value in [("-7 / 2", -4), ("-7 % 2", 1), ("7 % -2", -1), ("max(3, -4) * min(3, -4)", -12)]:
        assert geometry.evaluate(geometry.compile_expression(text, -1, "test"), slots) == (value, True)
    huge = " * ".join(["4611686018427387904"] * 3)
    assert geometry.evaluate(geometry.compile_expression(huge, -1, "test"), slots) == (None, False)
    assert geometry.evaluate(geometry.compile_expression("1 / 0", -1, "test"), slots) == (None, False)


def test_a_repeated_geometry_is_checked_again_when_anything_changes():
    """C++ skips the programs for a call whose op, table, bias presence and values repeat the last call
    that passed on its thread; any difference runs them again."""
    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3)
    for _ in range(2):
        assert torch.ops.fuel.conv2d(x, w, torch.randn(4)).shape == (1, 4, 6, 6)
    with pytest.raises(RuntimeError, match="bias.dim"):
        torch.ops.fuel.conv2d(x, w, torch.randn(5))
    assert torch.ops.fuel.conv2d(x, w).shape == (1, 4, 6, 6)
    with pytest.raises(RuntimeError, match="groups"):
        torch.ops.fuel.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 3)
    with pytest.raises(RuntimeError, match="stride"):
        torch.ops.fuel.conv_transpose2d(x, w, None, [1, 0])
    name = named_check("conv2d", call(TRIGGERS[3]), geometry.installed())
    with installed_table(geometry.installed().without(name)):
        assert torch.ops.fuel.conv2d(x[:0], w, None, [1, 1], [0, -1]).shape == (0, 4, 6, 4)
    with pytest.raises(RuntimeError, match="padding"):
        torch.ops.fuel.conv2d(x[:0], w, None, [1, 1], [0, -1])


# ---------------------------------------------------------------------------------------------
# The allocation rule (`returns`): the output the shape rule gives must fit in memory and in int64.

# Outputs beyond this machine's memory (a batch of 1: an empty one would need no memory).
BEYOND_MEMORY = [
    ("conv2d", (1, 1, 1, 1), (1, 1, 1, 1), None, {"padding": 2**20}),
    (T, (1, 2, 1, 1), (2, 1, 2, 2), None, {"dilation": 2**21}),
]


def allocation_clause() -> str:
    return next(step.clause for step in geometry.installed().steps["conv2d"] if step.needs_allocation)


def tightened(draft: Path, limit: str) -> geometry.Table:
    """The shipped table with the memory half of the allocation rule comparing against `limit`."""
    path = draft / geometry.TABLE_FILE
    path.write_text(path.read_text().replace("<= physical_memory", f"<= {limit}"))
    return geometry.load(load_contracts(draft), path)


@pytest.mark.parametrize("trigger", BEYOND_MEMORY, ids=["conv2d", T])
def test_an_output_beyond_memory_is_refused_alike_on_every_path(trigger):
    eager = call(trigger)  # refused before anything is allocated
    assert named_check(trigger[0], eager, geometry.installed()) == allocation_clause(), eager
    assert re.search(r": \d+ bytes, physical memory \d+ bytes\. Fix: ", eager), eager
    assert call(trigger, path="api") == eager
    assert call(trigger, mode=FakeTensorMode()) == eager
    assert call(trigger, path="api", mode=FakeTensorMode()) == eager


def test_without_the_allocation_rule_the_fakes_let_a_huge_output_through():
    """The fake kernels' allocation check is the table's: removed, a fake call gives the huge output.
    (C++ is shown to run the table's rule by test_a_tightened_allocation_rule_runs_in_cpp: removed
    there, this call would allocate terabytes.)"""
    with installed_table(geometry.installed().without(allocation_clause())):
        for trigger in BEYOND_MEMORY:
            assert call(trigger, mode=FakeTensorMode()) is None
            assert call(trigger, path="api", mode=FakeTensorMode()) is None
    assert call(BEYOND_MEMORY[0], mode=FakeTensorMode()) is not None


def test_a_tightened_allocation_rule_runs_in_cpp(draft):
    """A limit edited in the table (clause unchanged, so it loads) is what C++ and the fakes refuse with."""
    table = tightened(draft, "64")
    x, w = torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1)
    with installed_table(table):
        assert torch.ops.fuel.conv2d(x, w).shape == (1, 1, 4, 4)  # 16 floats: 64 bytes
        for op, weight in (("conv2d", (1, 1, 1, 1)), (T, (1, 1, 1, 1))):
            trigger = (op, (1, 1, 4, 5), weight, None, {})
            eager, fake = call(trigger), call(trigger, mode=FakeTensorMode())
            assert eager == fake and named_check(op, eager, table) == allocation_clause(), eager
            assert "saw out shape [1, 1, 4, 5] of torch.float32: 80 bytes, physical memory" in eager
        # .out overloads check their `out` instead: the rule does not apply to them.
        out = torch.empty(1, 1, 4, 5)
        assert torch.ops.fuel.conv2d.out(torch.randn(1, 1, 4, 5), w, out=out) is out


def test_a_repeated_geometry_is_checked_again_with_another_dtype(draft):
    """C++ skips the programs for a repeated geometry; the element size is part of what must repeat."""
    with installed_table(tightened(draft, "64")):
        x, w = torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1)
        for _ in range(2):
            assert torch.ops.fuel.conv2d(x, w).shape == (1, 1, 4, 4)
        with pytest.raises(RuntimeError, match=r"of torch.float64: 128 bytes, physical memory"):
            torch.ops.fuel.conv2d(x.double(), w.double())
        assert torch.ops.fuel.conv2d(x.half(), w.half()).shape == (1, 1, 4, 4)


def test_the_allocation_clause_is_the_contracts(draft):
    contracts = fuel_torch.installed()
    for op in geometry.OPS:
        stated = {f"return.allocation: {c.outputs[0].allocation}" for c in contracts.for_op(op)}
        assert stated == {step.clause for step in geometry.installed().steps[op] if step.needs_allocation}
    path = draft / geometry.TABLE_FILE
    path.write_text(path.read_text().replace("<= physical memory;", "<= all memory;"))
    with pytest.raises(ContractFormatError, match=r"the contracts state clauses no check enforces: "
                                                  r"\['return.allocation: out.numel \* dtype_bytes <= physical"):
        geometry.load(load_contracts(draft), path)


def test_only_returns_may_read_the_output():
    with pytest.raises(ContractFormatError, match=re.escape("unknown name `out.dim[0]`")):
        geometry.compile_expression("out.dim[0] >= 0", -1, "test", "bool")
    steps = geometry.installed().for_cpp()
    early = {op: [dict(s) for s in ss] for op, ss in steps.items()}
    early["conv2d"][0]["program"] = (("var", geometry.OUT_SLOT), ("const", 0), ("ge", 0))
    with pytest.raises(RuntimeError, match="reads an output dimension before the steps that give it"):
        _C.install_geometry(early)


def test_the_allocation_rule_adds_no_guard_on_a_symbolic_batch():
    """On a symbolic batch the rule is not provably broken: the fake gives the output, with no guard
    bounding the batch (the C++ kernel checks the real sizes)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * 3)
    x = mode.from_tensor(torch.randn(5, 32, 8, 8), symbolic_context=context)
    w = mode.from_tensor(torch.randn(32, 32, 3, 3))
    batch = x.shape[0].node.expr
    with mode:
        out = torch.ops.fuel.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)
    assert out.shape[0].node.expr == batch
    assert not [g for g in env.guards if batch in g.expr.free_symbols], env.guards
