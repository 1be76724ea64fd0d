#!/usr/bin/env bash
# Builds fuel_torch._C with AddressSanitizer + UndefinedBehaviorSanitizer (FUEL_SANITIZE=1, see
# setup.py) in a separate tree and runs tests against that build, with the sanitizer runtime preloaded.
#
#   tools/sanitize.sh                    # the whole suite (minus this script's own test and the RSS tests)
#   tools/sanitize.sh --bounded          # the subset CI runs (tests/test_sanitizer.py calls this)
#   tools/sanitize.sh tests/test_fuzz.py -k conv   # any pytest arguments
#
# The build goes to $FUEL_SANITIZE_DIR (default build/sanitize in the repository, which .gitignore
# covers): a copy of the sources with the extension built in place, so the normal build and the
# installed package are never touched, and a second run only recompiles what changed. Run it with
# the Python environment the project is installed in (it needs torch and the test dependencies).
# Exit status: pytest's; any sanitizer report aborts the process, so it fails the run.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tree="${FUEL_SANITIZE_DIR:-$repo/build/sanitize}"
python="${PYTHON:-python}"

# The subset CI can afford (tests/test_sanitizer.py): every kernel in every dtype through the parity
# special-value cross products, the enforcement paths, the hostile calls and the fuzzers at their CI
# counts, and a slice of the convolution grid.
# (-k applies to every file: it narrows only the parity file, whose name is one of each test's keywords.)
bounded=(tests/test_elementwise_parity.py
         -k "not test_elementwise_parity or special_values or ranks_zero or out_overload or position_invariance"
         tests/test_elementwise_enforcement.py tests/test_convolution_errors.py tests/test_adversarial.py
         tests/test_fuzz.py tests/test_convolution_patch_brgemm.py tests/test_convolution_plane_brgemm.py
         tests/test_convolution_depthwise_weight_grad.py
         "tests/test_convolution.py::test_empty_batch" "tests/test_convolution.py::test_no_input_channels_give_the_bias"
         "tests/test_convolution.py::test_empty_input_rows_read_only_padding"
         "tests/test_convolution.py::test_out_overload_overwrites_every_element"
         "tests/test_convolution.py::test_integer_valued_inputs_are_exact"
         "tests/test_convolution.py::test_deterministic_across_calls_and_threads"
         "tests/test_autograd.py::test_bias_gradient_sums_position_lanes_in_order"
         "tests/test_autograd.py::test_bias_gradient_op_takes_any_layout_and_refuses_bad_calls")
if [[ "${1:-}" == "--bounded" ]]; then
  shift
  set -- "${bounded[@]}" "$@"
elif [[ $# -eq 0 ]]; then
  # test_memory measures the resident set, which ASan's quarantine and shadow memory change.
  set -- tests --ignore=tests/test_sanitizer.py --ignore=tests/test_memory.py
fi

mkdir -p "$tree"
# Sources only, never a built library (mtimes kept, so a second run recompiles only what changed;
# a copied normal build would look up to date and be tested instead).
items=()
for item in csrc fuel_torch contracts tests tools examples benchmarks setup.py pyproject.toml README.md; do
  [[ -e "$repo/$item" ]] && items+=("$item")
done
tar -C "$repo" --exclude='*.so' --exclude=__pycache__ -cf - "${items[@]}" | tar -C "$tree" -xpf -
# The package's contracts live at the repository's top (setup.py maps them into fuel_torch).
ln -sfn ../contracts "$tree/fuel_torch/_contract_files"

cd "$tree"
FUEL_SANITIZE=1 FUEL_BUILD_LEVELS=native MAX_JOBS="${MAX_JOBS:-2}" "$python" setup.py -q build_ext --inplace >build.log 2>&1 \
  || { tail -40 build.log; echo "sanitize.sh: the sanitizer build failed (log: $tree/build.log)" >&2; exit 2; }

compiler="${CXX:-c++}"
asan="$("$compiler" -print-file-name=libasan.so)"
[[ -f "$asan" ]] || { echo "sanitize.sh: $compiler has no libasan.so ($asan)" >&2; exit 2; }
# libstdc++ too: python itself does not link it, and ASan's __cxa_throw interceptor must find the
# real one when it starts, or the first C++ exception (any torch error) aborts the process.
stdcxx="$("$compiler" -print-file-name=libstdc++.so)"
# Python is not built with ASan: its own leaks at exit are not ours (detect_leaks=0). torch's
# libraries are not instrumented either, so every report comes from our code.
export LD_PRELOAD="$asan:$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}"
# Reports go to files as well as they can: pytest captures a test's stderr, and a process that
# halts takes the captured text with it.
reports="$tree/sanitizer-reports"
rm -rf "$reports" && mkdir -p "$reports"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:print_summary=1:log_path=$reports/asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
export FUEL_SANITIZED_BUILD="$tree"
"$python" - <<'PY'
import os, fuel_torch
where = os.path.dirname(fuel_torch._C.__file__)
assert where.startswith(os.environ["FUEL_SANITIZED_BUILD"]), f"imported {where}, not the sanitizer build"
print(f"sanitize.sh: testing the sanitizer build {fuel_torch._C.__file__}")
PY
status=0
"$python" -m pytest -q -p no:cacheprovider "$@" || status=$?
if compgen -G "$reports/*" >/dev/null; then
  for report in "$reports"/*; do echo "== $report"; cat "$report"; done
  echo "sanitize.sh: sanitizer reports above (pytest exit status $status)" >&2
  exit 3
fi
exit "$status"
