// Loading a query tile into shared memory: 64 rows x d_qk columns as d_qk / 64 tiles of 64 x 64 16-bit elements,
// 128B-swizzled K-major (the tile convention of common/mma_tile.cuh), the A operand of S = Q K^T (the layer:
// docs/architecture.md, "Device layer").
//
// By TMA (load_q_tile_tma): one thread issues one box load per tile of a 4-D tensor map (columns, heads, query
// positions, requests; box 64 x 64, 128-byte swizzle), all completing on one transaction mbarrier. Dense decode loads
// a partition's later Q tiles this way (docs/dense-decode.md, decision dense-v17); sparse prefill loads every tile
// this way. The 16-byte cp.async paths stay with their kernels: dense decode gathers rows of several query positions
// of a kv head, sparse decode the heads of one position, and the two loops compile differently on purpose (unrolled,
// and kept rolled with a laundered start so ptxas does not hoist the addresses).
#pragma once

#include <cstdint>

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"

namespace openmla::kernels {

// Issues the kTiles box loads of one Q tile (rows head0 .. head0 + 63 of query position `position` of request
// `request`) into `tiles` and arms `bar` with their bytes. Called by one thread; the waiters wait on `bar`. `policy`:
// none, or one L2 cache policy for the loads (sparse prefill reads each Q tile once: evict_first, decision
// sparse-prefill-v7).
template <int kTiles, class... Policy>
__device__ __forceinline__ void load_q_tile_tma(uint8_t (*tiles)[tile::kTileBytes], const CUtensorMap* map,
                                                uint64_t* bar, int head0, int position, int request,
                                                Policy... policy) {
  static_assert(sizeof...(Policy) <= 1, "at most one cache policy");
  constexpr int kTileCols = tile::kRowBytes / 2;  // 64 16-bit columns per tile
  ptx::mbarrier_arrive_expect_tx(bar, kTiles * tile::kTileBytes);
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
    ptx::tma_load_4d(tiles[t], map, bar, t * kTileCols, head0, position, request, policy...);
}

}  // namespace openmla::kernels
