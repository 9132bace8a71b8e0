// Host-side construction of TMA descriptors (CUtensorMap) without linking the driver library: the
// driver's cuTensorMapEncodeTiled is looked up once through the runtime's entry-point query. The descriptors a
// thread encoded last are kept (per thread, by base address and spec), so a call that asks for one it asked for
// before (the same cache of a layer every step) gets a copy without calling the driver.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "openmla/status.h"

namespace openmla::detail {

struct TensorMapSpec {
  CUtensorMapDataType dtype;
  int rank;
  uint64_t dims[5];         // innermost first, in elements
  uint64_t byte_strides[4]; // strides of dims 1..rank-1, in bytes (multiples of 16)
  uint32_t box[5];          // box extent per dim, in elements
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2_promotion;
};

Status encode_tensor_map(CUtensorMap* map, const void* base, const TensorMapSpec& spec, const char* what);

// The TMA map of one packed (rows, heads, cols) 16-bit operand of a varlen kernel, addressed per sequence through a
// window that ends where the sequence ends (tensor_map.cpp; the device side: common/ragged_tma.cuh): rows past a
// sequence's end are outside the map (loads read zeros, stores skip them), so a neighbour's rows never reach shared
// memory. Box: 64 columns x 1 head x box_rows rows, 128B-swizzled.
// `stride_t` / `stride_h`: element strides of the token and head dimensions (multiples of 8, < 2^33); sequences and the
// tensor have at most varlen::kMaxRows rows (checked by the API).
struct RaggedOperand {
  const void* base;
  int64_t cols;
  int64_t heads;
  int64_t stride_t;
  int64_t stride_h;
  bool fp16;      // else bf16
  int box_rows;   // rows per TMA box: a tile (loads) or a warpgroup's rows (stores)
  // 1-byte elements (float8_e4m3fn, the FP8 prefill): boxes of 128 columns (128 bytes, the 128B swizzle's span), `fp16`
  // ignored; strides (elements = bytes) multiples of 16.
  bool e4m3 = false;
};
Status make_ragged_map(const RaggedOperand& op, CUtensorMap* map, const char* what);

}  // namespace openmla::detail
