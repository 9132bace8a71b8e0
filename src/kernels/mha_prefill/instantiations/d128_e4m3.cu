// Dense MHA prefill, FP8 (e4m3) q, k, v, d_qk = 128, d_v = 128; bf16 or fp16 out; key blocks of 128 and of 192 keys
// (decision fp8-d5: the launcher picks one per call, heuristics::mha_prefill_fp8_block_n).
#include "kernels/mha_prefill/launch_fp8_impl.cuh"

namespace openmla::kernels {
template Status launch_mha_prefill_fp8_typed<128, 128>(const MhaPrefillFp8Params&, cudaStream_t);
template Status launch_mha_prefill_fp8_typed<128, 192>(const MhaPrefillFp8Params&, cudaStream_t);
}  // namespace openmla::kernels
