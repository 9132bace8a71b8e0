// CPU codec of the FP8 KV-cache layouts (the truth the GPU kernels must match bit for bit).
// Formats: ../shared/docs/flashmla-facts.md section 2 and include/openmla/kv_cache.h.
//   kV32:    d_qk 576, 656 B/token, token r of a page at byte r*656:
//            [512 x e4m3 | 4 x fp32 scale (128 dims each) | 64 x bf16 RoPE]
//   kModel1: d_qk 512, 584 B/token, page of B tokens: token r's data at r*576 = [448 x e4m3 | 64 x bf16 RoPE],
//            its scales at B*576 + r*8 = [7 x UE8M0 (64 dims each) | 1 pad byte (written as 0)]
// Scale recipe per tile: amax in fp32 of the bf16 values; s = max(amax/448, 1e-4) rounded UP to a power of two;
// q = e4m3fn(x / s) round-to-nearest-even (|x/s| <= 448 always). Dequantise: float(q) * s (exact in bf16).
// Non-finite inputs: a NaN in a tile makes its amax NaN; the result is defined by the same arithmetic as the GPU
// codec (documented in docs/kv-cache-formats.md); tests compare the two bit for bit.
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

}  // namespace openmla::ref
