// OpenMLA: capability queries. Each answers "supported" or the reason it is not.
#pragma once

#include <string>

#include "openmla/status.h"

namespace openmla {

enum class Feature : int {
  kKVCacheQuantize = 0,  // FP8 KV-cache quantise / dequantise / append kernels
  kDenseDecode = 1,      // dense MLA decode over a paged BF16/FP16 cache
  kSparseDecode = 2,     // sparse top-k MLA decode over an FP8 cache
  kSparsePrefill = 3,    // sparse MLA prefill
  kDensePrefill = 4,     // dense MHA prefill forward/backward
  kMergeStates = 5,      // merge_attn_states: combining partial attention states (decode context parallelism)
  kDecodeBatchInvariant = 6,  // batch-invariant decode schedules (DenseDecodeProblem / SparseDecodeProblem::
                              // batch_invariant): served wherever the decode kernels are
  kDenseDecodeFp8 = 7,  // dense MLA decode over an FP8 e4m3 cache with per-tensor scales (openmla/dense_decode_fp8.h)
  kDensePrefillFp8 = 8,  // dense MHA prefill forward with float8_e4m3fn q, k, v (MhaPrefillProblem::dtype
                         // kFloat8E4M3): served wherever the dense prefill kernels are
  kDenseDecodeAnyPageSize = 9,  // dense decode at every page size 1, 2, 4, ..., 256 (k_cache.shape[1]; page 1 = a
                                // per-token slot list): served wherever dense decode is
  kDecodeVarlenQ = 10,  // per-request query lengths in dense and sparse decode (DenseDecodeProblem / SparseDecodeProblem::
                       // varlen_q, seqused_q): served wherever the decode kernels are
  kSparsePrefillFp8 = 11,  // sparse MLA prefill straight from the paged FP8 cache (sparse_prefill_fp8, bf16 compute)
};

const char* feature_name(Feature feature);

struct Capability {
  bool supported = false;
  std::string reason;  // empty when supported
};

// Is `feature` usable on CUDA device `device_id` with this build? Never throws, never syncs.
// Reasons name what is missing: no CUDA device, compute capability != 9.0, feature compiled out, or
// the kernel is not implemented yet in this version.
Capability query_capability(Feature feature, int device_id = 0);

// Library version "major.minor.patch" and the git commit it was built from.
const char* version_string();
const char* build_commit();

}  // namespace openmla
