// FP8 dense decode launcher (launch.h): the q dtype becomes the template argument.
#include "kernels/dense_decode/fp8/launch.h"

namespace openmla::kernels {

Status launch_dense_decode_fp8(const DenseDecodeFp8Params& params, bool q_fp8, cudaStream_t stream) {
  if (params.early_qk)
    return q_fp8 ? dense_decode_fp8::launch_variant<true, true>(params, stream)
                 : dense_decode_fp8::launch_variant<false, true>(params, stream);
  return q_fp8 ? dense_decode_fp8::launch_variant<true, false>(params, stream)
               : dense_decode_fp8::launch_variant<false, false>(params, stream);
}

}  // namespace openmla::kernels
