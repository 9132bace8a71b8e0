// The trace reader (api/trace.h): forwards to the kernel's launcher in a trace build that has its family, else answers
// why not. The only file outside src/kernels that names the kernels' trace functions.
#include "api/trace.h"

#include "api/families.h"

#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
#include "kernels/dense_decode/config.h"
#include "kernels/dense_decode/launch.h"
#include "kernels/sparse_decode/config.h"
#include "kernels/sparse_decode/launch.h"
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_SPARSE_PREFILL)
#include "kernels/sparse_prefill/config.h"
#include "kernels/sparse_prefill/launch.h"
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_MHA_PREFILL)
#include "kernels/mha_prefill/config.h"
#include "kernels/mha_prefill/launch.h"
#endif

namespace openmla::detail {

namespace {

using trace::Kernel;

constexpr Kernel kKernels[] = {Kernel::kDenseDecode, Kernel::kSparseDecode, Kernel::kSparsePrefill,
                               Kernel::kMhaPrefill};

KernelFamily trace_family(Kernel kernel) {
  switch (kernel) {
    case Kernel::kSparsePrefill: return KernelFamily::kSparsePrefill;
    case Kernel::kMhaPrefill: return KernelFamily::kMhaPrefill;
    default: return KernelFamily::kDecode;
  }
}

// The entry named in an answer: "<kernel>_trace".
std::string entry_of(Kernel kernel) { return std::string(trace_kernel_name(kernel)) + "_trace"; }

// Why this build cannot read `kernel`'s trace; OK when it can.
Status trace_gap(Kernel kernel) {
  const std::string entry = entry_of(kernel);
#if !defined(OPENMLA_HAS_TRACE)
  return trace_not_built(entry.c_str());
#else
  if (!family_built(trace_family(kernel))) return family_not_built(trace_family(kernel), entry.c_str());
  return Status::ok();
#endif
}

bool known(Kernel kernel) {
  for (Kernel k : kKernels)
    if (k == kernel) return true;
  return false;
}

}  // namespace

const char* trace_kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::kDenseDecode: return "dense_decode";
    case Kernel::kSparseDecode: return "sparse_decode";
    case Kernel::kSparsePrefill: return "sparse_prefill";
    case Kernel::kMhaPrefill: return "mha_prefill";
  }
  return "unknown";
}

Status trace_kernel_from_name(const std::string& name, Kernel* kernel) {
  for (Kernel k : kKernels) {
    if (name == trace_kernel_name(k)) {
      *kernel = k;
      return Status::ok();
    }
  }
  return Status::invalid_argument("argument 'kernel': no traced kernel '" + name +
                                  "'; expected 'dense_decode', 'sparse_decode', 'sparse_prefill' or 'mha_prefill'");
}

Status trace_values(Kernel kernel, size_t* count) {
  *count = 0;
  if (!known(kernel)) return Status::invalid_argument("argument 'kernel': not a traced kernel");
  OPENMLA_RETURN_IF_ERROR(trace_gap(kernel));
  switch (kernel) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
    case Kernel::kDenseDecode: *count = kernels::dense_decode::Trace::Format::kValues; break;
    case Kernel::kSparseDecode: *count = kernels::sparse_decode::Trace::Format::kValues; break;
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_SPARSE_PREFILL)
    case Kernel::kSparsePrefill: *count = kernels::sparse_prefill::Trace::Format::kValues; break;
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_MHA_PREFILL)
    case Kernel::kMhaPrefill: *count = kernels::mha_prefill::Trace::Format::kValues; break;
#endif
    default: return Status::internal(entry_of(kernel) + ": no reader");
  }
  return Status::ok();
}

Status read_trace(Kernel kernel, unsigned long long* host, size_t count, bool clear) {
  if (!known(kernel)) return Status::invalid_argument("argument 'kernel': not a traced kernel");
  OPENMLA_RETURN_IF_ERROR(trace_gap(kernel));
  switch (kernel) {
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_DENSE_DECODE)
    case Kernel::kDenseDecode: return kernels::dense_decode_trace(host, count, clear);
    case Kernel::kSparseDecode: return kernels::sparse_decode_trace(host, count, clear);
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_SPARSE_PREFILL)
    case Kernel::kSparsePrefill: return kernels::sparse_prefill_trace(host, count, clear);
#endif
#if defined(OPENMLA_HAS_TRACE) && defined(OPENMLA_HAS_MHA_PREFILL)
    case Kernel::kMhaPrefill: return kernels::mha_prefill_trace(host, count, clear);
#endif
    default:
      (void)host;
      (void)count;
      (void)clear;
      return Status::internal(entry_of(kernel) + ": no reader");
  }
}

}  // namespace openmla::detail
