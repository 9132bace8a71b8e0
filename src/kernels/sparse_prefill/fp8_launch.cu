// Host dispatcher of the FP8-cache sparse prefill kernel: one variant per cache layout (instantiations/*.cu).
#include "kernels/sparse_prefill/fp8_params.h"

namespace openmla::kernels {

template <int kDQK>
Status launch_sparse_prefill_fp8_typed(const SparsePrefillFp8Params& p, cudaStream_t stream);

Status launch_sparse_prefill_fp8(const SparsePrefillFp8Params& p, cudaStream_t stream) {
  return p.base.d_qk == 576 ? launch_sparse_prefill_fp8_typed<576>(p, stream)
                            : launch_sparse_prefill_fp8_typed<512>(p, stream);
}

}  // namespace openmla::kernels
