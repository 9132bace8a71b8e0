// Sparse decode main kernel of batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"): MODEL1 layout,
// plain.
#include "kernels/sparse_decode/launch_variant.cuh"

namespace openmla::kernels::sparse_decode {

template Status launch_invariant_variant<Layout::kModel1, false>(const SparseDecodeParams& params, cudaStream_t stream);

}  // namespace openmla::kernels::sparse_decode
