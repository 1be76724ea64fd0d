// The accept clauses of every registrable contract, installed from Python at import time.
//
// contracts/*.fkc.md is the single source of truth: fuel_torch parses it and hands the parsed
// rules to install_rules(). The C++ entry points check every call against that table, so a direct
// torch.ops.fuel.* call is rejected with the same clause and message as the Python paths.
// Messages are built by format_violation(), whose Python twin is fuel_torch/enforce.py; a test
// asserts that both produce the same text for the same bad input.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fuel {

struct InputRule {
  std::string name;
  std::vector<c10::ScalarType> dtypes;
  std::map<std::string, std::string> layout;  // flag -> "required" | "rejected" | "accepted"
  int64_t rank = -1;                          // -1: any rank
  bool optional = false;
  std::string same_as;  // shape_constraint `same_as=<input>`; other constraints are family code

  // Derived by install_rules() from the fields above, so that the per-call check compares flags and indices
  // instead of looking up strings.
  bool rejects_reverse_strides = false, rejects_broadcast_stride0 = false, rejects_start_offset = false,
       rejects_strided = false, requires_contiguous = false, accepts_channels_last = false;
  int64_t same_as_index = -1;  // position of the `same_as` input in the rule's inputs; -1: none
};

struct KernelRule {
  std::string kernel;  // contract name, e.g. "add_f32"
  std::string op;      // fuel op name, e.g. "add"
  c10::ScalarType dtype;
  std::vector<InputRule> inputs;
  // The return clause, quoted in messages about `out=`.
  std::string dtype_rule, shape_rule, layout_guarantee, aliasing;
};

void install_rules(std::vector<KernelRule> rules);

// "fuel::<op> [<kernel>]: argument '<arg>' breaks `<clause>`: saw <seen>. Fix: <fix>"
[[noreturn]] void fail(std::string_view op, std::string_view kernel, std::string_view arg, std::string_view clause,
                       std::string_view seen, std::string_view fix);

std::string shape_str(at::IntArrayRef sizes);
std::string dtype_str(c10::ScalarType dtype);

// Picks the contract for `op` by the dtype of its first tensor argument and checks every input
// (absent optionals are nullptr; a None passed for a required tensor arrives as an undefined tensor)
// against it: presence, device, dtype, layout flags, rank, same_as. Shape clauses are family specific
// and checked by the caller with fail(). On the hot path (every call) it allocates nothing and builds
// no string: messages are built only on failure.
const KernelRule& check_inputs(std::string_view op, c10::ArrayRef<const at::Tensor*> inputs);

// The `out=` tensor of a .out overload: exact dtype and shape, contiguous, zero offset, same
// device, and no memory shared with any input (return clause `aliasing: none`). Allocates nothing
// unless it fails.
void check_out(const KernelRule& rule, const at::Tensor& out, c10::ScalarType dtype,
               at::IntArrayRef shape, c10::ArrayRef<const at::Tensor*> inputs);

}  // namespace fuel
