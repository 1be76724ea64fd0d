"""Builds fuel_torch._C, the C++ kernels, with torch's own extension machinery."""
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension


def compile_args():
    # -fopenmp: cpp_extension adds none, and without it at::parallel_for runs on one thread.
    # The produced library then needs libgomp.so.1, which torch already loaded (same soname),
    # so torch.set_num_threads governs our kernels too.
    # No -ffast-math or -Ofast anywhere: subnormals must survive (no flush-to-zero).
    args = ["-O3", "-fopenmp", "-fvisibility=hidden"]
    # ATen's Vectorized<T> is header-only; building it for AVX2 needs the capability macros. The
    # extension is compiled on the machine that runs it, so follow what torch detects there.
    # FUEL_CPU_CAPABILITY=DEFAULT forces the portable build.
    capability = os.environ.get("FUEL_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        args += ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return args


def sanitizer_args():
    """FUEL_SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer, for compile and link alike.
    tools/sanitize.sh builds with it in a separate tree and runs the tests with the runtime preloaded."""
    if os.environ.get("FUEL_SANITIZE") != "1":
        return []
    # -O1: the usual sanitizer level (readable reports, a faster build); later -O flags win.
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g1", "-O1"]


setup(
    packages=["fuel_torch", "fuel_torch.judge", "fuel_torch._contract_files"],
    # contracts/ is the single source of truth at the top of the repo; it ships inside the package.
    package_dir={"fuel_torch": "fuel_torch", "fuel_torch._contract_files": "contracts"},
    package_data={"fuel_torch._contract_files": ["*.fkc.md"]},
    ext_modules=[
        CppExtension(
            name="fuel_torch._C",
            sources=sorted(os.path.join("csrc", f) for f in os.listdir("csrc") if f.endswith(".cpp")),
            extra_compile_args=compile_args() + sanitizer_args(),
            extra_link_args=["-fopenmp"] + sanitizer_args(),
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
