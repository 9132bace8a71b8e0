// Scalar log-sum-exp merge math of the combine kernel, host+device so the CPU tests check exactly the
// code the kernel runs (base 2 throughout; see docs/decode-schedule.md section 6).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define OPENMLA_MERGE_FN __host__ __device__ __forceinline__
#else
#define OPENMLA_MERGE_FN inline
#endif

namespace openmla::kernels::combine {

// Shift used before exponentiating chunk lse values: their max, or 0 when every chunk is empty (-inf),
// so 2^(l - shift) is 0 instead of NaN.
OPENMLA_MERGE_FN float lse_shift(float max_lse) { return max_lse == -INFINITY ? 0.f : max_lse; }

// G = log2(sum) + shift, or +inf (no visible key) when the sum is 0.
OPENMLA_MERGE_FN float merged_lse_log2(float sum, float shift) { return sum == 0.f ? INFINITY : log2f(sum) + shift; }

// Denominator of the output weights with an attention sink t (base 2): log2(2^G + 2^t), computed as
// max + log2(1 + 2^-|G - t|) so it never overflows. t = -inf returns G; t = +inf returns +inf (out = 0).
// Only called with a finite G (an empty row is 0 whatever the sink).
OPENMLA_MERGE_FN float add_sink_log2(float g, float sink_log2) {
  if (sink_log2 == -INFINITY) return g;
  return fmaxf(g, sink_log2) + log2f(1.f + exp2f(-fabsf(g - sink_log2)));
}

}  // namespace openmla::kernels::combine
