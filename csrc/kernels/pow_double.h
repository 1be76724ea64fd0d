// pow_double_core: x ** y for float64 lanes, x > 0 finite (subnormals included), y finite and
// non-zero, within 1 ulp of the correctly rounded power (0.505 ulp the most measured), results that
// overflow +inf, results that underflow 0 or the subnormal within 1 ulp. Every other lane (x <= 0,
// inf, NaN, y == 0, infinite or NaN y) gets an unspecified value without trapping: the caller sets
// C99's special cases itself, by blends, after this core (and passes |x| for negative bases).
//
// Algorithm: x ** y = exp(y * log x), with log x carried as hi + lo to about 2^-68 relative (y * log x
// reaches ~745 in magnitude where the result is finite and non-zero, so its absolute error must
// stay near 2^-60 for the exp to be within ~0.01 ulp of exact), after ARM optimized-routines' scalar
// pow (math/pow.c, Copyright (c) 2018-2024 Arm Limited, MIT OR Apache-2.0 WITH LLVM-exception):
//   log: x = 2^k z, z in [0x1.69555p-1, 0x1.69555p0); a 128-entry table, indexed by z's top
//        mantissa bits, gives 1/c (a value with few bits, so r = z/c - 1 is exact in one fma) and
//        log c as a hi part (a multiple of 2^-43, so k ln2hi + logc is exact) and a lo part;
//        log x = k ln2 + log c + log1p(r), log1p(r) = r - r^2/2 + r^3 P(r), |r| < 0x1.6bp-8,
//        with the error terms of each rounded addition collected into lo (double-double).
//   exp: y log x = ehi + elo (elo from an fma); ehi = k ln2/128 + r', 2^(k/128) = 2^(k>>7) *
//        T[k & 127] with T as a double and its relative tail (so the table adds no rounding
//        error), exp(r') - 1 = r' + r'^2 Q(r'), |r'| < ln2/256 + 2^-15; result scale + scale * tmp.
//   Lanes with |ehi| > 708, where scale leaves the normal range, take a slower branch: overflow
//   via a 2^-1009 prescale, underflow via ARM's rounding of the subnormal result in one step (no
//   double rounding: the value is rounded on the 2^-52 grid of [1, 2) and then scaled exactly).
// The polynomial coefficients are our own near-minimax (Chebyshev-node) fits, one degree above
// ARM's; they and the tables were produced by the script kept at the end of this file.
//
// The code is written once over a few per-level helpers (bit casts, shifts, table loads, fma), so
// the AVX2 and DEFAULT builds are the same algorithm: AVX2 loads table entries by row loads and a
// transpose, DEFAULT spells every helper as a per-lane loop (std::fma there: the error-free steps
// need a fused multiply-add at every level).
//
// AVX-512 has a variant of its own, pow_double_avx512.h (same contract, within 0.61 ulp measured):
// 32- and 16-row tables looked up in registers by permutes, where 128-row gathers took about half
// of this core's time on Intel's AVX-512 parts, and vgetmantpd/vgetexppd/vscalefpd for the
// reduction and the result. The code below is compiled at the other levels only.
#pragma once

#if defined(CPU_CAPABILITY_AVX512)
#include "pow_double_avx512.h"

namespace fuel {
namespace CPU_CAPABILITY {
// x ** y for x > 0 finite (subnormals included) and y finite; see the top of the file.
inline at::vec::Vectorized<double> pow_double_core(const at::vec::Vectorized<double>& x,
                                                   const at::vec::Vectorized<double>& y) {
  return pow_double_avx512::core(x, y);
}
// Whether every lane is one pow_double_core alone gets right (see pow_double_avx512.h).
inline bool pow_double_all_ordinary(const at::vec::Vectorized<double>& x, const at::vec::Vectorized<double>& y) {
  return pow_double_avx512::all_ordinary(x, y);
}
}  // namespace CPU_CAPABILITY
}  // namespace fuel

#else  // the shared core, for AVX2 and DEFAULT

#include <ATen/cpu/vec/vec.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace fuel {
namespace CPU_CAPABILITY {
namespace pow_double_detail {

using VD = at::vec::Vectorized<double>;
using VI = at::vec::Vectorized<int64_t>;
static_assert(VD::size() == VI::size(), "double and int64 lanes must pair up");

constexpr double double_with_bits(uint64_t bits) { return std::bit_cast<double>(bits); }

// ---- Tables, 128 rows each (generated, see the end of the file). ----
// log, row i for z's subinterval i: 1/c, log c rounded to a multiple of 2^-43, log c minus that,
// padding (rows of 32 bytes, one aligned pair of 16-byte loads each).
// exp, row i: 2^(i/128)'s relative tail, and the bits of its nearest double minus i << 45.
alignas(32) static constexpr double kLogTable[128][4] = {
    {0x1.6a00000000000p+0, -0x1.62c82f2b9c800p-2, 0x1.ab42428375680p-48, 0.0},
    {0x1.6800000000000p+0, -0x1.5d1bdbf580800p-2, -0x1.ca508d8e0f720p-46, 0.0},
    {0x1.6600000000000p+0, -0x1.5767717455800p-2, -0x1.362a4d5b6506dp-45, 0.0},
    {0x1.6400000000000p+0, -0x1.51aad872df800p-2, -0x1.684e49eb067d5p-49, 0.0},
    {0x1.6200000000000p+0, -0x1.4be5f95777800p-2, -0x1.41b6993293ee0p-47, 0.0},
    {0x1.6000000000000p+0, -0x1.4618bc21c6000p-2, 0x1.3d82f484c84ccp-46, 0.0},
    {0x1.5e00000000000p+0, -0x1.404308686a800p-2, 0x1.c42f3ed820b3ap-50, 0.0},
    {0x1.5c00000000000p+0, -0x1.3a64c55694800p-2, 0x1.0b1c686519460p-45, 0.0},
    {0x1.5a00000000000p+0, -0x1.347dd9a988000p-2, 0x1.5594dd4c58092p-45, 0.0},
    {0x1.5800000000000p+0, -0x1.2e8e2bae12000p-2, 0x1.67b1e99b72bd8p-45, 0.0},
    {0x1.5600000000000p+0, -0x1.2895a13de8800p-2, 0x1.5ca14b6cfb03fp-46, 0.0},
    {0x1.5600000000000p+0, -0x1.2895a13de8800p-2, 0x1.5ca14b6cfb03fp-46, 0.0},
    {0x1.5400000000000p+0, -0x1.22941fbcf7800p-2, -0x1.65a242853da76p-46, 0.0},
    {0x1.5200000000000p+0, -0x1.1c898c1699800p-2, -0x1.fafbc68e75404p-46, 0.0},
    {0x1.5000000000000p+0, -0x1.1675cababa800p-2, 0x1.f1fc63382a8f0p-46, 0.0},
    {0x1.4e00000000000p+0, -0x1.1058bf9ae4800p-2, -0x1.6a8c4fd055a66p-45, 0.0},
    {0x1.4c00000000000p+0, -0x1.0a324e2739000p-2, -0x1.c6bee7ef4030ep-47, 0.0},
    {0x1.4a00000000000p+0, -0x1.0402594b4d000p-2, -0x1.036b89ef42d7fp-48, 0.0},
    {0x1.4a00000000000p+0, -0x1.0402594b4d000p-2, -0x1.036b89ef42d7fp-48, 0.0},
    {0x1.4800000000000p+0, -0x1.fb9186d5e4000p-3, 0x1.d572aab993c87p-47, 0.0},
    {0x1.4600000000000p+0, -0x1.ef0adcbdc6000p-3, 0x1.b26b79c86af24p-45, 0.0},
    {0x1.4400000000000p+0, -0x1.e27076e2af000p-3, -0x1.72f4f543fff10p-46, 0.0},
    {0x1.4200000000000p+0, -0x1.d5c216b4fc000p-3, 0x1.1ba91bbca681bp-45, 0.0},
    {0x1.4000000000000p+0, -0x1.c8ff7c79aa000p-3, 0x1.7794f689f8434p-45, 0.0},
    {0x1.4000000000000p+0, -0x1.c8ff7c79aa000p-3, 0x1.7794f689f8434p-45, 0.0},
    {0x1.3e00000000000p+0, -0x1.bc286742d9000p-3, 0x1.94eb0318bb78fp-46, 0.0},
    {0x1.3c00000000000p+0, -0x1.af3c94e80c000p-3, 0x1.a4e633fcd9066p-52, 0.0},
    {0x1.3a00000000000p+0, -0x1.a23bc1fe2b000p-3, -0x1.58c64dc46c1eap-45, 0.0},
    {0x1.3a00000000000p+0, -0x1.a23bc1fe2b000p-3, -0x1.58c64dc46c1eap-45, 0.0},
    {0x1.3800000000000p+0, -0x1.9525a9cf45000p-3, -0x1.ad1d904c1d4e3p-45, 0.0},
    {0x1.3600000000000p+0, -0x1.87fa06520d000p-3, 0x1.bbdbf7fdbfa09p-45, 0.0},
    {0x1.3400000000000p+0, -0x1.7ab890210e000p-3, 0x1.bdb9072534a58p-45, 0.0},
    {0x1.3400000000000p+0, -0x1.7ab890210e000p-3, 0x1.bdb9072534a58p-45, 0.0},
    {0x1.3200000000000p+0, -0x1.6d60fe719d000p-3, -0x1.0e46aa3b2e266p-46, 0.0},
    {0x1.3000000000000p+0, -0x1.5ff3070a79000p-3, -0x1.e9e439f105039p-46, 0.0},
    {0x1.3000000000000p+0, -0x1.5ff3070a79000p-3, -0x1.e9e439f105039p-46, 0.0},
    {0x1.2e00000000000p+0, -0x1.526e5e3a1b000p-3, -0x1.0de8b90075b8fp-45, 0.0},
    {0x1.2c00000000000p+0, -0x1.44d2b6ccb8000p-3, 0x1.70cc16135783cp-46, 0.0},
    {0x1.2c00000000000p+0, -0x1.44d2b6ccb8000p-3, 0x1.70cc16135783cp-46, 0.0},
    {0x1.2a00000000000p+0, -0x1.371fc201e9000p-3, 0x1.178864d27543ap-48, 0.0},
    {0x1.2800000000000p+0, -0x1.29552f81ff000p-3, -0x1.48d301771c408p-45, 0.0},
    {0x1.2600000000000p+0, -0x1.1b72ad52f6000p-3, -0x1.e80a41811a396p-45, 0.0},
    {0x1.2600000000000p+0, -0x1.1b72ad52f6000p-3, -0x1.e80a41811a396p-45, 0.0},
    {0x1.2400000000000p+0, -0x1.0d77e7cd09000p-3, 0x1.a699688e85bf4p-47, 0.0},
    {0x1.2400000000000p+0, -0x1.0d77e7cd09000p-3, 0x1.a699688e85bf4p-47, 0.0},
    {0x1.2200000000000p+0, -0x1.fec9131dbe000p-4, -0x1.575545ca333f2p-45, 0.0},
    {0x1.2000000000000p+0, -0x1.e27076e2b0000p-4, 0x1.a342c2af0003cp-45, 0.0},
    {0x1.2000000000000p+0, -0x1.e27076e2b0000p-4, 0x1.a342c2af0003cp-45, 0.0},
    {0x1.1e00000000000p+0, -0x1.c5e548f5bc000p-4, -0x1.d0c57585fbe06p-46, 0.0},
    {0x1.1c00000000000p+0, -0x1.a926d3a4ae000p-4, 0x1.53935e85baac8p-45, 0.0},
    {0x1.1c00000000000p+0, -0x1.a926d3a4ae000p-4, 0x1.53935e85baac8p-45, 0.0},
    {0x1.1a00000000000p+0, -0x1.8c345d631a000p-4, 0x1.37c294d2f5668p-46, 0.0},
    {0x1.1a00000000000p+0, -0x1.8c345d631a000p-4, 0x1.37c294d2f5668p-46, 0.0},
    {0x1.1800000000000p+0, -0x1.6f0d28ae56000p-4, -0x1.69737c93373dap-45, 0.0},
    {0x1.1600000000000p+0, -0x1.51b073f062000p-4, 0x1.f025b61c65e57p-46, 0.0},
    {0x1.1600000000000p+0, -0x1.51b073f062000p-4, 0x1.f025b61c65e57p-46, 0.0},
    {0x1.1400000000000p+0, -0x1.341d7961be000p-4, 0x1.c5edaccf913dfp-45, 0.0},
    {0x1.1400000000000p+0, -0x1.341d7961be000p-4, 0x1.c5edaccf913dfp-45, 0.0},
    {0x1.1200000000000p+0, -0x1.16536eea38000p-4, 0x1.47c5e768fa309p-46, 0.0},
    {0x1.1000000000000p+0, -0x1.f0a30c0118000p-5, 0x1.d599e83368e91p-45, 0.0},
    {0x1.1000000000000p+0, -0x1.f0a30c0118000p-5, 0x1.d599e83368e91p-45, 0.0},
    {0x1.0e00000000000p+0, -0x1.b42dd71198000p-5, 0x1.c827ae5d6704cp-46, 0.0},
    {0x1.0e00000000000p+0, -0x1.b42dd71198000p-5, 0x1.c827ae5d6704cp-46, 0.0},
    {0x1.0c00000000000p+0, -0x1.77458f632c000p-5, -0x1.cfc4634f2a1eep-45, 0.0},
    {0x1.0c00000000000p+0, -0x1.77458f632c000p-5, -0x1.cfc4634f2a1eep-45, 0.0},
    {0x1.0a00000000000p+0, -0x1.39e87b9fec000p-5, 0x1.502b7f526feaap-48, 0.0},
    {0x1.0a00000000000p+0, -0x1.39e87b9fec000p-5, 0x1.502b7f526feaap-48, 0.0},
    {0x1.0800000000000p+0, -0x1.f829b0e780000p-6, -0x1.980267c7e09e4p-45, 0.0},
    {0x1.0800000000000p+0, -0x1.f829b0e780000p-6, -0x1.980267c7e09e4p-45, 0.0},
    {0x1.0600000000000p+0, -0x1.7b91b07d58000p-6, -0x1.88d5493faa639p-45, 0.0},
    {0x1.0400000000000p+0, -0x1.fc0a8b0fc0000p-7, -0x1.f1e7cf6d3a69cp-50, 0.0},
    {0x1.0400000000000p+0, -0x1.fc0a8b0fc0000p-7, -0x1.f1e7cf6d3a69cp-50, 0.0},
    {0x1.0200000000000p+0, -0x1.fe02a6b100000p-8, -0x1.9e23f0dda40e4p-46, 0.0},
    {0x1.0200000000000p+0, -0x1.fe02a6b100000p-8, -0x1.9e23f0dda40e4p-46, 0.0},
    {0x1.0000000000000p+0, 0x0.0p+0, 0x0.0p+0, 0.0},
    {0x1.0000000000000p+0, 0x0.0p+0, 0x0.0p+0, 0.0},
    {0x1.fc00000000000p-1, 0x1.0101575890000p-7, -0x1.0c76b999d2be8p-46, 0.0},
    {0x1.f800000000000p-1, 0x1.0205658938000p-6, -0x1.3dc5b06e2f7d2p-45, 0.0},
    {0x1.f400000000000p-1, 0x1.8492528c90000p-6, -0x1.aa0ba325a0c34p-45, 0.0},
    {0x1.f000000000000p-1, 0x1.0415d89e74000p-5, 0x1.111c05cf1d753p-47, 0.0},
    {0x1.ec00000000000p-1, 0x1.466aed42e0000p-5, -0x1.c167375bdfd28p-45, 0.0},
    {0x1.e800000000000p-1, 0x1.894aa149fc000p-5, -0x1.97995d05a267dp-46, 0.0},
    {0x1.e400000000000p-1, 0x1.ccb73cdddc000p-5, -0x1.a68f247d82807p-46, 0.0},
    {0x1.e200000000000p-1, 0x1.eea31c006c000p-5, -0x1.e113e4fc93b7bp-47, 0.0},
    {0x1.de00000000000p-1, 0x1.1973bd1466000p-4, -0x1.5325d560d9e9bp-45, 0.0},
    {0x1.da00000000000p-1, 0x1.3bdf5a7d1e000p-4, 0x1.cc85ea5db4ed7p-45, 0.0},
    {0x1.d600000000000p-1, 0x1.5e95a4d97a000p-4, -0x1.c69063c5d1d1ep-45, 0.0},
    {0x1.d400000000000p-1, 0x1.700d30aeac000p-4, 0x1.c1e8da99ded32p-49, 0.0},
    {0x1.d000000000000p-1, 0x1.9335e5d594000p-4, 0x1.3115c3abd47dap-45, 0.0},
    {0x1.cc00000000000p-1, 0x1.b6ac88dad6000p-4, -0x1.390802bf768e5p-46, 0.0},
    {0x1.ca00000000000p-1, 0x1.c885801bc4000p-4, 0x1.646d1c65aacd3p-45, 0.0},
    {0x1.c600000000000p-1, 0x1.ec739830a2000p-4, -0x1.dc068afe645e0p-45, 0.0},
    {0x1.c400000000000p-1, 0x1.fe89139dbe000p-4, -0x1.534d64fa10afdp-45, 0.0},
    {0x1.c000000000000p-1, 0x1.1178e8227e000p-3, 0x1.1ef78ce2d07f2p-45, 0.0},
    {0x1.be00000000000p-1, 0x1.1aa2b7e23f000p-3, 0x1.ca78e44389934p-45, 0.0},
    {0x1.ba00000000000p-1, 0x1.2d1610c868000p-3, 0x1.39d6ccb81b4a1p-47, 0.0},
    {0x1.b800000000000p-1, 0x1.365fcb0159000p-3, 0x1.62fa8234b7289p-51, 0.0},
    {0x1.b400000000000p-1, 0x1.4913d8333b000p-3, 0x1.5837954fdb678p-45, 0.0},
    {0x1.b200000000000p-1, 0x1.527e5e4a1b000p-3, 0x1.633e8e5697dc7p-45, 0.0},
    {0x1.ae00000000000p-1, 0x1.6574ebe8c1000p-3, 0x1.9cf8b2c3c2e78p-46, 0.0},
    {0x1.ac00000000000p-1, 0x1.6f0128b757000p-3, -0x1.5118de59c21e1p-45, 0.0},
    {0x1.aa00000000000p-1, 0x1.7898d85445000p-3, -0x1.c661070914305p-46, 0.0},
    {0x1.a600000000000p-1, 0x1.8beafeb390000p-3, -0x1.73d54aae92cd1p-47, 0.0},
    {0x1.a400000000000p-1, 0x1.95a5adcf70000p-3, 0x1.7f22858a0ff6fp-47, 0.0},
    {0x1.a000000000000p-1, 0x1.a93ed3c8ae000p-3, -0x1.8724350562169p-45, 0.0},
    {0x1.9e00000000000p-1, 0x1.b31d8575bd000p-3, -0x1.c358d4eace1aap-47, 0.0},
    {0x1.9c00000000000p-1, 0x1.bd087383be000p-3, -0x1.d4bc4595412b6p-45, 0.0},
    {0x1.9a00000000000p-1, 0x1.c6ffbc6f01000p-3, -0x1.1ec72c5962bd2p-48, 0.0},
    {0x1.9600000000000p-1, 0x1.db13db0d49000p-3, -0x1.aff2af715b035p-45, 0.0},
    {0x1.9400000000000p-1, 0x1.e530effe71000p-3, 0x1.212276041f430p-51, 0.0},
    {0x1.9200000000000p-1, 0x1.ef5ade4dd0000p-3, -0x1.a211565bb8e11p-51, 0.0},
    {0x1.9000000000000p-1, 0x1.f991c6cb3b000p-3, 0x1.bcbecca0cdf30p-46, 0.0},
    {0x1.8c00000000000p-1, 0x1.07138604d5800p-2, 0x1.89cdb16ed4e91p-48, 0.0},
    {0x1.8a00000000000p-1, 0x1.0c42d67616000p-2, 0x1.7188b163ceae9p-45, 0.0},
    {0x1.8800000000000p-1, 0x1.1178e8227e800p-2, -0x1.c210e63a5f01cp-45, 0.0},
    {0x1.8600000000000p-1, 0x1.16b5ccbacf800p-2, 0x1.b9acdf7a51681p-45, 0.0},
    {0x1.8400000000000p-1, 0x1.1bf99635a6800p-2, 0x1.ca6ed5147bdb7p-45, 0.0},
    {0x1.8200000000000p-1, 0x1.214456d0eb800p-2, 0x1.a87deba46baeap-47, 0.0},
    {0x1.7e00000000000p-1, 0x1.2bef07cdc9000p-2, 0x1.a9cfa4a5004f4p-45, 0.0},
    {0x1.7c00000000000p-1, 0x1.314f1e1d36000p-2, -0x1.8e27ad3213cb8p-45, 0.0},
    {0x1.7a00000000000p-1, 0x1.36b6776be1000p-2, 0x1.16ecdb0f177c8p-46, 0.0},
    {0x1.7800000000000p-1, 0x1.3c25277333000p-2, 0x1.83b54b606bd5cp-46, 0.0},
    {0x1.7600000000000p-1, 0x1.419b423d5e800p-2, 0x1.8e436ec90e09dp-47, 0.0},
    {0x1.7400000000000p-1, 0x1.4718dc271c800p-2, -0x1.f27ce0967d675p-45, 0.0},
    {0x1.7200000000000p-1, 0x1.4c9e09e173000p-2, -0x1.e20891b0ad8a4p-45, 0.0},
    {0x1.7000000000000p-1, 0x1.522ae0738a000p-2, 0x1.ebe708164c759p-45, 0.0},
    {0x1.6e00000000000p-1, 0x1.57bf753c8d000p-2, 0x1.fadedee5d40efp-46, 0.0},
    {0x1.6c00000000000p-1, 0x1.5d5bddf596000p-2, -0x1.a0b2a08a465dcp-47, 0.0},
};
alignas(16) static constexpr double kExpTable[128][2] = {
    {0x0.0p+0, double_with_bits(0x3ff0000000000000ULL)},
    {0x1.b3b4f1a88bf6ep-54, double_with_bits(0x3feff63da9fb3335ULL)},
    {-0x1.160139cd8dc5dp-56, double_with_bits(0x3fefec9a3e778061ULL)},
    {-0x1.05e7a108766d1p-54, double_with_bits(0x3fefe315e86e7f85ULL)},
    {0x1.cd2523567f613p-55, double_with_bits(0x3fefd9b0d3158574ULL)},
    {-0x1.bce8023f98efap-55, double_with_bits(0x3fefd06b29ddf6deULL)},
    {0x1.0f74e61e6c861p-57, double_with_bits(0x3fefc74518759bc8ULL)},
    {0x1.0a3e45b33d399p-54, double_with_bits(0x3fefbe3ecac6f383ULL)},
    {0x1.79aa65d837b6dp-54, double_with_bits(0x3fefb5586cf9890fULL)},
    {0x1.eb51a92fdeffcp-55, double_with_bits(0x3fefac922b7247f7ULL)},
    {0x1.ebe3d702f9cd1p-60, double_with_bits(0x3fefa3ec32d3d1a2ULL)},
    {-0x1.a033489906e0bp-57, double_with_bits(0x3fef9b66affed31bULL)},
    {-0x1.556522a2fbd0ep-54, double_with_bits(0x3fef9301d0125b51ULL)},
    {-0x1.080ef8c4eea55p-58, double_with_bits(0x3fef8abdc06c31ccULL)},
    {-0x1.1c923b9d5f416p-54, double_with_bits(0x3fef829aaea92de0ULL)},
    {0x1.0d3e3e95c55afp-55, double_with_bits(0x3fef7a98c8a58e51ULL)},
    {-0x1.01b15eaa59348p-55, double_with_bits(0x3fef72b83c7d517bULL)},
    {-0x1.f1ff055de323dp-55, double_with_bits(0x3fef6af9388c8deaULL)},
    {0x1.b898c3f1353bfp-55, double_with_bits(0x3fef635beb6fcb75ULL)},
    {-0x1.6d99c7611eb26p-54, double_with_bits(0x3fef5be084045cd4ULL)},
    {0x1.aecf73e3a2f60p-54, double_with_bits(0x3fef54873168b9aaULL)},
    {-0x1.fe782cb86389dp-55, double_with_bits(0x3fef4d5022fcd91dULL)},
    {0x1.a6f4144a6c38dp-55, double_with_bits(0x3fef463b88628cd6ULL)},
    {0x1.07a05b0e4047dp-55, double_with_bits(0x3fef3f49917ddc96ULL)},
    {0x1.68efde3a8a894p-54, double_with_bits(0x3fef387a6e756238ULL)},
    {0x1.75e18f274487dp-55, double_with_bits(0x3fef31ce4fb2a63fULL)},
    {0x1.0472b981fe7f2p-55, double_with_bits(0x3fef2b4565e27cddULL)},
    {-0x1.6b87b3f71085ep-54, double_with_bits(0x3fef24dfe1f56381ULL)},
    {0x1.2f7e16d09ab31p-55, double_with_bits(0x3fef1e9df51fdee1ULL)},
    {-0x1.d219b1a6fbffap-60, double_with_bits(0x3fef187fd0dad990ULL)},
    {0x1.b3782720c0ab4p-55, double_with_bits(0x3fef1285a6e4030bULL)},
    {0x1.e149289cecb8fp-57, double_with_bits(0x3fef0cafa93e2f56ULL)},
    {0x1.34d754db0abb6p-55, double_with_bits(0x3fef06fe0a31b715ULL)},
    {0x1.64201e2ac744cp-55, double_with_bits(0x3fef0170fc4cd831ULL)},
    {0x1.fdd395dd3f84ap-55, double_with_bits(0x3feefc08b26416ffULL)},
    {-0x1.6a3803b8e5b04p-55, double_with_bits(0x3feef6c55f929ff1ULL)},
    {-0x1.24aedcc4b5068p-54, double_with_bits(0x3feef1a7373aa9cbULL)},
    {-0x1.907f81b512d8ep-54, double_with_bits(0x3feeecae6d05d866ULL)},
    {-0x1.1d1e83e9436d2p-56, double_with_bits(0x3feee7db34e59ff7ULL)},
    {-0x1.91919b3ce1b15p-54, double_with_bits(0x3feee32dc313a8e5ULL)},
    {0x1.59f48a72a4c6dp-55, double_with_bits(0x3feedea64c123422ULL)},
    {-0x1.312607a28698ap-54, double_with_bits(0x3feeda4504ac801cULL)},
    {-0x1.8a78f4817895bp-58, double_with_bits(0x3feed60a21f72e2aULL)},
    {-0x1.c2c9b67499a1bp-56, double_with_bits(0x3feed1f5d950a897ULL)},
    {0x1.363ed60c2ac11p-59, double_with_bits(0x3feece086061892dULL)},
    {0x1.666093b0664efp-54, double_with_bits(0x3feeca41ed1d0057ULL)},
    {0x1.ecce1daa10379p-57, double_with_bits(0x3feec6a2b5c13cd0ULL)},
    {0x1.3ff8e3f0f1230p-54, double_with_bits(0x3feec32af0d7d3deULL)},
    {0x1.690cebb7aafb0p-56, double_with_bits(0x3feebfdad5362a27ULL)},
    {0x1.31dbdeb54e077p-54, double_with_bits(0x3feebcb299fddd0dULL)},
    {-0x1.f94340071a38ep-55, double_with_bits(0x3feeb9b2769d2ca7ULL)},
    {-0x1.7deccdc93a349p-55, double_with_bits(0x3feeb6daa2cf6642ULL)},
    {-0x1.8dec6bd0f385fp-56, double_with_bits(0x3feeb42b569d4f82ULL)},
    {-0x1.61246ec7b5cf6p-55, double_with_bits(0x3feeb1a4ca5d920fULL)},
    {0x1.3350518fdd78ep-54, double_with_bits(0x3feeaf4736b527daULL)},
    {0x1.b98b72f8a9b05p-56, double_with_bits(0x3feead12d497c7fdULL)},
    {0x1.063e1e21c5409p-54, double_with_bits(0x3feeab07dd485429ULL)},
    {0x1.4c7855019c6eap-60, double_with_bits(0x3feea9268a5946b7ULL)},
    {0x1.432e62b64c035p-54, double_with_bits(0x3feea76f15ad2148ULL)},
    {-0x1.ce44a6199769fp-55, double_with_bits(0x3feea5e1b976dc09ULL)},
    {-0x1.c33c53bef4da8p-55, double_with_bits(0x3feea47eb03a5585ULL)},
    {-0x1.45378892be9aep-55, double_with_bits(0x3feea34634ccc320ULL)},
    {-0x1.3cedd78565858p-54, double_with_bits(0x3feea23882552225ULL)},
    {0x1.710aa807e1964p-58, double_with_bits(0x3feea155d44ca973ULL)},
    {-0x1.3b3efbf5e2228p-54, double_with_bits(0x3feea09e667f3bcdULL)},
    {-0x1.a12ad8734b982p-57, double_with_bits(0x3feea012750bdabfULL)},
    {-0x1.367efb86da9eep-57, double_with_bits(0x3fee9fb23c651a2fULL)},
    {-0x1.0dc3d54e08851p-55, double_with_bits(0x3fee9f7df9519484ULL)},
    {-0x1.81f647e5a3ecfp-56, double_with_bits(0x3fee9f75e8ec5f74ULL)},
    {-0x1.6ee4ac08b7db0p-55, double_with_bits(0x3fee9f9a48a58174ULL)},
    {-0x1.619321e55e68ap-55, double_with_bits(0x3fee9feb564267c9ULL)},
    {0x1.09ccb5e09d4d3p-54, double_with_bits(0x3feea0694fde5d3fULL)},
    {-0x1.b32dcb94da51dp-56, double_with_bits(0x3feea11473eb0187ULL)},
    {0x1.4ecfd5467c06bp-54, double_with_bits(0x3feea1ed0130c132ULL)},
    {0x1.5ebe1abd66c55p-57, double_with_bits(0x3feea2f336cf4e62ULL)},
    {-0x1.8a1c52fb3cf42p-55, double_with_bits(0x3feea427543e1a12ULL)},
    {-0x1.369b6f13b3734p-54, double_with_bits(0x3feea589994cce13ULL)},
    {-0x1.05e843a19ff1ep-55, double_with_bits(0x3feea71a4623c7adULL)},
    {-0x1.4d450d872576ep-54, double_with_bits(0x3feea8d99b4492edULL)},
    {0x1.0ad675b0e8a00p-54, double_with_bits(0x3feeaac7d98a6699ULL)},
    {0x1.db72fc1f0eab4p-55, double_with_bits(0x3feeace5422aa0dbULL)},
    {-0x1.5b6609cc5e7ffp-57, double_with_bits(0x3feeaf3216b5448cULL)},
    {0x1.bf68359f35f44p-56, double_with_bits(0x3feeb1ae99157736ULL)},
    {-0x1.3091fa71e3d83p-54, double_with_bits(0x3feeb45b0b91ffc6ULL)},
    {-0x1.da9b88b6c1e29p-58, double_with_bits(0x3feeb737b0cdc5e5ULL)},
    {-0x1.c23f97c90b959p-57, double_with_bits(0x3feeba44cbc8520fULL)},
    {-0x1.2434322f4f9aap-54, double_with_bits(0x3feebd829fde4e50ULL)},
    {-0x1.5ca6cd7668e4bp-55, double_with_bits(0x3feec0f170ca07baULL)},
    {0x1.1affc2b91ce27p-56, double_with_bits(0x3feec49182a3f090ULL)},
    {0x1.dd235e10a73bbp-57, double_with_bits(0x3feec86319e32323ULL)},
    {-0x1.7c50422622263p-55, double_with_bits(0x3feecc667b5de565ULL)},
    {0x1.b1c86e3e231d5p-55, double_with_bits(0x3feed09bec4a2d33ULL)},
    {-0x1.1bbd1d3bcbb15p-54, double_with_bits(0x3feed503b23e255dULL)},
    {0x1.0cc319cee31d2p-54, double_with_bits(0x3feed99e1330b358ULL)},
    {0x1.469846e735ab3p-55, double_with_bits(0x3feede6b5579fdbfULL)},
    {-0x1.2dfcd978e9db4p-55, double_with_bits(0x3feee36bbfd3f37aULL)},
    {0x1.c1a7792cb3387p-55, double_with_bits(0x3feee89f995ad3adULL)},
    {-0x1.07b8f4ad1d9fap-54, double_with_bits(0x3feeee07298db666ULL)},
    {-0x1.5c3d956dcaebap-58, double_with_bits(0x3feef3a2b84f15fbULL)},
    {-0x1.0a40e3da6f640p-54, double_with_bits(0x3feef9728de5593aULL)},
    {-0x1.8d6f438ad9334p-57, double_with_bits(0x3feeff76f2fb5e47ULL)},
    {-0x1.1eee26b588a35p-54, double_with_bits(0x3fef05b030a1064aULL)},
    {0x1.4ffd70a5fddcdp-56, double_with_bits(0x3fef0c1e904bc1d2ULL)},
    {-0x1.1bdfbfa9298acp-54, double_with_bits(0x3fef12c25bd71e09ULL)},
    {0x1.36eae30af0cb3p-56, double_with_bits(0x3fef199bdd85529cULL)},
    {0x1.ee3325c9ffd94p-55, double_with_bits(0x3fef20ab5fffd07aULL)},
    {0x1.4e08fd10959acp-55, double_with_bits(0x3fef27f12e57d14bULL)},
    {0x1.3cdaf384e1a67p-57, double_with_bits(0x3fef2f6d9406e7b5ULL)},
    {0x1.76b2c6c921968p-57, double_with_bits(0x3fef3720dcef9069ULL)},
    {-0x1.08a1883ccb5d2p-55, double_with_bits(0x3fef3f0b555dc3faULL)},
    {-0x1.fad5d3ffffa6fp-55, double_with_bits(0x3fef472d4a07897cULL)},
    {-0x1.00dae3875a949p-54, double_with_bits(0x3fef4f87080d89f2ULL)},
    {0x1.4a385a63d07a7p-56, double_with_bits(0x3fef5818dcfba487ULL)},
    {-0x1.2919e2040220fp-55, double_with_bits(0x3fef60e316c98398ULL)},
    {0x1.e5a50d5c192acp-55, double_with_bits(0x3fef69e603db3285ULL)},
    {0x1.43a59ac016b4bp-55, double_with_bits(0x3fef7321f301b460ULL)},
    {-0x1.2d52107b43e1fp-55, double_with_bits(0x3fef7c97337b9b5fULL)},
    {-0x1.92ab93b470dc9p-55, double_with_bits(0x3fef864614f5a129ULL)},
    {0x1.4b604603a88d3p-56, double_with_bits(0x3fef902ee78b3ff6ULL)},
    {0x1.3c5ec519d7271p-55, double_with_bits(0x3fef9a51fbc74c83ULL)},
    {-0x1.ff7128fd391f0p-55, double_with_bits(0x3fefa4afa2a490daULL)},
    {-0x1.dae98e223747dp-55, double_with_bits(0x3fefaf482d8e67f1ULL)},
    {0x1.ec3bc41aa2008p-55, double_with_bits(0x3fefba1bee615a27ULL)},
    {0x1.42b94c3a9eb32p-55, double_with_bits(0x3fefc52b376bba97ULL)},
    {0x1.a64a931d185eep-55, double_with_bits(0x3fefd0765b6e4540ULL)},
    {-0x1.e37bae43be3edp-55, double_with_bits(0x3fefdbfdad9cbe14ULL)},
    {0x1.7893b4d91cd9dp-56, double_with_bits(0x3fefe7c1819e90d8ULL)},
    {0x1.305c14160cc89p-58, double_with_bits(0x3feff3c22b8f71f1ULL)},
};

// ---- Per-level helpers: the only place where the levels differ. ----
#if defined(CPU_CAPABILITY_AVX2)
inline VI bits_of(const VD& v) { return _mm256_castpd_si256(v); }
inline VD double_from_bits(const VI& v) { return _mm256_castsi256_pd(v); }
template <int kShift> inline VI shift_right_logical(const VI& v) { return _mm256_srli_epi64(v, kShift); }
template <int kShift> inline VI shift_left(const VI& v) { return _mm256_slli_epi64(v, kShift); }
// Table entries by row loads and a transpose, which on AMD Zen cost about half of what four-lane
// gathers (one per column) do. Each register below holds two columns of two rows, from two
// aligned 16-byte loads; unpacking two such registers lo/hi interleaves them into one column each.
inline __m256d columns_of_rows(const double* row_for_lanes_01, const double* row_for_lanes_23) {
  return _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_load_pd(row_for_lanes_01)), _mm_load_pd(row_for_lanes_23), 1);
}
struct LaneIndices {
  int64_t i0, i1, i2, i3;
};
inline LaneIndices lane_indices(const VI& index) {
  const __m128i low = _mm256_castsi256_si128(index), high = _mm256_extracti128_si256(index, 1);
  return {_mm_cvtsi128_si64(low), _mm_extract_epi64(low, 1), _mm_cvtsi128_si64(high), _mm_extract_epi64(high, 1)};
}
inline void load_log_entries(const VI& index, VD& inv_c, VD& log_c, VD& log_c_tail) {
  const LaneIndices i = lane_indices(index);
  const __m256d rows_02 = columns_of_rows(kLogTable[i.i0], kLogTable[i.i2]);  // columns 0, 1
  const __m256d rows_13 = columns_of_rows(kLogTable[i.i1], kLogTable[i.i3]);
  const __m256d tails_02 = columns_of_rows(kLogTable[i.i0] + 2, kLogTable[i.i2] + 2);  // columns 2, 3
  const __m256d tails_13 = columns_of_rows(kLogTable[i.i1] + 2, kLogTable[i.i3] + 2);
  inv_c = _mm256_unpacklo_pd(rows_02, rows_13);
  log_c = _mm256_unpackhi_pd(rows_02, rows_13);
  log_c_tail = _mm256_unpacklo_pd(tails_02, tails_13);
}
inline void load_exp_entries(const VI& index, VD& tail, VI& scale_bits) {
  const LaneIndices i = lane_indices(index);
  const __m256d rows_02 = columns_of_rows(kExpTable[i.i0], kExpTable[i.i2]);
  const __m256d rows_13 = columns_of_rows(kExpTable[i.i1], kExpTable[i.i3]);
  tail = _mm256_unpacklo_pd(rows_02, rows_13);
  scale_bits = _mm256_castpd_si256(_mm256_unpackhi_pd(rows_02, rows_13));
}
inline VD fused_multiply_add(const VD& a, const VD& b, const VD& c) { return _mm256_fmadd_pd(a, b, c); }
#else
// DEFAULT: Vectorized is an array of lanes; each helper is a loop over them.
constexpr int kLanes = VD::size();
template <typename To, typename From>
at::vec::Vectorized<To> reinterpret_lanes(const at::vec::Vectorized<From>& v) {
  __at_align__ From in[kLanes];
  __at_align__ To out[kLanes];
  v.store(in);
  std::memcpy(out, in, sizeof(in));
  return at::vec::Vectorized<To>::loadu(out);
}
inline VI bits_of(const VD& v) { return reinterpret_lanes<int64_t>(v); }
inline VD double_from_bits(const VI& v) { return reinterpret_lanes<double>(v); }
template <typename F>
VI map_bits(const VI& v, F f) {  // f on each lane's bits as uint64_t (shifts stay logical, wrap defined)
  __at_align__ int64_t lanes[kLanes];
  v.store(lanes);
  for (int i = 0; i < kLanes; ++i) lanes[i] = static_cast<int64_t>(f(static_cast<uint64_t>(lanes[i])));
  return VI::loadu(lanes);
}
template <int kShift> inline VI shift_right_logical(const VI& v) {
  return map_bits(v, [](uint64_t u) { return u >> kShift; });
}
template <int kShift> inline VI shift_left(const VI& v) {
  return map_bits(v, [](uint64_t u) { return u << kShift; });
}
inline void load_log_entries(const VI& index, VD& inv_c, VD& log_c, VD& log_c_tail) {
  __at_align__ int64_t row[kLanes];
  __at_align__ double column[3][kLanes];
  index.store(row);
  for (int i = 0; i < kLanes; ++i) {
    for (int j = 0; j < 3; ++j) column[j][i] = kLogTable[row[i]][j];
  }
  inv_c = VD::loadu(column[0]);
  log_c = VD::loadu(column[1]);
  log_c_tail = VD::loadu(column[2]);
}
inline void load_exp_entries(const VI& index, VD& tail, VI& scale_bits) {
  __at_align__ int64_t row[kLanes];
  __at_align__ double column[2][kLanes];
  index.store(row);
  for (int i = 0; i < kLanes; ++i) {
    for (int j = 0; j < 2; ++j) column[j][i] = kExpTable[row[i]][j];
  }
  tail = VD::loadu(column[0]);
  scale_bits = bits_of(VD::loadu(column[1]));
}
inline VD fused_multiply_add(const VD& a, const VD& b, const VD& c) {
  __at_align__ double la[kLanes], lb[kLanes], lc[kLanes];
  a.store(la);
  b.store(lb);
  c.store(lc);
  for (int i = 0; i < kLanes; ++i) la[i] = std::fma(la[i], lb[i], lc[i]);
  return VD::loadu(la);
}
#endif
// Integer lane sums and differences, modulo 2^64 (the vector instructions wrap; the DEFAULT loop
// works in uint64_t, as signed overflow would be undefined).
#if defined(CPU_CAPABILITY_AVX2)
inline VI add_bits(const VI& a, const VI& b) { return a + b; }
inline VI sub_bits(const VI& a, const VI& b) { return a - b; }
#else
template <typename F>
VI zip_bits(const VI& a, const VI& b, F f) {
  __at_align__ int64_t la[kLanes], lb[kLanes];
  a.store(la);
  b.store(lb);
  for (int i = 0; i < kLanes; ++i) {
    la[i] = static_cast<int64_t>(f(static_cast<uint64_t>(la[i]), static_cast<uint64_t>(lb[i])));
  }
  return VI::loadu(la);
}
inline VI add_bits(const VI& a, const VI& b) { return zip_bits(a, b, [](uint64_t u, uint64_t v) { return u + v; }); }
inline VI sub_bits(const VI& a, const VI& b) { return zip_bits(a, b, [](uint64_t u, uint64_t v) { return u - v; }); }
#endif
// Whether any lane of a comparison result (all-ones or all-zeros lanes) is set.
inline bool any_lane(const VD& mask) { return mask.zero_mask() != (1 << VD::size()) - 1; }

// ---- Constants (see the generator script at the end of the file). ----
constexpr int64_t kLogOffset = 0x3fe6955500000000LL;  // bits of 0x1.69555p-1, the bottom of z's range
constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;  // ln 2 to a multiple of 2^-42: k * kLn2Hi is exact
constexpr double kLn2Lo = 0x1.ef35793c76730p-45;
// log1p(r) = r - r^2/2 + r^3 * P(r), P's coefficients from r^0 up; |r| < 0x1.6bp-8, relative error
// of the whole below 2^-70.
constexpr double kLogPoly[7] = {0x1.5555555555555p-2, -0x1.0000000000006p-2, 0x1.99999999999a4p-3,
                                -0x1.5555555280dc1p-3, 0x1.24924921ffac4p-3, -0x1.0002d0a27ee6cp-3,
                                0x1.c7219005fed91p-4};
constexpr int kExpTableBits = 7;
constexpr double kInvLn2N = 0x1.71547652b82fep+7;  // 128 / ln 2
constexpr double kLn2HiN = 0x1.62e42fefa0000p-8;  // ln 2 / 128 in 36 bits: x - k * kLn2HiN is exact
constexpr double kLn2LoN = 0x1.cf79abc9e3b3ap-47;
// exp(r) - 1 = r + r^2 * Q(r), |r| <= ln2/256 + 2^-15, absolute error below 2^-75.
constexpr double kExpPoly[5] = {0x1.0000000000000p-1, 0x1.55555555554d8p-3, 0x1.5555555555517p-5,
                                0x1.1111150f5016fp-7, 0x1.6c16c56a55c5fp-10};
// Adding it rounds a double below 2^51 in magnitude to an integer, left in the low mantissa bits.
constexpr double kShift = 0x1.8p52;

// log x = hi + lo (|lo| far below ulp(hi)), x given as its bits ix, subnormals pre-normalized
// (ix = bits(x * 2^52) - 52 << 52, an exponent below the normal range).
inline void log_hi_lo(const VI& ix, VD& hi_out, VD& lo_out) {
  // x = 2^k z, z in [kLogOffset, 2 kLogOffset): k is tmp's top 12 bits (signed), the table index the
  // next 7 bits, z is ix with k taken off its exponent.
  const VI tmp = sub_bits(ix, VI(kLogOffset));
  const VI index = shift_right_logical<52 - 7>(tmp) & VI(127);
  // (k + 2048) sits unsigned in the top 12 bits of tmp ^ 2^63; it becomes a double through the
  // 2^52 exponent (AVX2 has no int64 -> double conversion).
  const VI k_biased = shift_right_logical<52>(tmp ^ VI(INT64_MIN));
  const VD k = double_from_bits(k_biased | VI(0x4330000000000000LL)) - VD(0x1p52 + 2048.0);
  const VD z = double_from_bits(sub_bits(ix, tmp & VI(static_cast<int64_t>(0xfffULL << 52))));

  VD inv_c, log_c, log_c_tail;
  load_log_entries(index, inv_c, log_c, log_c_tail);
  // 1/c has at most 8 significant bits and |z/c - 1| < 1/128, so r is exact.
  const VD r = fused_multiply_add(z, inv_c, VD(-1.0));
  // k ln2 + log c + r, with the rounding error of each step kept.
  const VD t1 = fused_multiply_add(k, VD(kLn2Hi), log_c);  // exact: both terms are multiples of 2^-43
  const VD t2 = t1 + r;
  const VD lo1 = fused_multiply_add(k, VD(kLn2Lo), log_c_tail);
  const VD lo2 = (t1 - t2) + r;  // |t1| >= |r| or t1 == 0: Fast2Sum
  // + -r^2/2: ar2 is its rounded value, lo3 the rounding error of that product, lo4 of the sum.
  const VD ar = VD(-0.5) * r;
  const VD ar2 = r * ar;
  const VD hi = t2 + ar2;
  const VD lo3 = fused_multiply_add(ar, r, VD(0.0) - ar2);
  const VD lo4 = (t2 - hi) + ar2;
  // + r^3 P(r): P by Estrin's scheme in r and r^2 (shorter dependency chains than Horner).
  const VD r2 = r * r;
  const VD p01 = fused_multiply_add(r, VD(kLogPoly[1]), VD(kLogPoly[0]));
  const VD p23 = fused_multiply_add(r, VD(kLogPoly[3]), VD(kLogPoly[2]));
  const VD p45 = fused_multiply_add(r, VD(kLogPoly[5]), VD(kLogPoly[4]));
  const VD p456 = fused_multiply_add(r2, VD(kLogPoly[6]), p45);
  const VD p = fused_multiply_add(r2, fused_multiply_add(r2, p456, p23), p01);
  const VD r3 = r2 * r;
  const VD lo = fused_multiply_add(r3, p, lo1 + lo2 + lo3 + lo4);
  hi_out = hi + lo;
  lo_out = (hi - hi_out) + lo;
}

// exp(x + xtail) as scale + scale * tmp, scale = 2^(k/128) with its bits as returned (valid as a
// double only while scale stays normal, |x| <= 708; the caller rescales otherwise). |xtail| is far
// below ulp(x) and |x| < 2^17.
inline void exp_scale_tmp(const VD& x, const VD& xtail, VI& scale_bits, VD& tmp) {
  // x = k ln2/128 + r, k integer (the shift leaves k in the low bits of shifted), |r| <= ln2/256.
  const VD shifted = fused_multiply_add(x, VD(kInvLn2N), VD(kShift));
  const VD k = shifted - VD(kShift);
  const VI k_bits = bits_of(shifted);
  VD r = fused_multiply_add(k, VD(-kLn2HiN), x);  // exact
  r = fused_multiply_add(k, VD(-kLn2LoN), r);
  r = r + xtail;
  // 2^(k/128) = 2^(k >> 7) * 2^((k & 127) / 128); the table's bits have (k & 127) << 45 taken off,
  // so adding k << 45 puts k >> 7 in the exponent (wrapping modulo 2^64 for negative k).
  const VI index = k_bits & VI((1 << kExpTableBits) - 1);
  VD table_tail;
  VI table_bits;
  load_exp_entries(index, table_tail, table_bits);
  scale_bits = add_bits(table_bits, shift_left<52 - kExpTableBits>(k_bits));
  // exp(r) - 1 + the table value's relative tail.
  const VD r2 = r * r;
  const VD q01 = fused_multiply_add(r, VD(kExpPoly[1]), VD(kExpPoly[0]));
  const VD q23 = fused_multiply_add(r, VD(kExpPoly[3]), VD(kExpPoly[2]));
  const VD q = fused_multiply_add(r2, fused_multiply_add(r2, VD(kExpPoly[4]), q23), q01);
  tmp = fused_multiply_add(r2, q, r + table_tail);
}

// exp(x + xtail) for lanes where 708 < |x| (the others get some finite value): +inf past
// 2^1024, the subnormal (or 0) below 2^-1022 rounded once.
inline VD exp_out_of_range(const VD& x, const VD& xtail) {
  // Beyond +-1100 every result is inf or 0; clamping keeps k's bits meaningful (a NaN lane stays
  // garbage). xtail from an infinite product would be infinite: drop it there.
  const VD limit(1100.0);
  const VD clamped = at::vec::minimum(at::vec::maximum(x, VD(0.0) - limit), limit);
  const VD tail = VD::blendv(xtail, VD(0.0), x.abs() >= limit);
  VI scale_bits;
  VD tmp;
  exp_scale_tmp(clamped, tail, scale_bits, tmp);
  // Overflow side: scale * 2^-1009 is normal; the final product by 2^1009 rounds or overflows once.
  const VD scale_up = double_from_bits(sub_bits(scale_bits, VI(1009LL << 52)));
  const VD up = fused_multiply_add(scale_up, tmp, scale_up) * VD(0x1p1009);
  // Underflow side: v = result * 2^1022. Where v < 1 the result is subnormal: v + 1 rounds v to
  // a multiple of 2^-52 (the subnormal grid after scaling) once, with v's own error term added
  // first, so the scaling by 2^-1022 afterwards is exact (ARM's specialcase, no double rounding).
  const VD scale_dn = double_from_bits(add_bits(scale_bits, VI(1022LL << 52)));
  const VD v = fused_multiply_add(scale_dn, tmp, scale_dn);
  const VD v_err = fused_multiply_add(scale_dn, tmp, scale_dn - v);  // scale - v is exact
  const VD one(1.0);
  const VD sum = one + v;
  const VD sum_err = ((one - sum) + v) + v_err;
  const VD v_rounded = (sum + sum_err) - one;
  const VD dn = VD::blendv(v, v_rounded, v < one) * VD(0x1p-1022);
  return VD::blendv(dn, up, x > VD(0.0));
}

}  // namespace pow_double_detail

// x ** y for x > 0 finite (subnormals included) and y finite, non-zero; see the top of the file.
inline at::vec::Vectorized<double> pow_double_core(const at::vec::Vectorized<double>& x,
                                                   const at::vec::Vectorized<double>& y) {
  using namespace pow_double_detail;
  // Subnormal x: scaled by 2^52 into the normal range, its exponent field then lowered by 52 (into
  // the sign bit's territory: log_hi_lo reads k as a signed 12-bit field).
  const VD subnormal = x < VD(0x1p-1022);
  const VD normalized = double_from_bits(sub_bits(bits_of(x * VD(0x1p52)), VI(52LL << 52)));
  const VI ix = bits_of(VD::blendv(x, normalized, subnormal));
  VD log_hi, log_lo;
  log_hi_lo(ix, log_hi, log_lo);
  // y log x = ehi + elo: the product's rounding error by an fma, plus y times log's low part.
  const VD ehi = y * log_hi;
  const VD elo = fused_multiply_add(y, log_lo, fused_multiply_add(y, log_hi, VD(0.0) - ehi));
  VI scale_bits;
  VD tmp;
  exp_scale_tmp(ehi, elo, scale_bits, tmp);
  const VD scale = double_from_bits(scale_bits);
  VD result = fused_multiply_add(scale, tmp, scale);
  // |ehi| <= 708 keeps 2^(k/128) and the result normal; the rest (rare) are rescaled.
  const VD out_of_range = ehi.abs() > VD(708.0);
  if (any_lane(out_of_range)) result = VD::blendv(result, exp_out_of_range(ehi, elo), out_of_range);
  return result;
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
#endif  // CPU_CAPABILITY_AVX512

// ---- Generator of the tables and coefficients above (Python 3 with mpmath) ----
/*
# Generates the tables (into tables.inc) and prints the constants of csrc/kernels/pow_double.h:
#   python gen_tables.py. Method after ARM optimized-routines pow (pow_log_data.c, exp_data.c); own fits.
import mpmath as mp, struct
mp.mp.prec = 300
def asdouble(u): return struct.unpack('<d', struct.pack('<Q', u & (2**64-1)))[0]
def asu64(d): return struct.unpack('<Q', struct.pack('<d', d))[0]
def hexf(d): return float(d).hex()
N_LOG, OFF = 128, 0x3fe6955500000000
LN2 = mp.log(2)
ln2hi = float(mp.nint(LN2 * 2**42) / 2**42)
ln2lo = float(LN2 - ln2hi)
print("// ln2hi", hexf(ln2hi), "ln2lo", hexf(ln2lo))
rows = []
for i in range(N_LOG):
    zlo = mp.mpf(asdouble(OFF + (i << 45))); zhi = mp.mpf(asdouble(OFF + ((i + 1) << 45)))
    center = (zlo + zhi) / 2
    invc = mp.nint(N_LOG / center) / N_LOG if center < 1 else mp.nint(2 * N_LOG / center) / (2 * N_LOG)
    invc = float(invc)
    logc_exact = -mp.log(mp.mpf(invc))
    logc = float(mp.nint(logc_exact * 2**43) / 2**43)
    logctail = float(logc_exact - logc)
    # check |z/c - 1| < 1/N on the interval
    for z in (zlo, zhi):
        assert abs(z * invc - 1) < mp.mpf(1) / N_LOG, (i, z)
    rows.append((invc, logc, logctail))
print("LOG_INVC", ", ".join(hexf(r[0]) for r in rows))
print("LOG_LOGC", ", ".join(hexf(r[1]) for r in rows))
print("LOG_TAIL", ", ".join(hexf(r[2]) for r in rows))
N_EXP = 128
tails, sbits = [], []
for i in range(N_EXP):
    v = mp.mpf(2) ** (mp.mpf(i) / N_EXP)
    hi = float(v)
    tails.append(float((v - hi) / hi))
    sbits.append(asu64(hi) - (i << 45))
print("EXP_TAIL", ", ".join(hexf(t) for t in tails))
print("EXP_SBITS", ", ".join("0x%016xULL" % s for s in sbits))
ln2n = LN2 / N_EXP
hiN = float(mp.nint(ln2n * 2**44) / 2**44)
print("// invln2N", hexf(float(N_EXP / LN2)), "ln2hiN", hexf(hiN), "ln2loN", hexf(float(ln2n - hiN)))

def cheb_fit(f, deg, a):
    # interpolate f at deg+1 Chebyshev nodes on [-a, a] (near-minimax), then report max error
    nodes = [a * mp.cos(mp.pi * (2 * j + 1) / (2 * (deg + 1))) for j in range(deg + 1)]
    A = mp.matrix([[x**k for k in range(deg + 1)] for x in nodes])
    c = mp.lu_solve(A, mp.matrix([f(x) for x in nodes]))
    return [c[k] for k in range(deg + 1)]
# log1p(r) = r - r^2/2 + r^3 * P(r), |r| <= 0x1.6bp-8 (largest |z/c-1| over the table)
a_log = mp.mpf(float.fromhex('0x1.6bp-8'))
f_log = lambda r: (mp.log1p(r) - r + r * r / 2) / r**3 if abs(r) > 1e-30 else mp.mpf(1) / 3 - r / 4
cl = cheb_fit(f_log, 6, a_log); cl = [float(c) for c in cl]
err = max(abs((r - r*r/2 + r**3 * sum(mp.mpf(c) * r**k for k, c in enumerate(cl))) - mp.log1p(r)) / abs(mp.log1p(r))
          for r in [a_log * (mp.mpf(j) / 500 - 1) for j in range(1001) if j != 500])
print("LOG_POLY", ", ".join(hexf(c) for c in cl), "// rel err 2^%.1f" % float(mp.log(err, 2)))
# exp(r) - 1 = r + r^2 * Q(r), |r| <= ln2/256 + small tail
a_exp = LN2 / 256 + mp.mpf(2)**-15
f_exp = lambda r: (mp.exp(r) - 1 - r) / r**2 if abs(r) > 1e-30 else mp.mpf(1) / 2 + r / 6
ce = cheb_fit(f_exp, 4, a_exp); ce = [float(c) for c in ce]
err = max(abs((r + r*r * sum(mp.mpf(c) * r**k for k, c in enumerate(ce))) - (mp.exp(r) - 1))
          for r in [a_exp * (mp.mpf(j) / 500 - 1) for j in range(1001)])
print("EXP_POLY", ", ".join(hexf(c) for c in ce), "// abs err 2^%.1f" % float(mp.log(err, 2)))

def rows_array(name, rows, width, align):
    body = "\n".join("    {" + ", ".join(rows[j]) + "}," for j in range(len(rows)))
    return "alignas(%d) static constexpr double %s[%d][%d] = {\n%s\n};" % (align, name, len(rows), width, body)
with open("tables.inc", "w") as f:
    f.write(rows_array("kLogTable", [[hexf(r[0]), hexf(r[1]), hexf(r[2]), "0.0"] for r in rows], 4, 32) + "\n")
    f.write(rows_array("kExpTable", [[hexf(t), "double_with_bits(0x%016xULL)" % s] for t, s in zip(tails, sbits)], 2, 16) + "\n")
*/
