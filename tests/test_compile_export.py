"""fuel ops under torch.library.opcheck, torch.compile and torch.export.

opcheck (test_utils="ALL": schema, autograd registration, fake tensor, AOT dispatch static and dynamic)
runs every op and .out overload in every dtype, with and without requires_grad inputs. A .out overload
with an input that requires grad refuses grad mode (torch's out= convention, tested in test_autograd), so
its requires_grad run is under torch.no_grad(), where an out= call is legitimate.
"""
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.library import opcheck

import fuel_torch
from fuel_torch import elementwise
from test_autograd import lane_order_case

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def elementwise_args(op, dtype, requires_grad):
    g = torch.Generator().manual_seed(0)
    # Positive operands keep every result finite and NaN-free: opcheck compares outputs with NaN != NaN.
    lhs = (torch.rand(3, 5, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    rhs = (torch.rand(3, 5, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    return lhs.requires_grad_(requires_grad), rhs.requires_grad_(requires_grad)


def run_opcheck(overload, args, kwargs, requires_grad):
    grad_mode = torch.no_grad() if (requires_grad and "out" in kwargs) else torch.enable_grad()
    with grad_mode:
        result = opcheck(overload, args, kwargs, test_utils="ALL")
    assert result and set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("requires_grad", (False, True), ids=("no_grad", "requires_grad"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", elementwise.OPS)
def test_opcheck_elementwise(op, dtype, requires_grad):
    lhs, rhs = elementwise_args(op, dtype, requires_grad)
    packet = getattr(torch.ops.fuel, op)
    run_opcheck(packet.default, (lhs, rhs), {}, requires_grad)
    run_opcheck(packet.out, (lhs, rhs), {"out": torch.empty(lhs.shape, dtype=dtype)}, requires_grad)


CONV_CASES = {  # name: (x shape, weight shape, with bias, functional args after (x, weight, bias))
    "conv2d": ((2, 4, 7, 6), (6, 2, 3, 2), True, ([2, 1], [1, 0], [1, 2], 2)),
    "conv2d_defaults": ((1, 3, 5, 5), (2, 3, 3, 3), False, ()),
    "conv_transpose2d": ((2, 4, 4, 3), (4, 3, 3, 2), True, ([2, 3], [1, 0], [1, 2], 2, [1, 2])),
    "conv_transpose2d_defaults": ((1, 2, 3, 3), (2, 3, 2, 2), False, ()),
}


@pytest.mark.parametrize("requires_grad", (False, True), ids=("no_grad", "requires_grad"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CONV_CASES)
def test_opcheck_convolution(case, dtype, requires_grad):
    x_shape, w_shape, with_bias, rest = CONV_CASES[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g).to(dtype).requires_grad_(requires_grad)
    weight = torch.randn(w_shape, generator=g).to(dtype).requires_grad_(requires_grad)
    transpose = case.startswith("conv_transpose2d")
    channels = w_shape[1] * (rest[3] if rest else 1) if transpose else w_shape[0]
    bias = torch.randn(channels, generator=g).to(dtype).requires_grad_(requires_grad) if with_bias else None
    packet = torch.ops.fuel.conv_transpose2d if transpose else torch.ops.fuel.conv2d
    args = (x, weight, bias, *rest) if with_bias or rest else (x, weight)
    run_opcheck(packet.default, args, {}, requires_grad)
    with torch.no_grad():
        expected = packet.default(*args)
    run_opcheck(packet.out, args, {"out": torch.empty_like(expected)}, requires_grad)


# ---------------------------------------------------------------------------------------------------
# torch.compile

class Elementwise(torch.nn.Module):
    """Every elementwise op, in a differentiable chain."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        f = torch.ops.fuel
        scale = self.scale.expand_as(x).contiguous()
        h = f.mul(x, scale)
        h = f.add(h, f.div(x, f.add(scale, scale)))
        h = f.maximum(h, f.sub(h, scale))
        h = f.minimum(h, f.mul(scale, torch.full_like(scale, 4.0)))
        h = f.add(h, f.rem(h, scale))
        return f.pow(f.add(h.abs(), torch.ones_like(h)), scale)


class ConvNet(torch.nn.Module):
    """fuel convolutions (through fuel_torch.nn) and elementwise ops."""

    def __init__(self):
        super().__init__()
        self.down = fuel_torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, groups=1)
        self.mix = fuel_torch.nn.Conv2d(8, 8, (3, 1), padding=(2, 0), dilation=(2, 1), groups=4)
        self.up = fuel_torch.nn.ConvTranspose2d(8, 3, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        f = torch.ops.fuel
        h = self.down(x)
        h = f.add(h, f.maximum(self.mix(h), torch.zeros_like(h)))
        return f.div(self.up(h), f.add(x.abs(), torch.ones_like(x)))


MODELS = {"elementwise": (Elementwise, (8,)), "conv": (ConvNet, (3, 8, 6))}


class Counter:
    """A backend that counts the graphs dynamo hands it (one per compile) and runs them through aot_eager,
    so the fake kernels, autograd registrations and the AOT backward are all exercised."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)


def forward_backward(model, x):
    x = x.detach().clone().requires_grad_()
    out = model(x)
    out.backward(torch.ones_like(out))
    grads = [x.grad] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def assert_same(a, b):
    (out_a, grads_a), (out_b, grads_b) = a, b
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(u, v) for u, v in zip(grads_a, grads_b, strict=True))


@pytest.mark.parametrize("name", MODELS)
def test_compile_fullgraph_matches_eager_and_batch_changes_do_not_recompile(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    cls, shape = MODELS[name]
    model = cls()
    counter = Counter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for batch in (2, 3, 7):
        x = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(batch))
        assert_same(forward_backward(compiled, x), forward_backward(model, x))
    assert counter.graphs == 1


@pytest.mark.parametrize("memory_format", (torch.contiguous_format, torch.channels_last), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_training_step_has_the_eager_bits(dtype, memory_format):
    """Every gradient of a compiled step equals the eager one bit for bit, in every dtype and both
    layouts: the backward graph records our ops themselves (the bias gradient too, as
    fuel_backward::conv_bias_grad), not torch ops whose order could differ from ours."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    # Convolutions only (the elementwise ops take NCHW-contiguous operands), each with a bias.
    model = torch.nn.Sequential(fuel_torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                fuel_torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), torch.nn.ReLU(),
                                fuel_torch.nn.ConvTranspose2d(8, 3, 3, stride=2, padding=1, output_padding=1))
    model = model.to(dtype=dtype, memory_format=memory_format)
    x = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    x = x.contiguous(memory_format=memory_format)
    counter = Counter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    assert_same(forward_backward(compiled, x), forward_backward(model, x))
    assert counter.graphs == 1


@pytest.mark.parametrize("memory_format", (torch.contiguous_format, torch.channels_last), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_bias_gradient_is_summed_in_fuels_order(dtype, memory_format):
    """A compiled backward sums the bias gradient with fuel_backward::conv_bias_grad, as eager does,
    not with torch's sum (whose order differs): the gradient built so that only fuel's order gives
    `expected` (test_autograd.lane_order_case)."""
    x, w, g, expected = lane_order_case(dtype, memory_format)
    torch._dynamo.reset()
    compiled = torch.compile(torch.ops.fuel.conv2d, backend=Counter(), fullgraph=True)
    b = torch.zeros(16, dtype=dtype, requires_grad=True)
    compiled(x, w, b).backward(g)
    assert torch.equal(b.grad, expected)


def test_inductor_runs_fuel_conv_ops_with_list_arguments():
    # torch 2.13's inductor mis-lowers custom ops with int[] arguments to their .out overload;
    # fuel_torch.compile_fixes routes the conv ops to the plain fallback (see the next test). A graph of
    # fuel ops only: nothing for inductor to fuse, so no C++ to build, and the result is bit-identical.
    def fn(x, w, wt):
        h = torch.ops.fuel.conv2d(x, w, None, [2, 1], [1, 0], [1, 2], 2)
        h = torch.ops.fuel.maximum(h, torch.ops.fuel.mul(h, h))
        return torch.ops.fuel.conv_transpose2d(h, wt, None, [2, 1], [1, 0], [1, 0], 2, [1, 2])

    g = torch.Generator().manual_seed(0)
    x, w, wt = (torch.randn(shape, generator=g) for shape in ((2, 4, 9, 8), (6, 2, 3, 3), (6, 2, 3, 3)))
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(fn, fullgraph=True)(x, w, wt), fn(x, w, wt))


def test_the_torch_bug_behind_compile_fixes_is_still_there():
    """When this fails, torch lowers list arguments correctly: drop fuel_torch/compile_fixes.py."""
    lib = torch.library.Library("fuel_compile_fix_probe", "DEF")
    lib.define("probe(Tensor x, int[2] s) -> Tensor")
    lib.define("probe.out(Tensor x, int[2] s, *, Tensor(a!) out) -> Tensor(a!)", tags=(torch.Tag.out,))
    lib.impl("probe", lambda x, s: x.clone(), "CPU")
    lib.impl("probe.out", lambda x, s, *, out: out.copy_(x), "CPU")
    torch.library.register_fake("fuel_compile_fix_probe::probe", lambda x, s: torch.empty_like(x), lib=lib)
    torch.library.register_fake("fuel_compile_fix_probe::probe.out", lambda x, s, *, out: out, lib=lib)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"probe\(\) expected at most 3 argument\(s\) but received 4"):
        torch.compile(lambda x: torch.ops.fuel_compile_fix_probe.probe(x, [2, 3]), fullgraph=True)(torch.ones(3))
    from torch._library._out_variant import to_out_variant
    assert to_out_variant(torch.ops.fuel.conv2d.default) is None  # routed around the bug
    assert to_out_variant(torch.ops.fuel.add.default) is None  # dynamic shapes break that lowering too (below)


def test_dynamic_compile_of_a_fuel_conv_feeding_fuel_elementwise_ops():
    """The README's example: under dynamic=True inductor's out-variant lowering of fuel.maximum fails on the
    symbolic sizes of the conv's output; compile_fixes keeps it on the functional op."""
    import fuel_torch.nn

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = fuel_torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return torch.ops.fuel.add(x, torch.ops.fuel.maximum(self.conv(x), torch.zeros_like(x)))

    torch.manual_seed(0)
    model = Block()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch in (4, 3):
        x = torch.randn(batch, 8, 16, 16)
        compiled(x).sum().backward()
        assert torch.equal(compiled(x), model(x))


def compile_error(fn, *args):
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    return str(info.value)


def eager_error(fn, *args):
    with pytest.raises(RuntimeError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("bad", ("strided", "dtype", "shape", "out_shape"))
def test_fake_raises_the_eager_contract_message_at_trace_time(bad):
    lhs, rhs = torch.rand(4, 6), torch.rand(4, 6)
    if bad == "strided":
        args, fn = (lhs, torch.rand(6, 4).t()), torch.ops.fuel.mul
    elif bad == "dtype":
        args, fn = (lhs, rhs.double()), torch.ops.fuel.mul
    elif bad == "shape":
        args, fn = (lhs, torch.rand(4, 5)), torch.ops.fuel.mul
    else:
        args, fn = (lhs, rhs, torch.empty(4, 5)), (lambda a, b, o: torch.ops.fuel.mul.out(a, b, out=o))
    message = eager_error(fn, *args)
    assert message.startswith("fuel::mul [mul_f32]: argument ")
    assert message in compile_error(fn, *args)
    with pytest.raises(Exception) as info:
        torch.export.export(Wrap(fn), args)
    assert message in str(info.value)


@pytest.mark.parametrize("bad", ("weight_layout", "stride", "groups", "transpose_output_padding"))
def test_conv_fake_raises_the_eager_contract_message_at_trace_time(bad):
    x, weight = torch.randn(2, 4, 6, 6), torch.randn(6, 2, 3, 3)
    if bad == "weight_layout":
        args, fn = (x, torch.randn(6, 2, 3, 3).transpose(2, 3)), (lambda x, w: torch.ops.fuel.conv2d(x, w, None, 1, 0, 1, 2))
    elif bad == "stride":
        args, fn = (x, weight), (lambda x, w: torch.ops.fuel.conv2d(x, w, None, [1, 0], 0, 1, 2))
    elif bad == "groups":
        args, fn = (x, weight), (lambda x, w: torch.ops.fuel.conv2d(x, w, None, 1, 0, 1, 3))
    else:
        args, fn = (x, torch.randn(4, 3, 3, 3)), (lambda x, w: torch.ops.fuel.conv_transpose2d(x, w, None, 2, 0, 2))
    message = eager_error(fn, *args)
    assert message.startswith("fuel::conv")
    assert message in compile_error(fn, *args)
    with pytest.raises(Exception) as info:
        torch.export.export(Wrap(fn), args)
    assert message in str(info.value)


class Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# ---------------------------------------------------------------------------------------------------
# torch.export

LOAD_AND_RUN = textwrap.dedent("""
    import sys, torch
    import fuel_torch  # registers torch.ops.fuel.*: a saved program refers to them by name
    program = torch.export.load(sys.argv[1])
    inputs = torch.load(sys.argv[2])
    torch.save([program.module()(x) for x in inputs], sys.argv[3])
""")


def assert_saved_program_runs_in_a_fresh_process(program, model, inputs, tmp_path):
    """torch.export.save the program, load and run it in a new process, compare with the eager model."""
    torch.export.save(program, tmp_path / "model.pt2")
    torch.save(inputs, tmp_path / "inputs.pt")
    subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(tmp_path / "model.pt2"), str(tmp_path / "inputs.pt"),
                    str(tmp_path / "outputs.pt")], check=True, timeout=120, cwd=tmp_path)
    for x, loaded in zip(inputs, torch.load(tmp_path / "outputs.pt"), strict=True):
        assert torch.equal(loaded, model(x))


EXPORTED_OPS = {"elementwise": {f"fuel.{op}.default" for op in elementwise.OPS},
                 "conv": {"fuel.conv2d.default", "fuel.conv_transpose2d.default", "fuel.add.default",
                          "fuel.maximum.default", "fuel.div.default"}}


@pytest.mark.parametrize("name", MODELS)
def test_export_save_load_in_a_fresh_process(tmp_path, name):
    torch.manual_seed(0)
    cls, shape = MODELS[name]
    model = cls().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    example = torch.randn(3, *shape)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert EXPORTED_OPS[name] <= targets, targets
    inputs = [torch.randn(3, *shape), torch.randn(5, *shape)]  # the exported batch dimension is dynamic
    for x in inputs:
        assert torch.equal(program.module()(x), model(x))
    assert_saved_program_runs_in_a_fresh_process(program, model, inputs, tmp_path)


def test_python_api_compiles_without_graph_breaks_and_follows_the_policy():
    def fn(a, b):
        return fuel_torch.mul(fuel_torch.add(a, b), b)

    a, b = torch.randn(4, 6), torch.randn(6)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="same_as"):
        compiled(a, b)  # strict: no broadcasting
    with fuel_torch.layout_policy("contiguize"):
        assert torch.equal(compiled(a, b), (a + b) * b)
        assert torch.equal(compiled(a.t().contiguous().t(), b), (a + b) * b)
