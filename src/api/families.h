// The kernel families a build may leave out (CMake OPENMLA_ENABLE_<FAMILY>=OFF; docs/architecture.md, "Build
// options"): whether this build has each one, and the error every entry point of an absent one returns.
//
// The switch itself is at compile time: each entry point launches its kernels under `#if defined(OPENMLA_HAS_<FAMILY>)`
// (CMakeLists.txt defines the macro when the family is built) and returns family_not_built() otherwise, after its
// argument checks, so a call gets the same argument errors in every build. query_capability() answers from the same
// table (capability.cpp), so a family it reports as compiled out is one whose entry points say "not built".
#pragma once

#include "openmla/capability.h"
#include "openmla/status.h"

namespace openmla::detail {

enum class KernelFamily : int {
  kKVCache,        // OPENMLA_ENABLE_KV_CACHE: quantize / dequantize / append_kv_cache
  kDecode,         // OPENMLA_ENABLE_DENSE_DECODE: plan_decode, dense_decode, sparse_decode (scheduler and combine too)
  kSparsePrefill,  // OPENMLA_ENABLE_SPARSE_PREFILL: sparse_prefill
  kMhaPrefill,     // OPENMLA_ENABLE_MHA_PREFILL: mha_prefill
  kMergeStates,    // OPENMLA_ENABLE_MERGE_STATES: merge_attn_states
};

// Whether this build compiled the family's kernels.
bool family_built(KernelFamily family);
// The CMake option that switches the family, e.g. "OPENMLA_ENABLE_DENSE_DECODE".
const char* family_option(KernelFamily family);
// The family whose kernels serve `feature`.
KernelFamily family_of(Feature feature);

// kUnsupported: "<entry>: this build has no <family's kernels> (CMake <option>=OFF)".
Status family_not_built(KernelFamily family, const char* entry);
// kUnsupported: "<entry>: this build has no kernel traces (CMake OPENMLA_TRACE=OFF)"; the trace readers' answer in a
// build without OPENMLA_TRACE (api/trace.h).
Status trace_not_built(const char* entry);

}  // namespace openmla::detail
