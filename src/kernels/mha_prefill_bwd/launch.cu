// Host launcher of the dense MHA prefill backward: the variant dispatch.
#include "kernels/mha_prefill_bwd/launch.h"

#include <string>

namespace openmla::kernels {

Status launch_mha_prefill_bwd(const MhaPrefillBwdParams& p, cudaStream_t stream) {
  if (p.d_qk == 192)
    return p.fp16 ? launch_mha_prefill_bwd_typed<192, true>(p, stream)
                  : launch_mha_prefill_bwd_typed<192, false>(p, stream);
  if (p.d_qk == 128)
    return p.fp16 ? launch_mha_prefill_bwd_typed<128, true>(p, stream)
                  : launch_mha_prefill_bwd_typed<128, false>(p, stream);
  return Status::internal("dense MHA prefill backward: no kernel variant for d_qk " + std::to_string(p.d_qk) +
                          " (the API admits 192 and 128)");
}

}  // namespace openmla::kernels
