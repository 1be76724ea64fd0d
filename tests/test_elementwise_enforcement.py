"""Contract enforcement for the elementwise family, on every path into a kernel.

The eager path (torch.ops.fuel.*) is checked in C++ against the rule table installed from
contracts/; the Python API and the fake kernels (torch.compile, meta tensors) are checked by
fuel_torch.enforce. The same bad input must give the same message on all three.
"""
from __future__ import annotations

import expecttest
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fuel_torch
from fuel_torch.reference import bit_equal


def base(n=6, dtype=torch.float32):
    return torch.arange(1, n + 1, dtype=dtype)


def bad_calls():
    """(name, lhs, rhs, out) for every rejection the elementwise contract makes."""
    a, b = base(), base()
    grid = torch.arange(1, 7, dtype=torch.float32).reshape(2, 3)
    return {
        "unsupported_dtype": (a.int(), b.int(), None),
        "complex_dtype": (a.to(torch.complex64), b.to(torch.complex64), None),
        "mixed_dtypes": (a, b.double(), None),
        "shape_mismatch": (a, b[:3].clone(), None),
        "rank_mismatch": (a.reshape(2, 3), b, None),
        "zero_dim_vs_vector": (torch.tensor(2.0), b, None),
        "transposed": (grid, grid.t().contiguous().t(), None),
        "step_slice": (a[:3].clone(), base(6)[::2], None),
        "expanded": (grid, torch.tensor([1.0, 2.0, 3.0]).expand(2, 3), None),
        "storage_offset": (base(7)[1:], b, None),
        "out_wrong_shape": (a, b, torch.empty(5)),
        "out_wrong_dtype": (a, b, torch.empty(6, dtype=torch.float64)),
        "out_strided": (a, b, torch.empty(12)[::2]),
        "out_offset": (a, b, torch.empty(7)[1:]),
        "out_is_lhs": (a, b, a),
        "out_is_rhs": (a, b, b),
        "out_views_rhs": (a, b, b.view(2, 3).view(6)),
    }


def message(fn) -> str:
    with pytest.raises(RuntimeError) as caught:
        fn()
    return str(caught.value)


def eager(lhs, rhs, out):
    return torch.ops.fuel.add(lhs, rhs) if out is None else torch.ops.fuel.add.out(lhs, rhs, out=out)


def api(lhs, rhs, out):
    return fuel_torch.add(lhs, rhs, out=out)


def fake(lhs, rhs, out):
    with FakeTensorMode() as mode:
        converted = [mode.from_tensor(t) if t is not None else None for t in (lhs, rhs, out)]
        return eager(*converted)


@pytest.mark.parametrize("case", sorted(bad_calls()))
def test_every_path_rejects_with_the_same_message(case):
    lhs, rhs, out = bad_calls()[case]
    from_cpp = message(lambda: eager(lhs, rhs, out))
    assert from_cpp.startswith("fuel::add [add_")
    assert message(lambda: api(lhs, rhs, out)) == from_cpp
    assert message(lambda: fake(lhs, rhs, out)) == from_cpp


def test_one_except_clause_catches_a_rejection_on_every_path():
    """Tracing raises fuel_torch.ContractViolation, the eager kernel a plain RuntimeError: a caller's
    `except RuntimeError` handles both, and sees the same text."""
    lhs, rhs, _ = bad_calls()["mixed_dtypes"]
    caught = {}
    for name, path in (("eager", eager), ("api", api), ("fake", fake)):
        try:
            path(lhs, rhs, None)
        except RuntimeError as error:
            caught[name] = error
    assert set(caught) == {"eager", "api", "fake"}
    assert type(caught["fake"]) is fuel_torch.ContractViolation
    assert len({str(error) for error in caught.values()}) == 1


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem"])
def test_every_op_enforces_its_own_contract(op):
    lhs, rhs, _ = bad_calls()["storage_offset"]
    text = message(lambda: getattr(torch.ops.fuel, op)(lhs, rhs))
    assert text.startswith(f"fuel::{op} [{op}_f32]: argument 'lhs' breaks `layout.start_offset: rejected`")
    assert message(lambda: getattr(fuel_torch, op)(lhs, rhs)) == text


class TestPinnedMessages(expecttest.TestCase):
    def check(self, case):
        return message(lambda: eager(*bad_calls()[case]))

    def test_dtype_messages(self):
        self.assertExpectedInline(self.check("unsupported_dtype"), """\
fuel::add [add_f32|add_f64|add_bf16|add_f16]: argument 'lhs' breaks `dtypes: [F32, F64, BF16, F16]`: saw torch.int32. Fix: convert the tensors to one of torch.float32, torch.float64, torch.bfloat16, torch.float16.""")
        self.assertExpectedInline(self.check("mixed_dtypes"), """\
fuel::add [add_f32]: argument 'rhs' breaks `dtypes: [F32]`: saw torch.float64. Fix: convert 'rhs' to torch.float32 (every tensor of one call has one dtype).""")

    def test_shape_messages(self):
        self.assertExpectedInline(self.check("shape_mismatch"), """\
fuel::add [add_f32]: argument 'lhs' breaks `shape_constraint: same_as=rhs`: saw lhs [6], rhs [3]. Fix: pass tensors of one shape (the kernel does not broadcast), or call through fuel_torch under layout_policy('contiguize'), which broadcasts first.""")
        self.assertExpectedInline(self.check("zero_dim_vs_vector"), """\
fuel::add [add_f32]: argument 'lhs' breaks `shape_constraint: same_as=rhs`: saw lhs [], rhs [6]. Fix: pass tensors of one shape (the kernel does not broadcast), or call through fuel_torch under layout_policy('contiguize'), which broadcasts first.""")

    def test_layout_messages(self):
        self.assertExpectedInline(self.check("transposed"), """\
fuel::add [add_f32]: argument 'rhs' breaks `layout.strided: rejected`: saw shape [2, 3], strides [1, 2], storage offset 0. Fix: pass a contiguous zero-offset copy (.contiguous() or .clone()), or call through fuel_torch under layout_policy('contiguize').""")
        self.assertExpectedInline(self.check("step_slice"), """\
fuel::add [add_f32]: argument 'rhs' breaks `layout.strided: rejected`: saw shape [3], strides [2], storage offset 0. Fix: pass a contiguous zero-offset copy (.contiguous() or .clone()), or call through fuel_torch under layout_policy('contiguize').""")
        self.assertExpectedInline(self.check("expanded"), """\
fuel::add [add_f32]: argument 'rhs' breaks `layout.broadcast_stride0: rejected`: saw shape [2, 3], strides [0, 1], storage offset 0. Fix: pass a contiguous zero-offset copy (.contiguous() or .clone()), or call through fuel_torch under layout_policy('contiguize').""")
        self.assertExpectedInline(self.check("storage_offset"), """\
fuel::add [add_f32]: argument 'lhs' breaks `layout.start_offset: rejected`: saw shape [6], strides [1], storage offset 1. Fix: pass a contiguous zero-offset copy (.contiguous() or .clone()), or call through fuel_torch under layout_policy('contiguize').""")

    def test_out_messages(self):
        self.assertExpectedInline(self.check("out_wrong_shape"), """\
fuel::add [add_f32]: argument 'out' breaks `return.shape_rule: same_as(lhs)`: saw shape [5], expected [6]. Fix: allocate out with shape [6] (.out never resizes).""")
        self.assertExpectedInline(self.check("out_wrong_dtype"), """\
fuel::add [add_f32]: argument 'out' breaks `return.dtype_rule: passthrough(lhs)`: saw torch.float64. Fix: allocate out with dtype torch.float32 (.out never casts).""")
        self.assertExpectedInline(self.check("out_strided"), """\
fuel::add [add_f32]: argument 'out' breaks `return.layout_guarantee: contiguous`: saw shape [6], strides [2], storage offset 0. Fix: pass a fresh contiguous zero-offset tensor as out.""")
        self.assertExpectedInline(self.check("out_offset"), """\
fuel::add [add_f32]: argument 'out' breaks `return.layout_guarantee: contiguous`: saw shape [6], strides [1], storage offset 1. Fix: pass a fresh contiguous zero-offset tensor as out.""")
        self.assertExpectedInline(self.check("out_is_rhs"), """\
fuel::add [add_f32]: argument 'out' breaks `return.aliasing: none`: saw out shares memory with 'rhs'. Fix: write into a tensor that no input uses.""")

    def test_device_messages(self):
        text = message(lambda: torch.ops.fuel.add(base(), base().to("meta")))
        self.assertExpectedInline(text, """\
fuel::add [add_f32]: argument 'rhs' breaks `backend: Cpu`: saw device meta ('lhs' is on cpu). Fix: move every tensor of the call to the CPU (meta tensors only for shape inference, all of them meta).""")


def test_meta_tensors_infer_shapes_and_are_checked_like_cpu_ones():
    lhs, rhs = torch.empty(3, 5, device="meta"), torch.empty(3, 5, device="meta")
    for op in ("add", "pow", "rem"):
        result = getattr(torch.ops.fuel, op)(lhs, rhs)
        assert result.device.type == "meta" and result.shape == (3, 5) and result.is_contiguous()
    out = torch.empty(3, 5, device="meta")
    assert torch.ops.fuel.mul.out(lhs, rhs, out=out) is out
    with pytest.raises(RuntimeError, match="breaks `layout.strided: rejected`"):
        torch.ops.fuel.add(lhs, rhs.t().contiguous().t())
    with pytest.raises(RuntimeError, match="breaks `shape_constraint: same_as=rhs`"):
        torch.ops.fuel.add(lhs, torch.empty(5, device="meta"))


def test_hostile_arguments_raise_instead_of_crashing():
    a = base()
    for call in (
        lambda: torch.ops.fuel.add(1.0, a),
        lambda: torch.ops.fuel.add(a, None),
        lambda: torch.ops.fuel.add(a.to_sparse(), a.to_sparse()),
        lambda: torch.ops.fuel.add.out(a, a, out=None),
        lambda: torch.ops.fuel.add(a, a, a),
    ):
        with pytest.raises((RuntimeError, TypeError, NotImplementedError)):
            call()


def test_zero_element_out_never_counts_as_aliasing():
    empty = torch.empty(0)
    assert torch.ops.fuel.add.out(empty, empty, out=torch.empty(0)).shape == (0,)


class TestLayoutPolicy:
    def test_default_is_strict(self):
        assert fuel_torch.current_policy() == "strict"
        with pytest.raises(RuntimeError, match="start_offset"):
            fuel_torch.add(base(7)[1:], base())

    def test_contiguize_materializes_views_and_broadcasts(self):
        grid = torch.randn(4, 6)
        row = torch.randn(6)
        with fuel_torch.layout_policy("contiguize"):
            assert fuel_torch.current_policy() == "contiguize"
            assert bit_equal(fuel_torch.add(grid.t(), grid.t()), grid.t() + grid.t())
            assert bit_equal(fuel_torch.mul(grid, row), grid * row)
            assert bit_equal(fuel_torch.sub(grid[1:], row.expand(3, 6)), grid[1:] - row)
            assert bit_equal(fuel_torch.maximum(grid[:, ::2], torch.tensor(0.0)), grid[:, ::2].clamp_min(0.0))
            # Mixed dtypes are not the policy's to fix: still a contract error.
            with pytest.raises(RuntimeError, match="dtypes: \\[F32\\]"):
                fuel_torch.add(grid, grid.double())
        assert fuel_torch.current_policy() == "strict"

    def test_policy_does_not_touch_the_raw_ops_or_out(self):
        with fuel_torch.layout_policy("contiguize"):
            with pytest.raises(RuntimeError, match="start_offset"):
                torch.ops.fuel.add(base(7)[1:], base())
            with pytest.raises(RuntimeError, match="return.layout_guarantee"):
                fuel_torch.add(base(), base(), out=torch.empty(12)[::2])

    def test_unknown_policy_is_refused(self):
        with pytest.raises(ValueError, match="unknown policy 'loose'"):
            with fuel_torch.layout_policy("loose"):
                pass


def test_empty_tensors_have_no_layout_to_break():
    """Zero elements: nothing is read, so strides and offsets cannot matter (torch: contiguous)."""
    odd_empty = torch.empty(0, 1, 3).expand(0, 10, 3)
    assert odd_empty.stride()[1] == 0
    offset_empty = torch.empty(5)[5:]
    for lhs in (odd_empty, offset_empty.view(0, 10, 3)):
        assert torch.ops.fuel.add(lhs, torch.empty(0, 10, 3)).shape == (0, 10, 3)
        assert fuel_torch.add(lhs, torch.empty(0, 10, 3)).shape == (0, 10, 3)
        assert fake(lhs, torch.empty(0, 10, 3), None).shape == (0, 10, 3)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem"])
def test_out_overloads_carry_torchs_out_tag(op):
    """torch.compile functionalizes .out overloads by this tag."""
    packet = getattr(torch.ops.fuel, op)
    assert torch.Tag.out in packet.out.tags
    assert torch.Tag.out not in packet.default.tags
    assert packet.out._schema.arguments[-1].alias_info.is_write
