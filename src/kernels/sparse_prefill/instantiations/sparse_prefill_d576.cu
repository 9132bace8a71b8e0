// Sparse prefill, d_qk = 576.
#include "kernels/sparse_prefill/launch_impl.cuh"

namespace openmla::kernels {
template Status launch_sparse_prefill_typed<576>(const SparsePrefillParams&, cudaStream_t);
}  // namespace openmla::kernels
#if defined(OPENMLA_TRACE) || defined(OPENMLA_SPARSE_TRACE)
namespace openmla::kernels {
template Status sparse_prefill_trace_typed<576>(unsigned long long*, size_t, bool);
}  // namespace openmla::kernels
#endif
