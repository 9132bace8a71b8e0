// FP8 KV-cache codec: device code. One warp per token; see config.h for the lane mapping and
// docs/kv-cache-formats.md for the numerics. Every step mirrors reference/src/fp8_codec.cpp so the results are
// bit-identical: integer amax on the bf16 magnitudes, IEEE division by 448, power-of-two rounding on the bits,
// exact multiplication by 2^-k, e4m3 round-to-nearest-even (cvt.rn.satfinite), poisoned tiles written
// explicitly (never left to the hardware's NaN conventions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/kv_cache/config.h"
#include "kernels/kv_cache/launch.h"

namespace openmla::kernels::kv_cache {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
inline constexpr uint32_t kNaNScaleBits = 0x7FC00000u;    // fp32 scale of a poisoned tile (UE8M0: 0xFF)
inline constexpr uint32_t kPoisonedE4M3x4 = 0x7F7F7F7Fu;  // four e4m3 NaN bytes
inline constexpr uint32_t kBf16InfBits = 0x7F80u;         // magnitudes at or above are inf / NaN
inline constexpr uint16_t kBf16CanonicalNaN = 0x7FC0u;

// ---------------------------------------------------------------------------------------------------------------
// Memory access: 16-byte vectors only (every address is 16-byte aligned by the validation rules).
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// ---------------------------------------------------------------------------------------------------------------
// Numerics
// ---------------------------------------------------------------------------------------------------------------
// Largest bf16 magnitude bit pattern (bits & 0x7FFF) of a chunk of 8 bf16. Integer order = numeric order for
// non-negative IEEE values, and inf/NaN patterns sort above every finite one.
__device__ __forceinline__ uint32_t chunk_amax_bits(uint4 c) {
  constexpr uint32_t kAbs = 0x7FFF7FFFu;
  const uint32_t m = __vmaxu2(__vmaxu2(c.x & kAbs, c.y & kAbs), __vmaxu2(c.z & kAbs, c.w & kAbs));
  return max(m & 0xFFFFu, m >> 16);
}

// fp32 bits of the tile scale 2^ceil(log2(max(amax / 448, 1e-4))), or kNaNScaleBits for a non-finite tile.
__device__ __forceinline__ uint32_t tile_scale_bits(uint32_t amax_bf16_bits) {
  if (amax_bf16_bits >= kBf16InfBits) return kNaNScaleBits;
  const float amax = __uint_as_float(amax_bf16_bits << 16);
  const float s = fmaxf(__fdiv_rn(amax, 448.0f), 1e-4f);  // IEEE division: the CPU codec divides too
  uint32_t u = __float_as_uint(s);
  if (u & 0x007FFFFFu) u = (u & 0x7F800000u) + 0x00800000u;  // not a power of two: next exponent
  return u;
}

// Two bf16 (packed in one word, low half first) times 2^-k -> two e4m3 bytes (low byte first).
__device__ __forceinline__ uint32_t quantize_pair(uint32_t w, float inv_scale) {
  const float2 f = make_float2(__fmul_rn(__uint_as_float(w << 16), inv_scale),
                               __fmul_rn(__uint_as_float(w & 0xFFFF0000u), inv_scale));
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3));
}

// 8 bf16 -> 8 e4m3 bytes with the tile scale `scale_bits`.
__device__ __forceinline__ uint2 quantize_chunk(uint4 c, uint32_t scale_bits) {
  if (scale_bits == kNaNScaleBits) return make_uint2(kPoisonedE4M3x4, kPoisonedE4M3x4);
  // 1/s = 2^(127 - e) has biased exponent 254 - e; e is in [114, 247], so 1/s is a normal float and
  // x * (1/s) equals x / s bit for bit.
  const float inv_scale = __uint_as_float((254u - (scale_bits >> 23)) << 23);
  return make_uint2(quantize_pair(c.x, inv_scale) | (quantize_pair(c.y, inv_scale) << 16),
                    quantize_pair(c.z, inv_scale) | (quantize_pair(c.w, inv_scale) << 16));
}

// Decoded value -> bf16 bits: round to nearest even (exact for every value the encoder writes), NaN canonical.
__device__ __forceinline__ uint32_t decoded_to_bf16(float v) {
  if (isnan(v)) return kBf16CanonicalNaN;
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Two e4m3 bytes (low byte first) times `scale` -> two bf16 packed in one word.
__device__ __forceinline__ uint32_t dequantize_pair(uint32_t q2, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q2), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));  // exact: every e4m3 value is an fp16 value
  return decoded_to_bf16(__fmul_rn(f.x, scale)) | (decoded_to_bf16(__fmul_rn(f.y, scale)) << 16);
}

__device__ __forceinline__ uint4 dequantize_chunk(uint2 q, float scale) {
  return make_uint4(dequantize_pair(q.x & 0xFFFFu, scale), dequantize_pair(q.x >> 16, scale),
                    dequantize_pair(q.y & 0xFFFFu, scale), dequantize_pair(q.y >> 16, scale));
}

// Value of a UE8M0 byte, as the CPU codec defines it: 2^(e-127); 0 -> 2^-127 (subnormal); 0xFF -> NaN.
__device__ __forceinline__ float ue8m0_to_float(uint32_t e) {
  if (e == 0xFFu) return __uint_as_float(kNaNScaleBits);
  if (e == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(e << 23);
}

__device__ __forceinline__ uint2 shuffle_xor(uint2 v, int mask) {
  return make_uint2(__shfl_xor_sync(kFullMask, v.x, mask), __shfl_xor_sync(kFullMask, v.y, mask));
}

// ---------------------------------------------------------------------------------------------------------------
// One token, one warp. `src`/`dst` point at the token's bf16 row (16-byte aligned, d_qk contiguous values);
// `page_base` at its FP8 page.
// ---------------------------------------------------------------------------------------------------------------
template <Fp8Layout kLayout>
__device__ __forceinline__ void encode_token(const uint16_t* __restrict__ src, uint8_t* __restrict__ page_base,
                                             int64_t page_size, int64_t row, int lane) {
  using T = Traits<kLayout>;
  using Cache = typename T::Cache;
  const uint4* src_chunks = reinterpret_cast<const uint4*>(src);

  // ---- loads: two coalesced 512-byte runs (+ the V3.2 RoPE tail on 8 lanes), all issued before any use
  const uint4 lo = load16(src_chunks + lane);
  const uint4 hi = load16(src_chunks + kWarpSize + lane);
  uint4 rope_tail = make_uint4(0, 0, 0, 0);
  if constexpr (!T::kRopeIsHi) {
    if (lane < kRopeDim / kChunkDims) rope_tail = load16(src_chunks + 2 * kWarpSize + lane);
  }

  // ---- tile amax: lo and hi tiles reduced together (two 15-bit magnitudes in one word)
  uint32_t amax = chunk_amax_bits(lo) | (chunk_amax_bits(hi) << 16);
#pragma unroll
  for (int offset = T::kLanesPerTile / 2; offset > 0; offset /= 2)
    amax = __vmaxu2(amax, __shfl_xor_sync(kFullMask, amax, offset));
  const uint32_t scale_lo = tile_scale_bits(amax & 0xFFFFu);
  const uint32_t scale_hi = tile_scale_bits(amax >> 16);  // MODEL1 lanes >= 24: RoPE, unused

  // ---- quantise, then swap halves with the neighbour so each lane owns one 16-byte piece of e4m3 bytes
  const uint2 q_lo = quantize_chunk(lo, scale_lo);
  const uint2 q_hi = quantize_chunk(hi, scale_hi);
  const bool odd = lane & 1;
  const uint2 received = shuffle_xor(odd ? q_lo : q_hi, 1);
  const uint4 piece =
      odd ? make_uint4(received.x, received.y, q_hi.x, q_hi.y) : make_uint4(q_lo.x, q_lo.y, received.x, received.y);

  uint8_t* data = page_base + row * Cache::kDataStride;
  const int pair = lane >> 1;
  if (!odd)
    store16(data + 16 * pair, piece);  // e4m3 bytes [0, 256)
  else if (lane < T::kHiNopeLanes)
    store16(data + kHalfDims + 16 * pair, piece);  // [256, nope)

  // ---- RoPE: bf16 bits copied through
  if constexpr (T::kRopeIsHi) {
    if (lane >= T::kHiNopeLanes) store16(data + Cache::kRopeOffset + 16 * (lane - T::kHiNopeLanes), hi);
  } else {
    if (lane < kRopeDim / kChunkDims) store16(data + Cache::kRopeOffset + 16 * lane, rope_tail);
  }

  // ---- scales: tile k's scale sits in the lanes of its group; gather them to lane 0
  uint32_t scales[Cache::kNumTiles];
#pragma unroll
  for (int k = 0; k < Cache::kNumTiles; ++k) {
    const bool from_hi = k >= T::kHiTileBase;
    const int src_lane = (from_hi ? k - T::kHiTileBase : k) * T::kLanesPerTile;
    scales[k] = __shfl_sync(kFullMask, from_hi ? scale_hi : scale_lo, src_lane);
  }
  if (lane == 0) {
    if constexpr (kLayout == Fp8Layout::kV32) {
      static_assert(Cache::kNumTiles == 4);
      store16(data + Cache::kScaleOffset, make_uint4(scales[0], scales[1], scales[2], scales[3]));
    } else {
      static_assert(Cache::kNumTiles == 7);
      // UE8M0 = the biased exponent; the NaN scale 0x7FC00000 gives 0xFF. Byte 7 is the pad, written as 0.
      uint32_t e[8];
#pragma unroll
      for (int k = 0; k < 7; ++k) e[k] = (scales[k] >> 23) & 0xFFu;
      e[7] = 0;
      const uint2 packed = make_uint2(e[0] | (e[1] << 8) | (e[2] << 16) | (e[3] << 24),
                                      e[4] | (e[5] << 8) | (e[6] << 16) | (e[7] << 24));
      *reinterpret_cast<uint2*>(page_base + page_size * Cache::kDataStride + row * Cache::kScaleStride) = packed;
    }
  }
}

template <Fp8Layout kLayout>
__device__ __forceinline__ void decode_token(const uint8_t* __restrict__ page_base, int64_t page_size, int64_t row,
                                             uint16_t* __restrict__ dst, int lane) {
  using T = Traits<kLayout>;
  using Cache = typename T::Cache;
  const uint8_t* data = page_base + row * Cache::kDataStride;
  const bool odd = lane & 1;
  const int pair = lane >> 1;
  const int group = lane / T::kLanesPerTile;  // lo tile index; hi tile = kHiTileBase + group

  // ---- loads: one 16-byte e4m3 piece per lane (mirror of the encoder), the scales (a broadcast), RoPE
  uint4 piece = make_uint4(0, 0, 0, 0);
  if (!odd)
    piece = load16(data + 16 * pair);
  else if (lane < T::kHiNopeLanes)
    piece = load16(data + kHalfDims + 16 * pair);
  uint4 rope = make_uint4(0, 0, 0, 0);
  if constexpr (T::kRopeIsHi) {
    if (lane >= T::kHiNopeLanes) rope = load16(data + Cache::kRopeOffset + 16 * (lane - T::kHiNopeLanes));
  } else {
    if (lane < kRopeDim / kChunkDims) rope = load16(data + Cache::kRopeOffset + 16 * lane);
  }
  float scale_lo, scale_hi;
  if constexpr (kLayout == Fp8Layout::kV32) {
    const uint4 s = load16(data + Cache::kScaleOffset);  // fp32 scales of tiles 0..3
    static_assert(T::kHiTileBase == 2 && T::kLanesPerTile == 16);
    scale_lo = __uint_as_float(group == 0 ? s.x : s.y);
    scale_hi = __uint_as_float(group == 0 ? s.z : s.w);
  } else {
    const uint2 s = *reinterpret_cast<const uint2*>(page_base + page_size * Cache::kDataStride +
                                                    row * Cache::kScaleStride);  // 7 UE8M0 + pad
    static_assert(T::kHiTileBase == 4 && T::kLanesPerTile == 8);
    scale_lo = ue8m0_to_float((s.x >> (8 * group)) & 0xFFu);
    scale_hi = ue8m0_to_float((s.y >> (8 * group)) & 0xFFu);  // group 3: the pad byte, unused (RoPE lanes)
  }

  // ---- undo the encoder's swap: even lanes hold (own lo, neighbour lo), odd lanes (neighbour hi, own hi)
  const uint2 received = shuffle_xor(odd ? make_uint2(piece.x, piece.y) : make_uint2(piece.z, piece.w), 1);
  const uint2 q_lo = odd ? received : make_uint2(piece.x, piece.y);
  const uint2 q_hi = odd ? make_uint2(piece.z, piece.w) : received;

  uint4* dst_chunks = reinterpret_cast<uint4*>(dst);
  store16(dst_chunks + lane, dequantize_chunk(q_lo, scale_lo));
  if constexpr (T::kRopeIsHi) {
    store16(dst_chunks + kWarpSize + lane, lane < T::kHiNopeLanes ? dequantize_chunk(q_hi, scale_hi) : rope);
  } else {
    store16(dst_chunks + kWarpSize + lane, dequantize_chunk(q_hi, scale_hi));
    if (lane < kRopeDim / kChunkDims) store16(dst_chunks + 2 * kWarpSize + lane, rope);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels: a warp per token; warps past the end (or skipped slots) leave as a whole, so every shuffle above
// runs with the full mask.
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ int64_t warp_token_index() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
}

// Page and row of a token index (quantise / dequantise) or a cache slot (append). One 32-bit division: the
// launcher guarantees index < num_blocks * page_size <= INT32_MAX.
struct PagePosition {
  uint32_t page;
  int64_t row;
};
__device__ __forceinline__ PagePosition page_position(int64_t index, int64_t page_size) {
  const uint32_t page = static_cast<uint32_t>(index) / static_cast<uint32_t>(page_size);
  return {page, index - static_cast<int64_t>(page) * page_size};
}

template <Fp8Layout kLayout>
__global__ void __launch_bounds__(kThreadsPerBlock) quantize_kernel(const QuantizeParams params) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t token = warp_token_index();
  if (token >= params.num_blocks * params.page_size) return;
  const auto [page, row] = page_position(token, params.page_size);
  const uint16_t* src =
      static_cast<const uint16_t*>(params.src) + page * params.src_page_stride + row * params.src_row_stride;
  uint8_t* page_base = static_cast<uint8_t*>(params.dst) + page * params.dst_page_stride;
  encode_token<kLayout>(src, page_base, params.page_size, row, lane);
}

template <Fp8Layout kLayout>
__global__ void __launch_bounds__(kThreadsPerBlock) dequantize_kernel(const DequantizeParams params) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t token = warp_token_index();
  if (token >= params.num_blocks * params.page_size) return;
  const auto [page, row] = page_position(token, params.page_size);
  const uint8_t* page_base = static_cast<const uint8_t*>(params.src) + page * params.src_page_stride;
  uint16_t* dst = static_cast<uint16_t*>(params.dst) + page * params.dst_page_stride + row * params.dst_row_stride;
  decode_token<kLayout>(page_base, params.page_size, row, dst, lane);
}

template <Fp8Layout kLayout, typename SlotT>
__global__ void __launch_bounds__(kThreadsPerBlock) append_kernel(const AppendParams params) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t token = warp_token_index();
  if (token >= params.num_new) return;
  const int64_t slot = static_cast<int64_t>(static_cast<const SlotT*>(params.slots)[token]);
  // NOTE: negative slots are padding; slots past the cache cannot be checked on the host without a sync, so
  // they are skipped here too rather than written out of bounds.
  if (slot < 0 || slot >= params.num_blocks * params.page_size) return;
  const auto [page, row] = page_position(slot, params.page_size);  // slot < 2^31, checked above
  const uint16_t* src = static_cast<const uint16_t*>(params.new_kv) + token * params.new_kv_row_stride;
  uint8_t* page_base = static_cast<uint8_t*>(params.cache) + page * params.cache_page_stride;
  encode_token<kLayout>(src, page_base, params.page_size, row, lane);
}

}  // namespace openmla::kernels::kv_cache
