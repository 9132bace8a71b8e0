// Sparse prefill, d_qk = 576.
#include "kernels/sparse_prefill/launch_impl.cuh"

namespace openmla::kernels {
template Status launch_sparse_prefill_typed<576>(const SparsePrefillParams&, cudaStream_t);
}  // namespace openmla::kernels
#if defined(OPENMLA_HAS_TRACE)
namespace openmla::kernels {
template Status sparse_prefill::trace_buffer<576>(detail::TraceBuffer*);
}  // namespace openmla::kernels
#endif
