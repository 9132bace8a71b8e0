// The two FP8 KV-cache layouts (docs/kv-cache-formats.md, section 1), defined once for the library: the codec
// writes them (kernels/kv_cache/config.h), sparse decode reads them (kernels/sparse_decode/config.h), the C++ API
// takes the sizes of a format from them (api/kv_cache.cpp), and the Python package reads them through the binding
// (`openmla._openmla.fp8_cache_layouts`, python/csrc/bind_kv_cache.cpp). Plain C++ constants, usable by host and
// device code alike.
//
// The CPU reference (reference/include/openmla_ref/fp8_codec.h) keeps its own definition of the same bytes on
// purpose: it includes nothing from src/ (docs/architecture.md), so a wrong constant here cannot make the kernels
// and their reference agree.
#pragma once

namespace openmla::fp8_cache {

// DeepSeek-V3.2 (KVCacheFormat::kFp8V32): d_qk 576, 656 bytes per token, token-interleaved records. Token r of a
// page starts at byte r * 656: [512 x e4m3 NoPE | 4 x fp32 scale (128 dims each) | 64 x bf16 RoPE].
struct V32 {
  static constexpr int kHeadDim = 576;                   // d_qk
  static constexpr int kNopeDim = 512;                   // e4m3 dims, one byte each
  static constexpr int kRopeDim = 64;                    // bf16 dims, stored bit for bit
  static constexpr int kTileDim = 128;                   // dims per scale (one quantisation tile)
  static constexpr int kNumTiles = kNopeDim / kTileDim;  // 4 scales per token
  static constexpr int kScaleBytes = 4;                  // a scale is an fp32
  static constexpr int kBytesPerToken = 656;             // the cache tensor's last dimension
  static constexpr int kDataStride = 656;                // bytes between two tokens' records in a page
  static constexpr int kScaleOffset = 512;               // the scales, inside the token's record
  static constexpr int kRopeOffset = 528;                // the RoPE dims, inside the token's record

  static_assert(kNopeDim + kRopeDim == kHeadDim && kNumTiles * kTileDim == kNopeDim);
  static_assert(kScaleOffset == kNopeDim && kRopeOffset == kScaleOffset + kNumTiles * kScaleBytes);
  static_assert(kBytesPerToken == kRopeOffset + 2 * kRopeDim && kDataStride == kBytesPerToken);
};

// MODEL1 (KVCacheFormat::kFp8Model1): d_qk 512, 584 bytes per token, block-structured pages. A page of B tokens is
// a data section, B x [448 x e4m3 NoPE | 64 x bf16 RoPE] (token r at byte r * 576), then a scale section,
// B x [7 x UE8M0 scale (64 dims each) | 1 pad byte] (token r's scales at byte B * 576 + r * 8). The 584-byte
// records of the tensor's shape do not exist.
struct Model1 {
  static constexpr int kHeadDim = 512;                   // d_qk
  static constexpr int kNopeDim = 448;                   // e4m3 dims, one byte each
  static constexpr int kRopeDim = 64;                    // bf16 dims, stored bit for bit
  static constexpr int kTileDim = 64;                    // dims per scale (one quantisation tile)
  static constexpr int kNumTiles = kNopeDim / kTileDim;  // 7 scales per token
  static constexpr int kScaleBytes = 1;                  // a scale is a UE8M0 byte: 2^(byte - 127)
  static constexpr int kBytesPerToken = 584;             // the cache tensor's last dimension
  static constexpr int kDataStride = 576;                // bytes between two tokens' data in the data section
  static constexpr int kRopeOffset = 448;                // the RoPE dims, inside the token's data
  static constexpr int kScaleStride = 8;                 // bytes between two tokens' scales in the scale section

  static_assert(kNopeDim + kRopeDim == kHeadDim && kNumTiles * kTileDim == kNopeDim);
  static_assert(kRopeOffset == kNopeDim && kDataStride == kRopeOffset + 2 * kRopeDim);
  static_assert(kScaleStride == kNumTiles * kScaleBytes + 1 && kBytesPerToken == kDataStride + kScaleStride);
};

}  // namespace openmla::fp8_cache
