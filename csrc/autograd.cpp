// Autograd for every fuel op, in C++ (TORCH_LIBRARY_IMPL(fuel, Autograd, m)), so that a call pays no Python:
// with grad off, or no input requiring grad, the autograd kernel is a few flag tests and a redispatch.
//
// Each functional op gets a backward node written the way torch's generated VariableType code writes its own
// (a Node subclass, collect_next_edges, set_history, SavedVariable) rather than a torch::autograd::Function:
// Function::apply refuses to run under torch.func transforms ("cannot use C++ torch::autograd::Function with
// functorch transforms"), a plain node does not, so torch.func.grad and vjp work as they do for torch's ops.
//
// The formulas are torch 2.13's own (tools/autograd/derivatives.yaml and FunctionsManual.cpp), in the same
// operation order, with our kernels wherever one exists. Backward calls the fuel ops through the dispatcher, so
// a backward pass is itself recorded by these kernels and differentiates again (double backward). Torch supplies
// only what we have no kernel for: where/masked_fill, neg, log, floor division and layout changes.
//
// Convolution: conv2d and conv_transpose2d are each other's adjoint, so each one's input gradient is the other
// op; a weight gradient is a grouped conv2d in which the batch becomes the reduction (see conv2d_weight_grad); a
// bias gradient is our sum, fuel_backward::conv_bias_grad (csrc/convolution/bias_grad.cpp), with an autograd
// kernel of its own below. Sizes are read as SymInts, so AOTAutograd can trace the backward with dynamic shapes.
//
// Two things a backward formula alone would get silently wrong, and these kernels turn into errors:
// - Forward-mode AD: there is no forward formula, and a dual tensor would pass through the op with its tangent
//   dropped. Every kernel here refuses tangents first, naming the op.
// - The .out overloads: like torch's out= functions they have no autograd; with grad mode on and an argument that
//   requires grad they raise, instead of returning a result cut off from the graph.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "convolution/weight_grad.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fuel {
namespace {

using at::Tensor;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// ---------------------------------------------------------------------------------------------------
// The fuel ops, called through the dispatcher (so that their own autograd kernels record them).

using BinarySignature = Tensor(const Tensor&, const Tensor&);
using Conv2dSignature = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, int64_t);
using ConvTranspose2dSignature = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, at::IntArrayRef,
                                        at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef);

template <typename Signature>
c10::TypedOperatorHandle<Signature> fuel_op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Signature>();
}

// One handle per op, looked up on first use (after the schemas are registered) and kept.
#define FUEL_BINARY(fn, qualified)                                         \
  Tensor fn(const Tensor& a, const Tensor& b) {                            \
    static const auto op = fuel_op<BinarySignature>(qualified);            \
    return op.call(a, b);                                                  \
  }
FUEL_BINARY(fuel_sub, "fuel::sub")
FUEL_BINARY(fuel_mul, "fuel::mul")
FUEL_BINARY(fuel_div, "fuel::div")
FUEL_BINARY(fuel_pow, "fuel::pow")
#undef FUEL_BINARY

Tensor fuel_conv2d(const Tensor& x, const Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
                   at::IntArrayRef dilation, int64_t groups) {
  static const auto op = fuel_op<Conv2dSignature>("fuel::conv2d");
  return op.call(x, weight, std::nullopt, stride, padding, dilation, groups);
}

Tensor fuel_conv_transpose2d(const Tensor& x, const Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation) {
  static const auto op = fuel_op<ConvTranspose2dSignature>("fuel::conv_transpose2d");
  return op.call(x, weight, std::nullopt, stride, padding, output_padding, groups, dilation);
}

// ---------------------------------------------------------------------------------------------------
// What every autograd kernel checks first.

bool has_tangent(const Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }
bool has_tangent(const std::optional<Tensor>& t) { return t.has_value() && has_tangent(*t); }
template <typename T> bool has_tangent(const T&) { return false; }  // ints and int lists

bool requires_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }
bool requires_grad(const std::optional<Tensor>& t) { return t.has_value() && requires_grad(*t); }
template <typename T> bool requires_grad(const T&) { return false; }

template <typename... Args>
void refuse_forward_ad_in(const std::string_view library, const std::string_view op, const Args&... args) {
  if ((has_tangent(args) || ...)) {
    TORCH_CHECK(false, library, "::", op, ": forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not "
                "supported: the op registers a backward formula only. Use reverse mode (backward, "
                "torch.autograd.grad), or the torch op for forward-mode derivatives.");
  }
}

template <typename... Args>
void refuse_forward_ad(const std::string_view op, const Args&... args) {
  refuse_forward_ad_in("fuel", op, args...);
}

// Incoming gradients can be expanded (the backward of sum) or strided; our kernels take neither.
Tensor dense(const Tensor& t) {
  if (!t.defined() || (t.is_contiguous() && t.sym_storage_offset() == 0)) return t;
  return t.clone(at::MemoryFormat::Contiguous);
}

// The convolutions also take channels_last operands as they are, and a channels_last model's
// gradients arrive so: copied into NCHW, two such copies took 7% of a bfloat16 ResNet block's
// training step.
Tensor conv_dense(const Tensor& t) {
  if (t.defined() && t.dim() == 4 && t.sym_storage_offset() == 0 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return t;
  }
  return dense(t);
}

// ---------------------------------------------------------------------------------------------------
// .out overloads: no autograd, as torch's out= functions.

template <typename Op, typename... Args>
Tensor& out_autograd(c10::DispatchKeySet keys, Args... args) {
  static const auto op = fuel_op<Tensor&(Args...)>(Op::qualified, "out");
  refuse_forward_ad(Op::out_name, args...);
  TORCH_CHECK(!at::GradMode::is_enabled() || !(requires_grad(args) || ...), "fuel::", Op::name,
              ".out: out= does not support automatic differentiation, but an argument requires grad. Call fuel::",
              Op::name, " (torch.ops.fuel.", Op::name, ") to get a differentiable result, or run under "
              "torch.no_grad().");
  at::AutoDispatchBelowAutograd guard;
  return op.redispatch(keys & c10::after_autograd_keyset, args...);
}

// ---------------------------------------------------------------------------------------------------
// Elementwise: (grad_lhs, grad_rhs) as functions of (grad, lhs, rhs, result), as in derivatives.yaml. Each Op
// says what its formulas read, so that add/sub keep nothing alive and only pow keeps its result.

Tensor ones(const Tensor& like) { return at::ones_like(like, like.options(), at::MemoryFormat::Contiguous); }
Tensor half(const Tensor& g) { return fuel_div(g, at::full_like(g, 2, g.options(), at::MemoryFormat::Contiguous)); }

// maximum/minimum: a tie splits the gradient in half; otherwise the winner takes it. With a NaN operand no
// comparison holds and torch gives both operands the whole gradient; so do we. `loses(a, b)`: a does not win.
template <typename Loses>
Tensor selection_grad(const Tensor& g, const Tensor& a, const Tensor& b, Loses loses) {
  return at::where(a == b, half(g), g).masked_fill(loses(a, b), 0);
}
Tensor less(const Tensor& a, const Tensor& b) { return a < b; }
Tensor greater(const Tensor& a, const Tensor& b) { return a > b; }

struct Add {
  static constexpr const char *name = "add", *qualified = "fuel::add", *out_name = "add.out";
  static constexpr bool saves_inputs = false, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return g; }
  static Tensor grad_rhs(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return g; }
};
struct Sub {
  static constexpr const char *name = "sub", *qualified = "fuel::sub", *out_name = "sub.out";
  static constexpr bool saves_inputs = false, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return g; }
  static Tensor grad_rhs(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return at::neg(g); }
};
struct Mul {
  static constexpr const char *name = "mul", *qualified = "fuel::mul", *out_name = "mul.out";
  static constexpr bool saves_inputs = true, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor&, const Tensor& b, const Tensor&) { return fuel_mul(g, b); }
  static Tensor grad_rhs(const Tensor& g, const Tensor& a, const Tensor&, const Tensor&) { return fuel_mul(g, a); }
};
struct Div {
  static constexpr const char *name = "div", *qualified = "fuel::div", *out_name = "div.out";
  static constexpr bool saves_inputs = true, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor&, const Tensor& b, const Tensor&) { return fuel_div(g, b); }
  static Tensor grad_rhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    return fuel_mul(at::neg(g), fuel_div(fuel_div(a, b), b));
  }
};
struct Maximum {
  static constexpr const char *name = "maximum", *qualified = "fuel::maximum", *out_name = "maximum.out";
  static constexpr bool saves_inputs = true, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    return selection_grad(g, a, b, less);
  }
  static Tensor grad_rhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    return selection_grad(g, b, a, less);
  }
};
struct Minimum {
  static constexpr const char *name = "minimum", *qualified = "fuel::minimum", *out_name = "minimum.out";
  static constexpr bool saves_inputs = true, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    return selection_grad(g, a, b, greater);
  }
  static Tensor grad_rhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    return selection_grad(g, b, a, greater);
  }
};
struct Pow {
  static constexpr const char *name = "pow", *qualified = "fuel::pow", *out_name = "pow.out";
  static constexpr bool saves_inputs = true, saves_result = true;
  // b * a^(b-1), and exactly 0 where b == 0 (so pow(0, 0) has gradient 0, not 0 * inf).
  static Tensor grad_lhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    const Tensor scaled = fuel_mul(g, fuel_mul(b, fuel_pow(a, fuel_sub(b, ones(b)))));
    return at::where(b == 0, 0.0, scaled);
  }
  // a^b * log(a), with torch's one mask: 0 where a == 0 and b >= 0 (there a^b is 0 or 1 for every b nearby). A
  // negative base is not masked: log gives NaN there, as in torch.
  static Tensor grad_rhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor& y) {
    return fuel_mul(g, at::where((a == 0).logical_and(b >= 0), 0.0, fuel_mul(y, at::log(a))));
  }
};
struct Rem {
  static constexpr const char *name = "rem", *qualified = "fuel::rem", *out_name = "rem.out";
  static constexpr bool saves_inputs = true, saves_result = false;
  static Tensor grad_lhs(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return g; }
  static Tensor grad_rhs(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
    return fuel_mul(at::neg(g), at::div(a, b, "floor"));
  }
};

template <typename Op>
struct ElementwiseBackward : Node {
  SavedVariable lhs, rhs, result;

  std::string name() const override { return std::string("fuel::") + Op::name + "_backward"; }

  void release_variables() override {
    lhs.reset_data();
    rhs.reset_data();
    result.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const Tensor g = dense(grads[0]);
    variable_list result_grads(2);
    if (!g.defined()) return result_grads;
    const Tensor a = Op::saves_inputs ? lhs.unpack() : Tensor();
    const Tensor b = Op::saves_inputs ? rhs.unpack() : Tensor();
    const Tensor y = Op::saves_result ? result.unpack(getptr()) : Tensor();
    if (task_should_compute_output(0)) result_grads[0] = Op::grad_lhs(g, a, b, y);
    if (task_should_compute_output(1)) result_grads[1] = Op::grad_rhs(g, a, b, y);
    return result_grads;
  }
};

template <typename Op>
Tensor binary_autograd(c10::DispatchKeySet keys, const Tensor& lhs, const Tensor& rhs) {
  static const auto op = fuel_op<BinarySignature>(Op::qualified);
  refuse_forward_ad(Op::name, lhs, rhs);
  c10::intrusive_ptr<ElementwiseBackward<Op>> grad_fn;
  if (torch::autograd::compute_requires_grad(lhs, rhs)) {
    grad_fn = c10::make_intrusive<ElementwiseBackward<Op>>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(lhs, rhs));
    if (Op::saves_inputs) {
      grad_fn->lhs = SavedVariable(lhs, /*is_output=*/false);
      grad_fn->rhs = SavedVariable(rhs, /*is_output=*/false);
    }
  }
  Tensor result = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.redispatch(keys & c10::after_autograd_keyset, lhs, rhs);
  }();
  if (grad_fn) {
    torch::autograd::set_history(result, grad_fn);
    if (Op::saves_result) grad_fn->result = SavedVariable(result, /*is_output=*/true);
  }
  return result;
}

template <typename Op>
void register_elementwise(torch::Library& m) {
  const std::string name(Op::name);
  m.impl(name.c_str(), TORCH_FN(binary_autograd<Op>));
  m.impl((name + ".out").c_str(), TORCH_FN((out_autograd<Op, const Tensor&, const Tensor&, Tensor&>)));
}

// ---------------------------------------------------------------------------------------------------
// Convolution.

struct Conv2d {
  static constexpr const char *name = "conv2d", *qualified = "fuel::conv2d", *out_name = "conv2d.out";
};
struct ConvTranspose2d {
  static constexpr const char *name = "conv_transpose2d", *qualified = "fuel::conv_transpose2d",
                              *out_name = "conv_transpose2d.out";
};

// t [N][C][H][W] as a dense [C][N][H][W]. A contiguous t is copied as [C][N][H * W] (runs of H * W
// elements), which torch copies about 3x faster in float32 than the 4-d transposed view.
Tensor swap_images_and_channels(const Tensor& t) {
  if (!t.is_contiguous()) return dense(t.transpose(0, 1));
  return t.flatten(2).transpose(0, 1).contiguous().view_symint(
      {t.sym_size(1), t.sym_size(0), t.sym_size(2), t.sym_size(3)});
}

// d(sum(grad_out * conv2d(x, w)))/dw, as one fuel conv2d.
//
// dw[o, i, kh, kw] = sum over images n and output positions p of grad_out[n, o, p] * x[n, i, p*stride + k*dilation
// - padding]. Read as a convolution over (image, group) channels, the batch is the reduction: input x arranged
// [Cin/groups, groups*N, H, W], weights grad_out arranged [Cout, N, Ho, Wo], grouped by the conv's groups, with
// stride and dilation trading places. The result can extend past the kernel (positions no output reached are still
// "in range" of the swapped conv): keep the first kh x kw.
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& grad_out, const c10::SymInt& kh, const c10::SymInt& kw,
                          at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  const auto n = x.sym_size(0), c_in = x.sym_size(1);
  const auto c_out = grad_out.sym_size(1);
  if (n == 0) return at::zeros_symint({c_out, c_in / groups, kh, kw}, x.options());
  // Without a graph to record (no double backward), the brgemm and depthwise paths read x and grad_out in place.
  const std::optional<int64_t> kh_int = kh.maybe_as_int(), kw_int = kw.maybe_as_int();
  if (!at::GradMode::is_enabled() && kh_int && kw_int) {
    if (groups == 1) {
      if (auto dw = weight_grad_on_brgemm(x, grad_out, *kh_int, *kw_int, stride, padding, dilation)) return *dw;
    } else if (c_in == groups && c_out == groups) {
      if (auto dw = weight_grad_depthwise(x, grad_out, *kh_int, *kw_int, stride, padding, dilation)) return *dw;
    }
  }
  // Built with cat rather than as a reshape-permute-reshape view: inductor (torch 2.13) crashes on a
  // view with symbolic strides that the partitioner saves from the forward graph (dynamic=True training).
  Tensor xs = swap_images_and_channels(x);
  if (groups > 1) {
    std::vector<Tensor> per_group;
    for (const Tensor& part : x.chunk(groups, 1)) per_group.push_back(part.transpose(0, 1));
    xs = dense(at::cat(per_group, 1));
  }
  const Tensor gs = swap_images_and_channels(grad_out);
  const Tensor full = fuel_conv2d(xs, gs, dilation, padding, stride, groups);
  return full.slice_symint(2, 0, kh).slice_symint(3, 0, kw).transpose(0, 1).contiguous();
}

// The bias gradient, by our own op (csrc/convolution/bias_grad.cpp): a fixed order that does not
// depend on the layout, and recorded as itself when torch.compile traces the backward.
Tensor bias_grad(const Tensor& g) {
  static const auto op = fuel_op<Tensor(const Tensor&)>("fuel_backward::conv_bias_grad");
  return op.call(g);
}

// conv_transpose2d's output length without output_padding, for input length `in`.
c10::SymInt transposed_size(const c10::SymInt& in, const c10::SymInt& k, int64_t stride, int64_t padding,
                            int64_t dilation) {
  return (in - 1) * stride - 2 * padding + (k - 1) * dilation + 1;
}

struct ConvBackward : Node {
  bool transpose = false;
  SavedVariable x, weight;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;

  std::string name() const override {
    return transpose ? "fuel::conv_transpose2d_backward" : "fuel::conv2d_backward";
  }

  void release_variables() override {
    x.reset_data();
    weight.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const Tensor g = conv_dense(grads[0]);
    variable_list result(3);  // x, weight, bias
    if (!g.defined()) return result;
    const Tensor input = x.unpack(), w = weight.unpack();
    const c10::SymInt kh = w.sym_size(2), kw = w.sym_size(3);
    if (task_should_compute_output(0)) result[0] = transpose ? transposed_input_grad(g, input, w) : input_grad(g, input, w);
    if (task_should_compute_output(1)) {
      // conv_transpose2d(x, w) is the input gradient of conv2d(., w); its weight gradient is conv2d's weight
      // gradient with grad as the image and x as the output gradient.
      result[1] = transpose ? conv2d_weight_grad(g, input, kh, kw, stride, padding, dilation, groups)
                            : conv2d_weight_grad(input, g, kh, kw, stride, padding, dilation, groups);
    }
    if (task_should_compute_output(2)) result[2] = bias_grad(g);
    return result;
  }

  // conv2d's adjoint: conv_transpose2d maps grad back onto x's grid; output_padding restores the rows and columns
  // the forward's floor division dropped (always fewer than stride).
  Tensor input_grad(const Tensor& g, const Tensor& input, const Tensor& w) const {
    int64_t output_padding[2];
    for (int d = 0; d < 2; ++d) {
      const c10::SymInt full = transposed_size(g.sym_size(2 + d), w.sym_size(2 + d), stride[d], padding[d], dilation[d]);
      output_padding[d] = (input.sym_size(2 + d) - full).guard_int(__FILE__, __LINE__);
    }
    return fuel_conv_transpose2d(g, w, stride, padding, output_padding, groups, dilation);
  }

  // conv_transpose2d's adjoint is conv2d with the same weight. When output_padding >= stride (torch allows it up to
  // dilation) the conv2d reaches past x's grid: those extra rows/columns are not x's, drop them.
  Tensor transposed_input_grad(const Tensor& g, const Tensor& input, const Tensor& w) const {
    Tensor grad_x = fuel_conv2d(g, w, stride, padding, dilation, groups);
    if (grad_x.sym_size(2) != input.sym_size(2) || grad_x.sym_size(3) != input.sym_size(3)) {
      grad_x = grad_x.slice_symint(2, 0, input.sym_size(2)).slice_symint(3, 0, input.sym_size(3)).contiguous();
    }
    return grad_x;
  }
};

// `forward` redispatches the call below autograd.
template <typename Forward>
Tensor conv_autograd(bool transpose, const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                     at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                     Forward forward) {
  c10::intrusive_ptr<ConvBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(x, weight, bias)) {
    grad_fn = c10::make_intrusive<ConvBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
    grad_fn->transpose = transpose;
    grad_fn->x = SavedVariable(x, /*is_output=*/false);
    grad_fn->weight = SavedVariable(weight, /*is_output=*/false);
    grad_fn->stride = stride.vec();
    grad_fn->padding = padding.vec();
    grad_fn->dilation = dilation.vec();
    grad_fn->groups = groups;
  }
  Tensor result = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward();
  }();
  if (grad_fn) torch::autograd::set_history(result, grad_fn);
  return result;
}

Tensor conv2d_autograd(c10::DispatchKeySet keys, const Tensor& x, const Tensor& weight,
                       const std::optional<Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                       at::IntArrayRef dilation, int64_t groups) {
  static const auto op = fuel_op<Conv2dSignature>(Conv2d::qualified);
  refuse_forward_ad(Conv2d::name, x, weight, bias);
  return conv_autograd(false, x, weight, bias, stride, padding, dilation, groups, [&] {
    return op.redispatch(keys & c10::after_autograd_keyset, x, weight, bias, stride, padding, dilation, groups);
  });
}

Tensor conv_transpose2d_autograd(c10::DispatchKeySet keys, const Tensor& x, const Tensor& weight,
                                 const std::optional<Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation) {
  static const auto op = fuel_op<ConvTranspose2dSignature>(ConvTranspose2d::qualified);
  refuse_forward_ad(ConvTranspose2d::name, x, weight, bias);
  return conv_autograd(true, x, weight, bias, stride, padding, dilation, groups, [&] {
    return op.redispatch(keys & c10::after_autograd_keyset, x, weight, bias, stride, padding, output_padding, groups,
                         dilation);
  });
}

// fuel_backward::conv_bias_grad is differentiable too (double backward of a biased conv): its
// gradient spreads each channel's incoming value over every image and position, as sum's does.
struct BiasGradBackward : Node {
  std::vector<c10::SymInt> sizes;

  std::string name() const override { return "fuel_backward::conv_bias_grad_backward"; }

  variable_list apply(variable_list&& grads) override {
    variable_list result(1);
    if (grads[0].defined() && task_should_compute_output(0)) {
      result[0] = grads[0].reshape_symint({1, sizes[1], 1, 1}).expand_symint(sizes);
    }
    return result;
  }
};

Tensor bias_grad_autograd(c10::DispatchKeySet keys, const Tensor& grad) {
  static const auto op = fuel_op<Tensor(const Tensor&)>("fuel_backward::conv_bias_grad");
  refuse_forward_ad_in("fuel_backward", "conv_bias_grad", grad);
  c10::intrusive_ptr<BiasGradBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(grad)) {
    grad_fn = c10::make_intrusive<BiasGradBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(grad));
    grad_fn->sizes = grad.sym_sizes().vec();
  }
  Tensor result = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.redispatch(keys & c10::after_autograd_keyset, grad);
  }();
  if (grad_fn) torch::autograd::set_history(result, grad_fn);
  return result;
}

using OptionalTensor = const std::optional<Tensor>&;

}  // namespace

TORCH_LIBRARY_IMPL(fuel, Autograd, m) {
  register_elementwise<Add>(m);
  register_elementwise<Sub>(m);
  register_elementwise<Mul>(m);
  register_elementwise<Div>(m);
  register_elementwise<Maximum>(m);
  register_elementwise<Minimum>(m);
  register_elementwise<Pow>(m);
  register_elementwise<Rem>(m);
  m.impl("conv2d", TORCH_FN(conv2d_autograd));
  m.impl("conv2d.out", TORCH_FN((out_autograd<Conv2d, const Tensor&, const Tensor&, OptionalTensor, at::IntArrayRef,
                                               at::IntArrayRef, at::IntArrayRef, int64_t, Tensor&>)));
  m.impl("conv_transpose2d", TORCH_FN(conv_transpose2d_autograd));
  m.impl("conv_transpose2d.out",
         TORCH_FN((out_autograd<ConvTranspose2d, const Tensor&, const Tensor&, OptionalTensor, at::IntArrayRef,
                                at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef, Tensor&>)));
}

TORCH_LIBRARY_IMPL(fuel_backward, Autograd, m) { m.impl("conv_bias_grad", TORCH_FN(bias_grad_autograd)); }

}  // namespace fuel
