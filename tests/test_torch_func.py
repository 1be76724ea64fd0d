"""torch.func on the fuel ops: grad, vjp and vmap of every functional op.

Oracles: the same transform of the matching torch op (torch.add, F.conv2d, ...): bit for bit where the ops are
(add/sub/mul/div/maximum/minimum/rem and their gradients), within assert_close's dtype tolerance for pow and the
convolutions (different but each correctly ordered sums). vmap results must also equal per-sample calls of the
fuel op itself bit for bit: the batching rules fold the batch into one call without changing any sum.
"""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import fuel_torch
from fuel_torch import elementwise

OPS = elementwise.OPS


def operands(op, shape=(3, 5), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    lhs = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
    rhs = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
    if op in ("maximum", "minimum"):
        rhs[0] = lhs[0]  # ties: the gradient splits
    if op == "rem":
        lhs = lhs * 5
    return lhs.to(dtype), rhs.to(dtype)


def assert_equal_or_close(op, ours, theirs):
    if op == "pow":
        torch.testing.assert_close(ours, theirs)
    else:
        assert torch.equal(ours, theirs), f"{op}: {ours} != {theirs}"


@pytest.mark.parametrize("op", OPS)
def test_grad_matches_torch(op):
    lhs, rhs = operands(op)
    fuel_fn, torch_fn = getattr(torch.ops.fuel, op), elementwise.TORCH_EQUIVALENT[op]
    ours = torch.func.grad(lambda a, b: fuel_fn(a, b).sum(), argnums=(0, 1))(lhs, rhs)
    theirs = torch.func.grad(lambda a, b: torch_fn(a, b).sum(), argnums=(0, 1))(lhs, rhs)
    for a, b in zip(ours, theirs, strict=True):
        assert_equal_or_close(op, a, b)


@pytest.mark.parametrize("op", OPS)
def test_vjp_matches_torch(op):
    lhs, rhs = operands(op)
    cotangent = torch.randn(lhs.shape, generator=torch.Generator().manual_seed(1), dtype=lhs.dtype)
    out, pullback = torch.func.vjp(getattr(torch.ops.fuel, op), lhs, rhs)
    expected, expected_pullback = torch.func.vjp(elementwise.TORCH_EQUIVALENT[op], lhs, rhs)
    assert_equal_or_close(op, out, expected)
    for a, b in zip(pullback(cotangent), expected_pullback(cotangent), strict=True):
        assert_equal_or_close(op, a, b)


def test_grad_of_grad_runs_on_fuel_kernels():
    # Second derivative of x^y in x: y (y - 1) x^(y - 2).
    x, y = torch.tensor([1.5, 2.0], dtype=torch.float64), torch.tensor([3.0, 2.5], dtype=torch.float64)
    d1 = torch.func.grad(lambda a: torch.ops.fuel.pow(a, y).sum())
    d2 = torch.func.grad(lambda a: d1(a).sum())(x)
    torch.testing.assert_close(d2, y * (y - 1) * x ** (y - 2))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("in_dims", [(0, 0), (1, None), (None, 0), (2, 1)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_vmap_matches_torch_and_per_sample_calls(op, in_dims, dtype):
    batch = 4
    lhs, rhs = operands(op, shape=(3, 5), dtype=dtype)

    def batched(t, dim, seed):  # a batched operand with the batch at `dim`, or t itself
        if dim is None:
            return t
        stacked = torch.stack([t * (1 + 0.25 * i) for i in range(batch)], 0) + seed
        return stacked.movedim(0, dim)

    lhs_b, rhs_b = batched(lhs, in_dims[0], 0.0), batched(rhs, in_dims[1], 0.125)
    fuel_fn = getattr(torch.ops.fuel, op)
    ours = torch.vmap(fuel_fn, in_dims=in_dims)(lhs_b, rhs_b)
    theirs = torch.vmap(elementwise.TORCH_EQUIVALENT[op], in_dims=in_dims)(lhs_b, rhs_b)
    assert ours.shape == theirs.shape == (batch, 3, 5)
    # Per-sample calls of our own op: the fold into one call changes no bit.
    pick = lambda t, dim, i: t if dim is None else t.select(dim, i).clone(memory_format=torch.contiguous_format)  # noqa: E731
    per_sample = torch.stack([fuel_fn(pick(lhs_b, in_dims[0], i), pick(rhs_b, in_dims[1], i)) for i in range(batch)])
    assert torch.equal(ours.isnan(), per_sample.isnan())
    assert torch.equal(ours.nan_to_num(), per_sample.nan_to_num())
    if op == "pow" or dtype in (torch.bfloat16, torch.float16) and op == "rem":
        torch.testing.assert_close(ours, theirs, equal_nan=True)
    else:
        assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())


def test_vmap_rejects_what_the_op_rejects_with_its_own_message():
    x = torch.rand(4, 3)
    with pytest.raises(RuntimeError) as plain:
        torch.ops.fuel.add(x[0], torch.rand(2))
    with pytest.raises(RuntimeError) as batched:
        torch.vmap(torch.ops.fuel.add, in_dims=(0, None))(x, torch.rand(2))
    assert "breaks `shape_constraint: same_as=" in str(plain.value)
    assert str(batched.value) == str(plain.value)
    with pytest.raises(RuntimeError, match=r"fuel::add \[add_f32\|.*\]: argument 'lhs' breaks `dtypes"):
        torch.vmap(torch.ops.fuel.add)(torch.ones(4, 3, dtype=torch.int32), torch.ones(4, 3, dtype=torch.int32))


def test_vmap_of_grad_gives_per_sample_gradients():
    lhs, rhs = operands("mul", shape=(4, 6))
    per_sample = torch.vmap(torch.func.grad(lambda a, b: torch.ops.fuel.mul(a, b).sum(), argnums=(0, 1)))(lhs, rhs)
    assert torch.equal(per_sample[0], rhs) and torch.equal(per_sample[1], lhs)


# ---------------------------------------------------------------------------------------------------
# Convolution

CONV = {  # name: (transpose, x shape, weight shape, groups, params after (x, weight, bias) up to groups)
    "conv2d": (False, (2, 4, 7, 6), (6, 2, 3, 2), 2, ([2, 1], [1, 0], [1, 2], 2)),
    "conv2d_defaults": (False, (1, 3, 5, 5), (2, 3, 3, 3), 1, ()),
    "conv_transpose2d": (True, (2, 4, 4, 3), (4, 3, 3, 2), 2, ([2, 1], [1, 0], [1, 0], 2, [1, 2])),
}


def conv_call(name, fuel):
    transpose, *_, params = CONV[name]
    if fuel:
        op = torch.ops.fuel.conv_transpose2d if transpose else torch.ops.fuel.conv2d
        return lambda x, w, b: op(x, w, b, *params)
    return lambda x, w, b: (TF.conv_transpose2d if transpose else TF.conv2d)(x, w, b, *params)


def conv_operands(name, batch=None, dtype=torch.float64):
    transpose, x_shape, w_shape, groups, _ = CONV[name]
    g = torch.Generator().manual_seed(0)
    lead = (batch,) if batch else ()
    channels = w_shape[1] * groups if transpose else w_shape[0]
    return (torch.randn(*lead, *x_shape, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(*lead, *w_shape, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(*lead, channels, generator=g, dtype=torch.float64).to(dtype))


@pytest.mark.parametrize("name", CONV)
def test_conv_grad_and_vjp_match_torch(name):
    x, w, b = conv_operands(name)
    ours, theirs = conv_call(name, True), conv_call(name, False)
    got = torch.func.grad(lambda *a: ours(*a).square().sum(), argnums=(0, 1, 2))(x, w, b)
    expected = torch.func.grad(lambda *a: theirs(*a).square().sum(), argnums=(0, 1, 2))(x, w, b)
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    out, pullback = torch.func.vjp(ours, x, w, b)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    expected_out, expected_pullback = torch.func.vjp(theirs, x, w, b)
    torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12)
    for a, e in zip(pullback(cotangent), expected_pullback(cotangent), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


CONV_TOLERANCE = {torch.float64: {"rtol": 1e-12, "atol": 1e-12}, torch.float32: {"rtol": 1e-5, "atol": 1e-5},
                  torch.bfloat16: {"rtol": 2 ** -8, "atol": 1e-4}}  # bfloat16: one rounding of the result


@pytest.mark.parametrize("dtype", CONV_TOLERANCE, ids=str)
@pytest.mark.parametrize("batched", ["x", "weight", "bias", "x+weight", "all"])
@pytest.mark.parametrize("name", CONV)
def test_conv_vmap_matches_per_sample_calls_and_torch(name, batched, dtype):
    batch = 3
    xb, wb, bb = conv_operands(name, batch=batch, dtype=dtype)
    x, w, b = (t[0].clone() for t in (xb, wb, bb))
    use = {"x": "x" in batched or batched == "all", "weight": "weight" in batched or batched == "all",
           "bias": batched in ("bias", "all")}
    args = (xb if use["x"] else x, wb if use["weight"] else w, bb if use["bias"] else b)
    in_dims = tuple(0 if use[k] else None for k in ("x", "weight", "bias"))
    ours = torch.vmap(conv_call(name, True), in_dims=in_dims)(*args)
    per_sample = torch.stack([conv_call(name, True)(*(a[i].clone() if d == 0 else a for a, d in zip(args, in_dims)))
                              for i in range(batch)])
    assert torch.equal(ours, per_sample)
    # torch in float64 on the same values: ours accumulates in float32 (float64) and rounds once.
    theirs = torch.vmap(conv_call(name, False), in_dims=in_dims)(*(a.double() for a in args))
    torch.testing.assert_close(ours.double(), theirs, **CONV_TOLERANCE[dtype])


@pytest.mark.parametrize("name", CONV)
def test_vmap_of_conv_grad_gives_per_sample_gradients(name):
    """Per-sample gradients (vmap over grad, batch folded into the calls) equal one grad call per
    sample bit for bit, the bias gradient's op (fuel_backward::conv_bias_grad) included, and every
    op on the way has a batching rule (no per-sample fallback warning)."""
    xb, w, b = conv_operands(name, batch=3)
    w, b = w[0].clone(), b[0].clone()
    ours = conv_call(name, True)
    loss = lambda x, w, b: ours(x, w, b).square().sum()  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        per_sample = torch.vmap(torch.func.grad(loss, argnums=(1, 2)), in_dims=(0, None, None))(xb, w, b)
    assert not [m for m in caught if "batching rule" in str(m.message)]
    for i in range(3):
        expected = torch.func.grad(loss, argnums=(1, 2))(xb[i].clone(), w, b)
        for got, want in zip(per_sample, expected, strict=True):
            assert torch.equal(got[i], want)


def test_conv_vmap_batch_not_in_front_and_bad_sample_rank():
    x, w, b = conv_operands("conv2d", batch=2)
    ours = torch.vmap(conv_call("conv2d", True), in_dims=(2, None, None))(x.movedim(0, 2), w[0].clone(), b[0].clone())
    expected = torch.stack([conv_call("conv2d", True)(x[i].clone(), w[0].clone(), b[0].clone()) for i in range(2)])
    assert torch.equal(ours, expected)
    # One sample of a 4-d batch is 3-d: the op's own rank error, as without vmap.
    with pytest.raises(RuntimeError, match=r"fuel::conv2d \[conv2d_f64\]: argument 'x' breaks `rank: 4`"):
        torch.vmap(lambda x: torch.ops.fuel.conv2d(x, w[0].clone()))(x[0])


def test_forward_mode_is_refused_under_torch_func_jvp_for_conv():
    x, w, b = conv_operands("conv2d")
    with pytest.raises(RuntimeError, match=r"fuel::conv2d: forward-mode AD .* Use reverse mode"):
        torch.func.jvp(lambda x: conv_call("conv2d", True)(x, w, b), (x,), (torch.ones_like(x),))
