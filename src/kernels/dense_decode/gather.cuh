// Dense MLA decode, page sizes 1, 2, 4 and 8 (docs/dense-decode.md, "Page sizes", "Small pages: the gather kernel"):
// the KV rows of a 64-token block come from up to 64 pages (at page 1 the block table is a per-token slot list), so
// they are gathered by 16-byte cp.async into the 128B-swizzled tiles the TMA would have written, by the warpgroup
// that refills the tile group, completing on the same K barriers through cp.async.mbarrier.arrive.noinc.
//
// Thread roles: thread `wg_tid` of either warpgroup owns row wg_tid / 2 of every block and, in every 64-column tile,
// the 16-byte chunks of parity wg_tid % 2 (chunks h, h + 2, h + 4, h + 6). One warp instruction then reads 32
// contiguous bytes of each of 16 rows (whole 32-byte sectors), a thread needs one page id per block, and every copy of
// a tile group is [register + immediate] on both sides: the global row pointer plus tile * 128 + k * 32, the shared
// row address XOR k * 32 plus tile * 8192 (the 128-byte swizzle XORs the chunk index with row % 8: chunk h + 2k of the
// row lands at byte ((h + 2k) ^ (row % 8)) << 4 = ((h ^ row % 8) << 4) ^ (k << 5) of its 128-byte tile row).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "kernels/dense_decode/config.h"
#include "kernels/dense_decode/params.h"

namespace openmla::kernels::dense_decode::gather {

// The page sizes the gather kernel takes: below the any-page kernel's TMA boxes (a box of fewer than 8 rows breaks the
// swizzle atom's alignment, and 64 / P copies per tile would be issued).
inline constexpr int kMaxPageSize = 8;

// 16-byte cp.async with an L2 cache policy and a 128-byte L2 fetch (a token row is 9 x 128 bytes: nothing of a
// neighbouring row is pulled in); src_bytes = 0 zero-fills the destination without reading `src`.
__device__ __forceinline__ void cp_async_16_hint(uint32_t smem_dst, const void* src, uint32_t src_bytes,
                                                 uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;" ::"r"(smem_dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

// Waits for this thread's committed cp.async groups (the Q tile) only: the KV gathers are never committed (they
// complete on the K barriers), so a wait_all would also wait for the first two blocks.
__device__ __forceinline__ void cp_async_wait_committed() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// The row of a 64-token block this thread gathers (either warpgroup), and the parity of its chunks.
__device__ __forceinline__ int row_of(int wg_tid) { return wg_tid >> 1; }

// The page holding row `row` of block `blk` of request `req`, or -1: a row at or past the sequence's length (the entry
// is never read; the row is zero-filled, as TMA fills out-of-bounds boxes, then masked) or an entry outside the cache
// [0, num_cache_blocks) (zero-filled, never an address: the page-64 kernel's TMA bounds give the same zeros).
__device__ __forceinline__ int page_of_row(const DenseDecodeParams& p, int req, int blk, int row, int seqlen,
                                           int log2_page) {
  const int tok = blk * Traits::kBlockN + row;
  if (tok >= seqlen) return -1;
  const int page = p.block_table[static_cast<int64_t>(req) * p.block_table_stride + (tok >> log2_page)];
  return page >= 0 && page < p.num_cache_blocks ? page : -1;
}

// Gathers this thread's row (page `page`, -1: zeros) of tiles [t_begin, t_end) (whole tile groups) into K buffer
// `buf`, and after each group arrives on that group's barrier once its copies have landed (.noinc: the barrier counts
// the 128 threads of the warpgroup that refills the group). `page_size` is a power of two <= 8: the row's place in its
// page is row % page_size.
__device__ __forceinline__ void gather_kv_tiles(SharedStorage& smem, const DenseDecodeParams& p, int page,
                                                int page_size, int wg_tid, int kv_head, int buf, int t_begin, int t_end,
                                                uint64_t policy) {
  const int row = row_of(wg_tid), half = wg_tid & 1;
  const uint8_t* src = static_cast<const uint8_t*>(p.k_cache);
  const uint32_t src_bytes = page >= 0 ? 16u : 0u;
  if (page >= 0)
    src += 2 * (static_cast<int64_t>(page) * p.k_stride_block + static_cast<int64_t>(row & (page_size - 1)) * p.k_stride_row +
                static_cast<int64_t>(kv_head) * p.k_stride_head) +
           half * 16;
  const uint32_t dst = ptx::smem_addr(smem.k[buf][0]) + row * Traits::kRowBytes + ((half ^ (row & 7)) << 4);
  for (int t = t_begin; t < t_end;) {
    const int g = t / Traits::kVTilesPerHalf;
    const int n = g == 2 ? 1 : Traits::kVTilesPerHalf;
#pragma unroll
    for (int i = 0; i < Traits::kVTilesPerHalf; ++i) {
      if (i >= n) break;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        cp_async_16_hint((dst ^ (k << 5)) + (t + i) * Traits::kTileBytes, src + (t + i) * Traits::kRowBytes + k * 32,
                         src_bytes, policy);
    }
    ptx::cp_async_mbarrier_arrive_noinc(&smem.k_bar[buf][g]);
    t += n;
  }
}

// L2 prefetch of one token row (1,152 bytes) of the cache: the epilogue's look-ahead at the next request's first
// blocks (the page-64 kernel prefetches their pages through the tensor map).
__device__ __forceinline__ void prefetch_row_l2(const DenseDecodeParams& p, int page, int row_in_page, int kv_head) {
  const uint8_t* src = static_cast<const uint8_t*>(p.k_cache) +
                       2 * (static_cast<int64_t>(page) * p.k_stride_block + static_cast<int64_t>(row_in_page) * p.k_stride_row +
                            static_cast<int64_t>(kv_head) * p.k_stride_head);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(Traits::kHeadDimQK * 2) : "memory");
}

}  // namespace openmla::kernels::dense_decode::gather
