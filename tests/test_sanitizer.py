"""The kernels under AddressSanitizer and UndefinedBehaviorSanitizer: zero reports.

Builds the extension with FUEL_SANITIZE=1 in a separate tree (tools/sanitize.sh; the installed build
is not touched) and runs the bounded subset there in a child process, with the ASan runtime
preloaded. Any report aborts the child, so the run fails; the output is searched for reports too,
in case one is printed by a process that does not decide the exit status (a DataLoader-style
worker, a subprocess of a test). Takes several minutes (a full compile); the whole suite under the
sanitizers is `tools/sanitize.sh` (README, Reliability).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "SUMMARY: AddressSanitizer", "SUMMARY: UndefinedBehaviorSanitizer")


def test_bounded_suite_is_clean_under_asan_and_ubsan(tmp_path_factory):
    compiler = os.environ.get("CXX", "c++")
    assert shutil.which(compiler), f"the sanitizer build needs a C++ compiler ({compiler})"
    env = dict(os.environ, PYTHON=sys.executable)
    env.setdefault("FUEL_SANITIZE_DIR", str(REPO / "build" / "sanitize"))
    run = subprocess.run(["bash", str(REPO / "tools" / "sanitize.sh"), "--bounded"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=45 * 60)
    output = run.stdout + run.stderr
    tail = output[-6000:]
    assert "sanitize.sh: testing the sanitizer build" in output, tail
    assert not [line for line in output.splitlines() if any(r in line for r in REPORTS)], tail
    assert run.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail
