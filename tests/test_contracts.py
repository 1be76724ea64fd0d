"""The FKC files: schema validation at load, lookup, and the contract <-> kernel bijection."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

import fuel_torch
from fuel_torch import families
from fuel_torch.contracts import ContractFormatError, FKC_DTYPES, load_contracts

ALL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64,
              torch.bool, torch.complex64, torch.uint8)


def test_lookup_by_op_and_dtype():
    add = fuel_torch.contract("add", torch.float32)
    assert add.kernel == "add_f32" and add.op == "add" and add.dtype == torch.float32
    assert add.entry_point == "fuel::add"
    assert add.input("lhs").layout["strided"] == "rejected"
    assert add.outputs[0].aliasing == "none"
    assert fuel_torch.contract("pow", torch.bfloat16).precision["max_ulp"] == 1
    with pytest.raises(KeyError, match="no registrable contract for fuel::add in torch.int32"):
        fuel_torch.contract("add", torch.int32)


def test_umbrella_entry_is_not_registrable():
    contracts = fuel_torch.installed()
    assert contracts.by_kernel["binary"].registrable is False
    assert "binary" not in {c.kernel for c in contracts.registrable}


def registered_fuel_ops() -> set[str]:
    """Functional fuel ops that have a CPU kernel registered with the dispatcher."""
    names = torch._C._dispatch_get_registrations_for_dispatch_key("CPU")
    return {name.split("::")[1] for name in names if name.startswith("fuel::") and "." not in name}


def accepted_dtypes(op: str) -> set[torch.dtype]:
    """The dtypes the registered kernel really runs in, found by calling it with each."""
    family = families.of(op)
    accepted = set()
    for dtype in ALL_DTYPES:
        args, kwargs = family.example_call(op, dtype)
        try:
            result = getattr(torch.ops.fuel, op)(*args, **kwargs)
        except RuntimeError as error:
            assert "breaks `dtypes:" in str(error), str(error)
            continue
        assert result.dtype == dtype
        accepted.add(dtype)
    return accepted


def test_every_registered_kernel_has_exactly_one_contract_and_back():
    contracts = fuel_torch.installed()
    registered = {(op, dtype) for op in registered_fuel_ops() for dtype in accepted_dtypes(op)}
    declared = [(c.op, c.dtype) for c in contracts.registrable]
    assert len(declared) == len(set(declared)), "two contracts for one (op, dtype)"
    assert set(declared) == registered
    # Both overloads of every op are registered too.
    cpu = set(torch._C._dispatch_get_registrations_for_dispatch_key("CPU"))
    assert {f"fuel::{op}.out" for op, _ in declared} <= cpu


def test_every_contract_behaves_as_it_says():
    """Each registrable contract's dtype runs, and the return clause holds for the result."""
    for contract in fuel_torch.installed().registrable:
        args, kwargs = families.of(contract.op).example_call(contract.op, contract.dtype)
        result = getattr(torch.ops.fuel, contract.op)(*args, **kwargs)
        ret = contract.outputs[0]
        source = ret.dtype_rule[len("passthrough("):-1]
        assert ret.dtype_rule.startswith("passthrough(") and result.dtype == dict(
            zip([i.name for i in contract.inputs], args))[source].dtype
        # The example calls pass contiguous operands: both guarantees promise a contiguous result there.
        assert ret.layout_guarantee in ("contiguous", "contiguous_or_channels_last")
        assert result.is_contiguous() and result.storage_offset() == 0
        assert ret.aliasing == "none" and all(
            not torch._C._is_alias_of(result, a) for a in args if isinstance(a, torch.Tensor))


def test_contracts_cover_the_four_dtypes_for_every_op():
    contracts = fuel_torch.installed()
    for op in contracts.ops():
        assert {c.dtype for c in contracts.for_op(op)} == set(FKC_DTYPES.values())


@pytest.fixture
def draft(tmp_path) -> Path:
    """A writable copy of the shipped contracts."""
    target = tmp_path / "contracts"
    shutil.copytree(fuel_torch.installed().directory, target, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return target


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, count))


def kernel_block(path: Path, kernel: str) -> tuple[int, int]:
    text = path.read_text()
    start = text.index(f"kernel: {kernel}\n")
    return start, text.index("```", start)


def edit_kernel(path: Path, kernel: str, old: str, new: str) -> None:
    text = path.read_text()
    start, end = kernel_block(path, kernel)
    block = text[start:end]
    assert old in block
    path.write_text(text[:start] + block.replace(old, new, 1) + text[end:])


@pytest.mark.parametrize("change, message", [
    (("      dtypes: [F32]\n", ""), r"kernel 'add_f32': field 'accept.inputs\[0\].dtypes': missing"),
    (("strided: rejected", "strided: maybe"),
     r"kernel 'add_f32': field 'accept.inputs\[0\].layout.strided': expected one of"),
    (("dtypes: [F32]", "dtypes: [F8]"), r"kernel 'add_f32': field 'accept.inputs\[0\].dtypes': expected a non-empty"),
    (("rank: any", "rank: -2"), r"kernel 'add_f32': field 'accept.inputs\[0\].rank'"),
    (("max_ulp: 0", "max_ulp: zero"), r"kernel 'add_f32': field 'precision.max_ulp': expected int/null"),
    (("bit_stable_on_same_hardware: true", "bit_stable_on_same_hardware: 1"),
     r"kernel 'add_f32': field 'precision.bit_stable_on_same_hardware': expected bool"),
    (('entry_point: "fuel::add"', 'entry_point: "add"'), r"kernel 'add_f32': field 'entry_point'"),
    (("      aliasing: none\n", ""), r"kernel 'add_f32': field 'return.outputs\[0\].aliasing': missing"),
    (("backend: Cpu", "backend: Gpu"), r"kernel 'add_f32': field 'backend'"),
])
def test_malformed_contract_fails_at_load_naming_file_kernel_and_field(draft, change, message):
    path = draft / "elementwise.fkc.md"
    edit_kernel(path, "add_f32", *change)
    with pytest.raises(ContractFormatError, match=re.escape(str(path)) + ": " + message):
        load_contracts(draft)


def test_invalid_yaml_and_duplicates_fail_at_load(draft):
    path = draft / "elementwise.fkc.md"
    original = path.read_text()
    edit_kernel(path, "add_f32", "op_kind: AddElementwise", "op_kind: [unclosed")
    with pytest.raises(ContractFormatError, match=r"elementwise.fkc.md: fkc block \d+: not valid YAML"):
        load_contracts(draft)
    path.write_text(original)
    edit_kernel(path, "sub_f32", "kernel: sub_f32", "kernel: add_f32")
    with pytest.raises(ContractFormatError, match="kernel 'add_f32': field 'kernel': already defined"):
        load_contracts(draft)
    path.write_text(original)
    edit_kernel(path, "sub_f32", 'entry_point: "fuel::sub"', 'entry_point: "fuel::add"')
    with pytest.raises(ContractFormatError, match="two registrable contracts serve fuel::add in torch.float32"):
        load_contracts(draft)
    path.write_text(original.replace("fkc_version: 1", "fkc_version: 2"))
    with pytest.raises(ContractFormatError, match="field 'fkc_version'"):
        load_contracts(draft)


def test_a_valid_draft_loads_and_reports_its_directory(draft):
    loaded = load_contracts(draft)
    assert loaded.directory == str(draft)
    assert len(loaded.registrable) == len(fuel_torch.installed().registrable)
