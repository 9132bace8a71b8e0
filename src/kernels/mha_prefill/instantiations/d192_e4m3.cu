// Dense MHA prefill, FP8 (e4m3) q, k, v, d_qk = 192, d_v = 128; bf16 or fp16 out.
#include "kernels/mha_prefill/launch_fp8_impl.cuh"

namespace openmla::kernels {
template Status launch_mha_prefill_fp8_typed<192>(const MhaPrefillFp8Params&, cudaStream_t);
}  // namespace openmla::kernels
