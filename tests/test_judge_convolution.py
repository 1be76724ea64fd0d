"""The Judge on the convolution family: probes understand the contract's rules, a wrong draft fails."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import fuel_torch
from fuel_torch.judge import cli, conformance, family_convolution, precision


@pytest.mark.parametrize("kernel", ["conv2d_f32", "conv_transpose2d_bf16"])
def test_conformance_probes_every_clause_of_the_installed_contract(kernel):
    contract = fuel_torch.installed().by_kernel[kernel]
    result = conformance.audit(contract, family_convolution)
    assert result["verdict"] == "pass", result["failed_claims"]
    assert result["counts"]["unverified"] == 0  # the shape rule and every shape constraint were probed
    assert result["counts"]["not constructible"] == 3  # reverse_strides on x, weight, bias
    claims = {p["claim"] for p in result["probes"]}
    assert {f"{name}.shape_constraint: {contract.input(name).shape_constraint}" for name in ("x", "weight", "bias")} <= claims
    assert sum(p["claim"].startswith("op_params") for p in result["probes"]) >= 6


@pytest.mark.parametrize("op", family_convolution.OPS)
def test_the_contracts_shape_rule_is_evaluated_not_trusted(op):
    rule = fuel_torch.contract(op, torch.float32).outputs[0].shape_rule
    generator = torch.Generator().manual_seed(0)
    for config in family_convolution._CONFIGS:
        call = family_convolution._make(op, config, torch.float32, generator)
        assert family_convolution.expected_shape(rule, call) == tuple(family_convolution.torch_op(call).shape)
    wrong = rule.replace("+ 1", "+ 2", 1)
    assert family_convolution.expected_shape(wrong, call) != tuple(family_convolution.torch_op(call).shape)


@pytest.mark.parametrize("kernel", ["conv2d_f64", "conv_transpose2d_f16"])
def test_precision_is_measured_against_the_exact_sum_and_the_documented_bound(kernel):
    contract = fuel_torch.installed().by_kernel[kernel]
    result = precision.audit(contract, family_convolution, "quick")
    assert result["kind"] == "exact" and result["verdict"] in ("pass", "no claim")
    assert 0 < result["documented_bound"]["max_error_over_bound"] <= 1 + 2.0 ** -11
    assert result["measured"]["max_relative"] < (1e-13 if contract.dtype == torch.float64 else 1e-2)
    assert result["torch"]["op"] == f"torch.nn.functional.{contract.op}"


def test_a_wrong_convolution_draft_fails(tmp_path):
    directory = tmp_path / "draft"
    shutil.copytree(fuel_torch.installed().directory, directory, ignore=shutil.ignore_patterns("__*"))
    path = directory / "convolution.fkc.md"
    text = path.read_text()
    start = text.index("kernel: conv2d_f32\n")
    end = text.index("```", start)
    block = text[start:end].replace("  max_relative: ~", "  max_relative: 1.0e-12", 1)
    block = block.replace("rank: 4", "rank: 3", 1)  # x
    path.write_text(text[:start] + block + text[end:])
    out = tmp_path / "out"
    status = cli.main(["--quick", "--contracts", str(directory), "--kernel", "conv2d_f32", "--checks",
                       "conformance,precision", "--out", str(out)])
    assert status == 1
    failed = json.loads((out / "judge.json").read_text())["summary"]["failed_claims"]
    assert "conv2d_f32: x.rank: 3" in failed
    assert any(c.startswith("conv2d_f32: precision.max_relative: 1e-12") for c in failed)


def test_cost_of_a_convolution_call():
    x, weight, bias = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3), torch.randn(6)
    predicted = fuel_torch.cost("conv2d", x, weight, bias, stride=[2, 2], padding=[1, 1], groups=2)
    out = torch.nn.functional.conv2d(x, weight, bias, stride=2, padding=1, groups=2)
    assert predicted.kernel == "conv2d_f32"
    assert predicted.flops == 2 * out.numel() * 2 * 3 * 3
    assert predicted.bytes_moved == (x.numel() + weight.numel() + out.numel()) * 4
