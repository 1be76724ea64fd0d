"""Hostile calls into torch.ops.fuel.*: each raises a Python exception, never crashes, never passes.

Every call runs in a child process (a segfault or abort is a test failure naming the call, not a
dead test run). Calls are batched, many per child, to keep this fast: the child reports each
outcome as it goes, and after a crash the parent starts a new child at the next call, so one run
lists every call that crashes.

Categories: None and non-tensors for every tensor argument; sizes and parameters near 2**63;
zero-size dimensions everywhere (these must compute, with the right shape); every invalid layout;
meta tensors and other layouts (sparse, mkldnn, quantized, nested); out= aliasing in every form;
integer, bool, complex and other dtypes; contract files with missing or wrong clauses (rejected at
load), and a permissive rule table installed into the kernels (what the kernels can read still wins).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fuel_torch  # noqa: F401  (registers torch.ops.fuel.*)

ELEMENTWISE = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem")
CONV = ("conv2d", "conv_transpose2d")
BIG = 2**63 - 1
ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError, OverflowError)

# Expectations: "contract" = RuntimeError starting "fuel::<op> ["; "names_op" = one of ERRORS whose
# message names the op; "raises" = one of ERRORS (None arguments: torch 2.13's dispatcher says
# "Unimplemented scalar type" without naming the op; branch `autograd` fixes the message);
# "returns" = must compute, and the check function (called on the result) must hold.


def _t(*shape, dtype=torch.float32):
    return torch.arange(1, 1 + torch.Size(shape).numel(), dtype=torch.float64).reshape(shape).to(dtype)


def _elementwise_calls():
    a, b = _t(6), _t(6)
    calls = []
    hostile_values = {"None": None, "float": 1.0, "int": 3, "bool": True, "str": "x", "list": [1.0] * 6,
                      "tuple": (1.0,), "object": object(), "numpy": a.numpy(), "storage": a.untyped_storage()}
    for op in ELEMENTWISE:
        packet = getattr(torch.ops.fuel, op)
        for label, value in hostile_values.items():
            kind = "raises" if value is None else "names_op"
            calls.append((f"{op}(lhs={label})", kind, op, lambda p=packet, v=value: p(v, b)))
            calls.append((f"{op}(rhs={label})", kind, op, lambda p=packet, v=value: p(a, v)))
            calls.append((f"{op}.out(out={label})", kind, op, lambda p=packet, v=value: p.out(a, b, out=v)))
        calls.append((f"{op}(no args)", "names_op", op, lambda p=packet: p()))
        calls.append((f"{op}(3 args)", "names_op", op, lambda p=packet: p(a, b, a)))
        # Integer, bool, complex and other dtypes: every one refused by the dtype clause.
        for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
                      torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16):
            calls.append((f"{op}({dtype})", "contract", op,
                          lambda p=packet, d=dtype: p(torch.ones(4).to(d), torch.ones(4).to(d))))
        calls.append((f"{op}(quantized)", "names_op", op, lambda p=packet: p(
            torch.quantize_per_tensor(a, 0.1, 0, torch.qint8), torch.quantize_per_tensor(b, 0.1, 0, torch.qint8))))
        # Other layouts and devices.
        calls.append((f"{op}(sparse)", "names_op", op, lambda p=packet: p(a.to_sparse(), b.to_sparse())))
        calls.append((f"{op}(sparse_csr)", "names_op", op,
                      lambda p=packet: p(a.reshape(2, 3).to_sparse_csr(), b.reshape(2, 3).to_sparse_csr())))
        calls.append((f"{op}(mkldnn)", "names_op", op, lambda p=packet: p(a.to_mkldnn(), b.to_mkldnn())))
        calls.append((f"{op}(nested)", "names_op", op, lambda p=packet: p(
            torch.nested.nested_tensor([a, a[:3].clone()]), torch.nested.nested_tensor([b, b[:3].clone()]))))
        calls.append((f"{op}(cpu, meta)", "contract", op, lambda p=packet: p(a, b.to("meta"))))
        calls.append((f"{op}(meta, cpu)", "contract", op, lambda p=packet: p(a.to("meta"), b)))
        calls.append((f"{op}.out(meta out)", "contract", op, lambda p=packet: p.out(a, b, out=torch.empty(6, device="meta"))))
        # Every invalid layout, on each operand and on out.
        grid = _t(2, 3)
        views = {"transposed": grid.t().contiguous().t(), "step": _t(12)[::2].reshape(2, 3),
                 "expanded": _t(3).expand(2, 3), "offset": _t(7)[1:].reshape(2, 3),
                 "channels_last": _t(1, 2, 1, 3).contiguous(memory_format=torch.channels_last).reshape(2, 3),
                 "huge_expanded": _t(1).expand(2**40, 2**20)}
        for label, view in views.items():
            other = _t(*view.shape) if view.numel() < 10**6 else _t(1).expand(view.shape)
            calls.append((f"{op}(lhs {label})", "contract", op, lambda p=packet, v=view, o=other: p(v, o)))
            calls.append((f"{op}(rhs {label})", "contract", op, lambda p=packet, v=view, o=other: p(o, v)))
        for label, out in {"step": torch.empty(12)[::2], "offset": torch.empty(7)[1:],
                           "expanded": torch.empty(1).expand(6), "2d": torch.empty(2, 3), "5": torch.empty(5),
                           "f64": torch.empty(6, dtype=torch.float64), "int": torch.empty(6, dtype=torch.int32)}.items():
            calls.append((f"{op}.out(out {label})", "contract", op, lambda p=packet, o=out: p.out(a, b, out=o)))
        # out= aliasing in every form.
        shared = torch.empty(6)
        alias_forms = {
            "out is lhs": lambda p: p.out(a, b, out=a),
            "out is rhs": lambda p: p.out(a, b, out=b),
            "out is lhs is rhs": lambda p: p.out(a, a, out=a),
            "out views lhs": lambda p: p.out(a, b, out=a.view(6)),
            "out views rhs reshaped": lambda p: p.out(a.view(2, 3), b.view(2, 3), out=b.view(2, 3)),
            "out shares lhs storage": lambda p: p.out(a, b, out=torch.empty(0).set_(a.untyped_storage(), 0, (6,))),
            "out over a larger lhs storage": lambda p: p.out(shared[:3], b[:3].clone(), out=shared[:3]),
        }
        for label, call in alias_forms.items():
            calls.append((f"{op}.out({label})", "contract", op, lambda p=packet, c=call: c(p)))
        # Zero-size dimensions everywhere: computed, with the operands' shape.
        for shape in [(0,), (0, 3), (3, 0), (2, 0, 4), (1, 1, 0, 1, 1, 1), (0, 0, 0, 0, 0, 0)]:
            calls.append((f"{op}({shape})", "returns", op,
                          lambda p=packet, s=shape: p(torch.empty(s), torch.empty(s)),
                          lambda r, s=shape: r.shape == s))
            calls.append((f"{op}.out({shape})", "returns", op,
                          lambda p=packet, s=shape: p.out(torch.empty(s), torch.empty(s), out=torch.empty(s)),
                          lambda r, s=shape: r.shape == s))
        calls.append((f"{op}(empty vs 1)", "contract", op, lambda p=packet: p(torch.empty(0), torch.empty(1))))
        calls.append((f"{op}(lhs is rhs)", "returns", op, lambda p=packet: p(a, a), lambda r: r.shape == (6,)))
        # Sizes near 2**63 through meta tensors (shape inference only: nothing is allocated).
        calls.append((f"{op}(meta 2**60)", "returns", op,
                      lambda p=packet: p(torch.empty(2**60, device="meta"), torch.empty(2**60, device="meta")),
                      lambda r: r.shape == (2**60,) and r.device.type == "meta"))
        calls.append((f"{op}(meta 2**60 vs 2**60-1)", "contract", op,
                      lambda p=packet: p(torch.empty(2**60, device="meta"), torch.empty(2**60 - 1, device="meta"))))
    return calls


def _conv_calls():
    calls = []
    x, w2, wt, bias = _t(1, 4, 6, 6), _t(4, 4, 3, 3), _t(4, 4, 3, 3), _t(4)
    for op in CONV:
        packet = getattr(torch.ops.fuel, op)
        w = w2 if op == "conv2d" else wt
        for label, value in {"None": None, "float": 1.0, "str": "x", "list": [1.0], "object": object(),
                             "numpy": x.numpy()}.items():
            kind = "raises" if value is None else "names_op"
            calls.append((f"{op}(x={label})", kind, op, lambda p=packet, v=value, w=w: p(v, w)))
            calls.append((f"{op}(weight={label})", kind, op, lambda p=packet, v=value: p(x, v)))
            if value is not None:
                calls.append((f"{op}(bias={label})", "names_op", op, lambda p=packet, v=value, w=w: p(x, w, v)))
            calls.append((f"{op}.out(out={label})", kind, op, lambda p=packet, v=value, w=w: p.out(x, w, out=v)))
        # Parameters of the wrong kind, and near or beyond 2**63.
        params = ["stride", "padding", "dilation", "groups"] + (["output_padding"] if op == "conv_transpose2d" else [])
        for name in params:
            # In int64: valid (a huge stride can be, in conv2d) or the contract's error; beyond it, or
            # not an int: the schema's or the contract's error, naming the op.
            for value in (BIG, -BIG - 1, 2**62, 0, -1, 2**63, -(2**64), [1, 2, 3], [], "same", 1.5, [1.5, 1]):
                if name == "groups" and isinstance(value, list):
                    continue
                kind = "contract_or_returns" if isinstance(value, int) and -2**63 <= value < 2**63 else "names_op"
                calls.append((f"{op}({name}={value!r})", kind, op,
                              lambda p=packet, n=name, v=value, w=w: p(x, w, bias, **{n: v}),
                              lambda r: r.dim() == 4))
        calls.append((f"{op}(groups=None)", "names_op", op, lambda p=packet, w=w: p(x, w, bias, groups=None)))
        # Sizes near 2**63 through meta tensors and empty CPU tensors (nothing allocated).
        # An empty batch still needs its other strides within int64 (our rule; README).
        huge = torch.empty(0, 1, 2**31, 2**31)
        calls.append((f"{op}(empty batch, 2**31 x 2**31 input)", "contract", op,
                      lambda p=packet: p(huge, torch.ones(1, 1, 1, 1))))
        calls.append((f"{op}(empty batch, 2**20 x 2**20 input)", "returns", op,
                      lambda p=packet: p(torch.empty(0, 1, 2**20, 2**20), torch.ones(1, 1, 1, 1)),
                      lambda r: r.shape == (0, 1, 2**20, 2**20)))
        calls.append((f"{op}(meta, huge input, stride 2**62)", "contract_or_returns", op,
                      lambda p=packet: p(torch.empty(2**20, 1, 2**20, 2**20, device="meta"),
                                         torch.empty(1, 1, 2**10, 2**10, device="meta"), stride=2**62),
                      lambda r: r.device.type == "meta"))
        calls.append((f"{op}(meta, output beyond int64)", "contract", op,
                      lambda p=packet: p(torch.empty(2**20, 2, 2**19, 2**19, device="meta"),
                                         torch.empty(2, 2, 1, 1, device="meta"), padding=2**40)))
        # Ranks, dtypes, devices, layouts.
        for label, bad_x in {"rank 3": _t(4, 6, 6), "rank 5": _t(1, 4, 6, 6, 1), "rank 0": torch.tensor(1.0),
                             "int32": x.int(), "bool": x.bool(), "complex": x.to(torch.complex64),
                             "f64 x, f32 w": x.double(), "meta x": x.to("meta"), "transposed": x.transpose(2, 3),
                             # channels_last itself is accepted; a permuted channels_last tensor is neither layout.
                             "channels_last transposed": x.contiguous(memory_format=torch.channels_last).transpose(2, 3),
                             "offset": _t(1 + x.numel())[1:].reshape(x.shape), "expanded": _t(1, 4, 1, 1).expand(1, 4, 6, 6),
                             "sparse": x.to_sparse(), "mkldnn": x.to_mkldnn()}.items():
            kind = "contract" if label not in ("sparse", "mkldnn") else "names_op"
            calls.append((f"{op}(x {label})", kind, op, lambda p=packet, v=bad_x, w=w: p(v, w)))
        for label, bad_w in {"rank 3": _t(4, 4, 3), "transposed": w.transpose(2, 3),
                             "channels_last transposed": w.contiguous(memory_format=torch.channels_last).transpose(2, 3),
                             "expanded": _t(1, 4, 3, 3).expand(4, 4, 3, 3), "half": w.half()}.items():
            calls.append((f"{op}(weight {label})", "contract", op, lambda p=packet, v=bad_w: p(x, v)))
        for label, bad_b in {"rank 2": _t(4, 1), "length 5": _t(5), "step": _t(8)[::2], "f64": bias.double(),
                             "meta": bias.to("meta"), "expanded": _t(1).expand(4)}.items():
            calls.append((f"{op}(bias {label})", "contract", op, lambda p=packet, v=bad_b, w=w: p(x, w, v)))
        # Zero-size dimensions everywhere.
        zero_cases = {
            "N=0": (torch.empty(0, 4, 6, 6), w, None),
            "Cin=0": (torch.empty(1, 0, 6, 6), torch.empty(4, 0, 3, 3) if op == "conv2d" else torch.empty(0, 4, 3, 3),
                      None),
            "Cout=0": (x, torch.empty(0, 4, 3, 3) if op == "conv2d" else torch.empty(4, 0, 3, 3), torch.empty(0)),
            "H=0 padded": (torch.empty(1, 4, 0, 6), w, None),
        }
        for label, (zx, zw, zb) in zero_cases.items():
            padding = 2 if (label == "H=0 padded" and op == "conv2d") else 0
            expected = None
            if op == "conv2d":
                expected = (zx.shape[0], zw.shape[0], zx.shape[2] + 2 * padding - 2, zx.shape[3] + 2 * padding - 2)
            else:
                expected = (zx.shape[0], zw.shape[1], zx.shape[2] + 2, zx.shape[3] + 2)
            kind = "returns" if expected[2] >= 1 else "contract"
            calls.append((f"{op}({label})", kind, op,
                          lambda p=packet, a=zx, b=zw, c=zb, pad=padding: p(a, b, c, padding=pad),
                          lambda r, e=expected: tuple(r.shape) == e))
        calls.append((f"{op}(kernel 0x3)", "contract", op,
                      lambda p=packet, w=w: p(x, torch.empty(w.shape[0], w.shape[1], 0, 3))))
        # out= in every wrong form, aliasing included (a 1x1 kernel keeps x's shape, so out=x is well shaped).
        same, ones = _t(1, 4, 4, 4), torch.ones(4, 4, 1, 1)
        tiny_x, tiny_w, tiny_b = _t(1, 1, 1, 1), _t(1, 1, 1, 1), _t(1)
        out_cases = {
            "out is x": (same, ones, None, same),
            "out views x": (same, ones, None, same.view(1, 4, 4, 4)),
            "out is weight": (tiny_x, tiny_w, None, tiny_w),
            "out shares bias storage": (tiny_x, tiny_w, tiny_b,
                                        torch.empty(0).set_(tiny_b.untyped_storage(), 0, (1, 1, 1, 1))),
            "out is x is weight": (tiny_x, tiny_x, None, tiny_x),
            "wrong shape": (x, w, None, torch.empty(1, 4, 5, 5)),
            "wrong dtype": (same, ones, None, torch.empty(1, 4, 4, 4, dtype=torch.float64)),
            "channels_last transposed out": (same, ones, None,
                                             torch.empty(1, 4, 4, 4).contiguous(memory_format=torch.channels_last)
                                             .transpose(2, 3)),
            "offset out": (same, ones, None, torch.empty(1 + 64)[1:].view(1, 4, 4, 4)),
            "expanded out": (same, ones, None, torch.empty(1, 4, 4, 1).expand(1, 4, 4, 4)),
            "meta out": (same, ones, None, torch.empty(1, 4, 4, 4, device="meta")),
        }
        for label, (cx, cw, cb, out) in out_cases.items():
            calls.append((f"{op}.out({label})", "contract", op,
                          lambda p=packet, a=cx, b=cw, c=cb, o=out: p.out(a, b, c, out=o)))
    return calls


def hostile_calls():
    return _elementwise_calls() + _conv_calls()


def _run_in_child(start: int) -> None:
    """Child side: run hostile_calls()[start:], one JSON line per outcome, flushed before the next."""
    import fuel_torch  # noqa: F401  (registers the ops)

    calls = hostile_calls()
    for index in range(start, len(calls)):
        name, kind, op, call, *check = calls[index]
        print(json.dumps({"index": index, "started": True}), flush=True)
        record = {"index": index}
        try:
            result = call()
        except BaseException as error:  # noqa: BLE001 - the parent judges every outcome
            record.update(raised=type(error).__name__, message=str(error)[:600],
                          allowed=isinstance(error, ERRORS))
        else:
            record.update(returned=type(result).__name__,
                          check=bool(check[0](result)) if check else None)
        print(json.dumps(record), flush=True)


def run_batch(function: str) -> tuple[list[dict], list[str]]:
    """Run a child entry point of this module until every call has an outcome; crashes are reported
    with the name of the call that was running."""
    outcomes, crashes, start = [], [], 0
    while True:
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import {Path(__file__).stem} as m; m.{function}({start})")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, PYTHONFAULTHANDLER="1"), cwd=Path(__file__).parent)
        started = None
        for line in run.stdout.splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("started"):
                started = record["index"]
            else:
                outcomes.append(record)
                started = None
        if run.returncode == 0:
            return outcomes, crashes
        if started is None:
            raise AssertionError(f"child failed outside any call (exit {run.returncode}):\n{run.stderr[-3000:]}")
        crashes.append(f"call {started} crashed the process (exit {run.returncode}): {run.stderr[-800:]}")
        start = started + 1


def judge(calls, outcomes) -> list[str]:
    problems = []
    seen = {o["index"] for o in outcomes}
    for index, (name, kind, op, *_rest) in enumerate(calls):
        if index not in seen:
            continue
        o = next(o for o in outcomes if o["index"] == index)
        if kind == "contract_or_returns" and "returned" in o:
            if o["check"] is False:
                problems.append(f"{name}: computed a wrong result")
            continue
        if kind == "returns":
            if "raised" in o:
                problems.append(f"{name}: must compute, raised {o['raised']}: {o['message']}")
            elif o["check"] is False:
                problems.append(f"{name}: computed a wrong result")
            continue
        if "returned" in o:
            problems.append(f"{name}: silently accepted (returned {o['returned']})")
            continue
        if not o["allowed"]:
            problems.append(f"{name}: raised {o['raised']}, not a Python error a caller can handle: {o['message']}")
        elif kind in ("contract", "contract_or_returns") and not (o["raised"] in ("RuntimeError", "ContractViolation")
                                         and o["message"].startswith(f"fuel::{op} [")):
            problems.append(f"{name}: expected the contract error of fuel::{op}, got {o['raised']}: {o['message']}")
        elif kind == "names_op" and op not in o["message"]:
            problems.append(f"{name}: the message does not name {op}: {o['raised']}: {o['message']}")
    return problems


def test_hostile_calls_raise_and_never_crash():
    calls = hostile_calls()
    assert len(calls) > 500
    outcomes, crashes = run_batch("_run_in_child")
    assert not crashes, "\n".join(crashes)
    assert {o["index"] for o in outcomes} == set(range(len(calls)))
    problems = judge(calls, outcomes)
    assert not problems, f"{len(problems)} of {len(calls)} hostile calls misbehave:\n" + "\n".join(problems[:40])


def test_a_crash_in_a_child_is_reported_with_the_call():
    """The harness itself: a call that kills its process is reported by name, and the rest still run."""
    outcomes, crashes = run_batch("_crash_demo")
    assert len(crashes) == 1 and "call 1 crashed" in crashes[0]
    assert sorted(o["index"] for o in outcomes) == [0, 2]


def _crash_demo(start: int) -> None:
    for index in range(start, 3):
        print(json.dumps({"index": index, "started": True}), flush=True)
        if index == 1:
            os.abort()
        print(json.dumps({"index": index, "returned": "None", "check": None}), flush=True)


# ---------------------------------------------------------------------------------------------
# Contract files with missing or wrong clauses: refused at load, before the kernels see them.

CONTRACT_EDITS = {
    "layout missing": ("      layout: { contiguous: required, strided: rejected, broadcast_stride0: rejected, "
                       "start_offset: rejected, reverse_strides: rejected }\n", ""),
    "dtypes missing": ("      dtypes: [F32]\n", ""),
    "return missing": ("return:\n  outputs:\n    - name: out\n", "results:\n  outputs:\n    - name: out\n"),
    "layout flag misspelt": ("strided: rejected", "strided_ok: rejected"),
    "layout value wrong": ("start_offset: rejected", "start_offset: sometimes"),
    "dtype unknown": ("dtypes: [F32]", "dtypes: [F8]"),
    "two dtypes": ("dtypes: [F32]", "dtypes: [F32, F64]"),
    "entry point not fuel": ('entry_point: "fuel::add"', 'entry_point: "aten::add"'),
    "rank negative": ("rank: any", "rank: -1"),
    "aliasing missing": ("      aliasing: none\n", ""),
    "formula executes": ('flops: "lhs.numel"', 'flops: "__import__(\'os\').getpid()"'),
}


def _load_edited_contracts(start: int) -> None:
    """Child side: each CONTRACT_EDITS entry applied to add_f32 in a fresh copy, then loaded."""
    import shutil
    import tempfile

    import fuel_torch

    names = sorted(CONTRACT_EDITS)
    for index in range(start, len(names)):
        print(json.dumps({"index": index, "started": True}), flush=True)
        old, new = CONTRACT_EDITS[names[index]]
        with tempfile.TemporaryDirectory() as directory:
            target = Path(directory) / "c"
            shutil.copytree(fuel_torch.installed().directory, target, ignore=shutil.ignore_patterns("*.py", "__py*"))
            path = target / "elementwise.fkc.md"
            text = path.read_text()
            start_at = text.index("kernel: add_f32\n")
            end_at = text.index("```", start_at)
            assert old in text[start_at:end_at], names[index]
            path.write_text(text[:start_at] + text[start_at:end_at].replace(old, new, 1) + text[end_at:])
            record = {"index": index}
            try:
                fuel_torch.load_contracts(target)
            except BaseException as error:  # noqa: BLE001
                record.update(raised=type(error).__name__, message=str(error)[:600])
            else:
                record.update(returned="ContractSet")
        print(json.dumps(record), flush=True)


def test_contract_files_with_missing_or_wrong_clauses_are_refused_at_load():
    outcomes, crashes = run_batch("_load_edited_contracts")
    assert not crashes, "\n".join(crashes)
    names = sorted(CONTRACT_EDITS)
    assert len(outcomes) == len(names)
    for o in outcomes:
        assert o.get("raised") == "ContractFormatError", (names[o["index"]], o)
        assert "elementwise.fkc.md" in o["message"] and "add_f32" in o["message"], (names[o["index"]], o)


def _report_cases(cases: list, start: int) -> None:
    """Child side: run cases[start:], one JSON line per outcome (what it raised, or that it returned)."""
    for index in range(start, len(cases)):
        print(json.dumps({"index": index, "started": True}), flush=True)
        record = {"index": index}
        try:
            cases[index]()
        except BaseException as error:  # noqa: BLE001 - the parent judges every outcome
            record.update(raised=type(error).__name__, message=str(error)[:600])
        else:
            record.update(returned="Tensor")
        print(json.dumps(record), flush=True)


def _permissive_rules(start: int) -> None:
    """Child side: rules that claim every layout is accepted, installed into the kernels directly."""
    import fuel_torch
    from fuel_torch import _C
    from fuel_torch.contracts import rules_for_cpp

    rules = rules_for_cpp(fuel_torch.installed())
    for rule in rules:
        for clause in rule["inputs"]:
            clause["layout"] = {flag: "accepted" for flag in clause["layout"]}
    _C.install_rules(rules)
    a = _t(7)
    cases = [lambda: torch.ops.fuel.add(a[1:], a[1:].clone()), lambda: torch.ops.fuel.add(a[::2], a[::2].clone()),
             lambda: torch.ops.fuel.add(_t(1).expand(10**6), torch.ones(10**6)),
             lambda: torch.ops.fuel.add.out(a, a.clone(), out=torch.empty(14)[::2]),
             lambda: torch.ops.fuel.conv2d(_t(1, 2, 5, 5).transpose(2, 3), _t(2, 2, 3, 3)),
             lambda: torch.ops.fuel.conv2d(_t(1, 1, 1, 1).expand(1, 2, 500, 500), _t(2, 2, 3, 3))]
    _report_cases(cases, start)


def test_a_permissive_rule_table_still_cannot_make_a_kernel_read_out_of_bounds():
    outcomes, crashes = run_batch("_permissive_rules")
    assert not crashes, "\n".join(crashes)
    assert len(outcomes) == 6
    for o in outcomes:
        assert o.get("raised") == "RuntimeError", o
        assert "layout.contiguous: required" in o["message"] or "return.layout_guarantee" in o["message"], o


def _rules_without_same_as(start: int) -> None:
    import fuel_torch
    from fuel_torch import _C
    from fuel_torch.contracts import rules_for_cpp

    rules = rules_for_cpp(fuel_torch.installed())
    for rule in rules:
        for clause in rule["inputs"]:
            clause["same_as"] = ""
    _C.install_rules(rules)
    cases = [lambda: torch.ops.fuel.add(torch.ones(4_000_000), torch.ones(1)),
             lambda: torch.ops.fuel.rem(torch.ones(1), torch.ones(4_000_000)),
             lambda: torch.ops.fuel.mul.out(torch.ones(4_000_000), torch.ones(4_000_000), out=torch.empty(1))]
    _report_cases(cases, start)


def test_rules_without_same_as_give_an_error_never_a_crash():
    outcomes, crashes = run_batch("_rules_without_same_as")
    assert not crashes, "\n".join(crashes)
    assert [o.get("raised") for o in outcomes] == ["RuntimeError"] * 3
