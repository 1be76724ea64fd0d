// The convolution family's entry points: fuel::conv2d and fuel::conv_transpose2d (NCHW, groups,
// stride, padding, dilation, output_padding), four dtypes each. This file validates and registers;
// the arithmetic (the chassis described in kernels/convolution_kernels.cpp) is compiled once per
// instruction-set level (dispatch.h).
#include <ATen/ATen.h>
#include <c10/util/safe_numerics.h>
#include <torch/library.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "contract_rules.h"
#include "dispatch.h"
#include "kernels/convolution_kernels.h"

namespace fuel {

FUEL_DECLARE_KERNELS(ConvolutionKernels, convolution_kernels)

namespace {

using Problem = ConvProblem;

// ---------------------------------------------------------------------------------------------
// Validation. The clause texts quote contracts/convolution.fkc.md; fuel_torch/convolution.py is
// the Python twin and must produce the same messages in the same order (a test compares them).

constexpr const char* kOverflowClause = "op_params.overflow: every intermediate size and product fits in int64";
constexpr const char* kAllocationClause =
    "return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64";
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

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

Problem validate(const Checker& c, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias,
                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                 std::optional<at::IntArrayRef> output_padding, int64_t groups) {
  Problem p;
  p.transpose = output_padding.has_value();
  c.at_least(stride, "stride", 1);
  c.at_least(padding, "padding", 0);
  c.at_least(dilation, "dilation", 1);
  if (p.transpose) {
    const at::IntArrayRef op = *output_padding;
    c.pair(op, "output_padding");
    for (int i = 0; i < 2; ++i) {
      if (op[i] < 0 || (op[i] >= stride[i] && op[i] >= dilation[i])) {
        c.fail("output_padding", "op_params.output_padding: 0 <= output_padding[i] < max(stride[i], dilation[i])",
               "output_padding " + shape_str(op) + ", stride " + shape_str(stride) + ", dilation " +
                   shape_str(dilation),
               "use an output_padding of at least 0 and smaller than the stride or the dilation in each dimension");
      }
      p.output_padding[i] = op[i];
    }
  }
  if (groups < 1) {
    c.fail("groups", "op_params.groups: groups >= 1", "groups " + std::to_string(groups), "use groups of at least 1");
  }
  for (int i = 0; i < 2; ++i) {
    p.stride[i] = stride[i];
    p.padding[i] = padding[i];
    p.dilation[i] = dilation[i];
  }
  p.groups = groups;
  p.N = x.size(0);
  p.Cin = x.size(1);
  p.H = x.size(2);
  p.W = x.size(3);
  p.Kh = weight.size(2);
  p.Kw = weight.size(3);
  // What the messages show, built only when one is raised.
  auto xs = [&] { return "x shape " + shape_str(x.sizes()); };
  auto ws = [&] { return "weight shape " + shape_str(weight.sizes()); };
  auto gs = [&] { return "groups " + std::to_string(groups); };

  if (p.Cin % groups != 0) {
    c.fail("x", "shape_constraint: x.dim[1] % groups == 0", xs() + ", " + gs(),
           "use a groups value that divides the input channels x.dim[1]");
  }
  if (!p.transpose) {
    if (weight.size(0) % groups != 0) {
      c.fail("weight", "shape_constraint: weight.dim[0] % groups == 0", ws() + ", " + gs(),
             "give weight a number of output channels weight.dim[0] divisible by groups");
    }
    if (weight.size(1) != p.Cin / groups) {
      c.fail("weight", "shape_constraint: weight.dim[1] == x.dim[1] / groups", ws() + ", " + xs() + ", " + gs(),
             "give weight x.dim[1] / groups = " + std::to_string(p.Cin / groups) +
                 " input channels in dimension 1 (conv2d weights are [Cout, Cin / groups, Kh, Kw])");
    }
    p.Cout = weight.size(0);
  } else {
    if (weight.size(0) != p.Cin) {
      c.fail("weight", "shape_constraint: weight.dim[0] == x.dim[1]", ws() + ", " + xs(),
             "give weight x.dim[1] = " + std::to_string(p.Cin) +
                 " input channels in dimension 0 (conv_transpose2d weights are [Cin, Cout / groups, Kh, Kw])");
    }
    p.Cout = c.mul(weight.size(1), groups, "groups",
                   [&] { return std::pair(std::string("weight.dim[1] * groups"), ws() + ", " + gs()); });
  }
  if (p.Kh < 1 || p.Kw < 1) {
    c.fail("weight", "shape_constraint: weight.dim[2 + i] >= 1", ws(), "use a kernel of at least 1x1");
  }
  if (bias && bias->size(0) != p.Cout) {
    const std::string bs = "bias shape " + shape_str(bias->sizes());
    if (!p.transpose) {
      c.fail("bias", "shape_constraint: bias.dim[0] == weight.dim[0]", bs + ", " + ws(),
             "pass a bias with one value per output channel (" + std::to_string(p.Cout) + ")");
    }
    c.fail("bias", "shape_constraint: bias.dim[0] == weight.dim[1] * groups", bs + ", " + ws() + ", " + gs(),
           "pass a bias with one value per output channel (" + std::to_string(p.Cout) + ")");
  }

  // Spatial sizes: every product is checked; sums of checked terms are evaluated in 128 bits and
  // then range-checked, so nothing wraps before it is compared.
  auto ss = [&] { return "stride " + shape_str(stride); };
  auto ps = [&] { return "padding " + shape_str(padding); };
  auto ds = [&] { return "dilation " + shape_str(dilation); };
  for (int i = 0; i < 2; ++i) {
    auto d = [i] { return "[" + std::to_string(2 + i) + "]"; };
    auto k = [i] { return "[" + std::to_string(i) + "]"; };
    const int64_t in = x.size(2 + i), kernel = weight.size(2 + i);
    const int64_t twice_pad = c.mul(2, padding[i], "padding", [&] { return std::pair("2 * padding" + k(), ps()); });
    const int64_t reach = c.mul(dilation[i], kernel - 1, "dilation", [&] {
      return std::pair("dilation" + k() + " * (weight.dim" + d() + " - 1)", ws() + ", " + ds());
    });
    __int128 size = 0;
    if (!p.transpose) {
      const __int128 padded = static_cast<__int128>(in) + twice_pad;
      if (padded > kInt64Max) {
        c.overflow("padding", "x.dim" + d() + " + 2 * padding" + k(), xs() + ", " + ps());
      }
      if (static_cast<__int128>(reach) + 1 > padded) {
        c.fail("weight", "shape_constraint: dilation[i] * (weight.dim[2 + i] - 1) + 1 <= x.dim[2 + i] + 2 * padding[i]",
               "i = " + std::to_string(i) + ": " + std::to_string(dilation[i]) + " * (" + std::to_string(kernel) + " - 1) + 1 > " +
                   std::to_string(in) + " + 2 * " + std::to_string(padding[i]),
               "use a smaller kernel or dilation, or more padding");
      }
      size = (padded - reach - 1) / stride[i] + 1;
    } else {
      const int64_t spread = c.mul(in - 1, stride[i], "stride",
                                   [&] { return std::pair("(x.dim" + d() + " - 1) * stride" + k(), xs() + ", " + ss()); });
      size = static_cast<__int128>(spread) - twice_pad + reach + p.output_padding[i] + 1;
      if (size > kInt64Max) {
        c.overflow("x",
                   "(x.dim" + d() + " - 1) * stride" + k() + " - 2 * padding" + k() + " + dilation" + k() +
                       " * (weight.dim" + d() + " - 1) + output_padding" + k() + " + 1",
                   xs() + ", " + ws() + ", " + ss() + ", " + ps() + ", " + ds() + ", output_padding " +
                       shape_str(*output_padding));
      }
      if (size < 1) {
        c.fail("x",
               "shape_constraint: (x.dim[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.dim[2 + i] - 1) "
               "+ output_padding[i] + 1 >= 1",
               "i = " + std::to_string(i) + ": (" + std::to_string(in) + " - 1) * " + std::to_string(stride[i]) + " - 2 * " +
                   std::to_string(padding[i]) + " + " + std::to_string(dilation[i]) + " * (" + std::to_string(kernel) +
                   " - 1) + " + std::to_string(p.output_padding[i]) + " + 1 = " + std::to_string(static_cast<int64_t>(size)),
               "use less padding, or a larger input, kernel, stride or dilation");
      }
    }
    (i == 0 ? p.Ho : p.Wo) = static_cast<int64_t>(size);
  }
  return p;
}

// Refuses an output this machine cannot hold, before anything is allocated. The extents are
// multiplied with empty dimensions counted as 1, as a contiguous tensor's strides are: an empty
// batch still needs the strides of its other dimensions to fit in int64.
void check_allocation(const Checker& c, const Problem& p, c10::ScalarType dtype) {
  const std::vector<int64_t> shape = {p.N, p.Cout, p.Ho, p.Wo};
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t extent = element, bytes = element;
  bool overflow = false;
  for (int64_t size : shape) {
    overflow |= c10::mul_overflows(extent, std::max<int64_t>(size, 1), &extent);
    bytes = overflow ? 0 : bytes * size;
  }
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  const std::string what = "out shape " + shape_str(shape) + " of " + dtype_str(dtype) + ": ";
  if (overflow) {
    c.fail("out", kAllocationClause, what + "strides or byte size beyond int64", "use smaller sizes, or split the batch");
  }
  if (bytes > physical) {
    c.fail("out", kAllocationClause,
           what + std::to_string(bytes) + " bytes, physical memory " + std::to_string(physical) + " bytes",
           "use smaller sizes, or split the batch");
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points.

at::Tensor& run(const std::string& op, const at::Tensor& x, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                at::IntArrayRef dilation, std::optional<at::IntArrayRef> output_padding, int64_t groups,
                at::Tensor* out_arg, at::Tensor& result) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  const KernelRule& rule = check_inputs(op, {&x, &weight, b});
  const Checker checker{op, rule};
  const Problem p = validate(checker, x, weight, b, stride, padding, dilation, output_padding, groups);
  const std::vector<int64_t> shape = {p.N, p.Cout, p.Ho, p.Wo};
  if (out_arg) {
    check_out(rule, *out_arg, x.scalar_type(), shape, {&x, &weight, b});
    result = *out_arg;
  } else {
    check_allocation(checker, p, x.scalar_type());
    result = at::empty(shape, x.options().memory_format(at::MemoryFormat::Contiguous));
  }
  const ConvolutionKernel kernel = FUEL_KERNELS_FOR_CPU(convolution_kernels).convolve[kernel_dtype_slot(x.scalar_type())];
  kernel(p, x.const_data_ptr(), weight.const_data_ptr(), b ? b->const_data_ptr() : nullptr, result.mutable_data_ptr());
  return result;
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  at::Tensor result;
  return run("conv2d", x, weight, bias, stride, padding, dilation, std::nullopt, groups, nullptr, result);
}

at::Tensor& conv2d_out(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       at::Tensor& out) {
  at::Tensor result;
  run("conv2d", x, weight, bias, stride, padding, dilation, std::nullopt, groups, &out, result);
  return out;
}

at::Tensor conv_transpose2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                            int64_t groups, at::IntArrayRef dilation) {
  at::Tensor result;
  return run("conv_transpose2d", x, weight, bias, stride, padding, dilation, output_padding, groups, nullptr, result);
}

at::Tensor& conv_transpose2d_out(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                                 int64_t groups, at::IntArrayRef dilation, at::Tensor& out) {
  at::Tensor result;
  run("conv_transpose2d", x, weight, bias, stride, padding, dilation, output_padding, groups, &out, result);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fuel, CPU, m) {
  m.impl("conv2d", TORCH_FN(conv2d));
  m.impl("conv2d.out", TORCH_FN(conv2d_out));
  m.impl("conv_transpose2d", TORCH_FN(conv_transpose2d));
  m.impl("conv_transpose2d.out", TORCH_FN(conv_transpose2d_out));
}

}  // namespace fuel
