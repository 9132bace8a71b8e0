// Dense decode main kernel for page sizes 1, 2, 4 and 8 under a batch-invariant schedule (docs/dense-decode.md, "Small
// pages: the gather kernel"; docs/decode-schedule.md, "Batch invariance"), fp16 q / cache / out.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_gather_variant<true, true>(const DenseDecodeParams& params, const DensePageGeometry& pages, int gather_flags,
                                                  cudaStream_t stream);

}  // namespace openmla::kernels::dense_decode
