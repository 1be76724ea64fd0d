"""The convolution benchmark's columns: each row's needed rate set against the peak line."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "bench_convolution.py"


def test_needed_over_peak_is_the_needed_rate_over_the_peak_line():
    result = subprocess.run([sys.executable, str(SCRIPT), "--only", "small", "--dtype", "float64", "bfloat16",
                             "--threads", "1", "--repeats", "1", "--no-training"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    peak = float(re.search(r"float64 (\d+)", next(line for line in lines if line.startswith("vector multiply-add"))).group(1))
    rows = {line.split()[3]: line for line in lines if line.startswith("small 3x3")}
    assert set(rows) == {"float64", "bfloat16"}, lines
    needed = float(re.search(r" \d+/\d+/(\d+) ", rows["float64"]).group(1))
    share = float(re.search(r" (\d+)% ", rows["float64"]).group(1))
    # All three printed rounded to the unit: the share must lie within what the unrounded rates allow.
    low, high = 100 * (needed - 0.5) / (peak + 0.5) - 0.5, 100 * (needed + 0.5) / (peak - 0.5) + 0.5
    assert low <= share <= high, (share, needed, peak)
    # Halves have no probe of their own: no share is claimed for them.
    assert "%" not in rows["bfloat16"], rows["bfloat16"]


def test_channels_last_rows_say_their_layout():
    result = subprocess.run([sys.executable, str(SCRIPT), "--only", "small", "--dtype", "float32", "--threads", "1",
                             "--repeats", "1", "--no-training", "--memory-format", "channels_last"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("CPU:") and line.endswith("memory format channels_last") for line in lines), lines
    assert any(line.startswith("small 3x3") and " float32 " in line for line in lines), lines
