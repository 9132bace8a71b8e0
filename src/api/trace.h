// The trace readers of the diagnostics build (CMake OPENMLA_TRACE=ON; docs/architecture.md, "Trace builds"), one
// place for every traced family, so the Python binding (its _*_trace functions) never names a kernel symbol that a
// build may lack. Each reader answers kUnsupported naming the CMake option when this build has no trace
// (OPENMLA_TRACE=OFF) or no kernels of the family (OPENMLA_ENABLE_<FAMILY>=OFF, api/families.h); otherwise it
// synchronises the device and copies (or clears) the trace of the family's last launch.
#pragma once

#include <cstddef>

#include "openmla/status.h"

namespace openmla::detail {

// Sparse decode: the block trace, the per-CTA timeline and the request switches of the last launch, flat
// (src/kernels/sparse_decode/kernel.cuh, struct Trace); the clear zeroes the timeline of every variant.
Status read_sparse_decode_trace(unsigned long long* host, size_t count);
Status clear_sparse_decode_trace();
// Dense decode: the request timeline of the last launch (src/kernels/dense_decode/kernel.cuh, struct Timeline).
Status read_dense_decode_timeline(unsigned long long* host, size_t count);
Status clear_dense_decode_timeline();
// Sparse prefill: the clock64 trace of the last launch with head dimension d_qk, or cleared when `clear` is set.
Status read_sparse_prefill_trace(int d_qk, unsigned long long* host, size_t count, bool clear);
// Dense MHA prefill: *count is the size of a copied trace (a layout header, then the traced CTAs); the reader copies
// (or clears) the trace of the last launch of the (d_qk, fp16) variant.
Status mha_prefill_trace_size(size_t* count);
Status read_mha_prefill_trace(int d_qk, bool fp16, unsigned long long* host, size_t count, bool clear);

}  // namespace openmla::detail
