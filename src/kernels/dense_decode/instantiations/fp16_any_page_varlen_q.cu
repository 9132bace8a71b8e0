// Dense decode main kernel with per-request query lengths (docs/dense-decode.md, "Per-request query lengths"),
// page sizes other than 64, fp16 q / cache / out.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_varlen_q_variant<true, true>(const DenseDecodeParams& params, const DensePageGeometry& pages,
                                                 const DenseVarlenQ& varlen, cudaStream_t stream);

}  // namespace openmla::kernels::dense_decode
