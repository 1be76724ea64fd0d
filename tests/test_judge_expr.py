"""The Judge's cost-formula evaluator: arithmetic over the names a call provides, nothing else."""
from __future__ import annotations

import pytest

from fuel_torch.expr import Dims, Expr, ExprError, evaluate

NAMES = {
    "lhs": Dims((4, 5)),
    "x": Dims((2, 3, 8, 9)),
    "weight": Dims((6, 3, 3, 2)),
    "out": Dims((2, 6, 6, 8)),
    "groups": 3,
    "stride": (2, 1),
    "dtype_bytes": 4,
}


@pytest.mark.parametrize("text, expected", [
    ("lhs.numel", 20),
    ("3 * lhs.numel * dtype_bytes", 240),
    ("3 * lhs.numel * 4", 240),
    (12, 12),
    (0.5, 0.5),
    ("2 * out.dim[0] * out.dim[1] * out.dim[2] * out.dim[3] * (x.dim[1] / groups) * weight.dim[2] * weight.dim[3]",
     2 * 2 * 6 * 6 * 8 * 1.0 * 3 * 2),
    ("(x.numel + weight.numel + out.numel) * dtype_bytes", (432 + 108 + 576) * 4),
    ("stride[0] + stride[-1]", 3),
    ("-x.dim[-1] + +groups", -6),
    ("(groups + 7) // 2 % 3", 2),
    ("x.dim[2] ** 2", 64),
    ("  lhs.numel  ", 20),
])
def test_accepts_arithmetic_over_known_names(text, expected):
    assert evaluate(text, NAMES) == expected


def test_reports_the_names_a_formula_uses():
    assert Expr("x.dim[1] * weight.numel / groups + 1").names == {"x", "weight", "groups"}


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')",   # calls
    "lhs.numel()",
    "max(groups, 1)",
    "lhs.shape",                          # attributes other than .numel / .dim
    "lhs.__class__",
    "x.dim.__len__",
    "lhs.dim",                            # .dim without an index
    "x.dim[groups]",                      # non-literal index
    "x.dim[0:2]",                         # slices
    "lhs.numel.real",
    "'abc'",                              # strings
    "f'{groups}'",
    "b'x'",
    "True",                               # booleans, None, Ellipsis
    "None",
    "...",
    "[g for g in stride]",                # comprehensions and displays
    "{g: g for g in stride}",
    "(g for g in stride)",
    "[1, 2]",
    "{1: 2}",
    "lambda: 1",
    "groups if groups else 1",            # conditionals, comparisons, boolean logic
    "groups < 3",
    "groups and 1",
    "(y := 3)",
    "2 ** 3 ** 2",                        # power towers
    "(2 ** 3) ** 2",
    "groups ** groups",                   # non-literal exponents
    "2 ** 100",                           # exponent out of range
    "2 ** -1",
    "groups @ groups",                    # operators outside + - * / // % **
    "groups << 40",
    "groups ^ 1",
    "~groups",
    "not groups",
    "import os",                          # statements
    "groups = 1",
    "",
    "1 +",
    "x" * 3000,
])
def test_rejects_everything_but_arithmetic(text):
    with pytest.raises(ExprError):
        Expr(text)


@pytest.mark.parametrize("text, problem", [
    ("unknown * 2", "does not provide"),
    ("bias.numel", "does not provide"),
    ("groups.numel", "not a tensor"),
    ("dtype_bytes[0]", "not a sequence"),
    ("lhs * 2", "not a number"),
    ("x.dim[4]", "out of range"),
    ("stride[2]", "out of range"),
    ("lhs.numel / (groups - 3)", "division by zero"),
    ("1e308 * 10", "not finite"),
])
def test_evaluation_errors_name_the_problem(text, problem):
    with pytest.raises(ExprError, match=problem):
        evaluate(text, NAMES)


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}])
def test_a_formula_is_a_string_or_a_number(value):
    with pytest.raises(ExprError):
        Expr(value)


def test_every_installed_cost_formula_parses_and_evaluates():
    import torch

    import fuel_torch
    from fuel_torch.costmodel import bind, formula_names, formula_values
    from fuel_torch import families

    for contract in fuel_torch.installed().registrable:
        call = families.probes(contract.op).base_call(contract)
        out = getattr(torch.ops.fuel, contract.op)(*call.tensors.values(), **call.params)
        bound = bind(contract.op, tuple(call.tensors.values()), dict(call.params))
        values = formula_values(contract, formula_names(contract.op, bound, out.shape, contract.dtype))
        assert values["bytes_moved"] >= out.numel() * out.element_size(), contract.kernel
        assert values["flops"] >= out.numel() and values["host_bytes"] >= out.numel() * out.element_size()
