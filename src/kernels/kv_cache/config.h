// FP8 KV-cache codec kernels: layout traits and the thread mapping, shared by kernel.cuh and launch.cu.
//
// Thread mapping (docs/kv-cache-formats.md, "Kernels"): one warp per token. A token's bf16 row is viewed as
// 16-byte chunks of 8 dims; lane l owns chunk l ("lo", dims 8l..8l+7) and chunk l + 32 ("hi", dims
// 256+8l..256+8l+7), so both loads of a warp are perfectly coalesced 512-byte runs. In the e4m3 domain the two
// 8-byte halves of neighbouring lanes are swapped with one shuffle so that every lane writes one 16-byte piece:
// even lanes the lo pair (chunks l, l+1), odd lanes the hi pair (chunks 31+l, 32+l). Tiles are reduced with
// xor-shuffles inside aligned lane groups; lo and hi tiles are reduced together, packed in one 32-bit word.
#pragma once

#include <cstdint>

namespace openmla::kernels::kv_cache {

enum class Fp8Layout : int { kV32 = 0, kModel1 = 1 };

inline constexpr int kWarpSize = 32;
inline constexpr int kChunkDims = 8;                      // bf16 dims per 16-byte chunk
inline constexpr int kHalfDims = kWarpSize * kChunkDims;  // 256: dims covered by the lo chunks of a warp
inline constexpr int kRopeDim = 64;                       // unquantised bf16 tail of every token
inline constexpr int kWarpsPerBlock = 8;  // one token per warp; 8 warps = 256 threads (occupancy-friendly)
inline constexpr int kThreadsPerBlock = kWarpsPerBlock * kWarpSize;

template <Fp8Layout kLayout>
struct LayoutTraits;

// DeepSeek-V3.2: 656 B/token, token-interleaved [512 e4m3 | 4 x fp32 scale | 64 bf16 RoPE].
template <>
struct LayoutTraits<Fp8Layout::kV32> {
  static constexpr int kHeadDim = 576;
  static constexpr int kNopeDim = 512;
  static constexpr int kTileDim = 128;
  static constexpr int kNumTiles = kNopeDim / kTileDim;  // 4
  static constexpr int kBytesPerToken = 656;
  static constexpr int kDataStride = 656;         // bytes between consecutive tokens' data inside a page
  static constexpr int kInlineScaleOffset = 512;  // scales inside the token record
  static constexpr int kRopeOffset = 528;         // bf16 RoPE inside the token record
};

// MODEL1: 584 B/token, block-structured: B x [448 e4m3 | 64 bf16 RoPE] then B x [7 UE8M0 | pad].
template <>
struct LayoutTraits<Fp8Layout::kModel1> {
  static constexpr int kHeadDim = 512;
  static constexpr int kNopeDim = 448;
  static constexpr int kTileDim = 64;
  static constexpr int kNumTiles = kNopeDim / kTileDim;  // 7
  static constexpr int kBytesPerToken = 584;
  static constexpr int kDataStride = 576;  // data section record; the scale section follows B of them
  static constexpr int kScaleStride = 8;   // scale section record: 7 UE8M0 + 1 pad byte
  static constexpr int kRopeOffset = 448;
};

template <Fp8Layout kLayout>
struct MappingTraits {
  using Layout = LayoutTraits<kLayout>;
  static constexpr int kLanesPerTile = Layout::kTileDim / kChunkDims;  // lanes whose lo chunks form a tile
  static constexpr int kHiTileBase = kHalfDims / Layout::kTileDim;     // tile index of lane 0's hi chunk
  // Lanes whose hi chunk is still NoPE (MODEL1: 448 - 256 = 192 dims = 24 lanes; V3.2: all 32).
  static constexpr int kHiNopeLanes = (Layout::kNopeDim - kHalfDims) / kChunkDims;
  // V3.2 has 72 chunks (576 dims): its 8 RoPE chunks lie past the hi chunks and get their own lanes.
  // MODEL1 has exactly 64: its RoPE chunks are the hi chunks of lanes 24..31.
  static constexpr bool kRopeIsHi = Layout::kHeadDim == 2 * kHalfDims;

  static_assert(Layout::kNopeDim % kChunkDims == 0 && Layout::kTileDim % kChunkDims == 0);
  static_assert(Layout::kNopeDim >= kHalfDims && Layout::kNopeDim <= 2 * kHalfDims);
  static_assert(kHalfDims % Layout::kTileDim == 0, "lo and hi halves must start on tile boundaries");
  static_assert(kLanesPerTile >= 2 && kLanesPerTile <= kWarpSize && (kLanesPerTile & (kLanesPerTile - 1)) == 0);
  static_assert(kHiNopeLanes % 2 == 0, "odd lanes store hi pairs: the NoPE/RoPE border must fall on a pair");
  static_assert(kRopeIsHi ? Layout::kHeadDim - Layout::kNopeDim == (kWarpSize - kHiNopeLanes) * kChunkDims
                          : Layout::kHeadDim == 2 * kHalfDims + kRopeDim);
  static_assert(Layout::kRopeOffset % 16 == 0 && Layout::kDataStride % 16 == 0, "16-byte vector accesses");
  static_assert(Layout::kNopeDim + 2 * kRopeDim == Layout::kDataStride ||
                Layout::kNopeDim + 2 * kRopeDim + 4 * Layout::kNumTiles == Layout::kBytesPerToken);
};

}  // namespace openmla::kernels::kv_cache
