"""The installed package: imports anywhere, more than once, and carries its contracts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fuel_torch

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_twice_and_from_another_directory(tmp_path):
    out = run_python(
        "import importlib, torch, fuel_torch, fuel_torch as again\n"
        "importlib.import_module('fuel_torch')\n"
        "assert again is fuel_torch\n"
        "print(len(fuel_torch.installed().registrable), torch.ops.fuel.add(torch.ones(3), torch.ones(3)).tolist())\n",
        cwd=tmp_path)
    assert out.split("[")[1].strip() == "2.0, 2.0, 2.0]"
    assert int(out.split()[0]) == len(fuel_torch.installed().registrable)


def test_contracts_are_found_from_the_package_not_the_working_directory(tmp_path):
    directory = run_python("import fuel_torch; print(fuel_torch.installed().directory)", cwd=tmp_path).strip()
    files = sorted(p.name for p in Path(directory).glob("*.fkc.md"))
    assert "elementwise.fkc.md" in files
    assert (Path(directory) / "convolution.geometry.yaml").is_file()  # the convolutions' geometry table
    package = Path(fuel_torch.__file__).resolve().parent
    if REPO not in package.parents:
        # A regular (non-editable) install, as CI does: the contracts travel inside the wheel.
        assert Path(directory).resolve().parent == package


def test_main_job_prints_every_kernel_with_its_contract(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fuel_torch"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    for contract in fuel_torch.installed().registrable:
        assert f"\n{contract.kernel} " in done.stdout
    assert "0 parity failures" in done.stdout
