// Dense decode main kernel, fp16 q / cache / out.
#include "kernels/dense_decode/launch_variant.cuh"

namespace openmla::kernels::dense_decode {

template Status launch_variant<true>(const DenseDecodeParams& params, cudaStream_t stream);
#if defined(OPENMLA_HAS_TRACE)
template Status trace_buffer<true>(detail::TraceBuffer* out);
#endif

}  // namespace openmla::kernels::dense_decode
