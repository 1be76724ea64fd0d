"""The instruction-set level fuel's kernels run at.

The kernels are compiled once per level (DEFAULT: baseline x86-64, AVX2, AVX512; see setup.py and
csrc/dispatch.h). At import the best level this build has and this CPU supports is chosen, or the
one the environment variable FUEL_CPU_CAPABILITY names (DEFAULT, AVX2 or AVX512): a level the CPU
or the build lacks is refused at import, with the reason, rather than crashing later on an illegal
instruction.
"""
from __future__ import annotations

from . import _C

LEVELS = ("DEFAULT", "AVX2", "AVX512")


def cpu_capability() -> str:
    """The level the kernels run at: "DEFAULT", "AVX2" or "AVX512"."""
    return _C.cpu_capability()


def bfloat16_brgemm() -> str | None:
    """The unit bfloat16 convolutions run on through torch's brgemm (oneDNN), or None where they run
    on the chassis: "AMX" (the tile unit: the CPU has AMX-BF16 and torch's brgemm can use it) or
    "AVX512_BF16" (vdpbf16ps dot products: AMD Zen 4 and 5, Intel Cooper Lake). Both flush
    subnormals, so calls take either only image by image where the exponent rule keeps every sum
    normal (contracts/convolution.fkc.md, Arithmetic). None where the kernels run below AVX512,
    torch.backends.mkldnn is off (checked per call, as torch checks it) or the environment variable
    FUEL_BF16_BRGEMM is "0" (read once, at the first convolution)."""
    return _C.bfloat16_brgemm() or None


def amx_convolution() -> bool:
    """Whether bfloat16 convolutions run on the AMX tile unit: bfloat16_brgemm() == "AMX"."""
    return bfloat16_brgemm() == "AMX"


def float_brgemm() -> bool:
    """Whether float32 convolutions may run on the brgemm paths (fuel's register tile at AVX2,
    csrc/convolution/float_brgemm.h; torch's brgemm, oneDNN's kernel, at AVX512): those of the
    weight-gradient shape (long kernel rows, few outputs, as autograd's weight gradients are), and
    at the AVX512 level those with at least 16 channels per group in and out (one brgemm per
    spatial tap). On when the kernels run above DEFAULT, torch.backends.mkldnn is enabled (checked
    per call, as torch checks it) and the environment variable FUEL_BRGEMM is not "0" (read once).
    bfloat16 takes the same shapes where bfloat16_brgemm() names a unit."""
    return bool(_C.float_brgemm())


def patch_brgemm() -> bool:
    """Whether the brgemm convolutions with a kernel larger than 1x1 and at least 16 output channels
    per group reduce over whole patches (csrc/convolution/patch_brgemm.h) rather than one tap at a
    time: the environment variable FUEL_PATCH is not "0" (read per call). It applies where
    float_brgemm() (float32) is on or bfloat16_brgemm() (bfloat16) names a unit; bfloat16 on the
    tile unit takes any output channel count."""
    return bool(_C.patch_brgemm())


def float16_division() -> str:
    """How float16 div runs: "reciprocal" (a reciprocal estimate and one correction, at the AVX512
    level on CPUs where that beats the divider: all but AMD's family 19h, Zen 4) or "divider". Both
    give torch's bits. The environment variable FUEL_FLOAT16_DIVISION ("reciprocal" or "divider")
    overrides the CPU's choice (read once, at import, which refuses any other value)."""
    return _C.float16_division()


def supported_capabilities() -> list[str]:
    """Levels this build has and this CPU supports, lowest first (FUEL_CPU_CAPABILITY may name any)."""
    return list(_C.cpu_capabilities())


def built_capabilities() -> list[str]:
    """Levels compiled into this build (the compiler that built it may lack one)."""
    return list(_C.built_capabilities())


def choose() -> str:
    """Chooses the level from the CPU and FUEL_CPU_CAPABILITY, and float16 div's way from the CPU and
    FUEL_FLOAT16_DIVISION (done at import: a value either variable does not know is refused there)."""
    try:
        level = _C.init_cpu_capability()
        _C.float16_division()
    except RuntimeError as error:
        raise ImportError(str(error).splitlines()[0]) from None
    return level


choose()
