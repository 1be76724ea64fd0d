// Geometry and validation of a convolution call: every parameter range-checked and every product
// overflow-checked before anything is allocated, with the contract's clause texts.
//
// The clause texts quote contracts/convolution.fkc.md; fuel_torch/convolution.py is the Python twin
// and must produce the same messages in the same order (a test compares them).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/safe_numerics.h>

#include <optional>
#include <string>
#include <utility>

#include "../contract_rules.h"
#include "problem.h"

namespace fuel {

extern const char* const kOverflowClause;

struct Checker {
  const std::string op;
  const KernelRule& rule;

  [[noreturn]] void fail(const std::string& arg, const std::string& clause, const std::string& seen,
                         const std::string& fix) const {
    fuel::fail(op, rule.kernel, arg, clause, seen, fix);
  }

  [[noreturn]] void overflow(const std::string& arg, const std::string& expr, const std::string& context) const {
    fail(arg, kOverflowClause, expr + " overflows int64 (" + context + ")", "use a smaller " + arg);
  }

  // a * b, or the overflow error; describe() gives its (expression, context) only when needed.
  template <typename Describe>
  int64_t mul(int64_t a, int64_t b, const char* arg, Describe describe) const {
    int64_t result = 0;
    if (c10::mul_overflows(a, b, &result)) {
      const auto [expr, context] = describe();
      overflow(arg, expr, context);
    }
    return result;
  }

  // A list parameter: exactly two values (the schema's int[2] does not enforce its length).
  void pair(at::IntArrayRef values, const char* name) const {
    if (values.size() != 2) {
      fail(name, std::string("op_params.") + name + ": int[2]",
           std::to_string(values.size()) + " values " + shape_str(values), "pass one int or a list of two ints");
    }
  }

  void at_least(at::IntArrayRef values, const char* name, int64_t minimum) const {
    pair(values, name);
    if (values[0] < minimum || values[1] < minimum) {
      fail(name, std::string("op_params.") + name + ": " + name + "[i] >= " + std::to_string(minimum),
           std::string(name) + " " + shape_str(values),
           std::string("use a ") + name + " of at least " + std::to_string(minimum) + " in each dimension");
    }
  }
};

// The output shape and the geometry the kernels need; output_padding is set for conv_transpose2d.
Problem validate(const Checker& c, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias,
                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                 std::optional<at::IntArrayRef> output_padding, int64_t groups);

// Refuses an output this machine cannot hold, before anything is allocated.
void check_allocation(const Checker& c, const Problem& p, c10::ScalarType dtype);

}  // namespace fuel
