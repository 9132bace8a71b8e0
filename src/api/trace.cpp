// Trace readers (api/trace.h): forward to the family's launcher in a trace build that has the family, else answer
// why not. The only file outside src/kernels that names the kernels' trace functions.
#include "api/trace.h"

#include "api/families.h"

#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
#include "kernels/dense_decode/launch.h"
#include "kernels/sparse_decode/launch.h"
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_SPARSE_PREFILL)
#include "kernels/sparse_prefill/launch.h"
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_MHA_PREFILL)
#include "kernels/mha_prefill/launch.h"
#endif

namespace openmla::detail {

namespace {

// Why this build cannot read the family's trace; OK when it can.
[[maybe_unused]] Status trace_gap(KernelFamily family, const char* entry) {
#if !defined(OPENMLA_HAS_TRACE)
  (void)family;
  return trace_not_built(entry);
#else
  if (!family_built(family)) return family_not_built(family, entry);
  return Status::ok();
#endif
}

}  // namespace

Status read_sparse_decode_trace(unsigned long long* host, size_t count) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
  return kernels::copy_sparse_decode_trace(host, count);
#else
  (void)host;
  (void)count;
  return trace_gap(KernelFamily::kDecode, "sparse_decode_trace");
#endif
}

Status clear_sparse_decode_trace() {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
  return kernels::clear_sparse_decode_timeline();
#else
  return trace_gap(KernelFamily::kDecode, "sparse_decode_timeline_clear");
#endif
}

Status read_dense_decode_timeline(unsigned long long* host, size_t count) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
  return kernels::copy_dense_decode_timeline(host, count);
#else
  (void)host;
  (void)count;
  return trace_gap(KernelFamily::kDecode, "dense_decode_timeline");
#endif
}

Status clear_dense_decode_timeline() {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
  return kernels::clear_dense_decode_timeline();
#else
  return trace_gap(KernelFamily::kDecode, "dense_decode_timeline_clear");
#endif
}

Status read_sparse_prefill_trace(int d_qk, unsigned long long* host, size_t count, bool clear) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_SPARSE_PREFILL)
  return kernels::sparse_prefill_trace(d_qk, host, count, clear);
#else
  (void)d_qk;
  (void)host;
  (void)count;
  (void)clear;
  return trace_gap(KernelFamily::kSparsePrefill, "sparse_prefill_trace");
#endif
}

Status mha_prefill_trace_size(size_t* count) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_MHA_PREFILL)
  *count = kernels::mha_prefill_trace_values();
  return Status::ok();
#else
  *count = 0;
  return trace_gap(KernelFamily::kMhaPrefill, "mha_prefill_trace");
#endif
}

Status read_mha_prefill_trace(int d_qk, bool fp16, unsigned long long* host, size_t count, bool clear) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_MHA_PREFILL)
  return kernels::mha_prefill_trace(d_qk, fp16, host, count, clear);
#else
  (void)d_qk;
  (void)fp16;
  (void)host;
  (void)count;
  (void)clear;
  return trace_gap(KernelFamily::kMhaPrefill, "mha_prefill_trace");
#endif
}

}  // namespace openmla::detail
