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

}  // namespace openmla::detail
