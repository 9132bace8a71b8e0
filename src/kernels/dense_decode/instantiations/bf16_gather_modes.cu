// Experiment modes of the bf16 gather kernel (params.h, kGatherMode 1; session 21, decision dense-v25): chosen by
// OPENMLA_DENSE_GATHER_MODE for an A/B on one build; removed once measured. bf16 q / cache / out, default schedule.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_gather_variant<false, false, 1>(const DenseDecodeParams& params, const DensePageGeometry& pages,
                                                      int gather_flags, cudaStream_t stream);

}  // namespace openmla::kernels::dense_decode
