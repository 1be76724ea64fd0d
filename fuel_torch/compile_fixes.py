"""A workaround for a torch 2.13 inductor bug that breaks torch.compile of fuel::conv2d / conv_transpose2d.

Inductor 2.13 lowers a functional custom op that has a `.out` overload (tagged torch.Tag.out) to that
overload, to plan its output buffer. It builds the call from the *flattened* non-tensor arguments, so an
`int[2]` argument turns into two positional ints and the generated code calls e.g.
`fuel::conv2d.out(x, w, b, 2, 2, 1, 1, 1, 1, 1, dilation=[1, 1], groups=1, out=buf)`, which fails
("expected at most 8 argument(s) but received 13"). Any custom op with a list argument and an out
variant hits it (tests/test_compile_export.py reproduces it on a throwaway op).

The same lowering also fails under dynamic shapes when the op's input comes from another fallback kernel
(a fuel conv feeding fuel maximum: its planned buffer gets symbolic sizes FixedLayout refuses).

The fix: for every fuel op, report "no out variant" to that lowering, so inductor calls the functional op
as a plain fallback kernel (the path it has always used, which passes lists and symbolic sizes correctly).
Nothing else in torch changes; users' own .out calls are still functionalized by the out tag.
"""
from __future__ import annotations

import functools

import torch

NAMESPACE = "fuel"


def install() -> bool:
    """Install the workaround once; False where this torch has no out-variant lowering to fix."""
    try:
        from torch._library import _out_variant
    except ImportError:
        return False
    original = _out_variant.to_out_variant
    if getattr(original, "_fuel_fix", False):
        return True

    @functools.wraps(original)
    def to_out_variant(op):
        if getattr(op, "namespace", None) == NAMESPACE:
            return None
        return original(op)

    to_out_variant._fuel_fix = True
    _out_variant.to_out_variant = to_out_variant
    return True


install()
