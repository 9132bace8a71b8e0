// A valid dense MHA prefill call for the host-only tests (test_mha_prefill_api.cpp, test_build_options.cpp): 4
// sequences packed into 1000 query rows and 1500 key rows, h_q = 16, h_kv = 2 (GQA 8), (d_qk, d_v) = (192, 128),
// causal, bf16, flash_mla's transposed lse. No CUDA call: the pointers are the caller's fakes.
#pragma once

#include <cstdint>

#include "openmla/prefill.h"

namespace openmla::testing {

inline MhaPrefillProblem mha_fixture_problem(int num_sms) {
  return MhaPrefillProblem{.batch = 4,
                           .h_q = 16,
                           .h_kv = 2,
                           .d_qk = 192,
                           .d_v = 128,
                           .dtype = DType::kBFloat16,
                           .causal = true,
                           .max_seqlen_qo = 0,
                           .num_sms = num_sms};
}

// `ptr(i)`: the fake device pointer of argument i = 1..8 (aligned, the arguments' bytes never overlapping).
template <class Ptr>
MhaPrefillArgs mha_fixture_args(Ptr ptr) {
  MhaPrefillArgs a;
  a.q = make_tensor(ptr(1), DType::kBFloat16, {1000, 16, 192});
  a.k = make_tensor(ptr(2), DType::kBFloat16, {1500, 2, 192});
  a.v = make_tensor(ptr(3), DType::kBFloat16, {1500, 2, 128});
  a.cu_seqlens_qo = make_tensor(ptr(4), DType::kInt32, {5});
  a.cu_seqlens_kv = make_tensor(ptr(5), DType::kInt32, {5});
  a.softmax_scale = 0.125f;
  a.workspace = make_tensor(ptr(6), DType::kUInt8, {16});
  a.out = make_tensor(ptr(7), DType::kBFloat16, {1000, 16, 128});
  a.lse = make_tensor(ptr(8), DType::kFloat32, {1000, 16}, {1, 1000});  // flash_mla's transposed lse
  return a;
}

}  // namespace openmla::testing
