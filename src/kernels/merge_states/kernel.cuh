// merge_attn_states: combines P partial attention states per (token, head) row into one (include/openmla/merge.h,
// docs/merge-states.md).
//
// One warp per row (config.h). Per row:
//   1. statistics: lane i reads lse_i (i < 32; more partials in steps of 32), the warp reduces the max over the
//      non-empty partials (+-inf = empty) and whether any is non-empty, then the sum of exp(lse_i - m);
//   2. lse_out = m + ln(sum), written by lane 0 (+inf when every partial is empty);
//   3. for each of the lane's 8-column chunks: acc = sum_i exp(lse_i - m) o_i over the partials in index order
//      (kPartialsInFlight chunk loads issued before their multiply-adds), out = acc / sum, rounded once.
// An empty partial's chunk is never loaded (its weight is 0 and its value is taken as 0), so NaN or garbage in it
// cannot reach the result; a NaN lse is not empty and makes the row NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/merge_states/config.h"
#include "kernels/merge_states/params.h"

namespace openmla::kernels::merge_states {

inline constexpr unsigned kFullMask = 0xffffffffu;

// ---- Element access: 8 consecutive columns ---------------------------------------------------------------------
// A chunk is loaded raw (16 bytes of bf16 / fp16, 32 of fp32) and widened to floats only at its multiply-add, so the
// kPartialsInFlight chunks in flight cost 4 (or 8) registers each, not 8 floats. The inputs are read once:
// streaming loads (evict-first), so they do not push the caller's data out of L2.
template <typename T>
struct RawChunk {
  uint4 bits;
};
template <>
struct RawChunk<float> {
  float4 lo, hi;
};

template <typename T>
__device__ __forceinline__ RawChunk<T> load_chunk(const T* src) {
  return RawChunk<T>{__ldcs(reinterpret_cast<const uint4*>(src))};
}
template <>
__device__ __forceinline__ RawChunk<float> load_chunk<float>(const float* src) {
  return RawChunk<float>{__ldcs(reinterpret_cast<const float4*>(src)), __ldcs(reinterpret_cast<const float4*>(src) + 1)};
}

template <typename T>
__device__ __forceinline__ RawChunk<T> zero_chunk() {
  return RawChunk<T>{make_uint4(0u, 0u, 0u, 0u)};  // +0.0 in bf16 and fp16
}
template <>
__device__ __forceinline__ RawChunk<float> zero_chunk<float>() {
  return RawChunk<float>{make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
}

// acc[c] += w * chunk[c], c = 0..7.
__device__ __forceinline__ void fma_chunk(float w, const RawChunk<__nv_bfloat16>& x, float (&acc)[kChunkElems]) {
  const uint32_t words[4] = {x.bits.x, x.bits.y, x.bits.z, x.bits.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[j]));
    acc[2 * j] = fmaf(w, f.x, acc[2 * j]);
    acc[2 * j + 1] = fmaf(w, f.y, acc[2 * j + 1]);
  }
}
__device__ __forceinline__ void fma_chunk(float w, const RawChunk<__half>& x, float (&acc)[kChunkElems]) {
  const uint32_t words[4] = {x.bits.x, x.bits.y, x.bits.z, x.bits.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[j]));
    acc[2 * j] = fmaf(w, f.x, acc[2 * j]);
    acc[2 * j + 1] = fmaf(w, f.y, acc[2 * j + 1]);
  }
}
__device__ __forceinline__ void fma_chunk(float w, const RawChunk<float>& x, float (&acc)[kChunkElems]) {
  const float v[kChunkElems] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w, x.hi.x, x.hi.y, x.hi.z, x.hi.w};
#pragma unroll
  for (int c = 0; c < kChunkElems; ++c) acc[c] = fmaf(w, v[c], acc[c]);
}

template <typename T>
__device__ __forceinline__ void store_chunk(T* dst, const float (&v)[kChunkElems]);

template <>
__device__ __forceinline__ void store_chunk<__nv_bfloat16>(__nv_bfloat16* dst, const float (&v)[kChunkElems]) {
  uint32_t words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    words[j] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

template <>
__device__ __forceinline__ void store_chunk<__half>(__half* dst, const float (&v)[kChunkElems]) {
  uint32_t words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2 pair = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
    words[j] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

template <>
__device__ __forceinline__ void store_chunk<float>(float* dst, const float (&v)[kChunkElems]) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// ---- Row statistics ---------------------------------------------------------------------------------------------
// +inf (a decode row without keys) and -inf (an empty sum) both mark an empty partial. NaN is not empty.
__device__ __forceinline__ bool is_empty(float lse) { return fabsf(lse) == INFINITY; }

// Butterfly reductions: every lane ends with the same value (each step adds or compares two equal-order operands,
// and fp addition is commutative), so the result is the same whichever lane uses it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

struct RowStats {
  float shift;    // m, the max over the non-empty partials; 0 when there is no finite one (exp stays finite)
  float inv_sum;  // 1 / sum_i exp(lse_i - shift); 0 when every partial is empty (out is then exactly 0)
  float lse;      // shift + ln(sum), or +inf when every partial is empty
};

// `lse_lane`: lane i's partial lse (i < num_partials), -inf past the last; partials from 32 on come from memory.
__device__ __forceinline__ RowStats row_stats(const float* lse_row, int64_t stride, int num_partials, float lse_lane,
                                              int lane) {
  float m = -INFINITY;
  bool any = false;
  for (int i = lane; i < num_partials; i += kWarpSize) {
    const float l = i < kWarpSize ? lse_lane : lse_row[i * stride];
    if (!is_empty(l)) {
      m = fmaxf(m, l);  // fmaxf ignores NaN: a NaN partial shows up in the sum below
      any = true;
    }
  }
  m = warp_max(m);
  any = __any_sync(kFullMask, any);
  RowStats s;
  s.shift = m == -INFINITY ? 0.f : m;
  float sum = 0.f;
  for (int i = lane; i < num_partials; i += kWarpSize) {
    const float l = i < kWarpSize ? lse_lane : lse_row[i * stride];
    if (!is_empty(l)) sum += expf(l - s.shift);
  }
  sum = warp_sum(sum);  // >= 1 when a finite partial exists (the max contributes exp(0)); NaN with a NaN lse
  s.inv_sum = any ? 1.f / sum : 0.f;
  s.lse = any ? s.shift + logf(sum) : INFINITY;
  return s;
}

// ---- Kernel -----------------------------------------------------------------------------------------------------
template <typename In, typename Out>
__global__ void __launch_bounds__(kThreadsPerCta)
    merge_states_kernel(const __grid_constant__ MergeStatesParams p) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + warp;
  if (row >= p.rows) return;  // warp-uniform
  const int64_t token = row / p.heads;
  const int64_t head = row - token * p.heads;

  const float* lse_row = p.lses + token * p.lses_stride_token + head * p.lses_stride_head;
  const int64_t lse_stride = p.lses_stride_partial;
  const float lse_lane = lane < p.num_partials ? lse_row[lane * lse_stride] : -INFINITY;
  const RowStats s = row_stats(lse_row, lse_stride, p.num_partials, lse_lane, lane);
  if (lane == 0 && p.lse_out != nullptr)
    p.lse_out[token * p.lse_out_stride_token + head * p.lse_out_stride_head] = s.lse;

  // Partial i's lse: lane i's register for i < 32 (one shuffle, warp-uniform i), else from memory.
  auto partial_lse = [&](int i) {
    return i < kWarpSize ? __shfl_sync(kFullMask, lse_lane, i) : lse_row[i * lse_stride];
  };

  const In* o_row = static_cast<const In*>(p.outs) + token * p.outs_stride_token + head * p.outs_stride_head;
  Out* out_row = static_cast<Out*>(p.out) + token * p.out_stride_token + head * p.out_stride_head;
  // NOTE: every lane runs the partial loop (the shuffles need the whole warp); lanes past d_v load and store nothing.
  for (int col0 = 0; col0 < p.d_v; col0 += kWarpColumns) {
    const int col = col0 + lane * kChunkElems;
    const bool active = col < p.d_v;
    float acc[kChunkElems];
#pragma unroll
    for (int c = 0; c < kChunkElems; ++c) acc[c] = 0.f;
    for (int i0 = 0; i0 < p.num_partials; i0 += kPartialsInFlight) {
      float w[kPartialsInFlight];
      RawChunk<In> v[kPartialsInFlight];
#pragma unroll
      for (int k = 0; k < kPartialsInFlight; ++k) {
        const int i = i0 + k;
        const float l = i < p.num_partials ? partial_lse(i) : -INFINITY;
        const bool empty = is_empty(l);
        w[k] = empty ? 0.f : expf(l - s.shift);
        v[k] = active && !empty ? load_chunk<In>(o_row + i * p.outs_stride_partial + col) : zero_chunk<In>();
      }
#pragma unroll
      for (int k = 0; k < kPartialsInFlight; ++k) fma_chunk(w[k], v[k], acc);
    }
    if (active) {
#pragma unroll
      for (int c = 0; c < kChunkElems; ++c) acc[c] *= s.inv_sum;
      store_chunk<Out>(out_row + col, acc);
    }
  }
}

}  // namespace openmla::kernels::merge_states
