// Checked mode's kernel (include/openmla/checked.h): reads the device-side inputs of one call and records the first
// violation in the device's InputCheckRecord (params.h). One launch per checked call, before its main kernel, on the
// caller's stream: graph-capturable, no host synchronisation, no allocation (the record is a __device__ variable).
//
// Grid: x walks the elements of one check in a grid-stride loop, y is the check. Each thread stops at its first
// violation (its lowest element: its elements come in increasing order), each CTA keeps the lowest of its threads'
// and re-reads that element (the inputs do not change during the call), and thread 0 merges it into the record under
// a spin lock: only CTAs that found something take it, once.
#pragma once

#include <cstdint>

#include "kernels/input_check/params.h"
#include "kernels/input_check/rules.h"

namespace openmla::kernels::input_check {

inline constexpr int kThreads = 256;
inline constexpr int64_t kNone = INT64_MAX;

// The first violation found on this device (one copy: this header is included by launch.cu only).
__device__ InputCheckRecord g_record;

// Merges a violation into the device's record: the earliest call, then the first check, then the lowest element.
__device__ void record_violation(const InputCheckParams& p, int check, int64_t element, const Violation& v) {
  while (atomicCAS(&g_record.lock, 0, 1) != 0) __nanosleep(64);
  __threadfence();
  volatile InputCheckRecord* r = &g_record;
  const bool take = r->found == 0 || p.epoch < r->epoch ||
                    (p.epoch == r->epoch && (check < r->check || (check == r->check && element < r->element)));
  if (take) {
    const InputCheck& c = p.checks[check];
    r->epoch = p.epoch;
    r->entry = p.entry;
    r->argument = c.argument;
    r->kind = c.kind;
    r->check = check;
    r->element = element;
    for (int k = 0; k < 3; ++k) r->coords[k] = v.coords[k];
    r->value = v.value;
    r->bound = v.bound;
    r->detail = v.detail;
    r->found = 1;
  }
  __threadfence();
  atomicExch(&g_record.lock, 0);
}

__global__ void __launch_bounds__(kThreads) input_check_kernel(const __grid_constant__ InputCheckParams p) {
  const int check = static_cast<int>(blockIdx.y);
  const InputCheck& c = p.checks[check];
  const int64_t count = check_element_count(c);
  int64_t first = kNone;
  Violation v;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    if (element_violates(c, e, &v)) {
      first = e;
      break;
    }
  }
  __shared__ int64_t warp_first[kThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) first = min(first, __shfl_xor_sync(0xffffffffu, first, off));
  if (threadIdx.x % 32 == 0) warp_first[threadIdx.x / 32] = first;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) first = min(first, warp_first[w]);
  if (first == kNone) return;
  element_violates(c, first, &v);  // the CTA's lowest violation, read again by thread 0
  record_violation(p, check, first, v);
}

}  // namespace openmla::kernels::input_check
