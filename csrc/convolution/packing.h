// Weight packing: the weights as accumulator-type rows in the order the kernels read them.
//
// Chassis: W[g][phase] holds the Cout / g x taps matrix W[co][t], t = (ci, kh, kw) over the taps that
// reach the phase in order, laid out as the micro-kernel reads it (packed_weight_index).
// Wide-kernel path: W[co][ci][kh][row], each kernel row padded with zeros to whole vectors.
// Either reads the weight tensor through its strides (contiguous or channels_last).
#pragma once

#include "axes.h"
#include "kernel_common.h"
#include "micro_kernel.h"
#include "tiles.h"

namespace fuel {
namespace CPU_CAPABILITY {

// Offsets of each phase's block inside one group's packed weights.
inline std::vector<int64_t> phase_offsets(const Problem& p, const Axis& ax_h, const Axis& ax_w) {
  const int64_t Cin_g = p.Cin / p.groups, Cout_g = p.Cout / p.groups;
  std::vector<int64_t> offsets;
  int64_t base = 0;
  for (const Phase& ph : ax_h.phases) {
    for (const Phase& pw : ax_w.phases) {
      offsets.push_back(base);
      base += Cout_g * Cin_g * static_cast<int64_t>(ph.taps.size() * pw.taps.size());
    }
  }
  return offsets;
}

// ws: the weight tensor's element strides. conv2d weights are [Cout, Cin / g, Kh, Kw],
// conv_transpose2d weights [Cin, Cout / g, Kh, Kw].
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void pack_chassis_weights(const Problem& p, const Axis& ax_h, const Axis& ax_w, const std::vector<int64_t>& offsets,
                          const scalar_t* w, const int64_t* ws, acc_t* packed) {
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const int64_t n_ph = static_cast<int64_t>(ax_h.phases.size()), n_pw = static_cast<int64_t>(ax_w.phases.size());
  const int64_t group_size = Cout_g * Cin_g * p.Kh * p.Kw;
  // Threads only for weights worth it: waking them costs more than packing a small kernel.
  const int64_t per_item = std::max<int64_t>(1, group_size / (n_ph * n_pw));
  at::parallel_for(0, G * n_ph * n_pw, std::max<int64_t>(1, (1 << 16) / per_item), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item / (n_ph * n_pw), i = item / n_pw % n_ph, j = item % n_pw;
      const auto &th = ax_h.phases[i].taps, &tw = ax_w.phases[j].taps;
      acc_t* dst = packed + g * group_size + offsets[i * n_pw + j];
      const int64_t taps = Cin_g * static_cast<int64_t>(th.size() * tw.size());
      // Where tap t of a row lies in the weight tensor, from the row's first element.
      std::vector<int64_t> tap_offsets;
      tap_offsets.reserve(taps);
      for (int64_t ci = 0; ci < Cin_g; ++ci) {
        for (const Tap& a : th) {
          for (const Tap& b : tw) tap_offsets.push_back((p.transpose ? ci * ws[0] : ci * ws[1]) + a.k * ws[2] + b.k * ws[3]);
        }
      }
      // Block by block (packed_weight_index: a block's rows tap-major), each written front to back:
      // row by row, every row's taps `rows` apart, each block's lines were written once per row (a
      // 6-row block of a float64 512 -> 512 3x3, 221 KiB, six times over).
      for (int64_t co0 = 0; co0 < Cout_g;) {
        const int64_t rows = packed_weight_index(co0, 1, Cout_g, taps) - packed_weight_index(co0, 0, Cout_g, taps);
        TORCH_INTERNAL_ASSERT(rows >= 1 && rows <= kChannelBlock);  // no message arguments: compiled per level
        const scalar_t* src[kChannelBlock];
        for (int64_t c = 0; c < rows; ++c) {
          src[c] = w + (p.transpose ? g * Cin_g * ws[0] + (co0 + c) * ws[1] : (g * Cout_g + co0 + c) * ws[0]);
        }
        acc_t* block = dst + packed_weight_index(co0, 0, Cout_g, taps);
        for (int64_t t = 0; t < taps; ++t) {
          for (int64_t c = 0; c < rows; ++c) block[t * rows + c] = static_cast<acc_t>(src[c][tap_offsets[t]]);
        }
        co0 += rows;
      }
    }
  });
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
template <typename T>
inline constexpr bool kTurnTiles = std::is_same_v<T, float>;
template <typename T>
inline void turn_tile(const T* src, int64_t lds, T* dst, int64_t ldd) {
  transpose_tile<T, T>(src, lds, dst, ldd);
}
#else
template <typename T>
inline constexpr bool kTurnTiles = false;
template <typename T>
inline void turn_tile(const T*, int64_t, T*, int64_t) {}
#endif

// One past the weight's last element (its strides positive: the contract's layout rule).
template <typename T>
const T* weight_end(const Problem& p, const T* w, const int64_t* ws) {
  const int64_t d0 = p.transpose ? p.Cin : p.Cout, d1 = (p.transpose ? p.Cout : p.Cin) / p.groups;
  return w + (d0 - 1) * ws[0] + (d1 - 1) * ws[1] + (p.Kh - 1) * ws[2] + (p.Kw - 1) * ws[3] + 1;
}

// Elements [i0, i1) of one matrix row for every tap, where each element's taps lie side by side
// (element i's tap t at row[i * along_row + tap_offsets[t]], every offset below 16): the 16-float
// windows of 16 elements turned round in registers, each tap's 16 values then one row of the
// result; element by element where a window would read past the weight's last element.
// dst_of_tap(t, i): where the row's element i of tap t goes, the next ones after it.
template <typename T, typename Destination>
void copy_tap_windows(const T* row, int64_t along_row, int64_t i0, int64_t i1, const std::vector<int64_t>& tap_offsets,
                      const T* w_end, Destination&& dst_of_tap) {
  for (int64_t c0 = i0; c0 < i1; c0 += 16) {
    const T* window = row + c0 * along_row;
    const int64_t count = std::min<int64_t>(16, i1 - c0);
    alignas(64) T turned[16 * 16];  // turned[o * 16 + i]: element c0 + i's float o
    const bool whole = count == 16 && window + 15 * along_row + 16 <= w_end;
    if (whole) turn_tile(window, along_row, turned, 16);
    for (int64_t t = 0; t < static_cast<int64_t>(tap_offsets.size()); ++t) {
      T* dst = dst_of_tap(t, c0);
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = whole ? turned[tap_offsets[t] * 16 + i] : window[i * along_row + tap_offsets[t]];
      }
    }
  }
}

// A 16 x 16 tile of every tap's matrix where each element's taps lie side by side and the tile's
// rows lie close (element (r, i)'s tap t at src[i * along_row + r * down_rows + tap_offsets[t]],
// every offset below 16: a conv_transpose2d's NCHW weight as A, the forward weight read down its
// input channels): each column's 16 windows turned round in registers, then each tap's 16 x 16
// turned again into its rows. dst_of_tap(t): where the tile's first row goes, its rows ldd apart.
template <typename T, typename Destination>
void turn_tap_columns(const T* src, int64_t along_row, int64_t down_rows, const std::vector<int64_t>& tap_offsets,
                      int64_t ldd, Destination&& dst_of_tap) {
  alignas(64) T turned[16 * 16 * 16];  // turned[(i * 16 + o) * 16 + r]: element (r, i)'s float o
  for (int64_t i = 0; i < 16; ++i) turn_tile(src + i * along_row, down_rows, turned + i * 256, 16);
  for (int64_t t = 0; t < static_cast<int64_t>(tap_offsets.size()); ++t) {
    turn_tile(turned + tap_offsets[t] * 16, 256, dst_of_tap(t), ldd);
  }
}

// Elements [j0, j1) (16 at most) of one matrix row for every tap, where each element's taps lie in
// one window (element i's tap t at row[i * along_row + tap_offsets[t]]), tap after tap: each tap's
// values are one line of the result, read from the elements' windows (a few KB, in L1). Runs of 16
// taps one element apart are turned round in registers as a 16 x 16 tile where the result's rows
// for them lie evenly apart; the rest go element by element. dst_of_tap(t): where the row's
// element j0 of tap t goes, element i at (i - j0) * i_step after it.
template <typename T, typename Destination>
void copy_windows_taps(const T* row, int64_t along_row, int64_t j0, int64_t j1, const std::vector<int64_t>& tap_offsets,
                       int64_t i_step, const T* w_end, Destination&& dst_of_tap) {
  const int64_t taps = static_cast<int64_t>(tap_offsets.size());
  for (int64_t t = 0; t < taps;) {
    T* dst = dst_of_tap(t);
    if (kTurnTiles<T> && i_step == 1 && j1 - j0 == 16 && t + 16 <= taps &&
        tap_offsets[t + 15] - tap_offsets[t] == 15 &&
        row + (j1 - 1) * along_row + tap_offsets[t] + 16 <= w_end) {
      bool runs_on = true;
      const int64_t ldd = dst_of_tap(t + 1) - dst;
      for (int64_t k = 1; k < 16; ++k) {
        runs_on = runs_on && tap_offsets[t + k] == tap_offsets[t] + k && dst_of_tap(t + k) - dst == k * ldd;
      }
      if (runs_on) {
        turn_tile(row + j0 * along_row + tap_offsets[t], along_row, dst, ldd);
        t += 16;
        continue;
      }
    }
    for (int64_t i = j0; i < j1; ++i) dst[(i - j0) * i_step] = row[i * along_row + tap_offsets[t]];
    ++t;
  }
}

// How pack_tap_matrices copies one weight: its strides along a matrix row and down its rows, the
// tiles a thread's share is cut into, and which of the turned copies below serve it.
struct PackRoute {
  int64_t rows = 0, row_length = 0, along_row = 0, down_rows = 0;
  int64_t tile_rows = 0, tile_length = 0, share_rows = 0, share_length = 0;
  bool turn_tiles = false, turn_windows = false, turn_columns = false, windows_first = false;
};

template <typename T>
PackRoute pack_route(const Problem& p, const std::vector<int64_t>& tap_offsets, bool rows_are_outputs, int64_t i_step,
                     int64_t panel, const int64_t* ws) {
  PackRoute rt;
  const int64_t Cin_g = p.Cin / p.groups, Cout_g = p.Cout / p.groups;
  const int64_t taps = static_cast<int64_t>(tap_offsets.size());
  rt.rows = rows_are_outputs ? Cout_g : Cin_g, rt.row_length = rows_are_outputs ? Cin_g : Cout_g;
  // conv2d's weight is [Cout][Cin_g], conv_transpose2d's [Cin][Cout_g] (weight_offset, kernel_common.h).
  const int64_t ci_stride = p.transpose ? ws[0] : ws[1], co_stride = p.transpose ? ws[1] : ws[0];
  rt.along_row = rows_are_outputs ? ci_stride : co_stride;
  rt.down_rows = rows_are_outputs ? co_stride : ci_stride;
  const bool row_close = std::abs(rt.along_row) <= 16;
  bool taps_close = true;
  int64_t tap_low = 0, tap_high = 0;
  for (int64_t offset : tap_offsets) {
    taps_close = taps_close && offset >= 0 && offset < 16;
    tap_low = std::min(tap_low, offset), tap_high = std::max(tap_high, offset);
  }
  // Rows far apart whose elements each hold their taps in one window wider than a vector (an NCHW
  // 5x5 or 7x7 weight, its 25 or 49 taps side by side): row by row, 16 elements at a time
  // (copy_windows_taps). In 16 x 16 tiles tap after tap, each tap's pass read a line for every
  // element, and an NCHW 7x7 192 -> 192 on 17x17 spent a quarter of its time packing (Zen 3, 1
  // thread).
  rt.windows_first = !row_close && !taps_close && taps > 1 && tap_high - tap_low < std::abs(rt.along_row) &&
                     rt.down_rows != 1;
  // A thread's share: 8 whole rows where a row lies close (or goes by windows), else 16 columns of
  // every row, so that the weight is read as a few runs that each move forward.
  const bool by_rows = row_close || rt.windows_first;
  rt.tile_rows = by_rows ? 8 : 16, rt.tile_length = std::min(panel, by_rows ? rt.row_length : 16);
  rt.share_rows = by_rows ? rt.tile_rows : rt.rows, rt.share_length = by_rows ? rt.row_length : rt.tile_length;
  // Far-apart rows of float whose elements run down the rows (a 1x1 weight as [ci][co], a
  // channels_last one): a whole tile's 16 rows of 16 loaded as vectors and turned round in
  // registers (tiles.h). Element by element every load missed L1 (16 lines 8 KiB apart share one
  // set), and the packing took more than half of a channels_last 1x1 2048 -> 512 call on 7x7 (Zen 3,
  // 1 thread: 1.9-2.15 -> 1.09 of torch's time).
  rt.turn_tiles = kTurnTiles<T> && !row_close && rt.down_rows == 1 && i_step == 1;
  // Rows whose elements each hold every tap side by side (an NCHW weight [co][ci][kh][kw] as A):
  // copy_tap_windows. Element by element the packing took about a quarter of an NCHW 3x3/2 256 ->
  // 512 call on 14x14 (1.41-1.49 -> 1.28-1.30 of torch's time).
  rt.turn_windows = kTurnTiles<T> && taps_close && row_close && rt.along_row > 1 && i_step == 1;
  // Their columns, where the rows lie close instead (a conv_transpose2d's NCHW weight as A, the
  // input gradient of a conv2d): turn_tap_columns. Element by element the packing took more than a
  // quarter of a 3x3 512 -> 512 conv_transpose2d on 14x14.
  rt.turn_columns =
      kTurnTiles<T> && taps_close && !row_close && rt.down_rows > 1 && rt.down_rows <= 16 && i_step == 1;
  return rt;
}

// The brgemm paths' weights: per group, one matrix per spatial tap (tap_offsets: where each tap
// lies in the weight, in the order the matrices go), copied as they are. A matrix row is an output
// channel's input channels (rows_are_outputs) or an input channel's output channels; dst(g, t, r, i)
// is where element i of row r of group g's matrix t goes, the row's next elements i_step apart up
// to the next multiple of `panel` (a row's elements in column panels: float_brgemm.h). Copied a tile
// at a time, every tap of the tile in turn, so that the weight lines a tile reads stay in L1: where
// a row's elements lie close in the weight (an NCHW weight's input channels, 9 floats apart in a
// 3x3), tiles of 8 rows; elsewhere (a whole weight row apart) 16 x 16 elements. One tap matrix after
// another over a large weight fetched a line for every element read: float32 3x3 512 -> 512 on
// 14x14 at 1 thread on a Zen 3, the packing 16-18% of the call before, 10% after. The row blocks
// are shared among the threads where the weight is large enough to pay for waking them.
template <typename T, typename Destination>
void pack_tap_matrices(const Problem& p, const std::vector<int64_t>& tap_offsets, bool rows_are_outputs,
                       int64_t i_step, int64_t panel, const T* w, const int64_t* ws, Destination&& dst_of) {
  const PackRoute rt = pack_route<T>(p, tap_offsets, rows_are_outputs, i_step, panel, ws);
  const int64_t taps = static_cast<int64_t>(tap_offsets.size());
  const int64_t rows = rt.rows, row_length = rt.row_length, along_row = rt.along_row, down_rows = rt.down_rows;
  const int64_t tile_rows = rt.tile_rows, tile_length = rt.tile_length;
  const int64_t row_shares = (rows + rt.share_rows - 1) / rt.share_rows;
  const int64_t column_shares = (row_length + rt.share_length - 1) / rt.share_length;
  const int64_t per_share = std::max<int64_t>(1, rt.share_rows * rt.share_length * taps);
  const T* const w_end = weight_end(p, w, ws);
  at::parallel_for(0, p.groups * row_shares * column_shares, std::max<int64_t>(1, (1 << 16) / per_share),
                   [&](int64_t first, int64_t last) {
    for (int64_t share = first; share < last; ++share) {
      const int64_t g = share / (row_shares * column_shares);
      const int64_t row_lo = share / column_shares % row_shares * rt.share_rows;
      const int64_t row_hi = std::min(rows, row_lo + rt.share_rows);
      const int64_t i_lo = share % column_shares * rt.share_length, i_hi = std::min(row_length, i_lo + rt.share_length);
      const T* group = w + weight_offset(p, ws, g, 0, 0);
      for (int64_t r0 = row_lo; r0 < row_hi; r0 += tile_rows) {
        const int64_t r1 = std::min(row_hi, r0 + tile_rows);
        for (int64_t i0 = i_lo; i0 < i_hi; i0 += tile_length) {
          const int64_t i1 = std::min(i_hi, i0 + tile_length);
          if (rt.turn_tiles && r1 - r0 == 16 && i1 - i0 == 16) {
            for (int64_t t = 0; t < taps; ++t) {
              T* dst = dst_of(g, t, r0, i0);
              turn_tile(group + tap_offsets[t] + r0 + i0 * along_row, along_row, dst, dst_of(g, t, r0 + 1, i0) - dst);
            }
            continue;
          }
          if (rt.turn_columns && r1 - r0 == 16 && i1 - i0 == 16) {
            const T* src = group + i0 * along_row + r0 * down_rows;
            if (src + 15 * along_row + 15 * down_rows + 16 <= w_end) {
              turn_tap_columns(src, along_row, down_rows, tap_offsets,
                               dst_of(g, 0, r0 + 1, i0) - dst_of(g, 0, r0, i0), [&](int64_t t) { return dst_of(g, t, r0, i0); });
              continue;
            }
          }
          if (rt.turn_windows) {
            for (int64_t r = r0; r < r1; ++r) {
              copy_tap_windows(group + r * down_rows, along_row, i0, i1, tap_offsets, w_end,
                               [&](int64_t t, int64_t i) { return dst_of(g, t, r, i); });
            }
            continue;
          }
          if (rt.windows_first) {
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t j0 = i0; j0 < i1; j0 += 16) {
                copy_windows_taps(group + r * down_rows, along_row, j0, std::min(i1, j0 + 16), tap_offsets, i_step, w_end,
                                  [&](int64_t t) { return dst_of(g, t, r, j0); });
              }
            }
            continue;
          }
          for (int64_t t = 0; t < taps; ++t) {
            const T* src = group + tap_offsets[t];
            for (int64_t r = r0; r < r1; ++r) {
              T* dst = dst_of(g, t, r, i0);
              for (int64_t i = i0; i < i1; ++i) dst[(i - i0) * i_step] = src[r * down_rows + i * along_row];
            }
          }
        }
      }
    }
  });
}

template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void pack_wide_weights(const Problem& p, const scalar_t* w, const int64_t* ws, int64_t row_len, acc_t* packed) {
  const int64_t rows = p.Cout * (p.Cin / p.groups) * p.Kh, Cin_g = p.Cin / p.groups;
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / row_len), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t kh = r % p.Kh, ci = r / p.Kh % Cin_g, co = r / p.Kh / Cin_g;
      const scalar_t* src = w + co * ws[0] + ci * ws[1] + kh * ws[2];
      acc_t* dst = packed + r * row_len;
      if (ws[3] == 1) {
        widen<scalar_t>(src, dst, p.Kw);
      } else {
        for (int64_t kw = 0; kw < p.Kw; ++kw) dst[kw] = static_cast<acc_t>(src[kw * ws[3]]);
      }
      zero(dst + p.Kw, row_len - p.Kw);
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
