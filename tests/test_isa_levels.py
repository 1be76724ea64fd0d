"""Run-time ISA dispatch: the kernels are built once per instruction-set level and chosen at import.

Each level this CPU supports runs in a child process (FUEL_CPU_CAPABILITY=<level>): it reports the
forced level, passes the elementwise and convolution parity suites, and gives the same results as
every other level for the ops whose results are defined to the bit (pow: within 1 ulp of the
correctly rounded power at each). Levels beyond the CPU, and unknown names, are refused at import
with the reason. The built library is checked for vector instructions of a level leaking into code
that runs at another (the linker merges inline functions compiled with different -m flags).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fuel_torch
from fuel_torch.capability import LEVELS, built_capabilities, supported_capabilities
from fuel_torch.reference import bits, ulp_distance
from fuel_torch.timing import ISA_CAPS

from elementwise_cases import DTYPES, c99_fixed, pow_reference

SUPPORTED = supported_capabilities()
TESTS = Path(__file__).parent
BIT_DEFINED = ("add", "sub", "mul", "div", "maximum", "minimum", "rem")
SELECTIONS = ("maximum", "minimum")  # return an operand bit for bit, NaN payloads included


def child(code: str, level: str | None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FUEL_CPU_CAPABILITY"}
    if level is not None:
        env["FUEL_CPU_CAPABILITY"] = level
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=TESTS, capture_output=True, text=True,
                          timeout=timeout)


def test_without_the_variable_the_best_supported_level_runs():
    assert SUPPORTED[0] == "DEFAULT" and set(SUPPORTED) <= set(built_capabilities())
    result = child("import fuel_torch; print(fuel_torch.cpu_capability())", None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [SUPPORTED[-1]]


def test_levels_beyond_this_cpu_and_unknown_names_are_refused_at_import():
    refused = [level for level in LEVELS if level not in SUPPORTED] + ["SSE9"]
    for level in refused:
        result = child("import fuel_torch", level)
        assert result.returncode != 0, f"{level} was accepted"
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: fuel_torch: FUEL_CPU_CAPABILITY=" + level), last
        if level == "SSE9":
            assert "is not a level; use one of DEFAULT, AVX2, AVX512" in last
        elif level in built_capabilities():
            assert "this CPU lacks" in last and "Levels this CPU supports: " + ", ".join(SUPPORTED) in last
        else:
            assert "which this build does not have" in last


# At a forced level: reports the level, then writes every op's results on special values and
# random data, for every dtype, to a file.
AT_LEVEL = """
import sys, torch, fuel_torch, fuel_torch.__main__
from elementwise_cases import DTYPES, OPS, cross, random_pair
print(fuel_torch.cpu_capability())
print(fuel_torch.__main__.capability_line())
results = {}
for dtype in DTYPES:
    for op in OPS:
        special_lhs, special_rhs = cross(dtype)
        lhs, rhs = random_pair(4099, dtype, 3, op)
        lhs, rhs = torch.cat([special_lhs, lhs]), torch.cat([special_rhs, rhs])
        results[op, str(dtype)] = (lhs, rhs, getattr(torch.ops.fuel, op)(lhs, rhs))
torch.save(results, sys.argv[1])
"""


@pytest.fixture(scope="module")
def results_per_level(tmp_path_factory) -> dict:
    """{level: results} from a child process per supported level, each checked to run at it."""
    per_level = {}
    for level in SUPPORTED:
        path = tmp_path_factory.mktemp("levels") / f"{level}.pt"
        # Level names are case-insensitive, as ATen's ATEN_CPU_CAPABILITY values are.
        result = child(f"import sys; sys.argv = ['', {str(path)!r}]\n" + AT_LEVEL, level.lower())
        assert result.returncode == 0, result.stderr
        reported, line = result.stdout.splitlines()[:2]
        assert reported == level
        assert f"fuel kernels at {level}" in line and line.startswith("CPU: ")
        per_level[level] = torch.load(path)
    return per_level


def test_bit_defined_ops_agree_across_levels(results_per_level):
    first = results_per_level[SUPPORTED[0]]
    for (op, dtype), (_, _, ours) in first.items():
        if op == "pow":
            continue
        for level in SUPPORTED[1:]:
            out = results_per_level[level][op, dtype][2]
            # IEEE 754 leaves the payload of an arithmetic NaN open (and compilers swap the
            # operands of commutative instructions), so arithmetic NaNs are compared as NaN;
            # selections return an operand, so theirs are compared bit for bit.
            nan = torch.isnan(ours)
            assert torch.equal(nan, torch.isnan(out)), (op, dtype, level)
            same = bits(out) == bits(ours)
            mismatch = ~same if op in SELECTIONS else ~same & ~nan
            assert not mismatch.any(), (f"{op} {dtype}: {level} differs from {SUPPORTED[0]} at "
                                        f"{int(mismatch.sum())} elements, first {mismatch.nonzero()[0].item()}")


def test_pow_is_within_one_ulp_at_every_level(results_per_level):
    for level, results in results_per_level.items():
        for dtype in DTYPES:
            lhs, rhs, out = results["pow", str(dtype)]
            reference = pow_reference(lhs, rhs)
            assert torch.equal(torch.isnan(out), torch.isnan(reference)), (level, dtype)
            assert int(ulp_distance(out, reference).max()) <= 1, (level, dtype)
            fixed = c99_fixed(lhs, rhs, reference)
            assert torch.equal(bits(out[fixed & ~torch.isnan(out)]), bits(reference[fixed & ~torch.isnan(out)])), \
                (level, dtype, "C99 special case")


# The parity suites at every supported level but the one this process runs at (the whole suite
# tests that one in-process), less what does not exercise the kernels' arithmetic or repeats it:
# the 1M-element random data (the cross-level comparison above covers random data), the pooled
# float32 conv error statistics, and the Python layer (opinfo samples, fake kernels, meta tensors,
# the CLI, argument handling). The patch path's suite too: its float32 code has an AVX2 and an
# AVX512 variant (tiles, run copies, masked stores), and at DEFAULT its calls take the chassis. And the
# depthwise weight gradient's: its register blocks and lane groups depend on the vector width. And
# the float32 brgemm paths' order test: their kernel is fuel's own tile at AVX2, oneDNN's at AVX512.
PARITY_FILES = ["test_elementwise_parity.py", "test_convolution.py", "test_convolution_patch_brgemm.py",
                "test_convolution_depthwise_weight_grad.py", "test_convolution_float_gemm.py",
                "test_convolution_plane_brgemm.py"]
LEFT_OUT = ("random_data_of_many_sizes", "python_api", "opinfo", "pooled", "fake_kernel", "meta_tensors",
            "cli_parity", "keyword", "string_padding", "contiguize", "every_registered")
OTHER_LEVELS = [level for level in SUPPORTED if level != fuel_torch.cpu_capability()]


@pytest.mark.parametrize("level", OTHER_LEVELS)
def test_parity_suites_pass_at_every_other_level(level):
    selection = " and ".join(f"not {name}" for name in LEFT_OUT)
    args = ["-q", "-x", "-p", "no:cacheprovider", *PARITY_FILES, "-k", selection]
    result = child(f"import sys, pytest; sys.exit(pytest.main({args!r}))", level, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]


@pytest.mark.parametrize("level", OTHER_LEVELS)
def test_bias_gradient_order_holds_at_every_other_level(level):
    """fuel_backward::conv_bias_grad's sums are compiled per level (bias_grad_sums.h): its order
    tests (lane by position mod 16, rounded once; both layouts, every dtype) pass at each level."""
    args = ["-q", "-x", "-p", "no:cacheprovider", "test_autograd.py", "-k", "bias_gradient"]
    result = child(f"import sys, pytest; sys.exit(pytest.main({args!r}))", level, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]


def vector_instructions_outside_their_level(disassembly: str) -> list[str]:
    """Functions whose instructions need a higher level than the namespace they belong to.

    Code outside fuel::AVX2 / fuel::AVX512 (and ATen's at::vec::AVX2 / AVX512) may run on any
    x86-64 CPU, so it must hold no VEX/EVEX instruction (mnemonics starting with 'v', or k-mask
    registers); AVX2 code must hold no AVX-512 register (zmm, k, xmm/ymm 16-31).
    """
    avx512_only = re.compile(r"%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{%k")
    bad, function, level = [], None, None
    for line in disassembly.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            # Demangled, or (objdump cannot demangle an OpenMP-outlined body, `..._omp_fn.0`) mangled:
            # a level's parallel_for lambda makes the outlined body that level's code.
            level = "AVX512" if re.search(r"\bAVX512::|4fuel6AVX512", function) else (
                "AVX2" if re.search(r"\bAVX2::|4fuel4AVX2", function) else "DEFAULT")
            continue
        parts = line.split("\t")
        if function is None or len(parts) < 2 or level == "AVX512":
            continue
        instruction = parts[-1].strip()
        mnemonic = instruction.split(" ")[0]
        if avx512_only.search(instruction) or (level == "DEFAULT" and (mnemonic.startswith("v") or
                                                                       "%ymm" in instruction)):
            bad.append(f"{function}: {instruction}")
            function = None  # one report per function
    return bad


def test_no_vector_instruction_leaks_out_of_its_level():
    objdump = shutil.which("objdump")
    assert objdump, "needs binutils' objdump (it comes with the compiler that builds fuel_torch)"
    disassembly = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", fuel_torch._C.__file__],
                                 capture_output=True, text=True, check=True).stdout
    assert "fuel::AVX2::" in disassembly or "AVX2" not in built_capabilities()
    assert "fuel::AVX512::" in disassembly or "AVX512" not in built_capabilities()
    leaks = vector_instructions_outside_their_level(disassembly)
    assert not leaks, f"{len(leaks)} functions use instructions beyond their level:\n" + "\n".join(leaks[:20])


def test_the_leak_check_can_fail():
    sample = ("0000000000001000 <fuel::(anonymous namespace)::check(int)>:\n"
              "    1000:\tvmovups %ymm0,(%rdi)\n"
              "0000000000002000 <fuel::AVX2::(anonymous namespace)::k()>:\n"
              "    2000:\tvaddps %zmm1,%zmm2,%zmm3\n"
              "0000000000003000 <fuel::AVX512::(anonymous namespace)::k()>:\n"
              "    3000:\tvaddps %zmm1,%zmm2,%zmm3\n"
              "0000000000004000 <fuel::AVX2::(anonymous namespace)::ok()>:\n"
              "    4000:\tvaddps %ymm1,%ymm2,%ymm3\n"
              "0000000000005000 <_ZN2at8internal15invoke_parallelIZN4fuel4AVX21kEv._omp_fn.0>:\n"
              "    5000:\tvaddps %ymm1,%ymm2,%ymm3\n")
    leaks = vector_instructions_outside_their_level(sample)
    assert [leak.split(":")[0] for leak in leaks] == ["fuel", "fuel"] and len(leaks) == 2
    assert "check(int)" in leaks[0] and "AVX2" in leaks[1]


@pytest.mark.parametrize("level", [level for level in ("AVX2", "DEFAULT") if level in SUPPORTED])
def test_a_benchmark_run_with_isa_holds_both_sides_to_the_level(level):
    # --isa re-executes the script with fuel_torch.timing.ISA_CAPS[level]: ours and ATen's kernels
    # must then report the level, and the machine line say that oneDNN's ISA is capped.
    script = TESTS.parent / "benchmarks" / "bench_elementwise.py"
    env = {k: v for k, v in os.environ.items() if k not in ("FUEL_CPU_CAPABILITY", "ATEN_CPU_CAPABILITY",
                                                             "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")}
    result = subprocess.run([sys.executable, str(script), "--isa", level, "--ops", "add", "--dtypes", "float32",
                             "--sizes", "1024", "--repeats", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    machine = next(line for line in result.stdout.splitlines() if line.startswith("CPU: "))
    assert f"capability {level}; fuel capability {level};" in machine, machine
    assert f"ISA capped (oneDNN {ISA_CAPS[level]['ONEDNN_MAX_CPU_ISA']}" in machine, machine
