"""No convolution kernel reads scratch it did not write.

The kernels leave their scratch buffers (packed weights, gathered inputs, running sums) unfilled,
on the claim that each writes every element before reading it. In an ordinary run a broken claim can
hide: leftover heap memory is often zeros, and a zero weight or input changes no sum. Under
FUEL_POISON_SCRATCH=1 every scratch buffer starts as all-one bytes, a NaN in every dtype, so an
element read before it is written reaches the output, and the parity oracles (NaN exactly where the
definition gives NaN) fail. The suites run in a child process, since the variable is read once.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Every third case of the parity grid (every op, dtype and geometry factor, on the chassis and the
# planar, depthwise and wide paths), under NaN-filled torch.empty too; the brgemm paths' suites; the
# depthwise weight gradient's.
SUITES = [
    "test_every_output_written.py",
    "test_convolution_tap_brgemm.py",
    "test_convolution_patch_brgemm.py",
    "test_convolution_plane_brgemm.py",
    "test_convolution_wide_brgemm.py",
    "test_convolution_float_gemm.py",
    "test_convolution_depthwise_weight_grad.py",
]


def child(code: str, poisoned: bool, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FUEL_POISON_SCRATCH"}
    if poisoned:
        env["FUEL_POISON_SCRATCH"] = "1"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=TESTS, capture_output=True, text=True,
                          timeout=timeout)


def test_the_switch_is_read_from_the_environment():
    code = "import fuel_torch; print(fuel_torch._C.scratch_poisoned())"
    assert child(code, poisoned=True, timeout=120).stdout.strip() == "True"
    assert child(code, poisoned=False, timeout=120).stdout.strip() == "False"


def test_convolution_suites_pass_with_scratch_poisoned():
    args = ["-q", "-x", "-p", "no:cacheprovider", *SUITES]
    code = ("import sys, pytest, fuel_torch\n"
            "assert fuel_torch._C.scratch_poisoned()\n"
            f"sys.exit(pytest.main({args!r}))")
    result = child(code, poisoned=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
