#include "geometry.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace fuel {

const char* const kOverflowClause = "op_params.overflow: every intermediate size and product fits in int64";
constexpr const char* kAllocationClause =
    "return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64";
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

namespace {

// stride, padding, dilation, output_padding and groups, in the order the Python twin checks them.
void check_params(const Checker& c, Problem& p, at::IntArrayRef stride, at::IntArrayRef padding,
                  at::IntArrayRef dilation, std::optional<at::IntArrayRef> output_padding, int64_t groups) {
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
}

// Channel counts against groups, the weight's channel slot, the kernel size and the bias length.
void check_channels(const Checker& c, Problem& p, const at::Tensor& x, const at::Tensor& weight,
                    const at::Tensor* bias) {
  const int64_t groups = p.groups;
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
}

// The output size along axis i (0: height, 1: width). Every product is checked; sums of checked
// terms are evaluated in 128 bits and then range-checked, so nothing wraps before it is compared.
int64_t output_size(const Checker& c, const Problem& p, int i, const at::Tensor& x, const at::Tensor& weight,
                    std::optional<at::IntArrayRef> output_padding) {
  const at::IntArrayRef stride(p.stride, 2), padding(p.padding, 2), dilation(p.dilation, 2);
  auto xs = [&] { return "x shape " + shape_str(x.sizes()); };
  auto ws = [&] { return "weight shape " + shape_str(weight.sizes()); };
  auto ss = [&] { return "stride " + shape_str(stride); };
  auto ps = [&] { return "padding " + shape_str(padding); };
  auto ds = [&] { return "dilation " + shape_str(dilation); };
  auto d = [i] { return "[" + std::to_string(2 + i) + "]"; };
  auto k = [i] { return "[" + std::to_string(i) + "]"; };
  const int64_t in = x.size(2 + i), kernel = weight.size(2 + i);
  const int64_t twice_pad = c.mul(2, padding[i], "padding", [&] { return std::pair("2 * padding" + k(), ps()); });
  const int64_t reach = c.mul(dilation[i], kernel - 1, "dilation", [&] {
    return std::pair("dilation" + k() + " * (weight.dim" + d() + " - 1)", ws() + ", " + ds());
  });
  if (!p.transpose) {
    const __int128 padded = static_cast<__int128>(in) + twice_pad;
    if (padded > kInt64Max) c.overflow("padding", "x.dim" + d() + " + 2 * padding" + k(), xs() + ", " + ps());
    if (static_cast<__int128>(reach) + 1 > padded) {
      c.fail("weight", "shape_constraint: dilation[i] * (weight.dim[2 + i] - 1) + 1 <= x.dim[2 + i] + 2 * padding[i]",
             "i = " + std::to_string(i) + ": " + std::to_string(dilation[i]) + " * (" + std::to_string(kernel) +
                 " - 1) + 1 > " + std::to_string(in) + " + 2 * " + std::to_string(padding[i]),
             "use a smaller kernel or dilation, or more padding");
    }
    return static_cast<int64_t>((padded - reach - 1) / stride[i] + 1);
  }
  const int64_t spread = c.mul(in - 1, stride[i], "stride",
                               [&] { return std::pair("(x.dim" + d() + " - 1) * stride" + k(), xs() + ", " + ss()); });
  const __int128 size = static_cast<__int128>(spread) - twice_pad + reach + p.output_padding[i] + 1;
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
  return static_cast<int64_t>(size);
}

}  // namespace

Problem validate(const Checker& c, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias,
                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                 std::optional<at::IntArrayRef> output_padding, int64_t groups) {
  Problem p;
  check_params(c, p, stride, padding, dilation, output_padding, groups);
  check_channels(c, p, x, weight, bias);
  p.Ho = output_size(c, p, 0, x, weight, output_padding);
  p.Wo = output_size(c, p, 1, x, weight, output_padding);
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

}  // namespace fuel
