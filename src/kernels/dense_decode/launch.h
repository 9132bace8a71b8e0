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

// Grid (num_m_blocks, h_kv, num_sm_parts), Traits::kThreads threads. `pages.page_size` 64 launches the page-64 kernel,
// 16, 32, 128 or 256 the any-page kernel, 1, 2, 4 or 8 the gather kernel (dense_decode_page_size_supported);
// params.chunk_blocks > 0 (a batch-invariant schedule) their chunk-walking twins.
Status launch_dense_decode(const DenseDecodeParams& params, const DensePageGeometry& pages, cudaStream_t stream);

// Per-request query lengths (docs/dense-decode.md, "Per-request query lengths"): the varlen kernels, page 64 or any
// page size, in launch_varlen_q.cu. Not combined with batch-invariant schedules (params.chunk_blocks must be 0).
Status launch_dense_decode_varlen_q(const DenseDecodeParams& params, const DensePageGeometry& pages,
                                    const DenseVarlenQ& varlen, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// Trace builds only (CMake -DOPENMLA_TRACE=ON; api/trace.h): copies the trace of the last launch (config.h, struct
// Trace; format common/trace_format.h, variant code: 1 for fp16) to host[0, Trace::Format::kValues), synchronising the
// device first, or zeroes the trace of every variant when `clear` is set.
Status dense_decode_trace(unsigned long long* host, size_t count, bool clear);
#endif

namespace dense_decode {

// One compiled variant: its definition is launch_variant.cuh, its one instantiation instantiations/<dtype>.cu.
template <bool kIsFp16>
Status launch_variant(const DenseDecodeParams& params, cudaStream_t stream);
// The any-page kernel's variant: instantiations/<dtype>_any_page.cu.
template <bool kIsFp16>
Status launch_any_page_variant(const DenseDecodeParams& params, const DensePageGeometry& pages, cudaStream_t stream);
// The gather kernel's variants (page sizes 1-8): instantiations/<dtype>_gather[_invariant].cu (kChunked: the
// batch-invariant twin).
// gather_flags: its L2 look-ahead and policy (params.h, kGatherDefaultFlags).
// kGatherMode: params.h's experiment modes (instantiations/bf16_gather_modes.cu: bf16, kChunked false, mode 1).
template <bool kIsFp16, bool kChunked, int kGatherMode = 0>
Status launch_gather_variant(const DenseDecodeParams& params, const DensePageGeometry& pages, int gather_flags,
                             cudaStream_t stream);
// The batch-invariant kernels' variants (params.chunk_blocks > 0): instantiations/<dtype>[_any_page]_invariant.cu.
template <bool kIsFp16, bool kAnyPage>
Status launch_invariant_variant(const DenseDecodeParams& params, const DensePageGeometry& pages, cudaStream_t stream);
// The varlen kernels' variants: instantiations/<dtype>[_any_page]_varlen_q.cu.
template <bool kIsFp16, bool kAnyPage>
Status launch_varlen_q_variant(const DenseDecodeParams& params, const DensePageGeometry& pages,
                               const DenseVarlenQ& varlen, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// The variant's unit's trace array (kernel.cuh).
template <bool kIsFp16>
Status trace_buffer(detail::TraceBuffer* out);
#endif

}  // namespace dense_decode

}  // namespace openmla::kernels
