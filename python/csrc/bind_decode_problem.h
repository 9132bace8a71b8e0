// The decode problem as the binding takes it: keyword arguments (bind_decode.cpp) -> the family's problem struct of
// include/openmla/decode.h (DenseDecodeProblem or SparseDecodeProblem). The binding never builds the compatibility
// form DecodeProblem.
#pragma once

#include <string>

#include "bind_common.h"
#include "openmla/decode.h"

namespace openmla::py {

// One decode problem of either family: `sparse` says which struct holds it.
struct FamilyDecodeProblem {
  bool sparse = false;
  DenseDecodeProblem dense;
  SparseDecodeProblem sparse_problem;
};

// Which family an entry takes: the one the keyword `sparse` names (get_decode_workspace_sizes, plan_decode), or its
// own (dense_decode, sparse_decode).
enum class DecodeFamily { kByKeyword, kDense, kSparse };

// The problem from keyword arguments, each field by name (unspecified fields keep the header's defaults). Accepted:
// every field of both families and `sparse` (the keyword form of earlier versions). A field the family's struct does
// not have is accepted at the value that family implies (dense: topk, extra_topk, extra_page_block_size 0; sparse:
// h_kv 1, causal False, max_blocks_per_seq 0), else ValueError naming it; `sparse` that contradicts the entry's own
// family raises ValueError; a field of the wrong Python type, or an unknown keyword, TypeError. `entry` names the
// function in those messages.
FamilyDecodeProblem decode_problem_from_kwargs(const nb::kwargs& kwargs, DecodeFamily family, const char* entry);

// 'bf16' ('bfloat16'), 'fp16' ('float16'), 'fp8_v32', 'fp8_model1'; anything else raises ValueError.
KVCacheFormat cache_format_from_name(const std::string& name);

// The workspace sizes of a problem (host arithmetic; no CUDA call when num_sms > 0). Raises the C++ API's error.
DecodeWorkspaceSizes decode_workspace_sizes(const DenseDecodeProblem& problem);
DecodeWorkspaceSizes decode_workspace_sizes(const SparseDecodeProblem& problem);

}  // namespace openmla::py
