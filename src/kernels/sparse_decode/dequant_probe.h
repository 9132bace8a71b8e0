// Test hook: runs the sparse-decode kernel's own FP8 -> BF16 dequantisation (dequant16 in kernel.cuh) on
// arbitrary bytes, so the C++ tests can check it bit for bit against the CPU codec over every e4m3 code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "openmla/status.h"

namespace openmla::kernels {

// n groups of 16 e4m3 bytes (bytes: n * 16), group i scaled by scales[i]; out: n * 16 bf16 bit patterns.
// All pointers are device memory. Synchronous (returns after the kernel finished).
Status run_fp8_dequant_probe(const uint8_t* bytes, const float* scales, uint16_t* out, int n);

}  // namespace openmla::kernels
