// The chassis: every convolution the special paths do not take, as an implicit GEMM.
//
// A task computes a block of output positions of one image, one group and a chunk of output
// channels as a small matrix product
//     out[co][p] = bias[co] + sum_t W[co][t] * col[t][p]
// over the taps t = (ci, kh, kw) that reach those positions. col is gathered from x for the task
// (implicit zero padding, stride, dilation and the input's layout resolved there), so the
// arithmetic loop (micro_kernel.h) has no branches and runs on whole vectors. Tasks own whole
// outputs, so the thread count never changes a sum.
#pragma once

#include "axes.h"
#include "kernel_common.h"
#include "micro_kernel.h"

namespace fuel {
namespace CPU_CAPABILITY {

constexpr int64_t kMaxPositions = 4096;  // output positions per task, at most

// One grid row's share of a task: grid columns [jw0, jw1) of grid row jh, stored from `offset` on.
struct Segment {
  int64_t jh, jw0, jw1, offset;
};

// One gathered row: dst[offset + jw - jw0] = plane[in_step_h * jh + a.offset][in_step_w * jw + b.offset]
// for every segment, zero where that falls outside the input (the implicit padding), and zero
// from `used` up to `width` (the unused lanes of the last vector block).
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void gather(const scalar_t* plane, const Layout& xl, int64_t in_step_h, int64_t in_step_w, const Tap& a, const Tap& b,
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
      const scalar_t* row = plane + (in_step_h * seg.jh + a.offset) * xl.h + b.offset * xl.w;
      const int64_t step = in_step_w * xl.w;
      if (step == 1) {
        widen<scalar_t>(row + lo, d + lo, hi - lo);
      } else {
        for (int64_t jw = lo; jw < hi; ++jw) d[jw] = static_cast<acc_t>(row[step * jw]);
      }
    }
    zero(d + hi, seg.jw1 - hi);
  }
  zero(dst + used, width - used);
}

// The sizes every task of one call shares.
struct ChassisPlan {
  Axis ax_h, ax_w;
  std::vector<int64_t> phase_offsets;
  int64_t chunk_taps = 1, chunk_rows = 1, positions = 1, max_taps = 0;
  struct Item {
    int64_t i, j, first, last;  // (phase h, phase w, first position, last position) of the phase's grid
  };
  std::vector<Item> items;
};

template <typename acc_t>
ChassisPlan plan_chassis(const Problem& p, Axis ax_h, Axis ax_w, std::vector<int64_t> offsets) {
  ChassisPlan plan{std::move(ax_h), std::move(ax_w), std::move(offsets)};
  const int64_t Cin_g = p.Cin / p.groups, Cout_g = p.Cout / p.groups;
  for (const Phase& ph : plan.ax_h.phases) {
    for (const Phase& pw : plan.ax_w.phases) {
      plan.max_taps = std::max<int64_t>(plan.max_taps, Cin_g * static_cast<int64_t>(ph.taps.size() * pw.taps.size()));
    }
  }
  // Positions per task: as many as keep the gathered taps and the running totals within
  // kScratchBytes each (they stay in L2), so that tasks with few taps or channels are not
  // dominated by per-task work. Any split gives the same bits; only the speed depends on it.
  plan.chunk_taps = std::clamp<int64_t>(plan.max_taps, 1, kTapChunk);
  plan.chunk_rows = std::clamp<int64_t>(Cout_g, 1, kChannelChunk);
  const int64_t block_width = kVectorBlock * Vectorized<acc_t>::size();
  const int64_t fit = kScratchBytes / static_cast<int64_t>(sizeof(acc_t)) / std::max(plan.chunk_taps, plan.chunk_rows);
  plan.positions = std::clamp<int64_t>(fit / block_width * block_width, block_width, kMaxPositions);
  for (int64_t i = 0; i < static_cast<int64_t>(plan.ax_h.phases.size()); ++i) {
    for (int64_t j = 0; j < static_cast<int64_t>(plan.ax_w.phases.size()); ++j) {
      const int64_t count = plan.ax_h.phases[i].count * plan.ax_w.phases[j].count;
      for (int64_t first = 0; first < count; first += plan.positions) {
        plan.items.push_back({i, j, first, std::min(count, first + plan.positions)});
      }
    }
  }
  return plan;
}

// Store: grid position (jh, jw) of the phase is output (r_h + out_step_h * jh, r_w + out_step_w * jw).
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void store_task(const ChassisPlan& plan, const Phase& ph, const Phase& pw, const std::vector<Segment>& segments,
                const acc_t* outer, int64_t ld, int64_t rows, scalar_t* first_plane, const Layout& ol) {
  const int64_t step = plan.ax_w.out_step * ol.w;
  for (int64_t c = 0; c < rows; ++c) {
    scalar_t* plane = first_plane + c * ol.c;
    for (const Segment& seg : segments) {
      scalar_t* row = plane + (ph.r + plan.ax_h.out_step * seg.jh) * ol.h + (pw.r + plan.ax_w.out_step * seg.jw0) * ol.w;
      store_row<scalar_t>(outer + c * ld + seg.offset, row, step, seg.jw1 - seg.jw0);
    }
  }
}

// w_rows: packed as pack_chassis_weights does.
template <typename scalar_t>
void convolve_chassis(const Problem& p, const ChassisPlan& plan, const scalar_t* x, const Layout& xl,
                      const acc_type<scalar_t>* w_rows, const acc_type<scalar_t>* bias, scalar_t* out,
                      const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const int64_t n_pw = static_cast<int64_t>(plan.ax_w.phases.size());
  const int64_t group_size = Cout_g * Cin_g * p.Kh * p.Kw, positions = plan.positions;
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  const int64_t co_chunks = (Cout_g + kChannelChunk - 1) / kChannelChunk;
  const int64_t tasks = p.N * G * n_items * co_chunks;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, plan.chunk_rows * plan.max_taps * positions));
  constexpr int64_t block_width = kVectorBlock * Vectorized<acc_t>::size();

  at::parallel_for(0, tasks, grain, [&](int64_t first_task, int64_t last_task) {
    const auto col = scratch<acc_t>(plan.chunk_taps * positions);
    const auto outer = scratch<acc_t>(plan.chunk_rows * positions), partial = scratch<acc_t>(plan.chunk_rows * positions);
    std::vector<const acc_t*> cols(plan.chunk_taps);
    for (int64_t t = 0; t < plan.chunk_taps; ++t) cols[t] = col.get() + t * positions;
    std::vector<Segment> segments;
    for (int64_t task = first_task; task < last_task; ++task) {
      const int64_t chunk = task % co_chunks, rest = task / co_chunks;
      const auto& item = plan.items[rest % n_items];
      const int64_t g = rest / n_items % G, n = rest / n_items / G;
      const Phase &ph = plan.ax_h.phases[item.i], &pw = plan.ax_w.phases[item.j];
      const int64_t nh = static_cast<int64_t>(ph.taps.size()), nw = static_cast<int64_t>(pw.taps.size());
      const int64_t taps = Cin_g * nh * nw;
      const int64_t width = (item.last - item.first + block_width - 1) / block_width * block_width;
      const int64_t co0 = chunk * kChannelChunk, rows = std::min(kChannelChunk, Cout_g - co0);
      const acc_t* w = w_rows + g * group_size + plan.phase_offsets[item.i * n_pw + item.j] + co0 * taps;

      const acc_t* task_bias = bias + g * Cout_g + co0;
      // No taps (no input channels): the outputs are the bias. Otherwise the first chunk starts
      // from it (multiply_block).
      if (taps == 0) {
        for (int64_t c = 0; c < rows; ++c) std::fill_n(outer.get() + c * positions, width, task_bias[c]);
      }

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
          const scalar_t* plane = x + n * xl.n + (g * Cin_g + ci) * xl.c;
          gather(plane, xl, plan.ax_h.in_step, plan.ax_w.in_step, ph.taps[ia], pw.taps[ib], segments,
                 col.get() + (t - t0) * positions, item.last - item.first, width);
          if (++ib == nw) {
            ib = 0;
            if (++ia == nh) ia = 0, ++ci;
          }
        }
        multiply<acc_t>(rows, w, taps, t0, cols.data(), t1 - t0, outer.get(), partial.get(), positions, width,
                        t0 == 0 ? task_bias : nullptr);
      }
      store_task<scalar_t>(plan, ph, pw, segments, outer.get(), positions, rows,
                           out + n * ol.n + (g * Cout_g + co0) * ol.c, ol);
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
