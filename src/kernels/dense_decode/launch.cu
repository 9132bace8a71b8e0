// Host launcher of the dense MLA decode main kernel: TMA descriptor for the paged cache, grid, smem.
#include "kernels/dense_decode/kernel.cuh"
#include "kernels/dense_decode/params.h"

#include "api/validate.h"
#include "common/tensor_map.h"
#if defined(OPENMLA_SPARSE_TRACE)
#include "common/trace_symbols.cuh"
#endif

namespace openmla::kernels {

namespace {

template <bool kIsFp16>
Status launch_typed(const DenseDecodeParams& p, cudaStream_t stream) {
  using dense_decode::Config;
  using dense_decode::SharedStorage;
  // The cache as a 5-D tensor (64 columns, 64 rows of a page, 9 column tiles 128 B apart, kv heads, pages):
  // one box is a group of 4 tiles (32 KB) for the V halves, or the single RoPE tile.
  detail::TensorMapSpec spec{};
  spec.dtype = kIsFp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  spec.rank = 5;
  spec.dims[0] = Config::kTileCols;
  spec.dims[1] = Config::kBlockN;
  spec.dims[2] = Config::kNumTiles;
  spec.dims[3] = static_cast<uint64_t>(p.h_kv);
  spec.dims[4] = static_cast<uint64_t>(p.num_cache_blocks);
  spec.byte_strides[0] = static_cast<uint64_t>(p.k_stride_row) * 2;
  spec.byte_strides[1] = Config::kTileCols * 2;
  spec.byte_strides[2] = static_cast<uint64_t>(p.k_stride_head) * 2;
  spec.byte_strides[3] = static_cast<uint64_t>(p.k_stride_block) * 2;
  spec.box[0] = Config::kTileCols;
  spec.box[1] = Config::kBlockN;
  spec.box[2] = Config::kVTilesPerHalf;
  spec.box[3] = 1;
  spec.box[4] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  spec.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  CUtensorMap k_map, k_map_rope;
  OPENMLA_RETURN_IF_ERROR(detail::encode_tensor_map(&k_map, p.k_cache, spec, "dense decode k_cache"));
  spec.box[2] = 1;
  OPENMLA_RETURN_IF_ERROR(detail::encode_tensor_map(&k_map_rope, p.k_cache, spec, "dense decode k_cache (RoPE)"));

  // Q by TMA when each CTA's 64 rows are 64 consecutive heads of one query position (q_per_kv a multiple of 64,
  // e.g. h_q = 128 or 64 per kv head) and q's address and strides are whole 16-byte units: a 4-D map (576
  // columns, heads, s_q, b), box 64 x 64, the 128-byte swizzle the cp.async path writes (perf-notes dense v17).
  // Other shapes keep the cp.async path.
  DenseDecodeParams params = p;
  CUtensorMap q_map{};
  {
    // A size-1 dimension is never stepped: its stride (free in PyTorch) is replaced by a valid one.
    const int64_t sh = p.q_stride_h, ss = p.s_q > 1 ? p.q_stride_s : sh * p.h_kv * p.q_per_kv,
                  sb = p.batch > 1 ? p.q_stride_b : ss * p.s_q;
    params.q_tma = p.q_per_kv % Config::kBlockM == 0 && reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && sh > 0 &&
                   ss > 0 && sb > 0 && sh % 8 == 0 && ss % 8 == 0 && sb % 8 == 0;
    if (params.q_tma) {
      detail::TensorMapSpec qs{};
      qs.dtype = spec.dtype;
      qs.rank = 4;
      qs.dims[0] = Config::kHeadDimQK;
      qs.dims[1] = static_cast<uint64_t>(p.h_kv) * p.q_per_kv;
      qs.dims[2] = static_cast<uint64_t>(p.s_q);
      qs.dims[3] = static_cast<uint64_t>(p.batch);
      qs.byte_strides[0] = static_cast<uint64_t>(sh) * 2;
      qs.byte_strides[1] = static_cast<uint64_t>(ss) * 2;
      qs.byte_strides[2] = static_cast<uint64_t>(sb) * 2;
      qs.box[0] = Config::kTileCols;
      qs.box[1] = Config::kBlockM;
      qs.box[2] = 1;
      qs.box[3] = 1;
      qs.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
      qs.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
      OPENMLA_RETURN_IF_ERROR(detail::encode_tensor_map(&q_map, p.q, qs, "dense decode q"));
    }
  }

  auto kernel = dense_decode::dense_decode_kernel<kIsFp16>;
  const int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
                               "dense decode: setting the shared-memory size");
  dim3 grid(p.num_m_blocks, p.h_kv, p.num_sm_parts);
  kernel<<<grid, Config::kThreads, smem_bytes, stream>>>(params, k_map, k_map_rope, q_map);
  return detail::last_cuda_error("dense decode kernel launch");
}

}  // namespace

Status launch_dense_decode(const DenseDecodeParams& params, cudaStream_t stream) {
  return params.is_fp16 ? launch_typed<true>(params, stream) : launch_typed<false>(params, stream);
}

#if defined(OPENMLA_SPARSE_TRACE)
// Trace build: copies the request timeline of the last dense launch (kernel.cuh, struct Timeline) to `host`;
// clear_dense_decode_timeline() zeroes it before a launch.
Status copy_dense_decode_timeline(unsigned long long* host, size_t count) {
  if (count < detail::symbol_values(dense_decode::g_dense_timeline))
    return Status::invalid_argument("argument 'count': the timeline holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "dense decode timeline: synchronising");
  return detail::copy_symbol(host, 0, dense_decode::g_dense_timeline, "dense decode timeline: copying");
}
Status clear_dense_decode_timeline() {
  return detail::clear_symbol(dense_decode::g_dense_timeline, "dense decode timeline: clearing");
}
#endif

}  // namespace openmla::kernels
