// Dense decode main kernel for page sizes other than 64 (docs/dense-decode.md, "Page sizes"), fp16 q / cache / out.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_any_page_variant<true>(const DenseDecodeParams& params, const DensePageGeometry& pages,
                                              cudaStream_t stream);

}  // namespace openmla::kernels::dense_decode
