// The trace reader of the diagnostics build (CMake OPENMLA_TRACE=ON; docs/architecture.md, "Trace builds"): one entry
// for every traced kernel, so the Python binding (its _trace function) never names a kernel symbol that a build may
// lack. The trace it copies is in the one format of common/trace_format.h (tools/diag/kernel_trace.py parses it).
// Each call answers kUnsupported naming the CMake option when this build has no trace (OPENMLA_TRACE=OFF) or no kernels
// of the family (OPENMLA_ENABLE_<FAMILY>=OFF, api/families.h); otherwise it synchronises the device and copies the
// trace of the kernel's last launch (the variant that launched last), or clears the trace of every variant.
#pragma once

#include <cstddef>
#include <string>

#include "common/trace_format.h"
#include "openmla/status.h"

namespace openmla::detail {

// The traced kernel called `name`: "dense_decode", "sparse_decode", "sparse_prefill" or "mha_prefill"; kInvalidArgument
// naming argument 'kernel' otherwise (in every build).
Status trace_kernel_from_name(const std::string& name, trace::Kernel* kernel);
// `kernel`'s name (as above).
const char* trace_kernel_name(trace::Kernel kernel);
// Values of a copied trace of `kernel` (header included); needs no device.
Status trace_values(trace::Kernel kernel, size_t* count);
// Copies the trace of `kernel`'s last launch to host[0, trace_values) (count: the room there), or, when `clear` is set,
// zeroes the trace of every variant of `kernel` (before a launch: stamps a CTA never makes then read 0; host and count
// are not used).
Status read_trace(trace::Kernel kernel, unsigned long long* host, size_t count, bool clear);

}  // namespace openmla::detail
