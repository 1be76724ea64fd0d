// The register-blocked micro-kernel of the chassis: a block of output channels times a block of
// gathered positions, over one chunk of taps, in the fixed summation order.
//
// One template for every dtype and ISA level: Vectorized<acc_t> is the level's vector (8 floats on
// AVX2, 16 on AVX-512), and the source is compiled once per level.
#pragma once

#include "kernel_common.h"

namespace fuel {
namespace CPU_CAPABILITY {

constexpr int kChannelBlock = 6;  // output channels per register block (12 accumulators)
constexpr int kVectorBlock = 2;   // vectors of positions per register block
// Taps per piece: a chunk is multiplied in pieces so that the inputs one position block reads from
// a piece (up to four cache lines per tap when unaligned) stay in L1 while every channel block reads
// them. The chunk's running sum waits in `partial` between pieces, so the order of the sums is
// unchanged. kPiece is for taps that each read lines of their own (a gathered row, a 1x1's input
// plane).
constexpr int64_t kPiece = 64;
static_assert(kTapChunk % kPiece == 0 && kPiece % kBlock == 0, "pieces must hold whole blocks of one chunk");

// Taps per piece where `sharing` taps read the same lines (a 3x3's three kernel columns read one
// plane row, shifted by a column): up to kPiece * sharing taps, the next whole division of the chunk.
// Fewer pieces, fewer round trips of the running sums through `partial`: at 1 thread on a Zen 5,
// float64 3x3 convolutions took 3-14% less time with whole chunks than with 64 taps; a 1x1's (no
// sharing) took 3-18% more (float64, float16).
inline int64_t taps_per_piece(int64_t sharing) {
  int64_t piece = kPiece;
  while (piece < kTapChunk && piece < kPiece * sharing) piece *= 2;
  return piece;
}

// Output channels per task: whole channel blocks of either size below, so that a task's packed
// weights start on a block.
constexpr int64_t kChannelChunk = 42 * kChannelBlock;
constexpr int kNarrowBlock = 4;  // channels per block where the task's count is a multiple of 4, not of 6
static_assert(kChannelChunk % kNarrowBlock == 0 && kNarrowBlock <= kChannelBlock, "a chunk must hold whole narrow blocks too");

// The channel block of a task with `rows` channels: kChannelBlock x kVectorBlock, or, where that
// would leave a short last block (64 = 10 x 6 + 4, 16 = 2 x 6 + 4), kNarrowBlock x 3 vectors: the
// same 12 sums in flight, and no block at two thirds of the speed.
inline int64_t channel_block(int64_t rows) {
  return rows % kChannelBlock != 0 && rows % kNarrowBlock == 0 ? kNarrowBlock : kChannelBlock;
}

// Where the weight of (row, tap) of a rows x taps weight matrix lies in the packed weights: rows in
// tasks of kChannelChunk, each task's rows in channel blocks (the last block holds the rest), each
// block tap-major, so that the weights one block broadcasts per tap are adjacent (row-major rows a
// power of two apart, as a 1x1's 256 taps are, would share a quarter of the L1 sets).
inline int64_t packed_weight_index(int64_t row, int64_t tap, int64_t rows, int64_t taps) {
  const int64_t task = row / kChannelChunk * kChannelChunk;
  const int64_t cb = channel_block(std::min(kChannelChunk, rows - task));
  const int64_t block = task + (row - task) / cb * cb;
  return block * taps + tap * std::min(cb, rows - block) + (row - block);
}

// The distance between the rows of a task's running totals: at least `width`, and an odd number of
// cache lines, so that rows a power of two apart do not all map to the same few L1 sets (64 rows
// 2 KiB apart would share two). Neither layout change moved a benchmark beyond this machine's noise.
template <typename acc_t>
constexpr int64_t staggered_pitch(int64_t width) {
  constexpr int64_t line = 64 / static_cast<int64_t>(sizeof(acc_t));
  const int64_t lines = (width + line - 1) / line;
  return (lines | 1) * line;
}

// outer[c][0..VB vectors) += sum over taps [0, taps) of w[t][c] * cols[t][p..p + VB vectors), for CB
// channels; w holds the block's weights tap-major (packed_weight_index) from the chunk's first tap
// on. cols[t] is tap t's row of inputs: a gathered row, or a run of a padded input plane. The taps
// (one chunk, at most kTapChunk, starting at a multiple of it) are summed in three levels: blocks of
// kBlock taps as fused chains, the chunk's blocks from zero, then the chunk into the running total.
// In the first chunk (bias: the CB channels' biases; null in the others) there is no running total
// yet: the first chain starts at the bias, held in a register, and the chunk sum becomes the total.
// Block and chunk boundaries sit at fixed multiples from the first tap, so the order of every sum
// is fixed by the geometry; CB and VB only choose how many sums run side by side.
template <typename acc_t, int CB, int VB>
inline void multiply_block(const acc_t* w, const acc_t* const* cols, int64_t p, int64_t first_tap,
                           int64_t end_tap, bool last_piece, acc_t* outer, acc_t* partial, int64_t ldo,
                           const acc_t* bias) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  Vec chunk[CB][VB];
  for (int c = 0; c < CB; ++c) {
    for (int v = 0; v < VB; ++v) chunk[c][v] = first_tap == 0 ? Vec(acc_t(0)) : Vec::loadu(partial + c * ldo + v * V);
  }
  for (int64_t t0 = first_tap; t0 < end_tap; t0 += kBlock) {
    const int64_t t1 = std::min(end_tap, t0 + kBlock);
    // The very first block's chain starts at the running total (the bias), so that a short sum is
    // one fused chain from the bias, rounded once per tap.
    const bool from_bias = bias && t0 == 0;
    Vec acc[CB][VB];
    for (int c = 0; c < CB; ++c) {
      for (int v = 0; v < VB; ++v) acc[c][v] = from_bias ? Vec(bias[c]) : Vec(acc_t(0));
    }
    for (int64_t t = t0; t < t1; ++t) {
      Vec xv[VB];
      const acc_t* col = cols[t] + p;
      for (int v = 0; v < VB; ++v) xv[v] = Vec::loadu(col + v * V);
      for (int c = 0; c < CB; ++c) {
        const Vec wv(w[t * CB + c]);
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
      if (!last_piece) {
        chunk[c][v].store(partial + c * ldo + v * V);
      } else {
        (bias ? chunk[c][v] : Vec::loadu(o) + chunk[c][v]).store(o);
      }
    }
  }
}

// Requests into L1 the next position block of taps [s0, s1): `span` inputs from `offset` on in each
// tap's run. A piece's taps are up to kPiece streams, more than the hardware prefetchers follow
// (1x1 with its images out of the cache: +10-15%; spreading the requests over the channel blocks,
// or asking further ahead, gained less).
template <typename acc_t>
inline void request_inputs(const acc_t* const* cols, int64_t s0, int64_t s1, int64_t offset, int64_t span) {
  constexpr int64_t line = 64 / static_cast<int64_t>(sizeof(acc_t));
  for (int64_t t = s0; t < s1; ++t) {
    const acc_t* first = cols[t] + offset;
    for (int64_t i = 0; i < span; i += line) _mm_prefetch(reinterpret_cast<const char*>(first + i), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(first + span - 1), _MM_HINT_T0);
  }
}

// multiply's piece [s0, s1) for a task of kNarrowBlock-channel blocks: kNarrowBlock x 3 vector
// blocks, then the last one or two vectors of positions.
template <typename acc_t, typename BlockWeights>
void multiply_narrow(int64_t rows, const BlockWeights& block_w, const acc_t* const* cols, int64_t s0, int64_t s1,
                     bool last, acc_t* outer, acc_t* partial, int64_t ldo, int64_t width, const acc_t* bias) {
  constexpr int64_t V = Vectorized<acc_t>::size(), step = 3 * V;
  constexpr int CB = kNarrowBlock;
  int64_t p = 0;
  for (; p + step <= width; p += step) {
    if (rows > CB && p + step < width) request_inputs(cols, s0, s1, p + step, step);  // as multiply does
    for (int64_t c = 0; c < rows; c += CB) {
      multiply_block<acc_t, CB, 3>(block_w(c), cols, p, s0, s1, last, outer + c * ldo + p, partial + c * ldo + p, ldo,
                                   bias ? bias + c : nullptr);
    }
  }
  for (int64_t c = 0; p < width && c < rows; c += CB) {
    acc_t *oc = outer + c * ldo + p, *pc = partial + c * ldo + p;
    if (width - p == 2 * V) {
      multiply_block<acc_t, CB, 2>(block_w(c), cols, p, s0, s1, last, oc, pc, ldo, bias ? bias + c : nullptr);
    } else {
      multiply_block<acc_t, CB, 1>(block_w(c), cols, p, s0, s1, last, oc, pc, ldo, bias ? bias + c : nullptr);
    }
  }
}

// multiply's piece [s0, s1) for a task of CB channels (one block): blocks of VB vectors of positions
// while they fit in width. Returns the first position left, a whole number of kVectorBlock blocks
// before width.
template <typename acc_t, int CB, int VB>
int64_t multiply_few(const acc_t* w, const acc_t* const* cols, int64_t s0, int64_t s1, bool last, acc_t* outer,
                     acc_t* partial, int64_t ldo, int64_t width, const acc_t* bias) {
  static_assert(VB % kVectorBlock == 0, "the kVectorBlock blocks after these must end on width");
  constexpr int64_t step = VB * Vectorized<acc_t>::size();
  int64_t p = 0;
  for (; p + step <= width; p += step) {
    multiply_block<acc_t, CB, VB>(w, cols, p, s0, s1, last, outer + p, partial + p, ldo, bias);
  }
  return p;
}

// All rows x all positions of one tap chunk, piece by piece (`piece` taps: kPiece, or
// taps_per_piece's); within a piece, positions go in the outer loop so that the piece's inputs for a
// position block stay in L1 while every channel block reads them. w: the task's packed weights
// (rows x all_taps, packed_weight_index); the chunk starts at tap t0 and cols[0..taps) are its
// inputs. width is a multiple of kVectorBlock vectors; partial has outer's shape.
template <typename acc_t>
void multiply(int64_t rows, const acc_t* w, int64_t all_taps, int64_t t0, const acc_t* const* cols, int64_t taps,
              acc_t* outer, acc_t* partial, int64_t ldo, int64_t width, const acc_t* bias, int64_t piece = kPiece) {
  constexpr int64_t V = Vectorized<acc_t>::size(), step = kVectorBlock * V;
  // Block c's weights from the chunk's first tap on.
  const int64_t cb = channel_block(rows);
  auto block_w = [&](int64_t c) { return w + c * all_taps + t0 * std::min(cb, rows - c); };
  for (int64_t s0 = 0; s0 < taps; s0 += piece) {
    const int64_t s1 = std::min(taps, s0 + piece);
    const bool last = s1 == taps;
    if (cb == kNarrowBlock) {
      multiply_narrow<acc_t>(rows, block_w, cols, s0, s1, last, outer, partial, ldo, width, bias);
      continue;
    }
    int64_t p = 0;
    // Few channels: wider position blocks keep enough independent sums in flight to hide the fused
    // multiply-add latency. AVX-512's 32 registers hold more of them than AVX2's 16: with 3 x 6
    // blocks for 3 x 2, a transposed 7x7/2 stem's 3 output channels went 2.4 -> 1.5 ms (float64) and
    // 1.2 -> 0.75 ms (float32) at 1 thread on a Zen 5.
#if defined(CPU_CAPABILITY_AVX512)
    if (rows == 1) p = multiply_few<acc_t, 1, 8>(block_w(0), cols, s0, s1, last, outer, partial, ldo, width, bias);
    if (rows == 2) p = multiply_few<acc_t, 2, 8>(block_w(0), cols, s0, s1, last, outer, partial, ldo, width, bias);
    if (rows == 3) p = multiply_few<acc_t, 3, 6>(block_w(0), cols, s0, s1, last, outer, partial, ldo, width, bias);
#else
    if (rows == 1) p = multiply_few<acc_t, 1, 6>(block_w(0), cols, s0, s1, last, outer, partial, ldo, width, bias);
    if (rows == 2) p = multiply_few<acc_t, 2, 4>(block_w(0), cols, s0, s1, last, outer, partial, ldo, width, bias);
#endif
    for (; p < width; p += step) {
      // The next position block's inputs, requested before the channel blocks work on this one.
      // Not for one channel block or less: its few multiply-adds per tap (a transposed 7x7/2
      // stem's 3 channels: 6) do not hide the requests, which took a quarter of that call's
      // kernel time; without them it went 2.8 -> 2.2 ms (float32) and 6.0 -> 4.4 ms (float64) at 1
      // thread on a Zen 3.
      if (rows > kChannelBlock && p + step < width) request_inputs(cols, s0, s1, p + step, step);
      int64_t c = 0;
      for (; c + kChannelBlock <= rows; c += kChannelBlock) {
        multiply_block<acc_t, kChannelBlock, kVectorBlock>(block_w(c), cols, p, s0, s1, last, outer + c * ldo + p,
                                                           partial + c * ldo + p, ldo, bias ? bias + c : nullptr);
      }
      const acc_t* wc = block_w(c);
      acc_t *oc = outer + c * ldo + p, *pc = partial + c * ldo + p;
      const acc_t* bc = bias ? bias + c : nullptr;
      switch (rows - c) {
        case 5: multiply_block<acc_t, 5, kVectorBlock>(wc, cols, p, s0, s1, last, oc, pc, ldo, bc); break;
        case 4: multiply_block<acc_t, 4, kVectorBlock>(wc, cols, p, s0, s1, last, oc, pc, ldo, bc); break;
        case 3: multiply_block<acc_t, 3, kVectorBlock>(wc, cols, p, s0, s1, last, oc, pc, ldo, bc); break;
        case 2: multiply_block<acc_t, 2, kVectorBlock>(wc, cols, p, s0, s1, last, oc, pc, ldo, bc); break;
        case 1: multiply_block<acc_t, 1, kVectorBlock>(wc, cols, p, s0, s1, last, oc, pc, ldo, bc); break;
        default: break;
      }
    }
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
