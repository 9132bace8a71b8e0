// FP8 dense decode kernel: bf16 q, the next Q K^T issued behind P V_L (decision dense-fp8-v4).
#include "kernels/dense_decode/fp8/launch_variant.cuh"

namespace openmla::kernels::dense_decode_fp8 {
template Status launch_variant<false, true>(const DenseDecodeFp8Params& params, cudaStream_t stream);
}  // namespace openmla::kernels::dense_decode_fp8
