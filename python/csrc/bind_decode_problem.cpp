#include "bind_decode_problem.h"

#include "api/validate.h"

namespace openmla::py {

namespace {

// The keyword fields, in the order the header declares them (DecodeProblem's order, which the docs list).
constexpr const char* kProblemFields =
    "batch, s_q, h_q, h_kv, d_qk, d_v, page_block_size, cache_format, causal, sparse, topk, extra_topk, "
    "extra_page_block_size, num_sms, max_blocks_per_seq, batch_invariant, varlen_q";

// Python ints only: a bool or float slipping into a size field is a caller bug worth reporting.
int64_t int_field(nb::handle value, const std::string& key) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr()))
    throw nb::type_error(
        ("problem field '" + key + "' must be an int, got " + nb::cast<std::string>(nb::str(value.type()))).c_str());
  return nb::cast<int64_t>(value);
}

bool bool_field(nb::handle value, const std::string& key) {
  if (!PyBool_Check(value.ptr()))
    throw nb::type_error(
        ("problem field '" + key + "' must be a bool, got " + nb::cast<std::string>(nb::str(value.type()))).c_str());
  return value.ptr() == Py_True;
}

// A field the family's struct does not have, given at another value than the one the family implies.
template <typename T>
void check_implied(const char* field, T value, T implied, const char* family, const char* meaning) {
  if (value == implied) return;
  throw_if_error(detail::invalid_field(field, value,
                                       std::string("a ") + family + " decode problem has no " + field + " (" +
                                           meaning + "): leave it out"));
}

}  // namespace

KVCacheFormat cache_format_from_name(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return KVCacheFormat::kBFloat16;
  if (name == "fp16" || name == "float16") return KVCacheFormat::kFloat16;
  if (name == "fp8_v32") return KVCacheFormat::kFp8V32;
  if (name == "fp8_model1") return KVCacheFormat::kFp8Model1;
  if (name == "fp8_e4m3") return KVCacheFormat::kFp8E4M3;
  throw nb::value_error(("argument 'cache_format': unknown format '" + name +
                         "'; expected one of 'bf16', 'fp16', 'fp8_v32', 'fp8_model1', 'fp8_e4m3'")
                            .c_str());
}

FamilyDecodeProblem decode_problem_from_kwargs(const nb::kwargs& kwargs, DecodeFamily family, const char* entry) {
  using D = DenseDecodeProblem;
  using S = SparseDecodeProblem;
  // The int64 fields: where each goes (null: not a field of that family's struct).
  struct IntField {
    const char* name;
    int64_t D::*dense;
    int64_t S::*sparse;
  };
  static constexpr IntField kIntFields[] = {
      {"batch", &D::batch, &S::batch},
      {"s_q", &D::s_q, &S::s_q},
      {"h_q", &D::h_q, &S::h_q},
      {"d_qk", &D::d_qk, &S::d_qk},
      {"d_v", &D::d_v, &S::d_v},
      {"page_block_size", &D::page_block_size, &S::page_block_size},
      {"h_kv", &D::h_kv, nullptr},
      {"max_blocks_per_seq", &D::max_blocks_per_seq, nullptr},
      {"topk", nullptr, &S::topk},
      {"extra_topk", nullptr, &S::extra_topk},
      {"extra_page_block_size", nullptr, &S::extra_page_block_size},
  };
  FamilyDecodeProblem p;
  D& d = p.dense;
  S& s = p.sparse_problem;
  bool sparse = family == DecodeFamily::kSparse, format_given = false;
  KVCacheFormat format = KVCacheFormat::kBFloat16;
  for (auto [k, v] : kwargs) {
    const std::string key = nb::cast<std::string>(k);
    const IntField* field = nullptr;
    for (const IntField& f : kIntFields)
      if (key == f.name) field = &f;
    if (field != nullptr) {
      const int64_t value = int_field(v, key);
      if (field->dense != nullptr) d.*field->dense = value;
      if (field->sparse != nullptr) s.*field->sparse = value;
    } else if (key == "cache_format") {
      format = cache_format_from_name(nb::cast<std::string>(v));
      format_given = true;
    } else if (key == "num_sms") {
      d.num_sms = s.num_sms = static_cast<int>(int_field(v, key));
    } else if (key == "causal") {  // dense only
      d.causal = bool_field(v, key);
    } else if (key == "batch_invariant") {
      d.batch_invariant = s.batch_invariant = bool_field(v, key);
    } else if (key == "varlen_q") {
      d.varlen_q = s.varlen_q = bool_field(v, key);
    } else if (key == "sparse") {
      const bool named = bool_field(v, key);
      if (family == DecodeFamily::kByKeyword)
        sparse = named;
      else if (named != sparse)
        throw_if_error(detail::invalid(std::string("argument 'problem.sparse' is ") + (named ? "True" : "False") +
                                       "; " + entry + " takes a " + (sparse ? "sparse" : "dense") + " problem"));
    } else {
      throw nb::type_error(
          ("unknown keyword argument '" + key + "'; the decode problem fields are: " + kProblemFields).c_str());
    }
  }
  p.sparse = sparse;
  if (sparse) {
    check_implied("h_kv", d.h_kv, int64_t{1}, "sparse", "one latent KV head");
    check_implied("causal", d.causal, false, "sparse", "the indices select the keys");
    check_implied("max_blocks_per_seq", d.max_blocks_per_seq, int64_t{0}, "sparse", "no block table");
    if (format_given) s.cache_format = format;
  } else {
    check_implied("topk", s.topk, int64_t{0}, "dense", "every cached key is attended");
    check_implied("extra_topk", s.extra_topk, int64_t{0}, "dense", "no extra cache");
    check_implied("extra_page_block_size", s.extra_page_block_size, int64_t{0}, "dense", "no extra cache");
    if (format_given) d.cache_format = format;
  }
  return p;
}

DecodeWorkspaceSizes decode_workspace_sizes(const DenseDecodeProblem& problem) {
  DecodeWorkspaceSizes sizes;
  throw_if_error(get_decode_workspace_sizes(problem, &sizes));
  return sizes;
}

DecodeWorkspaceSizes decode_workspace_sizes(const SparseDecodeProblem& problem) {
  DecodeWorkspaceSizes sizes;
  throw_if_error(get_decode_workspace_sizes(problem, &sizes));
  return sizes;
}

}  // namespace openmla::py
