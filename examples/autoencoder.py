"""A small convolutional autoencoder trained on fuel ops, eager and under torch.compile, against a pure-torch twin.

    python examples/autoencoder.py                 # 300 steps: eager, compiled, and the torch twin
    python examples/autoencoder.py --steps 20      # a short run (what the test does)
    python examples/autoencoder.py --no-compile    # eager only

The data are synthetic 16x16 images the script draws itself (two Gaussian blobs each). The encoder is two
strided fuel conv2d layers and a residual conv block, the decoder two fuel conv_transpose2d layers; the
activations (leaky ReLU as fuel maximum/mul), the residual (fuel add) and the loss (fuel sub/pow) are fuel
elementwise ops. The twin is the same network with torch.nn.Conv2d / ConvTranspose2d and torch's
elementwise ops, starting from the same weights (the state_dicts are interchangeable) and fed the same
batches: the three runs must agree on the loss at every step, within --rtol, and the loss must fall.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable

import torch

import fuel_torch
import fuel_torch.nn


@dataclasses.dataclass(frozen=True)
class Ops:
    """The layers and elementwise ops one network is built from."""
    Conv2d: type
    ConvTranspose2d: type
    add: Callable
    sub: Callable
    mul: Callable
    maximum: Callable
    pow: Callable


FUEL = Ops(fuel_torch.nn.Conv2d, fuel_torch.nn.ConvTranspose2d, torch.ops.fuel.add, torch.ops.fuel.sub,
           torch.ops.fuel.mul, torch.ops.fuel.maximum, torch.ops.fuel.pow)
TORCH = Ops(torch.nn.Conv2d, torch.nn.ConvTranspose2d, torch.add, torch.sub, torch.mul, torch.maximum, torch.pow)


class AutoEncoder(torch.nn.Module):
    def __init__(self, ops: Ops, channels: int = 8):
        super().__init__()
        self.ops = ops
        c = channels
        self.down1 = ops.Conv2d(1, c, 3, stride=2, padding=1)            # 16x16 -> 8x8
        self.down2 = ops.Conv2d(c, 2 * c, 3, stride=2, padding=1)        # 8x8 -> 4x4
        self.mix = ops.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2)      # residual block at the bottleneck
        self.up1 = ops.ConvTranspose2d(2 * c, c, 3, stride=2, padding=1, output_padding=1)  # 4x4 -> 8x8
        self.up2 = ops.ConvTranspose2d(c, 1, 3, stride=2, padding=1, output_padding=1)      # 8x8 -> 16x16

    def act(self, x):
        # Leaky ReLU: max(x, 0.1 x).
        return self.ops.maximum(x, self.ops.mul(x, torch.full_like(x, 0.1)))

    def forward(self, x):
        h = self.act(self.down2(self.act(self.down1(x))))
        h = self.ops.add(h, self.act(self.mix(h)))
        return self.up2(self.act(self.up1(h)))

    def loss(self, x):
        diff = self.ops.sub(self(x), x)
        return self.ops.pow(diff, torch.full_like(diff, 2.0)).mean()


def synthetic_images(count: int, seed: int, size: int = 16) -> torch.Tensor:
    """`count` images [1, size, size], each the sum of two Gaussian blobs of random place, width and sign."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.linspace(-1, 1, size)
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    images = torch.zeros(count, 1, size, size)
    for _ in range(2):
        cy, cx = (torch.rand(count, 1, 1, generator=g) * 1.4 - 0.7 for _ in range(2))
        width = torch.rand(count, 1, 1, generator=g) * 0.3 + 0.15
        sign = torch.where(torch.rand(count, 1, 1, generator=g) < 0.8, 1.0, -1.0)
        images[:, 0] += sign * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width ** 2))
    return images


def train(model: AutoEncoder, data: torch.Tensor, steps: int, batch: int, seed: int, lr: float,
          step_fn: Callable | None = None) -> list[float]:
    """Adam on random minibatches (the same sequence for every model given the same seed); the loss per step."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_of = step_fn or model.loss
    losses = []
    for _ in range(steps):
        x = data[torch.randint(len(data), (batch,), generator=g)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def run(steps: int = 300, compile: bool = True, seed: int = 0, batch: int = 32, lr: float = 3e-3,
        backend: str = "inductor", verbose: bool = True) -> dict[str, list[float]]:
    """Train the fuel network eagerly, compiled (optional) and its torch twin; the losses of each run."""
    data = synthetic_images(512, seed)
    torch.manual_seed(seed)
    reference = AutoEncoder(TORCH)
    start = reference.state_dict()

    def fresh(ops):
        model = AutoEncoder(ops)
        model.load_state_dict(start)  # same weights for every run: the state_dicts are interchangeable
        return model

    runs = {}
    plan = [("torch twin", fresh(TORCH), None), ("fuel eager", fresh(FUEL), None)]
    if compile:
        model = fresh(FUEL)
        compiled = torch.compile(model.loss, fullgraph=True, backend=backend)
        plan.append((f"fuel compiled ({backend})", model, compiled))
    for name, model, step_fn in plan:
        runs[name] = train(model, data, steps, batch, seed + 1, lr, step_fn)
    if verbose:
        names = list(runs)
        print("step  " + "  ".join(f"{n:>24}" for n in names))
        for step in sorted({0, steps - 1, *range(0, steps, max(1, steps // 10))}):
            print(f"{step:4d}  " + "  ".join(f"{runs[n][step]:24.6f}" for n in names))
        reference_losses = runs[names[0]]
        for n in names[1:]:
            worst = max(abs(a - b) / abs(b) for a, b in zip(runs[n], reference_losses))
            print(f"{n}: largest relative loss difference from {names[0]} over {steps} steps: {worst:.2e}")
    return runs


def check(runs: dict[str, list[float]], rtol: float) -> list[str]:
    """What is wrong with a set of runs: a loss that did not fall, or runs that disagree at some step."""
    problems = []
    names = list(runs)
    reference = runs[names[0]]
    for name in names:
        losses = runs[name]
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        if not last < 0.5 * first:
            problems.append(f"{name}: the loss did not fall by half ({first:.5f} -> {last:.5f})")
        for step, (a, b) in enumerate(zip(losses, reference)):
            if abs(a - b) > rtol * abs(b):
                problems.append(f"{name} differs from {names[0]} at step {step}: {a:.8f} vs {b:.8f}")
                break
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="allowed relative loss difference per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    runs = run(args.steps, args.compile, args.seed, backend=args.backend)
    problems = check(runs, args.rtol)
    for problem in problems:
        print("FAIL:", problem)
    if not problems:
        losses = runs["fuel eager"]
        print(f"ok: loss {losses[0]:.5f} -> {losses[-1]:.5f}; every run within rtol {args.rtol} of the torch twin "
              f"at every step")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
