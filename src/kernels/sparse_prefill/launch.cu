// Host launcher of the sparse top-k MLA prefill kernel: Q's tensor map, grid, shared memory.
#include "kernels/sparse_prefill/launch.h"

#include "common/tensor_map.h"
#include "kernels/sparse_prefill/config.h"
#include "kernels/sparse_prefill/params.h"

namespace openmla::kernels {

template <int kDQK>
Status launch_sparse_prefill_typed(const SparsePrefillParams& p, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
namespace {
// Trace builds: which variant launched last (its unit holds the trace the reader copies).
int g_last_d_qk = 576;
}  // namespace
#endif

Status launch_sparse_prefill(const SparsePrefillParams& p, cudaStream_t stream) {
#if defined(OPENMLA_HAS_TRACE)
  g_last_d_qk = p.d_qk;
#endif
  return p.d_qk == 576 ? launch_sparse_prefill_typed<576>(p, stream) : launch_sparse_prefill_typed<512>(p, stream);
}

#if defined(OPENMLA_HAS_TRACE)
Status sparse_prefill_trace(unsigned long long* host, size_t count, bool clear) {
  detail::TraceBuffer buffers[2];  // d_qk 576, 512
  OPENMLA_RETURN_IF_ERROR(sparse_prefill::trace_buffer<576>(&buffers[0]));
  OPENMLA_RETURN_IF_ERROR(sparse_prefill::trace_buffer<512>(&buffers[1]));
  return detail::read_trace<sparse_prefill::Trace::Format>(trace::Kernel::kSparsePrefill, g_last_d_qk, buffers, 2,
                                                           g_last_d_qk == 576 ? 0 : 1, host, count, clear,
                                                           "sparse prefill trace");
}
#endif

namespace sparse_prefill {

// Q as a 4-D tensor (d_qk columns, heads, tokens, 1), box 64 columns x 64 heads: one box per 64 x 64 swizzled
// tile; heads past h_q read as zeros (TMA out-of-bounds fill). A size-1 dimension is never stepped, so its stride
// (free in PyTorch) is replaced by a valid one.
Status make_q_tensor_map(const SparsePrefillParams& p, CUtensorMap* map) {
  const int64_t sh = p.h_q > 1 ? p.q_stride_h : p.d_qk;
  const int64_t ss = p.s_q > 1 ? p.q_stride_s : sh * p.h_q;
  detail::TensorMapSpec spec{};
  spec.dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  spec.rank = 4;
  spec.dims[0] = static_cast<uint64_t>(p.d_qk);
  spec.dims[1] = static_cast<uint64_t>(p.h_q);
  spec.dims[2] = static_cast<uint64_t>(p.s_q);
  spec.dims[3] = 1;
  spec.byte_strides[0] = static_cast<uint64_t>(sh) * 2;
  spec.byte_strides[1] = static_cast<uint64_t>(ss) * 2;
  spec.byte_strides[2] = static_cast<uint64_t>(ss) * 2 * static_cast<uint64_t>(p.s_q);
  spec.box[0] = 64;
  spec.box[1] = 64;
  spec.box[2] = 1;
  spec.box[3] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  spec.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return detail::encode_tensor_map(map, p.q, spec, "sparse prefill q");
}

}  // namespace sparse_prefill

}  // namespace openmla::kernels
