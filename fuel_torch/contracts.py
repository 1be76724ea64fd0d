"""FKC contracts: parse, validate and look up the files in contracts/.

A contract file is Markdown with YAML front matter and one fenced ```fkc YAML block per kernel.
Every rule the package enforces (dtypes, layout flags, ranks, shape constraints, the return
clause) is read from these files; nothing else in the package restates them.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import re
from pathlib import Path
from typing import Any, Mapping

import torch
import yaml

from .expr import Expr, ExprError

FKC_DTYPES: Mapping[str, torch.dtype] = {
    "F32": torch.float32,
    "F64": torch.float64,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
}
FKC_NAME = {dtype: name for name, dtype in FKC_DTYPES.items()}
LAYOUT_FLAGS = ("contiguous", "strided", "broadcast_stride0", "start_offset", "reverse_strides", "channels_last")
# Flags a contract may leave out, and the value they then have: channels_last (a 4-d tensor whose
# strides are torch.channels_last's, NHWC in memory) is a layout only some families read.
LAYOUT_DEFAULTS = {"channels_last": "rejected"}
LAYOUT_VALUES = ("required", "rejected", "accepted")

# A contract is a few kilobytes of text; anything far larger is a mistake or an attack on the parser.
MAX_FILE_BYTES = 1 << 20

# Every key a contract may use, per mapping. A key not listed is a typo or a clause this package
# does not enforce, and silently ignoring a clause would let a contract promise what nobody checks.
KNOWN_KEYS: Mapping[str, frozenset[str]] = {
    "front matter": frozenset({"fkc_version", "provider"}),
    "provider": frozenset({"name", "backend", "kernel_source", "link_registry", "revision_base"}),
    "kernel": frozenset({"kernel", "op_kind", "registrable", "blurb", "backend", "kernel_source", "entry_point",
                         "kernel_revision_hash", "accept", "return", "caps", "cost", "precision", "determinism"}),
    "accept": frozenset({"inputs", "op_params"}),
    "input": frozenset({"name", "dtypes", "layout", "rank", "shape_constraint", "optional"}),
    "return": frozenset({"outputs"}),
    "output": frozenset({"name", "dtype_rule", "shape_rule", "layout_guarantee", "aliasing", "allocation"}),
    "caps": frozenset({"awkward_layout_strategy", "fast_paths", "in_place", "alignment_bytes",
                       "access_granularity_bits"}),
    # calibration: the block the Judge's cost_block() folds its measurement into.
    "cost": frozenset({"provenance", "class", "flops", "bytes_moved", "memory", "calibration"}),
    "cost.memory": frozenset({"device_bytes", "host_bytes", "scratch_bytes_per_thread", "disk_bytes"}),
    "precision": frozenset({"bit_stable_on_same_hardware", "max_ulp", "max_relative", "max_absolute", "audited",
                            "notes"}),
}
# The cost formulas, evaluated later by fuel_torch.cost and the Judge: checked at load so that a
# formula that is not plain arithmetic never gets that far.
FORMULA_FIELDS = (("cost", "flops"), ("cost", "bytes_moved"), ("cost.memory", "device_bytes"),
                  ("cost.memory", "host_bytes"), ("cost.memory", "scratch_bytes_per_thread"),
                  ("cost.memory", "disk_bytes"))

_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)
_FKC_BLOCK = re.compile(r"^```fkc\n(.*?)^```", re.S | re.M)


class ContractFormatError(ValueError):
    """A contract file that does not follow the FKC schema; the message names file, kernel, field."""


class _SafeNoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader (plain data only, no Python objects) that also refuses aliases.

    A contract never needs `*alias`, and aliases are what a YAML bomb is made of ("billion laughs":
    a few lines of nested aliases that expand to billions of nodes when walked)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"found alias *{event.anchor}: aliases are not allowed in "
                                              "a contract (write the value out)", event.start_mark)
        return super().compose_node(parent, index)


def _load_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_SafeNoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise ContractFormatError(f"{where}: not valid YAML: {error}") from None
    except RecursionError:
        raise ContractFormatError(f"{where}: not valid YAML: nested too deeply") from None


@dataclasses.dataclass(frozen=True)
class InputClause:
    name: str
    dtypes: tuple[str, ...]
    layout: Mapping[str, str]
    rank: int | None  # None: any rank
    shape_constraint: str | None
    optional: bool

    @property
    def same_as(self) -> str | None:
        """The partner of a `same_as=<input>` shape constraint (the family-generic one)."""
        match = re.fullmatch(r"\s*same_as\s*=\s*(\w+)\s*", self.shape_constraint or "")
        return match.group(1) if match else None


@dataclasses.dataclass(frozen=True)
class OutputClause:
    name: str
    dtype_rule: str
    shape_rule: str
    layout_guarantee: str
    aliasing: str
    allocation: str | None = None  # the allocation rule (convolution.geometry.yaml's `returns` enforce it)


@dataclasses.dataclass(frozen=True)
class Contract:
    kernel: str
    op_kind: str
    entry_point: str
    registrable: bool
    inputs: tuple[InputClause, ...]
    outputs: tuple[OutputClause, ...]
    op_params: Mapping[str, Any]
    caps: Mapping[str, Any]
    cost: Mapping[str, Any]
    precision: Mapping[str, Any]
    determinism: str
    source: str
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @property
    def op(self) -> str:
        """The fuel op this contract describes: entry point `fuel::add` -> `add`."""
        return self.entry_point.split("::", 1)[1]

    @property
    def dtype(self) -> torch.dtype:
        return FKC_DTYPES[self.inputs[0].dtypes[0]]

    def input(self, name: str) -> InputClause:
        return next(clause for clause in self.inputs if clause.name == name)


class ContractSet:
    """The registrable contracts of one directory, indexed by kernel and by (op, dtype)."""

    def __init__(self, contracts: list[Contract], directory: str):
        self.directory = directory
        self.all = tuple(contracts)
        self.registrable = tuple(c for c in contracts if c.registrable)
        self.by_kernel = {c.kernel: c for c in contracts}
        self._by_op: dict[str, list[Contract]] = {}
        for contract in self.registrable:
            self._by_op.setdefault(contract.op, []).append(contract)

    def ops(self) -> list[str]:
        return list(self._by_op)

    def for_op(self, op: str) -> list[Contract]:
        return list(self._by_op.get(op, ()))

    def get(self, op: str, dtype: torch.dtype) -> Contract:
        for contract in self._by_op.get(op, ()):
            if contract.dtype == dtype:
                return contract
        raise KeyError(f"no registrable contract for fuel::{op} in {dtype} under {self.directory}")


class _Fields:
    """Typed access to one kernel block, raising ContractFormatError with file, kernel and field."""

    def __init__(self, source: str, kernel: str):
        self.source, self.kernel = source, kernel

    def fail(self, field: str, problem: str) -> ContractFormatError:
        return ContractFormatError(f"{self.source}: kernel '{self.kernel}': field '{field}': {problem}")

    def get(self, mapping: Any, key: str, path: str, types: tuple[type, ...], default: Any = ...) -> Any:
        field = f"{path}.{key}" if path else key
        if not isinstance(mapping, dict):
            raise self.fail(path or key, f"expected a mapping, got {type(mapping).__name__}")
        if key not in mapping:
            if default is ...:
                raise self.fail(field, "missing")
            return default
        value = mapping[key]
        # YAML booleans are ints in Python: never accept one where a number is meant, or vice versa.
        if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            raise self.fail(field, f"expected {names}, got {value!r}")
        return value

    def known_keys(self, mapping: Any, kind: str, path: str) -> None:
        if not isinstance(mapping, dict):
            raise self.fail(path or kind, f"expected a mapping, got {type(mapping).__name__}")
        for key in mapping:
            if key not in KNOWN_KEYS[kind]:
                field = f"{path}.{key}" if path else str(key)
                raise self.fail(field, f"unknown key {key!r} (known here: {', '.join(sorted(KNOWN_KEYS[kind]))})")

    def formula(self, mapping: dict, key: str, path: str) -> None:
        value = self.get(mapping, key, path, (str, int, float), None)
        if value is None:
            return
        try:
            Expr(value)
        except ExprError as error:
            raise self.fail(f"{path}.{key}", f"not an arithmetic formula: {error}") from None


def _parse_input(f: _Fields, raw: Any, path: str) -> InputClause:
    f.known_keys(raw, "input", path)
    name = f.get(raw, "name", path, (str,))
    dtypes = f.get(raw, "dtypes", path, (list,))
    if not dtypes or any(d not in FKC_DTYPES for d in dtypes):
        raise f.fail(f"{path}.dtypes", f"expected a non-empty list of {sorted(FKC_DTYPES)}, got {dtypes!r}")
    layout = f.get(raw, "layout", path, (dict,))
    required = set(LAYOUT_FLAGS) - set(LAYOUT_DEFAULTS)
    if not required <= set(layout) <= set(LAYOUT_FLAGS):
        raise f.fail(f"{path}.layout", f"expected the flags {sorted(required)} and optionally "
                     f"{sorted(LAYOUT_DEFAULTS)}, got {sorted(layout)}")
    layout = {**LAYOUT_DEFAULTS, **layout}
    for flag, value in layout.items():
        if value not in LAYOUT_VALUES:
            raise f.fail(f"{path}.layout.{flag}", f"expected one of {list(LAYOUT_VALUES)}, got {value!r}")
    rank = f.get(raw, "rank", path, (int, str))
    if rank != "any" and not (isinstance(rank, int) and rank >= 0):
        raise f.fail(f"{path}.rank", f"expected 'any' or a non-negative integer, got {rank!r}")
    return InputClause(
        name=name,
        dtypes=tuple(dtypes),
        layout=dict(layout),
        rank=None if rank == "any" else rank,
        shape_constraint=f.get(raw, "shape_constraint", path, (str, type(None)), None),
        optional=f.get(raw, "optional", path, (bool,), False),
    )


def _parse_output(f: _Fields, raw: Any, path: str) -> OutputClause:
    f.known_keys(raw, "output", path)
    return OutputClause(*(f.get(raw, key, path, (str,)) for key in
                          ("name", "dtype_rule", "shape_rule", "layout_guarantee", "aliasing")),
                        allocation=f.get(raw, "allocation", path, (str,), None))


def _parse_kernel(block: Any, source: str) -> Contract:
    kernel = block.get("kernel", "?") if isinstance(block, dict) else "?"
    f = _Fields(source, str(kernel))
    f.get(block, "kernel", "", (str,))
    f.known_keys(block, "kernel", "")
    registrable = f.get(block, "registrable", "", (bool,), True)
    entry_point = f.get(block, "entry_point", "", (str,))
    if f.get(block, "backend", "", (str,)) != "Cpu":
        raise f.fail("backend", f"expected 'Cpu', got {block['backend']!r}")
    accept = f.get(block, "accept", "", (dict,))
    f.known_keys(accept, "accept", "accept")
    inputs = tuple(_parse_input(f, raw, f"accept.inputs[{i}]")
                   for i, raw in enumerate(f.get(accept, "inputs", "accept", (list,))))
    returns = f.get(block, "return", "", (dict,))
    f.known_keys(returns, "return", "return")
    outputs = tuple(_parse_output(f, raw, f"return.outputs[{i}]")
                    for i, raw in enumerate(f.get(returns, "outputs", "return", (list,))))
    if not inputs or not outputs:
        raise f.fail("accept.inputs" if not inputs else "return.outputs", "must not be empty")
    cost = f.get(block, "cost", "", (dict,))
    f.known_keys(cost, "cost", "cost")
    for key in ("provenance", "class"):
        f.get(cost, key, "cost", (str,))
    for key in ("flops", "bytes_moved"):
        f.get(cost, key, "cost", (str, int, float))
    f.known_keys(f.get(cost, "memory", "cost", (dict,)), "cost.memory", "cost.memory")
    f.get(cost, "calibration", "cost", (dict,), None)
    for kind, key in FORMULA_FIELDS:
        f.formula(cost if kind == "cost" else cost["memory"], key, kind)
    caps = f.get(block, "caps", "", (dict,))
    f.known_keys(caps, "caps", "caps")
    precision = f.get(block, "precision", "", (dict,))
    f.known_keys(precision, "precision", "precision")
    f.get(precision, "bit_stable_on_same_hardware", "precision", (bool,))
    f.get(precision, "max_ulp", "precision", (int, type(None)))
    for key in ("max_relative", "max_absolute"):
        f.get(precision, key, "precision", (int, float, type(None)))
    f.get(precision, "notes", "precision", (str,))
    if registrable:
        if not re.fullmatch(r"fuel::\w+", entry_point):
            raise f.fail("entry_point", f"a registrable kernel names its op as 'fuel::<op>', got {entry_point!r}")
        if len({d for clause in inputs for d in clause.dtypes}) != 1:
            raise f.fail("accept.inputs", "a registrable kernel serves exactly one dtype across its inputs")
    return Contract(
        kernel=kernel,
        op_kind=f.get(block, "op_kind", "", (str,)),
        entry_point=entry_point,
        registrable=registrable,
        inputs=inputs,
        outputs=outputs,
        op_params=f.get(accept, "op_params", "accept", (dict,)),
        caps=caps,
        cost=cost,
        precision=precision,
        determinism=f.get(block, "determinism", "", (str,)),
        source=source,
        raw=block,
    )


def parse_fkc(text: str, source: str) -> list[Contract]:
    """Every kernel block of one FKC file, validated."""
    if len(text) > MAX_FILE_BYTES:
        raise ContractFormatError(f"{source}: {len(text)} characters, more than a contract file may hold "
                                  f"({MAX_FILE_BYTES})")
    front = _FRONT_MATTER.match(text)
    if not front:
        raise ContractFormatError(f"{source}: missing the '---' YAML front matter")
    header = _load_yaml(front.group(1), f"{source}: front matter")
    if not isinstance(header, dict) or header.get("fkc_version") != 1:
        raise ContractFormatError(f"{source}: front matter: field 'fkc_version': expected 1")
    for key in header:
        if key not in KNOWN_KEYS["front matter"]:
            raise ContractFormatError(f"{source}: front matter: field {key!r}: unknown key "
                                      f"(known here: {', '.join(sorted(KNOWN_KEYS['front matter']))})")
    provider = header.get("provider", {})
    if not isinstance(provider, dict) or not set(provider) <= KNOWN_KEYS["provider"]:
        raise ContractFormatError(f"{source}: front matter: field 'provider': expected a mapping with keys among "
                                  f"{', '.join(sorted(KNOWN_KEYS['provider']))}")
    contracts = []
    for number, match in enumerate(_FKC_BLOCK.finditer(text), start=1):
        block = _load_yaml(match.group(1), f"{source}: fkc block {number}")
        contracts.append(_parse_kernel(block, source))
    if not contracts:
        raise ContractFormatError(f"{source}: no ```fkc blocks")
    return contracts


def _default_directory() -> Path:
    return Path(str(importlib.resources.files("fuel_torch._contract_files")))


def load_contracts(directory: str | Path | None = None) -> ContractSet:
    """Parse every *.fkc.md under `directory` (default: the contracts shipped with fuel_torch)."""
    directory = Path(directory) if directory is not None else _default_directory()
    files = sorted(directory.glob("*.fkc.md"))
    if not files:
        raise ContractFormatError(f"{directory}: no *.fkc.md contract files")
    contracts: list[Contract] = []
    seen: dict[str, str] = {}
    for path in files:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ContractFormatError(f"{path}: {path.stat().st_size} bytes, more than a contract file may hold "
                                      f"({MAX_FILE_BYTES})")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ContractFormatError(f"{path}: not UTF-8 text ({error})") from None
        for contract in parse_fkc(text, str(path)):
            if contract.kernel in seen:
                raise ContractFormatError(f"{path}: kernel '{contract.kernel}': field 'kernel': "
                                          f"already defined in {seen[contract.kernel]}")
            seen[contract.kernel] = str(path)
            contracts.append(contract)
    pairs = [(c.op, c.dtype) for c in contracts if c.registrable]
    for pair in set(pairs):
        if pairs.count(pair) > 1:
            raise ContractFormatError(f"{directory}: two registrable contracts serve fuel::{pair[0]} in {pair[1]}")
    return ContractSet(contracts, str(directory))


@functools.cache
def installed() -> ContractSet:
    """The contracts shipped with the package: the ones the kernels enforce."""
    return load_contracts()


def contract(op: str, dtype: torch.dtype) -> Contract:
    """The installed contract of fuel::`op` for `dtype`, e.g. contract("add", torch.float32)."""
    return installed().get(op, dtype)


def rules_for_cpp(contracts: ContractSet) -> list[dict]:
    """The accept/return clauses in the shape fuel_torch._C.install_rules takes."""
    return [
        {
            "kernel": c.kernel,
            "op": c.op,
            "dtype": c.inputs[0].dtypes[0],
            "dtype_rule": c.outputs[0].dtype_rule,
            "shape_rule": c.outputs[0].shape_rule,
            "layout_guarantee": c.outputs[0].layout_guarantee,
            "aliasing": c.outputs[0].aliasing,
            "inputs": [
                {
                    "name": i.name,
                    "dtypes": list(i.dtypes),
                    "layout": dict(i.layout),
                    "rank": -1 if i.rank is None else i.rank,
                    "optional": i.optional,
                    "same_as": i.same_as or "",
                }
                for i in c.inputs
            ],
        }
        for c in contracts.registrable
    ]
