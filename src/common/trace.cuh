// The stamps of a trace build (CMake -DOPENMLA_TRACE=ON, compile definition OPENMLA_HAS_TRACE; docs/architecture.md,
// "Trace builds"), in the one format of common/trace_format.h. A kernel keeps its event table (config.h: its Format and
// event enums), one __device__ array of Format::kDeviceValues in its kernel.cuh, and its stamp macros, each defined
// once on top of OPENMLA_TRACE_ONLY:
//
//   #define OPENMLA_X_STAMP(role, step, ev) OPENMLA_TRACE_ONLY(x::stamp(role, step, ev))
//
// so that without OPENMLA_HAS_TRACE every macro is ((void)0), names nothing, and the kernel compiles to the
// production SASS. Each instantiation unit has its own copy of the kernel's array (whole-program compilation): the
// unit hands out its address (detail::trace_buffer, common/trace_symbols.cuh) and the host reads the copy of the
// variant that launched last.
//
// Who stamps is the kernel's choice (its macro tests the thread); the helpers below drop any stamp outside the
// format (a CTA, step or role the track does not keep), so a kernel may stamp unconditionally.
#pragma once

#include "common/trace_format.h"

#if defined(OPENMLA_HAS_TRACE)
#define OPENMLA_TRACE_ONLY(...) (__VA_ARGS__)
#else
#define OPENMLA_TRACE_ONLY(...) ((void)0)
#endif

#if defined(OPENMLA_HAS_TRACE)
#include <cstdint>

#include "common/ptx.cuh"

namespace openmla::trace {

// clock64 with a memory clobber, so the compiler keeps the stamp in program order with the asm around it (wgmma,
// barriers, loads and stores).
__device__ __forceinline__ unsigned long long cycles() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
template <Clock kClock>
__device__ __forceinline__ unsigned long long now() {
  if constexpr (kClock == Clock::kCycles)
    return cycles();
  else
    return ptx::globaltimer();
}
// The CTA index of every track and CTA header: the linear CTA id.
__device__ __forceinline__ unsigned cta() { return ptx::linear_cta_id(); }
// Thread 0 of each warpgroup (the stamping thread of most roles).
__device__ __forceinline__ bool warpgroup_leader() { return threadIdx.x % 128 == 0; }

// Index of (cta, role, step, ev) of track kTrack in the kernel's array, in 32-bit arithmetic (an array is far below
// 2^32 values; 64-bit index math cost the MHA trace build registers).
template <class F, int kTrack>
__device__ __forceinline__ unsigned index(unsigned cta, int role, uint32_t step, int ev) {
  using T = typename F::template TrackAt<kTrack>;
  static_assert(F::kDeviceValues < (size_t{1} << 31), "32-bit trace indices");
  return static_cast<unsigned>(F::template device_offset<kTrack>()) +
         ((cta * T::kRoles + static_cast<unsigned>(role)) * T::kSteps + step) * T::kEvents + static_cast<unsigned>(ev);
}

// Value `ev` of `role`'s step `step` in track kTrack of format F: `value` as it is (a count, coordinates).
template <class F, int kTrack>
__device__ __forceinline__ void put(unsigned long long* buffer, int role, uint32_t step, int ev,
                                    unsigned long long value) {
  using T = typename F::template TrackAt<kTrack>;
  const unsigned c = cta();
  if (c < T::kCtas && step < T::kSteps) buffer[index<F, kTrack>(c, role, step, ev)] = value;
}
// Event `ev` of `role`'s step `step` of CTA `c` in track kTrack of format F: the time now on the track's clock. `c` is
// the linear CTA id; a kernel that knows it more cheaply for the CTAs it stamps passes it (sparse decode: blockIdx.x
// where blockIdx.y = blockIdx.z = 0: the linear id computed in its loops cost registers). `step` is unsigned, so a
// negative step converted to it is dropped.
template <class F, int kTrack>
__device__ __forceinline__ void stamp_at(unsigned long long* buffer, unsigned c, int role, uint32_t step, int ev) {
  using T = typename F::template TrackAt<kTrack>;
  if (c < T::kCtas && step < T::kSteps) buffer[index<F, kTrack>(c, role, step, ev)] = now<T::kClock>();
}
// The same for the calling CTA.
template <class F, int kTrack>
__device__ __forceinline__ void stamp(unsigned long long* buffer, int role, uint32_t step, int ev) {
  stamp_at<F, kTrack>(buffer, cta(), role, step, ev);
}
// The same once `dep` has landed: the value is stored first (to the CTA header's scratch value), the store needs the
// register, and the warp issues in order, so the stamp measures when a load's result arrived.
template <class F, int kTrack>
__device__ __forceinline__ void stamp_after(unsigned long long* buffer, int role, uint32_t step, int ev, uint32_t dep) {
  const unsigned c = cta();
  if (c < F::kCtas) *reinterpret_cast<volatile unsigned long long*>(&buffer[c * kCtaValues + kCtaScratch]) = dep;
  stamp<F, kTrack>(buffer, role, step, ev);
}

// The CTA's start (one thread): its SM and block index, and both clocks (so a tool can convert cycles to ns).
template <class F>
__device__ __forceinline__ void cta_start(unsigned long long* buffer) {
  const unsigned c = cta();
  if (c >= F::kCtas) return;
  unsigned long long* h = buffer + c * kCtaValues;
  uint32_t smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  h[kCtaSmid] = static_cast<unsigned long long>(smid) | (1ull << 63);
  h[kCtaBlock] = blockIdx.x | (static_cast<unsigned long long>(blockIdx.y) << 32) |
                 (static_cast<unsigned long long>(blockIdx.z) << 48);
  h[kCtaStartClock] = cycles();
  h[kCtaStartTimer] = ptx::globaltimer();
}
// The CTA's end (one thread; a later call overwrites an earlier one): the kernel's value and both clocks.
template <class F>
__device__ __forceinline__ void cta_end(unsigned long long* buffer, unsigned long long value) {
  const unsigned c = cta();
  if (c >= F::kCtas) return;
  unsigned long long* h = buffer + c * kCtaValues;
  h[kCtaValue] = value;
  h[kCtaEndClock] = cycles();
  h[kCtaEndTimer] = ptx::globaltimer();
}

}  // namespace openmla::trace
#endif
