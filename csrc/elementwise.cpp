// The elementwise binary family: out[i] = op(lhs[i], rhs[i]) over contiguous same-shape tensors.
//
// One chassis, binary_kernel<scalar_t, Op>, serves all 32 (op, dtype) kernels. Each Op is a
// single function on at::vec::Vectorized values of its compute type (float for bf16/f16, which
// widen on load and narrow once on store, round to nearest even).
//
// Position invariance: every element, the tail included, goes through the same vector code (the
// tail through a partial load/store), so out[i] depends on lhs[i] and rhs[i] alone, never on the
// length of the tensor, the element's index or the thread split.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "contract_rules.h"

namespace fuel {
namespace {

using at::vec::Vectorized;

struct Add {
  static constexpr const char* name = "add";
  template <typename V> static V apply(const V& a, const V& b) { return a + b; }
};
struct Sub {
  static constexpr const char* name = "sub";
  template <typename V> static V apply(const V& a, const V& b) { return a - b; }
};
struct Mul {
  static constexpr const char* name = "mul";
  template <typename V> static V apply(const V& a, const V& b) { return a * b; }
};
struct Div {
  static constexpr const char* name = "div";
  template <typename V> static V apply(const V& a, const V& b) { return a / b; }
};
struct Pow {
  static constexpr const char* name = "pow";
  template <typename V> static V apply(const V& a, const V& b) { return a.pow(b); }
};
// fmod, exactly (as C's fmod is), in vector code. Sleef's vector fmod returns NaN once |a/b|
// overflows and scalar fmod is slow, so: n = trunc(a/b) and one fused a - n*b. While |a/b| is below
// 2^digits, n*b fits the fused product and a - n*b is exact; a quotient that rounded up to n
// leaves r just past zero on the wrong side, and one add of |b| (exact too) brings it back. Lanes
// outside that range (huge quotients, zero or infinite divisors, NaN) take std::fmod one by one;
// both ways give the exact result, so out[i] still depends on lhs[i] and rhs[i] alone.
template <typename V>
V exact_fmod(const V& a, const V& b) {
  using T = typename V::value_type;
  const V zero(0), sign_bit(T(-0.0));
  V r;
  V fast(zero);  // all lanes take std::fmod where no fused multiply-add is known to be available
#if defined(CPU_CAPABILITY_AVX2)
  const V q = a / b;
  const V n = q.trunc();
  r = at::vec::fmadd(zero - n, b, a);
  const V overshot = (r != zero) & ((r < zero) ^ (a < zero));
  r = V::blendv(r, r + (b.abs() | (a & sign_bit)), overshot);
  r = r.abs() | (a & sign_bit);  // fmod's result, zero included, has the sign of a
  const V exact_range(T(2) / std::numeric_limits<T>::epsilon());
  fast = (q.abs() < exact_range) & (b.abs() != V(std::numeric_limits<T>::infinity()));
#endif
  if (fast.zero_mask() == 0) return r;
  __at_align__ T a_buf[V::size()], b_buf[V::size()], r_buf[V::size()], fast_buf[V::size()];
  a.store(a_buf);
  b.store(b_buf);
  r.store(r_buf);
  fast.store(fast_buf);
  for (int i = 0; i < V::size(); ++i) {
    if (fast_buf[i] == T(0)) r_buf[i] = std::fmod(a_buf[i], b_buf[i]);
  }
  return V::loadu(r_buf);
}

// torch.remainder: fmod, moved by one divisor when non-zero with a sign unlike the divisor's. A
// zero keeps fmod's sign, as torch's does (rem(-6, 3) == -0).
struct Rem {
  static constexpr const char* name = "rem";
  template <typename V> static V apply(const V& a, const V& b) {
    const V zero(0);
    const V m = exact_fmod(a, b);
    const V differ = (m != zero) & ((m < zero) ^ (b < zero));
    return V::blendv(m, m + b, differ);
  }
};

// Maximum and minimum return one operand bit for bit: lhs if it is NaN, else rhs if it is NaN,
// else the larger (smaller) one, lhs on ties (+0 vs -0 included). take_rhs is that choice as a
// lane mask, applied to the stored operands.
struct Maximum {
  static constexpr const char* name = "maximum";
  template <typename V> static V take_rhs(const V& a, const V& b) { return ((b != b) & (a == a)) | (b > a); }
};
struct Minimum {
  static constexpr const char* name = "minimum";
  template <typename V> static V take_rhs(const V& a, const V& b) { return ((b != b) & (a == a)) | (b < a); }
};

template <typename Op, typename = void> struct is_selection : std::false_type {};
template <typename Op>
struct is_selection<Op, std::void_t<decltype(&Op::template take_rhs<Vectorized<float>>)>> : std::true_type {};


template <typename scalar_t>
constexpr bool is_half = std::is_same_v<scalar_t, at::BFloat16> || std::is_same_v<scalar_t, at::Half>;

// One block of up to Vectorized<scalar_t>::size() elements; count < size() only at a chunk's end.
template <typename scalar_t, typename Op>
inline void apply_block(const scalar_t* lhs, const scalar_t* rhs, scalar_t* out, int64_t count) {
  using Vec = Vectorized<scalar_t>;
  const Vec a = Vec::loadu(lhs, count), b = Vec::loadu(rhs, count);
  if constexpr (is_selection<Op>::value) {
    // The choice is made on the stored operands, halves included (their vector comparisons run in
    // float and give 16-bit lane masks), so a chosen NaN keeps its payload.
    Vec::blendv(a, b, Op::take_rhs(a, b)).store(out, count);
  } else if constexpr (is_half<scalar_t>) {
    auto [a_lo, a_hi] = at::vec::convert_to_float<scalar_t>(a);
    auto [b_lo, b_hi] = at::vec::convert_to_float<scalar_t>(b);
    at::vec::convert_from_float<scalar_t>(Op::apply(a_lo, b_lo), Op::apply(a_hi, b_hi)).store(out, count);
  } else {
    Op::apply(a, b).store(out, count);
  }
}

template <typename scalar_t, typename Op>
void binary_kernel(const scalar_t* lhs, const scalar_t* rhs, scalar_t* out, int64_t n) {
  constexpr int64_t step = Vectorized<scalar_t>::size();
  // Chunks start on multiples of `step` so that no thread split creates extra partial blocks
  // (they would give the same bits, but cost time).
  at::parallel_for(0, (n + step - 1) / step, at::internal::GRAIN_SIZE / step, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const int64_t i = block * step;
      apply_block<scalar_t, Op>(lhs + i, rhs + i, out + i, std::min(step, n - i));
    }
  });
}

template <typename Op>
at::Tensor& binary_out(const at::Tensor& lhs, const at::Tensor& rhs, at::Tensor& out) {
  const KernelRule& rule = check_inputs(Op::name, {&lhs, &rhs});
  check_out(rule, out, lhs.scalar_type(), lhs.sizes(), {&lhs, &rhs});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, lhs.scalar_type(), Op::name, [&] {
    binary_kernel<scalar_t, Op>(lhs.const_data_ptr<scalar_t>(), rhs.const_data_ptr<scalar_t>(),
                                out.mutable_data_ptr<scalar_t>(), lhs.numel());
  });
  return out;
}

template <typename Op>
at::Tensor binary(const at::Tensor& lhs, const at::Tensor& rhs) {
  // Validate before allocating, so a bad call never allocates an output.
  check_inputs(Op::name, {&lhs, &rhs});
  at::Tensor out = at::empty(lhs.sizes(), lhs.options().memory_format(at::MemoryFormat::Contiguous));
  return binary_out<Op>(lhs, rhs, out);
}

template <typename Op>
void register_op(torch::Library& m) {
  const std::string name(Op::name);
  m.impl(name.c_str(), TORCH_FN(binary<Op>));
  m.impl((name + ".out").c_str(), TORCH_FN(binary_out<Op>));
}

}  // namespace

TORCH_LIBRARY_IMPL(fuel, CPU, m) {
  register_op<Add>(m);
  register_op<Sub>(m);
  register_op<Mul>(m);
  register_op<Div>(m);
  register_op<Maximum>(m);
  register_op<Minimum>(m);
  register_op<Pow>(m);
  register_op<Rem>(m);
}

}  // namespace fuel
