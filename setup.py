"""Builds fuel_torch._C, the C++ kernels, with torch's own extension machinery.

Run-time ISA dispatch, as ATen's DispatchStub: the sources in csrc/kernels/ are compiled once per
instruction-set level (LEVELS), each copy with that level's -m flags and CPU_CAPABILITY=<level>, so
that its code lives in namespace fuel::<level> and ATen's Vectorized<T> is the level's own; the
rest of csrc/ (checks, registration, the choice of level) is compiled once, for baseline x86-64.
fuel_torch picks the level at import from the running CPU (csrc/dispatch.h), so a build made on
an AVX-512 machine runs on an older one. cpp_extension has no per-file flags, so build_ext compiles
the per-level objects itself (with the same ninja machinery) and links them after the common ones.
"""
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# The flags ATen builds its own kernels with (cmake/Codegen.cmake). The order matters: the linker
# keeps the first copy of an inline function that several objects define, and that copy must run
# on every CPU that calls it, so objects go lowest level first (common sources before all).
LEVELS = {
    "DEFAULT": [],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
}
KERNEL_DIR = os.path.join("csrc", "kernels")

# -fopenmp: cpp_extension adds none, and without it at::parallel_for runs on one thread. The
# produced library then needs libgomp.so.1, which torch already loaded (same soname), so
# torch.set_num_threads governs our kernels too.
# No -ffast-math or -Ofast anywhere: subnormals must survive (no flush-to-zero).
# -std=c++20: the sources use it (std::bit_cast, std::make_unique_for_overwrite); torch 2.13's
# cpp_extension passes it too, older ones pass c++17 unless a -std flag is given.
# -g0: Python's CFLAGS carry -g, which made the library 120 MB of debug information and its largest
# object compile 30% slower (the sanitizer build's -g1 comes later and wins).
COMPILE_ARGS = ["-O3", "-g0", "-fopenmp", "-fvisibility=hidden", "-std=c++20"]
# The kernels' copy loops stay loops: GCC turns them into memcpy calls (with a vzeroupper each),
# which on the convolution's short output rows took 6% of a 7x7 stem.
KERNEL_ARGS = ["-fno-tree-loop-distribute-patterns"]


def sources(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".cpp"))


def levels_to_build():
    """LEVELS, or with FUEL_BUILD_LEVELS=native only those this machine's CPU runs (the sanitizer
    build, tools/sanitize.sh, tests only what can run here and so compiles a third less)."""
    if os.environ.get("FUEL_BUILD_LEVELS") != "native":
        return LEVELS
    try:
        with open("/proc/cpuinfo") as info:
            flags = set(next(line for line in info if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        flags = set()
    needs = {"AVX2": {"avx2", "fma", "f16c"}, "AVX512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}
    return {level: f for level, f in LEVELS.items() if needs.get(level, set()) <= flags}


def compiler_supports(compiler, flags):
    """Whether the compiler accepts a level's flags (an old compiler may lack AVX-512)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.cpp")
        with open(probe, "w") as f:
            f.write("int main() { return 0; }\n")
        run = subprocess.run([compiler, *flags, "-c", probe, "-o", os.path.join(tmp, "probe.o")],
                             capture_output=True)
        return run.returncode == 0


class BuildWithLevels(BuildExtension):
    def build_extension(self, ext):
        compiler = self.compiler.compiler_so[0]
        common_args = list(ext.extra_compile_args)  # COMPILE_ARGS plus what BuildExtension added
        levels = {}
        for level, flags in levels_to_build().items():
            if level != "DEFAULT" and not compiler_supports(compiler, flags):
                print(f"fuel_torch: the compiler cannot target {level}; building without those kernels")
                continue
            if level != "DEFAULT":
                ext.extra_compile_args.append(f"-DFUEL_HAVE_{level}")  # for the common sources
            levels[level] = flags

        def compile_level(level):
            return self.compiler.compile(
                sources(KERNEL_DIR),
                output_dir=os.path.join(self.build_temp, "levels", level),
                macros=ext.define_macros,
                include_dirs=ext.include_dirs,
                extra_postargs=[*common_args, *KERNEL_ARGS, *levels[level], f"-DCPU_CAPABILITY={level}",
                                f"-DCPU_CAPABILITY_{level}"],
                depends=ext.depends,
            )

        # The levels compile side by side (a ninja run each): a level is one large object and two
        # small ones, so one level at a time left a core idle for most of the build.
        with ThreadPoolExecutor(max_workers=len(levels)) as pool:
            ext.extra_objects = [obj for objects in pool.map(compile_level, levels) for obj in objects]  # LEVELS order
        super().build_extension(ext)


def sanitizer_args():
    """FUEL_SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer, for compile and link alike.
    tools/sanitize.sh builds with it in a separate tree and runs the tests with the runtime preloaded."""
    if os.environ.get("FUEL_SANITIZE") != "1":
        return []
    # -O1: the usual sanitizer level (readable reports, a faster build); later -O flags win.
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g1", "-O1"]


setup(
    packages=["fuel_torch", "fuel_torch.judge", "fuel_torch._contract_files", "fuel_torch.planner"],
    # contracts/ is the single source of truth at the top of the repo; it ships inside the package.
    package_dir={"fuel_torch": "fuel_torch", "fuel_torch._contract_files": "contracts"},
    package_data={"fuel_torch._contract_files": ["*.fkc.md", "*.yaml"]},
    ext_modules=[
        CppExtension(
            name="fuel_torch._C",
            # csrc/ and each family's folder (csrc/convolution/); csrc/kernels/ is built per level above.
            sources=sources("csrc") + sources(os.path.join("csrc", "convolution")),
            # Kernel sources and headers are not all in `sources`: listed here so editing one relinks.
            depends=sorted(os.path.join(root, f) for root, _, files in os.walk("csrc") for f in files),
            extra_compile_args=COMPILE_ARGS + sanitizer_args(),  # the per-level objects get them too
            extra_link_args=["-fopenmp"] + sanitizer_args(),
        )
    ],
    cmdclass={"build_ext": BuildWithLevels.with_options(use_ninja=True)},
)
