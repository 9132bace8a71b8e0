// The launcher of one compiled variant of the dense decode main kernel (launch.h). Included only by the
// instantiation units (instantiations/*.cu), one variant each, so the variants compile in parallel.
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "common/tensor_map.h"
#include "kernels/dense_decode/kernel.cuh"
#include "kernels/dense_decode/launch.h"
#include "kernels/dense_decode/params.h"

namespace openmla::kernels::dense_decode {

// Both kernels: the cache as a 5-D tensor (64 columns, P rows of a page, 9 column tiles 128 B apart, kv heads, pages).
// Page 64 and P > 64: one box is a group of 4 tiles of 64 rows (32 KB) for the V halves, or the single RoPE tile (the
// any-page kernel gives the row of the block inside the page). P < 64: `k_map_rope` (box: one tile of P rows) is the
// one every copy uses, `k_map` (4 tiles of P rows) only serves the L2 prefetch of a page. Q as a 4-D map where the
// launch plan says so (q_map untouched otherwise).
template <bool kIsFp16>
Status encode_q_map(const DenseDecodeParams& p, CUtensorMap* q_map);

template <bool kIsFp16>
Status encode_maps(const DenseDecodeParams& p, int page_size, CUtensorMap* k_map, CUtensorMap* k_map_rope,
                   CUtensorMap* q_map) {
  const uint64_t box_rows = page_size < Traits::kBlockN ? static_cast<uint64_t>(page_size) : Traits::kBlockN;
  detail::TensorMapSpec spec{};
  spec.dtype = kIsFp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  spec.rank = 5;
  spec.dims[0] = Traits::kTileCols;
  spec.dims[1] = static_cast<uint64_t>(page_size);
  spec.dims[2] = Traits::kNumTiles;
  spec.dims[3] = static_cast<uint64_t>(p.h_kv);
  spec.dims[4] = static_cast<uint64_t>(p.num_cache_blocks);
  spec.byte_strides[0] = static_cast<uint64_t>(p.k_stride_row) * 2;
  spec.byte_strides[1] = Traits::kTileCols * 2;
  spec.byte_strides[2] = static_cast<uint64_t>(p.k_stride_head) * 2;
  spec.byte_strides[3] = static_cast<uint64_t>(p.k_stride_block) * 2;
  spec.box[0] = Traits::kTileCols;
  spec.box[1] = box_rows;
  spec.box[2] = Traits::kVTilesPerHalf;
  spec.box[3] = 1;
  spec.box[4] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  spec.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  OPENMLA_RETURN_IF_ERROR(detail::encode_tensor_map(k_map, p.k_cache, spec, "dense decode k_cache"));
  spec.box[2] = 1;
  OPENMLA_RETURN_IF_ERROR(detail::encode_tensor_map(k_map_rope, p.k_cache, spec, "dense decode k_cache (RoPE)"));
  return encode_q_map<kIsFp16>(p, q_map);
}

// Q by TMA where the launch plan says so (q_map untouched otherwise).
template <bool kIsFp16>
Status encode_q_map(const DenseDecodeParams& p, CUtensorMap* q_map) {
  // Q by TMA when the launch plan says so (heuristics::plan_dense_decode_launch: each CTA's 64 rows are 64
  // consecutive heads of one query position and q's address and strides are whole 16-byte units): a 4-D map
  // (576 columns, heads, s_q, b), box 64 x 64, the 128-byte swizzle the cp.async path writes (docs/dense-decode.md,
  // decision dense-v17). Otherwise the kernel loads Q by cp.async and never reads the map.
  if (p.q_tma) {
    const DenseQMapStrides qs_strides =
        dense_q_map_strides(p.batch, p.s_q, p.h_q, p.q_stride_b, p.q_stride_s, p.q_stride_h);
    detail::TensorMapSpec qs{};
    qs.dtype = kIsFp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    qs.rank = 4;
    qs.dims[0] = Traits::kHeadDimQK;
    qs.dims[1] = static_cast<uint64_t>(p.h_kv) * p.q_per_kv;
    qs.dims[2] = static_cast<uint64_t>(p.s_q);
    qs.dims[3] = static_cast<uint64_t>(p.batch);
    qs.byte_strides[0] = static_cast<uint64_t>(qs_strides.head) * 2;
    qs.byte_strides[1] = static_cast<uint64_t>(qs_strides.position) * 2;
    qs.byte_strides[2] = static_cast<uint64_t>(qs_strides.request) * 2;
    qs.box[0] = Traits::kTileCols;
    qs.box[1] = Traits::kBlockM;
    qs.box[2] = 1;
    qs.box[3] = 1;
    qs.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
    qs.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    OPENMLA_RETURN_IF_ERROR(detail::encode_tensor_map(q_map, p.q, qs, "dense decode q"));
  }
  return Status::ok();
}

template <bool kIsFp16>
Status launch_variant(const DenseDecodeParams& p, cudaStream_t stream) {
  CUtensorMap k_map, k_map_rope, q_map{};
  OPENMLA_RETURN_IF_ERROR(encode_maps<kIsFp16>(p, Traits::kBlockN, &k_map, &k_map_rope, &q_map));
  auto kernel = dense_decode_kernel<kIsFp16>;
  constexpr int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;  // set once per device (common/dynamic_smem.h)
  const dim3 grid(p.num_m_blocks, p.h_kv, p.num_sm_parts);
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "dense decode: setting the shared-memory size", "dense decode kernel launch",
                                          [&] {
                                            kernel<<<grid, Traits::kThreads, smem_bytes, stream>>>(p, k_map,
                                                                                                  k_map_rope, q_map);
                                            return cudaPeekAtLastError();
                                          });
}

template <bool kIsFp16>
Status launch_any_page_variant(const DenseDecodeParams& p, const DensePageGeometry& pages, cudaStream_t stream) {
  CUtensorMap k_map, k_map_rope, q_map{};
  OPENMLA_RETURN_IF_ERROR(encode_maps<kIsFp16>(p, pages.page_size, &k_map, &k_map_rope, &q_map));
  auto kernel = dense_decode_any_page_kernel<kIsFp16>;
  constexpr int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;
  const dim3 grid(p.num_m_blocks, p.h_kv, p.num_sm_parts);
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "dense decode (any page size): setting the shared-memory size",
                                          "dense decode kernel (any page size) launch", [&] {
                                            kernel<<<grid, Traits::kThreads, smem_bytes, stream>>>(
                                                p, k_map, k_map_rope, q_map, pages);
                                            return cudaPeekAtLastError();
                                          });
}

// Page sizes 1-8 (docs/dense-decode.md, "Small pages: the gather kernel"): the cache is gathered by cp.async, so only
// q's map is built (the cache maps are passed empty and never read).
// kChunked: the batch-invariant twin (params.chunk_blocks > 0).
template <bool kIsFp16, bool kChunked, int kGatherMode>
Status launch_gather_variant(const DenseDecodeParams& p, const DensePageGeometry& pages, int gather_flags,
                             cudaStream_t stream) {
  CUtensorMap k_map{}, k_map_rope{}, q_map{};
  OPENMLA_RETURN_IF_ERROR(encode_q_map<kIsFp16>(p, &q_map));
  auto kernel = [] {  // (if constexpr: each unit compiles one of the two kernels)
    if constexpr (kChunked) return dense_decode_gather_invariant_kernel<kIsFp16>;
    else return dense_decode_gather_kernel<kIsFp16, kGatherMode>;
  }();
  constexpr int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;
  const dim3 grid(p.num_m_blocks, p.h_kv, p.num_sm_parts);
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "dense decode (small pages): setting the shared-memory size",
                                          "dense decode kernel (small pages) launch", [&] {
                                            kernel<<<grid, Traits::kThreads, smem_bytes, stream>>>(
                                                p, k_map, k_map_rope, q_map, pages, gather_flags);
                                            return cudaPeekAtLastError();
                                          });
}

template <bool kIsFp16, bool kAnyPage>
Status launch_invariant_variant(const DenseDecodeParams& p, const DensePageGeometry& pages, cudaStream_t stream) {
  CUtensorMap k_map, k_map_rope, q_map{};
  OPENMLA_RETURN_IF_ERROR(encode_maps<kIsFp16>(p, pages.page_size, &k_map, &k_map_rope, &q_map));
  auto kernel = dense_decode_invariant_kernel<kIsFp16, kAnyPage>;
  constexpr int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;
  const dim3 grid(p.num_m_blocks, p.h_kv, p.num_sm_parts);
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "dense decode (batch-invariant): setting the shared-memory size",
                                          "dense decode kernel (batch-invariant) launch", [&] {
                                            kernel<<<grid, Traits::kThreads, smem_bytes, stream>>>(
                                                p, k_map, k_map_rope, q_map, pages);
                                            return cudaPeekAtLastError();
                                          });
}

template <bool kIsFp16, bool kAnyPage>
Status launch_varlen_q_variant(const DenseDecodeParams& p, const DensePageGeometry& pages, const DenseVarlenQ& varlen,
                               cudaStream_t stream) {
  CUtensorMap k_map, k_map_rope, q_map{};
  OPENMLA_RETURN_IF_ERROR(encode_maps<kIsFp16>(p, pages.page_size, &k_map, &k_map_rope, &q_map));
  auto kernel = dense_decode_varlen_q_kernel<kIsFp16, kAnyPage>;
  constexpr int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;
  const dim3 grid(p.num_m_blocks, p.h_kv, p.num_sm_parts);
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "dense decode (per-request query lengths): setting the shared-memory size",
                                          "dense decode kernel (per-request query lengths) launch", [&] {
                                            kernel<<<grid, Traits::kThreads, smem_bytes, stream>>>(
                                                p, k_map, k_map_rope, q_map, pages, varlen);
                                            return cudaPeekAtLastError();
                                          });
}

#if defined(OPENMLA_HAS_TRACE)
template <bool kIsFp16>
Status trace_buffer(detail::TraceBuffer* out) {
  return detail::trace_buffer(g_trace, out, "dense decode trace: finding the buffer");
}
#endif

}  // namespace openmla::kernels::dense_decode
