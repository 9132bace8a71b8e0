// Dense MLA decode (sm_90a): compile-time traits and the shared-memory plan.
// Design note: docs/dense-decode.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/seesaw.h"
#include "common/trace_format.h"

namespace openmla::kernels::dense_decode {

// The kernel's compile-time constants. A plain struct: none depends on a template parameter (the element type, the
// kernels' one, only selects the wgmma instructions), where the other kernels' Traits take their layout or shape.
struct Traits {
  static constexpr int kHeadDimQK = 576;  // 512 NoPE + 64 RoPE
  static constexpr int kHeadDimV = 512;   // V = first 512 dims of K
  static constexpr int kBlockM = 64;      // query rows of one CTA tile (one wgmma M)
  static constexpr int kBlockN = 64;      // KV tokens per block (= the page size the kernel takes)
  static constexpr int kTileCols = 64;    // columns per 128B-swizzled tile: 64 x 16-bit = 128 bytes
  static constexpr int kNumTiles = kHeadDimQK / kTileCols;       // 9 tiles per 64 x 576 block
  static constexpr int kNumVTiles = kHeadDimV / kTileCols;       // 8 tiles carry V
  static constexpr int kVTilesPerHalf = kNumVTiles / 2;          // 4 tiles = 256 columns per warpgroup
  static constexpr int kRopeTile = kNumTiles - 1;                // tile 8: RoPE dims, QK^T only
  // TMA granularity: one copy per tile GROUP (tiles 0-3 = V_L, 4-7 = V_R, 8 = RoPE), because issuing a TMA costs
  // ~100 cycles the whole warpgroup waits for (docs/dense-decode.md, decision dense-v8); one mbarrier per group.
  static constexpr int kNumTileGroups = 3;
  static constexpr int kTileBytes = kBlockN * kTileCols * 2;     // 8192
  static constexpr int kSwizzleAtomBytes = 1024;                 // 8 rows x 128 B
  static constexpr int kRowBytes = kTileCols * 2;                // 128

  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kNumWarpgroups = 2;  // WG0 owns O[:, 0:256], WG1 owns O[:, 256:512]
  static constexpr int kThreads = kWarpgroupThreads * kNumWarpgroups;

  // Output staging (aliases the K buffers once a request's main loop is done). Pitches padded to keep the
  // accumulator-layout writes free of bank conflicts.
  static constexpr int kStageBf16PitchBytes = kHeadDimV * 2 + 16;  // 1040
  static constexpr int kStageF32Pitch = kHeadDimV + 8;             // 520 floats

  // Row-max start value (base-2 scaled units): finite so that exp2(m_old - m_new) never sees inf - inf.
  static constexpr float kMaxInit = -1e30f;

  static_assert(kHeadDimQK % kTileCols == 0, "576 = 9 tiles of 64");
  static_assert(kVTilesPerHalf * kTileCols == 256, "each warpgroup owns a 64 x 256 O tile (wgmma N = 256)");
};

// Hand-offs between the two warpgroups inside a block pair (common/barrier_ring.cuh, SeesawHandoff: the first three;
// P1 goes into K1's RoPE tile before kScale1Ready, P0 into K0's before kP0Ready). Each is an mbarrier with 128
// arrivals (every thread of the producing warpgroup arrives with release semantics, after its shared-memory writes
// AND its last reads of what the other side will overwrite next); the consuming warpgroup waits on the pair's
// parity. mbarriers give the release/acquire ordering explicitly, which plain bar.arrive pairs leave implicit.
using Handoff = pipeline::SeesawHandoff;
inline constexpr int kHandoffs = 3;

// Named barriers (id 0 is __syncthreads); only bar.sync is used, every participant waits.
enum class NamedBarrier : int {
  kWg0Local = 1,     // WG0 only: zero-filled V rows are visible to its wgmma
  kWg1Local = 2,     // WG1 only: same for WG1
  kRowSumReady = 3,  // both: per-row partial sums exchanged in the epilogue; K buffers free for staging
};

// Split requests (docs/dense-decode.md, "Split requests"): how a split chunk's epilogue ends. Decided by thread 0
// from the request's chunk count and its merge counter, published to the CTA in SharedStorage::merge_info.
enum MergeMode : int {
  kMergeByCombine = 0,  // write the fp32 partial; the combine kernel merges (no counters, or more chunks)
  kMergeNow = 1,        // the other chunk already published: merge it with ours, write the final rows
  kMergePublish = 2,    // write and publish the partial; merge only if our publication turns out last
};

// Shared memory. Tiles are 1024-byte aligned for the 128B swizzle (TMA and wgmma agree on it).
struct alignas(1024) SharedStorage {
  alignas(1024) uint8_t q[Traits::kNumTiles][Traits::kTileBytes];  // Q tile, 64 x 576, K-major swizzled
  // Two KV blocks (K0 = even, K1 = odd block of a pair), 64 x 576 each. The RoPE tile of each buffer is
  // dead after its QK^T and doubles as the P buffer the other warpgroup reads (P0 in K0, P1 in K1).
  // After a request's main loop the whole area is the output staging buffer.
  alignas(1024) uint8_t k[2][Traits::kNumTiles][Traits::kTileBytes];
  float max0[Traits::kBlockM];    // m0 of the current pair (scaled base-2 units)
  float scale0[Traits::kBlockM];  // a0 = 2^(m_prev - m0)
  float max1[Traits::kBlockM];    // m1
  float scale1[Traits::kBlockM];  // a1 = 2^(m0 - m1)
  float row_sum[2][Traits::kBlockM];
  alignas(8) uint64_t k_bar[2][Traits::kNumTileGroups];  // one TMA completion barrier per tile group
  uint64_t handoff[kHandoffs];
  uint64_t merge_bar;  // the other chunk's partial rows landed in the staging area (bulk loads, tx bytes)
  uint64_t q_bar;      // TMA path: a request's Q tile landed (9 box loads, tx bytes)
  int merge_info[3];   // thread 0 -> all: MergeMode of this epilogue, the other chunk's split slot, merges so far
  int q_waits;  // TMA path: completions of q_bar waited for so far (thread 0 counts)
};

static_assert(sizeof(SharedStorage::k) >= Traits::kBlockM * Traits::kStageF32Pitch * 4, "fp32 staging fits in K");
static_assert(sizeof(SharedStorage) + 1024 <= 232448, "227 KB opt-in shared memory limit of sm_90");

// The trace of a trace build (CMake -DOPENMLA_TRACE=ON; format common/trace_format.h; kernel.cuh stamps it,
// tools/diag/kernel_trace.py dense-decode reads it): one track, the request timeline. Thread 0 of every CTA (linear
// id < kCtas) stamps %globaltimer (ns, one clock for all SMs) at each step of its first kRequests requests (the
// track's steps). Its CTA header: start = the first request's prologue start, end = the last request's kDone (value:
// the requests the CTA ran); a CTA without a request stamps nothing. Only constants here.
struct Trace {
  static constexpr int kCtas = 1024, kRequests = 8, kEvents = 8;
  using Format = trace::Format<trace::Track<kCtas, 1, kRequests, kEvents, trace::Clock::kNanoseconds>>;
  enum Event : int {
    kPrologueStart = 0,  // top of the request
    kPrologueDone = 1,   // after the prologue's barrier (first KV loads issued, Q landed)
    kFirstTiles = 2,     // WG0: the request's first K tiles landed (first Q K^T done)
    kLoopDone = 3,       // after the last block pair
    kStaged = 4,         // epilogue: output staged in shared memory
    kStored = 5,         // epilogue: global stores issued
    kDone = 6,           // after the epilogue's last barrier
    kBlocks = 7,         // (value, not a time) blocks of the request in this partition
  };
};

}  // namespace openmla::kernels::dense_decode
