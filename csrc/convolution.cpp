// The convolution family: fuel::conv2d and fuel::conv_transpose2d (NCHW, groups, stride, padding,
// dilation, output_padding), four dtypes each.
//
// One chassis serves all 8 kernels. A task computes a block of output positions of one image, one
// group and a block of output channels as a small matrix product
//     out[co][p] = bias[co] + sum_t W[co][t] * col[t][p]
// over the taps t = (ci, kh, kw) that reach those positions. col is gathered from x for the task
// (implicit zero padding, stride and dilation resolved there), so the arithmetic loop has no
// branches and runs on whole vectors. conv_transpose2d is the same gather: its output positions
// are split into stride phases (oh % stride), and within a phase it is an ordinary stride-1
// correlation over the taps that land on that phase. Nothing is scattered, so there is no race.
//
// Accumulation is in acc_t (float for f32/bf16/f16, double for f64): bf16/f16 widen on load and
// narrow once on store, bias included in the accumulator. Every output's sum runs in one fixed
// order, in three levels: blocks of kBlock taps, each a chain of fused multiply-adds (the first
// block's chain starts at the bias, the others at zero); the blocks of each chunk of kTapChunk taps
// summed from zero; the chunk sums added in turn to the running total. That order depends on the
// geometry only, never on the thread count or on how the work is split, so results are
// bit-identical for every torch.set_num_threads. Short sums round once per tap, like a plain fused
// chain; long ones stay more accurate than torch's own (measured against a float64 reference).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/safe_numerics.h>
#include <torch/library.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "contract_rules.h"

namespace fuel {
namespace {

using at::vec::Vectorized;

// ---------------------------------------------------------------------------------------------
// Validation. The clause texts quote contracts/convolution.fkc.md; fuel_torch/convolution.py is
// the Python twin and must produce the same messages in the same order (a test compares them).

constexpr const char* kOverflowClause = "op_params.overflow: every intermediate size and product fits in int64";
constexpr const char* kAllocationClause =
    "return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64";
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

struct Problem {
  bool transpose = false;
  int64_t N = 0, Cin = 0, H = 0, W = 0, Cout = 0, Kh = 0, Kw = 0, Ho = 0, Wo = 0, groups = 1;
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1}, output_padding[2] = {0, 0};
};

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
// The chassis.

constexpr int64_t kBlock = 16;           // taps per fused multiply-add chain
constexpr int64_t kTapChunk = 256;       // taps gathered at once (a multiple of kBlock)
constexpr int64_t kChannelChunk = 256;   // output channels per task
constexpr int64_t kScratchBytes = 131072; // per thread, for the gathered taps and for the running totals
constexpr int64_t kMaxPositions = 4096;   // output positions per task, at most
constexpr int kChannelBlock = 6;         // output channels per register block (12 accumulators)
constexpr int kVectorBlock = 2;          // vectors of positions per register block
static_assert(kTapChunk % kBlock == 0, "a tap chunk must hold whole blocks, or chunking would change the sums");

template <typename T> using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
constexpr bool is_half = std::is_same_v<T, at::BFloat16> || std::is_same_v<T, at::Half>;

// floor(a / b) for b > 0, clamped to +-2^62: callers clamp it to a grid range anyway, and the margin
// lets them add or negate it without overflow.
int64_t floor_div(__int128 a, int64_t b) {
  __int128 q = a / b;
  if (a % b != 0 && a < 0) --q;
  constexpr __int128 limit = __int128(1) << 62;
  return static_cast<int64_t>(std::clamp<__int128>(q, -limit, limit));
}

// One kernel tap along one axis: the kernel index, and the grid range [lo, hi) whose input
// coordinate step * j + offset lies inside the input.
struct Tap {
  int64_t k, offset, lo, hi;
};

// The output positions r + out_step * j (j in [0, count)) of one phase along one axis, and the taps
// that reach them. conv2d has one phase per axis (r = 0, out_step = 1, in_step = stride);
// conv_transpose2d has one per stride residue (out_step = stride, in_step = 1).
struct Phase {
  int64_t r, count;
  std::vector<Tap> taps;
};

struct Axis {
  int64_t in_step, out_step;
  std::vector<Phase> phases;
};

Axis make_axis(const Problem& p, int i) {
  const int64_t in = i == 0 ? p.H : p.W, out = i == 0 ? p.Ho : p.Wo, kernel = i == 0 ? p.Kh : p.Kw;
  const int64_t s = p.stride[i], pad = p.padding[i], d = p.dilation[i];
  Axis axis;
  auto tap = [&](int64_t k, __int128 offset, int64_t step, int64_t count) {
    // step * j + offset in [0, in)  <=>  j in [ceil(-offset / step), floor((in - 1 - offset) / step)]
    const int64_t lo = -floor_div(offset, step);
    const int64_t hi = floor_div(static_cast<__int128>(in) - 1 - offset, step) + 1;
    return Tap{k, static_cast<int64_t>(offset), std::clamp<int64_t>(lo, 0, count), std::clamp<int64_t>(hi, 0, count)};
  };
  if (!p.transpose) {
    axis = {s, 1, {Phase{0, out, {}}}};
    for (int64_t k = 0; k < kernel; ++k) {
      axis.phases[0].taps.push_back(tap(k, static_cast<__int128>(k) * d - pad, s, out));
    }
    return axis;
  }
  // out index o = i * s - pad + k * d, so tap k reaches the outputs o = r + s * j with
  // r = (k * d - pad) mod s, reading input row j + (r + pad - k * d) / s.
  axis = {1, s, {}};
  const int64_t n_phases = std::min(s, out);
  for (int64_t r = 0; r < n_phases; ++r) {
    axis.phases.push_back(Phase{r, static_cast<int64_t>((static_cast<__int128>(out) - r + s - 1) / s), {}});
  }
  for (int64_t k = 0; k < kernel; ++k) {
    const __int128 reach = static_cast<__int128>(k) * d - pad;
    const int64_t r = static_cast<int64_t>(((reach % s) + s) % s);
    if (r >= n_phases) continue;  // lands on no output
    Phase& phase = axis.phases[r];
    phase.taps.push_back(tap(k, (r - reach) / s, 1, phase.count));
  }
  return axis;
}

template <typename T>
inline void zero(T* dst, int64_t n) {
  using Vec = Vectorized<T>;
  const Vec z(T(0));
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) z.store(dst + i);
  for (; i < n; ++i) dst[i] = T(0);
}

template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline void widen(const scalar_t* src, acc_t* dst, int64_t n) {
  if constexpr (!is_half<scalar_t>) {
    // Short runs are the common case (one input row per segment): inline vector moves, no memmove.
    using Vec = Vectorized<acc_t>;
    int64_t i = 0;
    for (; i + Vec::size() <= n; i += Vec::size()) Vec::loadu(src + i).store(dst + i);
    for (; i < n; ++i) dst[i] = src[i];
  } else {
    constexpr int64_t step = Vectorized<scalar_t>::size(), half = Vectorized<float>::size();
    for (int64_t i = 0; i < n; i += step) {
      const int64_t count = std::min(step, n - i);
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(Vectorized<scalar_t>::loadu(src + i, count));
      lo.store(dst + i, std::min(half, count));
      if (count > half) hi.store(dst + i + half, count - half);
    }
  }
}

// Narrowing (round to nearest even) of a contiguous run: every element through the same vector code.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline void narrow(const acc_t* src, scalar_t* dst, int64_t n) {
  if constexpr (!is_half<scalar_t>) {
    std::copy(src, src + n, dst);
  } else {
    constexpr int64_t step = Vectorized<scalar_t>::size(), half = Vectorized<float>::size();
    for (int64_t i = 0; i < n; i += step) {
      const int64_t count = std::min(step, n - i);
      const auto lo = Vectorized<float>::loadu(src + i, std::min(half, count));
      const auto hi = count > half ? Vectorized<float>::loadu(src + i + half, count - half) : Vectorized<float>(0.f);
      at::vec::convert_from_float<scalar_t>(lo, hi).store(dst + i, count);
    }
  }
}

// outer[c][0..VB vectors) += sum over taps [0, taps) of w[c][t] * col[t][0..VB vectors), for CB
// channels. The taps (one chunk, at most kTapChunk, starting at a multiple of it) are summed in
// three levels: blocks of kBlock taps as fused chains, the chunk's blocks from zero, then the chunk
// into the running total; in the first chunk the first chain starts at the running total (the
// bias) and the chunk sum replaces it. Block and chunk boundaries sit at fixed multiples from the
// first tap, so the order of every sum is fixed by the geometry; CB and VB only choose how many
// sums run side by side.
template <typename acc_t, int CB, int VB>
inline void multiply_block(const acc_t* w, int64_t ldw, const acc_t* col, int64_t ldc, int64_t taps, acc_t* outer,
                           int64_t ldo, bool first_chunk) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  Vec chunk[CB][VB];
  for (int c = 0; c < CB; ++c) {
    for (int v = 0; v < VB; ++v) chunk[c][v] = Vec(acc_t(0));
  }
  for (int64_t t0 = 0; t0 < taps; t0 += kBlock) {
    const int64_t t1 = std::min(taps, t0 + kBlock);
    // The very first block's chain starts at the running total (the bias), so that a short sum is
    // one fused chain from the bias, rounded once per tap.
    const bool from_bias = first_chunk && t0 == 0;
    Vec acc[CB][VB];
    for (int c = 0; c < CB; ++c) {
      for (int v = 0; v < VB; ++v) acc[c][v] = from_bias ? Vec::loadu(outer + c * ldo + v * V) : Vec(acc_t(0));
    }
    for (int64_t t = t0; t < t1; ++t) {
      Vec xv[VB];
      for (int v = 0; v < VB; ++v) xv[v] = Vec::loadu(col + t * ldc + v * V);
      for (int c = 0; c < CB; ++c) {
        const Vec wv(w[c * ldw + t]);
        for (int v = 0; v < VB; ++v) acc[c][v] = at::vec::fmadd(wv, xv[v], acc[c][v]);
      }
    }
    for (int c = 0; c < CB; ++c) {
      for (int v = 0; v < VB; ++v) chunk[c][v] = chunk[c][v] + acc[c][v];
    }
  }
  for (int c = 0; c < CB; ++c) {
    for (int v = 0; v < VB; ++v) {
      acc_t* o = outer + c * ldo + v * V;
      (first_chunk ? chunk[c][v] : Vec::loadu(o) + chunk[c][v]).store(o);
    }
  }
}

// All rows x all positions of one tap chunk. Positions go in the outer loop so that the gathered
// taps of a position block stay in L1 while every channel block reads them. width is a multiple of
// kVectorBlock vectors.
template <typename acc_t>
void multiply(int64_t rows, const acc_t* w, int64_t ldw, const acc_t* col, int64_t ldc, int64_t taps,
              acc_t* outer, int64_t ldo, int64_t width, bool first_chunk) {
  constexpr int64_t V = Vectorized<acc_t>::size(), step = kVectorBlock * V;
  int64_t p = 0;
  // Few channels (depthwise and the like): wider position blocks keep enough independent sums in
  // flight to hide the fused multiply-add latency.
  if (rows == 1) {
    for (; p + 6 * V <= width; p += 6 * V) multiply_block<acc_t, 1, 6>(w, ldw, col + p, ldc, taps, outer + p, ldo, first_chunk);
  } else if (rows == 2) {
    for (; p + 4 * V <= width; p += 4 * V) multiply_block<acc_t, 2, 4>(w, ldw, col + p, ldc, taps, outer + p, ldo, first_chunk);
  }
  for (; p < width; p += step) {
    int64_t c = 0;
    for (; c + kChannelBlock <= rows; c += kChannelBlock) {
      multiply_block<acc_t, kChannelBlock, kVectorBlock>(w + c * ldw, ldw, col + p, ldc, taps, outer + c * ldo + p, ldo, first_chunk);
    }
    const acc_t* wc = w + c * ldw;
    acc_t* oc = outer + c * ldo + p;
    switch (rows - c) {
      case 5: multiply_block<acc_t, 5, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 4: multiply_block<acc_t, 4, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 3: multiply_block<acc_t, 3, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 2: multiply_block<acc_t, 2, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 1: multiply_block<acc_t, 1, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      default: break;
    }
  }
}

// One grid row's share of a task: grid columns [jw0, jw1) of grid row jh, stored from `offset` on.
struct Segment {
  int64_t jh, jw0, jw1, offset;
};

// One gathered row: dst[offset + jw - jw0] = plane[in_step_h * jh + a.offset][in_step_w * jw + b.offset]
// for every segment, zero where that falls outside the input (the implicit padding), and zero
// from `used` up to `width` (the unused lanes of the last vector block).
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void gather(const scalar_t* plane, int64_t W, int64_t in_step_h, int64_t in_step_w, const Tap& a, const Tap& b,
            const std::vector<Segment>& segments, acc_t* dst, int64_t used, int64_t width) {
  for (const Segment& seg : segments) {
    acc_t* d = dst + seg.offset - seg.jw0;  // d[jw] is the slot of grid column jw (jw >= jw0)
    if (seg.jh < a.lo || seg.jh >= a.hi) {
      zero(d + seg.jw0, seg.jw1 - seg.jw0);
      continue;
    }
    const int64_t lo = std::clamp(b.lo, seg.jw0, seg.jw1), hi = std::clamp(b.hi, lo, seg.jw1);
    zero(d + seg.jw0, lo - seg.jw0);
    // The row's address only where a column reads it: with an empty input `plane` is null, and even
    // an unused offset from it is undefined behaviour (UBSan: tools/sanitize.sh).
    if (hi > lo) {
      const scalar_t* row = plane + (in_step_h * seg.jh + a.offset) * W + b.offset;
      if (in_step_w == 1) {
        widen<scalar_t>(row + lo, d + lo, hi - lo);
      } else {
        for (int64_t jw = lo; jw < hi; ++jw) d[jw] = static_cast<acc_t>(row[in_step_w * jw]);
      }
    }
    zero(d + hi, seg.jw1 - hi);
  }
  zero(dst + used, width - used);
}

template <typename scalar_t>
void convolve(const Problem& p, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias,
              at::Tensor& out) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  if (out.numel() == 0) return;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const Axis ax_h = make_axis(p, 0), ax_w = make_axis(p, 1);
  const int64_t n_ph = static_cast<int64_t>(ax_h.phases.size()), n_pw = static_cast<int64_t>(ax_w.phases.size());

  // Weights as acc_t rows W[g][phase][co][t], taps t = (ci, kh, kw) in the phase's order. conv2d
  // in f32/f64 reads the weight tensor itself: [Cout, Cin / groups, Kh, Kw] already is that layout.
  const scalar_t* w_data = weight.const_data_ptr<scalar_t>();
  std::vector<acc_t> packed;
  std::vector<int64_t> phase_base(n_ph * n_pw);  // offset of (phase) inside one group's block
  const acc_t* w_rows = nullptr;
  const int64_t group_size = Cout_g * Cin_g * p.Kh * p.Kw;
  {
    int64_t base = 0;
    for (int64_t i = 0; i < n_ph; ++i) {
      for (int64_t j = 0; j < n_pw; ++j) {
        phase_base[i * n_pw + j] = base;
        base += Cout_g * Cin_g * static_cast<int64_t>(ax_h.phases[i].taps.size() * ax_w.phases[j].taps.size());
      }
    }
  }
  if constexpr (!is_half<scalar_t>) {
    if (!p.transpose) w_rows = w_data;
  }
  if (!w_rows) {
    packed.resize(weight.numel());
    // Threads only for weights worth it: waking them costs more than packing a small kernel.
    const int64_t per_item = std::max<int64_t>(1, group_size / (n_ph * n_pw));
    at::parallel_for(0, G * n_ph * n_pw, std::max<int64_t>(1, (1 << 16) / per_item), [&](int64_t first, int64_t last) {
      for (int64_t item = first; item < last; ++item) {
        const int64_t g = item / (n_ph * n_pw), i = item / n_pw % n_ph, j = item % n_pw;
        const auto &th = ax_h.phases[i].taps, &tw = ax_w.phases[j].taps;
        acc_t* dst = packed.data() + g * group_size + phase_base[i * n_pw + j];
        for (int64_t co = 0; co < Cout_g; ++co) {
          for (int64_t ci = 0; ci < Cin_g; ++ci) {
            for (const Tap& a : th) {
              for (const Tap& b : tw) {
                const int64_t index = p.transpose
                    ? (((g * Cin_g + ci) * Cout_g + co) * p.Kh + a.k) * p.Kw + b.k
                    : (((g * Cout_g + co) * Cin_g + ci) * p.Kh + a.k) * p.Kw + b.k;
                *dst++ = static_cast<acc_t>(w_data[index]);
              }
            }
          }
        }
      }
    });
    w_rows = packed.data();
  }
  std::vector<acc_t> bias_acc(p.Cout, acc_t(0));
  if (bias) {
    const scalar_t* b = bias->const_data_ptr<scalar_t>();
    for (int64_t co = 0; co < p.Cout; ++co) bias_acc[co] = static_cast<acc_t>(b[co]);
  }

  // Positions per task: as many as keep the gathered taps and the running totals within
  // kScratchBytes each (they stay in L2), so that tasks with few taps or channels (depthwise) are not
  // dominated by per-task work. Any split gives the same bits; only the speed depends on it.
  int64_t max_taps = 0;
  for (const Phase& ph : ax_h.phases) {
    for (const Phase& pw : ax_w.phases) {
      max_taps = std::max<int64_t>(max_taps, Cin_g * static_cast<int64_t>(ph.taps.size() * pw.taps.size()));
    }
  }
  const int64_t chunk_taps = std::clamp<int64_t>(max_taps, 1, kTapChunk);
  const int64_t chunk_rows = std::clamp<int64_t>(Cout_g, 1, kChannelChunk);
  constexpr int64_t block_width = kVectorBlock * Vec::size();
  const int64_t fit = kScratchBytes / static_cast<int64_t>(sizeof(acc_t)) / std::max(chunk_taps, chunk_rows);
  const int64_t positions = std::clamp<int64_t>(fit / block_width * block_width, block_width, kMaxPositions);

  // Work items: (phase, first position, last position) over the phase's flattened grid.
  struct Item {
    int64_t i, j, first, last;
  };
  std::vector<Item> items;
  for (int64_t i = 0; i < n_ph; ++i) {
    for (int64_t j = 0; j < n_pw; ++j) {
      const int64_t count = ax_h.phases[i].count * ax_w.phases[j].count;
      for (int64_t first = 0; first < count; first += positions) {
        items.push_back({i, j, first, std::min(count, first + positions)});
      }
    }
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  const int64_t co_chunks = (Cout_g + kChannelChunk - 1) / kChannelChunk;
  const int64_t tasks = p.N * G * n_items * co_chunks;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, chunk_rows * max_taps * positions));

  const scalar_t* x_data = x.const_data_ptr<scalar_t>();
  scalar_t* out_data = out.mutable_data_ptr<scalar_t>();

  at::parallel_for(0, tasks, grain, [&](int64_t first_task, int64_t last_task) {
    std::vector<acc_t> col(chunk_taps * positions), outer(chunk_rows * positions);
    std::vector<Segment> segments;
    for (int64_t task = first_task; task < last_task; ++task) {
      int64_t rest = task;
      const int64_t chunk = rest % co_chunks;
      rest /= co_chunks;
      const Item& item = items[rest % n_items];
      rest /= n_items;
      const int64_t g = rest % G, n = rest / G;
      const Phase &ph = ax_h.phases[item.i], &pw = ax_w.phases[item.j];
      const int64_t nh = static_cast<int64_t>(ph.taps.size()), nw = static_cast<int64_t>(pw.taps.size());
      const int64_t taps = Cin_g * nh * nw;
      const int64_t width = (item.last - item.first + block_width - 1) / block_width * block_width;
      const int64_t co0 = chunk * kChannelChunk, rows = std::min(kChannelChunk, Cout_g - co0);
      const acc_t* w = w_rows + g * group_size + phase_base[item.i * n_pw + item.j] + co0 * taps;

      for (int64_t c = 0; c < rows; ++c) std::fill_n(outer.data() + c * positions, width, bias_acc[g * Cout_g + co0 + c]);

      // The task's positions, one segment per grid row, shared by every tap and by the store.
      segments.clear();
      for (int64_t q = item.first; q < item.last;) {
        const int64_t jh = q / pw.count, jw0 = q % pw.count, jw1 = std::min(pw.count, jw0 + (item.last - q));
        segments.push_back({jh, jw0, jw1, q - item.first});
        q += jw1 - jw0;
      }
      for (int64_t t0 = 0; t0 < taps; t0 += kTapChunk) {
        const int64_t t1 = std::min(taps, t0 + kTapChunk);
        int64_t ci = t0 / (nh * nw), ia = t0 / nw % nh, ib = t0 % nw;
        for (int64_t t = t0; t < t1; ++t) {
          const scalar_t* plane = x_data + ((n * p.Cin + g * Cin_g + ci) * p.H) * p.W;
          gather(plane, p.W, ax_h.in_step, ax_w.in_step, ph.taps[ia], pw.taps[ib], segments,
                 col.data() + (t - t0) * positions, item.last - item.first, width);
          if (++ib == nw) {
            ib = 0;
            if (++ia == nh) ia = 0, ++ci;
          }
        }
        multiply<acc_t>(rows, w + t0, taps, col.data(), positions, t1 - t0, outer.data(), positions, width, t0 == 0);
      }

      // Store: grid position (jh, jw) is output (r_h + out_step_h * jh, r_w + out_step_w * jw).
      for (int64_t c = 0; c < rows; ++c) {
        scalar_t* plane = out_data + (n * p.Cout + g * Cout_g + co0 + c) * p.Ho * p.Wo;
        const acc_t* src = outer.data() + c * positions;
        for (const Segment& seg : segments) {
          scalar_t* row = plane + (ph.r + ax_h.out_step * seg.jh) * p.Wo + pw.r;
          const acc_t* from = src + seg.offset;  // from[jw - jw0] holds grid column jw
          if (ax_w.out_step == 1) {
            narrow<scalar_t>(from, row + seg.jw0, seg.jw1 - seg.jw0);
          } else {
            for (int64_t jw = seg.jw0; jw < seg.jw1; ++jw) {
              row[ax_w.out_step * jw] = static_cast<scalar_t>(from[jw - seg.jw0]);
            }
          }
        }
      }
    }
  });
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fuel_convolution",
                                  [&] { convolve<scalar_t>(p, x, weight, b, result); });
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
