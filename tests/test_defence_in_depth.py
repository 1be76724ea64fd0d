"""The kernels check, themselves, the buffers they are about to touch (issue "Speed I", item 5).

The contract rules installed from contracts/ are the first line: they give the clause-quoting
errors. A contract file that lost a clause must still give an error, never an out-of-bounds access:
the child process below installs rules from a doctored contract set (no `same_as`, every layout
accepted, every dtype accepted) and makes calls that those rules let through. A crash kills the
child, which the test reports as a failure rather than dying with it.
"""
from __future__ import annotations

import os
import subprocess
import sys

CHILD = r"""
import torch, fuel_torch
from fuel_torch import _C
from fuel_torch.contracts import installed, rules_for_cpp

rules = rules_for_cpp(installed())
for rule in rules:
    for argument in rule["inputs"]:
        argument["same_as"] = ""
        argument["layout"] = {flag: "accepted" for flag in argument["layout"]}
        argument["dtypes"] = ["F32", "F64", "BF16", "F16"]
_C.install_rules(rules)

big = torch.ones(4_000_000)
calls = {
    "shorter rhs": lambda: torch.ops.fuel.add(big, torch.ones(1)),
    "shorter lhs": lambda: torch.ops.fuel.mul(torch.ones(1), big),
    "stride-0 rhs": lambda: torch.ops.fuel.pow(big, torch.ones(1).expand(4_000_000)),
    "strided rhs": lambda: torch.ops.fuel.sub(big, torch.ones(8_000_000)[::2]),
    "offset rhs": lambda: torch.ops.fuel.div(big, torch.ones(4_000_001)[1:]),
    "narrower rhs dtype": lambda: torch.ops.fuel.rem(big, torch.ones(4_000_000, dtype=torch.float16)),
    "shorter rhs, out=": lambda: torch.ops.fuel.maximum.out(big, torch.ones(1), out=torch.empty(4_000_000)),
}
for name, call in calls.items():
    try:
        call()
        print(f"{name}: ACCEPTED")
    except RuntimeError as error:
        print(f"{name}: refused: {str(error).splitlines()[0]}")
"""


def test_a_contract_without_its_clauses_gives_errors_not_crashes():
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, f"the child died (exit {result.returncode}): {result.stderr[-3000:]}"
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 7, result.stdout
    for line in lines:  # a clean error naming the op, from the rules left or from the kernel
        assert line.split(": ", 1)[1].startswith("refused: fuel::"), line
    # The sizes are the kernel's own check: no rule is left to refuse them.
    for line in lines[0], lines[1], lines[6]:
        assert "the kernel refuses argument 'rhs'" in line and "same_as" in line, line
    assert "shape [1]" in lines[0] and "shape [4000000]" in lines[1]  # lhs decides the buffer size
