// FP8 KV-cache codec kernels: the traits of each format (its layout, common/fp8_cache_layout.h, and the thread
// mapping), shared by kernel.cuh and launch.cu.
//
// Thread mapping (docs/kv-cache-formats.md, "Kernels"): one warp per token. A token's bf16 row is viewed as
// 16-byte chunks of 8 dims; lane l owns chunk l ("lo", dims 8l..8l+7) and chunk l + 32 ("hi", dims
// 256+8l..256+8l+7), so both loads of a warp are perfectly coalesced 512-byte runs. In the e4m3 domain the two
// 8-byte halves of neighbouring lanes are swapped with one shuffle so that every lane writes one 16-byte piece:
// even lanes the lo pair (chunks l, l+1), odd lanes the hi pair (chunks 31+l, 32+l). Tiles are reduced with
// xor-shuffles inside aligned lane groups; lo and hi tiles are reduced together, packed in one 32-bit word.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/fp8_cache_layout.h"

namespace openmla::kernels::kv_cache {

enum class Fp8Layout : int { kV32 = 0, kModel1 = 1 };

inline constexpr int kWarpSize = 32;
inline constexpr int kChunkDims = 8;                      // bf16 dims per 16-byte chunk
inline constexpr int kHalfDims = kWarpSize * kChunkDims;  // 256: dims covered by the lo chunks of a warp
inline constexpr int kRopeDim = fp8_cache::V32::kRopeDim;  // unquantised bf16 tail of every token (both formats)
inline constexpr int kWarpsPerBlock = 8;  // one token per warp; 8 warps = 256 threads (occupancy-friendly)
inline constexpr int kThreadsPerBlock = kWarpsPerBlock * kWarpSize;

// The bytes of each format: common/fp8_cache_layout.h (the one definition, which sparse decode reads too).
template <Fp8Layout kLayout>
using CacheLayout = std::conditional_t<kLayout == Fp8Layout::kV32, fp8_cache::V32, fp8_cache::Model1>;

// The codec's traits of one format: its layout (Cache) and how a warp's lanes cover it.
template <Fp8Layout kLayout>
struct Traits {
  using Cache = CacheLayout<kLayout>;
  static constexpr int kLanesPerTile = Cache::kTileDim / kChunkDims;  // lanes whose lo chunks form a tile
  static constexpr int kHiTileBase = kHalfDims / Cache::kTileDim;     // tile index of lane 0's hi chunk
  // Lanes whose hi chunk is still NoPE (MODEL1: 448 - 256 = 192 dims = 24 lanes; V3.2: all 32).
  static constexpr int kHiNopeLanes = (Cache::kNopeDim - kHalfDims) / kChunkDims;
  // V3.2 has 72 chunks (576 dims): its 8 RoPE chunks lie past the hi chunks and get their own lanes.
  // MODEL1 has exactly 64: its RoPE chunks are the hi chunks of lanes 24..31.
  static constexpr bool kRopeIsHi = Cache::kHeadDim == 2 * kHalfDims;

  static_assert(Cache::kRopeDim == kRopeDim, "one warp's RoPE lanes cover 64 dims");
  static_assert(Cache::kNopeDim % kChunkDims == 0 && Cache::kTileDim % kChunkDims == 0);
  static_assert(Cache::kNopeDim >= kHalfDims && Cache::kNopeDim <= 2 * kHalfDims);
  static_assert(kHalfDims % Cache::kTileDim == 0, "lo and hi halves must start on tile boundaries");
  static_assert(kLanesPerTile >= 2 && kLanesPerTile <= kWarpSize && (kLanesPerTile & (kLanesPerTile - 1)) == 0);
  static_assert(kHiNopeLanes % 2 == 0, "odd lanes store hi pairs: the NoPE/RoPE border must fall on a pair");
  static_assert(kRopeIsHi ? Cache::kHeadDim - Cache::kNopeDim == (kWarpSize - kHiNopeLanes) * kChunkDims
                          : Cache::kHeadDim == 2 * kHalfDims + kRopeDim);
  static_assert(Cache::kRopeOffset % 16 == 0 && Cache::kDataStride % 16 == 0, "16-byte vector accesses");
};

}  // namespace openmla::kernels::kv_cache
