// Phase bookkeeping of the mbarriers that guard buffers shared between the roles of a kernel (the layer:
// docs/architecture.md, "Device layer").
//
// An mbarrier completes phase after phase; a waiter names the phase it waits for by its parity: the wait returns once
// the latest completed phase has that parity (the current one has the other). On a fresh barrier, in phase 0, a wait
// for parity 1 returns at once. The kernels count uses and derive the parity from the count, here.
//
// A ring of kStages buffers used in order: use n (n = 0, 1, 2, ...) is slot n % kStages, and it is that slot's
// (n / kStages)-th use. Each slot has a "full" barrier (use n's fill completes it; the consumers wait on it with
// parity(n)) and, where a producer refills it, a "free" barrier (use n's release by the consumers completes it; the
// producer waits on it before fill n with free_parity(n), the parity of the release of use n - kStages, which on a
// fresh barrier passes at once). Sparse decode: the two K buffers (kStages = 2, n = the partition's block count so
// far) and its Q tile (kStages = 1, n = the Q generation); dense decode: its Q tile and merge buffer (kStages = 1,
// n = the waits so far).
//
// Barriers that complete exactly once per step of a loop keep the parity as a bit flipped per step instead of a
// count (PhaseBit; the same thing as BarrierRing<1> of the step count): dense decode's per-buffer tile-group
// barriers, and the hand-off barriers of the seesaw kernels (Handoffs).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "common/seesaw.h"

// Hang detector of the waits that depend on another role's progress (wait_or_trap): a wait that has not completed
// after kWatchdogNs traps, so a kernel whose other role stopped fails its launch with an error instead of hanging the
// process. The check runs only on the slow path of a wait. 0 compiles it out.
#ifndef OPENMLA_WATCHDOG
#define OPENMLA_WATCHDOG 1
#endif

namespace openmla::kernels::pipeline {

// 20 s: far beyond any wait of a working kernel, also under compute-sanitizer.
inline constexpr unsigned long long kWatchdogNs = 20ull * 1000 * 1000 * 1000;

// Blocks until the phase of `bar` with parity `parity` has completed, trapping after kWatchdogNs (OPENMLA_WATCHDOG).
// For a producer's waits on the consumers' releases: a trap in a consumer warpgroup's code makes ptxas serialise its
// wgmma and spill (docs/mha-prefill.md, "Watchdog"), so consumers wait with ptx::mbarrier_wait_parity.
__device__ __forceinline__ void wait_or_trap(uint64_t* bar, uint32_t parity) {
  if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
#if OPENMLA_WATCHDOG
  const unsigned long long t0 = ptx::globaltimer();
  for (uint32_t spins = 1;; ++spins) {
    if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
    if ((spins & 1023u) == 0 && ptx::globaltimer() - t0 > kWatchdogNs) __trap();
  }
#else
  ptx::mbarrier_wait_parity(bar, parity);
#endif
}

template <int kStages>
struct BarrierRing {
  static_assert(kStages >= 1, "a ring has at least one slot");
  // The slot of use n.
  __device__ __forceinline__ static int slot(uint32_t n) { return static_cast<int>(n % kStages); }
  // The parity of the completion that use n makes on its slot's barrier (the fill's on a full barrier, the release's
  // on a free one): what a wait for it passes.
  __device__ __forceinline__ static uint32_t parity(uint32_t n) { return (n / kStages) & 1u; }
  // What the producer passes to its wait on the free barrier before fill n: the parity of the release of use
  // n - kStages (a fresh barrier lets the first kStages fills through at once).
  __device__ __forceinline__ static uint32_t free_parity(uint32_t n) { return parity(n) ^ 1u; }
};

// The parity of a barrier (or a set of barriers) that completes once per step, flipped at the end of each step.
struct PhaseBit {
  uint32_t bit = 0;
  __device__ __forceinline__ void flip() { bit ^= 1u; }
};

// Hand-off barriers between warpgroups, one per kind of hand-off (`Id`: an enum class numbering them from 0): each
// completes once per step when every thread of the handing warpgroup has arrived (release: after its shared-memory
// writes and its last reads of what the other side overwrites next); the receiving warpgroup waits with the step's
// parity (docs/dense-decode.md, "Barriers").
template <typename Id>
struct Handoffs {
  uint64_t* bars;  // the barriers, indexed by Id, each initialised with the handing warpgroup's thread count
  PhaseBit phase;

  __device__ __forceinline__ void arrive(Id h) const { ptx::mbarrier_arrive(&bars[static_cast<int>(h)]); }
  __device__ __forceinline__ void wait(Id h) const {
    ptx::mbarrier_wait_parity(&bars[static_cast<int>(h)], phase.bit);
  }
  __device__ __forceinline__ void next_step() { phase.flip(); }
};

}  // namespace openmla::kernels::pipeline
