"""Judge probes for the convolution family: fuel::conv2d and fuel::conv_transpose2d.

Schemas (issue 3): conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) and
conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1),
argument for argument torch.nn.functional's. Precision is measured against the exact result of the
same (already rounded) inputs: float64 arithmetic for f32 and the halves (its rounding error is
~2^-53 relative, far below theirs), numpy long double for f64 (64-bit significand).
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch
import torch.nn.functional as F

from fuel_torch.contracts import Contract, InputClause
from fuel_torch.costmodel import bind, formula_names

from .exact import round_to
from fuel_torch.expr import Expr, ExprError
from .probes import Call

OPS = ("conv2d", "conv_transpose2d")
TORCH = {"conv2d": F.conv2d, "conv_transpose2d": F.conv_transpose2d}

# (N, Cin, H, W, Cout, Kh, Kw, stride, padding, dilation, groups, bias, output_padding)
_CONFIGS = [
    (2, 4, 7, 6, 6, 3, 2, (2, 1), (1, 0), (1, 2), 2, True, (1, 0)),
    (1, 3, 9, 9, 5, 3, 3, 1, 1, 1, 1, True, 0),
    (2, 6, 8, 8, 6, 3, 3, 1, 1, 1, 6, False, 0),        # depthwise
    (1, 4, 6, 10, 8, 1, 3, (1, 2), (0, 1), 1, 2, True, (0, 1)),
    (3, 9, 5, 5, 7, 5, 5, 2, 2, 1, 1, True, 1),
    (1, 2, 1, 1, 4, 1, 1, 1, 0, 1, 1, True, 0),          # 1x1 input
    (1, 16, 12, 12, 16, 3, 3, 1, 1, 2, 4, True, 0),
    (1, 8, 16, 16, 24, 7, 7, 1, 3, 1, 1, False, 0),
]
SIZES = {
    "quick": dict(corpus=3, determinism=(2, 8, 16, 16, 8), cost=[(1, 4, 8, 8, 4), (1, 8, 16, 16, 8), (2, 16, 16, 16, 16)]),
    "default": dict(corpus=6, determinism=(2, 16, 24, 24, 16),
                    cost=[(1, 4, 8, 8, 4), (1, 8, 16, 16, 8), (2, 16, 16, 16, 16), (2, 16, 32, 32, 32), (4, 32, 32, 32, 32)]),
    "full": dict(corpus=len(_CONFIGS), determinism=(4, 32, 32, 32, 32),
                 cost=[(1, 4, 8, 8, 4), (1, 8, 16, 16, 8), (2, 16, 16, 16, 16), (2, 16, 32, 32, 32), (4, 32, 32, 32, 32),
                       (8, 32, 56, 56, 64)]),
}


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def torch_op(call: Call) -> torch.Tensor:
    return TORCH[call.op](*call.tensors.values(), **call.params)


def torch_name(op: str) -> str:
    return f"torch.nn.functional.{op}"


def _make(op: str, config: tuple, dtype: torch.dtype, generator: torch.Generator, integer: bool = False) -> Call:
    n, cin, h, w, cout, kh, kw, stride, padding, dilation, groups, bias, output_padding = config

    def rand(*shape):
        if integer:  # sums of small integers are exact in any order: no rounding anywhere
            return torch.randint(-3, 4, shape, generator=generator).to(dtype)
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)

    # int[2] parameters always as pairs: torch.ops schemas do not turn a bare int into a list.
    stride, padding, dilation, output_padding = map(_pair, (stride, padding, dilation, output_padding))
    if op == "conv2d":
        weight = rand(cout, cin // groups, kh, kw)
        params = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    else:
        weight = rand(cin, cout // groups, kh, kw)
        params = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    return Call(op, {"x": rand(n, cin, h, w), "weight": weight, "bias": rand(cout) if bias else None}, params)


def base_call(contract: Contract, seed: int = 0) -> Call:
    return _make(contract.op, _CONFIGS[0], contract.dtype, torch.Generator().manual_seed(seed))


def positive_calls(contract: Contract) -> list[tuple[str, Call]]:
    generator = torch.Generator().manual_seed(1)
    calls = []
    for label, config in [("depthwise (groups == Cin)", _CONFIGS[2]), ("1x1 input", _CONFIGS[5]),
                          ("empty batch (N = 0)", (0,) + _CONFIGS[1][1:])]:
        calls.append((f"accept ({label})", _make(contract.op, config, contract.dtype, generator)))
    return calls


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


def expected_shape(rule: str, call: Call):
    """The output shape a shape rule promises for `call`, or None when the rule is not understood.

    Understood: `conv2d(params)` / `conv_transpose2d(params)` (torch's formula), and the explicit
    form `[e0, e1, out.dim[2], out.dim[3]], out.dim[2 + i] = <formula in i>`, evaluated with the
    safe evaluator (i = 0, 1; `/` on the non-negative sizes is the integer division it means)."""
    if re.match(rf"\s*{call.op}\s*\(", rule):
        meta = [None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta") for t in call.tensors.values()]
        return tuple(TORCH[call.op](*meta, **call.params).shape)
    text = rule.strip()
    if not text.startswith("["):
        return None
    depth = 0
    for end, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0:
            break
    match = re.fullmatch(r"\s*,\s*out\.dim\[\s*2\s*\+\s*i\s*\]\s*=\s*(.+)", text[end + 1:])
    if not match:
        return None
    bound = bind(call.op, tuple(call.tensors.values()), dict(call.params))
    names = formula_names(call.op, bound, (), call.tensors["x"].dtype)
    del names["out"]  # the shape being derived
    shape = []
    try:
        for entry in _split_top_level(text[1:end]):
            spatial = re.fullmatch(r"\s*out\.dim\[\s*([23])\s*\]\s*", entry)
            if spatial:
                i = int(spatial.group(1)) - 2
                formula = re.sub(r"\[\s*2\s*\+\s*i\s*\]", f"[{2 + i}]", match.group(1))
                formula = re.sub(r"\[\s*i\s*\]", f"[{i}]", formula)
                shape.append(math.floor(Expr(formula).evaluate(names)))
            else:
                shape.append(Expr(entry).evaluate(names))
    except ExprError:
        return None
    return tuple(int(v) for v in shape)


def _torch_rejects(call: Call) -> bool:
    # Real float32 zeros: torch's meta kernels skip some checks, and the dtype does not change validity.
    zeros = [None if t is None else torch.zeros(t.shape) for t in call.tensors.values()]
    try:
        TORCH[call.op](*zeros, **call.params)
    except Exception:  # noqa: BLE001 - torch refusing is the signal
        return True
    return False


def shape_violations(contract: Contract, clause: InputClause, base: Call) -> list[tuple[str, Call]] | None:
    """For each size of `clause`'s tensor the constraint mentions (`<name>.dim[i]`), the first nudge
    (+1, -1, x2) that torch itself refuses: torch is the oracle for what breaks the constraint."""
    t = base.tensors.get(clause.name)
    if t is None:
        return None
    text = clause.shape_constraint or ""
    dims = sorted({int(i) for i in re.findall(rf"\b{clause.name}\.dim\[(\d+)\]", text)}) or list(range(t.dim()))
    found = []
    for d in dims:
        if d >= t.dim():
            continue
        for size in (t.shape[d] + 1, t.shape[d] - 1, 2 * t.shape[d]):
            if size < 1:
                continue
            shape = list(t.shape)
            shape[d] = size
            call = base.with_tensor(clause.name, torch.zeros(shape, dtype=t.dtype))
            if _torch_rejects(call):
                found.append((f"{clause.name}.dim[{d}] = {size} (torch refuses it too)", call))
                break
    return found or None


def param_violations(contract: Contract, base: Call) -> list[tuple[str, Call]]:
    """Parameters the family's validation refuses (issue 3): each must be a contract error on every path."""
    bad = [("stride 0", dict(stride=(0, 1))), ("padding -1", dict(padding=(0, -1))), ("dilation 0", dict(dilation=(0, 1))),
           ("groups 0", dict(groups=0)), ("groups 3 does not divide the channels", dict(groups=3)),
           ("dilation 2**62 (int64 overflow in the window size)", dict(dilation=(2 ** 62, 1)))]
    if base.op == "conv_transpose2d":
        bad += [("output_padding >= stride and dilation", dict(output_padding=(2, 2))),
                ("stride 2**62 (int64 overflow in the output size)", dict(stride=(2 ** 62, 1))),
                ("padding so large the output is empty", dict(padding=(10, 10)))]
    calls = [(label, base.with_params(**params)) for label, params in bad]
    if base.op == "conv2d":
        tiny = base.with_tensor("x", base.tensors["x"][:, :, :1, :1].contiguous())
        calls.append(("kernel larger than the padded input", tiny.with_params(padding=(0, 0))))
    return calls


# ---- precision -----------------------------------------------------------------------------------

def precision_corpus(contract: Contract, level: str, seed: int = 1234) -> list[Call]:
    generator = torch.Generator().manual_seed(seed)
    count = SIZES[level]["corpus"]
    calls = [_make(contract.op, config, contract.dtype, generator) for config in _CONFIGS[:count]]
    calls.append(_make(contract.op, _CONFIGS[1], contract.dtype, generator, integer=True))
    return calls


def _conv2d_np(x, w, b, stride, padding, dilation, groups, dt):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dt)
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    out = np.zeros((n, o, ho, wo), dt)
    og = o // groups
    for g in range(groups):
        xg, wg = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if b is not None:
        out += b[None, :, None, None]
    return out


def _conv_transpose2d_np(x, w, b, stride, padding, output_padding, groups, dilation, dt):
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    oph, opw = _pair(output_padding)
    ho, wo = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1, (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    full = np.zeros((n, og * groups, (h - 1) * sh + dh * (kh - 1) + 1 + oph, (wd - 1) * sw + dw * (kw - 1) + 1 + opw), dt)
    cg = c // groups
    for g in range(groups):
        xg, wg = x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                full[:, g * og:(g + 1) * og, i * dh:i * dh + sh * (h - 1) + 1:sh, j * dw:j * dw + sw * (wd - 1) + 1:sw] += \
                    np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
    out = full[:, :, ph:ph + ho, pw:pw + wo].copy()
    if b is not None:
        out += b[None, :, None, None]
    return out


def numpy_conv(call: Call, dt, absolute: bool = False) -> np.ndarray:
    """The call computed in numpy dtype `dt` (float64 or longdouble); with `absolute`, on |inputs|."""
    arrays = {k: None if t is None else t.double().numpy().astype(dt) for k, t in call.tensors.items()}
    if absolute:
        arrays = {k: None if a is None else np.abs(a) for k, a in arrays.items()}
    fn = _conv2d_np if call.op == "conv2d" else _conv_transpose2d_np
    return fn(arrays["x"], arrays["weight"], arrays["bias"], dt=dt, **call.params)


def exact_reference(call: Call) -> tuple[np.ndarray, np.ndarray]:
    """(exact result, error scale sum|x*w| + |bias|) in a type wider than the kernel's."""
    dt = np.longdouble if call.tensors["x"].dtype == torch.float64 else np.float64
    return numpy_conv(call, dt), numpy_conv(call, dt, absolute=True)


def round_reference(exact: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return round_to(exact.astype(np.float64), dtype)


ACCUMULATOR_U = {torch.float64: 2.0 ** -53}  # every other dtype accumulates in float32: 2^-24
HALF_PRECISION = {torch.bfloat16: 8, torch.float16: 11}  # significand bits
HALF_MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14}
BOUND_NOTE = ("issue 3's accumulation bound, stated in the contract notes: |out - exact| <= (K + 2) * u * "
              "(conv(|x|, |weight|) + |bias|), u the accumulator's unit roundoff, K the taps per output; "
              "plus ulp(out) / 2 for the halves' one rounding")


def accumulation_bound(call: Call, result: torch.Tensor, scale: np.ndarray) -> np.ndarray:
    """The bound above, elementwise, for this call's result."""
    weight, dtype = call.tensors["weight"], result.dtype
    taps = weight.shape[2] * weight.shape[3] * (weight.shape[1] if call.op == "conv2d"
                                                 else weight.shape[0] // call.params["groups"])
    bound = (taps + 2) * ACCUMULATOR_U.get(dtype, 2.0 ** -24) * scale.astype(np.float64)
    if dtype in HALF_PRECISION:
        _, exponent = np.frexp(np.abs(result.double().numpy()))
        ulp = np.ldexp(1.0, np.maximum(exponent, HALF_MIN_EXPONENT[dtype] + 1) - HALF_PRECISION[dtype])
        bound = bound + ulp / 2
    return bound


def reference_note(op: str) -> str:
    return ("exact result of the rounded inputs: float64 (f32, halves) or long double (f64) direct "
            f"{op}; ulp against it rounded once to the dtype")


# ---- determinism and cost ------------------------------------------------------------------------

def _sized(contract: Contract, size: tuple, seed: int) -> Call:
    n, cin, hw, _, cout = size
    config = (n, cin, hw, hw, cout, 3, 3, 1, 1, 1, 1, True, 0)
    return _make(contract.op, config, contract.dtype, torch.Generator().manual_seed(seed))


def determinism_call(contract: Contract, level: str) -> Call:
    return _sized(contract, SIZES[level]["determinism"], 7)


def cost_calls(contract: Contract, level: str) -> list[Call]:
    return [_sized(contract, size, 11) for size in SIZES[level]["cost"]]


def size_label(call: Call) -> str:
    x, w = call.tensors["x"], call.tensors["weight"]
    return f"x{list(x.shape)} w{list(w.shape)}"
