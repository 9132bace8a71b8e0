// The prologue every warp-specialised kernel of the library shares: its shared storage in the dynamic shared memory,
// aligned to 1024 bytes (the 128B swizzle's atom: TMA and wgmma agree on it; launches ask for sizeof(storage) + 1024),
// and each thread's warpgroup made provably warp-uniform (wgmma under a branch ptxas cannot prove uniform is
// serialised). Device only (the layer: docs/architecture.md, "Device layer").
#pragma once

#include <cstdint>

namespace openmla::kernels::cta {

// The kernel's shared storage, at the first 1024-byte boundary of the dynamic shared memory.
template <class Storage>
__device__ __forceinline__ Storage& shared_storage() {
  extern __shared__ uint8_t smem_raw[];
  return *reinterpret_cast<Storage*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

// Thread `tid`'s warpgroup (128 threads each: every kernel's Traits::kWarpgroupThreads), broadcast from lane 0 so that ptxas knows it warp-uniform.
__device__ __forceinline__ int warpgroup(int tid) { return __shfl_sync(0xffffffffu, tid / 128, 0); }

}  // namespace openmla::kernels::cta
