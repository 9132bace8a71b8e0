// FP8 dense decode kernel: e4m3 q (descale_q).
#include "kernels/dense_decode/fp8/launch_variant.cuh"

namespace openmla::kernels::dense_decode_fp8 {
template Status launch_variant<true, false>(const DenseDecodeFp8Params& params, cudaStream_t stream);
}  // namespace openmla::kernels::dense_decode_fp8
