// The online-softmax row update of the MLA attention kernels, base 2 with the softmax scale folded in (dense decode,
// sparse decode; sparse prefill computes the same). Each thread holds two rows of a 64 x 64 S fragment
// (tile::Fragment: rows row[0] and row[1]) and, per row, the running max m (scaled base-2 units) and its part l of
// the row sum relative to m. One step over a block of logits S:
//
//   m_new = max(m_old, rowmax(S) * scale_log2)     (m starts at a finite -1e30, so m_old - m_new is never inf - inf)
//   a     = 2^(m_old - m_new)                      the factor that rescales O and l to the new max
//   P     = 2^(S * scale_log2 - m_new)             ex2.approx; masked logits are -inf and give 0
//   l     = l * a + rowsum(P)                      this thread's columns only; quad_sum() at the end
//
// rowmax, the exponentials and the O rescale are the fragment operations of common/mma_tile.cuh (tile::row_max,
// tile::exponentiate, tile::scale_rows); the scalar parts are here. Each kernel composes the step itself: the seesaw
// kernels split it between two warpgroups (one computes m_new and a from its block, the other continues from them),
// and a function wrapping the whole step compiled both decode kernels to different machine code (its inlined body
// is optimised differently), so there is none (docs/architecture.md, "Device layer"). Numerics:
// docs/dense-decode.md, "Masking and numerics".
#pragma once

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"

namespace openmla::kernels::softmax {

// The new running max of a row from its old max and the row max of a block's raw logits.
__device__ __forceinline__ float new_max(float m_old, float block_row_max, float scale_log2) {
  return fmaxf(m_old, block_row_max * scale_log2);
}

// The factor that takes values relative to m_old to values relative to m_new.
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) { return ptx::exp2_approx(m_old - m_new); }

// l <- l * a + sum, for both rows.
__device__ __forceinline__ void update_row_sums(float (&l)[2], const float (&a)[2], const float (&sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = l[i] * a[i] + sum[i];
}

}  // namespace openmla::kernels::softmax
