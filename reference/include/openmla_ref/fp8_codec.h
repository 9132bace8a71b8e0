// CPU codec of the FP8 KV-cache layouts (the truth the GPU kernels must match bit for bit).
// Formats: docs/kv-cache-formats.md and include/openmla/kv_cache.h.
//   kV32:    d_qk 576, 656 B/token, token r of a page at byte r*656:
//            [512 x e4m3 | 4 x fp32 scale (128 dims each) | 64 x bf16 RoPE]
//   kModel1: d_qk 512, 584 B/token, page of B tokens: token r's data at r*576 = [448 x e4m3 | 64 x bf16 RoPE],
//            its scales at B*576 + r*8 = [7 x UE8M0 (64 dims each) | 1 pad byte (written as 0)]
// Scale recipe per tile: amax in fp32 of the bf16 values; s = max(amax/448, 1e-4) rounded UP to a power of two;
// q = e4m3fn(x / s) round-to-nearest-even (|x/s| <= 448 always). Dequantise: float(q) * s (exact in bf16).
// Non-finite inputs (docs/kv-cache-formats.md, "Non-finite inputs"): a tile holding any NaN or +-inf is poisoned:
// its scale is stored as NaN (fp32 0x7FC00000 for V3.2, UE8M0 0xFF for MODEL1) and all its e4m3 bytes are 0x7F
// (NaN), so every dim of the tile decodes to NaN. The bf16 RoPE part is copied bit for bit. amax is taken on the
// bf16 magnitudes as integers (bits & 0x7FFF), so NaN/inf detection and amax need no float comparisons.
// Decoding to bf16 rounds float(q) * s to nearest even and writes every NaN as the canonical 0x7FC0.
// The GPU codec (src/kernels/kv_cache/) does the same arithmetic; tests compare the two bit for bit.
// The layouts are defined here independently of the library's definition (src/common/fp8_cache_layout.h), on
// purpose: the reference includes nothing from src/ (docs/architecture.md), so one wrong constant cannot make the
// kernels and their reference agree.
#pragma once

#include <cstdint>

namespace openmla::ref {

enum class Fp8Layout { kV32, kModel1 };

int64_t fp8_bytes_per_token(Fp8Layout layout);  // 656 / 584
int64_t fp8_head_dim(Fp8Layout layout);         // 576 / 512
int64_t fp8_nope_dim(Fp8Layout layout);         // 512 / 448
int64_t fp8_tile_dim(Fp8Layout layout);         // 128 / 64 (dims per scale)

// Scalar pieces (exposed for tests).
uint8_t float_to_e4m3fn(float x);  // round to nearest even, saturation never needed by the recipe (NaN -> 0x7F)
float e4m3fn_to_float(uint8_t v);
float fp8_tile_scale(float amax);  // the power-of-two scale of the recipe

// Encode token `row` of a page (page_base points at the page's first byte; page_size tokens per page).
// `src` holds d_qk bf16 bit patterns.
void fp8_encode_token(Fp8Layout layout, const uint16_t* src, uint8_t* page_base, int64_t page_size, int64_t row);
// Decode token `row` of a page into d_qk floats (each exactly a bf16 value).
void fp8_decode_token(Fp8Layout layout, const uint8_t* page_base, int64_t page_size, int64_t row, float* dst);
// Same, as bf16 bit patterns.
void fp8_decode_token_bf16(Fp8Layout layout, const uint8_t* page_base, int64_t page_size, int64_t row, uint16_t* dst);

// ---- Extensions (compatible additions) -------------------------------------------------------------------------
inline constexpr float kFp8E4M3Max = 448.0f;     // largest finite float8_e4m3fn
inline constexpr float kFp8MinScaleArg = 1e-4f;  // floor of amax / 448 before the power-of-two rounding
inline constexpr uint8_t kFp8E4M3NaN = 0x7F;     // the byte a poisoned (non-finite) tile stores
inline constexpr uint8_t kUe8m0NaN = 0xFF;       // the UE8M0 byte of a poisoned tile's scale

// UE8M0 byte of a power-of-two scale (its biased fp32 exponent); NaN or infinite -> 0xFF.
uint8_t fp8_scale_to_ue8m0(float scale);
// Value of a UE8M0 byte: 2^(e-127) (0 -> 2^-127, a subnormal float), 0xFF -> NaN.
float fp8_ue8m0_to_float(uint8_t e);
// The bf16 bit pattern the decoder writes for a decoded float: round to nearest even, NaN -> 0x7FC0.
uint16_t fp8_decoded_float_to_bf16(float v);
// Byte offset, inside a page of `page_size` tokens, of token `row`'s scales: V3.2 row*656 + 512,
// MODEL1 page_size*576 + row*8 (the scale section follows the data section).
int64_t fp8_scale_offset(Fp8Layout layout, int64_t page_size, int64_t row);
// Byte offset, inside a page, of token `row`'s e4m3 data (row*656 / row*576); its bf16 RoPE start 528 / 448 bytes
// later.
int64_t fp8_data_offset(Fp8Layout layout, int64_t row);

// Whole pages. `src`/`dst` hold page_size rows of d_qk bf16 bit patterns, `row_stride` elements apart.
void fp8_encode_page(Fp8Layout layout, const uint16_t* src, int64_t row_stride, uint8_t* page_base, int64_t page_size);
void fp8_decode_page_bf16(Fp8Layout layout, const uint8_t* page_base, int64_t page_size, uint16_t* dst,
                          int64_t row_stride);

}  // namespace openmla::ref
