// Host dispatcher of the FP8-cache sparse prefill kernel: one variant per cache layout and producer
// (instantiations/*.cu).
#include <cstdlib>
#include <cstring>

#include "kernels/sparse_prefill/fp8_params.h"

namespace openmla::kernels {

template <int kDQK, bool kStaged>
Status launch_sparse_prefill_fp8_typed(const SparsePrefillFp8Params& p, cudaStream_t stream);

namespace {

// The producer (docs/sparse-prefill.md, "Sparse prefill from the FP8 cache"): the register producer by default; the
// environment variable OPENMLA_SPARSE_PREFILL_FP8_PRODUCER=staged selects the staged one (a tuning knob for the
// benchmark and its tests, read once).
bool use_staged_producer() {
  static const bool staged = [] {
    const char* v = std::getenv("OPENMLA_SPARSE_PREFILL_FP8_PRODUCER");
    return v != nullptr && std::strcmp(v, "staged") == 0;
  }();
  return staged;
}

}  // namespace

Status launch_sparse_prefill_fp8(const SparsePrefillFp8Params& p, cudaStream_t stream) {
  const bool staged = use_staged_producer();
  if (p.base.d_qk == 576)
    return staged ? launch_sparse_prefill_fp8_typed<576, true>(p, stream) : launch_sparse_prefill_fp8_typed<576, false>(p, stream);
  return staged ? launch_sparse_prefill_fp8_typed<512, true>(p, stream) : launch_sparse_prefill_fp8_typed<512, false>(p, stream);
}

}  // namespace openmla::kernels
