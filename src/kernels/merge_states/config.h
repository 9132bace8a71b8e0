// merge_attn_states kernel: its traits (the thread mapping), shared by kernel.cuh and the launchers.
//
// Thread mapping (docs/merge-states.md, "Kernel"): one warp per (token, head) row, kWarpsPerCta rows per CTA. A row
// is walked in chunks of kChunkElems = 8 columns: lane l owns chunks l, l + 32, ... (columns 8l .. 8l + 7, then
// 256 later, ...), so each load of a warp is one coalesced run of 32 chunks (512 bytes of bf16 / fp16, 1 KiB of
// fp32). For one column chunk the lane walks the partials kPartialsInFlight at a time, issuing all their loads
// before the first multiply-add: the kernel is memory-bound, and those loads are what keeps HBM busy.
#pragma once

#include <cstdint>

namespace openmla::kernels::merge_states {

// The element types of outs and out (each may be any of the three).
enum class Element : int { kBFloat16 = 0, kFloat16 = 1, kFloat32 = 2 };

inline constexpr int kWarpSize = 32;
inline constexpr int kChunkElems = 8;  // columns per lane per step: 16 bytes of bf16 / fp16, 32 of fp32
inline constexpr int kWarpColumns = kWarpSize * kChunkElems;  // 256 columns per warp step
// Rows per CTA: 4 warps (128 threads) keeps the grid fine-grained at small row counts (b 1, h 16: 16 rows).
inline constexpr int kWarpsPerCta = 4;
inline constexpr int kThreadsPerCta = kWarpsPerCta * kWarpSize;
// Partials whose chunk loads are issued together, before any is used (4 registers each for bf16 / fp16, 8 for fp32).
// The kernel compiles to 72 registers with bf16 / fp16 inputs (7 CTAs = 28 warps per SM: 28 x 4 x 512 bytes = 56 KiB
// of loads in flight, about twice HBM3's bandwidth x latency per SM, 3.35 TB/s x ~1 us / 132 ~ 25 KiB) and 106 with
// fp32 inputs (4 CTAs, 16 warps x 4 x 1 KiB). A floor of 8 CTAs per SM (64 registers) made ptxas spill.
inline constexpr int kPartialsInFlight = 4;
inline constexpr int kVectorBytes = 16;  // the API checks every row start and stride against this

static_assert(kChunkElems * 2 == kVectorBytes, "a bf16 / fp16 chunk is one 16-byte vector");

}  // namespace openmla::kernels::merge_states
