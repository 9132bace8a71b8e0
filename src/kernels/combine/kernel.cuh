// Split-KV combine: merges the fp32 partials of every split request into the final out / lse.
//
// One warp per (request, partial row, column slice). kSlices = 1: lane l owns columns 4l + 128j, j = 0..3
// (four float4: a warp reads each 2 KiB partial row with four fully coalesced 512-byte loads). kSlices = 4
// (small grids only, launch.cu): grid z picks a 128-column slice and a lane owns one float4 of it. The
// splits are read kBatch at a time, all loads of a batch issued before any is used: with few requests the
// combine is latency-bound (docs/decode-schedule.md, decisions combine-v16, combine-v18: b = 2 has 11 splits
// per row). Slicing every grid (4x the CTAs, the lse pass repeated) cost the dense rows 3-9 %, hence only below a
// grid size.
//
// Math (base 2, as the main kernel stores partial lse), for chunk lse values l_i and rows O_i:
//   M = max_i l_i (0 if every chunk is empty),  S = sum_i 2^(l_i - M),  G = log2(S) + M  (+inf if S == 0)
//   lse = G * ln 2 (natural log, written before any sink adjustment: the sink never changes lse)
//   sink (natural units) s, in base 2 t = s * log2(e):  G' = max(G, t) + log2(1 + 2^-|G - t|)
//     (t = -inf: G' = G; t = +inf: G' = +inf so out = 0)
//   out = sum_i 2^(l_i - G') O_i, or 0 when G is +inf (no visible key, whatever the sink).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/epilogue.cuh"
#include "common/ptx.cuh"
#include "kernels/combine/merge_math.h"
#include "kernels/combine/params.h"

namespace openmla::kernels::combine {

using epilogue::kLn2;
using epilogue::kLog2e;
inline constexpr int kVectorStride = 32 * 4;  // columns between a lane's float4s
static_assert(kCombineHeadDim % (kCombineMaxSlices * kVectorStride) == 0, "whole float4 per lane per slice");

// Waits until the preceding kernel on the stream (launched before us; we are its programmatic
// dependent) has completed and its memory is visible. No-op when launched without PDL.
__device__ __forceinline__ void wait_for_main_kernel() { ptx::griddep_wait(); }

// NOTE: ordinary (coherent) loads, never ld.global.nc / __ldg: the data was written by the kernel we
// overlap with via PDL, and the read-only path may be reordered or served from stale lines. The pointer
// is deliberately not __restrict__ so the compiler cannot prove it read-only and switch to .nc.

template <typename Element>
__device__ __forceinline__ uint2 pack4(float a, float b, float c, float d);

template <>
__device__ __forceinline__ uint2 pack4<__nv_bfloat16>(float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b);
  __nv_bfloat162 hi = __floats2bfloat162_rn(c, d);
  return make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
}

template <>
__device__ __forceinline__ uint2 pack4<__half>(float a, float b, float c, float d) {
  __half2 lo = __floats2half2_rn(a, b);
  __half2 hi = __floats2half2_rn(c, d);
  return make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The combine of one (request, row, slice). kCapacityGuard (batch-invariant calls: combine_capped_kernel) also skips a
// request whose split slots pass p.split_capacity; without it the code is the default kernel's as it always was.
template <typename Element, int kSlices, bool kCapacityGuard>
__device__ __forceinline__ void combine_rows(const CombineParams& p) {
  constexpr int kVectorsPerLane = kCombineHeadDim / kSlices / kVectorStride;  // 4 or 1 float4
  constexpr int kColumnsPerLane = 4 * kVectorsPerLane;
  constexpr int kBatch = 4 * kSlices;  // split rows in flight per warp (the same registers either way)
  // ---- Prologue: runs while the main kernel drains (nothing here reads its output) -------------------
  const int req = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int rows = p.s_q * p.h_q;  // partial rows per split slot
  const int row = blockIdx.y * kCombineWarps + warp;
  if (row >= rows) return;
  // num_splits comes from the scheduler, which completed before the main kernel started (the scheduler
  // is launched without PDL and never triggers early), so it is safe to read before the wait.
  const int32_t first_slot = combine_split_base(p, req);
  const int32_t num_slots = combine_split_base(p, req + 1) - first_slot;
  if (num_slots <= max(1, p.merged_in_kernel) || (kCapacityGuard && first_slot + num_slots > p.split_capacity)) {
    // Not split, or merged by the main kernel: it wrote the final result. One CTA still waits for the main
    // kernel, so that this grid never completes before it (work after the combine on the stream must see
    // every output row, whichever kernel wrote it).
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && warp == 0) wait_for_main_kernel();
    return;
  }

  const int rows_per_kv_head = p.s_q * p.q_per_kv;
  const int kv_head = row / rows_per_kv_head;
  const int packed = row - kv_head * rows_per_kv_head;
  const int s_idx = packed / p.q_per_kv;
  const int head = kv_head * p.q_per_kv + (packed - s_idx * p.q_per_kv);
  const float sink_log2 = p.attn_sink != nullptr ? p.attn_sink[head] * kLog2e : -INFINITY;

  const int64_t lse_slot_stride = rows;
  const int64_t o_slot_stride = static_cast<int64_t>(rows) * kCombineHeadDim;
  const float* lse_row = p.partial_lse + static_cast<int64_t>(first_slot) * lse_slot_stride + row;
  const int col = static_cast<int>(blockIdx.z) * (kCombineHeadDim / kSlices) + lane * 4;
  const float* o_row = p.partial_o + static_cast<int64_t>(first_slot) * o_slot_stride +
                       static_cast<int64_t>(row) * kCombineHeadDim + col;

  wait_for_main_kernel();

  // One round trip for the usual case (docs/decode-schedule.md, decision combine-v19): the chunk lse values
  // (lane i holds chunk i's) and the first batch of this lane's columns of every chunk row are all requested
  // before any is used; only requests of more than 32 chunks (lse) or kBatch chunks (rows) go back for more.
  const float lse_lane = lane < num_slots ? lse_row[lane * lse_slot_stride] : -INFINITY;
  float4 v[kBatch][kVectorsPerLane];
#pragma unroll
  for (int k = 0; k < kBatch; ++k) {
    if (k < num_slots) {
#pragma unroll
      for (int j = 0; j < kVectorsPerLane; ++j)
        v[k][j] = *reinterpret_cast<const float4*>(o_row + k * o_slot_stride + j * kVectorStride);
    }
  }
  // Chunk i's lse: from lane i's register for i < 32 (one shuffle), else from memory.
  auto chunk_lse = [&](int i) { return i < 32 ? __shfl_sync(0xffffffffu, lse_lane, i) : lse_row[i * lse_slot_stride]; };

  // ---- Global log-sum-exp over the chunks -------------------------------------------------------------
  float m = lse_lane;
  for (int i = lane + 32; i < num_slots; i += 32) m = fmaxf(m, lse_row[i * lse_slot_stride]);
  m = warp_max(m);
  const float m_safe = lse_shift(m);
  float s = lane < num_slots ? exp2f(lse_lane - m_safe) : 0.f;
  for (int i = lane + 32; i < num_slots; i += 32) s += exp2f(lse_row[i * lse_slot_stride] - m_safe);
  s = warp_sum(s);
  const float g = merged_lse_log2(s, m_safe);

  if (lane == 0 && blockIdx.z == 0) {
    p.output.lse[p.output.lse_offset(req, s_idx, head)] = g * kLn2;
  }

  // ---- Weighted sum of the chunk rows ----------------------------------------------------------------
  float acc[kColumnsPerLane];
#pragma unroll
  for (int c = 0; c < kColumnsPerLane; ++c) acc[c] = 0.f;
  if (g != INFINITY) {
    const float g_sink = add_sink_log2(g, sink_log2);
    if (g_sink != INFINITY) {  // +inf sink: the output is exactly 0
      for (int i0 = 0; i0 < num_slots; i0 += kBatch) {
        if (i0 > 0) {  // later batches (more than kBatch chunks): load them now
#pragma unroll
          for (int k = 0; k < kBatch; ++k) {
            if (i0 + k < num_slots) {
#pragma unroll
              for (int j = 0; j < kVectorsPerLane; ++j)
                v[k][j] = *reinterpret_cast<const float4*>(o_row + (i0 + k) * o_slot_stride + j * kVectorStride);
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          if (i0 + k >= num_slots) break;
          const float w = exp2f(chunk_lse(i0 + k) - g_sink);
          // An empty chunk (lse -inf) has weight 0; skipping it (warp-uniform) keeps any non-finite
          // filler in its row out of the result.
          if (w != 0.f) {
#pragma unroll
            for (int j = 0; j < kVectorsPerLane; ++j) {
              acc[4 * j + 0] = fmaf(w, v[k][j].x, acc[4 * j + 0]);
              acc[4 * j + 1] = fmaf(w, v[k][j].y, acc[4 * j + 1]);
              acc[4 * j + 2] = fmaf(w, v[k][j].z, acc[4 * j + 2]);
              acc[4 * j + 3] = fmaf(w, v[k][j].w, acc[4 * j + 3]);
            }
          }
        }
      }
    }
  }

  // ---- Store -------------------------------------------------------------------------------------------
  Element* out = static_cast<Element*>(p.output.out) + p.output.out_offset(req, s_idx, head) + col;
#pragma unroll
  for (int j = 0; j < kVectorsPerLane; ++j) {
    *reinterpret_cast<uint2*>(out + j * kVectorStride) =
        pack4<Element>(acc[4 * j + 0], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
  }
}

template <typename Element, int kSlices>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const __grid_constant__ CombineParams p) {
  combine_rows<Element, kSlices, false>(p);
}

// Batch-invariant calls (launch_invariant.cu, its own unit): the split buffers hold the chunks of the longest request
// the call's block table allows, which a schedule planned from other lengths may pass.
template <typename Element, int kSlices>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_capped_kernel(const __grid_constant__ CombineParams p) {
  combine_rows<Element, kSlices, true>(p);
}

}  // namespace openmla::kernels::combine
