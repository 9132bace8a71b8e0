// Dense decode main kernel, bf16 q / cache / out.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_variant<false>(const DenseDecodeParams& params, cudaStream_t stream);
#if defined(OPENMLA_HAS_TRACE)
template Status trace_buffer<false>(detail::TraceBuffer* out);
#endif

}  // namespace openmla::kernels::dense_decode
