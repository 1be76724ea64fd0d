// The elementwise binary family's arithmetic: out[i] = op(lhs[i], rhs[i]) over contiguous buffers.
// Compiled once per instruction-set level (setup.py); everything here lives in fuel::<level>.
//
// One chassis, binary_kernel<scalar_t, Op>, serves all 32 (op, dtype) kernels. Each Op is a
// single function on at::vec::Vectorized values of its compute type (float for bf16/f16, which
// widen on load and narrow once on store, round to nearest even).
//
// Position invariance: every element, the tail included, goes through the same vector code (the
// tail through a partial load/store), so out[i] depends on lhs[i] and rhs[i] alone, never on the
// length of the tensor, the element's index or the thread split.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <limits>

#include "elementwise_kernels.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

struct Add {
  template <typename V> static V apply(const V& a, const V& b) { return a + b; }
};
struct Sub {
  template <typename V> static V apply(const V& a, const V& b) { return a - b; }
};
struct Mul {
  template <typename V> static V apply(const V& a, const V& b) { return a * b; }
};
struct Div {
  template <typename V> static V apply(const V& a, const V& b) { return a / b; }
};
// C99 makes these 1 even for a NaN operand (signalling ones included, which the DEFAULT level's
// std::pow turns into NaN): a zero exponent, a base of 1, and -1 to an infinite power.
template <typename V>
V c99_ones(const V& a, const V& b, const V& power) {
  using T = typename V::value_type;
  const V one(1), inf(std::numeric_limits<T>::infinity());
  return V::blendv(power, one, (b == V(0)) | (a == one) | ((a == V(-1)) & (b.abs() == inf)));
}

// The DEFAULT level has no vector pow of its own (ATen's generic one is std::pow per lane, which
// is not within 1 ulp for double everywhere): long double's powl, rounded once to double.
template <typename V>
V pow_per_lane(const V& a, const V& b) {
  using T = typename V::value_type;
  __at_align__ T a_buf[V::size()], b_buf[V::size()];
  a.store(a_buf);
  b.store(b_buf);
  for (int i = 0; i < V::size(); ++i) {
    a_buf[i] = static_cast<T>(std::pow(static_cast<long double>(a_buf[i]), static_cast<long double>(b_buf[i])));
  }
  return V::loadu(a_buf);
}

struct Pow {
  template <typename V> static V apply(const V& a, const V& b) {
#if defined(CPU_CAPABILITY_DEFAULT)
    return c99_ones(a, b, pow_per_lane(a, b));
#else
    return c99_ones(a, b, a.pow(b));
#endif
  }
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
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
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
  template <typename V> static V take_rhs(const V& a, const V& b) { return ((b != b) & (a == a)) | (b > a); }
};
struct Minimum {
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

constexpr int64_t kGrain = 32768;  // elements per thread at least (TensorIterator's GRAIN_SIZE)

template <typename scalar_t, typename Op>
void binary_kernel(const void* lhs_data, const void* rhs_data, void* out_data, int64_t n) {
  const auto* lhs = static_cast<const scalar_t*>(lhs_data);
  const auto* rhs = static_cast<const scalar_t*>(rhs_data);
  auto* out = static_cast<scalar_t*>(out_data);
  constexpr int64_t step = Vectorized<scalar_t>::size();
  // Chunks start on multiples of `step` so that no thread split creates extra partial blocks
  // (they would give the same bits, but cost time).
  at::parallel_for(0, (n + step - 1) / step, kGrain / step, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const int64_t i = block * step;
      apply_block<scalar_t, Op>(lhs + i, rhs + i, out + i, std::min(step, n - i));
    }
  });
}

template <typename Op>
constexpr std::array<BinaryKernel, kKernelDtypes> row() {
  return {binary_kernel<float, Op>, binary_kernel<double, Op>, binary_kernel<at::BFloat16, Op>,
          binary_kernel<at::Half, Op>};
}

}  // namespace

// Constant-initialized (no code runs at load), in BinaryOp order.
extern const BinaryKernels binary_kernels;
const BinaryKernels binary_kernels = {
    {row<Add>(), row<Sub>(), row<Mul>(), row<Div>(), row<Maximum>(), row<Minimum>(), row<Pow>(), row<Rem>()}};

}  // namespace CPU_CAPABILITY
}  // namespace fuel
