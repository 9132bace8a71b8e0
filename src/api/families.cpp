// Which kernel families this build has (api/families.h). The only file that turns the OPENMLA_HAS_<FAMILY>
// definitions into values; the entry points test the macros themselves, since an absent family's launchers do not
// exist to be linked.
#include "api/families.h"

#include <string>

namespace openmla::detail {

bool family_built(KernelFamily family) {
  switch (family) {
    case KernelFamily::kKVCache:
#if defined(OPENMLA_HAS_KV_CACHE)
      return true;
#else
      return false;
#endif
    case KernelFamily::kDecode:
#if defined(OPENMLA_HAS_DENSE_DECODE)
      return true;
#else
      return false;
#endif
    case KernelFamily::kSparsePrefill:
#if defined(OPENMLA_HAS_SPARSE_PREFILL)
      return true;
#else
      return false;
#endif
    case KernelFamily::kMhaPrefill:
#if defined(OPENMLA_HAS_MHA_PREFILL)
      return true;
#else
      return false;
#endif
    case KernelFamily::kMergeStates:
#if defined(OPENMLA_HAS_MERGE_STATES)
      return true;
#else
      return false;
#endif
  }
  return false;
}

const char* family_option(KernelFamily family) {
  switch (family) {
    case KernelFamily::kKVCache: return "OPENMLA_ENABLE_KV_CACHE";
    case KernelFamily::kDecode: return "OPENMLA_ENABLE_DENSE_DECODE";
    case KernelFamily::kSparsePrefill: return "OPENMLA_ENABLE_SPARSE_PREFILL";
    case KernelFamily::kMhaPrefill: return "OPENMLA_ENABLE_MHA_PREFILL";
    case KernelFamily::kMergeStates: return "OPENMLA_ENABLE_MERGE_STATES";
  }
  return "unknown";
}

KernelFamily family_of(Feature feature) {
  switch (feature) {
    case Feature::kKVCacheQuantize: return KernelFamily::kKVCache;
    case Feature::kDenseDecode:
    case Feature::kSparseDecode:
    case Feature::kDecodeBatchInvariant:
    case Feature::kDenseDecodeFp8:
    case Feature::kDenseDecodeAnyPageSize:
    case Feature::kDecodeVarlenQ: return KernelFamily::kDecode;  // one option builds both decode kernels
    case Feature::kSparsePrefill:
    case Feature::kSparsePrefillFp8: return KernelFamily::kSparsePrefill;
    case Feature::kDensePrefill: return KernelFamily::kMhaPrefill;  // the forward and the backward
    case Feature::kDensePrefillFp8: return KernelFamily::kMhaPrefill;  // the FP8 forward
    case Feature::kMergeStates: return KernelFamily::kMergeStates;
  }
  return KernelFamily::kDecode;
}

namespace {

// What the family's option leaves out, as the message says it.
const char* family_kernels(KernelFamily family) {
  switch (family) {
    case KernelFamily::kKVCache: return "FP8 KV-cache codec kernels";
    case KernelFamily::kDecode: return "decode kernels, dense or sparse";
    case KernelFamily::kSparsePrefill: return "sparse prefill kernels";
    case KernelFamily::kMhaPrefill: return "dense MHA prefill kernels";
    case KernelFamily::kMergeStates: return "attention-state merge kernel";
  }
  return "kernels";
}

}  // namespace

Status family_not_built(KernelFamily family, const char* entry) {
  return Status::unsupported(std::string(entry) + ": this build has no " + family_kernels(family) + " (CMake " +
                             family_option(family) + "=OFF)");
}

Status trace_not_built(const char* entry) {
  return Status::unsupported(std::string(entry) + ": this build has no kernel traces (CMake OPENMLA_TRACE=OFF)");
}

}  // namespace openmla::detail
