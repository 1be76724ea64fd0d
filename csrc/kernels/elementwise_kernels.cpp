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

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "elementwise_kernels.h"
#include "pow_double.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// With two NaN operands x86 returns the first source operand's payload, quieted (Intel's and AMD's
// manuals agree, and tests/test_elementwise_parity.py pins it). The compiler does not model
// payloads, so it may commute a + b or a * b, differently in each inlined copy of the loop (the
// OpenMP-outlined one included), and the payload would depend on the thread count. The AVX levels
// therefore issue the instruction themselves, lhs as the first source: one instruction, where a
// NaN-lhs blend costs three more (a quarter of an add's time in cache). sub and div are not
// commutative, so the compiler keeps their order. The DEFAULT level's Vectorized is lane loops,
// so there a NaN lhs decides the result itself (a op a of a NaN is that NaN, quiet).
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#if defined(CPU_CAPABILITY_AVX512)
using FloatRegister = __m512;
using DoubleRegister = __m512d;
#define FUEL_VECTOR_REGISTER "v"
#else
using FloatRegister = __m256;
using DoubleRegister = __m256d;
#define FUEL_VECTOR_REGISTER "x"
#endif
#define FUEL_LHS_FIRST(name, instruction)                                                             \
  inline Vectorized<float> name(const Vectorized<float>& a, const Vectorized<float>& b) {             \
    FloatRegister r;                                                                                    \
    asm(instruction "ps %2, %1, %0" : "=" FUEL_VECTOR_REGISTER(r)                                       \
        : FUEL_VECTOR_REGISTER(FloatRegister(a)), FUEL_VECTOR_REGISTER(FloatRegister(b)));              \
    return r;                                                                                           \
  }                                                                                                     \
  inline Vectorized<double> name(const Vectorized<double>& a, const Vectorized<double>& b) {          \
    DoubleRegister r;                                                                                   \
    asm(instruction "pd %2, %1, %0" : "=" FUEL_VECTOR_REGISTER(r)                                       \
        : FUEL_VECTOR_REGISTER(DoubleRegister(a)), FUEL_VECTOR_REGISTER(DoubleRegister(b)));            \
    return r;                                                                                           \
  }
FUEL_LHS_FIRST(add_lhs_first, "vadd")
FUEL_LHS_FIRST(mul_lhs_first, "vmul")
#undef FUEL_LHS_FIRST
// a + b or a - b as a * 1 + b or a * 1 - b, one fused multiply-add: the product is exact, so the
// result is rounded once from the same exact value (signed zeros and inf - inf's NaN included).
// NaNs: a fused multiply-add returns its multiplicands' NaN before its addend's, and the addend's
// unnegated (Intel's SDM, "FMA Numeric Behavior"; the payload test pins it on each CPU), so with a
// multiplied by 1 and b added a's NaN wins and a lone NaN b comes back as it is. float16 lanes
// take it: on Zen 4 the float16 conversions run on the adder pipes, which vaddps would share,
// while the FMA pipes are free (a loop over float16 in cache: 2.97 -> 2.58 ns per 32 lanes, as
// fast as mul).
#define FUEL_ADD_FUSED(name, instruction)                                                             \
  inline Vectorized<float> name(const Vectorized<float>& a, const Vectorized<float>& b) {             \
    const FloatRegister one = Vectorized<float>(1.f);                                                   \
    FloatRegister r = a;                                                                                \
    asm(instruction "ps %2, %1, %0" : "+" FUEL_VECTOR_REGISTER(r)                                       \
        : FUEL_VECTOR_REGISTER(one), FUEL_VECTOR_REGISTER(FloatRegister(b)));                           \
    return r;                                                                                           \
  }
FUEL_ADD_FUSED(add_fused, "vfmadd213")
FUEL_ADD_FUSED(sub_fused, "vfmsub213")
#undef FUEL_ADD_FUSED
#undef FUEL_VECTOR_REGISTER
#else
template <typename V> V add_lhs_first(const V& a, const V& b) { return V::blendv(a + b, a + a, a != a); }
template <typename V> V mul_lhs_first(const V& a, const V& b) { return V::blendv(a * b, a * a, a != a); }
#endif
struct Add {
  template <typename V> static V apply(const V& a, const V& b) { return add_lhs_first(a, b); }
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  static Vectorized<float> apply_for_float16(const Vectorized<float>& a, const Vectorized<float>& b) {
    return add_fused(a, b);
  }
#endif
};
struct Sub {
  template <typename V> static V apply(const V& a, const V& b) { return a - b; }
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  static Vectorized<float> apply_for_float16(const Vectorized<float>& a, const Vectorized<float>& b) {
    return sub_fused(a, b);
  }
#endif
};
struct Mul {
  template <typename V> static V apply(const V& a, const V& b) { return mul_lhs_first(a, b); }
};
struct Div {
  template <typename V> static V apply(const V& a, const V& b) { return a / b; }
};
#if defined(CPU_CAPABILITY_AVX512)
// float16 div (lanes widened to float) without the divider, where that is faster (chosen per CPU:
// float16_division_by_reciprocal): the float quotient from a reciprocal estimate and one
// correction, q = q0 + (a - q0 b) r with r = rcp14(b), q0 = a r. q lies within half a float ulp
// plus 2^-27 |a/b| of a/b, and is exact where a/b is a float; a quotient of two float16 values
// that is not a float16 midpoint lies at least 2^-23 |a/b| from every midpoint. So q rounds to the
// float16 that a / b in float rounds to (torch's result), bit for bit: checked over all 2^32 pairs
// of float16 values. Vectors with a zero, infinite or NaN lane divide (every such lane's result is
// the division's either way).
struct DivByReciprocal : Div {
  static Vectorized<float> apply_for_float16(const Vectorized<float>& a, const Vectorized<float>& b) {
    constexpr int kZeroInfNan = 0x9f;  // vfpclassps: QNaN, +-0, +-inf, SNaN
    const __m512 x = a, y = b;
    if (_mm512_fpclass_ps_mask(x, kZeroInfNan) | _mm512_fpclass_ps_mask(y, kZeroInfNan)) return a / b;
    const __m512 r = _mm512_rcp14_ps(y);
    const __m512 q0 = _mm512_mul_ps(x, r);
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(q0, y, x), r, q0);
  }
};
#endif
// ---------------------------------------------------------------------------------------------
// pow, ours in every dtype, the special cases set exactly as C99 defines them. float: exp2(y *
// log2|x|) evaluated in double, within 5e-9 relative of the exact power before its one rounding to
// float (a float ulp is at least 6e-8 relative), so within 1 ulp of the correctly rounded result.
// The halves (widened to float): the same evaluated in float, ample for their one rounding (see
// exp2_of_product_in_float). double: pow_double.h's table-driven core (within 0.51 ulp; its
// AVX-512 variant, pow_double_avx512.h, within 0.61).

// Lane reinterpretation and float <-> double conversion, which Vectorized has no cheap portable
// form of; each level spells them with its own instructions.
#if defined(CPU_CAPABILITY_AVX512)
inline Vectorized<int32_t> bits_of(const Vectorized<float>& v) { return _mm512_castps_si512(v); }
inline Vectorized<float> float_from_bits(const Vectorized<int32_t>& v) { return _mm512_castsi512_ps(v); }
inline Vectorized<int64_t> bits_of(const Vectorized<double>& v) { return _mm512_castpd_si512(v); }
inline Vectorized<double> double_from_bits(const Vectorized<int64_t>& v) { return _mm512_castsi512_pd(v); }
inline std::pair<Vectorized<double>, Vectorized<double>> to_double(const Vectorized<float>& v) {
  const __m512 f = v;
  return {_mm512_cvtps_pd(_mm512_castps512_ps256(f)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1))};
}
inline Vectorized<float> to_float(const Vectorized<double>& lo, const Vectorized<double>& hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
}
inline std::pair<Vectorized<double>, Vectorized<double>> to_double(const Vectorized<int32_t>& v) {
  const __m512i i = v;
  return {_mm512_cvtepi32_pd(_mm512_castsi512_si256(i)), _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(i, 1))};
}
inline bool any_sign_bit(const Vectorized<int32_t>& v) { return _mm512_movepi32_mask(v) != 0; }
#elif defined(CPU_CAPABILITY_AVX2)
inline Vectorized<int32_t> bits_of(const Vectorized<float>& v) { return _mm256_castps_si256(v); }
inline Vectorized<float> float_from_bits(const Vectorized<int32_t>& v) { return _mm256_castsi256_ps(v); }
inline Vectorized<int64_t> bits_of(const Vectorized<double>& v) { return _mm256_castpd_si256(v); }
inline Vectorized<double> double_from_bits(const Vectorized<int64_t>& v) { return _mm256_castsi256_pd(v); }
inline std::pair<Vectorized<double>, Vectorized<double>> to_double(const Vectorized<float>& v) {
  const __m256 f = v;
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))};
}
inline Vectorized<float> to_float(const Vectorized<double>& lo, const Vectorized<double>& hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1);
}
inline std::pair<Vectorized<double>, Vectorized<double>> to_double(const Vectorized<int32_t>& v) {
  const __m256i i = v;
  return {_mm256_cvtepi32_pd(_mm256_castsi256_si128(i)), _mm256_cvtepi32_pd(_mm256_extracti128_si256(i, 1))};
}
inline bool any_sign_bit(const Vectorized<int32_t>& v) {
  return _mm256_movemask_ps(_mm256_castsi256_ps(v)) != 0;
}
#else
template <typename To, typename From>
Vectorized<To> reinterpret(const Vectorized<From>& v) {
  static_assert(sizeof(Vectorized<To>) == sizeof(Vectorized<From>));
  __at_align__ From buffer[Vectorized<From>::size()];
  v.store(buffer);
  return Vectorized<To>::loadu(buffer);
}
inline Vectorized<int32_t> bits_of(const Vectorized<float>& v) { return reinterpret<int32_t>(v); }
inline Vectorized<float> float_from_bits(const Vectorized<int32_t>& v) { return reinterpret<float>(v); }
inline Vectorized<int64_t> bits_of(const Vectorized<double>& v) { return reinterpret<int64_t>(v); }
inline Vectorized<double> double_from_bits(const Vectorized<int64_t>& v) { return reinterpret<double>(v); }
// float or int32 lanes, converted exactly to two vectors of double.
template <typename T>
inline std::pair<Vectorized<double>, Vectorized<double>> to_double(const Vectorized<T>& v) {
  constexpr int D = Vectorized<double>::size();
  static_assert(Vectorized<T>::size() == 2 * D);
  __at_align__ T lanes[2 * D];
  __at_align__ double lo[D], hi[D];
  v.store(lanes);
  for (int i = 0; i < D; ++i) lo[i] = lanes[i], hi[i] = lanes[D + i];
  return {Vectorized<double>::loadu(lo), Vectorized<double>::loadu(hi)};
}
inline Vectorized<float> to_float(const Vectorized<double>& lo, const Vectorized<double>& hi) {
  constexpr int D = Vectorized<double>::size();
  __at_align__ double l[D], h[D];
  __at_align__ float f[2 * D];
  lo.store(l);
  hi.store(h);
  for (int i = 0; i < D; ++i) f[i] = static_cast<float>(l[i]), f[D + i] = static_cast<float>(h[i]);
  return Vectorized<float>::loadu(f);
}
inline bool any_sign_bit(const Vectorized<int32_t>& v) {
  __at_align__ int32_t lanes[Vectorized<int32_t>::size()];
  v.store(lanes);
  bool any = false;
  for (int32_t lane : lanes) any |= lane < 0;
  return any;
}
#endif

// C99 makes these 1 even for a NaN operand (signalling ones included, which the DEFAULT level's
// std::pow turns into NaN): a zero exponent, a base of 1, and -1 to an infinite power.
template <typename V>
V c99_ones(const V& a, const V& b, const V& power) {
  using T = typename V::value_type;
  const V one(1), inf(std::numeric_limits<T>::infinity());
  return V::blendv(power, one, (b == V(0)) | (a == one) | ((a == V(-1)) & (b.abs() == inf)));
}

// 2^(y * (k + log2 z)) in double, for z in [sqrt(1/2), sqrt(2)), integer k and finite y.
//
// The loop over this is bound by latency, not by throughput (each vector's chain runs about 80
// cycles through the divide, two polynomials and the conversions, and the out-of-order window
// holds little more than one vector's work), so the polynomials are minimax fits of the lowest
// degree the error budget allows, evaluated in Estrin's scheme, with y and the scale folded into
// their last terms. Coefficients: Remez fits with relative error weight, made by
// tools/pow_float_coefficients.py. A table-driven log (1/c and log2 c looked up by the top bits of
// z, as ARM's powf) costs more here than the division it saves: as a speed mock-up, 12% slower
// with three vpermps lookups of float tables (N = 8, 9 cycles each, and six more conversions), 25%
// with gathers.
//
// Error budget, relative to the exact power, before the one rounding to float:
//   log2 z = s * P(s^2), s = (z - 1) / (z + 1), |s| <= 0.1716: P of degree 4 is within 4.3e-12
//   relative of the series 2 atanh(s) / ln 2, so log2|x| = k + log2 z is within 4.3e-12 relative
//   (for k != 0, |log2 z| <= 1/2 <= |k + log2 z|), near x = 1 included, where it is s itself that
//   carries the relative accuracy. z - 1 and z + 1 are exact (z is a float), s is rounded once;
//   the rounding of t = y * log2|x| (|k| / |k + log2 z| <= 2 at most) adds below 1e-15 |t|. Where
//   the float result is finite and not 0, |t| < 150, so t is within 6.5e-10 absolute: 4.5e-10
//   relative in 2^t.
//   2^f, |f| <= 1/2: 1 + f Q(f) with Q of degree 5, within 3.9e-9 relative. 2^n is exact.
//   Together below 4.4e-9 (plus a few double roundings), within 5e-9: a float ulp is at least
//   6e-8 relative, so the one rounding lands within 1 ulp of the correctly rounded power (subnormal
//   results included: their ulp is coarser still, and the double is rounded once, to the subnormal).
inline Vectorized<double> exp2_of_product(const Vectorized<double>& z, const Vectorized<double>& k,
                                          const Vectorized<double>& y) {
  using VD = Vectorized<double>;
  using at::vec::fmadd;
  static constexpr double kLog2[] = {0x1.71547652bede5p+1, 0x1.ec709d12e18a7p-1, 0x1.27777fda5aa44p-1,
                                     0x1.a58d8fbff31c2p-2, 0x1.5ce7cddf873fbp-2};
  static constexpr double kExp2[] = {0x1.62e431703e9b2p-1, 0x1.ebfbe07ba90a3p-3, 0x1.c6ae2c578f90bp-5,
                                     0x1.3b29e58efa91ep-7, 0x1.5f88c7991e827p-10, 0x1.446b2bc8a265ap-13};
  const VD s = (z - VD(1.0)) / (z + VD(1.0));
  const VD w = s * s;
  const VD w2 = w * w;
  const VD p01 = fmadd(w, VD(kLog2[1]), VD(kLog2[0]));
  const VD p234 = fmadd(w2, VD(kLog2[4]), fmadd(w, VD(kLog2[3]), VD(kLog2[2])));
  // t = y k + (y s) p01 + (y s w^2) p234: y multiplies s, off the chain, not the polynomial's sum.
  const VD ys = y * s;
  const VD t = fmadd(ys * w2, p234, fmadd(ys, p01, y * k));
  // t = n + f, n = round(t) (half to even), |f| <= 1/2, f exact. Below AVX-512, 2^n from n's bits:
  // n clamped far outside float's range (2^+-400 stays normal in double) and added to
  // 1.5 * 2^52 + 1023, which leaves n + 1023 in the low bits (n is an integer: adding t itself
  // would round a half-integer t to the other neighbour wherever n + 1023 is the even one, and 2^n
  // would then not match f).
  const VD n = t.round();
  const VD f = t - n;
  const VD f2 = f * f;
  const VD q2345 = fmadd(f2, fmadd(f, VD(kExp2[5]), VD(kExp2[4])), fmadd(f, VD(kExp2[3]), VD(kExp2[2])));
  const VD q01 = fmadd(f, VD(kExp2[1]), VD(kExp2[0]));
#if defined(CPU_CAPABILITY_AVX512)
  // 2^n (1 + f Q(f)), Q = q01 + f^2 q2345 in Estrin's form, the scaling by vscalefpd (exact, and
  // inf or 0 far outside the range): the same bits as the scaled form below, in five fewer
  // instructions per vector (a tenth of the loop).
  return _mm512_scalef_pd(fmadd(f * f2, q2345, fmadd(f, q01, VD(1.0))), n);
#else
  const VD biased = at::vec::clamp(n, VD(-400.0), VD(400.0)) + VD(0x1.8p52 + 1023);
  const VD scale = double_from_bits(bits_of(biased) << Vectorized<int64_t>(52));
  // 2^n (1 + f Q(f)) = scale + (f scale) (q01 + f^2 q2345).
  const VD f_scale = f * scale;
  return fmadd(f_scale * f2, q2345, fmadd(f_scale, q01, scale));
#endif
}

// |x| ** y from a core that is right for positive finite bases and finite exponents, with C99's
// special cases set exactly for every other lane (float and double alike).
template <typename V>
V with_special_cases(const V& x, const V& y, V result) {
  using T = typename V::value_type;
  const V zero(0), inf(std::numeric_limits<T>::infinity());
  // Positive finite bases with finite exponents need no special case (NaNs fail the comparisons).
  if (((x > zero) & (x < inf) & (y.abs() < inf)).zero_mask() == 0) return result;

  // A negative base to an odd integer power is negative (zeros and infinities included); the
  // exponent's half is an integer for even and infinite ones.
  const V ax = x.abs();
  const V not_integer = y.trunc() != y;
  const V half = y * V(T(0.5));
  const V odd_sign = (x & V(T(-0.0))) & (half.trunc() != half) & (y.trunc() == y);
  result = result | odd_sign;
  // Zero and infinite bases: +-0 ** y is inf for y < 0, 0 for y > 0; +-inf ** y the reverse.
  const V x_zero = ax == zero, x_inf = ax == inf;
  const V to_inf = (x_zero & (y < zero)) | (x_inf & (y > zero));
  result = V::blendv(result, (inf & to_inf) | odd_sign, x_zero | x_inf);
  // NaN for a NaN operand and for a finite negative base to a non-integer power ...
  const V nan = (x != x) | (y != y) | ((x < zero) & (ax != inf) & not_integer);
  result = V::blendv(result, V(std::numeric_limits<T>::quiet_NaN()), nan);
  return c99_ones(x, y, result);  // ... except where C99 says 1
}

// The same 2^(y * (k + log2 z)) all in float, for the halves: their results are rounded to 8 or 11
// bits, and this is within 2e-5 relative of the exact power (log2 z to s^7, below 5e-8 absolute;
// y * (k + log2 z) within 2e-5 absolute for |y * log2|x|| < 160; 2^f to f^6, below 2e-7), far below the
// half ulp of either (2^-9, 2^-12 relative), so the one rounding to the half stays within 1 ulp of
// the correctly rounded result. Twice the lanes of the double evaluation and half the terms.
inline Vectorized<float> exp2_of_product_in_float(const Vectorized<float>& z, const Vectorized<float>& k,
                                                  const Vectorized<float>& y) {
  using VF = Vectorized<float>;
  using VI = Vectorized<int32_t>;
  static constexpr float kLog2Series[] = {2.8853900817779268f, 0.96179669392597560f, 0.57707801635558536f,
                                          0.41219858311113240f};
  const VF s = (z - VF(1.f)) / (z + VF(1.f));
  const VF w = s * s;
  VF p(kLog2Series[3]);
  for (int i = 2; i >= 0; --i) p = at::vec::fmadd(p, w, VF(kLog2Series[i]));
  // Clamped beyond every half's range (bf16 reaches 2^-133 .. 2^128), inside what two float
  // scalings by 2^(n/2) can build.
  const VF t = at::vec::clamp(y * at::vec::fmadd(s, p, k), VF(-160.f), VF(130.f));
  const VF shifted = t + VF(0x1.8p23f);
  const VF f = t - (shifted - VF(0x1.8p23f));
  static constexpr float kExp2Series[] = {1.0f, 0.69314718055994531f, 0.24022650695910071f, 0.055504108664821580f,
                                          0.0096181291076284772f, 0.0013333558146428443f, 0.00015403530393381610f};
  VF q(kExp2Series[6]);
  for (int i = 5; i >= 0; --i) q = at::vec::fmadd(q, f, VF(kExp2Series[i]));
  // n sits in the low bits of the shifted value; 2^n as 2^(n/2) * 2^(n - n/2), each a normal float.
  const VI n = bits_of(shifted) - bits_of(VF(0x1.8p23f));
  const VI half_n = n >> VI(1);
  const VF first = float_from_bits((half_n + VI(127)) << VI(23));
  const VF second = float_from_bits((n - half_n + VI(127)) << VI(23));
  return q * first * second;
}

// |x| ** y for float lanes from the double core: x positive and finite, y finite. kSubnormals:
// x may be subnormal (first scaled by 2^23 into the normal range); otherwise x is normal.
template <bool kSubnormals>
inline Vectorized<float> pow_float_wide(const Vectorized<float>& ax, const Vectorized<float>& y) {
  using VF = Vectorized<float>;
  using VI = Vectorized<int32_t>;
  VI ix = bits_of(ax);
  VI k_offset(0);
  if constexpr (kSubnormals) {
    const VF subnormal = ax < VF(std::numeric_limits<float>::min());
    ix = bits_of(VF::blendv(ax, ax * VF(8388608.f), subnormal));
    k_offset = bits_of(subnormal) & VI(23);
  }
  // |x| = 2^k * z with z in [sqrt(1/2), sqrt(2)), exactly, by the bits.
  const VI biased = ix - VI(0x3f3504f3);  // 0x3f3504f3: float(sqrt(1/2))
  const VF z = float_from_bits(ix - (biased & VI(0xff800000)));
  const auto [k_lo, k_hi] = to_double((biased >> VI(23)) - k_offset);
  const auto [z_lo, z_hi] = to_double(z);
  const auto [y_lo, y_hi] = to_double(y);
  return to_float(exp2_of_product(z_lo, k_lo, y_lo), exp2_of_product(z_hi, k_hi, y_hi));
}

// x ** y for float lanes, the C99 special cases exact. kWideCore: the core in double (float's own
// results, within 1 ulp); otherwise in float (results bound for a half, see above).
template <bool kWideCore>
inline Vectorized<float> pow_float(const Vectorized<float>& x, const Vectorized<float>& y) {
  using VF = Vectorized<float>;
  using VI = Vectorized<int32_t>;
  if constexpr (kWideCore) {
    // Vectors of normal positive bases and finite exponents, the usual ones, skip the subnormal
    // scaling and every special case (the other path takes 22% longer on them). One test:
    // y * 0 + x is x for finite y (NaN otherwise), and its bits less FLT_MIN's lie in
    // [0, 0x7f000000) exactly for x in [FLT_MIN, FLT_MAX]: a negative difference, or one whose
    // distance below 0x7f000000 is negative, marks any other lane (negative x included, whose bits
    // wrap into one of the two). A usual lane gets the same bits on either path (the same core on
    // the same values), so out[i] still depends on lhs[i] and rhs[i] alone.
    const VI a = bits_of(at::vec::fmadd(y, VF(0.f), x)) - VI(0x00800000);
    if (!any_sign_bit(a | (VI(0x7effffff) - a))) return pow_float_wide</*kSubnormals=*/false>(x, y);
    // The rest: the core on |x| and y limited to +-FLT_MAX (which keeps t finite and leaves every
    // finite base's result to an infinite power at inf or 0, as C99's), then the special cases.
    const VF limit(std::numeric_limits<float>::max());
    return with_special_cases(x, y, pow_float_wide</*kSubnormals=*/true>(x.abs(), at::vec::clamp(y, -limit, limit)));
  } else {
    const VF ax = x.abs();
    // |x| = 2^k * z with z in [sqrt(1/2), sqrt(2)), exactly, by the bits; subnormals are first
    // scaled by 2^23 into the normal range.
    const VF subnormal = ax < VF(std::numeric_limits<float>::min());
    const VI ix = bits_of(VF::blendv(ax, ax * VF(8388608.f), subnormal));
    const VI k = (ix - VI(0x3f3504f3)) >> VI(23);  // 0x3f3504f3: float(sqrt(1/2))
    const VF z = float_from_bits(ix - (k << VI(23)));
    const VF kf = at::vec::convert<float>(k) - (subnormal & VF(23.f));
    return with_special_cases(x, y, exp2_of_product_in_float(z, kf, y));
  }
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
  static constexpr int64_t kWorkPerElement = 16;
  template <typename V> static V apply(const V& a, const V& b) {
    if constexpr (std::is_same_v<V, Vectorized<float>>) {
      return pow_float</*kWideCore=*/true>(a, b);
    } else {
#if defined(CPU_CAPABILITY_DEFAULT)
      return c99_ones(a, b, pow_per_lane(a, b));
#else
#if defined(CPU_CAPABILITY_AVX512)
      // Vectors of positive finite bases and finite exponents, the usual ones, skip the special
      // cases (one vfpclasspd per operand, where the generic test takes a dozen instructions);
      // those lanes get the same core on the same values on either path.
      if (pow_double_all_ordinary(a, b)) return pow_double_core(a, b);
#endif
      return with_special_cases(a, b, pow_double_core(a.abs(), b));
#endif
    }
  }
  // bf16 and f16 lanes, widened to float: the float core is ample for their one rounding.
  static Vectorized<float> apply_for_half(const Vectorized<float>& a, const Vectorized<float>& b) {
    return pow_float</*kWideCore=*/false>(a, b);
  }
};
// torch.remainder: fmod (exact, as C's is), moved by one divisor when non-zero with a sign unlike
// the divisor's; a zero keeps fmod's sign, the dividend's (rem(-6, 3) == -0), as torch's does.
// The per-lane definition, which the vector code below reproduces bit for bit.
template <typename T>
T remainder_of(T a, T b) {
  const T m = std::fmod(a, b);
  return m != T(0) && ((m < T(0)) != (b < T(0))) ? m + b : m;
}

// In vector code (Sleef's vector fmod returns NaN once |a/b| overflows, and scalar fmod is slow):
// n = trunc(a/b) and one fused r = a - n*b. While |a/b| is below 2^digits, the rounded quotient is
// the true one or one further from zero, so r is fmod's m exactly, or round(m + b) once n overshot:
// the sign of r then differs from a's, and from b's exactly where m's does. So one rule finishes
// both: a non-zero r signed unlike b gets b added (m + b, rounded once as remainder_of's); the other
// lanes are rem already. Lanes outside that range (huge quotients, zero or infinite divisors, NaN)
// take remainder_of one by one; both ways give the same bits.
struct Rem {
  static constexpr int64_t kWorkPerElement = 4;
  template <typename V> static V apply(const V& a, const V& b) {
    using T = typename V::value_type;
    V rem;
    V fast(0);  // all lanes take remainder_of where no fused multiply-add is known to be available
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    const V zero(0);
    const V q = a / b;
    V r = at::vec::fnmadd(q.trunc(), b, a);
    r = V::blendv(r, a & V(T(-0.0)), r == zero);  // an exact zero has the dividend's sign, as fmod's
    rem = V::blendv(r, r + b, (r != zero) & ((r < zero) ^ (b < zero)));
    const V exact_range(T(2) / std::numeric_limits<T>::epsilon());
    fast = (q.abs() < exact_range) & (b.abs() != V(std::numeric_limits<T>::infinity()));
#endif
    if (fast.zero_mask() == 0) return rem;
    __at_align__ T a_buf[V::size()], b_buf[V::size()], r_buf[V::size()], fast_buf[V::size()];
    a.store(a_buf);
    b.store(b_buf);
    rem.store(r_buf);
    fast.store(fast_buf);
    for (int i = 0; i < V::size(); ++i) {
      if (fast_buf[i] == T(0)) r_buf[i] = remainder_of(a_buf[i], b_buf[i]);
    }
    return V::loadu(r_buf);
  }
};

// Maximum and minimum return one operand bit for bit: lhs if it is NaN, else rhs if it is NaN,
// else the larger (smaller) one, lhs on ties (+0 vs -0 included). take_rhs is that choice as a
// lane mask, applied to the stored operands: rhs exactly where lhs is a number and rhs is not
// <= lhs (>= for minimum). Every lane where b <= a holds has a == a, so the exclusive or of the
// two masks is that difference, in two comparisons and one logical operation.
// rhs_beyond is the same choice on integer keys that order the numbers as their values do (see
// half_select): rhs strictly larger (smaller).
struct Maximum {
  template <typename V> static V take_rhs(const V& a, const V& b) { return (a == a) ^ (b <= a); }
  template <typename VI> static VI rhs_beyond(const VI& key_a, const VI& key_b) { return key_b > key_a; }
#if defined(CPU_CAPABILITY_AVX512)
  static __mmask32 rhs_beyond(const __m512i& key_a, const __m512i& key_b) {
    return _mm512_cmpgt_epi16_mask(key_b, key_a);
  }
#endif
};
struct Minimum {
  template <typename V> static V take_rhs(const V& a, const V& b) { return (a == a) ^ (b >= a); }
  template <typename VI> static VI rhs_beyond(const VI& key_a, const VI& key_b) { return key_b < key_a; }
#if defined(CPU_CAPABILITY_AVX512)
  static __mmask32 rhs_beyond(const __m512i& key_a, const __m512i& key_b) {
    return _mm512_cmplt_epi16_mask(key_b, key_a);
  }
#endif
};

template <typename Op, typename = void> struct is_selection : std::false_type {};
template <typename Op>
struct is_selection<Op, std::void_t<decltype(&Op::template take_rhs<Vectorized<float>>)>> : std::true_type {};

// An op may evaluate half lanes (widened to float) by a cheaper rule than float's own.
template <typename Op, typename = void> struct has_half_rule : std::false_type {};
template <typename Op>
struct has_half_rule<Op, std::void_t<decltype(&Op::apply_for_half)>> : std::true_type {};

// And float16 lanes by one of their own (add and sub fused, div by the reciprocal: their results
// never leave float's normal range).
template <typename Op, typename = void> struct has_float16_rule : std::false_type {};
template <typename Op>
struct has_float16_rule<Op, std::void_t<decltype(&Op::apply_for_float16)>> : std::true_type {};

template <typename scalar_t, typename Op>
Vectorized<float> apply_to_half_lanes(const Vectorized<float>& a, const Vectorized<float>& b) {
  if constexpr (std::is_same_v<scalar_t, at::Half> && has_float16_rule<Op>::value) {
    return Op::apply_for_float16(a, b);
  } else if constexpr (has_half_rule<Op>::value) {
    return Op::apply_for_half(a, b);
  } else {
    return Op::apply(a, b);
  }
}

template <typename scalar_t>
constexpr bool is_half = std::is_same_v<scalar_t, at::BFloat16> || std::is_same_v<scalar_t, at::Half>;

// Half lanes widened to float and narrowed back, as a pair. at::vec's conversions keep the lane
// order, which costs bf16 a cross-block shuffle each way; an elementwise op does not care about the
// order, so on the AVX levels bf16 interleaves each 128-bit block with zeros (a bf16 is the top
// half of its float) and packs back within blocks, which restores the order (at 64K elements in
// cache: 13 -> 8 us). The rounding is at::vec's, bit for bit: to nearest even, every NaN 0xffff.
// float16 converts by instruction (F16C), in order, on every level but DEFAULT.
#if defined(CPU_CAPABILITY_AVX512)
inline std::pair<Vectorized<float>, Vectorized<float>> widen(const Vectorized<at::BFloat16>& v) {
  const __m512i zero = _mm512_setzero_si512();
  return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v))};
}
// Each float lane rounded to bf16 in the lane's high half (the low half is left over): to nearest
// even, every NaN all ones.
inline __m512i bf16_in_high_half(const __m512 f) {
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i lowest_kept_bit = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lowest_kept_bit);
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(-1));
}
// The high halves of lo's and hi's lanes in one two-table permute, in the order packing each
// block's lo lanes then its hi lanes gives, which undoes widen's unpacks. A shift per vector and a
// pack did the same in three operations, and the NaN blend through a vector mask took two more
// per vector: 20 operations per 32 lanes of a bf16 mul where there were 30 (a loop in cache: 3.5
// -> 2.9 ns per 32 lanes).
inline Vectorized<at::BFloat16> narrow_bf16(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  static constexpr std::array<int16_t, 32> high_halves = [] {
    std::array<int16_t, 32> index{};
    for (int j = 0; j < 32; ++j) {
      const int block = j / 8, k = j % 8;  // word k of the output's 128-bit block
      index[j] = static_cast<int16_t>(k < 4 ? 2 * (4 * block + k) + 1 : 32 + 2 * (4 * block + k - 4) + 1);
    }
    return index;
  }();
  return _mm512_permutex2var_epi16(bf16_in_high_half(lo), _mm512_loadu_si512(high_halves.data()),
                                   bf16_in_high_half(hi));
}
#elif defined(CPU_CAPABILITY_AVX2)
// Each float lane's bf16 bits, in the lane's low half.
inline Vectorized<int32_t> bf16_bits_of(const Vectorized<float>& f) {
  using VI = Vectorized<int32_t>;
  const VI bits = bits_of(f);
  const VI rounded = ((bits + ((bits >> VI(16)) & VI(1)) + VI(0x7fff)) >> VI(16)) & VI(0xffff);
  return VI::blendv(rounded, VI(0xffff), bits_of(f != f));
}
inline std::pair<Vectorized<float>, Vectorized<float>> widen(const Vectorized<at::BFloat16>& v) {
  const __m256i zero = _mm256_setzero_si256();
  return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v))};
}
inline Vectorized<at::BFloat16> narrow_bf16(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  return _mm256_packus_epi32(bf16_bits_of(lo), bf16_bits_of(hi));
}
#else
inline std::pair<Vectorized<float>, Vectorized<float>> widen(const Vectorized<at::BFloat16>& v) {
  auto [lo, hi] = at::vec::convert_to_float<at::BFloat16>(v);
  return {lo, hi};
}
inline Vectorized<at::BFloat16> narrow_bf16(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  return at::vec::convert_from_float<at::BFloat16>(lo, hi);
}
#endif
inline std::pair<Vectorized<float>, Vectorized<float>> widen(const Vectorized<at::Half>& v) {
  auto [lo, hi] = at::vec::convert_to_float<at::Half>(v);
  return {lo, hi};
}
template <typename scalar_t>
inline Vectorized<scalar_t> narrow(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    return narrow_bf16(lo, hi);
  } else {
    return at::vec::convert_from_float<scalar_t>(lo, hi);
  }
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// Maximum's and minimum's choice (Op::take_rhs) for half lanes, on their bits, applied: a half's
// sign and magnitude as one two's-complement integer key orders the numbers as their values do, -0
// and +0 the same key, and a magnitude above infinity's is a NaN. Comparing widened floats took four
// conversions, four comparisons and a pack per vector, about twice these integer operations, and
// bound the float16 loop even out of cache (4M elements, 2 threads: 0.9 of torch's time).
template <typename scalar_t, typename Op>
inline Vectorized<scalar_t> half_select(const Vectorized<scalar_t>& a, const Vectorized<scalar_t>& b) {
  constexpr int16_t kInfinity = std::is_same_v<scalar_t, at::Half> ? 0x7c00 : 0x7f80;
#if defined(CPU_CAPABILITY_AVX512)
  // Comparisons into mask registers and the blend from one: as vectors of lane masks, each of the
  // five comparisons and the blend cost AVX-512 one conversion more (a 64K float16 maximum took 6.2
  // us at 2 threads on a Zen 4, the AVX2 level's code 4.9).
  const __m512i x = a, y = b, magnitude_bits = _mm512_set1_epi16(0x7fff), infinity = _mm512_set1_epi16(kInfinity);
  const __m512i magnitude_x = _mm512_and_si512(x, magnitude_bits), magnitude_y = _mm512_and_si512(y, magnitude_bits);
  const __m512i negative_x = _mm512_srai_epi16(x, 15), negative_y = _mm512_srai_epi16(y, 15);  // the sign, spread
  const __m512i key_x = _mm512_sub_epi16(_mm512_xor_si512(magnitude_x, negative_x), negative_x);
  const __m512i key_y = _mm512_sub_epi16(_mm512_xor_si512(magnitude_y, negative_y), negative_y);
  const __mmask32 nan_x = _mm512_cmpgt_epi16_mask(magnitude_x, infinity);
  const __mmask32 nan_y = _mm512_cmpgt_epi16_mask(magnitude_y, infinity);
  const __mmask32 take = _kandn_mask32(nan_x, _kor_mask32(nan_y, Op::rhs_beyond(key_x, key_y)));
  return _mm512_mask_blend_epi16(take, x, y);
#else
  using VI = Vectorized<int16_t>;
  const VI infinity(kInfinity), magnitude_bits(0x7fff), zero(0);
  const VI x{__m256i(a)}, y{__m256i(b)};
  const VI magnitude_x = x & magnitude_bits, magnitude_y = y & magnitude_bits;
  const VI negative_x = x < zero, negative_y = y < zero;  // all ones where the sign bit is set
  const VI key_x = (magnitude_x ^ negative_x) - negative_x, key_y = (magnitude_y ^ negative_y) - negative_y;
  const VI nan_x = magnitude_x > infinity, nan_y = magnitude_y > infinity;
  const VI take = ((nan_y | Op::rhs_beyond(key_x, key_y)) | nan_x) ^ nan_x;  // ... and not nan_x
  return Vectorized<scalar_t>::blendv(a, b, Vectorized<scalar_t>(__m256i(take)));
#endif
}
#else
// Two float lane masks (all ones or zeros per lane) as one mask of 16-bit lanes, in the order
// widen() took the lanes out.
template <typename scalar_t>
inline Vectorized<scalar_t> narrow_mask(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  constexpr int F = Vectorized<float>::size();
  __at_align__ float lanes[2 * F];
  __at_align__ int16_t mask[2 * F];
  lo.store(lanes);
  hi.store(lanes + F);
  for (int i = 0; i < 2 * F; ++i) {
    int32_t bits;
    std::memcpy(&bits, &lanes[i], sizeof(bits));
    mask[i] = bits != 0 ? int16_t(-1) : int16_t(0);
  }
  return Vectorized<scalar_t>::loadu(mask);
}
#endif

// One vector of half operands, loaded widened to float. float16 converts straight from memory,
// half a vector at a time (F16C takes a memory operand): a full-width load would need a shuffle
// per half, about a fifth of the loop's work in cache.
inline std::pair<Vectorized<float>, Vectorized<float>> load_widened(const at::Half* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)))};
#elif defined(CPU_CAPABILITY_AVX2)
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
#else
  return widen(Vectorized<at::Half>::loadu(p));
#endif
}
inline std::pair<Vectorized<float>, Vectorized<float>> load_widened(const at::BFloat16* p) {
  return widen(Vectorized<at::BFloat16>::loadu(p));
}

// A half op's float results for the one vector of operands at lhs and rhs, as two widened halves.
template <typename scalar_t, typename Op>
inline std::pair<Vectorized<float>, Vectorized<float>> half_results(const scalar_t* lhs, const scalar_t* rhs) {
  auto [a_lo, a_hi] = load_widened(lhs);
  auto [b_lo, b_hi] = load_widened(rhs);
  return {apply_to_half_lanes<scalar_t, Op>(a_lo, b_lo), apply_to_half_lanes<scalar_t, Op>(a_hi, b_hi)};
}

// op(lhs[j], rhs[j]) for the one vector of operands at lhs and rhs. Body and tail go through this
// same function (the tail from zero-padded copies whose extra lanes are never stored), so out[i]
// depends on lhs[i] and rhs[i] alone.
template <typename scalar_t, typename Op>
inline Vectorized<scalar_t> compute(const scalar_t* lhs, const scalar_t* rhs) {
  using Vec = Vectorized<scalar_t>;
  if constexpr (is_selection<Op>::value) {
    const Vec a = Vec::loadu(lhs), b = Vec::loadu(rhs);
    // The choice is applied to the stored operands, so a chosen NaN keeps its payload. Halves are
    // compared on their bits at the vector levels (half_select); at DEFAULT widened once
    // (Vectorized's own half comparisons widen both operands per comparison and narrow each mask
    // back), the float lane masks narrowed to the 16-bit lanes.
    if constexpr (is_half<scalar_t>) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
      return half_select<scalar_t, Op>(a, b);
#else
      auto [a_lo, a_hi] = widen(a);
      auto [b_lo, b_hi] = widen(b);
      return Vec::blendv(a, b, narrow_mask<scalar_t>(Op::take_rhs(a_lo, b_lo), Op::take_rhs(a_hi, b_hi)));
#endif
    } else {
      return Vec::blendv(a, b, Op::take_rhs(a, b));
    }
  } else if constexpr (is_half<scalar_t>) {
    auto [lo, hi] = half_results<scalar_t, Op>(lhs, rhs);
    return narrow<scalar_t>(lo, hi);
  } else {
    return Op::apply(Vec::loadu(lhs), Vec::loadu(rhs));
  }
}

// compute's vector stored whole at out. float16 at AVX512 stores each half as it is rounded (by
// ATen's own cvtfp32_fp16, which narrow applies): building one vector of the two cost an insert
// per vector (a loop over float16 in cache: 2.8 -> 2.5 ns per 32 lanes on a Zen 4).
template <typename scalar_t, typename Op>
inline void compute_into(const scalar_t* lhs, const scalar_t* rhs, scalar_t* out) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, at::Half> && !is_selection<Op>::value) {
    auto [lo, hi] = half_results<scalar_t, Op>(lhs, rhs);
    auto* halves = reinterpret_cast<__m256i*>(out);
    _mm256_storeu_si256(halves, at::vec::cvtfp32_fp16(lo));
    _mm256_storeu_si256(halves + 1, at::vec::cvtfp32_fp16(hi));
    return;
  }
#endif
  compute<scalar_t, Op>(lhs, rhs).store(out);
}

// Non-temporal stores write around the caches: they save the read for ownership of every output
// line and keep the operands cached, but the output then has to come back from memory. They pay
// once a call's working set (lhs, rhs and out) no longer stays in a cache that serves a core faster
// than memory does:
// - AMD (Zen 3, 32 MB L3 per 8 cores): the L3 does. Streaming once the working set exceeds it,
//   measured at 2 threads: 24 MB working sets (float32 2M, halves 4M elements) kept in the L3 take
//   0.54-0.91 of torch's time where streaming took 0.78-1.39; 48 and 96 MB (float32 and float64 4M)
//   stream, 0.71-0.86 of torch's.
// - Intel Xeon (Emerald Rapids, 2 MB L2 per core, a 300 MB L3 on the mesh): the L3 serves one core
//   at about 22 GB/s, no faster than memory, so only the private L2 is worth keeping. Streaming from
//   a thread's share of the working set above its L2 on, measured with 1 and 2 threads: 3-48 MB
//   working sets 0.97-1.0 -> 0.66-0.84 of torch's time; in L2 (1.5 MB a thread) streaming is
//   1.3-1.5x slower, so it stays off there.
#if defined(CPU_CAPABILITY_AVX512)
inline void stream(void* p, __m512 v) { _mm512_stream_ps(static_cast<float*>(p), v); }
inline void stream(void* p, __m512d v) { _mm512_stream_pd(static_cast<double*>(p), v); }
inline void stream(void* p, __m512i v) { _mm512_stream_si512(static_cast<__m512i*>(p), v); }
constexpr bool kCanStream = true;
#elif defined(CPU_CAPABILITY_AVX2)
inline void stream(void* p, __m256 v) { _mm256_stream_ps(static_cast<float*>(p), v); }
inline void stream(void* p, __m256d v) { _mm256_stream_pd(static_cast<double*>(p), v); }
inline void stream(void* p, __m256i v) { _mm256_stream_si256(static_cast<__m256i*>(p), v); }
constexpr bool kCanStream = true;
#else
template <typename V> inline void stream(void* p, const V& v) { v.store(p); }
constexpr bool kCanStream = false;
#endif

struct CacheSizes {
  int64_t private_bytes = 0;     // the largest cache one core has to itself (L2)
  int64_t last_level_bytes = 0;  // the last-level cache
  bool last_level_is_slow = false;  // its bandwidth per core is no better than memory's (Intel's mesh L3)
};

// Linux's cache description of CPU 0 (per cache instance: glibc's sysconf counts every instance of
// an AMD L3); cache_sizes falls back to 2 MiB for the L2, and to sysconf, else the L2, for the L3.
inline int64_t cache_bytes(const char* path, int64_t fallback) {
  if (FILE* f = std::fopen(path, "r")) {
    long kib = 0;
    const bool ok = std::fscanf(f, "%ldK", &kib) == 1 && kib > 0;
    std::fclose(f);
    if (ok) return static_cast<int64_t>(kib) * 1024;
  }
  return fallback;
}

inline const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    CacheSizes s;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    s.private_bytes = cache_bytes("/sys/devices/system/cpu/cpu0/cache/index2/size", int64_t(2) << 20);
    s.last_level_bytes = cache_bytes("/sys/devices/system/cpu/cpu0/cache/index3/size",
                                     l3 > 0 ? static_cast<int64_t>(l3) : s.private_bytes);
    s.last_level_is_slow = cpu_is_intel();
    return s;
  }();
  return sizes;
}

// Whether a call whose working set is `bytes`, split over `threads` threads, streams its stores.
inline bool streams(int64_t bytes, int64_t threads) {
  const CacheSizes& c = cache_sizes();
  if (c.last_level_is_slow) return bytes > threads * c.private_bytes;
  return bytes > c.last_level_bytes;
}

// out[i] = op(lhs[i], rhs[i]) for i in [begin, end): whole vectors, then the tail as one partial
// vector (masked load and store where the level has them).
template <typename scalar_t, typename Op, bool kStreaming>
void run_range(const scalar_t* lhs, const scalar_t* rhs, scalar_t* out, int64_t begin, int64_t end) {
  using Vec = Vectorized<scalar_t>;
  constexpr int64_t V = Vec::size();
  int64_t i = begin;
  for (; i + V <= end; i += V) {
    if constexpr (kStreaming) {
      stream(out + i, compute<scalar_t, Op>(lhs + i, rhs + i));
    } else {
      compute_into<scalar_t, Op>(lhs + i, rhs + i, out + i);
    }
  }
  if (i < end) {
    const int64_t count = end - i;
    __at_align__ scalar_t lhs_tail[V] = {}, rhs_tail[V] = {};
    std::memcpy(lhs_tail, lhs + i, count * sizeof(scalar_t));
    std::memcpy(rhs_tail, rhs + i, count * sizeof(scalar_t));
    compute<scalar_t, Op>(lhs_tail, rhs_tail).store(out + i, count);
  }
  if constexpr (kStreaming) _mm_sfence();  // streamed lines are visible before the threads join
}

// Threads only for calls long enough to repay waking them: 32K elements for the ops that cost
// about a load and a store per element (torch's grain too), proportionally fewer for those that
// compute more (Op::kWorkPerElement; measured with benchmarks/bench_elementwise.py at 64K
// elements, 1 vs 2 threads). Chunks start on whole vectors so that no split adds partial vectors.
constexpr int64_t kGrainElements = 32768;
template <typename Op, typename = void> struct work_per_element : std::integral_constant<int64_t, 1> {};
template <typename Op>
struct work_per_element<Op, std::void_t<decltype(Op::kWorkPerElement)>>
    : std::integral_constant<int64_t, Op::kWorkPerElement> {};

template <typename scalar_t, typename Op>
void binary_kernel(const void* lhs_data, const void* rhs_data, void* out_data, int64_t n) {
  const auto* lhs = static_cast<const scalar_t*>(lhs_data);
  const auto* rhs = static_cast<const scalar_t*>(rhs_data);
  auto* out = static_cast<scalar_t*>(out_data);
  constexpr int64_t V = Vectorized<scalar_t>::size();
  constexpr int64_t grain = std::max<int64_t>(V, kGrainElements / work_per_element<Op>::value / V * V);
  // The threads at::parallel_for will use: one per grain-sized chunk, at most the pool's.
  const int64_t threads = n <= grain ? 1 : std::min<int64_t>(at::get_num_threads(), (n + grain - 1) / grain);
  const bool streaming = kCanStream && streams(3 * n * static_cast<int64_t>(sizeof(scalar_t)), threads) &&
                         reinterpret_cast<uintptr_t>(out) % sizeof(Vectorized<scalar_t>) == 0;
  const auto range = streaming ? run_range<scalar_t, Op, true> : run_range<scalar_t, Op, false>;
  if (n <= grain) {
    range(lhs, rhs, out, 0, n);
    return;
  }
  at::parallel_for(0, (n + V - 1) / V, grain / V, [&](int64_t first, int64_t last) {
    range(lhs, rhs, out, first * V, std::min(n, last * V));
  });
}

template <typename Op>
constexpr std::array<BinaryKernel, kKernelDtypes> row() {
  return {binary_kernel<float, Op>, binary_kernel<double, Op>, binary_kernel<at::BFloat16, Op>,
          binary_kernel<at::Half, Op>};
}

void streaming_triad(const void* lhs_data, const void* rhs_data, void* out_data, int64_t n) {
  const auto* lhs = static_cast<const float*>(lhs_data);
  const auto* rhs = static_cast<const float*>(rhs_data);
  auto* out = static_cast<float*>(out_data);
  constexpr int64_t V = Vectorized<float>::size();
  const bool aligned = reinterpret_cast<uintptr_t>(out) % sizeof(Vectorized<float>) == 0;
  const auto range = aligned ? run_range<float, Add, kCanStream> : run_range<float, Add, false>;
  at::parallel_for(0, (n + V - 1) / V, kGrainElements / V, [&](int64_t first, int64_t last) {
    range(lhs, rhs, out, first * V, std::min(n, last * V));
  });
}

// The div row. At the AVX512 level float16 takes the reciprocal or the divider, per CPU.
constexpr std::array<BinaryKernel, kKernelDtypes> div_row() {
  std::array<BinaryKernel, kKernelDtypes> kernels = row<Div>();
#if defined(CPU_CAPABILITY_AVX512)
  kernels[3] = [](const void* lhs, const void* rhs, void* out, int64_t n) {
    (float16_division_by_reciprocal() ? binary_kernel<at::Half, DivByReciprocal> : binary_kernel<at::Half, Div>)(
        lhs, rhs, out, n);
  };
#endif
  return kernels;
}

}  // namespace

// Constant-initialized (no code runs at load), in BinaryOp order.
extern const BinaryKernels binary_kernels;
const BinaryKernels binary_kernels = {
    {row<Add>(), row<Sub>(), row<Mul>(), div_row(), row<Maximum>(), row<Minimum>(), row<Pow>(), row<Rem>()},
    streaming_triad};

}  // namespace CPU_CAPABILITY
}  // namespace fuel
