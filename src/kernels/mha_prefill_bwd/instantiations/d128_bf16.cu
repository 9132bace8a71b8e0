// Dense MHA prefill backward, d_qk = 128, d_v = 128, bf16.
#include "kernels/mha_prefill_bwd/launch_impl.cuh"

namespace openmla::kernels {
template Status launch_mha_prefill_bwd_typed<128, false>(const MhaPrefillBwdParams&, cudaStream_t);
}  // namespace openmla::kernels
