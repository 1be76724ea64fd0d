"""examples/autoencoder.py, short: fuel eager, fuel under torch.compile (inductor) and the torch twin agree."""
import importlib.util
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "autoencoder.py"


def load_example():
    spec = importlib.util.spec_from_file_location("fuel_autoencoder_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_short_training_run_falls_and_matches_the_torch_twin(capsys):
    example = load_example()
    torch._dynamo.reset()
    assert example.main(["--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert "fuel compiled (inductor)" in out and "ok: loss" in out


def test_check_catches_a_run_that_drifts_or_does_not_learn():
    example = load_example()
    falling = [1.0 / (step + 1) for step in range(20)]
    assert example.check({"twin": falling, "fuel": list(falling)}, rtol=1e-3) == []
    drifted = falling[:10] + [v * 1.01 for v in falling[10:]]
    assert example.check({"twin": falling, "fuel": drifted}, rtol=1e-3) == [
        f"fuel differs from twin at step 10: {drifted[10]:.8f} vs {falling[10]:.8f}"]
    flat = [1.0] * 20
    assert "did not fall by half" in example.check({"twin": flat}, rtol=1e-3)[0]


def test_the_networks_share_state_dict_keys_and_run_on_fuel_ops():
    example = load_example()
    fuel, twin = example.AutoEncoder(example.FUEL), example.AutoEncoder(example.TORCH)
    assert list(fuel.state_dict()) == list(twin.state_dict())
    assert {type(m).__module__ for m in fuel.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.ConvTranspose2d)} \
        == {"fuel_torch.nn"}
