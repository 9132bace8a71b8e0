// Host launcher of the dense MLA decode main kernel. Arguments arrive validated and the launch plan's choices
// (Q by TMA or not: heuristics::plan_dense_decode_launch) are already in the params; the launcher turns the
// element type into the compiled variant, builds the TMA descriptors, sets the shared-memory size and launches
// on the caller's stream (no sync, no allocation). The combine kernel is launched separately (kernels/combine).
#pragma once

#include <cuda_runtime.h>

#include "kernels/dense_decode/params.h"
#include "openmla/status.h"
#if defined(OPENMLA_HAS_TRACE)
#include "common/trace_symbols.cuh"
#endif

namespace openmla::kernels {

// Grid (num_m_blocks, h_kv, num_sm_parts), Traits::kThreads threads.
Status launch_dense_decode(const DenseDecodeParams& params, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// Trace builds only (CMake -DOPENMLA_TRACE=ON; the Python module's _dense_decode_timeline): copies the request
// timeline of the last launch (kernel.cuh, struct Timeline) to `host`, synchronising the device first;
// clear_dense_decode_timeline() zeroes it (every variant) before a launch.
Status copy_dense_decode_timeline(unsigned long long* host, size_t count);
Status clear_dense_decode_timeline();
#endif

namespace dense_decode {

// One compiled variant: its definition is launch_variant.cuh, its one instantiation instantiations/<dtype>.cu.
template <bool kIsFp16>
Status launch_variant(const DenseDecodeParams& params, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// The variant's unit's request timeline (kernel.cuh, struct Timeline).
template <bool kIsFp16>
Status timeline_buffer(detail::TraceBuffer* out);
#endif

}  // namespace dense_decode

}  // namespace openmla::kernels
