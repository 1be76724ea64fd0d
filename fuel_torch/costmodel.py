"""`fuel_torch.cost(op, *args, **kwargs)`: the predicted cost of one fuel call, without running it.

The contract's formula hints (`flops`, `bytes_moved`, `memory.host_bytes`) are evaluated over the
call's sizes with the safe evaluator of fuel_torch.expr. When a calibration exists (written by
`python -m fuel_torch judge`), seconds are predicted from it: the kernel's measured launch overhead
plus bytes (or flops) over its achieved rate, plus, under `layout_policy("contiguize")`, one copy
per operand the policy would materialize, at the machine's measured copy rate. Without a
calibration `seconds` is None and only the formula values are given.

The calibration file is `$FUEL_TORCH_CALIBRATION` if set, else
`$XDG_CACHE_HOME/fuel_torch/calibration.json` (default `~/.cache/fuel_torch/calibration.json`). It
holds one cost model per machine key (CPU model and capability level, see `machine_key`), so
machines and venvs sharing a home directory keep their own; `cost` reads the running machine's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from . import layout
from .contracts import installed
from .expr import Dims, Expr

CALIBRATION_ENV = "FUEL_TORCH_CALIBRATION"
CALIBRATION_FORMAT = "fuel-torch-calibration/2"  # one machine's cost model
CALIBRATION_FILE_FORMAT = "fuel-torch-calibrations/2"  # the file: one cost model per machine key


def calibration_path() -> Path:
    if os.environ.get(CALIBRATION_ENV):
        return Path(os.environ[CALIBRATION_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "fuel_torch" / "calibration.json"


@functools.cache
def machine_key() -> str:
    """Which cost model applies here: "<CPU model>|<torch capability>", plus "|fuel <level>" where
    the fuel kernels choose their own level at run time. Machines or venvs sharing one calibration
    file (a shared home directory) each read and write their own entry."""
    import fuel_torch  # noqa: PLC0415 - at call time: this module is imported while fuel_torch loads

    from .timing import cpu_model  # noqa: PLC0415 - torch.utils.benchmark stays out of `import fuel_torch`

    key = f"{cpu_model()}|{torch.backends.cpu.get_cpu_capability()}"
    if hasattr(fuel_torch, "cpu_capability"):
        key += f"|fuel {fuel_torch.cpu_capability()}"
    return key


_read_cache: dict[Path, tuple[tuple[int, int], dict]] = {}


def load_calibrations(path: str | Path | None = None) -> dict[str, dict]:
    """Every machine's cost model stored in `path` (a calibration file, or a judge.json), by key."""
    path = Path(path) if path is not None else calibration_path()
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if path in _read_cache and _read_cache[path][0] == stamp:  # fuel_torch.cost runs per planned call
            return _read_cache[path][1]
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if isinstance(data, dict) and data.get("format") == CALIBRATION_FILE_FORMAT:
        entries = data.get("machines", {})
    elif isinstance(data, dict):  # a judge.json carries one machine's entry
        one = data.get("calibration", data)
        entries = {one.get("key"): one} if isinstance(one, dict) else {}
    else:
        entries = {}
    entries = {k: v for k, v in entries.items()
               if isinstance(k, str) and isinstance(v, dict) and v.get("format") == CALIBRATION_FORMAT}
    _read_cache[path] = (stamp, entries)
    return entries


def load_calibration(path: str | Path | None = None, key: str | None = None) -> dict | None:
    """The stored cost model of this machine (or of `key`), or None when there is none."""
    return load_calibrations(path).get(key or machine_key())


@contextlib.contextmanager
def _locked(path: Path):
    """Serialize read-modify-write of the file between processes (two judges finishing at once)."""
    try:
        import fcntl  # noqa: PLC0415 - POSIX only
    except ImportError:  # elsewhere the atomic rename still keeps the file whole
        yield
        return
    with open(path.with_name(path.name + ".lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def save_calibration(calibration: dict, path: str | Path | None = None) -> Path:
    """Store one machine's cost model under its key (calibration["key"]), leaving other machines'
    entries alone and keeping this machine's other kernels when measured with the same torch."""
    path = Path(path) if path is not None else calibration_path()
    key = calibration.get("key") or machine_key()
    calibration = {**calibration, "key": key}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        _read_cache.pop(path, None)
        entries = dict(load_calibrations(path))
        old = entries.get(key)
        if old and old.get("torch") == calibration.get("torch"):
            calibration = {**calibration, "kernels": {**old.get("kernels", {}), **calibration.get("kernels", {})}}
        entries[key] = calibration
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as f:
            json.dump({"format": CALIBRATION_FILE_FORMAT, "machines": entries}, f, indent=2)
        os.replace(f.name, path)
    return path


@dataclasses.dataclass(frozen=True)
class Cost:
    """Predicted cost of one call. `seconds` is None when no calibration covers the kernel."""

    op: str
    kernel: str
    seconds: float | None
    kernel_seconds: float | None
    copy_seconds: float | None
    flops: float
    bytes_moved: float
    host_bytes: float
    copies: tuple[tuple[str, int], ...]  # (argument, elements) the contiguize policy would copy
    basis: str


def bind(op: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Arguments of a fuel op by schema name, defaults filled in."""
    schema = getattr(torch.ops.fuel, op).default._schema
    bound: dict[str, Any] = {}
    positional = list(args)
    for argument in schema.arguments:
        if positional and not argument.kwarg_only:
            bound[argument.name] = positional.pop(0)
        elif argument.name in kwargs:
            bound[argument.name] = kwargs.pop(argument.name)
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            raise TypeError(f"fuel::{op}: missing argument '{argument.name}'")
    if positional or kwargs:
        raise TypeError(f"fuel::{op}: unexpected arguments {positional or sorted(kwargs)}")
    return bound


def formula_names(op: str, bound: dict[str, Any], out_shape, dtype: torch.dtype) -> dict[str, Any]:
    """What a cost formula may name: each tensor argument (.numel, .dim[i]; an absent optional has
    no elements), each int or int-list parameter, `out`, and `dtype_bytes`."""
    names: dict[str, Any] = {"out": Dims(tuple(out_shape)), "dtype_bytes": torch.empty((), dtype=dtype).element_size()}
    for argument in getattr(torch.ops.fuel, op).default._schema.arguments:
        value, kind = bound.get(argument.name), str(argument.type)
        if "Tensor" in kind:
            names[argument.name] = Dims(tuple(value.shape)) if value is not None else Dims((0,))
        elif kind == "List[int]":
            n = getattr(argument, "N", None) or 1
            names[argument.name] = (int(value),) * n if isinstance(value, int) else tuple(int(v) for v in value)
        elif kind == "int":
            names[argument.name] = int(value)
    return names


def formula_values(contract, names: dict[str, Any]) -> dict[str, float]:
    memory = contract.cost.get("memory", {})
    return {
        "flops": Expr(contract.cost["flops"]).evaluate(names),
        "bytes_moved": Expr(contract.cost["bytes_moved"]).evaluate(names),
        "host_bytes": Expr(memory.get("host_bytes", 0)).evaluate(names),
    }


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with t's shape, strides and offset, so the contract check sees t's layout."""
    if t.device.type == "meta":
        return t
    span = 1 + t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return torch.as_strided(torch.empty(max(span, 1), dtype=t.dtype, device="meta"), t.shape, t.stride(), t.storage_offset())


def predict(entry: dict, values: dict[str, float]) -> float:
    """Seconds from one calibration entry: launch overhead + amount / achieved rate."""
    return entry["launch_overhead_s"] + values[entry["basis"]] / entry["per_second"]


def cost(op: str, *args: Any, **kwargs: Any) -> Cost:
    """Predicted cost of `fuel_torch.<op>(*args, **kwargs)` (or torch.ops.fuel.<op>) on this machine.

    Raises the contract's own error for a call the kernel would reject under the current layout
    policy (strict by default)."""
    from . import elementwise  # noqa: PLC0415 - the family decides whether the policy broadcasts

    if not hasattr(torch.ops.fuel, op):
        raise ValueError(f"fuel_torch.cost: no fuel op named {op!r}")
    bound = bind(op, args, dict(kwargs))
    tensor_names = [name for name, v in bound.items() if isinstance(v, torch.Tensor)]
    tensors = [bound[name] for name in tensor_names]
    copies: list[tuple[str, int]] = []
    if layout.current_policy() == "contiguize":
        target = None
        if op in elementwise.OPS and len({t.dtype for t in tensors}) == 1:
            target = torch.broadcast_shapes(*(t.shape for t in tensors))
        prepared = {}
        for name, t in zip(tensor_names, tensors):
            shape = target if target is not None else t.shape
            if tuple(shape) != tuple(t.shape) or layout.needs_copy(t):
                copies.append((name, math.prod(shape)))
            prepared[name] = torch.empty(shape, dtype=t.dtype, device="meta")
    else:
        prepared = {name: _meta_like(t) for name, t in zip(tensor_names, tensors)}
    meta_bound = {**bound, **prepared}
    out = getattr(torch.ops.fuel, op).default(*meta_bound.values())  # the contract check, on shapes only
    dtype = tensors[0].dtype
    contract = installed().get(op, dtype)
    values = formula_values(contract, formula_names(op, meta_bound, out.shape, dtype))
    key = machine_key()
    calibration = load_calibration(key=key)
    entry = (calibration or {}).get("kernels", {}).get(contract.kernel)
    kernel_seconds = copy_seconds = seconds = None
    if entry:
        kernel_seconds = predict(entry, values)
        copy = calibration["contiguize"]
        element = torch.empty((), dtype=dtype).element_size()
        copy_seconds = sum(copy["launch_overhead_s"] + 2 * n * element / copy["per_second"] for _, n in copies)
        seconds = kernel_seconds + copy_seconds
        basis = (f"judge_measured calibration {calibration_path()} ({calibration.get('created', '?')}, "
                 f"{calibration.get('machine', {}).get('cpu', '?')}, torch {calibration.get('torch', '?')})")
    else:
        basis = (f"formula hints of {contract.kernel} only: no calibration for it on this machine ({key}) at "
                 f"{calibration_path()} (run `python -m fuel_torch judge`)")
    return Cost(op=op, kernel=contract.kernel, seconds=seconds, kernel_seconds=kernel_seconds, copy_seconds=copy_seconds,
                flops=values["flops"], bytes_moved=values["bytes_moved"], host_bytes=values["host_bytes"],
                copies=tuple(copies), basis=basis)
