// The online-softmax steps of the seesaw kernels (dense decode, sparse prefill: docs/dense-decode.md, "Warp roles"),
// where two warpgroups take the two blocks of a pair and chain the softmax through shared memory: WG0 computes its
// block's max and publishes it with the factor that rescales the running state (wg0_softmax), WG1 continues from
// them with its block's max (wg1_rescale). The scalar parts are common/online_softmax.cuh's; the kernels' shared
// memory provides the exchange arrays max0, scale0, max1, scale1 (one float per row of the 64-row tile); WG0 then takes
// WG1's max back (wg0_receive). The
// hand-offs that order them: common/seesaw.h. Device only (the layer: docs/architecture.md, "Device layer").
#pragma once

#include "common/mma_tile.cuh"
#include "common/online_softmax.cuh"

namespace openmla::kernels::seesaw {

// WG0, block 0 of the pair: m0 = max(m, rowmax S0 * scale), a0 = 2^(m - m0), S0 <- P0 = 2^(S0 * scale - m0),
// l <- l a0 + rowsum P0 (this thread's columns); m0 and a0 published to shared memory (one lane per row). Returns a0,
// the factor O's rows are rescaled by.
template <class Smem>
__device__ __forceinline__ void wg0_softmax(float (&s)[32], float scale_log2, const float (&m_run)[2], float (&l_run)[2],
                                            Smem& smem, const tile::Fragment& frag, int lane, float (&a0)[2]) {
  float mx[2], m0[2], sum[2];
  tile::row_max(s, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m0[i] = softmax::new_max(m_run[i], mx[i], scale_log2);
    a0[i] = softmax::rescale_factor(m_run[i], m0[i]);
  }
  tile::exponentiate(s, scale_log2, m0, sum);
  softmax::update_row_sums(l_run, a0, sum);
  if (lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      smem.max0[frag.row[i]] = m0[i];
      smem.scale0[frag.row[i]] = a0[i];
    }
  }
}

// WG1, block 1 of the pair, once WG0 published (kMax0Ready): from m0, a0 and the row max mx of S1 (-inf without a
// block 1): m1 = max(m0, mx * scale), a1 = 2^(m0 - m1), a01 = a0 a1 (what WG1's O, still relative to m, is rescaled
// by); the running max becomes m1; m1 and a1 published to shared memory (one lane per row).
template <class Smem>
__device__ __forceinline__ void wg1_rescale(const float (&mx)[2], float scale_log2, float (&m_run)[2], Smem& smem,
                                            const tile::Fragment& frag, int lane, float (&m1)[2], float (&a1)[2],
                                            float (&a01)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m0 = smem.max0[frag.row[i]];
    const float a0 = smem.scale0[frag.row[i]];
    m1[i] = softmax::new_max(m0, mx[i], scale_log2);
    a1[i] = softmax::rescale_factor(m0, m1[i]);
    a01[i] = a0 * a1[i];
    m_run[i] = m1[i];
    if (lane % 4 == 0) {
      smem.scale1[frag.row[i]] = a1[i];
      smem.max1[frag.row[i]] = m1[i];
    }
  }
}

// WG0, once WG1 published (kScale1Ready): a1 = 2^(m0 - m1) and m1 from shared memory; the running max becomes m1
// and this warpgroup's row sums move to it (l <- l a1). Returns a1, the factor P0 and O_L are rescaled by.
template <class Smem>
__device__ __forceinline__ void wg0_receive(const Smem& smem, const tile::Fragment& frag, float (&m_run)[2],
                                            float (&l_run)[2], float (&a1)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    a1[i] = smem.scale1[frag.row[i]];
    m_run[i] = smem.max1[frag.row[i]];
    l_run[i] *= a1[i];
  }
}

}  // namespace openmla::kernels::seesaw
