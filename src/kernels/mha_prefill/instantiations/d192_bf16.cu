// Dense MHA prefill, d_qk = 192, d_v = 128, bf16.
#include "kernels/mha_prefill/launch_impl.cuh"

namespace openmla::kernels {
template Status launch_mha_prefill_typed<192, false>(const MhaPrefillParams&, cudaStream_t);
}  // namespace openmla::kernels
#if defined(OPENMLA_HAS_TRACE)
namespace openmla::kernels {
template Status mha_prefill::trace_buffer<192, false>(detail::TraceBuffer*);
}  // namespace openmla::kernels
#endif
