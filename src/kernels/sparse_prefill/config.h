// Sparse top-k MLA prefill (sm_90a): per-layout traits, named hardware resources and the shared-memory plan.
// Design note: docs/sparse-prefill.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/seesaw.h"
#include "common/trace_format.h"

// Bytes of L2 prefetch per 16-byte gather (compile definition): 128, so that the hint on a row's last chunk does not
// pull half of a neighbouring, unselected 1152-byte (V3.2) or 1024-byte (MODEL1) row into L2. 256 (FlashMLA's
// choice) measured 1-4 % slower on the rows that miss L2 and equal on the L2-resident ones (docs/sparse-prefill.md,
// decision sparse-prefill-v6).
#ifndef OPENMLA_SP_L2_PREFETCH
#define OPENMLA_SP_L2_PREFETCH 128
#endif

namespace openmla::kernels::sparse_prefill {

// d_qk = 576 (DeepSeek-V3.2: 512 NoPE + 64 RoPE; V = the first 512 dims) or 512 (MODEL1: V = all 512 dims).
template <int kDQK>
struct Traits {
  static_assert(kDQK == 576 || kDQK == 512, "sparse prefill serves d_qk 576 and 512");
  static constexpr int kHeadDimQK = kDQK;
  static constexpr int kHeadDimV = 512;
  static constexpr int kBlockM = 64;    // query heads of one tile (one wgmma M)
  static constexpr int kBlockN = 64;    // top-k slots per block
  static constexpr int kTileCols = 64;  // 64 x bf16 = one 128-byte swizzled row
  static constexpr int kRowBytes = kTileCols * 2;
  static constexpr int kTileBytes = kBlockN * kRowBytes;  // 8192
  static constexpr int kNumTiles = kHeadDimQK / kTileCols;      // 9 or 8
  static constexpr int kVTilesPerHalf = 4;                      // each consumer warpgroup owns 256 output columns
  // Tile groups of a K buffer, each with its own full/free mbarrier pair: V_L (tiles 0-3), V_R (tiles 4-7) and,
  // for d_qk = 576, the RoPE tile 8 (Q K^T only; once that is done it holds P for the other warpgroup).
  static constexpr bool kPInRopeTile = kHeadDimQK == 576;
  static constexpr int kNumGroups = kPInRopeTile ? 3 : 2;
  static constexpr int kRopeTile = 8;

  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = 3 * kWarpgroupThreads;  // WG0, WG1 consumers; WG2 producer
  // setmaxnreg split of the CTA's 384 x 168 registers (ptxas gives each thread 168 under __launch_bounds__(384, 1);
  // .inc blocks until enough are free, so the split may not exceed 3 x 168). Each consumer holds a 64 x 256 fp32 O
  // tile (128), the 64 x 64 S tile (32) and its bf16 A fragments (16); the producer only addresses and indices.
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsConsumer = 216;
  static constexpr int kRegsProducer = 72;
  static_assert(2 * kRegsConsumer + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg only redistributes registers");

  // Producer mapping: warp w gathers rows 16w..16w+15 of a block, 8 lanes per row (one 128-byte tile row per
  // warp instruction and row), rows 16w + lane/8 + 4j for j = 0..3.
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kRowsPerThread = 4;

  static constexpr float kMaxInit = -1e30f;  // finite: exp2(m_old - m_new) never sees inf - inf
};

// Hand-offs between the consumer warpgroups inside a block pair (mbarriers of 128 arrivals, one completion per
// pair): the seesaw's four (common/seesaw.h; WG1 publishes m1 and a1 before its exponentials, then P1 on its own).
using Handoff = pipeline::SeesawHandoff;
inline constexpr int kHandoffs = 4;

// Named barriers (id 0 is __syncthreads).
enum class NamedBarrier : int {
  kRowSums = 1,  // the two consumer warpgroups: partial row sums exchanged in the epilogue
};

template <int kDQK>
struct alignas(1024) SharedStorage {
  using T = Traits<kDQK>;
  static constexpr int kNumPBuffers = T::kPInRopeTile ? 0 : 2;
  alignas(1024) uint8_t q[T::kNumTiles][T::kTileBytes];     // Q tile (64 heads x d_qk), TMA, 128B-swizzled
  alignas(1024) uint8_t k[2][T::kNumTiles][T::kTileBytes];  // K0 = even block, K1 = odd block of a pair
  alignas(1024) uint8_t p[kNumPBuffers > 0 ? kNumPBuffers : 1][kNumPBuffers > 0 ? T::kTileBytes : 16];  // d_qk 512
  float max0[T::kBlockM];    // m0 of the current pair (scaled base-2 units)
  float scale0[T::kBlockM];  // a0 = 2^(m_prev - m0)
  float max1[T::kBlockM];    // m1
  float scale1[T::kBlockM];  // a1 = 2^(m0 - m1)
  float row_sum[2][2][T::kBlockM];  // [tile parity][warpgroup][row]: epilogue exchange (double-buffered)
  alignas(8) uint16_t valid[2][4];  // per K buffer: bit i of word w = slot 16w + i holds a token
  uint64_t full[2][T::kNumGroups];   // producer -> consumers: a tile group landed (cp.async arrivals + 4 plain)
  uint64_t free_[2][T::kNumGroups];  // last reader (128 threads) -> producer: the tile group may be refilled
  uint64_t handoff[kHandoffs];
  uint64_t q_full;  // producer's TMA of the tile's Q landed (tx bytes)
  uint64_t q_free;  // both consumer warpgroups (256 arrivals) are past their last Q K^T of the tile
};

static_assert(sizeof(SharedStorage<576>) + 1024 <= 232448, "d_qk 576 plan exceeds 227 KB");
static_assert(sizeof(SharedStorage<512>) + 1024 <= 232448, "d_qk 512 plan exceeds 227 KB");

// The trace of a trace build (CMake -DOPENMLA_TRACE=ON; format common/trace_format.h; kernel.cuh stamps it,
// tools/diag/kernel_trace.py sparse-prefill reads it): one clock64 track. Thread 0 of each warpgroup of the CTAs with
// linear id < kCtas stamps each step of its first kPairs block pairs (the steps, counted over the CTA's tiles). CTA
// header: start = the producer's first pair start, end = WG0's last tile epilogue (value: the pairs WG0 ran). The
// kernel stamps the events by number. Only constants here.
struct Trace {
  static constexpr int kCtas = 2, kRoles = 3, kPairs = 96, kEvents = 8;
  using Format = trace::Format<trace::Track<kCtas, kRoles, kPairs, kEvents>>;
  enum Role : int { kRoleWg0 = 0, kRoleWg1 = 1, kRoleProducer = 2 };
  // WG0: pair start, S0 = Q K0^T done, m0 published, P0 V0_L done, a1 received, P0 stored, P1 V1_L done, tile
  // epilogue done (last pair of a tile only).
  enum Wg0Event : int {
    kWg0Start = 0, kWg0S0 = 1, kWg0M0Published = 2, kWg0PV0 = 3, kWg0A1 = 4, kWg0P0Stored = 5, kWg0PV1 = 6,
    kWg0Epilogue = 7 };
  // WG1: pair start, S1 = Q K1^T done, m0 received, P1 stored + a1 published, P1 V1_R done, P0 received, P0 V0_R
  // done, tile epilogue done. kWg1P1Stored follows the P1 store (a1 went out before the exponentials, decision
  // sparse-prefill-v5); kWg1PV1 is P1 V1_R issued (not waited for).
  enum Wg1Event : int {
    kWg1Start = 0, kWg1S1 = 1, kWg1M0 = 2, kWg1P1Stored = 3, kWg1PV1 = 4, kWg1P0 = 5, kWg1PV0 = 6,
    kWg1Epilogue = 7 };
  // Producer: pair start, then the fill of K0 V_L, K1 V_R, K0 V_R, K0 RoPE, K1 RoPE, K1 V_L issued (each after its
  // free wait), the next pair's rows prefetched.
  enum ProducerEvent : int {
    kProdStart = 0, kProdK0Vl = 1, kProdK1Vr = 2, kProdK0Vr = 3, kProdK0Rope = 4, kProdK1Rope = 5, kProdK1Vl = 6,
    kProdPrefetch = 7 };
};

}  // namespace openmla::kernels::sparse_prefill
