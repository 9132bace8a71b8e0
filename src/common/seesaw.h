// The hand-off kinds of the seesaw kernels. Plain data (the kernels' config headers, host-compiled too, size their
// barrier arrays with it); the barriers themselves: common/barrier_ring.cuh, Handoffs.
#pragma once

namespace openmla::kernels::pipeline {

// The hand-offs of the seesaw kernels (dense decode, sparse prefill: docs/dense-decode.md, "Warp roles"), where two
// warpgroups chain the online softmax of a block pair through shared memory. A kernel uses the first kHandoffs of them
// (dense decode 3: its WG1 stores P1 before kScale1Ready; sparse prefill 4).
enum class SeesawHandoff : int {
  kMax0Ready = 0,    // WG0 published m0 and a0 = 2^(m - m0) for the pair
  kScale1Ready = 1,  // WG1 published m1 and a1 = 2^(m0 - m1) (dense decode: and stored P1)
  kP0Ready = 2,      // WG0 stored P0, rescaled to m1
  kP1Ready = 3,      // WG1 stored P1 (sparse prefill, whose WG1 publishes a1 before its exponentials)
};

}  // namespace openmla::kernels::pipeline
