// Binding of include/openmla/decode.h: workspace sizes, GPU scheduling, dense and sparse decode.
//
// Thin on purpose: arrays become TensorRefs, keyword arguments become the family's problem struct
// (bind_decode_problem.h), the C++ API does every check, and its Status becomes the matching Python exception with
// the message unchanged.
// The flash_mla-compatible layer (schedule caching, output allocation) is python/openmla/decode.py.
#include <atomic>
#include <string>

#include <nanobind/stl/string.h>

#include "bind_common.h"
#include "bind_decode_problem.h"
#include "openmla/decode.h"
#include "openmla/test_hooks.h"

namespace openmla::py {

namespace {

// Test hook of the Python tests (_set_dense_merge_publish_always): the options every dense_decode call of this
// module passes to the library (openmla/test_hooks.h). The library itself keeps no such state.
std::atomic<bool> g_test_merge_publish_always{false};

nb::dict workspace_sizes(const nb::kwargs& kwargs) {
  const FamilyDecodeProblem p = decode_problem_from_kwargs(kwargs, DecodeFamily::kByKeyword,
                                                           "get_decode_workspace_sizes");
  const DecodeWorkspaceSizes sizes =
      p.sparse ? decode_workspace_sizes(p.sparse_problem) : decode_workspace_sizes(p.dense);
  nb::dict d;
  d["num_sm_parts"] = sizes.num_sm_parts;
  d["metadata_ints"] = sizes.metadata_ints;
  d["num_splits_ints"] = sizes.num_splits_ints;
  d["partial_rows"] = sizes.partial_rows;
  d["partial_o_bytes"] = sizes.partial_o_bytes;
  d["partial_lse_bytes"] = sizes.partial_lse_bytes;
  d["merge_counter_ints"] = sizes.merge_counter_ints;
  d["varlen_ints"] = sizes.varlen_ints;
  return d;
}

void plan(const OptArray& cache_seqlens, const Array& metadata, const Array& num_splits, const OptArray& topk_length,
          const OptArray& extra_topk_length, const OptArray& merge_counters, uintptr_t stream,
          const OptArray& seqused_q, const OptArray& varlen_lengths, const nb::kwargs& kwargs) {
  const FamilyDecodeProblem p = decode_problem_from_kwargs(kwargs, DecodeFamily::kByKeyword, "plan_decode");
  DecodeSchedule schedule;
  schedule.metadata = to_tensor_ref(metadata, "tile_scheduler_metadata");
  schedule.num_splits = to_tensor_ref(num_splits, "num_splits");
  schedule.merge_counters = to_tensor_ref(merge_counters, "merge_counters");
  schedule.varlen_lengths = to_tensor_ref(varlen_lengths, "varlen_lengths");
  const TensorRef used = to_tensor_ref(seqused_q, "seqused_q");
  const TensorRef seqlens = to_tensor_ref(cache_seqlens, "cache_seqlens");
  const TensorRef topk = to_tensor_ref(topk_length, "topk_length");
  const TensorRef extra_topk = to_tensor_ref(extra_topk_length, "extra_topk_length");
  Status status;
  {
    // Launching needs no Python state; let other Python threads run meanwhile.
    nb::gil_scoped_release release;
    // Each family reads its own lengths: dense cache_seqlens, sparse the top-k lengths (the other ones are ignored).
    // Per-request query lengths (varlen_q): the overloads that take seqused_q (they plan like the others without it).
    status = p.sparse ? plan_decode(p.sparse_problem, topk, extra_topk, used, schedule, to_stream(stream))
                      : plan_decode(p.dense, seqlens, used, schedule, to_stream(stream));
  }
  throw_if_error(status);
}

void dense(const Array& q, const Array& k_cache, const Array& block_table, const Array& cache_seqlens,
           const Array& metadata, const Array& num_splits, const Array& partial_o, const Array& partial_lse,
           const Array& out, const Array& lse, const OptArray& merge_counters, float softmax_scale, uintptr_t stream,
           const OptArray& seqused_q, const OptArray& varlen_lengths, const nb::kwargs& kwargs) {
  const DenseDecodeProblem problem =
      decode_problem_from_kwargs(kwargs, DecodeFamily::kDense, "dense_decode").dense;
  DenseDecodeArgs args;
  args.schedule.merge_counters = to_tensor_ref(merge_counters, "merge_counters");
  args.q = to_tensor_ref(q, "q");
  args.k_cache = to_tensor_ref(k_cache, "k_cache");
  args.block_table = to_tensor_ref(block_table, "block_table");
  args.cache_seqlens = to_tensor_ref(cache_seqlens, "cache_seqlens");
  args.softmax_scale = softmax_scale;
  args.schedule.metadata = to_tensor_ref(metadata, "tile_scheduler_metadata");
  args.schedule.num_splits = to_tensor_ref(num_splits, "num_splits");
  args.split.partial_o = to_tensor_ref(partial_o, "partial_o");
  args.split.partial_lse = to_tensor_ref(partial_lse, "partial_lse");
  args.out = to_tensor_ref(out, "out");
  args.lse = to_tensor_ref(lse, "lse");
  args.seqused_q = to_tensor_ref(seqused_q, "seqused_q");
  args.schedule.varlen_lengths = to_tensor_ref(varlen_lengths, "varlen_lengths");
  Status status;
  {
    nb::gil_scoped_release release;
    const test_hooks::DenseDecodeOptions options{.merge_publish_always = g_test_merge_publish_always.load()};
    status = test_hooks::dense_decode(problem, args, options, to_stream(stream));
  }
  throw_if_error(status);
}

void sparse(const Array& q, const Array& k_cache, const Array& indices, const Array& metadata, const Array& num_splits,
            const Array& partial_o, const Array& partial_lse, const Array& out, const Array& lse,
            const OptArray& topk_length, const OptArray& attn_sink, const OptArray& extra_k_cache,
            const OptArray& extra_indices, const OptArray& extra_topk_length, float softmax_scale, uintptr_t stream,
            const OptArray& seqused_q, const OptArray& varlen_lengths, const nb::kwargs& kwargs) {
  const SparseDecodeProblem problem =
      decode_problem_from_kwargs(kwargs, DecodeFamily::kSparse, "sparse_decode").sparse_problem;
  SparseDecodeArgs args;
  args.q = to_tensor_ref(q, "q");
  args.k_cache = to_tensor_ref(k_cache, "k_cache");
  args.indices = to_tensor_ref(indices, "indices");
  args.topk_length = to_tensor_ref(topk_length, "topk_length");
  args.attn_sink = to_tensor_ref(attn_sink, "attn_sink");
  args.extra_k_cache = to_tensor_ref(extra_k_cache, "extra_k_cache");
  args.extra_indices = to_tensor_ref(extra_indices, "extra_indices");
  args.extra_topk_length = to_tensor_ref(extra_topk_length, "extra_topk_length");
  args.softmax_scale = softmax_scale;
  args.schedule.metadata = to_tensor_ref(metadata, "tile_scheduler_metadata");
  args.schedule.num_splits = to_tensor_ref(num_splits, "num_splits");
  args.split.partial_o = to_tensor_ref(partial_o, "partial_o");
  args.split.partial_lse = to_tensor_ref(partial_lse, "partial_lse");
  args.out = to_tensor_ref(out, "out");
  args.lse = to_tensor_ref(lse, "lse");
  args.seqused_q = to_tensor_ref(seqused_q, "seqused_q");
  args.schedule.varlen_lengths = to_tensor_ref(varlen_lengths, "varlen_lengths");
  Status status;
  {
    nb::gil_scoped_release release;
    status = sparse_decode(problem, args, to_stream(stream));
  }
  throw_if_error(status);
}

}  // namespace

void bind_decode(nb::module_& m) {
  m.attr("DECODE_SCHEDULE_RECORD_INTS") = kDecodeScheduleRecordInts;
  m.attr("MAX_DECODE_SM_PARTS") = kMaxDecodeSmParts;

  m.def("get_decode_workspace_sizes", &workspace_sizes,
        "get_decode_workspace_sizes(**problem) -> dict\n\n"
        "Sizes of the caller-owned decode workspace for a problem given as keyword arguments, the fields of its "
        "family's struct: batch, s_q, h_q, d_qk, d_v, page_block_size, cache_format ('bf16', 'fp16', 'fp8_v32', "
        "'fp8_model1'), num_sms (0: the current device's SM count); dense: h_kv, causal, max_blocks_per_seq; "
        "sparse (sparse=True): topk, extra_topk, extra_page_block_size.\n"
        "Returns {num_sm_parts, metadata_ints, num_splits_ints, partial_rows, partial_o_bytes, "
        "partial_lse_bytes}. Host-only: launches nothing.");

  m.def("plan_decode", &plan, nb::arg("cache_seqlens").none(), nb::arg("tile_scheduler_metadata"),
        nb::arg("num_splits"), nb::arg("topk_length") = nb::none(), nb::arg("extra_topk_length") = nb::none(),
        nb::arg("merge_counters") = nb::none(), nb::arg("stream") = 0, nb::arg("seqused_q") = nb::none(),
        nb::arg("varlen_lengths") = nb::none(), nb::arg("problem"),
        "plan_decode(cache_seqlens, tile_scheduler_metadata, num_splits, topk_length=None, "
        "extra_topk_length=None, merge_counters=None, stream=0, **problem)\n\n"
        "Computes the decode schedule on the GPU, on `stream` (a cudaStream_t as int), without host "
        "synchronisation (graph-capturable).\n"
        "cache_seqlens: (b,) int32 CUDA (dense; ignored, may be None, when sparse). tile_scheduler_metadata: "
        "(num_sm_parts, 8) int32 CUDA, contiguous, written. num_splits: (b + 1,) int32 CUDA, contiguous, "
        "written. topk_length / extra_topk_length: (b,) int32 CUDA, sparse only. merge_counters: optional "
        "(>= merge_counter_ints,) int32 CUDA, contiguous, zeroed (enables dense decode's in-kernel merge).\n"
        "Per-request query lengths (varlen_q=True in the problem): seqused_q (b,) int32 CUDA and varlen_lengths "
        "(>= varlen_ints,) int32 CUDA, written (DecodeSchedule::varlen_lengths).");

  m.def("dense_decode", &dense, nb::arg("q"), nb::arg("k_cache"), nb::arg("block_table"), nb::arg("cache_seqlens"),
        nb::arg("tile_scheduler_metadata"), nb::arg("num_splits"), nb::arg("partial_o"), nb::arg("partial_lse"),
        nb::arg("out"), nb::arg("lse"), nb::arg("merge_counters") = nb::none(), nb::arg("softmax_scale") = 0.f,
        nb::arg("stream") = 0, nb::arg("seqused_q") = nb::none(), nb::arg("varlen_lengths") = nb::none(),
        nb::arg("problem"),
        "dense_decode(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, partial_o, "
        "partial_lse, out, lse, merge_counters=None, softmax_scale=0.0, stream=0, **problem)\n\n"
        "Dense MLA decode over a paged BF16/FP16 cache, main kernel plus combine, on `stream`.\n"
        "q: (b, s_q, h_q, d_qk); k_cache: (num_blocks, page_block_size, h_kv, d_qk), q's dtype; block_table: "
        "(b, max_blocks_per_seq) int32; cache_seqlens: (b,) int32; schedule from plan_decode() with the same "
        "problem and cache_seqlens; partial_o: (partial_rows, d_v) float32; partial_lse: (partial_rows,) "
        "float32; out: (b, s_q, h_q, d_v) q's dtype, written; lse: (b, h_q, s_q) float32 any strides, "
        "written; merge_counters: the ones given to plan_decode() (None: the combine kernel merges every split "
        "request). softmax_scale 0 means d_qk ** -0.5.");

  m.def("sparse_decode", &sparse, nb::arg("q"), nb::arg("k_cache"), nb::arg("indices"),
        nb::arg("tile_scheduler_metadata"), nb::arg("num_splits"), nb::arg("partial_o"), nb::arg("partial_lse"),
        nb::arg("out"), nb::arg("lse"), nb::arg("topk_length") = nb::none(), nb::arg("attn_sink") = nb::none(),
        nb::arg("extra_k_cache") = nb::none(), nb::arg("extra_indices") = nb::none(),
        nb::arg("extra_topk_length") = nb::none(), nb::arg("softmax_scale") = 0.f, nb::arg("stream") = 0,
        nb::arg("seqused_q") = nb::none(), nb::arg("varlen_lengths") = nb::none(), nb::arg("problem"),
        "sparse_decode(q, k_cache, indices, tile_scheduler_metadata, num_splits, partial_o, partial_lse, out, lse, "
        "topk_length=None, attn_sink=None, extra_k_cache=None, extra_indices=None, extra_topk_length=None, "
        "softmax_scale=0.0, stream=0, **problem)\n\n"
        "Sparse top-k MLA decode over an FP8 paged cache, main kernel plus combine, on `stream`. The problem is "
        "SparseDecodeProblem's fields: cache_format 'fp8_v32' (d_qk 576) or 'fp8_model1' (d_qk 512), topk, and "
        "extra_topk / extra_page_block_size when an extra cache is given (sparse=True and h_kv=1 accepted).\n"
        "q: (b, s_q, h_q, d_qk) bf16; k_cache: (num_blocks, page_block_size, 1, 656 | 584) uint8 / int8 / "
        "float8_e4m3 bytes, any page stride (multiple of 16 bytes); indices: (b, s_q, topk) int32, index = page * "
        "page_block_size + offset, -1 or out of range = skipped; topk_length: (b,) int32 slots used per request; "
        "attn_sink: (h_q,) float32; extra_k_cache / extra_indices (b, s_q, extra_topk) / extra_topk_length: a "
        "second cache attended under the same softmax. Schedule from plan_decode() with the same problem, "
        "topk_length and extra_topk_length; partial_o / partial_lse as for dense_decode; out: (b, s_q, h_q, d_v) "
        "bf16, written; lse: (b, h_q, s_q) float32 any strides, written (never changed by the sink). "
        "softmax_scale 0 means d_qk ** -0.5.");

  // Testing only (openmla/test_hooks.h, DenseDecodeOptions): this module's dense_decode calls make split chunks always
  // publish before they may merge. Off by default.
  m.def("_set_dense_merge_publish_always", [](bool on) { g_test_merge_publish_always.store(on); }, nb::arg("on"));

}

}  // namespace openmla::py
