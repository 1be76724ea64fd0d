"""What users hit (issue "What users hit"): dynamic compile, export with an open batch size, Python scalars,
CPU autocast, and the small things (version, repr, string padding on the raw op)."""

import pytest
import torch
from torch.export import Dim

import fuel_torch
import fuel_torch.nn

from test_compile_export import assert_saved_program_runs_in_a_fresh_process


class Counter:
    """A backend that counts the graphs dynamo hands it and runs them through inductor."""

    def __init__(self, backend="inductor"):
        self.graphs, self.backend = 0, backend

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)


# ---------------------------------------------------------------------------------------------------
# 1. torch.compile(dynamic=True)

def issue_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(fuel_torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
                               fuel_torch.nn.Conv2d(32, 32, 3, padding=1, groups=4))


# (module class, constructor arguments): every stride / padding / dilation / groups / output_padding mix.
GEOMETRIES = {
    "strided": (fuel_torch.nn.Conv2d, dict(in_channels=4, out_channels=8, kernel_size=3, stride=2, padding=1)),
    "dilated_grouped": (fuel_torch.nn.Conv2d, dict(in_channels=4, out_channels=8, kernel_size=(3, 2), stride=(1, 3),
                                                   padding=(2, 0), dilation=(2, 1), groups=2)),
    "depthwise": (fuel_torch.nn.Conv2d, dict(in_channels=4, out_channels=4, kernel_size=3, padding=1, groups=4)),
    "unpadded_stride3": (fuel_torch.nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, stride=3)),
    "transpose_upsample": (fuel_torch.nn.ConvTranspose2d, dict(in_channels=4, out_channels=6, kernel_size=4, stride=2,
                                                               padding=1)),
    "transpose_mixed": (fuel_torch.nn.ConvTranspose2d, dict(in_channels=4, out_channels=6, kernel_size=(3, 2),
                                                            stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
                                                            dilation=(1, 2), groups=2)),
}


@pytest.mark.parametrize("name", GEOMETRIES)
def test_dynamic_compile_of_every_geometry_matches_eager_without_recompiling(name):
    """Two fuel convs in a row (the second reads the first's symbolic sizes): one inductor compilation
    serves every batch and image size, bit-identical to eager."""
    cls, kwargs = GEOMETRIES[name]
    torch.manual_seed(0)
    follow = fuel_torch.nn.Conv2d(kwargs["out_channels"], 4, 3, padding=1, groups=2)
    model = torch.nn.Sequential(cls(**kwargs), follow).eval()
    counter = Counter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for shape in ((3, 4, 12, 13), (2, 4, 17, 9), (5, 4, 8, 8)):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))
            assert torch.equal(compiled(x), model(x)), shape
    assert counter.graphs == 1


def test_the_issue_model_compiles_dynamic_for_inference():
    model = issue_model().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for shape in ((4, 16, 8, 8), (2, 16, 7, 9), (3, 16, 32, 32)):
            x = torch.randn(shape)
            assert torch.equal(compiled(x), model(x))


def test_the_issue_model_compiles_dynamic_for_training():
    model = issue_model()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for shape in ((4, 16, 8, 8), (2, 16, 7, 9)):
        x = torch.randn(shape)
        out = compiled(x)
        out.sum().backward()
        assert torch.equal(out, model(x))


def test_symbolic_sizes_keep_open_ranges():
    """The fake kernels put no upper bound on a symbolic batch or image size: the overflow and memory checks
    that used to become guards (e.g. batch * 32 * 5 * 6 * 4 <= physical memory) are left to the C++ kernel,
    which checks the real sizes of every call."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._sympy.numbers import int_oo

    def fn(x, w, wt):
        h = torch.ops.fuel.conv2d(x, w, None, [2, 2], [1, 1])
        out = torch.ops.fuel.conv_transpose2d(h, wt, None, [2, 2], [1, 1], [1, 1], 2)
        return torch.ops.fuel.add(out, out)

    # Distinct sizes everywhere: make_fx gives equal sizes one symbol.
    gm = make_fx(fn, tracing_mode="symbolic")(torch.empty(5, 16, 9, 11), torch.empty(32, 16, 3, 3),
                                              torch.empty(32, 8, 4, 4))
    x = next(node for node in gm.graph.nodes if node.op == "placeholder").meta["val"]
    shape_env = x.shape[0].node.shape_env
    for i in (0, 2, 3):
        assert shape_env.var_to_range[x.shape[i].node.expr].upper is int_oo, shape_env.var_to_range


def test_symbolic_geometry_errors_still_raise_the_contract_message():
    """A symbolic size that certainly breaks a rule still gets the op's own message at trace time."""
    with pytest.raises(RuntimeError, match=r"fuel::conv2d \[conv2d_f32\]: argument 'weight' breaks `shape_constraint: "
                                           r"dilation\[i\] \* \(weight.dim\[2 \+ i\] - 1\) \+ 1 <= "):
        torch.compile(lambda x, w: torch.ops.fuel.conv2d(x, w), backend="aot_eager", fullgraph=True,
                      dynamic=True)(torch.randn(2, 3, 4, 4), torch.randn(2, 3, 5, 5))


# ---------------------------------------------------------------------------------------------------
# 2. torch.export with an open batch dimension

class ExportNet(torch.nn.Module):
    """A fuel conv2d, a fuel conv_transpose2d and a fuel elementwise op; forward takes `x`."""

    def __init__(self):
        super().__init__()
        self.conv = fuel_torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.up = fuel_torch.nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return torch.ops.fuel.add(self.up(self.conv(x)), x)


class OneConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = fuel_torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)




@pytest.mark.parametrize("cls", (OneConv, ExportNet))
def test_export_with_an_unbounded_batch_dim_saves_and_loads(tmp_path, cls):
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(4, 16, 16, 16)
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: Dim("batch")}})
    # The same open range torch's own conv exports with.
    twin = torch.export.export(torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)), (x,),
                               dynamic_shapes=({0: Dim("batch")},))
    assert [str(r) for r in program.range_constraints.values()] == [str(r) for r in twin.range_constraints.values()]
    inputs = [torch.randn(batch, 16, 16, 16) for batch in (1, 3, 9)]
    for x in inputs:
        assert torch.equal(program.module()(x), model(x))
    assert_saved_program_runs_in_a_fresh_process(program, model, inputs, tmp_path)


# ---------------------------------------------------------------------------------------------------
# 3. Python numbers

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def operand(dtype, numel=37):
    g = torch.Generator().manual_seed(3)
    return (torch.rand(numel, generator=g, dtype=torch.float64) * 4 + 0.25).to(dtype)


@pytest.mark.parametrize("policy", ("strict", "contiguize"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", fuel_torch.elementwise.OPS)
def test_a_number_is_a_tensor_of_the_other_operands_dtype_under_every_policy(op, dtype, policy):
    """Our definition: the number, rounded to the tensor's dtype, broadcast; then the op, bit for bit."""
    x, api, raw = operand(dtype), fuel_torch.elementwise.API[op], getattr(torch.ops.fuel, op)
    with fuel_torch.layout_policy(policy):
        for number in (2.0, 3, True, 0.1):
            filled = torch.full_like(x, number)
            right, left = api(x, number), api(number, x)
            assert right.dtype == left.dtype == dtype
            assert torch.equal(right, raw(x, filled)), number
            assert torch.equal(left, raw(filled, x)), number


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
@pytest.mark.parametrize("op", ("add", "sub", "mul", "div", "rem"))
def test_numbers_match_torch_where_the_number_is_exact_in_the_dtype(op, dtype):
    x, api, theirs = operand(dtype), fuel_torch.elementwise.API[op], fuel_torch.elementwise.TORCH_EQUIVALENT[op]
    for number in (2.0, -3, 0.5):
        assert torch.equal(api(x, number), theirs(x, number))


def test_the_issue_calls():
    x = operand(torch.float32).reshape(37, 1)
    assert torch.equal(fuel_torch.add(x, 2.0), torch.add(x, 2.0))
    assert torch.equal(fuel_torch.pow(x, 2.0), torch.ops.fuel.pow(x, torch.full_like(x, 2.0)))
    with fuel_torch.layout_policy("contiguize"):  # was AttributeError: 'float' object has no attribute 'dtype'
        assert torch.equal(fuel_torch.add(x.t(), 2.0), torch.add(x.t(), 2.0))
        assert torch.equal(fuel_torch.pow(x.expand(37, 3), 2.0), fuel_torch.pow(x.expand(37, 3).contiguous(), 2.0))


def test_number_edge_cases():
    half = operand(torch.float16)
    assert torch.equal(fuel_torch.add(half, 1e6), torch.add(half, 1e6))  # overflows to inf, as a cast does
    with pytest.raises(TypeError, match=r"fuel_torch.mul: at least one operand must be a tensor, got two numbers"):
        fuel_torch.mul(2.0, 3)
    x = operand(torch.float32)
    with pytest.raises(RuntimeError, match=r"fuel::add \[add_f32\]: argument 'lhs' breaks `layout.broadcast_stride0"):
        fuel_torch.add(x.reshape(1, 37).expand(2, 37).t(), 1.0)  # strict: a number broadcasts, a view does not


def test_numbers_compile_without_graph_breaks():
    def fn(x):
        return fuel_torch.rem(fuel_torch.mul(fuel_torch.add(x, 1.5), 2), 0.75)

    x = operand(torch.float32)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn, backend="aot_eager", fullgraph=True)(x), fn(x))


@pytest.mark.parametrize("op", fuel_torch.elementwise.OPS)
def test_the_raw_op_refuses_a_number_naming_the_api(op):
    x, raw = operand(torch.float32), getattr(torch.ops.fuel, op)
    for args, arg, number in (((x, 2.0), "rhs", "2.0"), ((3, x), "lhs", "3")):
        with pytest.raises(TypeError) as info:
            raw(*args)
        message = str(info.value)
        assert message.startswith(f"fuel::{op}: argument '{arg}' is the number {number}, but the raw op takes "
                                  f"tensors only"), message
        assert f"Fix: call fuel_torch.{op}, which takes a number" in message


def test_the_raw_op_refuses_a_number_at_trace_time_too():
    x = operand(torch.float32)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"fuel::add: argument 'rhs' is the number 2.0, but the raw op takes tensors"):
        torch.compile(lambda t: torch.ops.fuel.add(t, 2.0), backend="aot_eager", fullgraph=True)(x)


def test_a_number_given_to_an_explicit_overload_gets_torchs_schema_error():
    """torch.ops.fuel.add.default names one schema, so torch's argument parser answers before any kernel
    of ours: the message still names the op, the argument and the type."""
    with pytest.raises(RuntimeError, match=r"fuel::add\(\) Expected a value of type 'Tensor' for argument 'rhs' but "
                                           r"instead found type 'float'"):
        torch.ops.fuel.add.default(operand(torch.float32), 2.0)


# ---------------------------------------------------------------------------------------------------
# 4. CPU autocast

CONV_CALLS = {  # op: (x shape, weight shape, geometry)
    "conv2d": ((2, 4, 9, 8), (6, 2, 3, 3), dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)),
    "conv_transpose2d": ((2, 4, 5, 6), (4, 3, 3, 2), dict(stride=2, padding=(1, 0), output_padding=1, groups=2)),
}


def conv_operands(op):
    x_shape, w_shape, geometry = CONV_CALLS[op]
    g = torch.Generator().manual_seed(4)
    channels = w_shape[0] if op == "conv2d" else w_shape[1] * geometry["groups"]
    return [torch.randn(shape, generator=g) for shape in (x_shape, w_shape, (channels,))], geometry


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("op", CONV_CALLS)
def test_convs_run_in_the_autocast_dtype_as_torchs_do(op, dtype):
    (x, w, b), geometry = conv_operands(op)
    theirs_fn = fuel_torch.convolution.TORCH_EQUIVALENT[op]
    with torch.autocast("cpu", dtype=dtype):
        ours = fuel_torch.convolution.API[op](x, w, b, **geometry)
        theirs = theirs_fn(x, w, b, **geometry)
    assert ours.dtype == theirs.dtype == dtype
    # Our definition: torch's cast, then our kernel in that dtype, bit for bit.
    assert torch.equal(ours, fuel_torch.convolution.API[op](x.to(dtype), w.to(dtype), b.to(dtype), **geometry))
    if op == "conv2d":  # torch's half conv_transpose2d does not accumulate in float32: not an oracle (README)
        torch.testing.assert_close(ours, theirs)  # the dtype's default tolerance: both round to `dtype`


def test_nn_modules_train_under_autocast_as_torchs_do():
    torch.manual_seed(0)
    ours = torch.nn.Sequential(fuel_torch.nn.Conv2d(4, 8, 3, padding=1), fuel_torch.nn.ConvTranspose2d(8, 4, 2, stride=2))
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ConvTranspose2d(8, 4, 2, stride=2))
    x = torch.randn(2, 4, 6, 6)
    results = []
    for model in (ours, theirs):
        inp = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(inp)
        out.float().sum().backward()
        results.append((out, inp.grad, [p.grad for p in model.parameters()]))
    (out_a, gx_a, gp_a), (out_b, gx_b, gp_b) = results
    assert out_a.dtype == out_b.dtype == torch.bfloat16
    assert gx_a.dtype == gx_b.dtype == torch.float32
    assert [g.dtype for g in gp_a] == [g.dtype for g in gp_b] == [torch.float32] * 4


def test_autocast_leaves_float64_and_out_alone_as_torch_does():
    (x, w, b), geometry = conv_operands("conv2d")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wide = fuel_torch.conv2d(x.double(), w.double(), b.double(), **geometry)
        assert wide.dtype == torch.nn.functional.conv2d(x.double(), w.double(), b.double(), **geometry).dtype
        expected = fuel_torch.conv2d(x, w, b, **geometry)  # bfloat16
        out = torch.empty(expected.shape)
        torch.ops.fuel.conv2d.out(x, w, b, [2, 1], [1, 1], [1, 2], 2, out=out)  # writes out's float32
    assert wide.dtype == torch.float64
    assert torch.equal(out, fuel_torch.conv2d(x, w, b, **geometry))


@pytest.mark.parametrize("dtypes", ((torch.bfloat16, torch.float32), (torch.float32, torch.float64),
                                    (torch.bfloat16, torch.float16), (torch.float16, torch.float16)), ids=str)
@pytest.mark.parametrize("op", fuel_torch.elementwise.OPS)
def test_elementwise_ops_promote_under_autocast_as_torchs_do(op, dtypes):
    lhs, rhs = operand(dtypes[0]), operand(dtypes[1]).flip(0).contiguous()
    torch_op = fuel_torch.elementwise.TORCH_EQUIVALENT[op]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = getattr(torch.ops.fuel, op)(lhs, rhs), torch_op(lhs, rhs)
    assert ours.dtype == theirs.dtype
    wide = ours.dtype
    assert torch.equal(ours, getattr(torch.ops.fuel, op)(lhs.to(wide), rhs.to(wide)))
    if op != "pow":  # pow: within 1 ulp of exact on both sides, not bitwise
        assert torch.equal(ours, theirs)


def test_mixed_dtypes_are_still_refused_outside_autocast():
    with pytest.raises(RuntimeError, match=r"fuel::add \[add_bf16\]: argument 'rhs' breaks `dtypes"):
        torch.ops.fuel.add(operand(torch.bfloat16), operand(torch.float32))


def test_autocast_inside_a_compiled_function():
    (x, w, b), geometry = conv_operands("conv2d")

    def fn(x, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fuel_torch.add(fuel_torch.conv2d(x, w, b, **geometry), 1.0)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, w, b)
    assert compiled.dtype == torch.bfloat16 and torch.equal(compiled, fn(x, w, b))


# ---------------------------------------------------------------------------------------------------
# 6, 7. convert()'s report, version, repr, string padding on the raw op

def test_convert_report_says_what_routes_the_rest():
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3), torch.nn.ReLU())
    report = fuel_torch.nn.convert(model)
    assert 'torch.compile(model, backend="fuel")' in str(report)
    assert "residual adds, activations" in str(report)


def test_version_comes_from_the_installed_metadata():
    from importlib import metadata
    assert fuel_torch.__version__ == metadata.version("fuel-torch")


def test_fuel_modules_say_they_are_fuels_in_repr():
    model = torch.nn.Sequential(fuel_torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.Conv2d(32, 32, 1),
                                fuel_torch.nn.ConvTranspose2d(32, 16, 2, stride=2))
    text = repr(model)
    assert "(0): fuel.Conv2d(16, 32, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))" in text
    assert "(1): Conv2d(32, 32, kernel_size=(1, 1), stride=(1, 1))" in text
    assert "(2): fuel.ConvTranspose2d(32, 16, kernel_size=(2, 2), stride=(2, 2))" in text


def test_string_padding_on_the_raw_op_names_the_api():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    expected = (r"fuel::conv2d: argument 'padding' is the string 'same', but the raw op takes int\[2\] padding \(its "
                r"strict schema\). Fix: call fuel_torch.conv2d\(x, weight, bias, stride, padding='same', ...\)")
    with pytest.raises(TypeError, match=expected):
        torch.ops.fuel.conv2d(x, w, None, 1, "same")
    torch._dynamo.reset()
    with pytest.raises(Exception, match=expected):
        torch.compile(lambda x, w: torch.ops.fuel.conv2d(x, w, None, 1, "same"), backend="aot_eager",
                      fullgraph=True)(x, w)
    # The numbers still reach the kernel, and the API still takes the string.
    assert torch.equal(torch.ops.fuel.conv2d(x, w, None, 1, 1), fuel_torch.conv2d(x, w, None, 1, "same"))
