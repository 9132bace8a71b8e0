// Sparse FP8 MLA decode (sm_90a): per-layout traits and the shared-memory plan.
// Design note: docs/sparse-decode.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/fp8_cache_layout.h"

#include "common/trace_format.h"

namespace openmla::kernels::sparse_decode {

enum class Layout { kV32, kModel1 };

struct Common {
  static constexpr int kHeadDimV = 512;
  static constexpr int kBlockM = 64;     // query heads per CTA (one wgmma M)
  static constexpr int kBlockN = 64;     // top-k slots per block (the scheduler's unit)
  static constexpr int kTileCols = 64;   // 64 x 16-bit = one 128-byte swizzled row
  static constexpr int kTileBytes = kBlockN * kTileCols * 2;  // 8192
  static constexpr int kRowBytes = kTileCols * 2;             // 128
  static constexpr int kSwizzleAtomBytes = 1024;
  static constexpr int kNumVTiles = kHeadDimV / kTileCols;    // 8
  static constexpr int kVTilesPerHalf = kNumVTiles / 2;       // 4: each consumer warpgroup owns 256 columns

  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = 3 * kWarpgroupThreads;  // WG0, WG1 consumers; WG2 producer
  // setmaxnreg split. Every thread starts with kLaunchRegs (ptxas: 65536 / 384 rounded down to 8 under
  // __launch_bounds__(384, 1)); the CTA owns 384 x kLaunchRegs registers and setmaxnreg only moves them between
  // warpgroups: .inc blocks until enough are free (a split summing above 3 x kLaunchRegs deadlocks), .inc below
  // the current count is an illegal instruction. WG0 holds O_L + S + P, WG1 O_R, the producer two units of
  // token bytes (docs/sparse-decode.md, decision sparse-v4).
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsWg0 = 200;
  static constexpr int kRegsWg1 = 168;
  static constexpr int kRegsProducer = 136;
  static_assert(kRegsWg0 + kRegsWg1 + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg only redistributes the CTA's registers");
  static_assert(kRegsWg0 >= kLaunchRegs && kRegsWg1 >= kLaunchRegs && kRegsProducer <= kLaunchRegs,
                "consumers grow, the producer shrinks");

  // Producer thread mapping: 4 threads per token (16 fp8 of each 64-dim tile each), 32 tokens per round.
  static constexpr int kThreadsPerToken = 4;
  static constexpr int kTokensPerRound = kWarpgroupThreads / kThreadsPerToken;  // 32

  static constexpr float kMaxInit = -1e30f;  // finite: exp2(m_old - m_new) never sees inf - inf

  // K buffer layout (docs/sparse-decode.md, decisions sparse-v7, sparse-v10). The first kGroupTiles tiles are
  // split into two halves of 4 tiles (V_L = tiles 0-3, V_R = tiles 4-7); inside a half, rows 8g..8g+7 of its 4
  // tiles are 4 consecutive 1024-byte swizzle atoms: tile t, row group g at (t / 4) * kHalfBytes + g * kGroupStride
  // + (t % 4) * 1024. 32 consecutive tokens of a half are then one contiguous 16 KB range (the crossover sends each
  // half of its 32 tokens to the peer with one bulk copy, as soon as that half of the buffer is free). Descriptors:
  // K-major SBO = kGroupStride; the MN-major V view of a half LBO = one atom (next 64 columns), SBO =
  // kGroupStride (next 8 tokens). Tiles from kGroupTiles on (V3.2's RoPE tile) are plain 8 KB tiles after them.
  static constexpr int kGroupTiles = 8;
  static constexpr int kHalfTiles = 4;
  static constexpr int kGroupStride = kHalfTiles * kSwizzleAtomBytes;  // 4096
  static constexpr int kHalfBytes = 8 * kGroupStride;                  // 32768: 64 tokens x 4 tiles
  static constexpr int kGroupBytes = kGroupTiles * kTileBytes;         // 65536
  static constexpr int kTokensPerGroup = 8;
};

// Named barriers (id 0 is __syncthreads).
enum class NamedBarrier : int {
  kConsumers = 1,  // WG0 and WG1 (256 threads): request switches; barrier.sync (unaligned: two roles' code)
  kProducer = 2,   // the producer warpgroup (128 threads): its shared-memory stores before a bulk copy to the peer
  kInit = 3,       // the whole CTA, once, after the mbarrier setup (plain kernel; the crossover syncs the cluster)
};

// The traits of one cache layout. The bytes it reads are the codec's (Cache: common/fp8_cache_layout.h); the
// shared-memory tiles hold 64 dims each, one e4m3 byte per dim in the cache.
template <Layout L>
struct Traits : Common {
  using Cache = std::conditional_t<L == Layout::kV32, fp8_cache::V32, fp8_cache::Model1>;
  static constexpr int kHeadDimQK = Cache::kHeadDim;                // 576 / 512
  static constexpr int kNopeTiles = Cache::kNopeDim / kTileCols;    // 8 / 7
  static constexpr int kRopeTile = kNopeTiles;                      // the 64 RoPE dims: one more tile
  static constexpr int kNumTiles = kNopeTiles + 1;                  // 9 / 8
  static constexpr int kTilesPerScale = Cache::kTileDim / kTileCols;  // 2 / 1
  // V3.2's RoPE tile only enters Q K^T (d_qk > d_v), so once that is done it holds P for the other warpgroup;
  // MODEL1's RoPE dims are part of V.
  static constexpr bool kPInRopeTile = kHeadDimQK > kHeadDimV;

  static_assert(Cache::kRopeDim == kTileCols && Cache::kNopeDim % kTileCols == 0 && Cache::kTileDim % kTileCols == 0);
};

// Shared memory. 128B-swizzled K-major tiles, 1024-byte aligned. The K buffers are filled by the producer
// warpgroups of BOTH CTAs of a cluster (each dequantises half of the 64 tokens and writes both copies).
template <Layout L>
struct alignas(1024) SharedStorage {
  using T = Traits<L>;
  static constexpr int kNumPBuffers = T::kPInRopeTile ? 1 : 2;  // V3.2: P lives in the dead RoPE tile
  alignas(1024) uint8_t q[T::kNumTiles][T::kTileBytes];
  alignas(1024) uint8_t k[2][T::kNumTiles * T::kTileBytes];  // layout: Common::kGroupTiles, k_chunk()
  alignas(1024) uint8_t p[kNumPBuffers][T::kTileBytes];  // P per K buffer (MODEL1); unused for V3.2, whose
                                                         // plan still fits with it (one array shape for both)
  float scale[2][T::kBlockM];   // per block: a = 2^(m_old - m_new), WG0 -> WG1
  float out_scale[T::kBlockM];  // epilogue: 1 / (row sum [+ sink term]), WG0 -> WG1
  uint32_t valid[2][T::kBlockN];  // per block: 1 if the slot holds a token (written by the producers of both CTAs)
  alignas(8) uint64_t full[2];     // producers (local + peer) -> consumers
  uint64_t free_[2][2];            // [buf][half] consumer warps (local + peer) -> producers: V_L tiles (WG0),
                                   // V_R tiles + RoPE/P tile + validity (WG0 and WG1)
  uint64_t p_ready[2];             // WG0 -> WG1: P and a of the block are in shared memory
  uint64_t q_full;                 // producer -> WG0: a later request's Q tile landed (cp.async arrive)
  uint64_t q_free;                 // WG0 -> producer: the current Q tile is no longer read
  uint64_t scale_free[2];          // WG1 -> WG0: scale[buf] of the block has been read
};

static_assert(sizeof(SharedStorage<Layout::kV32>) + 1024 <= 232448, "V3.2 smem plan exceeds 227 KB");
static_assert(sizeof(SharedStorage<Layout::kModel1>) + 1024 <= 232448, "MODEL1 smem plan exceeds 227 KB");

// The trace of a trace build (CMake -DOPENMLA_TRACE=ON; format common/trace_format.h; kernel.cuh stamps it,
// tools/diag/kernel_trace.py sparse-decode reads it). Only constants here.
//   Track 0, clock64: thread 0 of each warpgroup of the CTAs x < kCtas of query position 0, partition 0 (y = z = 0,
//     so their linear id is x; h_q = 128: the cluster pair) stamps its steps per block (roles WG0, WG1, producer;
//     step = the block, the first kIters), and WG0's thread 0 its request switches (role kRoleSwitch; step = the
//     partition's request, the first kSwitches).
//   Track 1, %globaltimer (ns, one clock for all SMs): the whole-kernel timeline of every CTA (linear id <
//     kTimelineCtas; one role, one step).
//   CTA header: start at kEntry, end at kExit (value 0).
struct Trace {
  static constexpr int kCtas = 2, kRoles = 4, kIters = 256, kEvents = 6, kSwitches = 16;
  static constexpr int kTimelineCtas = 1024, kTimelineEvents = 12;
  using Format = trace::Format<trace::Track<kCtas, kRoles, kIters, kEvents>,
                               trace::Track<kTimelineCtas, 1, 1, kTimelineEvents, trace::Clock::kNanoseconds>>;
  enum Role : int { kRoleWg0 = 0, kRoleWg1 = 1, kRoleProducer = 2, kRoleSwitch = 3 };
  // Events of a block (the kernel stamps them by number).
  enum Wg0Event : int { kWg0Wait = 0, kWg0Full = 1, kWg0Scores = 2, kWg0PHanded = 3, kWg0OLeft = 4 };
  enum Wg1Event : int { kWg1Wait = 0, kWg1PFull = 1, kWg1ORight = 2 };
  // Producer: step start, V_L half free, all stores issued (after the V_R half free), full arrived; the plain path
  // also round 0 and round 1 stored (between the V_L free and the stores issued).
  enum ProducerEvent : int {
    kProdStart = 0, kProdVlFree = 1, kProdStored = 2, kProdArrived = 3, kProdRound0 = 4, kProdRound1 = 5 };
  // A request switch of WG0 (step k: from request k to k + 1; the partition's last request stops at kSwStores).
  enum SwitchEvent : int {
    kSwLoopDone = 0,    // the request's last block done
    kSwQReleased = 1,   // Q released (q_free)
    kSwEpilogue = 2,    // epilogue barrier passed
    kSwStores = 3,      // output stores issued
    kSwNextQ = 4,       // next request: Q landed (cp.async wait)
    kSwQBarrier = 5,    // Q barrier passed
  };
  enum TimelineEvent : int {
    kEntry = 0,         // thread 0 at kernel entry
    kInitDone = 1,      // thread 0 after barrier init + cluster sync
    kQReady = 2,        // WG0 thread 0: first Q tile landed
    kFirstFull = 3,     // WG0 thread 0: first K block full
    kLastBlockDone = 4, // WG0 thread 0: O_L of the partition's last block done
    kEpilogueDone = 5,  // WG0 thread 0: last output stores issued
    kProducerDone = 6,  // producer thread 0: last block handed over
    kExit = 7,          // WG0 thread 0: after the closing cluster sync
    // Producer thread 0, head of the kernel; each waits for the value it names (the stamp forces the wait, so
    // these measure the dependent-load chain of the first block).
    kProdCursor = 8,    // first request's work (topk length) known
    kProdIndex = 9,     // first index landed
    kProdToken = 10,    // first token's bytes landed
    kProdFirstSent = 11,  // first block: V_L half stored and sent
  };
};

}  // namespace openmla::kernels::sparse_decode
