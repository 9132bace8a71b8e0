// Dense MHA prefill backward (sm_90a): per-variant traits, the shared-memory plan, the barriers and the layout of the
// fp32 dq accumulator. Design note: docs/mha-prefill-bwd.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/varlen.h"

#if defined(__CUDACC__)
#define OPENMLA_BWD_FN __host__ __device__ inline constexpr
#else
#define OPENMLA_BWD_FN inline constexpr
#endif

namespace openmla::kernels::mha_prefill_bwd {

// A CTA's tile: one sequence's kv head and 128 keys (two consumer warpgroups of 64 keys); it walks the query blocks
// of 64 rows that see those keys, for every query head that reads the kv head. The tile arithmetic is the varlen
// layer's (common/varlen.h), by key blocks.
inline constexpr int kBlockM = 64;   // query rows per step
inline constexpr int kBlockN = 128;  // keys per tile
using Tiles = varlen::Tiling<kBlockM, kBlockN>;

// The fp32 dq accumulator (workspace): per query head, the query rows of sequence i start at padded row
// pad_row(i) = 64 * ((begin_i + 64 i) / 64), so every query block of every sequence is one aligned 64-row block and
// blocks of different sequences never overlap; a block holds kQKTiles sub-blocks of 64 rows x 64 columns, each in
// the order of the m64n64 accumulator fragment (dq_accum_index): the consumers' stores to the staging tile are then
// 16-byte and conflict-free, and the block reaches global memory by one bulk reduction per sub-block.
OPENMLA_BWD_FN int64_t dq_padded_blocks(int64_t total_q, int64_t batch) {
  return (total_q + 64 * batch) / 64 + 2;
}
// Index (in floats) of element (row r, column c) of a 64 x 64 sub-block: the float c % 2 of float4 (c / 8) of thread
// t = 32 (r / 16) + 4 (r % 8) + (c % 8) / 2 of a warpgroup, its float4s 512 floats apart (a warp's 32 float4s are
// contiguous).
OPENMLA_BWD_FN int dq_accum_index(int r, int c) {
  const int t = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2;
  const int e = ((r % 16) / 8) * 2 + (c % 2);
  return (c / 8) * 512 + t * 4 + e;
}
inline constexpr int kSubBlockFloats = 64 * 64;

// The deterministic mode's order of the key blocks' dq additions to a query block, non-causal: when a sequence has no
// more key blocks (N) than the call has CTAs, key block n walks its M query blocks from walk_start(n) = floor(n M / N)
// and wraps, so that the CTAs of a kv head reach each query block at different steps, and the additions to query
// block m go in the order the walks reach it: key block n_a (the last whose walk starts at or before m), n_a - 1, ...,
// 0, then N - 1, ..., n_a + 1 (rotated_rank). A CTA may then wait for a key block taken after its own, which cannot
// deadlock while the N tiles of a kv head fit in the grid (the API's grid >= N test). Otherwise: block 0 first.
OPENMLA_BWD_FN int walk_start(int n, int num_n, int num_m) {
  return static_cast<int>(static_cast<int64_t>(n) * num_m / num_n);
}
OPENMLA_BWD_FN int rotated_rank(int n, int m, int num_n, int num_m) {
  int last = static_cast<int>((static_cast<int64_t>(m + 1) * num_n + num_m - 1) / num_m) - 1;
  if (last > num_n - 1) last = num_n - 1;
  return n <= last ? last - n : last + 1 + (num_n - 1 - n);
}

// kDQK: the Q/K head dimension (192 or 128); d_v is 128. kFp16: fp16 operands (else bf16); accumulation in fp32.
template <int kDQK, bool kFp16>
struct Traits {
  static_assert(kDQK == 192 || kDQK == 128, "dense MHA prefill serves d_qk 192 and 128");
  static constexpr int kHeadDimQK = kDQK;
  static constexpr int kHeadDimV = 128;
  static constexpr bool kIsFp16 = kFp16;
  static constexpr int kBlockM = mha_prefill_bwd::kBlockM;
  static constexpr int kBlockN = mha_prefill_bwd::kBlockN;
  static constexpr int kKeysPerWarpgroup = 64;
  static constexpr int kTileCols = 64;  // shared tiles: 64 columns (128-byte rows, 128B-swizzled), one TMA box wide
  static constexpr int kRowBytes = kTileCols * 2;
  static constexpr int kKTileBytes = kBlockN * kRowBytes;  // K, V, dS: 128 rows, 16 KB
  static constexpr int kQTileBytes = kBlockM * kRowBytes;  // Q, dO: 64 rows, 8 KB
  static constexpr int kQKTiles = kDQK / kTileCols;        // 3 or 2
  static constexpr int kVTiles = kHeadDimV / kTileCols;    // 2
  static constexpr int kStages = 2;                        // the Q / dO / lse / D ring

  static constexpr int kWarpgroupThreads = 128;
  // Two warpgroups (keys 0-63, 64-127), no producer warpgroup: each thread may take 255 registers (dK 64 x d_qk fp32:
  // 96 or 64, dV 64 x 128: 64, for the whole tile; per step S^T and dP^T, 32 each, their A fragments, 16 each, or
  // the dQ sub-blocks, 32 or 64), which a third warpgroup's share would not leave (2 x 240 + 24). Thread 32 (kLoaderThread)
  // issues the loads one step ahead; warp 0 walks the tiles.
  static constexpr int kThreads = 2 * kWarpgroupThreads;

  static constexpr uint32_t kKBytes = kQKTiles * kKTileBytes;
  static constexpr uint32_t kVBytes = kVTiles * kKTileBytes;
  static constexpr uint32_t kQBytes = kQKTiles * kQTileBytes;
  static constexpr uint32_t kDoBytes = kVTiles * kQTileBytes;
  static constexpr uint32_t kRowStatBytes = kBlockM * 4;  // the block's lse (base 2) or D
  static constexpr uint32_t kStepBytes = kQBytes + kDoBytes + 2 * kRowStatBytes;
};

// The tile record warp 0 publishes (two slots: tile t in slot t % 2, so a slow reader of tile t - 1's record is never
// overwritten).
struct TileInfo {
  int valid;        // 0: no tile left (the consumers exit)
  int q_begin;      // the sequence's first query row
  int s_q;          // its query rows
  int k_begin;      // its first key row
  int s_k;          // its keys
  int kv_head;      // the tile's kv head
  int n_block;      // keys [128 n_block, 128 n_block + 128) of the sequence
  int m_begin;      // query blocks [m_begin, m_end) see the tile's keys (an empty range: dk = dv = 0)
  int m_end;
  int pad_block;    // the sequence's first padded block in the dq accumulator and the row statistics
  int walk_from;    // the query block walk starts at m_begin + walk_from and wraps (walk_start; 0: in order)
  int rotated;      // 1: the deterministic order is rotated_rank's (else key block order or causal's)
};

// Mbarriers:
//   kv_full:   the loader's loads -> everyone, once per tile: 1 arrival + K's and V's bytes
//   step_full[s]: the loader's loads -> everyone, per step: 1 arrival + Q, dO, lse and D bytes
//   step_free[s]: everyone -> the loader, per step: one arrival per warp (8) after the step's last reads of Q, dO, lse
//              and D (the loader waits before loading the step two ahead into the slot)
// Named barriers (id 0 is __syncthreads):
enum class NamedBarrier : int {
  kTileStart = 1,  // both warpgroups, once per tile: the record is published and every thread is past the previous
                   // tile's GEMMs (K and V may be reloaded)
  kDsFree = 2,    // both consumer warpgroups, per step: the previous step's dQ GEMMs (readers of dS and of the dq
                  // staging tiles' previous reductions) are done; dS may be rewritten
  kDsReady = 3,   // both consumer warpgroups, per step: dS of this step is in shared memory
  kStage0 = 4,    // warpgroup w's own (id kStage0 + w): its dq sub-blocks are staged, the reduction may be issued
  kStage1 = 5,
};
inline constexpr int kConsumerWarps = 8;
// The thread that issues the TMA loads: lane 0 of warp 1 (warp 0 walks the tiles and its thread 0 leads warpgroup 0's
// dq reductions).
inline constexpr int kLoaderThread = 32;
inline constexpr int kConsumerThreads = 256;

template <int kDQK, bool kFp16>
struct alignas(1024) SharedStorage {
  using T = Traits<kDQK, kFp16>;
  alignas(1024) uint8_t k[T::kQKTiles][T::kKTileBytes];               // the tile's K: 128 keys x d_qk
  alignas(1024) uint8_t v[T::kVTiles][T::kKTileBytes];                // its V: 128 keys x 128
  alignas(1024) uint8_t q[T::kStages][T::kQKTiles][T::kQTileBytes];   // a step's Q: 64 rows x d_qk
  alignas(1024) uint8_t dout[T::kStages][T::kVTiles][T::kQTileBytes];  // its dO: 64 rows x 128
  alignas(1024) uint8_t ds[T::kKTileBytes];                            // dS^T: 128 keys x 64 query rows (16-bit)
  alignas(1024) float dq_stage[T::kQKTiles][kSubBlockFloats];          // the step's dQ sub-blocks (fp32)
  float lse[T::kStages][T::kBlockM];   // the step's lse, base 2 (padded rows: a huge value, so P = 0)
  float dsum[T::kStages][T::kBlockM];  // D = rowsum(dO o O) (padded rows: 0)
  TileInfo tile[2];
  int zero;
  int pending_order[2];  // deterministic: warpgroup w's reduced block whose count is not raised yet (-1: none)
  int pad_;
  int order_target[2];   // deterministic: the count warpgroup w's step must still wait for before its reductions (-1:
                         // seen at the step's start)
  uint64_t kv_full;
  uint64_t step_full[T::kStages];
  uint64_t step_free[T::kStages];
};

template <int kDQK, bool kFp16>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage<kDQK, kFp16>)) + 1024;
static_assert(kSmemBytes<192, false> <= 232448, "d_qk 192 backward plan exceeds 227 KB");
static_assert(kSmemBytes<128, false> <= 232448, "d_qk 128 backward plan exceeds 227 KB");

}  // namespace openmla::kernels::mha_prefill_bwd

#undef OPENMLA_BWD_FN
