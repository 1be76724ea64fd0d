// One brgemm per block of output positions over each position's whole receptive field (its patch,
// an im2col row), through torch's brgemm (ATen/native/CPUBlas.h): bfloat16 on the AMX tile unit or
// AVX512_BF16 dot products, float32 on the kernel oneDNN generates for the CPU (AVX2 or AVX-512).
//
// tap_brgemm.h reduces over one tap's channels per brgemm and adds the taps in C. Where a group has
// few channels (a 3-channel stem, 16-channel groups) or the taps are spread (dilation), each of
// those brgemms does little but move C. Here the input is staged once, zero-padded, with each
// group's channels innermost, [n][g][row][column][channel] (bfloat16 read in place: channels
// rounded up to a pair, the pad channel zero). A position's patch is then a few contiguous runs of
// one staged image: taps adjacent along a row (dilation 1, or a transposed conv's phase) are one
// run. Where every tap steps by 1 (a stride-1 conv2d, every transposed conv's phase), A =
// [positions][K] is the staged rows themselves, lda = the channels, one brgemm per run; elsewhere a
// task copies the patches of kPatchRows positions of one phase into A, K = taps x channels, one
// brgemm for all. B is the weight packed once per call as [K][Cout_g] (bfloat16: VNNI pairs along
// K), taken in blocks of output channels. C = [positions][output channels] starts at the bias and
// is turned round to an NCHW output by 16 x 16 register transposes.
//
// Summation order, fixed by the geometry alone: each output starts at its bias, then K in the order
// (tap row, tap column, channel) over the taps that reach its phase, each axis's taps sorted by
// input offset. bfloat16: the unit (tiles or dot products) adds the exact products of its chunks of
// 32 pairs of consecutive K terms in float32, to nearest even (a copied patch of an odd channel
// count pairs across taps, and an odd K ends with one zero term); the exponent rule of tap_brgemm.h
// keeps every operand and partial sum normal, checked image by image (an image that fails is left
// to the caller). float32: chunks of at most kPatchChunk terms (a copied patch's K, or an in-place
// run, cut every kPatchChunk terms), each summed by oneDNN's kernel from zero (one fused
// multiply-add chain per output, in K order) and added in turn to C.
#pragma once

#include <ATen/native/CPUBlas.h>

#include <cstring>
#include <optional>
#include <tuple>

#include "axes.h"
#include "kernel_common.h"
#include "kernel_table.h"
#include "tap_brgemm.h"
#include "tiles.h"

namespace fuel {

// Whether the patch path may run where it serves (cpu_capability.cpp): FUEL_PATCH not "0".
bool patch_brgemm_allowed();

namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

constexpr int64_t kPatchRows = 64;      // positions per task (copied patches): brgemm's M
constexpr int64_t kPatchChannels = 64;  // output channels per brgemm: its N
constexpr int64_t kPatchBlock = kPatchRows * kPatchChannels;  // C's floats

// A task's C: `rows` positions of `ldc` floats (its output channels, at most kPatchChannels, in
// whole 16-channel tiles). In place, fewer channels buy more positions per brgemm: 16-channel
// groups made three brgemms of 64 x 16 per 64 positions, which took longer to call than to run.
struct PatchBlock {
  int64_t rows, ldc;
};

// Fewer positions per block where blocks are too few to share among the threads: one image of a
// 32-channel 16 x 16 conv made 3 blocks, 2 + 1 over 2 threads, and took longer at 2 threads than at
// 1 (channels_last float32 on a Zen 4: 0.092 ms against 0.063). `others` is the tasks per block
// index (images x groups x phases). Any split gives the same bits: a block only chooses which
// outputs one brgemm computes.
// `rows` positions per block, or fewer (whole 16s) where the blocks, `others` tasks each, would be
// fewer than 4 a thread.
inline int64_t rows_for_threads(int64_t rows, int64_t positions, int64_t others, int64_t threads) {
  const int64_t wanted_blocks = (4 * threads + others - 1) / others;
  if (threads > 1 && (positions + rows - 1) / rows < wanted_blocks) {
    rows = std::clamp<int64_t>((positions + wanted_blocks - 1) / wanted_blocks + 15, 16, rows) / 16 * 16;
  }
  return rows;
}

inline PatchBlock patch_block(int64_t Cout_g, bool in_place, int64_t positions, int64_t others, int64_t threads) {
  const int64_t ldc = std::min(kPatchChannels, (Cout_g + 15) / 16 * 16);
  const int64_t rows = in_place ? kPatchBlock / ldc / 16 * 16 : kPatchRows;  // whole tiles of rows for the transposes
  return {rows_for_threads(rows, positions, others, threads), ldc};
}

// float32 terms per brgemm: each chunk is summed from zero and added to C. 64 keeps the largest
// error at the per-tap path's on 64-channel taps; 256-term chunks doubled it, past the suite's
// bound of twice torch's error, and were no faster on a ResNet 3x3.
constexpr int64_t kPatchChunk = 64;
constexpr double kStagingBudget = double(int64_t(256) << 20);

// The staged input: image n's group g at data + (n * groups + g) * image_group, element
// [row][column][channel] = x[n][g * Cin_g + channel][row + min_h][column + min_w], zero outside x,
// at (row * pitch + column) * Cp. A row's Ws columns start `pitch` after the previous row's: where
// both sides are padded, the zero columns at a row's right end are the next row's left ones
// (pitch = Ws - shared). In place, every staged row is a grid row of computed positions, so each
// shared column is one position fewer computed and dropped (a 3x3 over 28 columns: 29 for 30).
struct PatchStaging {
  int64_t Cp = 0;                // channels per position: Cin_g (bfloat16 in place: rounded up to a pair)
  int64_t min_h = 0, min_w = 0;  // the input row and column of staged row and column 0
  int64_t Hs = 0, Ws = 0, pitch = 0, image_group = 0;
  int64_t x_lo = 0, x_hi = 0;    // the staged columns that hold x's, [x_lo, x_hi): zeros around them
  // The columns row i writes: its own pitch, the last row all Ws (the columns past the last
  // pitch are the next rows' in every other row).
  int64_t row_columns(int64_t i) const { return i + 1 == Hs ? Ws : pitch; }
};

// A run of `length` staged elements at `offset` from a position's first element: part of its patch.
struct PatchRun {
  int64_t offset, length;
};

// One phase's patch: its runs in K order, K, and where the phase's packed weights begin.
struct PatchPhase {
  std::vector<PatchRun> runs;
  std::vector<int64_t> run_k;  // where each run's terms begin in K
  int64_t K = 0, weight_offset = 0;
  std::vector<Tap> taps_h, taps_w;  // sorted by offset: the K order
};

// The staging extent along one axis, as a double first: a hostile padding must fail the budget,
// not overflow.
inline bool staging_extent(const Axis& ax, int64_t& min_off, int64_t& extent) {
  double lo = 0, hi = 0;
  bool any = false;
  for (const Phase& ph : ax.phases) {
    if (ph.taps.empty()) return false;
    for (const Tap& t : ph.taps) {
      const double first = double(t.offset), last = double(ax.in_step) * double(ph.count - 1) + double(t.offset);
      lo = any ? std::min(lo, first) : first, hi = any ? std::max(hi, last) : last, any = true;
    }
  }
  if (!any || hi - lo + 1 > kStagingBudget) return false;
  min_off = static_cast<int64_t>(lo), extent = static_cast<int64_t>(hi - lo) + 1;
  return true;
}

// pair_channels: bfloat16 read in place, whose runs must start on whole pairs.
template <typename scalar_t>
bool patch_staging(const Problem& p, const Axis& ax_h, const Axis& ax_w, bool pair_channels, PatchStaging& st) {
  const int64_t Cin_g = p.Cin / p.groups;
  st.Cp = pair_channels ? (Cin_g + 1) / 2 * 2 : Cin_g;
  if (!staging_extent(ax_h, st.min_h, st.Hs) || !staging_extent(ax_w, st.min_w, st.Ws)) return false;
  const double bytes = double(p.N) * p.groups * double(st.Hs) * double(st.Ws) * st.Cp * sizeof(scalar_t);
  if (bytes > kStagingBudget) return false;
  st.x_lo = std::clamp<int64_t>(-st.min_w, 0, st.Ws);
  st.x_hi = std::clamp<int64_t>(p.W - st.min_w, st.x_lo, st.Ws);
  // In place, a grid row's positions are its staged row's `pitch` columns, so no more columns are
  // shared than leave every phase's output columns a position each: with a padding past the kernel's
  // reach (a 3x3 padded by 3, a 1x1 by 1) sharing all the zeros left fewer positions than output
  // columns, and the last ones were written past the block into memory not the call's.
  int64_t widest = 0;
  for (const Phase& ph : ax_w.phases) widest = std::max(widest, ph.count);
  st.pitch = st.Ws - std::clamp<int64_t>(std::min(st.x_lo, st.Ws - st.x_hi), 0, std::max<int64_t>(0, st.Ws - widest));
  st.image_group = ((st.Hs - 1) * st.pitch + st.Ws) * st.Cp;
  return true;
}

inline std::vector<Tap> by_offset(std::vector<Tap> taps) {
  std::stable_sort(taps.begin(), taps.end(), [](const Tap& a, const Tap& b) { return a.offset < b.offset; });
  return taps;
}

// even_K: bfloat16, whose B is packed in pairs of K rows; an odd K gets one zero term at its end.
inline std::vector<PatchPhase> patch_phases(const Axis& ax_h, const Axis& ax_w, const PatchStaging& st, bool even_K) {
  std::vector<PatchPhase> phases;
  for (const Phase& ph : ax_h.phases) {
    for (const Phase& pw : ax_w.phases) {
      PatchPhase pp;
      pp.taps_h = by_offset(ph.taps), pp.taps_w = by_offset(pw.taps);
      for (const Tap& a : pp.taps_h) {
        for (size_t b = 0; b < pp.taps_w.size();) {
          size_t end = b + 1;
          while (end < pp.taps_w.size() && pp.taps_w[end].offset == pp.taps_w[end - 1].offset + 1) ++end;
          const int64_t offset = ((a.offset - st.min_h) * st.pitch + (pp.taps_w[b].offset - st.min_w)) * st.Cp;
          pp.runs.push_back({offset, static_cast<int64_t>(end - b) * st.Cp});
          pp.run_k.push_back(pp.K);
          pp.K += static_cast<int64_t>(end - b) * st.Cp;
          b = end;
        }
      }
      if (even_K && pp.K % 2 == 1) ++pp.K;
      phases.push_back(std::move(pp));
    }
  }
  return phases;
}

// Stride-1 geometry (a stride-1 conv2d, every transposed conv's phases) with each column phase's
// taps adjacent (each tap row one run): A is the staged image itself, one brgemm per tap row.
inline bool patch_in_place(const Axis& ax_h, const Axis& ax_w) {
  bool in_place = ax_h.in_step == 1 && ax_w.in_step == 1;
  for (const Phase& pw : ax_w.phases) {
    const std::vector<Tap> taps = by_offset(pw.taps);
    for (size_t b = 1; b < taps.size(); ++b) in_place = in_place && taps[b].offset == taps[b - 1].offset + 1;
  }
  return in_place;
}

// A call's plan on this path: the staging, each phase's patch, whether A is read in place, and
// the longest patch.
struct PatchPlan {
  PatchStaging st;
  std::vector<PatchPhase> phases;
  bool in_place = false;
  int64_t max_K = 0;
};

// The plan where this path serves the call, else nullopt. It serves a dtype the brgemm paths take
// (tap_brgemm.h), not depthwise (the caller's), every phase reached by some tap, at least one input
// channel (none: the bias alone, the chassis's), and staging within its budget. A call needs a
// vector's worth of output channels per group (below that the chassis was 2.5x faster on a
// 3-channel float32 stem transpose, and 1.7x on the bfloat16 one with AVX512_BF16 dot products on a
// Zen 5), but for bfloat16 on the tile unit: with 13 of 16 tile columns empty it was still 15-20%
// faster than the chassis there. A 1x1 kernel's patch is one tap: tap_brgemm.h
// computes it as the same single brgemm without the staged copy (in place, for an NCHW stride-1
// input).
template <typename scalar_t>
std::optional<PatchPlan> patch_plan(const Problem& p, const Axis& ax_h, const Axis& ax_w) {
  // 1x1 kernels: bfloat16 here, float32 on the per-tap path. On a Zen 4 (4x256x28x28 -> 64), bfloat16
  // took 0.78 ms per tap (NCHW; 1.88 channels_last, its pair planes gathered across the channels) and
  // 0.65 here in either layout; float32 took 1.01 per tap (NCHW) and 1.23 here.
  constexpr bool paired = std::is_same_v<scalar_t, at::BFloat16>;
  if (!patch_brgemm_allowed() || (p.Kh * p.Kw == 1 && !paired) || p.Cin == 0) return std::nullopt;
  const bool on_tiles = paired && bfloat16_brgemm_unit() == Bf16Unit::tiles;
  if (!on_tiles && p.Cout / p.groups < 16) return std::nullopt;
  PatchPlan plan;
  plan.in_place = patch_in_place(ax_h, ax_w);
  // Copied patches need no pad channel: a patch's terms pair across taps, and only an odd K gets a
  // zero term. With it, a 3-channel 7x7 stem's patches were 196 terms for 147, and its bfloat16
  // conv took 0.90 ms for 0.72 (2x3x112x112, 1 thread, Zen 4).
  if (!brgemm_dtype_enabled<scalar_t>() || !patch_staging<scalar_t>(p, ax_h, ax_w, paired && plan.in_place, plan.st)) {
    return std::nullopt;
  }
  plan.phases = patch_phases(ax_h, ax_w, plan.st, paired);
  for (const PatchPhase& pp : plan.phases) plan.max_K = std::max(plan.max_K, pp.K);
  // Copied patches keep a task's A within what a task may hold in L2 (a 3x3 kernel over 128
  // float32 channels, 256 bfloat16 ones); past that, tap_brgemm.h reads the planes in place.
  if (!plan.in_place && kPatchRows * plan.max_K * int64_t(sizeof(scalar_t)) > 2 * kScratchBytes) return std::nullopt;
  return plan;
}

// A short run of bytes with 64-byte moves, the tail under a mask: runs are a few channels to a few
// hundred (a stem's row of taps is 56 bytes).
inline void copy_bytes(const char* src, char* dst, int64_t n) {
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX512)
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
  if (i < n) {
    const __mmask64 lanes = ~uint64_t(0) >> (64 - (n - i));
    _mm512_mask_storeu_epi8(dst + i, lanes, _mm512_maskz_loadu_epi8(lanes, src + i));
  }
#else
  // AVX2 has no byte masks; its runs are of float32, whole 4-byte lanes.
  for (; i + 32 <= n; i += 32) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
  if (const int64_t lanes = (n - i) / 4; lanes > 0) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_epi32(reinterpret_cast<int*>(dst + i), mask,
                           _mm256_maskload_epi32(reinterpret_cast<const int*>(src + i), mask));
    i += lanes * 4;
  }
  if (i < n) std::memcpy(dst + i, src + i, n - i);
#endif
}

// Whether staged row i holds x's elements (else it lies in the padding).
inline bool row_holds_x(const Problem& p, const PatchStaging& st, int64_t i) {
  return i + st.min_h >= 0 && i + st.min_h < p.H;
}

// The zeros of staged row i: the whole row where it lies in the padding, else its padding columns
// and the pad channel.
template <typename scalar_t>
void zero_row_padding(const Problem& p, const PatchStaging& st, int64_t i, scalar_t* row) {
  const int64_t Cin_g = p.Cin / p.groups, columns = st.row_columns(i);
  if (!row_holds_x(p, st, i)) {
    std::memset(static_cast<void*>(row), 0, columns * st.Cp * sizeof(scalar_t));
    return;
  }
  const int64_t lo = st.x_lo, hi = st.x_hi;
  std::memset(static_cast<void*>(row), 0, lo * st.Cp * sizeof(scalar_t));
  std::memset(static_cast<void*>(row + hi * st.Cp), 0, (columns - hi) * st.Cp * sizeof(scalar_t));
  for (int64_t j = lo; j < hi && st.Cp > Cin_g; ++j) row[j * st.Cp + Cin_g] = scalar_t(0.f);
}

// Channel blocks of an NCHW x that are staged by 16 x 16 tiles (see stage_rows); the channels
// past them go element by element.
inline int64_t staged_tile_blocks(const Problem& p, const PatchStaging& st, const Layout& xl) {
  return xl.c != 1 && xl.w == 1 && st.x_hi - st.x_lo >= 16 ? p.Cin / p.groups / 16 : 0;
}

// x's elements of staged row i (one that holds them) of image n's group g: channel block `block`
// of staged_tile_blocks, or with block = -1 every channel that no tile block covers.
template <typename scalar_t>
void stage_row_channels(const Problem& p, const PatchStaging& st, const scalar_t* x, const Layout& xl, int64_t n,
                        int64_t g, int64_t i, int64_t block, scalar_t* row) {
  const int64_t Cin_g = p.Cin / p.groups, lo = st.x_lo, hi = st.x_hi;
  const scalar_t* src = x + n * xl.n + g * Cin_g * xl.c + (i + st.min_h) * xl.h + st.min_w * xl.w;
  if (block >= 0) {
    // A row's last columns by one more tile ending at its end, overlapping the one before it
    // (element by element, a 28-column row's last 12 took most of its staging).
    const int64_t c0 = 16 * block;
    for (int64_t j = lo; j < hi; j += 16) {
      const int64_t at = std::min(j, hi - 16);
      transpose_tile(src + c0 * xl.c + at, xl.c, row + at * st.Cp + c0, st.Cp);
    }
    return;
  }
  if (xl.c == 1) {  // channels_last: a position's channels are already side by side
    for (int64_t j = lo; j < hi; ++j) {
      copy_bytes(reinterpret_cast<const char*>(src + j * xl.w), reinterpret_cast<char*>(row + j * st.Cp),
                 Cin_g * sizeof(scalar_t));
    }
    return;
  }
#if defined(CPU_CAPABILITY_AVX512)
  if (xl.w == 1 && Cin_g < 16) {
    // Few channels (a 3-channel stem): 16 positions at a time turned round from Cin_g rows, each
    // position's 16 lanes (its channels, then zeros) stored whole: the zeros land where the next
    // position's store goes after it, or in the row's right padding (masked stores are slow on AMD,
    // and element by element this staging took a tenth of a 7x7/2 stem on a Zen 5). Positions whose
    // lanes would pass the row's end go one by one.
    const int64_t whole_end = std::min(hi, (st.row_columns(i) * st.Cp - 16) / st.Cp + 1);
    int64_t j = lo;
    for (; j + 16 <= whole_end; j += 16) transpose_tile(src + j, xl.c, row + j * st.Cp, st.Cp, Cin_g);
    for (; j < hi; ++j) {
      for (int64_t c = 0; c < Cin_g; ++c) row[j * st.Cp + c] = src[c * xl.c + j];
    }
    return;
  }
#endif
  const int64_t untiled = 16 * staged_tile_blocks(p, st, xl);
  for (int64_t j = lo; j < hi; ++j) {
    for (int64_t c = untiled; c < Cin_g; ++c) row[j * st.Cp + c] = src[c * xl.c + j * xl.w];
  }
}

// Staged rows [i0, i1) of image n's group g, channels innermost. Tile blocks go one after another,
// each over all the rows, so that the tiles read 16 of x's planes at a time, not all the group's:
// from memory (x out of cache, as between a model's layers), a bfloat16 4x64x56x56 input staged
// row by row took 0.38-0.46 ms, block by block 0.21-0.27 (Zen 4, 1 thread, stand-alone).
template <typename scalar_t>
void stage_rows(const Problem& p, const PatchStaging& st, const scalar_t* x, const Layout& xl, int64_t n, int64_t g,
                int64_t i0, int64_t i1, scalar_t* image) {
  auto row_at = [&](int64_t i) { return image + i * st.pitch * st.Cp; };
  for (int64_t i = i0; i < i1; ++i) zero_row_padding(p, st, i, row_at(i));
  const int64_t blocks = staged_tile_blocks(p, st, xl);
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t i = i0; i < i1; ++i) {
      if (row_holds_x(p, st, i)) stage_row_channels(p, st, x, xl, n, g, i, block, row_at(i));
    }
  }
  if (blocks * 16 == p.Cin / p.groups) return;
  for (int64_t i = i0; i < i1; ++i) {
    if (row_holds_x(p, st, i)) stage_row_channels(p, st, x, xl, n, g, i, -1, row_at(i));
  }
}

// Where staging would copy x unchanged: one group of channels_last positions, dense rows, no pad
// channel, and only x's own whole rows staged (no padding read). A is then x itself, read in place:
// the same operands in the same brgemms, so the same bits. Staged, a bfloat16 4x256x28x28 1x1 call
// spent a sixth of its time staging on a Zen 4.
inline bool reads_x_in_place(const Problem& p, const PatchPlan& plan, const Layout& xl) {
  const PatchStaging& st = plan.st;
  return plan.in_place && p.groups == 1 && xl.c == 1 && xl.w == p.Cin && xl.h == p.W * p.Cin && st.Cp == p.Cin &&
         st.min_w == 0 && st.Ws == p.W && st.pitch == p.W && st.min_h >= 0 && st.min_h + st.Hs <= p.H;
}

// Stages every image (see PatchStaging); for bfloat16 also folds each image's exponents into seen.
// A task stages a range of one image's rows: the whole image where there are images enough to
// share among the threads.
template <typename scalar_t>
void stage_input(const Problem& p, const PatchStaging& st, const scalar_t* x, const Layout& xl, scalar_t* staged,
                 ImageExponents* seen) {
  const int64_t images = p.N * p.groups;
  const int64_t parts = std::min(st.Hs, (2 * int64_t(at::get_num_threads()) + images - 1) / images);
  const int64_t part_rows = (st.Hs + parts - 1) / parts;
  at::parallel_for(0, images * parts, 1, [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task) {
      const int64_t ng = task / parts, g = ng % p.groups, n = ng / p.groups;
      const int64_t i0 = task % parts * part_rows, i1 = std::min(st.Hs, i0 + part_rows);
      if (i0 >= i1) continue;
      scalar_t* image = staged + ng * st.image_group;
      stage_rows(p, st, x, xl, n, g, i0, i1, image);
      if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
        int emin = kSmallestEx;
        bool subnormal = false;
        // The rows' columns end to end: a row's columns past its pitch are the next row's.
        const int64_t end = (i1 - 1) * st.pitch + st.row_columns(i1 - 1);
        fold_exponents(reinterpret_cast<const uint16_t*>(image + i0 * st.pitch * st.Cp),
                       (end - i0 * st.pitch) * st.Cp, emin, subnormal);
        seen->fold(n, emin, subnormal);
      }
    }
  });
}

// B per group and phase: [K][Cout_g] in K order (float32), or as VNNI pairs [K / 2][Cout_g][2]; zero
// for the channels past Cin_g.
template <typename scalar_t>
std::vector<scalar_t> pack_patch_weights(const Problem& p, std::vector<PatchPhase>& phases, const PatchStaging& st,
                                         const scalar_t* w, const int64_t* ws) {
  constexpr bool paired = std::is_same_v<scalar_t, at::BFloat16>;
  const int64_t Cout_g = p.Cout / p.groups;
  int64_t total = 0;
  // Per tap matrix: where it lies in the weight, and where its first row goes in a group's B.
  std::vector<int64_t> tap_offsets, tap_k;
  for (PatchPhase& pp : phases) {
    pp.weight_offset = total, total += pp.K * Cout_g;
    int64_t k = 0;
    for (const Tap& a : pp.taps_h) {
      for (const Tap& b : pp.taps_w) {
        tap_offsets.push_back(a.k * ws[2] + b.k * ws[3]);
        tap_k.push_back(pp.weight_offset / Cout_g + k);
        k += st.Cp;
      }
    }
  }
  std::vector<scalar_t> packed(p.groups * total, scalar_t(0.f));
  // Row k of B: [k][co] at k * Cout_g, or k / 2's pairs [co][2] at k / 2 * Cout_g * 2, half k % 2.
  pack_tap_matrices<scalar_t>(p, tap_offsets, false, paired ? 2 : 1, Cout_g, w, ws,
                              [&](int64_t g, int64_t t, int64_t ci, int64_t co) {
                                const int64_t k = tap_k[t] + ci;
                                return packed.data() + g * total + (paired ? (k / 2 * Cout_g + co) * 2 + k % 2 : k * Cout_g + co);
                              });
  return packed;
}

// Rows of C past a block's last one that a transpose may read: a piece of an output row starts
// anywhere in a block and its tile reads 16 rows from there (C is allocated with them).
constexpr int64_t kTileSlackRows = 16;

// float32 or bfloat16 at unit column steps (NCHW): C's positions taken output row by output row,
// up to 16 at a time, each piece turned round by 16 x 16 transposes (bfloat16: rounded in the same
// registers), a whole one straight into the output, a shorter one (a row's end: 28 columns are
// 16 + 12) through `turned` in whole vectors. Pieces of 16 taken from the block's start instead
// straddle output rows (28-column rows: half of them), and stored element by element they took 9%
// of a grouped conv's time on a Zen 3; bfloat16 turned round through `turned` and narrowed 16
// positions at a time took 28% of a ResNet 3x3's on a Zen 5.
template <typename scalar_t>
void store_unit_step_rows(const float* c, float* turned, const PatchBlock& blk, int64_t rows, int64_t cols, int64_t m0,
                          int64_t pitch, const Phase& ph, const Phase& pw, const Axis& ax_h, scalar_t* out_nc,
                          const Layout& ol) {
  // Where grid rows lie back to back in the output (a conv2d's copied patches into a contiguous
  // plane: the stem), consecutive positions are consecutive output elements and a piece need not
  // stop at a row's end: split there, a 56-column stem's rows were 16 + 16 + 16 + 8 and every other
  // row's 16-float stores straddled cache lines.
  const bool back_to_back = pitch == pw.count && ax_h.out_step * ol.h == pitch;
  for (int64_t m = 0; m < rows;) {
    const int64_t jh = (m0 + m) / pitch, jw = (m0 + m) % pitch;
    if (jw >= pw.count) {  // computed past the grid row's end (in place), dropped
      m += pitch - jw;
      continue;
    }
    const int64_t piece_end = back_to_back ? rows : std::min(rows, m + pw.count - jw);
    const int64_t span = std::min<int64_t>(16, piece_end - m);
    // A short piece (a 28-column row's last 12) as the whole 16 positions ending with it, where they
    // are this block's and its output row's: the ones before it are stored again, with the same
    // bits, and the tile goes straight into the output, not through `turned` channel by channel
    // (a bfloat16 grouped 4x64x28x28 conv: 1.5-2.7% less time on a Zen 4).
    const int64_t back = 16 - span;
    const bool whole_from_behind = span < 16 && m >= back && (back_to_back || jw >= back);
    scalar_t* row = out_nc + (ph.r + ax_h.out_step * jh) * ol.h + pw.r + jw;
    for (int64_t co = 0; co < cols; co += 16) {
      const float* tile = c + m * blk.ldc + co;
      const int64_t channels = std::min<int64_t>(16, cols - co);
      if ((span == 16 || whole_from_behind) && channels == 16) {
        const int64_t from = span == 16 ? 0 : back;
        transpose_tile(tile - from * blk.ldc, blk.ldc, row - from + co * ol.c, ol.c);
        continue;
      }
      transpose_tile(tile, blk.ldc, turned, int64_t(16));
      // `turned` holds the whole tile: each row is read by whole loads.
      for (int64_t ch = 0; ch < channels; ++ch) {
        narrow<scalar_t, true>(turned + ch * 16, row + (co + ch) * ol.c, span);
      }
    }
    m += span;
  }
}

// The NCHW output lines that store_patch_block (or, given the pair phase, store_column_pair) will
// write for C's block, fetched for writing before its brgemms run. Each turned tile stores into 16
// channel planes, a pattern no hardware prefetcher follows: the stores took a fifth of a float32
// 7x7/2 stem's time on a Zen 3 (the same stores into a buffer in L1, next to nothing), and in the
// same processes the prefetch took 4-18% off the stem's and the grouped 3x3's times, 1 and 2
// threads. channels_last outputs, whose tiles are rows of positions, gained nothing.
// `step`: output elements from one position to the next.
template <typename scalar_t>
void prefetch_block_output(int64_t rows, int64_t cols, int64_t m0, int64_t pitch, const Phase& ph, const Phase& pw,
                           const Axis& ax_h, int64_t step, const scalar_t* out_nc, const Layout& ol) {
  for (int64_t m = 0; m < rows;) {
    const int64_t jh = (m0 + m) / pitch, jw = (m0 + m) % pitch, span = std::min(rows - m, pitch - jw);
    const int64_t count = std::min(span, pw.count - jw);
    const scalar_t* first = out_nc + (ph.r + ax_h.out_step * jh) * ol.h + pw.r * ol.w + jw * step;
    for (int64_t co = 0; count > 0 && co < cols; ++co) {
      prefetch_for_write(first + co * ol.c, ((count - 1) * step + 1) * int64_t(sizeof(scalar_t)));
    }
    m += span;
  }
}

// C's block [rows][cols] (at blk.ldc) into the output: channels_last rows as they are, unit column
// steps by store_unit_step_rows, other layouts turned round 16 positions at a time so that
// each channel's positions are one run, through `turned` ([cols][16]). Positions m0 + m are grid
// positions jh * pitch + jw; those with jw >= pw.count are dropped.
template <typename scalar_t>
void store_patch_block(const float* c, float* turned, const PatchBlock& blk, int64_t rows, int64_t cols, int64_t m0,
                       int64_t pitch, const Phase& ph, const Phase& pw, const Axis& ax_h, const Axis& ax_w,
                       scalar_t* out_nc, const Layout& ol) {
  // The positions from m (at most `most`) that lie in m's grid row: how many (span), how many of
  // them are kept (count: those past the grid row's count are dropped), and where the first goes.
  auto row_piece = [&](int64_t m, int64_t most) {
    const int64_t jh = (m0 + m) / pitch, jw = (m0 + m) % pitch, span = std::min(most, pitch - jw);
    scalar_t* dst = out_nc + (ph.r + ax_h.out_step * jh) * ol.h + (pw.r + ax_w.out_step * jw) * ol.w;
    return std::tuple<int64_t, int64_t, scalar_t*>{span, std::max<int64_t>(0, std::min(span, pw.count - jw)), dst};
  };
  if (ol.c == 1) {
    // A grid row's positions at a time: a division per position took two fifths of this store
    // (channels_last bfloat16 grouped 4x64x28x28 on a Zen 4).
    for (int64_t m = 0; m < rows;) {
      const auto [span, count, dst] = row_piece(m, rows - m);
      for (int64_t s = 0; s < count; ++s) narrow<scalar_t>(c + (m + s) * blk.ldc, dst + s * ax_w.out_step * ol.w, cols);
      m += span;
    }
    return;
  }
  const int64_t step = ax_w.out_step * ol.w;
  if (step == 1) return store_unit_step_rows<scalar_t>(c, turned, blk, rows, cols, m0, pitch, ph, pw, ax_h, out_nc, ol);
  for (int64_t m = 0; m < rows; m += 16) {
    const int64_t segment = std::min<int64_t>(16, rows - m);
    for (int64_t co = 0; co < cols; co += 16) transpose_tile(c + m * blk.ldc + co, blk.ldc, turned + co * 16, int64_t(16));
    for (int64_t s = 0; s < segment;) {
      const auto [span, count, dst] = row_piece(m + s, segment - s);
      for (int64_t co = 0; count > 0 && co < cols; ++co) store_row<scalar_t>(turned + co * 16 + s, dst + co * ol.c, step, count);
      s += span;
    }
  }
}

// A transposed conv's two column phases (stride 2 along the row, residues 0 and 1), in place, of an
// NCHW output: a task computes both phases' C for the same grid positions, and 8 positions of one
// output row from each are 16 adjacent columns, written as whole vectors (store_column_pair). Stored
// phase by phase, each writes every other column one element at a time (a fifth of a k4/s2
// upsampling's time in float32 on a Zen 3; in bfloat16, each rounded on its own, as long as the
// brgemms on a Zen 5). Returns the indices of the residue-0 and residue-1 phases where that holds.
template <typename scalar_t>
std::optional<std::pair<int64_t, int64_t>> paired_column_phases(const Axis& ax_w, bool in_place, const Layout& ol) {
  if (!in_place || ol.w != 1 || ax_w.out_step != 2 || ax_w.phases.size() != 2) return std::nullopt;
  const int64_t even = ax_w.phases[0].r == 0 ? 0 : 1;
  if (ax_w.phases[even].r != 0 || ax_w.phases[1 - even].r != 1) return std::nullopt;
  return std::pair<int64_t, int64_t>{even, 1 - even};
}

// The two column phases' C, interleaved ([position][phase][channel]: C's row q = 2m + phase), into
// the output. Row q of grid row jh is output column 2 jw + phase of that row, so the pair is one
// unit-step phase of twice the columns and positions (store_unit_step_rows): 8 positions of both
// phases per 16 x 16 transpose, 16 adjacent output columns per channel. Where W is odd the
// residue-1 phase's last column is missing: it falls past the pair's count and is dropped. (From
// separate C blocks, turned round 16 positions at a time and interleaved per channel and piece, the
// store took an eighth of a bfloat16 k4/s2 upsampling's kernel time on a Zen 5.)
template <typename scalar_t>
void store_column_pair(const float* c, float* turned, const PatchBlock& blk, int64_t rows_even, int64_t cols,
                       int64_t m0, int64_t pitch, const Phase& ph, const Phase& pw_even, const Phase& pw_odd,
                       const Axis& ax_h, scalar_t* out_nc, const Layout& ol) {
  const Phase pair{0, pw_even.count + pw_odd.count, {}};
  store_unit_step_rows<scalar_t>(c, turned, blk, 2 * rows_even, cols, 2 * m0, 2 * pitch, ph, pair, ax_h, out_nc, ol);
}

// The exponent rule of the bfloat16 units (tap_brgemm.h) for one call: the weights' and bias's part
// up front, each image's as its elements are seen (staged, or read in place by the tasks).
struct PatchExponentRule {
  int ew = kSmallestEx, eb = kSmallestEx;
  bool weights_pass = true;
  ImageExponents seen;

  template <typename scalar_t>
  PatchExponentRule(const Problem& p, const std::vector<scalar_t>& packed, const scalar_t* bias) : seen(p.N) {
    if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
      bool sub_w = false, sub_b = false;
      fold_exponents(reinterpret_cast<const uint16_t*>(packed.data()), static_cast<int64_t>(packed.size()), ew, sub_w);
      if (bias) scan_exponents(bias, p.Cout, 1, eb, sub_b);
      weights_pass = !sub_w && !sub_b;
    }
  }
  // Per image, whether its operands pass; float32 passes whole.
  template <typename scalar_t>
  std::vector<char> images_passing(int64_t N) const {
    std::vector<char> done(N, weights_pass);
    if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
      for (int64_t n = 0; n < N; ++n) {
        done[n] = weights_pass && !seen.sub[n].load() && sums_stay_normal(seen.low[n].load(), ew, eb);
      }
    }
    return done;
  }
};

// Counts the images this path computed (fuel_torch._C.path_counts()).
template <typename scalar_t>
void count_patch_images(const std::vector<char>& done, bool x_in_place) {
  const int64_t computed = std::count(done.begin(), done.end(), 1);
  (std::is_same_v<scalar_t, at::BFloat16> ? path_counts().bfloat16_brgemm_images : path_counts().float_brgemm_images) +=
      computed;
  path_counts().patch_brgemm_images += computed;
  if (x_in_place) path_counts().patch_x_in_place_images += computed;
}

// Elements of slack past the staged images and past A: at least the 64 bytes copy_patches may
// read and write past a run.
constexpr int64_t kRunSlack = 32;

// A run copied in whole vector moves (AVX512: 64 bytes, AVX2: 32), up to a vector past its end:
// masked stores are slow on AMD cores (AVX2's took a third of a stem's patch copy on a Zen 3), and
// the bytes past a run land where the next run or the next patch is written after it, or in A's
// slack.
inline void copy_run_over(const char* src, char* dst, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  for (int64_t i = 0; i < n; i += 64) _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
#else
  for (int64_t i = 0; i < n; i += 32) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
#endif
}

// A = the patches of grid positions [m0, m0 + rows) of one phase, one row of K elements each, in
// order (copy_run_over's spill is overwritten by what follows it).
template <typename scalar_t>
void copy_patches(const PatchPhase& pp, const PatchStaging& st, const Axis& ax_h, const Axis& ax_w, int64_t count_w,
                  const scalar_t* image, int64_t m0, int64_t rows, scalar_t* a) {
  int64_t jh = m0 / count_w, jw = m0 % count_w;
  for (int64_t m = 0; m < rows; ++m) {
    const scalar_t* base = image + (ax_h.in_step * jh * st.pitch + ax_w.in_step * jw) * st.Cp;
    scalar_t* dst = a + m * pp.K;
    for (const PatchRun& run : pp.runs) {
      copy_run_over(reinterpret_cast<const char*>(base + run.offset), reinterpret_cast<char*>(dst),
                    run.length * sizeof(scalar_t));
      dst += run.length;
    }
    if (dst < a + (m + 1) * pp.K) *dst = scalar_t(0.f);  // the zero term of an odd bfloat16 patch
    if (++jw == count_w) jw = 0, ++jh;  // the next position walked to, not divided out (64-bit divisions are slow)
  }
}

// A thread's buffers: A (copied patches), C (zeroed once: the transposes read whole 16 x 16 tiles
// of C past a short block's rows, up to kTileSlackRows past its end; a column pair's two phases
// interleaved, twice the rows) and the transposes' buffer.
template <typename scalar_t>
struct PatchBuffers {
  static constexpr int64_t kCFloats = kPatchBlock + kTileSlackRows * kPatchChannels;
  std::unique_ptr<scalar_t[]> a;
  std::vector<float> c, turned;
  PatchBuffers(const PatchPlan& plan, bool column_pair)
      : a(scratch<scalar_t>(plan.in_place ? 0 : kPatchRows * plan.max_K + kRunSlack)),
        c((column_pair ? 2 : 1) * kCFloats, 0.f),
        turned(kPatchBlock) {}
};

// What a call's tasks share, and one task's work: a block of grid positions of one row phase and
// one column phase (both, for a column pair), every output channel of one group of one image.
template <typename scalar_t>
struct PatchCall {
  static constexpr bool paired = std::is_same_v<scalar_t, at::BFloat16>;
  const Problem& p;
  const Axis &ax_h, &ax_w;
  const PatchPlan& plan;
  const std::vector<scalar_t>& packed;  // pack_patch_weights
  const scalar_t* images;               // the staged images (stage_input), or x (reads_x_in_place)
  int64_t image_stride;                 // from one image's group to the next's in `images`
  ImageExponents* seen_by_tasks;        // bfloat16 read in place: the exponents the tasks read
  const std::vector<char>& done;        // the images this path computes
  const std::vector<float>& bias;       // per output channel, zero without one
  PatchBlock blk;
  int64_t blocks;  // position blocks of the largest phase
  std::optional<std::pair<int64_t, int64_t>> column_pair;  // paired_column_phases
  scalar_t* out;
  const Layout& ol;

  int64_t n_pw() const { return static_cast<int64_t>(ax_w.phases.size()); }
  int64_t task_phases_w() const { return column_pair ? 1 : n_pw(); }
  int64_t tasks() const {
    return p.N * p.groups * static_cast<int64_t>(ax_h.phases.size()) * task_phases_w() * blocks;
  }
  // In place, A is read at lda = Cp and a task's positions are the staged rows' pitch apart: the
  // pitch - count columns past each grid row are computed and dropped, as on the planar path.
  int64_t pitch(int64_t j) const { return plan.in_place ? plan.st.pitch : ax_w.phases[j].count; }
  // Positions of column phase j in the block from m0 (none: a phase with fewer than the largest).
  int64_t rows_of(const Phase& ph, int64_t j, int64_t m0) const {
    if (j < 0) return 0;
    return std::max<int64_t>(0, std::min(blk.rows, (ph.count - 1) * pitch(j) + ax_w.phases[j].count - m0));
  }

  // Folds the exponents of the elements a block's brgemms read in place (its runs' span: every
  // staged element between its first run's start and its last run's end).
  void fold_block_exponents(const PatchPhase& pp, const scalar_t* image, int64_t m0, int64_t rows, int64_t n) const {
    if constexpr (paired) {
      const int64_t first = pp.runs.front().offset, end = pp.runs.back().offset + pp.runs.back().length;
      int emin = kSmallestEx;
      bool subnormal = false;
      fold_exponents(reinterpret_cast<const uint16_t*>(image + m0 * plan.st.Cp + first),
                     (rows - 1) * plan.st.Cp + end - first, emin, subnormal);
      seen_by_tasks->fold(n, emin, subnormal);
    }
  }

  // C += A[:, 0, K) B[0, K), in chunks of at most kPatchChunk terms: brgemm sums each chunk from
  // zero and adds it to C (bfloat16: chunks of 32 pairs inside the unit as well).
  void accumulate(float* c, int64_t ldc, int64_t rows, int64_t cols, int64_t K, const scalar_t* a, int64_t lda,
                  const scalar_t* b, int64_t ldb) const {
    const int64_t chunk = paired ? K : kPatchChunk;
    for (int64_t k0 = 0; k0 < K; k0 += chunk) {
      dtype_brgemm(rows, cols, std::min(chunk, K - k0), lda, ldb, ldc, true, a + k0, b + k0 * ldb, c);
    }
  }

  // C of phase pp of group g for output channels [co0, co0 + cols), its rows ldc apart: the bias,
  // then the patch, read in place from the image or from the copied patches a.
  void compute(const PatchPhase& pp, int64_t g, const scalar_t* image, const scalar_t* a, int64_t m0, int64_t rows,
               int64_t co0, int64_t cols, float* c, int64_t ldc) const {
    const int64_t Cout_g = p.Cout / p.groups;
    for (int64_t m = 0; m < rows; ++m) copy_run(bias.data() + g * Cout_g + co0, c + m * ldc, cols);
    const scalar_t* b = packed.data() + g * static_cast<int64_t>(packed.size()) / p.groups + pp.weight_offset +
                        co0 * (paired ? 2 : 1);
    if (!plan.in_place) return accumulate(c, ldc, rows, cols, pp.K, a, pp.K, b, Cout_g);
    for (size_t r = 0; r < pp.runs.size(); ++r) {
      accumulate(c, ldc, rows, cols, pp.runs[r].length, image + m0 * plan.st.Cp + pp.runs[r].offset, plan.st.Cp,
                 b + pp.run_k[r] * Cout_g, Cout_g);
    }
  }

  void run(int64_t task, PatchBuffers<scalar_t>& buf) const {
    const int64_t G = p.groups, Cout_g = p.Cout / G, n_ph = static_cast<int64_t>(ax_h.phases.size());
    const auto [n, g, i, task_j, block, unused] = phase_task(task, G, n_ph, task_phases_w(), blocks, 1);
    if (!done[n]) return;
    const Phase& ph = ax_h.phases[i];
    const int64_t m0 = block * blk.rows;
    const int64_t j_first = column_pair ? column_pair->first : task_j, j_second = column_pair ? column_pair->second : -1;
    const int64_t rows_first = rows_of(ph, j_first, m0), rows_second = rows_of(ph, j_second, m0);
    if (rows_first == 0 && rows_second == 0) return;
    const scalar_t* image = images + (n * G + g) * image_stride;
    const PatchPhase& pp_first = plan.phases[i * n_pw() + j_first];
    if (seen_by_tasks) {
      if (rows_first > 0) fold_block_exponents(pp_first, image, m0, rows_first, n);
      if (rows_second > 0) fold_block_exponents(plan.phases[i * n_pw() + j_second], image, m0, rows_second, n);
    }
    if (!plan.in_place) {
      copy_patches(pp_first, plan.st, ax_h, ax_w, ax_w.phases[j_first].count, image, m0, rows_first, buf.a.get());
    }
    scalar_t* out_group = out + n * ol.n + g * Cout_g * ol.c;
    // A column pair's C: the two phases' rows interleaved (store_column_pair).
    const int64_t ldc = column_pair ? 2 * blk.ldc : blk.ldc;
    for (int64_t co0 = 0; co0 < Cout_g; co0 += blk.ldc) {
      const int64_t cols = std::min(blk.ldc, Cout_g - co0);
      if (ol.c != 1 && column_pair) {
        const Phase pair{0, ax_w.phases[j_first].count + ax_w.phases[j_second].count, {}};
        prefetch_block_output(2 * rows_first, cols, 2 * m0, 2 * pitch(j_first), ph, pair, ax_h, 1, out_group + co0 * ol.c, ol);
      } else if (ol.c != 1) {
        prefetch_block_output(rows_first, cols, m0, pitch(j_first), ph, ax_w.phases[j_first], ax_h,
                              ax_w.out_step * ol.w, out_group + co0 * ol.c, ol);
      }
      if (rows_first > 0) compute(pp_first, g, image, buf.a.get(), m0, rows_first, co0, cols, buf.c.data(), ldc);
      if (column_pair) {
        if (rows_second > 0) {
          compute(plan.phases[i * n_pw() + j_second], g, image, nullptr, m0, rows_second, co0, cols,
                  buf.c.data() + blk.ldc, ldc);
        }
        store_column_pair<scalar_t>(buf.c.data(), buf.turned.data(), blk, rows_first, cols, m0, pitch(j_first), ph,
                                    ax_w.phases[j_first], ax_w.phases[j_second], ax_h, out_group + co0 * ol.c, ol);
        continue;
      }
      store_patch_block<scalar_t>(buf.c.data(), buf.turned.data(), blk, rows_first, cols, m0, pitch(j_first), ph,
                                  ax_w.phases[j_first], ax_h, ax_w, out_group + co0 * ol.c, ol);
    }
  }
};

// Computes the images that take this path and returns, per image, whether it did (the caller
// computes the others).
template <typename scalar_t>
std::vector<char> convolve_patch_brgemm(const Problem& p, const Axis& ax_h, const Axis& ax_w, PatchPlan plan,
                                        const scalar_t* x, const Layout& xl, const ConvOperands& o,
                                        const scalar_t* bias, scalar_t* out, const Layout& ol) {
  const PatchStaging& st = plan.st;
  const std::vector<scalar_t> packed =
      pack_patch_weights<scalar_t>(p, plan.phases, st, static_cast<const scalar_t*>(o.weight), o.weight_strides);
  PatchExponentRule rule(p, packed, bias);
  if (!rule.weights_pass) return std::vector<char>(p.N, 0);
  // Staged, an image's exponents are seen before its tasks, which skip it where it fails. Read in
  // place, its tasks see them as they read x, and an image that fails is computed here all the same,
  // then again by the caller, over these outputs.
  const bool x_in_place = reads_x_in_place(p, plan, xl);
  ImageExponents* const seen = std::is_same_v<scalar_t, at::BFloat16> ? &rule.seen : nullptr;
  scalar_t* const staged = x_in_place ? nullptr : reused_planes<scalar_t>(p.N * p.groups * st.image_group + kRunSlack);
  if (staged) stage_input<scalar_t>(p, st, x, xl, staged, seen);
  // Not const: returned or handed on by move (a copy of it, compiled here at the level's ISA, is a
  // std:: function the linker may pick for every level: test_isa_levels.py).
  std::vector<char> to_compute = x_in_place ? std::vector<char>(p.N, 1) : rule.images_passing<scalar_t>(p.N);
  if (std::find(to_compute.begin(), to_compute.end(), 1) == to_compute.end()) return to_compute;

  int64_t max_positions = 1;
  for (const Phase& ph : ax_h.phases) {
    for (const Phase& pw : ax_w.phases) {
      max_positions = std::max(max_positions, plan.in_place ? (ph.count - 1) * st.pitch + pw.count : ph.count * pw.count);
    }
  }
  const auto column_pair = paired_column_phases<scalar_t>(ax_w, plan.in_place, ol);
  const int64_t others = p.N * p.groups * static_cast<int64_t>(ax_h.phases.size()) *
                         (column_pair ? 1 : static_cast<int64_t>(ax_w.phases.size()));
  const PatchBlock blk = patch_block(p.Cout / p.groups, plan.in_place, max_positions, others, at::get_num_threads());
  std::vector<float> bias_f(p.Cout, 0.f);
  for (int64_t c = 0; bias && c < p.Cout; ++c) bias_f[c] = static_cast<float>(bias[c]);
  const scalar_t* images = x_in_place ? x + st.min_h * xl.h : staged;
  const int64_t image_stride = x_in_place ? xl.n : st.image_group;
  const PatchCall<scalar_t> call{p, ax_h, ax_w, plan, packed, images, image_stride, x_in_place ? seen : nullptr,
                                 to_compute, bias_f, blk, (max_positions + blk.rows - 1) / blk.rows,
                                 column_pair, out, ol};
  at::parallel_for(0, call.tasks(), 1, [&](int64_t first, int64_t last) {
    PatchBuffers<scalar_t> buf(plan, call.column_pair.has_value());
    for (int64_t task = first; task < last; ++task) call.run(task, buf);
    at::native::cpublas::brgemm_release(PatchCall<scalar_t>::paired);
  });
  // Staged, the images that pass were known before the tasks; read in place, only now.
  std::vector<char> done = x_in_place ? rule.images_passing<scalar_t>(p.N) : std::move(to_compute);
  count_patch_images<scalar_t>(done, x_in_place);
  return done;
}

#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
