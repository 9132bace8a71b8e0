// Dense MLA decode, page sizes 1, 2, 4 and 8 (docs/dense-decode.md, "Page sizes", "Small pages: the gather kernel"):
// the KV rows of a 64-token block come from up to 64 pages (at page 1 the block table is a per-token slot list), so
// they are gathered by 16-byte cp.async into the 128B-swizzled tiles the TMA would have written, by the warpgroup
// that refills the tile group, completing on the same K barriers through cp.async.mbarrier.arrive.noinc.
//
// Thread roles (either warpgroup): warp w owns rows 16 w .. 16 w + 15 of every block; lane l copies the 16-byte chunk
// l % 8 of rows 16 w + 4 j + l / 8 (j = 0..3), in every 64-column tile of the group. One warp instruction then reads
// four whole 128-byte lines (as the sparse kernels' gathers do): four L2 requests per instruction, not sixteen.
//
// Page ids travel in one register per lane for a pair of blocks ("PairIds"): lane l holds the block-table entry of row
// 16 w + l % 16 of block l / 16 of the pair (-1: past the length or past the CTA's range; an entry outside the cache is
// kept as read and zero-filled at its use); a copy takes its row's id by a shuffle.
//
// L2 look-ahead (the kernel's gather_flags, params.h): each token row of a pair further ahead is pulled into L2 as one
// 1,152-byte bulk prefetch, so the DRAM sees whole rows instead of three 512 / 128-byte pieces at three times, and the
// gathers, issued by the compute warpgroups, hit L2.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "kernels/dense_decode/config.h"
#include "kernels/dense_decode/params.h"

namespace openmla::kernels::dense_decode::gather {

// 16-byte cp.async with an L2 cache policy and a 128-byte L2 fetch (a token row is 9 x 128 bytes: nothing of a
// neighbouring row is pulled in); src_bytes = 0 zero-fills the destination without reading `src`.
__device__ __forceinline__ void cp_async_16_hint(uint32_t smem_dst, const void* src, uint32_t src_bytes,
                                                 uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;" ::"r"(smem_dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

// The same copy without the L2 fetch hint (mode kGatherModeNoFetchHint).
__device__ __forceinline__ void cp_async_16_nohint(uint32_t smem_dst, const void* src, uint32_t src_bytes,
                                                   uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(smem_dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

__device__ __forceinline__ uint64_t make_l2_evict_normal_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// The gathers' L2 policy (gather_flags bit kGatherEvictNormal: evict_normal, else the TMA kernels' evict_last).
__device__ __forceinline__ uint64_t policy_of(int flags) {
  return (flags & kGatherEvictNormal) ? make_l2_evict_normal_policy() : ptx::make_l2_evict_last_policy();
}

// Waits for this thread's committed cp.async groups (the Q tile) only: the KV gathers are never committed (they
// complete on the K barriers), so a wait_all would also wait for the first two blocks.
__device__ __forceinline__ void cp_async_wait_committed() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// The page holding token `tok` of request `req`, or -1: a token at or past `limit` (the length; the entry is never
// read, the row is zero-filled, as TMA fills out-of-bounds boxes, then masked) or an entry outside the cache
// [0, num_cache_blocks) (zero-filled, never an address: the page-64 kernel's TMA bounds give the same zeros).
__device__ __forceinline__ int page_of_token(const DenseDecodeParams& p, int req, int tok, int limit, int log2_page) {
  if (tok >= limit) return -1;
  const int page = p.block_table[static_cast<int64_t>(req) * p.block_table_stride + (tok >> log2_page)];
  return page >= 0 && page < p.num_cache_blocks ? page : -1;
}

// Whether a page id is an address: inside the cache [0, num_cache_blocks) (negative ids, -1 included, are not).
__device__ __forceinline__ bool page_in_cache(const DenseDecodeParams& p, int page) {
  return static_cast<unsigned>(page) < static_cast<unsigned>(p.num_cache_blocks);
}

// This lane's id of the pair of blocks starting at `blk` (lane l: row 16 w + l % 16 of block blk + l / 16): the
// block-table entry as stored, or -1 for a block at or past `blk_end` or a token at or past the length (never
// gathered, never prefetched). The entry is NOT range-checked here: the ids are requested pairs ahead, and a check at
// the load would wait for it (decision dense-v24: that wait was 27 % of the page-1 kernel's stall samples); every use
// (gather_kv_tiles, prefetch_pair_rows_l2) tests page_in_cache after its shuffle.
__device__ __forceinline__ int pair_ids(const DenseDecodeParams& p, int req, int blk, int blk_end, int seqlen,
                                        int log2_page, int wg_tid) {
  const int lane = wg_tid % 32, b = blk + lane / 16;
  const int tok = b * Traits::kBlockN + (wg_tid / 32) * 16 + lane % 16;
  int page = -1;
  if (b < blk_end && tok < seqlen)
    page = p.block_table[static_cast<int64_t>(req) * p.block_table_stride + (tok >> log2_page)];
  return page;
}

// Address of token row `row_in_page` of page `page` (kv head `kv_head`) in the cache.
__device__ __forceinline__ const uint8_t* row_address(const DenseDecodeParams& p, int page, int row_in_page,
                                                      int kv_head) {
  return static_cast<const uint8_t*>(p.k_cache) +
         2 * (static_cast<int64_t>(page) * p.k_stride_block + static_cast<int64_t>(row_in_page) * p.k_stride_row +
              static_cast<int64_t>(kv_head) * p.k_stride_head);
}

// Gathers this warp's 16 rows of block `half` (0 or 1) of the pair whose ids are `ids` (PairIds), tiles
// [t_begin, t_end) (whole tile groups), into K buffer `buf`; after each group, arrives on that group's barrier once its
// copies have landed (.noinc: the barrier counts the 128 threads of the warpgroup that refills the group). `page_size`
// is a power of two <= 8: a row's place in its page is row % page_size.
template <int kMode = 0>
__device__ __forceinline__ void gather_kv_tiles(SharedStorage& smem, const DenseDecodeParams& p, int ids, int half,
                                                int page_size, int wg_tid, int kv_head, int buf, int t_begin,
                                                int t_end, uint64_t policy) {
  const int lane = wg_tid % 32, warp = wg_tid / 32, lr = lane / 8, chunk = lane % 8;
  const uint32_t buf_base = ptx::smem_addr(smem.k[buf][0]);
  const uint8_t* src[4];
  uint32_t dst[4], bytes[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int row = warp * 16 + 4 * j + lr;
    const int page = __shfl_sync(0xffffffffu, ids, half * 16 + 4 * j + lr);
    const bool valid = page_in_cache(p, page);
    bytes[j] = valid ? 16u : 0u;
    src[j] = (valid ? row_address(p, page, row & (page_size - 1), kv_head) : static_cast<const uint8_t*>(p.k_cache)) +
             chunk * 16;
    dst[j] = buf_base + row * Traits::kRowBytes + ((chunk ^ (row & 7)) << 4);
  }
  for (int t = t_begin; t < t_end;) {
    const int g = t / Traits::kVTilesPerHalf;
    const int n = g == 2 ? 1 : Traits::kVTilesPerHalf;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int i = 0; i < Traits::kVTilesPerHalf; ++i) {
        if (i >= n) break;
        if constexpr ((kMode & kGatherModeNoFetchHint) != 0)
          cp_async_16_nohint(dst[j] + (t + i) * Traits::kTileBytes, src[j] + (t + i) * Traits::kRowBytes, bytes[j],
                             policy);
        else
          cp_async_16_hint(dst[j] + (t + i) * Traits::kTileBytes, src[j] + (t + i) * Traits::kRowBytes, bytes[j],
                           policy);
      }
    }
    ptx::cp_async_mbarrier_arrive_noinc(&smem.k_bar[buf][g]);
    t += n;
  }
}

// L2 prefetch of this lane's row of a pair (PairIds): one 1,152-byte bulk prefetch.
// Mode kGatherModeLinePrefetch: the warp's 32 rows (16 per block of the pair) as nine 128-byte lines each, the 288
// lines dealt to the 32 lanes (item k * 32 + lane = line item % 9 of row item / 9), each lane its own address, so no
// loop over the lanes. A row whose start is not 128-byte aligned (a padded stride) gets nine lines from its start: a
// hint, not a copy.
template <int kMode = 0>
__device__ __forceinline__ void prefetch_pair_rows_l2(const DenseDecodeParams& p, int ids, int page_size, int wg_tid,
                                                      int kv_head) {
  const int row = (wg_tid / 32) * 16 + wg_tid % 16;
  if constexpr ((kMode & kGatherModeLinePrefetch) != 0) {
    const int lane = wg_tid % 32;
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      const int item = k * 32 + lane, r = item / 9, c = item % 9;
      const int page = __shfl_sync(0xffffffffu, ids, r);
      const int row_r = (wg_tid / 32) * 16 + r % 16;
      if (page_in_cache(p, page))
        asm volatile("prefetch.global.L2::evict_normal [%0];" ::"l"(row_address(p, page, row_r & (page_size - 1),
                                                                                kv_head) + c * 128)
                     : "memory");
    }
    return;
  }
  if (!page_in_cache(p, ids)) return;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row_address(p, ids, row & (page_size - 1), kv_head)),
               "r"(Traits::kHeadDimQK * 2)
               : "memory");
}

// L2 prefetch of one token row (1,152 bytes) of the cache: the epilogue's look-ahead at the next request's first
// blocks (the page-64 kernel prefetches their pages through the tensor map).
__device__ __forceinline__ void prefetch_row_l2(const DenseDecodeParams& p, int page, int row_in_page, int kv_head) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row_address(p, page, row_in_page, kv_head)),
               "r"(Traits::kHeadDimQK * 2)
               : "memory");
}

}  // namespace openmla::kernels::dense_decode::gather
