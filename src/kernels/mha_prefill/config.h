// Dense MHA prefill forward (sm_90a): per-variant traits, named hardware resources and the shared-memory plan.
// Design note: docs/mha-prefill.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/trace_format.h"
#include "common/varlen.h"

namespace openmla::kernels::mha_prefill {

// The tile: 128 query rows (two consumer warpgroups of 64) x key blocks of 128; the tile arithmetic is the varlen
// layer's (common/varlen.h).
inline constexpr int kBlockM = 128;
inline constexpr int kBlockN = 128;
using Tiles = varlen::Tiling<kBlockM, kBlockN>;

// kDQK: the Q/K head dimension (192: MLA's 128 NoPE + 64 RoPE; 128); d_v is 128 in both. kFp16: fp16 operands
// (else bf16); accumulation is fp32 either way.
template <int kDQK, bool kFp16>
struct Traits {
  static_assert(kDQK == 192 || kDQK == 128, "dense MHA prefill serves d_qk 192 and 128");
  static constexpr int kHeadDimQK = kDQK;
  static constexpr int kHeadDimV = 128;
  static constexpr bool kIsFp16 = kFp16;
  static constexpr int kBlockM = mha_prefill::kBlockM;  // query rows per tile
  static constexpr int kBlockN = mha_prefill::kBlockN;  // keys per block
  static constexpr int kRowsPerWarpgroup = 64;          // one wgmma M per consumer warpgroup
  // Operands live in shared memory as tiles of 128 rows x 64 columns (128 bytes: one 128B-swizzled row), which is
  // also one TMA box.
  static constexpr int kTileCols = 64;
  static constexpr int kRowBytes = kTileCols * 2;
  static constexpr int kTileBytes = kBlockM * kRowBytes;  // 16 KB
  static_assert(kBlockM == kBlockN, "Q, K and V tiles share one shape (128 rows)");
  static constexpr int kQKTiles = kHeadDimQK / kTileCols;  // 3 or 2
  static constexpr int kVTiles = kHeadDimV / kTileCols;    // 2
  // K and V ring depth. Two stages let the producer load block n - 1 while block n is consumed; 192/128 then takes
  // 208 KB of the 227 (docs/mha-prefill.md, "Shared memory"), so a third stage does not fit; 128/128 could take three.
  static constexpr int kStages = 2;

  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = 3 * kWarpgroupThreads;  // WG0, WG1 consumers (rows 0-63, 64-127); WG2 producer
  // setmaxnreg split of the CTA's 384 x 168 registers (__launch_bounds__(384, 1)): each consumer holds O (64 x 128
  // fp32: 64 registers), S of the next block (64), P of the current one as bf16 A fragments (32), the softmax state
  // and addresses; the producer runs the tile scan and issues TMA. setmaxnreg only redistributes (.inc blocks until
  // the registers are free), so the split may not exceed 3 x 168; values are multiples of 8.
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsConsumer = 232;
  static constexpr int kRegsProducer = 40;
  static_assert(2 * kRegsConsumer + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg only redistributes registers");
  static_assert(kRegsConsumer % 8 == 0 && kRegsProducer % 8 == 0, "setmaxnreg counts are multiples of 8");

  static constexpr uint32_t kQBytes = kQKTiles * kTileBytes;  // TMA bytes of one Q tile
  static constexpr uint32_t kKBytes = kQKTiles * kTileBytes;  // of one K block
  static constexpr uint32_t kVBytes = kVTiles * kTileBytes;   // of one V block

  // Running max before the first block: finite, so exp2(m_old - m_new) never sees inf - inf (a row whose logits are
  // all masked keeps it and ends with l = 0: out 0, lse +inf).
  static constexpr float kMaxInit = -1e30f;
};

// What the producer tells the consumers about a tile (shared memory, two slots: tile t in slot t % 2). The producer
// writes tile t + 1's record before the exchange barrier of tile t and the consumers read it after that barrier
// (kernel.cuh, "exchange"); the slot's previous reader (tile t - 1) passed the exchange of tile t - 1 before.
struct TileInfo {
  int valid;    // 0: no tile left (the consumers exit)
  int q_begin;  // first row of the sequence in q / out / lse
  int s_q;      // its query rows
  int s_k;      // its keys
  int head;     // query head
  int m_block;  // query block: rows [128 m_block, 128 m_block + 128) of the sequence
  int n_end;    // key blocks [0, n_end) are visited, last first; 0: no valid row sees a key
  int pad;
};

// Mbarriers: the Q buffer (one per CTA) and the K and V rings (pipeline::BarrierRing<kStages> names their slots and
// parities). (No GEMM turns between the consumer warpgroups since decision mha-v0.18, docs/mha-prefill.md.)
//   q_full:   producer -> consumers, 1 arrival (+ Q's TMA bytes; a plain arrival for a tile without keys)
//   k_full/v_full[s]: producer -> consumers, 1 arrival + the block's TMA bytes
//   k_free/v_free[s]: consumers -> producer, one arrival per consumer warp (8) after the wgmma reading the stage
// Named barrier kExchange (producer warp + both consumer warpgroups, bar.sync on both sides): once before the
// first tile, then once per tile when the consumers are past its last Q K^T (Q may be rewritten, the next record is
// published). A symmetric barrier rather than an mbarrier arrive / wait pair: both order the record's accesses in the
// PTX memory model, but compute-sanitizer racecheck follows only barriers every side waits on (docs/mha-prefill.md).
// Named barriers (id 0 is __syncthreads).
enum class NamedBarrier : int {
  kExchange = 1,  // producer warp + both consumer warpgroups, once per tile (above)
  kOStage0 = 2,   // warpgroup w's own (128 threads, id kOStage0 + w) around its O staging (the staged-O kernels only)
  kOStage1 = 3,
};
inline constexpr int kConsumerWarps = 8;

template <int kDQK, bool kFp16>
struct alignas(1024) SharedStorage {
  using T = Traits<kDQK, kFp16>;
  alignas(1024) uint8_t q[T::kQKTiles][T::kTileBytes];              // Q tile: 128 rows x d_qk, 128B-swizzled
  alignas(1024) uint8_t k[T::kStages][T::kQKTiles][T::kTileBytes];  // K blocks: 128 keys x d_qk
  alignas(1024) uint8_t v[T::kStages][T::kVTiles][T::kTileBytes];   // V blocks: 128 keys x 128
  TileInfo tile[2];
  int zero;  // 0 (set at the start): the tile counter's offset, read from here so ptxas cannot prove it uniform
  int pad_[3];
  uint64_t q_full;
  uint64_t k_full[T::kStages];
  uint64_t k_free[T::kStages];
  uint64_t v_full[T::kStages];
  uint64_t v_free[T::kStages];
};

// The trace of a trace build (CMake -DOPENMLA_TRACE=ON; format common/trace_format.h; kernel.cuh stamps it,
// tools/diag/kernel_trace.py mha-prefill reads it): one clock64 track. Per traced CTA (linear id < kCtas), role (WG0,
// WG1, producer) and traced tile (the steps: the CTA's first kTiles tiles) kEvents values: kFixedEvents, then
// kBlockEvents per visited key block (the first kMaxBlocks of the tile, in visit order: block n_end - 1 first). Stamps
// by the role's first thread. CTA header: start at kernel start (thread 0), end when WG0 finds no tile left (value:
// the tiles the CTA ran). Only constants here: a build without the trace compiles no stamp.
struct Trace {
  static constexpr int kCtas = 8, kRoles = 3, kTiles = 16, kMaxBlocks = 32;
  static constexpr int kFixedEvents = 10, kBlockEvents = 6;
  static constexpr int kEvents = kFixedEvents + kMaxBlocks * kBlockEvents;
  using Format = trace::Format<trace::Track<kCtas, kRoles, kTiles, kEvents>>;
  static constexpr int kRoleWg0 = 0, kRoleWg1 = 1, kRoleProducer = 2;
  // Fixed events of a consumer warpgroup's tile.
  enum ConsumerEvent : int {
    kTileStart = 0,      // the tile's record read (valid)
    kQReady = 1,         // q_full passed
    kExchangeEnter = 2,  // after the tile's last Q K^T, before the exchange barrier
    kExchangePassed = 3,
    kLastPvReady = 4,    // the last P V step: V(0) full passed
    kLastPvTurn = 5,     // its issue begins (the ping-pong turn was acquired here before decision mha-v0.18)
    kLastPvIssued = 6,   // its P V issued
    kLastPvDone = 7,     // its P V done: the epilogue starts
    kStoresDone = 8,     // out and lse stored
  };
  // Events of a consumer warpgroup's visited block j (the step that issues Q K^T of block j, with P V of j - 1).
  enum BlockEvent : int {
    kBlockDataReady = 0,  // K(j) (and V(j - 1)) full passed
    kBlockTurn = 1,       // the issue begins (the ping-pong turn was acquired here before decision mha-v0.18)
    kBlockIssued = 2,     // the step's GEMMs issued
    kBlockQkDone = 3,     // S = Q K(j)^T done
    kBlockSoftmaxDone = 4,  // mask (where needed) and the online-softmax step done
    kBlockPvDone = 5,     // O += P(j) V(j) done (stamped in step j + 1, or the last P V step)
  };
  // Fixed events of the producer's tile.
  enum ProducerEvent : int {
    kRecordPublished = 0,  // the tile's record written to its slot
    kQIssued = 1,          // Q's TMA issued (or the plain arrival of a tile without keys)
    kProducerExchangeEnter = 2,
    kProducerExchangePassed = 3,
    kMetaBlocks = 4,  // value, not a time: n_end | 1 << 63
    kMetaCoord = 5,   // value: head << 32 | m_block
  };
  // Events of the producer's visited block j.
  enum ProducerBlockEvent : int {
    kKIssued = 0,  // K(j)'s TMA issued (after its free wait)
    kVIssued = 1,  // V(j)'s TMA issued
  };
};

// O's staging in the staged-O kernels (kStagedO; docs/mha-prefill.md, decision mha-v0.14): per consumer warpgroup
// 64 rows x 64 columns (half of its O), 128B-swizzled, one TMA store box. It follows SharedStorage, whose size is a
// multiple of 1024, so each tile is 1024-aligned; the direct-store kernels do not ask for it.
template <int kDQK, bool kFp16>
inline constexpr int kOStageTileBytes = Traits<kDQK, kFp16>::kRowsPerWarpgroup * Traits<kDQK, kFp16>::kRowBytes;
static_assert(sizeof(SharedStorage<192, false>) % 1024 == 0 && sizeof(SharedStorage<128, false>) % 1024 == 0);

// The dynamic shared memory a launch asks for: the plan (and O's staging) plus the slack that aligns it to 1024 bytes.
template <int kDQK, bool kFp16, bool kStagedO>
inline constexpr int kSmemBytes =
    static_cast<int>(sizeof(SharedStorage<kDQK, kFp16>)) + (kStagedO ? 2 * kOStageTileBytes<kDQK, kFp16> : 0) + 1024;

static_assert(kSmemBytes<192, false, true> <= 232448, "d_qk 192 plan exceeds 227 KB");
static_assert(kSmemBytes<128, false, true> <= 232448, "d_qk 128 plan exceeds 227 KB");

}  // namespace openmla::kernels::mha_prefill
