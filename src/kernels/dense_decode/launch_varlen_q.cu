// Dense decode with per-request query lengths (launch.h, launch_dense_decode_varlen_q): the element type and page
// size become the varlen variant's template arguments. The variants are compiled in instantiations/*_varlen_q.cu.
#include "kernels/dense_decode/launch.h"

namespace openmla::kernels {

Status launch_dense_decode_varlen_q(const DenseDecodeParams& params, const DensePageGeometry& pages,
                                    const DenseVarlenQ& varlen, cudaStream_t stream) {
  if (params.chunk_blocks > 0)
    return Status::internal("dense decode: per-request query lengths with a batch-invariant schedule");
  if (varlen.seqused_q == nullptr) return Status::internal("dense decode: per-request query lengths without seqused_q");
  if (pages.page_size < kDenseMinTmaPageSize)
    return Status::unsupported("dense decode: per-request query lengths need pages of 16 or more tokens");
  if (pages.page_size != 64)
    return params.is_fp16 ? dense_decode::launch_varlen_q_variant<true, true>(params, pages, varlen, stream)
                          : dense_decode::launch_varlen_q_variant<false, true>(params, pages, varlen, stream);
  return params.is_fp16 ? dense_decode::launch_varlen_q_variant<true, false>(params, pages, varlen, stream)
                        : dense_decode::launch_varlen_q_variant<false, false>(params, pages, varlen, stream);
}

}  // namespace openmla::kernels
