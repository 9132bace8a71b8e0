// Dense decode main kernel of batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"), pages != 64,
// bf16 q / cache / out.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_invariant_variant<false, true>(const DenseDecodeParams& params, const DensePageGeometry& pages,
                                                 cudaStream_t stream);

}  // namespace openmla::kernels::dense_decode
