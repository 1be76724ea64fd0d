// pow_double_core's AVX-512 variant (included by pow_double.h at that level only; same contract: x
// > 0 finite, subnormals included, y finite; other lanes get an unspecified value without trapping).
//
// Why a variant: on Intel's AVX-512 parts the five 8-lane gathers of the shared table-driven core
// (128-row tables) cost about half its time (a mock-up with permutes in their place ran in 0.52 of
// the time). This one looks its tables up in registers instead, by vpermt2pd (16 rows a
// permute), with tables of 32 (log) and 16 (exp) rows and polynomials of higher degree, and takes
// the instructions AVX-512 has for the rest: vgetmantpd/vgetexppd split x (subnormals included, no
// pre-scaling), vscalefpd builds the result (overflow to inf in the one instruction; only results
// that may be subnormal, and lanes beyond the range, take a branch, rare, with one test a vector).
//
// Algorithm (ARM optimized-routines' pow structure, as the shared core, other table sizes):
//   log: x = 2^k z; m = getmant(x) in [1, 2), row j = the top 5 fraction bits of m + 2^-6 (so row
//        0 is centred on 1); m >= 2 - 2^-6 wraps to row 0 as z = m/2, k + 1, so z in [1 - 2^-7,
//        2 - 2^-6). Row j: 1/c on a grid of 2^-7 or 2^-6 (whichever keeps r = z/c - 1 exact in one
//        fma: a multiple of 2^-59 below 2^-6, or of 2^-58 below 2^-5), log c as a multiple of
//        2^-43 (k ln2hi + log c exact) and its tail. |r| <= 0x1.44p-6 (2^-5.66).
//        log x = k ln2 + log c + r - r^2/2 + r^3 P(r) as log_hi + lo, the rounding error of each
//        of the two leading additions and of r^2/2 kept in lo (double-double, renormalized).
//   exp: y log x = kd ln2/16 + r', kd the nearest integer to y log_hi 16/ln2; r' = (y log_hi -
//        kd ln2hi/16) - kd ln2lo/16 + y lo (the first in one fma: kd ln2hi/16 is exact, the
//        product y log_hi is exact inside it), |r'| <= ln2/32 + 2^-40. 2^(kd/16) = 2^floor(kd/16)
//        2^(j/16), j = kd mod 16 (the low bits of the rounding shift), 2^(j/16) as a double T and
//        its relative tail; exp(r') - 1 = r' + r'^2 Q(r'); the result is scalef(T + T (r' + tail
//        + r'^2 Q), kd/16), scalef taking the floor of its exponent.
//   |y log_hi| > 708 (edge_lanes): subnormal results rounded once; beyond +-1000, +inf or +0.
//
// Error budget, in ulps of the result (u = 2^-53; an error of e relative to the value is at most
// e / u ulp), before the result's one rounding (0.5 ulp):
//   log x = log_hi + lo, relative to log x. The r^3 P term carries nearly all of it: ar3 is
//   rounded once (1u), the fma that adds ar3 times P's constant term once (1u), and P's other
//   terms, 2^-6 of the whole at most, add their few roundings at that scale (0.1u): 2.1u of
//   |r^3/3|, and |r^3/3| / |log x| <= 2^-13.44 over the rows (printed by the script: row 1, x
//   just above 1 + 2^-6, |r| up to 2^-5.96 against log x >= 2^-6.01; row 0, where log x ~ r, has
//   r^2/3 <= 2^-13.58), so 2^-12.37 u. P's fit (its coefficients as doubles) adds 2^-67.9 of
//   log1p(r), 2^-14.9 u; lo1..lo4 and their sums 2^-80, the tables' tails 2^-97; the Fast2Sum
//   that renormalizes at the end is exact. Together below 2^-12.1 u relative to log x.
//   y log x: where the result is finite, non-zero and normal, |y log x| < 710, so the log's
//   error is below 710 * 2^-12.1 u = 0.17 ulp of the result (the products y log_hi and y lo are
//   exact inside their fmas). Subnormal results (|y log x| up to 745) are rounded once on their
//   own grid (edge_lanes), whose ulp is at least 2^-52 of them: below 0.09 ulp there.
//   exp: r' rounded once (|r'| < 2^-5: u/64; its small part's roundings 2^-90), r' + tail and tmp
//   once each (u/64 each), Q's fit 2^-65 (u/4096), r'^2's rounding in r'^2 Q (r'^2 Q < 2^-12:
//   u/4096), T's tail 2^-106: below 3u/64 + u/2048 = 0.05u relative, 0.05 ulp.
//   Total below 0.5 + 0.17 + 0.05 = 0.72 ulp. Measured against long double powl: 0.61 ulp at most,
//   near x = 1 + 2^-6 (row 1's lower end) with |y log x| ~ 705 (4 * 10^7 inputs aimed there: x
//   within 0.004 of rows 0 and 1's edges, |y log x| 690-709.7), 0.536 away from x ~ 1 (4 * 10^6
//   inputs each: bases over the whole exponent range, subnormal bases and results, overflow,
//   integer y, small y).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <immintrin.h>

namespace fuel {
namespace CPU_CAPABILITY {
namespace pow_double_avx512 {

// ---- Tables and coefficients: tools/pow_double_coefficients.py prints them. ----
// log, row j: 1/c, log c to a multiple of 2^-43, and log c minus that.
alignas(64) static constexpr double kInvC[32] = {
    0x1.0000000000000p+0, 0x1.f000000000000p-1, 0x1.e000000000000p-1, 0x1.d400000000000p-1,
    0x1.c800000000000p-1, 0x1.b800000000000p-1, 0x1.b000000000000p-1, 0x1.a400000000000p-1,
    0x1.9800000000000p-1, 0x1.9000000000000p-1, 0x1.8800000000000p-1, 0x1.7c00000000000p-1,
    0x1.7400000000000p-1, 0x1.6c00000000000p-1, 0x1.6400000000000p-1, 0x1.5c00000000000p-1,
    0x1.5400000000000p-1, 0x1.5000000000000p-1, 0x1.4800000000000p-1, 0x1.4000000000000p-1,
    0x1.3c00000000000p-1, 0x1.3400000000000p-1, 0x1.3000000000000p-1, 0x1.2800000000000p-1,
    0x1.2400000000000p-1, 0x1.2000000000000p-1, 0x1.1c00000000000p-1, 0x1.1400000000000p-1,
    0x1.1000000000000p-1, 0x1.0c00000000000p-1, 0x1.0800000000000p-1, 0x1.0400000000000p-1,
};
alignas(64) static constexpr double kLogC[32] = {
    0x0.0p+0, 0x1.0415d89e74000p-5, 0x1.08598b59e4000p-4, 0x1.700d30aeac000p-4,
    0x1.da72763844000p-4, 0x1.365fcb0159000p-3, 0x1.5bf406b544000p-3, 0x1.95a5adcf70000p-3,
    0x1.d1037f2656000p-3, 0x1.f991c6cb3b000p-3, 0x1.1178e8227e800p-2, 0x1.314f1e1d36000p-2,
    0x1.4718dc271c800p-2, 0x1.5d5bddf596000p-2, 0x1.741d876c67800p-2, 0x1.8b639a88b3000p-2,
    0x1.a33440224f800p-2, 0x1.af5295248d000p-2, 0x1.c7ff9c7455800p-2, 0x1.e148a1a272800p-2,
    0x1.ee2a156b41000p-2, 0x1.04360be760400p-1, 0x1.0ae76e2d05400p-1, 0x1.188ee40f23c00p-1,
    0x1.1f8635fc61800p-1, 0x1.269621134dc00p-1, 0x1.2dbf557b0e000p-1, 0x1.3c6080c36c000p-1,
    0x1.43d9ff2f92400p-1, 0x1.4b6fd6f970c00p-1, 0x1.5322e26867800p-1, 0x1.5af405c364800p-1,
};
alignas(64) static constexpr double kLogCTail[32] = {
    0x0.0p+0, 0x1.111c05cf1d753p-47, -0x1.7e5dd7009902cp-46, 0x1.c1e8da99ded32p-49,
    0x1.a89401fa71733p-46, 0x1.62fa8234b7289p-51, -0x1.27023eb68981cp-46, 0x1.7f22858a0ff6fp-47,
    -0x1.84a7e75b6f6e4p-47, 0x1.bcbecca0cdf30p-46, -0x1.c210e63a5f01cp-45, -0x1.8e27ad3213cb8p-45,
    -0x1.f27ce0967d675p-45, -0x1.a0b2a08a465dcp-47, 0x1.d8b0949dc60b3p-45, -0x1.05ae1e5e70470p-45,
    0x1.3c6457f9d79f5p-45, -0x1.17cc552774458p-45, -0x1.9b6ddc15249aep-45, -0x1.326b207322938p-46,
    0x1.f27f45a470251p-45, -0x1.4c45fe79539e0p-47, 0x1.f486b887e7e27p-46, 0x1.4cc4ef8ab4650p-46,
    -0x1.a7242c9fe81d3p-45, -0x1.b61f105226250p-47, -0x1.7a6e507b9dc11p-46, -0x1.2b7367cfe13c2p-47,
    -0x1.d984f481051f7p-48, 0x1.f7115ed4c541cp-49, 0x1.5ccc45d257531p-47, 0x1.dfa63ac10c9fbp-45,
};
// exp, row j: 2^(j/16) to the nearest double, and its relative tail.
alignas(64) static constexpr double kExp2[16] = {
    0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0,
    0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0,
};
alignas(64) static constexpr double kExp2Tail[16] = {
    0x0.0p+0, 0x1.79aa65d837b6dp-54, -0x1.01b15eaa59348p-55, 0x1.68efde3a8a894p-54,
    0x1.34d754db0abb6p-55, 0x1.59f48a72a4c6dp-55, 0x1.690cebb7aafb0p-56, 0x1.063e1e21c5409p-54,
    -0x1.3b3efbf5e2228p-54, -0x1.b32dcb94da51dp-56, 0x1.db72fc1f0eab4p-55, 0x1.1affc2b91ce27p-56,
    0x1.c1a7792cb3387p-55, 0x1.36eae30af0cb3p-56, 0x1.4a385a63d07a7p-56, -0x1.ff7128fd391f0p-55,
};
constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;  // ln 2 to a multiple of 2^-42: k * kLn2Hi is exact
constexpr double kLn2Lo = 0x1.ef35793c76730p-45;
// log1p(r) = r - r^2/2 + r^3 P(r), P's coefficients from r^0 up, |r| <= 0x1.44p-6: relative error of
// the whole 2^-67.9.
constexpr double kLogPoly[8] = {0x1.5555555555553p-2, -0x1.ffffffffffffcp-3, 0x1.99999999ba8d3p-3,
                                -0x1.55555555738a1p-3, 0x1.2492452be8dc2p-3, -0x1.fffff8b81a19cp-4,
                                0x1.c779b951b7242p-4, -0x1.99ef1b5689d8fp-4};
constexpr double kInvLn2N = 0x1.71547652b82fep+4;  // 16 / ln 2
constexpr double kLn2HiN = 0x1.62e42fefa0000p-5;  // ln 2 / 16 in 37 bits: kd * kLn2HiN is exact, |kd| < 2^16
constexpr double kLn2LoN = 0x1.cf79abc9e3b3ap-44;
// exp(r) - 1 = r + r^2 Q(r), Q's coefficients from r^0 up, |r| <= ln2/32 + 2^-20: absolute error 2^-65.
constexpr double kExpPoly[6] = {0x1.0000000000004p-1, 0x1.5555555555557p-3, 0x1.55555554711b3p-5,
                                0x1.11111110aba1fp-7, 0x1.6c185155b2ac6p-10, 0x1.a01b651a53202p-13};
constexpr double kShift = 0x1.8p52;  // adding it rounds |v| < 2^51 to an integer, left in the low bits

inline __m512d set(double v) { return _mm512_set1_pd(v); }
// Row idx (its low 5 bits) of a 32-row column: vpermt2pd reads the low 4 bits, the fifth picks
// the half (upper: the lanes with bit 4 set).
inline __m512d lookup32(const double* column, __m512i idx, __mmask8 upper) {
  const __m512d low = _mm512_permutex2var_pd(_mm512_load_pd(column), idx, _mm512_load_pd(column + 8));
  const __m512d high = _mm512_permutex2var_pd(_mm512_load_pd(column + 16), idx, _mm512_load_pd(column + 24));
  return _mm512_mask_blend_pd(upper, low, high);
}
inline __m512d lookup16(const double* column, __m512i idx) {
  return _mm512_permutex2var_pd(_mm512_load_pd(column), idx, _mm512_load_pd(column + 8));
}

// P(r) in the form ARM's pow evaluates it: with s = -r^2/2 (ar2, already at hand) in place of r^2,
// so each coefficient of r^(2a+b) is scaled by (-2)^a, and by -2 more for the factor ar3 = -r^3/2.
constexpr double scaled(int i) {
  double f = -2.0;
  for (int a = 0; a < i / 2; ++a) f *= -2.0;
  return kLogPoly[i] * f;
}

// The lanes of core's result with |y log x| > 708 made right (the others are kept as they are):
// below -708 the result may be subnormal, where scalef would round twice (v to 53 bits, then to
// the subnormal's): instead, as ARM's specialcase, the value scaled by 2^1022 (w, below 1 exactly
// where the result is subnormal) is rounded once on the 2^-52 grid of 1 + w, its error terms
// added first, so that the product by 2^-1022 afterwards is exact. Beyond +-1000 (and for an
// infinite y log x), where kd and r' lose their meaning, +inf or 0.
inline __m512d edge_lanes(__m512d result, __m512d ehi, __m512d kd_16, __m512d t, __m512d tmp) {
  const __m512d one = set(1.0);
  const __m512d s = _mm512_scalef_pd(t, _mm512_add_pd(kd_16, set(1022.0)));  // exact: normal
  const __m512d w = _mm512_fmadd_pd(s, tmp, s);
  const __m512d w_err = _mm512_fmadd_pd(s, tmp, _mm512_sub_pd(s, w));  // s - w is exact
  const __m512d sum = _mm512_add_pd(one, w);
  const __m512d sum_err = _mm512_add_pd(_mm512_add_pd(_mm512_sub_pd(one, sum), w), w_err);
  const __m512d subnormal = _mm512_mul_pd(_mm512_sub_pd(_mm512_add_pd(sum, sum_err), one), set(0x1p-1022));
  const __mmask8 below = _mm512_cmp_pd_mask(ehi, _mm512_setzero_pd(), _CMP_LT_OQ) & _mm512_cmp_pd_mask(w, one, _CMP_LT_OQ);
  result = _mm512_mask_mov_pd(result, below, subnormal);
  result = _mm512_mask_mov_pd(result, _mm512_cmp_pd_mask(ehi, set(1000.0), _CMP_GT_OQ), set(__builtin_inf()));
  return _mm512_mask_mov_pd(result, _mm512_cmp_pd_mask(ehi, set(-1000.0), _CMP_LT_OQ), _mm512_setzero_pd());
}

inline __m512d core(__m512d x, __m512d y) {
  const __m512d one = set(1.0);
  // ---- log x = log_hi + lo ----
  const __m512d m = _mm512_getmant_pd(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
  const __m512d e = _mm512_getexp_pd(x);
  const __m512i idx = _mm512_srli_epi64(_mm512_add_epi64(_mm512_castpd_si512(m), _mm512_set1_epi64(1LL << 46)), 47);
  const __mmask8 wrap = _mm512_cmp_pd_mask(m, set(2.0 - 0x1p-6), _CMP_GE_OQ);
  const __m512d k = _mm512_mask_add_pd(e, wrap, e, one);
  const __m512d z = _mm512_mask_mul_pd(m, wrap, m, set(0.5));
  const __mmask8 upper = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
  const __m512d inv_c = lookup32(kInvC, idx, upper);
  const __m512d log_c = lookup32(kLogC, idx, upper);
  const __m512d log_c_tail = lookup32(kLogCTail, idx, upper);
  const __m512d r = _mm512_fmsub_pd(z, inv_c, one);  // exact (see the table)
  // k ln2 + log c + r, the rounding error of the sum kept.
  const __m512d t1 = _mm512_fmadd_pd(k, set(kLn2Hi), log_c);  // exact
  const __m512d t2 = _mm512_add_pd(t1, r);
  const __m512d lo1 = _mm512_fmadd_pd(k, set(kLn2Lo), log_c_tail);
  const __m512d lo2 = _mm512_add_pd(_mm512_sub_pd(t1, t2), r);  // Fast2Sum: |t1| >= |r| or t1 == 0
  // + -r^2/2: ar2 rounded, lo3 the product's error, lo4 the sum's.
  const __m512d ar = _mm512_mul_pd(set(-0.5), r);
  const __m512d ar2 = _mm512_mul_pd(r, ar);
  const __m512d hi = _mm512_add_pd(t2, ar2);
  const __m512d lo3 = _mm512_fmsub_pd(ar, r, ar2);
  const __m512d lo4 = _mm512_add_pd(_mm512_sub_pd(t2, hi), ar2);
  // + r^3 P(r) = ar3 P', P' in Estrin's scheme over r and ar2, its constant term (-2/3, nearly all
  // of it) multiplied in apart, last, so that P's roundings reach only the rest (2^-6 of it).
  // ar3 = -r^3/2 rounded once: r (ar2 + lo3), lo3 being ar2's rounding error.
  const __m512d ar3 = _mm512_fmadd_pd(r, ar2, _mm512_mul_pd(r, lo3));
  const __m512d s2 = _mm512_mul_pd(ar2, ar2);
  const __m512d p01 = _mm512_mul_pd(r, set(scaled(1)));
  const __m512d p23 = _mm512_fmadd_pd(r, set(scaled(3)), set(scaled(2)));
  const __m512d p45 = _mm512_fmadd_pd(r, set(scaled(5)), set(scaled(4)));
  const __m512d p67 = _mm512_fmadd_pd(r, set(scaled(7)), set(scaled(6)));
  const __m512d p = _mm512_fmadd_pd(s2, _mm512_fmadd_pd(ar2, p67, p45), _mm512_fmadd_pd(ar2, p23, p01));
  const __m512d lo_sum = _mm512_add_pd(_mm512_add_pd(lo1, lo2), _mm512_add_pd(lo3, lo4));
  const __m512d lo_unnormalized = _mm512_fmadd_pd(ar3, set(scaled(0)), _mm512_fmadd_pd(ar3, p, lo_sum));
  // Renormalized: lo holds r^3 P (up to 2^-18.4), which must not be left out of log_hi, the value
  // the exp's reduction is taken from (|r'| would leave Q's interval).
  const __m512d log_hi = _mm512_add_pd(hi, lo_unnormalized);
  const __m512d lo = _mm512_add_pd(_mm512_sub_pd(hi, log_hi), lo_unnormalized);

  // ---- exp(y log_hi + y lo) ----
  const __m512d ehi = _mm512_mul_pd(y, log_hi);
  const __m512d shifted = _mm512_fmadd_pd(ehi, set(kInvLn2N), set(kShift));
  const __m512d kd = _mm512_sub_pd(shifted, set(kShift));
  // r' = (ehi - kd ln2hi/16) + (the product's error + y lo - kd ln2lo/16): the first exact (kd
  // ln2hi/16 is, and within 2^-5 of ehi), the second summed beside it (below 2^-40, its
  // roundings 2^-90), so r' is rounded once.
  const __m512d small = _mm512_fnmadd_pd(kd, set(kLn2LoN), _mm512_fmadd_pd(y, lo, _mm512_fmsub_pd(y, log_hi, ehi)));
  const __m512d rr = _mm512_add_pd(_mm512_fnmadd_pd(kd, set(kLn2HiN), ehi), small);
  const __m512i j = _mm512_castpd_si512(shifted);  // kd mod 16 in the low 4 bits
  const __m512d t = lookup16(kExp2, j);
  const __m512d t_tail = lookup16(kExp2Tail, j);
  const __m512d r2 = _mm512_mul_pd(rr, rr);
  const __m512d r4 = _mm512_mul_pd(r2, r2);
  const __m512d q01 = _mm512_fmadd_pd(rr, set(kExpPoly[1]), set(kExpPoly[0]));
  const __m512d q23 = _mm512_fmadd_pd(rr, set(kExpPoly[3]), set(kExpPoly[2]));
  const __m512d q45 = _mm512_fmadd_pd(rr, set(kExpPoly[5]), set(kExpPoly[4]));
  const __m512d q = _mm512_fmadd_pd(r4, q45, _mm512_fmadd_pd(r2, q23, q01));
  const __m512d tmp = _mm512_fmadd_pd(r2, q, _mm512_add_pd(rr, t_tail));
  const __m512d v = _mm512_fmadd_pd(t, tmp, t);
  // scalef multiplies by 2^floor(kd/16), kd = 16 floor(kd/16) + j: exactly for a normal result
  // (v's rounding the only one), to inf beyond DBL_MAX; below DBL_MIN it would round a second
  // time, to the subnormal's grid (edge_lanes redoes those).
  const __m512d kd_16 = _mm512_mul_pd(kd, set(1.0 / 16));
  __m512d result = _mm512_scalef_pd(v, kd_16);
  // |y log x| > 708 (rare, one test for the vector): subnormal results, rounded once, and lanes
  // where the reduction above has no meaning.
  const __mmask8 edge = _mm512_cmp_pd_mask(_mm512_abs_pd(ehi), set(708.0), _CMP_GT_OQ);
  if (edge != 0) result = edge_lanes(result, ehi, kd_16, t, tmp);
  return result;
}

// Whether every lane has a positive finite base (subnormals included) and a finite exponent: the
// lanes the core alone gets right, so the caller can skip its special cases (one vfpclasspd each:
// NaN, zeros, infinities, negative for x; NaN and infinities for y).
inline bool all_ordinary(__m512d x, __m512d y) {
  return _kortestz_mask8_u8(_mm512_fpclass_pd_mask(x, 0xdf), _mm512_fpclass_pd_mask(y, 0x99));
}

}  // namespace pow_double_avx512
}  // namespace CPU_CAPABILITY
}  // namespace fuel
