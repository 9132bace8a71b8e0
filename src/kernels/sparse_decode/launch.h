// Host launcher of the sparse FP8 MLA decode main kernel. Arguments arrive validated and the launch plan's choices
// (crossover pairs or the plain kernel, host-computed records: heuristics::plan_sparse_decode_launch) are already
// in the params; the launcher turns the cache layout and the crossover flag into the compiled variant, sets the
// shared-memory size and the cluster shape, and launches on the caller's stream (no sync, no allocation). The
// combine kernel is launched separately (kernels/combine).
#pragma once

#include <cuda_runtime.h>

#include "kernels/sparse_decode/config.h"
#include "kernels/sparse_decode/params.h"
#include "openmla/status.h"
#if defined(OPENMLA_HAS_TRACE)
#include "common/trace_symbols.cuh"
#endif

namespace openmla::kernels {

// Grid (num_head_blocks, s_q, num_sm_parts), Common::kThreads threads, clusters of 2 along x when `crossover`.
Status launch_sparse_decode(const SparseDecodeParams& params, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// Trace builds only (CMake -DOPENMLA_TRACE=ON; api/trace.h): copies the trace of the last launch (config.h, struct
// Trace; format common/trace_format.h; variant code: 1 for MODEL1 | 2 for crossover) to host[0,
// Trace::Format::kValues), synchronising the device first, or zeroes the trace of every variant when `clear` is set.
Status sparse_decode_trace(unsigned long long* host, size_t count, bool clear);
#endif

namespace sparse_decode {

// One compiled variant: its definition is launch_variant.cuh, its one instantiation instantiations/<variant>.cu.
template <Layout L, bool kCrossover>
Status launch_variant(const SparseDecodeParams& params, cudaStream_t stream);
// The batch-invariant kernel's variant (params.chunk_blocks > 0): instantiations/<variant>_invariant.cu.
template <Layout L, bool kCrossover>
Status launch_invariant_variant(const SparseDecodeParams& params, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// The variant's unit's trace array (kernel.cuh).
template <Layout L, bool kCrossover>
Status trace_buffer(detail::TraceBuffer* out);
#endif

}  // namespace sparse_decode

}  // namespace openmla::kernels
