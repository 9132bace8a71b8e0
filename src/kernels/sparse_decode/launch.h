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
// Trace builds only (CMake -DOPENMLA_TRACE=ON; the Python module's _sparse_decode_trace): copies the trace of the
// last launch to `host` (synchronising the device first): the clock64 block trace, then the per-CTA %globaltimer
// timeline, then the request-switch stamps (kernel.cuh, struct Trace).
Status copy_sparse_decode_trace(unsigned long long* host, size_t count);
// Zeroes the per-CTA timeline of every variant (CTAs that exit early stamp only some events).
Status clear_sparse_decode_timeline();
#endif

namespace sparse_decode {

// One compiled variant: its definition is launch_variant.cuh, its one instantiation instantiations/<variant>.cu.
template <Layout L, bool kCrossover>
Status launch_variant(const SparseDecodeParams& params, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// The variant's unit's trace arrays (kernel.cuh, struct Trace): block trace, per-CTA timeline, request switches.
struct TraceBuffers {
  detail::TraceBuffer trace, timeline, switches;
};
template <Layout L, bool kCrossover>
Status trace_buffers(TraceBuffers* out);
#endif

}  // namespace sparse_decode

}  // namespace openmla::kernels
