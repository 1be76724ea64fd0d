"""The planner: torch.compile(model, backend="fuel" | "fuel_inductor") routes plain-torch models onto fuel kernels.

The models here are written with torch ops only (torch.nn convs, +, *, torch.maximum as ReLU,
torch.remainder); the planner decides per ATen node, and fuel_torch.plan_report() says what went where.
Results are compared with the eager model: in float64, where fuel's and torch's convolutions both sit
within a few ulp of exact, at float64's default tolerance; in float32 within the conv contracts' bound.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import fuel_torch
from fuel_torch import costmodel
from fuel_torch.planner import cost as planner_cost

torch._dynamo.config.cache_size_limit = 64


class Block(nn.Module):
    """A ResNet basic block: conv, ReLU (as torch.maximum), conv, residual add, ReLU."""

    def __init__(self, channels=4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        y = torch.maximum(self.conv1(x), torch.zeros_like(x))
        y = self.conv2(y)
        return torch.maximum(x + y, torch.tensor(0.0, dtype=x.dtype))  # a 0-dim operand: broadcast


class UNet(nn.Module):
    """conv2d down, conv_transpose2d up, residual adds, maximum as ReLU, a remainder-based positional term."""

    def __init__(self, channels=3, width=6):
        super().__init__()
        self.down = nn.Conv2d(channels, width, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(width, width, 3, padding=1)
        self.up = nn.ConvTranspose2d(width, channels, 4, stride=2, padding=1)
        self.period = nn.Parameter(torch.full((1, 1, 1, 1), 3.0))

    def forward(self, x):
        columns = torch.arange(x.shape[-1], dtype=x.dtype)
        position = torch.remainder(columns, self.period) / 3.0   # broadcast [1,1,1,W], a Python scalar
        x = x + position
        down = torch.maximum(self.down(x), torch.zeros_like(self.down.bias).view(1, -1, 1, 1))
        mid = down + torch.maximum(self.mid(down), torch.zeros_like(down))
        return x * 0.5 + self.up(mid)


def _twins(model_cls, dtype, seed=0, **kwargs):
    torch.manual_seed(seed)
    eager = model_cls(**kwargs).to(dtype)
    twin = model_cls(**kwargs).to(dtype)
    twin.load_state_dict(eager.state_dict())
    return eager, twin


def _run(model, x):
    x = x.clone().requires_grad_(True)
    out = model(x)
    (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return out.detach(), x.grad, {name.removeprefix("_orig_mod."): p.grad for name, p in model.named_parameters()}


def _assert_training_matches(eager, compiled_model, x, **tolerance):
    out_e, gx_e, grads_e = _run(eager, x)
    out_c, gx_c, grads_c = _run(compiled_model, x)
    torch.testing.assert_close(out_c, out_e, **tolerance)
    torch.testing.assert_close(gx_c, gx_e, **tolerance)
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], **tolerance, msg=lambda m: f"grad of {name}: {m}")


def _compile(model, **options):
    torch._dynamo.reset()
    return torch.compile(model, backend="fuel", options=options or None)


@pytest.fixture
def no_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("FUEL_TORCH_CALIBRATION", str(tmp_path / "absent.json"))


def _calibration(path, elementwise=(1e-6, 10e9, 1e-6, 10e9), conv=(1e-6, 100e9, 1e-6, 100e9), copy=(1e-6, 10e9)):
    """A calibration file: per kernel (fuel launch s, fuel rate, torch launch s, torch rate)."""
    kernels = {}
    for contract in fuel_torch.installed().registrable:
        ours_s, ours_rate, theirs_s, theirs_rate = conv if contract.op.startswith("conv") else elementwise
        basis = "flops" if contract.op.startswith("conv") else "bytes_moved"
        kernels[contract.kernel] = {"op": contract.op, "dtype": str(contract.dtype), "basis": basis,
                                    "launch_overhead_s": ours_s, "per_second": ours_rate,
                                    "torch": {"launch_overhead_s": theirs_s, "per_second": theirs_rate}}
    costmodel.save_calibration({"format": costmodel.CALIBRATION_FORMAT, "key": costmodel.machine_key(),
                                "created": "test", "torch": torch.__version__, "machine_id": "test",
                                "machine": {"cpu": "test CPU"},
                                "contiguize": {"launch_overhead_s": copy[0], "per_second": copy[1]},
                                "kernels": kernels}, path)
    return path


# ---------------------------------------------------------------------------------------------------------

def test_backends_registered_once_with_entry_points():
    from importlib.metadata import entry_points
    from torch._dynamo.backends.registry import lookup_backend

    names = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert names.get("fuel") == "fuel_torch.planner.backend:fuel"
    assert names.get("fuel_inductor") == "fuel_torch.planner.backend:fuel_inductor"
    assert lookup_backend("fuel") is fuel_torch.planner.fuel
    assert lookup_backend("fuel") is fuel_torch.planner.fuel  # a second lookup registers nothing again
    assert {"fuel", "fuel_inductor"} <= set(torch._dynamo.list_backends())


def test_resnet_block_training_matches_eager_and_reports_both_graphs(no_calibration):
    eager, twin = _twins(Block, torch.float64)
    compiled = _compile(twin, route="all")
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    _assert_training_matches(eager, compiled, x)
    report = fuel_torch.plan_report()
    by_graph = {g: [d for d in report.decisions if d.graph == g] for g in ("forward", "backward")}
    forward_fuel = {d.target for d in by_graph["forward"] if d.chosen == "fuel"}
    assert {"aten.convolution.default", "aten.maximum.default", "aten.add.Tensor"} <= forward_fuel
    conv_backward = [d for d in by_graph["backward"] if d.target == "aten.convolution_backward.default"]
    assert len(conv_backward) == 2 and all(d.chosen == "fuel" for d in conv_backward)
    assert conv_backward[0].fuel_op == "fuel::conv_transpose2d+fuel::conv2d"
    convs = [d for d in by_graph["forward"] if d.target == "aten.convolution.default"]
    assert all(d.fuel_op == "fuel::conv2d" and d.contiguized == () for d in convs)
    # The 0-dim operand of the last maximum is broadcast: materialized, and said so.
    broadcast = [d for d in report.decisions if d.chosen == "fuel" and d.contiguized and "broadcast" in d.reason]
    assert broadcast, str(report)
    for d in report.decisions:
        assert d.reason and d.chosen in ("fuel", "aten") and d.graph in ("forward", "backward")
        assert d.fuel_cost is not None and d.aten_cost is not None and d.cost_unit == "B"
    text = str(report)
    assert "formula hints only" in text and "aten.convolution_backward.default" in text
    assert "fuel::conv_transpose2d" in text


def test_unet_training_matches_eager(no_calibration):
    eager, twin = _twins(UNet, torch.float64)
    compiled = _compile(twin, route="all")
    _assert_training_matches(eager, compiled, torch.randn(2, 3, 8, 8, dtype=torch.float64))
    report = fuel_torch.plan_report()
    fuel_ops = {d.fuel_op for d in report.on("fuel") if d.graph == "forward"}
    assert {"fuel::conv2d", "fuel::conv_transpose2d", "fuel::rem", "fuel::add", "fuel::maximum"} <= fuel_ops, str(report)
    assert any(d.target == "aten.convolution_backward.default" and d.chosen == "fuel" for d in report.decisions)
    scalar = [d for d in report.on("fuel") if "python scalar" in d.reason]
    assert scalar and all(d.contiguized for d in scalar), str(report)


def test_float32_within_contract_precision(no_calibration):
    eager, twin = _twins(UNet, torch.float32)
    compiled = _compile(twin, route="all")
    # conv contract: |out - exact| <= (K + 2) 2^-24 conv(|x|, |w|); K <= 96 taps here, values O(1).
    _assert_training_matches(eager, compiled, torch.randn(2, 3, 8, 8), rtol=1e-4, atol=1e-5)
    assert len(fuel_torch.plan_report().on("fuel")) > 5


class Geometry(nn.Module):
    """Grouped, strided, dilated, asymmetric convolutions both ways: the backward split's hard cases."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=(2, 3), padding=1, output_padding=(1, 2), groups=2,
                                     dilation=(1, 2), bias=False)

    def forward(self, x):
        return self.up(self.conv(x))


def test_convolution_geometry_training_matches_eager(no_calibration):
    eager, twin = _twins(Geometry, torch.float64)
    compiled = _compile(twin, route="all")
    _assert_training_matches(eager, compiled, torch.randn(3, 4, 9, 8, dtype=torch.float64))
    report = fuel_torch.plan_report()
    assert len(report.decisions) == 4 and not report.on("aten"), str(report)


def test_route_none_routes_nothing_and_keeps_reasons(no_calibration):
    eager, twin = _twins(Block, torch.float64)
    compiled = _compile(twin, route="none")
    _assert_training_matches(eager, compiled, torch.randn(2, 4, 6, 6, dtype=torch.float64), rtol=0, atol=0)
    report = fuel_torch.plan_report()
    assert report.decisions and not report.on("fuel")
    assert all(d.reason.startswith("route='none'") for d in report.decisions)
    assert all(d.fuel_op is None and d.contiguized == () for d in report.decisions)


def test_route_cost_follows_the_calibration(monkeypatch, tmp_path):
    # Fuel convolutions 10x faster than torch's, fuel elementwise 10x slower: cost routes the convs only.
    path = _calibration(tmp_path / "calibration.json", elementwise=(1e-5, 1e9, 1e-6, 10e9),
                        conv=(1e-6, 100e9, 1e-5, 10e9))
    monkeypatch.setenv("FUEL_TORCH_CALIBRATION", str(path))
    eager, twin = _twins(Block, torch.float64)
    compiled = _compile(twin)  # route="cost" is the default
    _assert_training_matches(eager, compiled, torch.randn(2, 4, 6, 6, dtype=torch.float64))
    report = fuel_torch.plan_report()
    assert report.route == "cost" and "calibrated" in report.basis and str(path) in report.basis
    for d in report.decisions:
        is_conv = d.target.startswith("aten.convolution")
        assert d.chosen == ("fuel" if is_conv else "aten"), str(report)
        assert d.cost_unit == "s" and (d.fuel_cost < d.aten_cost) == is_conv
        assert ("cheaper by the model" if is_conv else "slower by the model") in d.reason


def test_route_cost_without_calibration_uses_formula_hints(no_calibration):
    eager, twin = _twins(Block, torch.float64)
    compiled = _compile(twin, route="cost")
    _assert_training_matches(eager, compiled, torch.randn(2, 4, 6, 6, dtype=torch.float64))
    report = fuel_torch.plan_report()
    assert "formula hints only" in report.basis and "python -m fuel_torch judge" in report.basis
    for d in report.decisions:
        # Equal bytes on both sides: fuel is kept; a Contiguize copy adds bytes and loses.
        assert d.chosen == ("fuel" if d.fuel_cost <= d.aten_cost else "aten"), str(report)
    assert report.on("fuel") and report.on("aten")


def test_ops_option_limits_routing(no_calibration):
    eager, twin = _twins(Block, torch.float64)
    compiled = _compile(twin, route="all", ops=["conv2d"])
    _assert_training_matches(eager, compiled, torch.randn(2, 4, 6, 6, dtype=torch.float64))
    report = fuel_torch.plan_report()
    assert {d.target for d in report.on("fuel")} == {"aten.convolution.default"}
    backward = [d for d in report.decisions if d.target == "aten.convolution_backward.default"]
    assert backward and all("excluded by options" in d.reason and "conv_transpose2d" in d.reason for d in backward)
    assert all("excluded by options" in d.reason for d in report.decisions if d.target.startswith("aten.max"))


def test_bad_options_are_refused():
    x = torch.randn(2, 2)
    for options, message in (({"route": "fast"}, "route"), ({"ops": ["conv3d"]}, "unknown fuel ops"),
                             ({"ops": "conv2d"}, "list of fuel op names"), ({"colour": 1}, "unknown options")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(lambda a: a + a, backend="fuel", options=options)(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="inductor mode"):
        torch.compile(lambda a: a + a, backend="fuel", mode="max-autotune")(x)


def test_unroutable_nodes_get_reasons(no_calibration):
    def f(a, b, i, h):
        return (torch.add(a, b, alpha=2), torch.div(a, b, rounding_mode="floor"), i + i, a + h, torch.add(a, 0.1))

    args = (torch.randn(3, 4), torch.rand(3, 4) + 1, torch.arange(4), torch.randn(3, 4, dtype=torch.float64))
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend="fuel", options={"route": "all"})(*args)
    for got, want in zip(out, f(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    reasons = {d.node: d.reason for d in fuel_torch.plan_report().decisions}
    text = " | ".join(reasons.values())
    for expected_reason in ("alpha != 1", "rounding_mode", "integer", "mixed dtypes"):
        assert expected_reason in text, text
    assert all(d.graph == "inference" for d in fuel_torch.plan_report().decisions)
    # a + 0.1 in float32: 0.1 is not a float32; torch.add rounds it to float32 as the materialized operand does.
    assert any("python scalar" in d.reason for d in fuel_torch.plan_report().on("fuel")), text


def test_half_scalar_not_exact_stays_on_torch(no_calibration):
    torch._dynamo.reset()
    x = torch.randn(8, dtype=torch.bfloat16)
    with torch.no_grad():
        out = torch.compile(lambda t: (t + 0.1, t * 2.0), backend="fuel", options={"route": "all"})(x)
    torch.testing.assert_close(out[0], x + 0.1, rtol=0, atol=0)
    decisions = fuel_torch.plan_report().decisions
    assert [d.chosen for d in decisions] == ["aten", "fuel"], str(fuel_torch.plan_report())
    assert "not exact in torch.bfloat16" in decisions[0].reason


def test_strided_and_channels_last_inputs_are_materialized(no_calibration):
    eager, twin = _twins(Block, torch.float64)
    compiled = _compile(twin, route="all")
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64).transpose(2, 3)          # strided
    _assert_training_matches(eager, compiled, x)
    report = fuel_torch.plan_report()
    first_conv = next(d for d in report.decisions if d.target == "aten.convolution.default")
    assert first_conv.chosen == "fuel" and first_conv.contiguized, str(report)
    assert "layout.strided" in first_conv.reason or "layout.contiguous" in first_conv.reason
    torch._dynamo.reset()
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64).to(memory_format=torch.channels_last)
    _assert_training_matches(eager, torch.compile(twin, backend="fuel", options={"route": "all"}), x)


def test_offset_operand_is_materialized(no_calibration):
    def f(a):
        return torch.mul(a[1:], a[:-1])  # a[1:] starts at an offset

    a = torch.randn(5, 4)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend="fuel", options={"route": "all"})(a)
    torch.testing.assert_close(out, f(a), rtol=0, atol=0)
    (d,) = fuel_torch.plan_report().decisions
    assert d.chosen == "fuel" and "layout.start_offset" in d.reason and len(d.contiguized) == 1


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_planned_backward_sums_the_bias_gradient_as_eager_fuel_does(no_calibration, dtype):
    """The rewritten convolution_backward takes the bias gradient from fuel_backward::conv_bias_grad,
    the op fuel's own autograd calls: a planned bias gradient has eager fuel's bits, where torch's sum
    would order its terms otherwise."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    eager, twin = _twins(Block, dtype)
    compiled = _compile(twin, route="all")
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2)).to(dtype)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    compiled(x).backward(grad)  # compiles the backward graph (traced with fake tensors) ...
    twin.zero_grad(set_to_none=True)
    out = compiled(x)
    with Ops() as ops:  # ... which this backward runs
        out.backward(grad)
    assert ops.seen.count(torch.ops.fuel_backward.conv_bias_grad.default) == 2
    fuel_model = Block()
    fuel_model.conv1, fuel_model.conv2 = (fuel_torch.nn.Conv2d(4, 4, 3, padding=1).to(dtype) for _ in range(2))
    fuel_model.load_state_dict(eager.state_dict())
    fuel_model(x).backward(grad)
    for name in ("conv1", "conv2"):
        assert torch.equal(getattr(twin, name).bias.grad, getattr(fuel_model, name).bias.grad), name


def test_no_grad_inference(no_calibration):
    eager, twin = _twins(UNet, torch.float64)
    compiled = _compile(twin, route="all")
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x))
    report = fuel_torch.plan_report()
    assert {d.graph for d in report.decisions} == {"inference"} and len(report.on("fuel")) >= 6


@pytest.mark.parametrize("route", ("cost", "all"))
def test_dynamic_batch_compiles_once(no_calibration, route):
    from torch._dynamo.utils import counters

    eager, twin = _twins(Block, torch.float64)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(twin, backend="fuel", options={"route": route}, dynamic=True)
    for batch in (2, 3, 5, 7):
        _assert_training_matches(eager, compiled, torch.randn(batch, 4, 6, 6, dtype=torch.float64))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    report = fuel_torch.plan_report()
    if route == "all":  # every node, the convolution backward included, serves every size
        assert len(report.decisions) == 10 and not report.on("aten"), str(report)
    else:  # formula hints: the Contiguize copies tip some nodes, for every size alike (no guard)
        assert report.on("fuel") and report.on("aten")
        assert all("every size" in d.reason and d.guard is None for d in report.decisions), str(report)


def test_dynamic_size_dependent_choice_is_guarded(monkeypatch, tmp_path):
    # Fuel add: 20us launch, 100 GB/s; torch: 1us, 10 GB/s; 3 * 4 bytes per element. Equal where
    # 19us = 12 B * n * (1/10 - 1/100) ns/B, n = 17,592.6 elements: 2 x 8 x 32 x 32 = 16,384 stays on torch,
    # 3 x 8 x 32 x 32 = 24,576 and up go to fuel.
    from torch._dynamo.utils import counters

    path = _calibration(tmp_path / "calibration.json", elementwise=(20e-6, 100e9, 1e-6, 10e9))
    monkeypatch.setenv("FUEL_TORCH_CALIBRATION", str(path))

    def f(a, b):
        return a + b

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, backend="fuel", dynamic=True)
    plans = []
    with torch.no_grad():
        for batch in (2, 3, 4, 6):
            a, b = torch.randn(batch, 8, 32, 32), torch.randn(batch, 8, 32, 32)
            torch.testing.assert_close(compiled(a, b), a + b, rtol=0, atol=0)
            plans.append(fuel_torch.plan_report())
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # one per side of the crossover
    first, second = plans[0], plans[-1]
    assert first is not second
    (small,), (large,) = first.decisions, second.decisions
    assert small.chosen == "aten" and large.chosen == "fuel"
    for d in (small, large):
        assert "size-dependent: fuel iff numel > 17592" in d.reason and d.guard is not None, d.reason


def test_plan_log_prints_every_compilation(no_calibration, monkeypatch, capfd):
    monkeypatch.setenv("FUEL_PLAN_LOG", "1")
    eager, twin = _twins(Block, torch.float64)
    _run(_compile(twin), torch.randn(2, 4, 6, 6, dtype=torch.float64))
    err = capfd.readouterr().err
    assert "[fuel plan] forward graph" in err and "[fuel plan] backward graph" in err
    assert "aten.convolution.default" in err and "aten.convolution_backward.default" in err


def _child(code, env=None):
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, **(env or {})},
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


CHILD = """
    import sys, torch
    import torch.nn.functional as F
    assert "fuel_torch" not in sys.modules
    def f(x, w, b, floor):
        y = F.conv2d(x, w, b, padding=1)
        return torch.maximum(y, floor) + y
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g) for s in ((2, 3, 8, 8), (4, 3, 3, 3), (4,), (2, 4, 8, 8))]
    with torch.no_grad():
        for backend in ("fuel", "fuel_inductor"):
            torch._dynamo.reset()
            out = torch.compile(f, backend=backend, options={"route": "all"})(*args)
            torch.testing.assert_close(out, f(*args), rtol=1e-4, atol=1e-5)
            import fuel_torch  # loaded by the entry point already: this only names it
            report = fuel_torch.plan_report()
            print(report.backend, len(report.on("fuel")), sorted(d.fuel_op for d in report.on("fuel")))
"""


def test_by_name_without_import_and_fuel_inductor_with_warm_caches(tmp_path):
    # backend="fuel" without `import fuel_torch` (the entry point), then fuel_inductor; run twice, so
    # that the second process finds inductor's caches warm: the plan must still run and give the same.
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "FUEL_TORCH_CALIBRATION": str(tmp_path / "none")}
    first = _child(CHILD, env)
    second = _child(CHILD, env)
    expected = "['fuel::add', 'fuel::conv2d', 'fuel::maximum']"
    assert first.splitlines() == [f"fuel 3 {expected}", f"fuel_inductor 3 {expected}"], first
    assert second.splitlines() == first.splitlines()


def test_fuel_inductor_training_after_plain_inductor_saw_the_ops(no_calibration, tmp_path, monkeypatch):
    # Plain inductor, compiling fuel ops first, registers its own implicit fallbacks for them (inputs in
    # their fake values' stride order); fuel_inductor must still hand the kernels contiguous inputs after that.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    fuel_block = nn.Sequential(fuel_torch.nn.Conv2d(4, 4, 3, padding=1), fuel_torch.nn.Conv2d(4, 4, 3, padding=1))
    torch._dynamo.reset()
    plain = torch.compile(fuel_block, backend="inductor")
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    plain(x).sum().backward()
    assert x.grad is not None
    test_fuel_inductor_training_matches_eager(no_calibration, tmp_path, monkeypatch)


def test_fuel_inductor_training_matches_eager(no_calibration, tmp_path, monkeypatch):
    # Inductor lays out buffers itself: the fuel fallbacks must still get contiguous inputs (the backward
    # split feeds them permuted copies).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    eager, twin = _twins(Block, torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend="fuel_inductor", options={"route": "all"})
    _assert_training_matches(eager, compiled, torch.randn(2, 4, 8, 8), rtol=1e-4, atol=1e-5)
    report = fuel_torch.plan_report()
    assert report.backend == "fuel_inductor" and not report.on("aten"), str(report)
    assert sum(d.target == "aten.convolution_backward.default" for d in report.decisions) == 2


def test_import_offers_the_backends_where_no_entry_point_is_installed():
    from torch._dynamo.backends import registry

    saved = {name: (registry._BACKENDS.pop(name, None), registry._COMPILER_FNS.pop(name, None))
             for name in ("fuel", "fuel_inductor")}
    try:
        fuel_torch.planner.offer_backends()
        assert registry.lookup_backend("fuel") is fuel_torch.planner.fuel
        assert registry.lookup_backend("fuel") is fuel_torch.planner.fuel  # registered once, found again
        fuel_torch.planner.offer_backends()  # a second offer changes nothing: the name is registered
        assert registry._COMPILER_FNS["fuel"] is fuel_torch.planner.fuel
    finally:
        for name, (entry, fn) in saved.items():
            registry._BACKENDS[name] = entry
            registry._COMPILER_FNS.pop(name, None)
            if fn is not None:
                registry._COMPILER_FNS[name] = fn


def test_calibration_from_a_judge_json(monkeypatch, tmp_path):
    calibration = json.loads(json.dumps(costmodel.load_calibration(_calibration(tmp_path / "c.json"))))
    for entry in calibration["kernels"].values():
        del entry["torch"]
    judge = {"calibration": calibration,
             "kernels": [{"kernel": "add_f32", "cost": {"basis": "bytes_moved",
                                                         "torch": {"launch_overhead_s": 2e-6, "per_second": 5e9}}}]}
    (tmp_path / "judge.json").write_text(json.dumps(judge))
    monkeypatch.setenv("FUEL_TORCH_CALIBRATION", str(tmp_path / "judge.json"))
    loaded = planner_cost.Calibration.load()
    assert loaded.theirs["add_f32"]["per_second"] == 5e9 and "add_f32" in loaded.ours
    assert loaded.covers(["add_f32"]) and not loaded.covers(["mul_f32"])
