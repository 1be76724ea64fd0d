// The wide-kernel path: conv2d whose kernel rows are long (weight.dim[3] >= 2 vectors, dilation[1]
// == 1) and whose outputs are few per row, the shape of a weight gradient (autograd computes it as
// a conv2d whose "kernel" is the output gradient, e.g. 56x56, and whose output is the 3x3 kernel).
//
// There the chassis would gather a handful of positions per tap; here the vectors run along the
// kernel row instead: lane l of an output's accumulator sums the taps kw = l (mod L) over
// (ci, kh, kw) in order, one fused chain per lane, and the lanes are added in order at the end,
// after the bias. L = 64 bytes of lanes (16 floats, 8 doubles) at every ISA level (two AVX2
// vectors, one AVX-512 vector), so the order depends on the geometry only: not on the level, the
// thread count or the split (threads own whole outputs).
#pragma once

#include "kernel_common.h"

namespace fuel {
namespace CPU_CAPABILITY {

// Lanes per accumulator group: 64 bytes, whatever the ISA level's vector width.
template <typename acc_t>
constexpr int64_t kWideLanes = 64 / static_cast<int64_t>(sizeof(acc_t));

template <typename acc_t>
inline bool is_wide_kernel(const Problem& p) {
  return !p.transpose && p.Kw >= kWideLanes<acc_t> && p.dilation[1] == 1 && p.Wo <= 16;
}

namespace wide_detail {

template <typename acc_t>
constexpr int kVectors = static_cast<int>(kWideLanes<acc_t> / Vectorized<acc_t>::size());  // vectors per group
template <typename acc_t>
constexpr int kRows = kVectors<acc_t> == 1 ? 4 : 2;  // output channels per register block
constexpr int kColumns = 3;                          // output columns per register block

// part[c][q] += sum over the kernel rows (each padded to whole lane groups) of w rows times the
// input runs starting at line offsets q * sw; the last group of each row masks the input lanes past
// the kernel (their weights are zero, but the input there is real and may be inf or NaN).
template <typename acc_t, int CB, int PB>
inline void block(const acc_t* w, int64_t ldw, const acc_t* lines, int64_t n_rows, int64_t row_len, int64_t line_len,
                  int64_t sw, int64_t tail, acc_t* part, int64_t ldp) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size(), L = kWideLanes<acc_t>;
  constexpr int NV = kVectors<acc_t>;
  Vec mask[NV];
  for (int v = 0; v < NV; ++v) mask[v] = Vec::arange(acc_t(v * V), acc_t(1)) < Vec(static_cast<acc_t>(tail));
  Vec acc[CB][PB][NV];
  for (int c = 0; c < CB; ++c) {
    for (int q = 0; q < PB; ++q) {
      for (int v = 0; v < NV; ++v) acc[c][q][v] = Vec::loadu(part + c * ldp + q * L + v * V);
    }
  }
  const int64_t full = tail == L ? row_len : row_len - L;
  for (int64_t r = 0; r < n_rows; ++r) {
    const acc_t* line = lines + r * line_len;
    const acc_t* wr = w + r * row_len;
    for (int64_t k = 0; k < row_len; k += L) {
      const bool masked = k == full;
      for (int v = 0; v < NV; ++v) {
        Vec xv[PB];
        for (int q = 0; q < PB; ++q) {
          xv[q] = Vec::loadu(line + q * sw + k + v * V);
          if (masked) xv[q] = Vec::blendv(Vec(acc_t(0)), xv[q], mask[v]);
        }
        for (int c = 0; c < CB; ++c) {
          const Vec wv = Vec::loadu(wr + c * ldw + k + v * V);
          for (int q = 0; q < PB; ++q) acc[c][q][v] = at::vec::fmadd(wv, xv[q], acc[c][q][v]);
        }
      }
    }
  }
  for (int c = 0; c < CB; ++c) {
    for (int q = 0; q < PB; ++q) {
      for (int v = 0; v < NV; ++v) acc[c][q][v].store(part + c * ldp + q * L + v * V);
    }
  }
}

template <typename acc_t, int CB>
inline void row_of_columns(const acc_t* w, int64_t ldw, const acc_t* lines, int64_t n_rows, int64_t row_len,
                           int64_t line_len, int64_t sw, int64_t tail, acc_t* part, int64_t ldp, int64_t Wo) {
  constexpr int64_t L = kWideLanes<acc_t>;
  int64_t q = 0;
  for (; q + kColumns <= Wo; q += kColumns) {
    block<acc_t, CB, kColumns>(w, ldw, lines + q * sw, n_rows, row_len, line_len, sw, tail, part + q * L, ldp);
  }
  for (; q < Wo; ++q) block<acc_t, CB, 1>(w, ldw, lines + q * sw, n_rows, row_len, line_len, sw, tail, part + q * L, ldp);
}

// Input row ih of a plane, zero-padded into a line of line_len elements (zero outside x).
template <typename scalar_t, typename acc_t>
inline void stage_line(const Problem& p, const scalar_t* plane, const Layout& xl, int64_t ih, acc_t* line,
                       int64_t line_len) {
  if (ih < 0 || ih >= p.H) {
    zero(line, line_len);
    return;
  }
  const int64_t lo = std::clamp<int64_t>(p.padding[1], 0, line_len);
  const int64_t hi = std::clamp<int64_t>(p.padding[1] + p.W, lo, line_len);
  zero(line, lo);
  if (xl.w == 1) {
    widen<scalar_t>(plane + ih * xl.h + lo - p.padding[1], line + lo, hi - lo);
  } else {
    for (int64_t j = lo; j < hi; ++j) line[j] = static_cast<acc_t>(plane[ih * xl.h + (j - p.padding[1]) * xl.w]);
  }
  zero(line + hi, line_len - hi);
}

// An output's lanes added in order after its bias, rounded once to scalar_t.
template <typename scalar_t, typename acc_t>
inline scalar_t lanes_total(const acc_t* lanes, const scalar_t* bias, int64_t co) {
  acc_t total = bias ? static_cast<acc_t>(bias[co]) : acc_t(0);
  for (int64_t l = 0; l < kWideLanes<acc_t>; ++l) total += lanes[l];
  return static_cast<scalar_t>(total);
}

// Output rows of one column (a 1x1 conv's weight gradient: one column, one row): the register block
// takes kColumns images where it takes columns elsewhere, the images' lines staged kImageRows kernel
// rows at a time, so that a task's weight rows are read once per image block, not once per image (a
// float64 128 -> 128 1x1 over 4x56x56 streamed 7 MB of them per image: about 80 ms at 1 thread on a
// Zen 3, now 20-25, torch 12-13). The images' lines of a row chunk stay in L2 while every output channel of
// the task reads them. Each lane's chain keeps its order, (ci, kh, kw): the chunks run in kh order
// within each ci, the lanes kept in part between them.
constexpr int64_t kImageBlock = 24;  // images per task
constexpr int64_t kImageRows = 8;    // kernel rows staged at a time

template <typename scalar_t>
void convolve_wide_kernel_one_column(const Problem& p, const scalar_t* x, const Layout& xl,
                                     const acc_type<scalar_t>* w_rows, const scalar_t* bias, scalar_t* out,
                                     const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  constexpr int64_t L = kWideLanes<acc_t>;
  constexpr int kRowBlock = kRows<acc_t>;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const int64_t row_len = (p.Kw + L - 1) / L * L, tail = p.Kw - (row_len - L);
  const int64_t co_chunk = std::min<int64_t>(Cout_g, 64), co_chunks = (Cout_g + co_chunk - 1) / co_chunk;
  const int64_t image_blocks = (p.N + kImageBlock - 1) / kImageBlock;
  const int64_t tasks = image_blocks * G * p.Ho * co_chunks, ldw = Cin_g * p.Kh * row_len, ldp = kImageBlock * L;
  at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    const auto lines = scratch<acc_t>(kImageBlock * kImageRows * row_len), part = scratch<acc_t>(co_chunk * ldp);
    for (int64_t task = first; task < last; ++task) {
      const int64_t chunk = task % co_chunks, oh = task / co_chunks % p.Ho, g = task / co_chunks / p.Ho % G;
      const int64_t n0 = task / co_chunks / p.Ho / G * kImageBlock, images = std::min(kImageBlock, p.N - n0);
      const int64_t co0 = g * Cout_g + chunk * co_chunk, rows = std::min(co_chunk, (g + 1) * Cout_g - co0);
      zero(part.get(), co_chunk * ldp);
      for (int64_t ci = 0; ci < Cin_g; ++ci) {
        for (int64_t kh0 = 0; kh0 < p.Kh; kh0 += kImageRows) {
          const int64_t n_rows = std::min(kImageRows, p.Kh - kh0), image_len = n_rows * row_len;
          for (int64_t j = 0; j < images; ++j) {
            const scalar_t* plane = x + (n0 + j) * xl.n + (g * Cin_g + ci) * xl.c;
            for (int64_t r = 0; r < n_rows; ++r) {
              const int64_t ih = oh * p.stride[0] + (kh0 + r) * p.dilation[0] - p.padding[0];
              stage_line(p, plane, xl, ih, lines.get() + j * image_len + r * row_len, row_len);
            }
          }
          const acc_t* w = w_rows + co0 * ldw + (ci * p.Kh + kh0) * row_len;
          // Images outer: their lines (kColumns of them) stay in L1 while the weight rows stream from L2.
          const auto images_of = [&](auto fixed, int64_t j) {
            constexpr int PB = decltype(fixed)::value;
            const acc_t* image_lines = lines.get() + j * image_len;
            int64_t c = 0;
            for (; c + kRowBlock <= rows; c += kRowBlock) {
              block<acc_t, kRowBlock, PB>(w + c * ldw, ldw, image_lines, n_rows, row_len, row_len, image_len, tail,
                                         part.get() + c * ldp + j * L, ldp);
            }
            for (; c < rows; ++c) {
              block<acc_t, 1, PB>(w + c * ldw, ldw, image_lines, n_rows, row_len, row_len, image_len, tail,
                                  part.get() + c * ldp + j * L, ldp);
            }
          };
          int64_t j = 0;
          for (; j + kColumns <= images; j += kColumns) images_of(std::integral_constant<int, kColumns>{}, j);
          for (; j < images; ++j) images_of(std::integral_constant<int, 1>{}, j);
        }
      }
      for (int64_t c = 0; c < rows; ++c) {
        for (int64_t j = 0; j < images; ++j) {
          out[(n0 + j) * ol.n + (co0 + c) * ol.c + oh * ol.h] = lanes_total(part.get() + c * ldp + j * L, bias, co0 + c);
        }
      }
    }
  });
}

}  // namespace wide_detail

// w_rows: the weights as acc_t rows [Cout][Cin / groups][Kh][row_len], row_len = Kw rounded up to
// whole vectors, zero-padded.
template <typename scalar_t>
void convolve_wide_kernel(const Problem& p, const scalar_t* x, const Layout& xl, const acc_type<scalar_t>* w_rows,
                          const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using namespace wide_detail;
  if (p.Wo == 1) return convolve_wide_kernel_one_column(p, x, xl, w_rows, bias, out, ol);
  using acc_t = acc_type<scalar_t>;
  constexpr int64_t V = kWideLanes<acc_t>;  // the lane group: the unit of rows, parts and the final sum
  constexpr int kRowBlock = kRows<acc_t>;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const int64_t row_len = (p.Kw + V - 1) / V * V, tail = p.Kw - (row_len - V);
  const int64_t sw = p.stride[1], line_len = (p.Wo - 1) * sw + row_len;
  const int64_t co_chunk = std::min<int64_t>(Cout_g, 64), co_chunks = (Cout_g + co_chunk - 1) / co_chunk;
  const int64_t tasks = p.N * G * p.Ho * co_chunks;
  const int64_t ldw = Cin_g * p.Kh * row_len;
  const int64_t work = std::max<int64_t>(1, co_chunk * p.Wo * ldw);
  at::parallel_for(0, tasks, std::max<int64_t>(1, (1 << 16) / work), [&](int64_t first, int64_t last) {
    const auto lines = scratch<acc_t>(p.Kh * line_len), part = scratch<acc_t>(co_chunk * p.Wo * V);
    for (int64_t task = first; task < last; ++task) {
      const int64_t chunk = task % co_chunks, oh = task / co_chunks % p.Ho, g = task / co_chunks / p.Ho % G;
      const int64_t n = task / co_chunks / p.Ho / G;
      const int64_t co0 = g * Cout_g + chunk * co_chunk, rows = std::min(co_chunk, (g + 1) * Cout_g - co0);
      zero(part.get(), co_chunk * p.Wo * V);
      for (int64_t ci = 0; ci < Cin_g; ++ci) {
        // The input rows this output row reads, one per kernel row, zero-padded.
        const scalar_t* plane = x + n * xl.n + (g * Cin_g + ci) * xl.c;
        for (int64_t kh = 0; kh < p.Kh; ++kh) {
          const int64_t ih = oh * p.stride[0] + kh * p.dilation[0] - p.padding[0];
          stage_line(p, plane, xl, ih, lines.get() + kh * line_len, line_len);
        }
        const acc_t* w = w_rows + co0 * ldw + ci * p.Kh * row_len;
        const int64_t ldp = p.Wo * V;
        int64_t c = 0;
        for (; c + kRowBlock <= rows; c += kRowBlock) {
          row_of_columns<acc_t, kRowBlock>(w + c * ldw, ldw, lines.get(), p.Kh, row_len, line_len, sw, tail,
                                       part.get() + c * ldp, ldp, p.Wo);
        }
        for (; c < rows; ++c) {
          row_of_columns<acc_t, 1>(w + c * ldw, ldw, lines.get(), p.Kh, row_len, line_len, sw, tail,
                                   part.get() + c * ldp, ldp, p.Wo);
        }
      }
      for (int64_t c = 0; c < rows; ++c) {
        scalar_t* row = out + n * ol.n + (co0 + c) * ol.c + oh * ol.h;
        for (int64_t q = 0; q < p.Wo; ++q) row[q * ol.w] = lanes_total(part.get() + (c * p.Wo + q) * V, bias, co0 + c);
      }
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
