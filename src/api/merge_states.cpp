// Public merge_attn_states API (include/openmla/merge.h): validate every argument (messages name it), build the
// params, launch. Order: each tensor's presence, device kind, dtype, rank, sizes, strides and alignment (outs, lses,
// out, lse_out), then the shapes between tensors, the memory the call writes against everything else, the devices;
// the launch context last. Nothing here touches CUDA before check_launch_context.
#include <string>

#include "api/families.h"
#include "api/merge_states_internal.h"
#include "api/validate.h"
#include "kernels/merge_states/config.h"
#include "kernels/merge_states/launch.h"

namespace openmla {

namespace ms = kernels::merge_states;

namespace {

using detail::MessageStream;
using detail::shape_string;

constexpr const char* kEntry = "merge_attn_states";

std::string quoted(const char* name) { return std::string("argument '") + name + "'"; }

// A tensor of the call: defined (an empty one may carry a null pointer: nothing is accessed), on a CUDA device, one
// of `dtypes`, `ndim` dimensions, sane strides, its data aligned to its element size.
Status check_tensor(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes, int ndim) {
  if (!(t.valid_ndim() && t.ndim > 0 && t.numel() == 0)) OPENMLA_RETURN_IF_ERROR(detail::check_defined(t, name));
  if (t.device != DeviceType::kCUDA)
    return Status::invalid_argument(quoted(name) + " must be a CUDA tensor, got a CPU (host) tensor");
  OPENMLA_RETURN_IF_ERROR(detail::check_dtype(t, name, dtypes));
  OPENMLA_RETURN_IF_ERROR(detail::check_ndim(t, name, ndim));
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_sane(t, name));
  return detail::check_pointer_aligned(t, name, static_cast<int64_t>(t.element_size()));
}

// Rows read or written as 16-byte vectors (outs, out): last dim contiguous, every other stride a whole number of
// vectors, the data 16-byte aligned.
Status check_vector_rows(const TensorRef& t, const char* name) {
  OPENMLA_RETURN_IF_ERROR(detail::check_last_dim_contiguous(t, name));
  const int64_t elems = ms::kVectorBytes / static_cast<int64_t>(t.element_size());
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_multiple(t, name, elems, "16-byte vector access"));
  return detail::check_pointer_aligned(t, name, ms::kVectorBytes);
}

Status check_size(const TensorRef& t, const char* name, int dim, int64_t expected, const char* what,
                  const char* of) {
  if (t.shape[dim] == expected) return Status::ok();
  MessageStream os;
  os << quoted(name) << " has size " << t.shape[dim] << " in dimension " << dim << " (" << what << "), expected "
     << expected << " as " << of << "; shape " << shape_string(t);
  return Status::invalid_argument(os.str());
}

ms::Element element_of(DType dtype) {
  return dtype == DType::kFloat32 ? ms::Element::kFloat32
         : dtype == DType::kFloat16 ? ms::Element::kFloat16
                                    : ms::Element::kBFloat16;
}

constexpr int64_t kInt32Max = 2147483647;

}  // namespace

namespace detail {

Status validate_merge_states(const MergeStatesArgs& args_in, MergeStatesLaunch* launch) {
  const TensorRef outs = canonical(args_in.outs), lses = canonical(args_in.lses), out = canonical(args_in.out),
                  lse_out = canonical(args_in.lse_out);
  const auto float_types = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};

  // outs: (num_partials, tokens, heads, d_v).
  OPENMLA_RETURN_IF_ERROR(check_tensor(outs, "outs", float_types, 4));
  const int64_t num_partials = outs.shape[0], tokens = outs.shape[1], heads = outs.shape[2], d_v = outs.shape[3];
  if (num_partials < 1 || num_partials > kInt32Max) {
    MessageStream os;
    os << "argument 'outs' has " << num_partials
       << " partials (dimension 0); merge_attn_states needs at least 1 (and at most 2^31 - 1); shape "
       << shape_string(outs);
    return Status::invalid_argument(os.str());
  }
  if (d_v < ms::kChunkElems || d_v % ms::kChunkElems != 0 || d_v > kInt32Max) {
    MessageStream os;
    os << "argument 'outs' has d_v = " << d_v << " (dimension 3); it must be a positive multiple of "
       << ms::kChunkElems << " (e.g. 512 or 128); shape " << shape_string(outs);
    return Status::invalid_argument(os.str());
  }
  if (heads > kInt32Max) {
    MessageStream os;
    os << "argument 'outs' has " << heads << " heads (dimension 2); at most 2^31 - 1 are supported";
    return Status::invalid_argument(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_vector_rows(outs, "outs"));

  // lses: (num_partials, tokens, heads) fp32, any strides.
  OPENMLA_RETURN_IF_ERROR(check_tensor(lses, "lses", {DType::kFloat32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_size(lses, "lses", 0, num_partials, "partials", "in outs"));
  OPENMLA_RETURN_IF_ERROR(check_size(lses, "lses", 1, tokens, "tokens", "in outs"));
  OPENMLA_RETURN_IF_ERROR(check_size(lses, "lses", 2, heads, "heads", "in outs"));

  // out: (tokens, heads, d_v), any of the three types.
  OPENMLA_RETURN_IF_ERROR(check_tensor(out, "out", float_types, 3));
  OPENMLA_RETURN_IF_ERROR(check_size(out, "out", 0, tokens, "tokens", "in outs"));
  OPENMLA_RETURN_IF_ERROR(check_size(out, "out", 1, heads, "heads", "in outs"));
  OPENMLA_RETURN_IF_ERROR(check_size(out, "out", 2, d_v, "d_v", "in outs"));
  OPENMLA_RETURN_IF_ERROR(check_vector_rows(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(out, "out"));

  // lse_out: optional (tokens, heads) fp32.
  if (lse_out.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_tensor(lse_out, "lse_out", {DType::kFloat32}, 2));
    OPENMLA_RETURN_IF_ERROR(check_size(lse_out, "lse_out", 0, tokens, "tokens", "in outs"));
    OPENMLA_RETURN_IF_ERROR(check_size(lse_out, "lse_out", 1, heads, "heads", "in outs"));
    OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(lse_out, "lse_out"));
  }

  OPENMLA_RETURN_IF_ERROR(
      check_disjoint({{&out, "out"}, {&lse_out, "lse_out"}}, {{&outs, "outs"}, {&lses, "lses"}}));
  OPENMLA_RETURN_IF_ERROR(
      check_same_device_all(outs, "outs", {{&lses, "lses"}, {&out, "out"}, {&lse_out, "lse_out"}}));

  if (launch == nullptr) return Status::ok();
  launch->in = element_of(outs.dtype);
  launch->out = element_of(out.dtype);
  launch->params = ms::MergeStatesParams{
      .outs = outs.data,
      .outs_stride_partial = outs.stride[0],
      .outs_stride_token = outs.stride[1],
      .outs_stride_head = outs.stride[2],
      .lses = static_cast<const float*>(lses.data),
      .lses_stride_partial = lses.stride[0],
      .lses_stride_token = lses.stride[1],
      .lses_stride_head = lses.stride[2],
      .out = out.data,
      .out_stride_token = out.stride[0],
      .out_stride_head = out.stride[1],
      .lse_out = lse_out.defined() ? static_cast<float*>(lse_out.data) : nullptr,
      .lse_out_stride_token = lse_out.defined() ? lse_out.stride[0] : 0,
      .lse_out_stride_head = lse_out.defined() ? lse_out.stride[1] : 0,
      .num_partials = static_cast<int>(num_partials),
      .heads = static_cast<int>(heads),
      .d_v = static_cast<int>(d_v),
      .rows = tokens * heads,
  };
  return Status::ok();
}

}  // namespace detail

Status merge_attn_states(const MergeStatesArgs& args, cudaStream_t stream) {
  detail::MergeStatesLaunch launch;
  OPENMLA_RETURN_IF_ERROR(detail::validate_merge_states(args, &launch));
  if (launch.params.rows == 0) {  // no rows: nothing to launch (the tensors may carry null pointers)
    if (detail::family_built(detail::KernelFamily::kMergeStates)) return Status::ok();
    return detail::family_not_built(detail::KernelFamily::kMergeStates, kEntry);
  }
#if !defined(OPENMLA_HAS_MERGE_STATES)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kMergeStates, kEntry);
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(args.outs.device_id, "outs", stream, kEntry));
  return ms::launch_merge_states(launch.params, launch.in, launch.out, stream);
#endif
}

}  // namespace openmla
