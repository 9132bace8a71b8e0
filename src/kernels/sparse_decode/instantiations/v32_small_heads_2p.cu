// Sparse decode main kernel: V3.2 layout, few heads (h_q <= 32; small_heads.cuh), two producer warpgroups.
#include "kernels/sparse_decode/launch_variant.cuh"

namespace openmla::kernels::sparse_decode {

template Status launch_small_heads_variant<Layout::kV32, 2>(const SparseDecodeParams& params, cudaStream_t stream);

}  // namespace openmla::kernels::sparse_decode
