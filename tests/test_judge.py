"""The Judge: a broken draft is caught, the quick CLI writes judge.json, fuel_torch.cost, the references."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fuel_torch
from fuel_torch import costmodel as cost_module
from fuel_torch.judge import cli, exact, family_convolution, precision, report, timing



@pytest.fixture
def calibration_file(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv(cost_module.CALIBRATION_ENV, str(path))
    return path


def _edit_block(text: str, kernel: str, old: str, new: str, count: int = 1) -> str:
    """Replace `old` by `new` inside the ```fkc block of `kernel` only."""
    start = text.index(f"kernel: {kernel}\n")
    end = text.index("```", start)
    block = text[start:end]
    assert block.count(old) >= count, (kernel, old)
    return text[:start] + block.replace(old, new, count) + text[end:]


@pytest.fixture
def broken_contracts(tmp_path):
    """The installed contracts with two false claims: pow_f32 exact, add_f32 taking strided lhs."""
    directory = tmp_path / "draft"
    shutil.copytree(fuel_torch.installed().directory, directory, ignore=shutil.ignore_patterns("__*"))
    path = directory / "elementwise.fkc.md"
    text = path.read_text()
    text = _edit_block(text, "pow_f32", "max_ulp: 1", "max_ulp: 0")
    text = _edit_block(text, "add_f32", "strided: rejected", "strided: accepted")
    path.write_text(text)
    return directory


def test_a_broken_draft_fails_on_both_false_claims(broken_contracts, tmp_path, calibration_file, capsys):
    out = tmp_path / "out"
    status = cli.main(["--quick", "--contracts", str(broken_contracts), "--kernel", "add_f32", "--kernel", "pow_f32",
                       "--kernel", "sub_f32", "--checks", "conformance,precision", "--out", str(out)])
    assert status == 1
    result = json.loads((out / "judge.json").read_text())
    kernels = {e["kernel"]: e for e in result["kernels"]}
    assert "add_f32: lhs.layout.strided: accepted" in result["summary"]["failed_claims"]
    assert any(c.startswith("pow_f32: precision.max_ulp: 0 (measured 1 ulp)") for c in result["summary"]["failed_claims"])
    assert kernels["sub_f32"]["verdict"] == "pass"  # untouched claims still hold
    # The strided probe failed because every path rejected the strided lhs the draft claims to accept.
    probe = next(p for p in kernels["add_f32"]["conformance"]["probes"] if p["claim"] == "lhs.layout.strided: accepted")
    assert probe["verdict"] == "fail"
    assert all(v.startswith("rejected: ") and "layout.strided: rejected" in v for v in probe["paths"].values())
    assert set(probe["paths"]) == {"eager", "api", "fake"}
    assert kernels["pow_f32"]["precision"]["declared"]["max_ulp"] == 0
    assert kernels["pow_f32"]["precision"]["measured"]["max_ulp"] == 1
    table = capsys.readouterr().out
    assert re.search(r"^add_f32\s+FAIL 1/\d+", table, re.M)
    assert re.search(r"^pow_f32\s+\S+ ok .*FAIL 1 ulp <= 0 ulp", table, re.M)
    assert not calibration_file.exists()  # no cost check ran, and a draft never calibrates anyway


def test_the_installed_contracts_pass_conformance_on_every_path():
    from fuel_torch.judge import conformance, family_elementwise

    result = conformance.audit(fuel_torch.contract("rem", torch.float16), family_elementwise)
    assert result["verdict"] == "pass", result["failed_claims"]
    assert result["counts"]["fail"] == 0 and result["counts"]["pass"] > 25
    not_constructible = [p for p in result["probes"] if p["verdict"] == "not constructible"]
    assert {p["claim"] for p in not_constructible} == {"lhs.layout.reverse_strides: rejected",
                                                      "rhs.layout.reverse_strides: rejected"}
    assert all("not constructible in torch" in p["detail"] for p in not_constructible)


def test_quick_cli_writes_judge_json_and_calibrates_cost(tmp_path, calibration_file, capsys):
    out = tmp_path / "out"
    status = cli.main(["--quick", "--kernel", "add_f32", "--kernel", "pow_bf16", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    result = json.loads((out / "judge.json").read_text())
    assert result["format"] == "fuel-torch-judge/1" and result["level"] == "quick"
    assert result["torch"] == torch.__version__ and result["contracts_are_installed"]
    assert result["summary"]["passed"] and result["summary"]["kernels"] == 2
    measured = result["machine"]["measured"]
    assert measured["dram_bandwidth_GBps"] > 0 and measured["roofs"]["peak_GFLOPs"]["float32"] > 0
    assert measured["roofs"]["threads"] == torch.get_num_threads()
    # A roof at every working set a bandwidth point was measured at (the elementwise points' bytes_moved).
    roof_sizes = {r["bytes"] for r in measured["roofs"]["bandwidth_GBps_by_working_set"]}
    for entry in result["kernels"]:
        for point in entry["cost"]["points"]:
            assert point["working_set_bytes"] == point["bytes_moved"] and point["bytes_moved"] in roof_sizes
            assert point["roof"]["unit"] == "GB/s" and point["roof"]["how"]
    for entry in result["kernels"]:
        assert entry["verdict"] == "pass"
        assert entry["conformance"]["counts"]["fail"] == 0
        assert entry["precision"]["measured"]["max_ulp"] <= entry["precision"]["declared"]["max_ulp"]
        assert entry["precision"]["torch"]["op"].startswith("torch.")
        assert entry["determinism"]["repeats_identical"] == 16 and entry["determinism"]["threads"]["1"]
        assert entry["cost"]["ours"]["launch_overhead_s"] >= 0 and entry["cost"]["ours"]["per_second"] > 0
        assert entry["cost"]["torch"]["per_second"] > 0 and entry["cost"]["time_ratio_at_largest"] > 0
        block = entry["cost_block"]
        assert block["provenance"] == "judge_measured" and block["bytes_moved"] == entry["cost"]["formulas"]["bytes_moved"]
        assert block["calibration"]["measured_on"]["torch"] == torch.__version__
    assert set(result["calibration"]["kernels"]) == {"add_f32", "pow_bf16"}
    assert result["calibration_saved_to"] == str(calibration_file)
    for kernel in ("add_f32", "pow_bf16"):
        assert re.search(rf"^{kernel}\s+\d+/\d+ ok", printed, re.M)
    assert str((out / "judge.json").resolve()) in printed
    if result["roofline"] == "roofline.png":
        assert (out / "roofline.png").stat().st_size > 0
    else:
        assert result["roofline"] == report.ROOFLINE_HINT
    # fuel_torch.cost now predicts from the stored calibration.
    a = torch.randn(1000)
    predicted = fuel_torch.cost("add", a, a)
    entry = result["calibration"]["kernels"]["add_f32"]
    assert predicted.seconds == pytest.approx(entry["launch_overhead_s"] + 12_000 / entry["per_second"])
    assert "judge_measured" in predicted.basis


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    assert cli.main(["--kernel", "no_such_kernel", "--out", str(tmp_path)]) == 2
    assert "no registrable kernel matches ['no_such_kernel']" in capsys.readouterr().err
    assert cli.main(["--checks", "conformance,speed", "--out", str(tmp_path)]) == 2
    assert cli.main(["--contracts", str(tmp_path), "--out", str(tmp_path)]) == 2  # no *.fkc.md there


def test_module_entry_point_runs_the_judge(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fuel_torch", "judge", "--quick", "--kernel", "mul_f64",
                           "--checks", "conformance,determinism"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^mul_f64\s+\d+/\d+ ok", done.stdout, re.M)
    assert "[ 1/1] mul_f64" in done.stderr  # progress goes to stderr
    folders = list(tmp_path.glob("judge-*/judge.json"))  # the default output folder, created fresh
    assert len(folders) == 1 and str(folders[0].parent.resolve()) in done.stderr


def test_roofline_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    fake = {"machine": {"measured": {"dram_bandwidth_GBps": 10.0, "roofs": {"peak_GFLOPs": {"float32": 100.0}}}},
            "kernels": [{"kernel": "add_f32", "cost": {"unit": "GB/s", "ours": {}, "points": [
                {"flops": 10, "bytes_moved": 120, "ours_s": 1e-6, "torch_s": 1e-6}]}}]}
    assert report.roofline(fake, tmp_path / "roofline.png") == report.ROOFLINE_HINT
    assert "pip install 'fuel-torch[judge]'" in report.ROOFLINE_HINT
    assert not (tmp_path / "roofline.png").exists()


# ---- fuel_torch.cost -----------------------------------------------------------------------------

def _calibrate(path: Path) -> None:
    cost_module.save_calibration({
        "format": cost_module.CALIBRATION_FORMAT, "machine_id": "test", "torch": torch.__version__,
        "contiguize": {"launch_overhead_s": 2e-6, "per_second": 5e9},
        "kernels": {"add_f32": {"basis": "bytes_moved", "launch_overhead_s": 1e-5, "per_second": 1e10}}}, path)


def test_cost_without_calibration_gives_the_formula_hints(tmp_path, calibration_file):
    a = torch.randn(6, 7, dtype=torch.float64)
    predicted = fuel_torch.cost("mul", a, a)
    assert predicted.kernel == "mul_f64" and predicted.seconds is None
    assert (predicted.flops, predicted.bytes_moved, predicted.host_bytes) == (42, 3 * 42 * 8, 42 * 8)
    assert "formula hints" in predicted.basis and str(calibration_file) in predicted.basis


def test_cost_uses_the_calibration_and_counts_contiguize_copies(calibration_file):
    _calibrate(calibration_file)
    a, b = torch.randn(100, 10), torch.randn(10, 100)
    predicted = fuel_torch.cost("add", a, b.t().contiguous())
    assert predicted.seconds == pytest.approx(1e-5 + 12_000 / 1e10) and predicted.copies == ()
    # Strict (the default): the strided operand is the kernel's own contract error.
    with pytest.raises(fuel_torch.ContractViolation, match=r"argument 'rhs' breaks `layout.strided: rejected`"):
        fuel_torch.cost("add", a, b.t())
    with fuel_torch.layout_policy("contiguize"):
        predicted = fuel_torch.cost("add", lhs=a, rhs=b.t())
        assert predicted.copies == (("rhs", 1000),)
        assert predicted.copy_seconds == pytest.approx(2e-6 + 2 * 1000 * 4 / 5e9)
        assert predicted.seconds == pytest.approx(predicted.kernel_seconds + predicted.copy_seconds)
        broadcast = fuel_torch.cost("add", torch.randn(4, 1), torch.randn(1, 5))
        assert broadcast.copies == (("lhs", 20), ("rhs", 20)) and broadcast.flops == 20
    other = fuel_torch.cost("add", a.double(), a.double())  # no calibration entry for add_f64
    assert other.seconds is None and other.bytes_moved == 3 * 1000 * 8


def test_cost_rejects_what_the_call_would_reject(calibration_file):
    with pytest.raises(ValueError, match="no fuel op named 'nope'"):
        fuel_torch.cost("nope", torch.ones(2))
    with pytest.raises(fuel_torch.ContractViolation, match="shape_constraint: same_as=rhs"):
        fuel_torch.cost("add", torch.ones(2), torch.ones(3))
    with pytest.raises(TypeError, match="missing argument 'rhs'"):
        fuel_torch.cost("add", torch.ones(2))


def test_save_calibration_keeps_other_kernels_of_the_same_machine(calibration_file):
    _calibrate(calibration_file)
    cost_module.save_calibration({"format": cost_module.CALIBRATION_FORMAT, "machine_id": "test",
                                  "torch": torch.__version__, "kernels": {"sub_f32": {"x": 1}}})
    assert set(cost_module.load_calibration()["kernels"]) == {"add_f32", "sub_f32"}


def test_machine_key_names_the_cpu_model_and_capability():
    from fuel_torch.timing import cpu_model

    key = cost_module.machine_key()
    assert key.startswith(f"{cpu_model()}|{torch.backends.cpu.get_cpu_capability()}")


def test_calibration_is_per_machine_and_cost_reads_the_running_one(calibration_file, monkeypatch):
    """Two machines (or venvs at different capability levels) sharing one home directory: each
    writes its own entry, neither overwrites the other, and fuel_torch.cost uses the running one's."""
    def entry(per_second: float, kernel: str = "add_f32") -> dict:
        return {"format": cost_module.CALIBRATION_FORMAT, "machine_id": "m", "torch": torch.__version__,
                "contiguize": {"launch_overhead_s": 0.0, "per_second": 1e9},
                "kernels": {kernel: {"basis": "bytes_moved", "launch_overhead_s": 0.0, "per_second": per_second}}}

    xeon, epyc = "Intel(R) Xeon(R) Platinum 8480+|AVX512", "AMD EPYC 7763 64-Core Processor|AVX2"
    monkeypatch.setattr(cost_module, "machine_key", lambda: xeon)
    a = torch.randn(1000)
    cost_module.save_calibration({**entry(2e10), "key": epyc})  # only the other machine has calibrated
    predicted = fuel_torch.cost("add", a, a)
    assert predicted.seconds is None and xeon in predicted.basis
    cost_module.save_calibration(entry(4e10))  # this machine calibrates: stored under its own key
    cost_module.save_calibration({**entry(1e10, "sub_f32"), "key": epyc})  # the other one adds a kernel
    stored = json.loads(calibration_file.read_text())
    assert stored["format"] == cost_module.CALIBRATION_FILE_FORMAT and set(stored["machines"]) == {xeon, epyc}
    assert set(stored["machines"][epyc]["kernels"]) == {"add_f32", "sub_f32"}
    assert set(stored["machines"][xeon]["kernels"]) == {"add_f32"}
    assert fuel_torch.cost("add", a, a).seconds == pytest.approx(12_000 / 4e10)
    monkeypatch.setattr(cost_module, "machine_key", lambda: epyc)
    assert fuel_torch.cost("add", a, a).seconds == pytest.approx(12_000 / 2e10)
    assert fuel_torch.cost("sub", a, a).seconds == pytest.approx(12_000 / 1e10)


def test_a_judge_json_calibrates_only_its_own_machine(tmp_path, monkeypatch):
    key = cost_module.machine_key()
    calibration = {"format": cost_module.CALIBRATION_FORMAT, "key": key, "torch": torch.__version__, "kernels": {}}
    path = tmp_path / "judge.json"
    path.write_text(json.dumps({"format": "fuel-torch-judge/1", "calibration": calibration}))
    assert cost_module.load_calibration(path) == calibration
    monkeypatch.setattr(cost_module, "machine_key", lambda: "another CPU|DEFAULT")
    assert cost_module.load_calibration(path) is None


# ---- the Judge's references and fits -------------------------------------------------------------

def _nearest_bf16(value: float) -> float:
    """Brute force: of the bfloat16 values around `value`, the nearest, ties to the even significand."""
    upper = int(np.array([value], dtype=np.float32).view(np.uint32)[0]) >> 16
    candidates = []
    for bits in (upper - 1, upper, upper + 1):
        c = float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])
        candidates.append((abs(c - value), bits & 1, c))
    return min(candidates)[2]


def test_round_to_bfloat16_rounds_once():
    one_ulp = 2.0 ** -7
    trap = 1 + one_ulp / 2 + 2.0 ** -30  # float32 rounds it onto the bf16 midpoint; the answer is up
    assert float(exact.round_to(np.array([trap]), torch.bfloat16)) == 1 + one_ulp
    assert float(np.float32(trap)) == 1 + one_ulp / 2  # the input is a trap: rounding via float32 would tie to 1.0
    values = np.random.default_rng(0).standard_normal(2000) * 10.0 ** np.random.default_rng(1).uniform(-30, 30, 2000)
    rounded = exact.round_to(values, torch.bfloat16)
    assert [float(r) for r in rounded] == [_nearest_bf16(v) for v in values]


def test_round_to_float16_and_float32_match_numpy_single_rounding():
    values = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 65520.0, 1e-8, -0.0, np.inf, np.nan])
    assert exact.round_to(values, torch.float16).tolist()[:4] == [1 + 2.0 ** -10, math.inf, 0.0, -0.0]
    assert exact.round_to(values, torch.float32)[0].item() == np.float32(values[0])


def test_pow64_is_correctly_rounded_on_known_values():
    base = np.array([2.0, 10.0, 2.0, 2.0, -2.0, -8.0, np.nan, 1.0, 0.0, -0.0, 1e300])
    exponent = np.array([0.5, -2.0, -1074.0, 1024.0, 3.0, 1 / 3, 0.0, np.nan, -1.0, -3.0, 2.0])
    result = exact.pow64(base, exponent)
    expected = [math.sqrt(2.0), 0.01, 5e-324, math.inf, -8.0, math.nan, 1.0, 1.0, math.inf, -math.inf, math.inf]
    for got, want in zip(result.tolist(), expected):
        assert (math.isnan(got) and math.isnan(want)) or got == want


def test_ulp_errors_count_signed_zero_and_match_nans():
    a = torch.tensor([0.0, -0.0, float("nan"), 1.0, 1.0])
    b = torch.tensor([-0.0, -0.0, float("nan"), float("nan"), 1.0 + 2.0 ** -23])
    errors = precision.ulp_errors(a, b).tolist()
    assert errors[:3] == [1, 0, 0] and errors[3] == precision.NAN_MISMATCH and errors[4] == 1


@pytest.mark.parametrize("op", family_convolution.OPS)
def test_convolution_references_agree_with_torch_float64(op):
    generator = torch.Generator().manual_seed(0)
    for config in family_convolution._CONFIGS:
        call = family_convolution._make(op, config, torch.float64, generator)
        theirs = family_convolution.torch_op(call).numpy()
        for dt in (np.float64, np.longdouble):
            ours = family_convolution.numpy_conv(call, dt)
            assert ours.shape == theirs.shape
            assert np.abs(ours - theirs).max() <= 1e-12 * max(1.0, np.abs(theirs).max())


def test_fit_recovers_overhead_and_rate():
    amounts = [1e2, 1e4, 1e6, 1e8]
    seconds = [5e-6 + a / 2e10 for a in amounts]
    fitted = timing.fit(amounts, seconds)
    assert fitted["launch_overhead_s"] == pytest.approx(5e-6, rel=1e-6)
    assert fitted["per_second"] == pytest.approx(2e10, rel=1e-6)
    assert fitted["max_relative_residual"] < 1e-9


# ---- the roofs -----------------------------------------------------------------------------------

class FakeRoofs:
    """Roofs with fixed rates: 100 GB/s up to 1 MiB of working set, 20 GB/s beyond; 50 GFLOP/s."""

    def __init__(self, remeasured_rate: float | None = None):
        self.asked: list[tuple[int, bool]] = []
        self.remeasured_rate = remeasured_rate

    def roof(self, basis, point, dtype, remeasure=False):
        self.asked.append((point["bytes_moved"], remeasure))
        if basis == "flops":
            return 50.0, "fake peak"
        rate = 100.0 if point["bytes_moved"] <= 1 << 20 else 20.0
        if remeasure and self.remeasured_rate is not None:
            rate = self.remeasured_rate
        return rate, f"fake {rate} GB/s"


def _points(sizes_and_times):
    return [{"size": f"n={n}", "bytes_moved": 12 * n, "flops": n, "ours_s": ours, "torch_s": theirs}
            for n, ours, theirs in sizes_and_times]


def test_a_figure_within_its_roof_is_kept_as_measured():
    points = _points([(1 << 16, 12 * (1 << 16) / 80e9, 12 * (1 << 16) / 90e9)])  # 80 and 90 GB/s, roof 100
    remeasured = []
    assert timing.check_roofs(points, [p["bytes_moved"] for p in points], "bytes_moved", torch.float32,
                              FakeRoofs(), remeasured.append) == []
    assert remeasured == [] and "unreliable" not in points[0] and "remeasured" not in points[0]
    assert points[0]["roof"]["rate"] == 100.0 and points[0]["working_set_bytes"] == 12 * (1 << 16)


def test_the_roof_for_a_point_depends_on_its_working_set():
    # 50 GB/s: under the in-cache roof (100) at 768 KiB, above the DRAM roof (20) at 48 MiB.
    small, large = 1 << 16, 1 << 22
    points = _points([(small, 12 * small / 50e9, 12 * small / 50e9), (large, 12 * large / 50e9, 12 * large / 25e9)])
    roofs = FakeRoofs()
    reasons = timing.check_roofs(points, [p["bytes_moved"] for p in points], "bytes_moved", torch.float32, roofs,
                                 lambda index: (points[index]["ours_s"], points[index]["torch_s"]))
    assert [p["roof"]["rate"] for p in points] == [100.0, 20.0]
    assert "unreliable" not in points[0]
    assert "fuel 50 GB/s" in points[1]["unreliable"] and "torch 25 GB/s" in points[1]["unreliable"]
    assert (12 * large, True) in roofs.asked  # the roof was measured again before the verdict
    assert len(reasons) == 1 and reasons[0].startswith(f"n={large}: ")


def test_a_figure_above_its_roof_is_remeasured_and_kept_when_the_second_timing_is_sane():
    n = 1 << 16
    points = _points([(n, 12 * n / 300e9, 12 * n / 90e9)])  # ours at 3x the roof: a clock glitch
    calls = []

    def remeasure(index):
        calls.append(index)
        return 12 * n / 95e9, 12 * n / 90e9

    assert timing.check_roofs(points, [12 * n], "bytes_moved", torch.float32, FakeRoofs(), remeasure) == []
    assert calls == [0] and "unreliable" not in points[0]
    assert points[0]["ours_s"] == pytest.approx(12 * n / 95e9)
    assert "ours 300 GB/s above the roof" in points[0]["remeasured"]["because"]


def test_a_roof_measured_too_low_is_fixed_by_measuring_it_again():
    n = 1 << 22
    points = _points([(n, 12 * n / 30e9, 12 * n / 30e9)])  # above a 20 GB/s roof, below its re-measurement
    assert timing.check_roofs(points, [12 * n], "bytes_moved", torch.float32, FakeRoofs(remeasured_rate=35.0),
                              lambda index: (points[index]["ours_s"], points[index]["torch_s"])) == []
    assert points[0]["roof"]["rate"] == 35.0 and "unreliable" not in points[0]


def test_compute_figures_are_checked_against_the_dtype_peak():
    points = [{"size": "conv", "bytes_moved": 1000, "flops": 6e9, "ours_s": 0.2, "torch_s": 0.02}]  # 30, 300 GFLOP/s
    reasons = timing.check_roofs(points, [6e9], "flops", torch.float32, FakeRoofs(), lambda index: (0.2, 0.01))
    assert points[0]["roof"] == {"rate": 50.0, "unit": "GFLOP/s", "how": "fake peak"}
    assert "torch 600 GFLOP/s" in points[0]["unreliable"] and "fuel" not in points[0]["unreliable"]
    assert len(reasons) == 1


def test_the_cost_audit_leaves_unreliable_points_out_of_the_fit(monkeypatch):
    from fuel_torch.judge import family_elementwise

    contract = fuel_torch.contract("add", torch.float32)
    sizes = family_elementwise.SIZES["quick"]["cost"]
    honest = {n: 2e-6 + 12 * n / 10e9 for n in sizes}  # 2 us + 10 GB/s, far under the fake roofs

    def fake_pair(ours, theirs, level):
        n = fake_pair.sizes.pop(0)
        glitch = n == sizes[1]  # the middle point reads 1000x too fast, at the first timing and the recheck
        return (honest[n] / 1000 if glitch else honest[n]), honest[n]

    fake_pair.sizes = list(sizes) + [sizes[1]]
    monkeypatch.setattr(timing, "measure_pair", fake_pair)
    result = timing.audit(contract, family_elementwise, "quick", FakeRoofs())
    assert fake_pair.sizes == []  # every point timed once, the glitched one twice
    assert [("unreliable" in p) for p in result["points"]] == [False, True, False]
    assert len(result["unreliable"]) == 1 and result["fit_points"] == [f"n={sizes[0]}", f"n={sizes[2]}"]
    assert result["ours"]["launch_overhead_s"] == pytest.approx(2e-6, rel=1e-6)
    assert result["ours"]["rate"] == pytest.approx(10.0, rel=1e-6)


def test_bandwidth_roofs_are_measured_at_the_working_set_with_the_floor_taken_off(monkeypatch):
    """Fake streaming kernels: 2 us per call plus bytes at 100 GB/s in cache (<= 1 MiB), 20 GB/s beyond."""
    measured = []

    def fake_streams(self, working_set, threads):
        measured.append((working_set, threads))
        rate = 100e9 if working_set <= 1 << 20 else 20e9
        nbytes = 12 * max(1, working_set // 12)
        return {"add": (nbytes, 2e-6 + nbytes / rate), "copy": (nbytes, 2e-6 + nbytes / (rate / 2))}

    monkeypatch.setattr(timing.Roofs, "_streams", fake_streams)
    roofs = timing.Roofs("quick", threads=1)
    assert roofs.bandwidth(768 << 10)["GBps"] == pytest.approx(100, rel=0.01)
    assert roofs.bandwidth(48 << 20)["GBps"] == pytest.approx(20, rel=0.01)
    assert roofs.bandwidth(768 << 10)["measurements"] == 1  # kept, not measured again
    assert roofs.bandwidth(768 << 10, remeasure=True)["measurements"] == 2
    assert roofs.bandwidth(24)["GBps"] is None  # 24 bytes in 2 us: all floor, no roof bounds it
    sizes = [r["bytes"] for r in roofs.as_dict()["bandwidth_GBps_by_working_set"]]
    assert sizes == sorted({24, 768 << 10, 48 << 20})
    # At 4 threads a small working set is also bounded by 4 x one thread over a quarter of the bytes
    # (torch's own loop would not split it; a kernel may).
    measured.clear()
    four = timing.Roofs("quick", threads=4)
    assert four.bandwidth(768 << 10)["GBps"] == pytest.approx(400, rel=0.05)
    assert (192 << 10, 1) in measured


def test_compute_roof_of_a_half_dtype_is_at_least_float32s(monkeypatch):
    peaks = {torch.float32: 100.0, torch.float64: 50.0, torch.bfloat16: 400.0, torch.float16: 20.0}
    monkeypatch.setattr(timing.Roofs, "_measure_peak", lambda self, dtype: {"GFLOPs": peaks[dtype], "by": "fake"})
    roofs = timing.Roofs("quick", threads=1)
    assert roofs.peak(torch.float64)["GFLOPs"] == 50.0
    assert roofs.peak(torch.bfloat16)["GFLOPs"] == 400.0  # AMX-class bf16
    assert roofs.peak(torch.float16)["GFLOPs"] == 100.0  # a half kernel may compute in float32
    assert roofs.as_dict()["peak_GFLOPs"] == {"float64": 50.0, "bfloat16": 400.0, "float32": 100.0, "float16": 20.0}


def test_compute_roof_is_the_higher_of_matmul_and_the_multiply_add_probe(monkeypatch):
    """On an AMD CPU torch.mm runs MKL's AVX2 code at half the AVX-512 rate, and a roof from it alone
    put correct convolution timings above it. Fake timings: torch.mm 1 ms, the probe 2 ms."""
    probe_calls = []

    class FakeC:
        @staticmethod
        def peak_probe(dtype, iterations):
            probe_calls.append(dtype)
            # Operations on each of torch's threads: 2000 and 50 GFLOP/s in 2 ms at 2 threads.
            return 1e9 * {"float32": 4.0, "float64": 0.1}[dtype] * torch.get_num_threads() / 2

        @staticmethod
        def cpu_capability():
            return "AVX512"

    def fake_medians(fns, **kwargs):
        for fn in fns.values():
            fn()
        return {name: {"mm": 1e-3, "probe": 2e-3}[name] for name in fns}

    monkeypatch.setattr(timing, "_C", FakeC)
    monkeypatch.setattr(timing.clock, "interleaved_medians", fake_medians)
    # The process at 1 thread, the roof at 2: the probe's count must be scaled to the roof's threads.
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    roofs = timing.Roofs("quick", threads=2)
    mm_rate = lambda n: 2 * n**3 / 1e-3 / 1e9  # noqa: E731
    f32 = roofs.peak(torch.float32)
    assert f32["GFLOPs"] == pytest.approx(2000.0) and "vector multiply-adds at AVX512, 2 threads" in f32["by"]
    f64 = roofs.peak(torch.float64)  # torch.mm 384^3 in 1 ms beats the probe's 50
    assert f64["GFLOPs"] == pytest.approx(mm_rate(384)) and "torch.mm 384x384" in f64["by"]
    probe_calls.clear()
    bf16 = roofs.peak(torch.bfloat16)  # no probe of its own: float32's, already measured, bounds it
    assert probe_calls == [] and bf16["GFLOPs"] == pytest.approx(2000.0)


def test_the_multiply_add_probe_counts_the_work_it_does():
    """The compute roof's probe (_C.peak_probe) must report the operations it did: a count above the
    work would raise the roof. Each of torch's threads runs the same rounds."""
    from fuel_torch import _C

    threads = torch.get_num_threads()
    try:
        for dtype in ("float32", "float64"):
            torch.set_num_threads(1)
            one = _C.peak_probe(dtype, 1000)
            assert one > 0 and _C.peak_probe(dtype, 2000) == 2 * one and _C.peak_probe(dtype, 0) == 0
            assert one % (2 * 1000) == 0  # 2 operations per lane, chain and round
            torch.set_num_threads(2)
            assert _C.peak_probe(dtype, 1000) == 2 * one
        assert _C.peak_probe("float32", 1) == 2 * _C.peak_probe("float64", 1)  # twice the lanes per vector
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="dtype must be 'float32' or 'float64', saw 'bfloat16'"):
        _C.peak_probe("bfloat16", 10)
    with pytest.raises(RuntimeError, match=r"iterations must lie in \[0, 2\^28\] \(at most about a second\), saw -1"):
        _C.peak_probe("float32", -1)
    with pytest.raises(RuntimeError, match=r"iterations must lie in .*saw 268435457"):
        _C.peak_probe("float64", 2**28 + 1)


def test_report_marks_unreliable_figures_in_the_table_and_the_roofline(tmp_path):
    point = {"size": "n=1048576", "flops": 1 << 20, "bytes_moved": 12 << 20, "ours_s": 1e-4, "torch_s": 1e-3,
             "roof": {"rate": 20.0, "unit": "GB/s", "how": "20 GB/s at 12 MiB"},
             "unreliable": "fuel 126 GB/s above the roof 20 GB/s at 12 MiB, measured twice: a measurement error"}
    fit = {"launch_overhead_s": 1e-6, "per_second": 1e10, "rate": 10.0}
    entry = {"kernel": "add_f32", "verdict": "pass", "failed_claims": [],
             "cost": {"unit": "GB/s", "basis": "bytes_moved", "points": [point], "ours": fit, "torch": fit,
                      "time_ratio_at_largest": 0.1, "unreliable": [f"n=1048576: {point['unreliable']}"]}}
    fake = {"machine": {"cpu": "fake CPU", "torch_threads": 2, "cpu_count": 2, "load_average": [0.0],
                        "measured": {"dram_bandwidth_GBps": 20.0, "dram_working_set_bytes": 128 << 20, "roofs": {
                            "threads": 2, "peak_GFLOPs": {"float32": 100.0},
                            "bandwidth_GBps_by_working_set": [{"bytes": 12 << 20, "GBps": 20.0, "by": "x"}]}}},
            "kernels": [entry], "checks": ["cost"], "summary": {"failed_claims": [], "kernels": 1, "failed_kernels": 0,
                                                             "seconds": 1.0},
            "contracts": "contracts", "level": "quick", "torch": torch.__version__, "created": "now"}
    text = report.table(fake)
    assert re.search(r"^add_f32 .*\(1 pt above roof\).*0\.10x UNRELIABLE", text, re.M)
    assert "UNRELIABLE timings (1; left out of the fits, not results):" in text
    assert "add_f32 n=1048576: fuel 126 GB/s above the roof" in text
    assert "bandwidth roofs by working set: 12 MiB 20.0 GB/s" in text
    assert report.roofline(fake, tmp_path / "roofline.png") is None
    assert (tmp_path / "roofline.png").stat().st_size > 0


def test_the_streaming_roof_probe_adds_and_checks_its_buffers():
    """The Judge's third bandwidth probe (Roofs._streams): out = lhs + rhs with non-temporal stores,
    the access pattern fuel's elementwise kernels take past their caches. It must compute the sum
    (a probe that skipped work would raise the roof) and refuse buffers it cannot walk."""
    from fuel_torch import _C

    for n in (1, 17, 40_000, 3_000_001):  # below and above the grain, and past the caches
        a, b = torch.rand(n), torch.rand(n)
        out = torch.full_like(a, float("nan"))
        _C.streaming_triad(a, b, out)
        assert torch.equal(out, a + b), n
    with pytest.raises(RuntimeError, match="refuses argument 'out'"):
        _C.streaming_triad(torch.rand(8), torch.rand(8), torch.empty(5))
    with pytest.raises(RuntimeError, match="float32 tensors only"):
        _C.streaming_triad(torch.rand(8).double(), torch.rand(8).double(), torch.empty(8).double())
