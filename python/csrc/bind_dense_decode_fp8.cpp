// Binding of include/openmla/dense_decode_fp8.h: dense MLA decode over an FP8 e4m3 cache with per-tensor scales.
// Thin: arrays become TensorRefs, keyword arguments the DenseDecodeProblem (bind_decode_problem.h), the C++ API does
// every check. The flash_mla-compatible layer is python/openmla/decode_fp8.py.
#include <nanobind/stl/string.h>

#include <atomic>

#include "api/dense_decode_fp8_internal.h"
#include "bind_common.h"
#include "bind_decode_problem.h"
#include "openmla/dense_decode_fp8.h"

namespace openmla::py {

namespace {

// Test / benchmark hook (_set_dense_fp8_hold_pv_r): the kernel's P V_R timing, for the A/B of decision dense-fp8-v2.
// 0: the plan's choice, 1: held, 2: issued at once.
std::atomic<int> g_hold_pv_r{0};
// (_set_dense_fp8_k_l1_no_allocate) the A/B of decision dense-fp8-v3.
std::atomic<bool> g_k_l1_no_allocate{false};
// (_set_dense_fp8_early_qk) the A/B of decision dense-fp8-v4: 0 the default, 1 on, 2 off.
std::atomic<int> g_early_qk{0};

void dense_fp8(const Array& q, const Array& k_cache, const Array& block_table, const Array& cache_seqlens,
               const Array& metadata, const Array& num_splits, const Array& partial_o, const Array& partial_lse,
               const Array& out, const Array& lse, const OptArray& descale_q, const OptArray& descale_k,
               float descale_q_value, float descale_k_value, const OptArray& merge_counters, float softmax_scale,
               bool q_fp8, uintptr_t stream, const nb::kwargs& kwargs) {
  DenseDecodeProblem problem = decode_problem_from_kwargs(kwargs, DecodeFamily::kDense, "dense_decode_fp8").dense;
  DenseDecodeFp8Args args;
  args.q = to_tensor_ref(q, "q");
  // A torch float8 q may arrive as a byte view (DLPack exports without float8): q_fp8 says what the bytes are.
  if (q_fp8 && (args.q.dtype == DType::kUInt8 || args.q.dtype == DType::kInt8)) args.q.dtype = DType::kFloat8E4M3;
  args.k_cache = to_tensor_ref(k_cache, "k_cache");
  args.block_table = to_tensor_ref(block_table, "block_table");
  args.cache_seqlens = to_tensor_ref(cache_seqlens, "cache_seqlens");
  args.descale_q = to_tensor_ref(descale_q, "descale_q");
  args.descale_k = to_tensor_ref(descale_k, "descale_k");
  args.descale_q_value = descale_q_value;
  args.descale_k_value = descale_k_value;
  args.softmax_scale = softmax_scale;
  args.schedule.metadata = to_tensor_ref(metadata, "tile_scheduler_metadata");
  args.schedule.num_splits = to_tensor_ref(num_splits, "num_splits");
  args.schedule.merge_counters = to_tensor_ref(merge_counters, "merge_counters");
  args.split.partial_o = to_tensor_ref(partial_o, "partial_o");
  args.split.partial_lse = to_tensor_ref(partial_lse, "partial_lse");
  args.out = to_tensor_ref(out, "out");
  args.lse = to_tensor_ref(lse, "lse");
  Status status;
  {
    nb::gil_scoped_release release;
    const int hold = g_hold_pv_r.load();
    const detail::DenseDecodeFp8Options options{
        .hold_pv_r = hold == 0 ? detail::HoldPvR::kAuto : (hold == 1 ? detail::HoldPvR::kOn : detail::HoldPvR::kOff),
        .k_l1_no_allocate = g_k_l1_no_allocate.load(),
        .early_qk = g_early_qk.load() == 0 ? detail::kDenseFp8EarlyQkDefault : g_early_qk.load() == 1};
    status = detail::run_dense_decode_fp8(problem, args, options, to_stream(stream));
  }
  throw_if_error(status);
}

}  // namespace

void bind_dense_decode_fp8(nb::module_& m) {
  m.def("dense_decode_fp8", &dense_fp8, nb::arg("q"), nb::arg("k_cache"), nb::arg("block_table"),
        nb::arg("cache_seqlens"), nb::arg("tile_scheduler_metadata"), nb::arg("num_splits"), nb::arg("partial_o"),
        nb::arg("partial_lse"), nb::arg("out"), nb::arg("lse"), nb::arg("descale_q") = nb::none(),
        nb::arg("descale_k") = nb::none(), nb::arg("descale_q_value") = 1.f, nb::arg("descale_k_value") = 1.f,
        nb::arg("merge_counters") = nb::none(), nb::arg("softmax_scale") = 0.f, nb::arg("q_fp8") = false,
        nb::arg("stream") = 0, nb::arg("problem"),
        "dense_decode_fp8(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, partial_o, "
        "partial_lse, out, lse, descale_q=None, descale_k=None, descale_q_value=1.0, descale_k_value=1.0, "
        "merge_counters=None, softmax_scale=0.0, q_fp8=False, stream=0, **problem)\n\n"
        "Dense MLA decode over an FP8 e4m3 paged cache with per-tensor scales, main kernel plus combine, on "
        "`stream`. problem: DenseDecodeProblem's fields with cache_format='fp8_e4m3', h_kv=1, any page_block_size.\n"
        "q: (b, s_q, h_q, 576) bf16 or float8_e4m3; k_cache: (num_blocks, page_block_size, 1, 576) float8_e4m3 "
        "(uint8 / int8 views accepted); descale_q / descale_k: float32 CUDA tensors of one element, or None (then "
        "the *_value floats); out: (b, s_q, h_q, 512) bf16; lse (b, h_q, s_q) float32. Schedule from plan_decode() "
        "with the same problem and cache_seqlens. softmax_scale 0 means 576 ** -0.5. q_fp8: q is a uint8 / int8 byte view "
        "of e4m3 values.");

  // Testing / benchmarking only: True / False forces WG1's P V_R held until WG0's next Q K^T / issued as soon as P is
  // ready (the A/B of decision dense-fp8-v2, docs/dense-decode.md); None (the default) leaves it to the launch plan.
  m.def(
      "_set_dense_fp8_hold_pv_r",
      [](std::optional<bool> on) { g_hold_pv_r.store(!on.has_value() ? 0 : (*on ? 1 : 2)); },
      nb::arg("on").none());
  // Testing / benchmarking only: the token loads skip L1 (the A/B of decision dense-fp8-v3). Off by default.
  m.def("_set_dense_fp8_k_l1_no_allocate", [](bool on) { g_k_l1_no_allocate.store(on); }, nb::arg("on"));
  // Testing / benchmarking only: True / False forces the kernels where WG0 issues the next Q K^T behind its P V_L, or
  // the others (the A/B of decision dense-fp8-v4); None leaves the default (DENSE_FP8_EARLY_QK_DEFAULT).
  m.def(
      "_set_dense_fp8_early_qk",
      [](std::optional<bool> on) { g_early_qk.store(!on.has_value() ? 0 : (*on ? 1 : 2)); }, nb::arg("on").none());
  m.attr("DENSE_FP8_EARLY_QK_DEFAULT") = detail::kDenseFp8EarlyQkDefault;
}

}  // namespace openmla::py
