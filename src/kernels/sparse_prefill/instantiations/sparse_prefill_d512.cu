// Sparse prefill, d_qk = 512.
#include "kernels/sparse_prefill/launch_impl.cuh"

namespace openmla::kernels {
template Status launch_sparse_prefill_typed<512>(const SparsePrefillParams&, cudaStream_t);
}  // namespace openmla::kernels
#if defined(OPENMLA_HAS_TRACE)
namespace openmla::kernels {
template Status sparse_prefill::trace_buffer<512>(detail::TraceBuffer*);
}  // namespace openmla::kernels
#endif
