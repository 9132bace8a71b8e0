// openmla._openmla: the nanobind extension. Each bind_*.cpp file registers one public header's API.
#include "bind_common.h"
#include "openmla/capability.h"

namespace openmla::py {
void bind_kv_cache(nb::module_& m);
void bind_decode(nb::module_& m);
void bind_decode_step(nb::module_& m);
void bind_prefill(nb::module_& m);
void bind_prefill_call(nb::module_& m);
void bind_mha(nb::module_& m);
void bind_mha_call(nb::module_& m);
void bind_merge(nb::module_& m);
void bind_kv_cache_call(nb::module_& m);
void bind_reference(nb::module_& m);
void bind_checked(nb::module_& m);
void bind_diag(nb::module_& m);
void bind_dense_decode_fp8(nb::module_& m);
}  // namespace openmla::py

namespace {

openmla::Feature feature_from_name(const std::string& name) {
  using openmla::Feature;
  for (Feature f : {Feature::kKVCacheQuantize, Feature::kDenseDecode, Feature::kSparseDecode,
                    Feature::kSparsePrefill, Feature::kDensePrefill, Feature::kMergeStates,
                    Feature::kDecodeBatchInvariant, Feature::kDenseDecodeFp8, Feature::kDensePrefillFp8,
                    Feature::kDenseDecodeAnyPageSize, Feature::kDecodeVarlenQ, Feature::kSparsePrefillFp8})
    if (name == openmla::feature_name(f)) return f;
  throw nb::value_error(("argument 'feature': unknown feature '" + name +
                         "'; expected one of kv_cache_quantize, dense_decode, sparse_decode, sparse_prefill, "
                         "dense_prefill, merge_attn_states, decode_batch_invariant, dense_decode_fp8, dense_prefill_fp8, "
                         "dense_decode_any_page_size, decode_varlen_q, sparse_prefill_fp8")
                            .c_str());
}

}  // namespace

NB_MODULE(_openmla, m) {
  m.doc() = "OpenMLA: Multi-head Latent Attention kernels for NVIDIA Hopper (compiled core)";
  m.def("version", [] { return std::string(openmla::version_string()); }, "Library version string.");
  m.def("build_commit", [] { return std::string(openmla::build_commit()); }, "Git commit the library was built from.");
  m.def(
      "query_capability",
      [](const std::string& feature, int device) {
        openmla::Capability cap = openmla::query_capability(feature_from_name(feature), device);
        return std::make_tuple(cap.supported, cap.reason);
      },
      nb::arg("feature"), nb::arg("device") = 0,
      "Returns (supported, reason): whether `feature` runs on CUDA device `device`, and if not, why.");
  openmla::py::bind_kv_cache(m);
  openmla::py::bind_decode(m);
  openmla::py::bind_decode_step(m);
  openmla::py::bind_prefill(m);
  openmla::py::bind_prefill_call(m);
  openmla::py::bind_mha(m);
  openmla::py::bind_mha_call(m);
  openmla::py::bind_merge(m);
  openmla::py::bind_kv_cache_call(m);
  openmla::py::bind_reference(m);
  openmla::py::bind_checked(m);
  openmla::py::bind_diag(m);
  openmla::py::bind_dense_decode_fp8(m);
}
