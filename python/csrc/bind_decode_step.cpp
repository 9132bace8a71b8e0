// Binding of the per-call decode entries behind python/openmla/decode.py: every call of one schedule style goes
// through ONE entry, built for a small host cost per call (docs/python-api.md, "Host cost"):
//
//   DecodeStep         the object style (FlashMLASchedMeta): one decoding step's problem and schedule, built when
//                      the first layer plans (plan()); decode() is every call of the step, the first included.
//   TensorStyleDecode  the tensor style (get_mla_metadata(cache_seqlens, ...)): plan() makes the two schedule
//                      tensors; decode() is every call that passes them, its split-KV scratch from a pool kept per
//                      (device, stream), so no call allocates it once the pool holds one large enough. The torch op
//                      torch.ops.openmla.flash_mla_with_kvcache takes it too.
//
// Each entry builds the family's problem struct (DenseDecodeProblem / SparseDecodeProblem). Tensors are read through
// the DLPack C exchange API where the framework has one (object_tensors.h), the stream is the framework's current
// stream of the tensors' device unless one is given, outputs are allocated by the framework when the caller passes
// none. The C++ API validates every call in full, as for the DLPack binding (bind_decode.cpp).
//
// An entry serves the call or raises; it never hands the call back. Before the C++ API, the flash_mla layer requires
// what only it knows (the mode arguments, torch CUDA tensors, a reused schedule's shapes and flags:
// python/openmla/decode.py, _check_call). An entry tests the same conditions here, with comparisons that cost next to
// nothing; when one fails, or an argument cannot be read, it calls the layer's check function, which raises the error
// that names what is wrong, the one any call of the layer raises for those arguments.
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "bind_common.h"
#include "bind_decode_problem.h"
#include "common/fp8_cache_layout.h"
#include "object_tensors.h"
#include "openmla/decode.h"

namespace openmla::py {

namespace {

// The FP8 layouts' sizes: common/fp8_cache_layout.h (the one definition).
constexpr int64_t kV32BytesPerToken = fp8_cache::V32::kBytesPerToken;
constexpr int64_t kModel1BytesPerToken = fp8_cache::Model1::kBytesPerToken;

// int(h), as the flash_mla layer converts head_dim_v; raises what int() raises.
int64_t int_value(nb::handle h) {
  PyObject* v = PyNumber_Long(h.ptr());
  if (v == nullptr) throw nb::python_error();
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
  Py_DECREF(v);
  if (n == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow != 0) throw nb::value_error("argument 'head_dim_v' does not fit in 64 bits");
  return n;
}

// softmax_scale None -> d_qk ** -0.5 (a double power, then float); else float(softmax_scale).
float scale_or_default(nb::handle softmax_scale, int64_t d_qk) {
  if (softmax_scale.is_none()) return static_cast<float>(std::pow(static_cast<double>(d_qk), -0.5));
  const double v = PyFloat_AsDouble(softmax_scale.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
  return static_cast<float>(v);
}

// Python truthiness (flash_mla takes causal=0 / 1 as well as False / True).
bool truthy(nb::handle h) {
  const int v = PyObject_IsTrue(h.ptr());
  if (v < 0) throw nb::python_error();
  return v != 0;
}

KVCacheFormat dense_format(const TensorRef& q) {
  return q.dtype == DType::kFloat16 ? KVCacheFormat::kFloat16 : KVCacheFormat::kBFloat16;
}

// The FP8 layout of a cache from its bytes per token (the last dimension); false for any other size.
bool fp8_format(int64_t bytes_per_token, KVCacheFormat* format, int64_t* d_qk) {
  if (bytes_per_token == kV32BytesPerToken) {
    *format = KVCacheFormat::kFp8V32;
    *d_qk = fp8_cache::V32::kHeadDim;
    return true;
  }
  if (bytes_per_token == kModel1BytesPerToken) {
    *format = KVCacheFormat::kFp8Model1;
    *d_qk = fp8_cache::Model1::kHeadDim;
    return true;
  }
  return false;
}

// out (b, s_q, h_q, d_v) and lse (b, h_q, s_q) of one call: the caller's, or new framework tensors (lse as
// flash_mla allocates it: a transposed view of (b, s_q, h_q) storage). When both are new they share one allocation
// (new_cuda_tensors: one allocator call instead of two).
struct CallOutputs {
  nb::object out, lse;
  TensorRef out_ref, lse_ref;
};

// False when an output is missing and no framework allocator is known (the tensors came through __dlpack__).
bool prepare_outputs(TensorReader& reader, nb::handle out, nb::handle lse, int device_id, DType dtype, int64_t b,
                     int64_t s_q, int64_t h_q, int64_t d_v, CallOutputs* o) {
  if ((out.is_none() || lse.is_none()) && reader.api() == nullptr) return false;
  if (out.is_none() && lse.is_none()) {
    nb::object made[2];
    new_cuda_tensors(*reader.api(), device_id,
                     {{dtype, {b, s_q, h_q, d_v}}, {DType::kFloat32, {b, h_q, s_q}, {s_q * h_q, 1, h_q}}}, made);
    o->out = std::move(made[0]);
    o->lse = std::move(made[1]);
    o->out_ref = reader.read(o->out, "out");
    o->lse_ref = reader.read(o->lse, "lse");
    return true;
  }
  if (out.is_none()) {
    o->out = new_cuda_tensor(*reader.api(), device_id, dtype, {b, s_q, h_q, d_v});
    out = o->out;
  } else {
    o->out = nb::borrow(out);
  }
  if (lse.is_none()) {
    o->lse = new_cuda_tensor(*reader.api(), device_id, DType::kFloat32, {b, h_q, s_q}, {s_q * h_q, 1, h_q},
                             b * s_q * h_q);
    lse = o->lse;
  } else {
    o->lse = nb::borrow(lse);
  }
  o->out_ref = reader.read(out, "out");
  o->lse_ref = reader.read(lse, "lse");
  return true;
}

// Orders the calls that share one schedule and split-KV scratch (one DecodeStep) when they come from different
// streams: a call on another stream than the previous one first waits for everything already enqueued on that
// stream (an event), so sharing an object across streams or threads is correct, though not concurrent. Calls on
// one stream cost nothing more. The mutex is taken without the GIL, so a thread waiting for it never blocks the
// thread that holds it.
class StreamOrder {
 public:
  ~StreamOrder() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }

  // Runs `launch` on `stream` after the previous call's stream, under the mutex. Call without the GIL, with the
  // schedule's device current.
  template <class Launch>
  Status run(cudaStream_t stream, Launch&& launch) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (has_last_ && last_ != stream) wait_for_last(stream);
    last_ = stream;
    has_last_ = true;
    return launch();
  }

  cudaStream_t last_stream() const { return last_; }

 private:
  void wait_for_last(cudaStream_t stream) {
    // A stream under CUDA-graph capture cannot wait for an event recorded outside it (torch.cuda.graph
    // synchronises the device before capturing anyway); neither can an event be recorded into a capture from here.
    cudaStreamCaptureStatus now = cudaStreamCaptureStatusNone, before = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(stream, &now);
    if (err == cudaSuccess) err = cudaStreamIsCapturing(last_, &before);
    if (err == cudaSuccess && now == cudaStreamCaptureStatusNone && before == cudaStreamCaptureStatusNone) {
      if (event_ == nullptr) err = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
      if (err == cudaSuccess) err = cudaEventRecord(event_, last_);
      if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, event_, 0);
    }
    // A failed call of ours (a stream destroyed since) must not be reported later as the launch's error, nor as
    // someone else's; an error pending from someone else is left alone (src/common/cuda_check.h, "Attribution").
    if (err != cudaSuccess && cudaPeekAtLastError() == err) cudaGetLastError();
  }

  std::mutex mutex_;
  cudaStream_t last_ = nullptr;
  bool has_last_ = false;
  cudaEvent_t event_ = nullptr;
};

// Launches with the GIL released and `device_id` current, through `order` when the schedule is shared.
template <class Launch>
void launch_on(int device_id, const CallStream& stream, StreamOrder* order, Launch&& launch) {
  launch_without_gil(device_id, stream, [&] { return order != nullptr ? order->run(stream.stream, launch) : launch(); });
}

// ---------------------------------------------------------------------------------------------------------------
// What the flash_mla layer requires before the C++ API (python/openmla/decode.py, _check_call), tested here
// ---------------------------------------------------------------------------------------------------------------

// One flash_mla_with_kvcache call as an entry receives it (the layer's argument order).
struct DecodeCall {
  nb::handle q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache, indices,
      attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length;

  // Calls the layer's check function with `prefix` and the call's arguments (softmax_scale aside: the layer does
  // not check it).
  template <class... Prefix>
  void check(const nb::object& checks, Prefix... prefix) const {
    if (!checks.is_valid())
      throw std::runtime_error("openmla: a decode entry used after the garbage collector cleared it");
    checks(prefix..., q, k_cache, block_table, cache_seqlens, head_dim_v, causal, is_fp8_kvcache, indices,
           attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length);
  }
};

// Runs `accept`, an entry's own tests, which read the call's arguments and return why the call cannot be served
// (null: it can). When it cannot, or an argument cannot be read (an exception), `check` (the layer's check function)
// raises the error that names what is wrong. If the checks find nothing, the entry's own error stands: a reading
// error as such (the C++ API's path raises it too), or, for a reason, an internal error (the entry and the checks
// disagree: a bug to report).
template <class Accept, class Check>
void accept_or_raise(const char* entry, Accept&& accept, Check&& check) {
  const char* reason = nullptr;
  try {
    reason = accept();
  } catch (const std::exception&) {
    check();
    throw;
  }
  if (reason == nullptr) return;
  check();
  throw std::runtime_error(std::string("openmla: internal error: ") + entry + " turned the call down (" + reason +
                           ") but the argument checks of openmla.decode accept it; please report it");
}

// The mode arguments of a dense call (indices None).
const char* dense_mode_refusal(const DecodeCall& c) {
  if (!c.attn_sink.is_none() || !c.extra_k_cache.is_none() || !c.extra_indices.is_none() ||
      !c.topk_length.is_none() || !c.extra_topk_length.is_none())
    return "a sparse-decode argument without indices";
  if (truthy(c.is_fp8_kvcache)) return "is_fp8_kvcache without indices";
  if (c.block_table.is_none() || c.cache_seqlens.is_none()) return "block_table or cache_seqlens is None";
  return nullptr;
}

// The mode arguments of a sparse call (indices given).
const char* sparse_mode_refusal(const DecodeCall& c) {
  if (!truthy(c.is_fp8_kvcache)) return "indices without is_fp8_kvcache";
  if (truthy(c.causal)) return "causal with indices";
  if (c.extra_k_cache.is_none() ? !c.extra_indices.is_none() || !c.extra_topk_length.is_none()
                                : c.extra_indices.is_none())
    return "extra-cache arguments that do not go together";
  return nullptr;
}

// Reads one of the tensors the layer requires to be CUDA tensors of its framework (q, k_cache, indices, the extra
// cache and indices): true when it is one, of `ndim` dimensions, read through `route` (the framework's exchange
// table; null: through __dlpack__).
bool read_required(TensorReader& reader, nb::handle obj, const char* name, int ndim,
                   const dlpack::ExchangeApi* route, TensorRef* t) {
  *t = reader.read(obj, name);
  return t->defined() && reader.last_route() == route && t->device == DeviceType::kCUDA && t->ndim == ndim;
}

// The FP8 caches of a sparse call: both read as required, of one layout (`format`, whose d_qk is `layout_d_qk`).
// `extra` is null when the call has no extra cache.
bool read_fp8_caches(TensorReader& reader, const DecodeCall& c, const dlpack::ExchangeApi* route, TensorRef* k,
                     TensorRef* extra, KVCacheFormat* format, int64_t* layout_d_qk) {
  if (!read_required(reader, c.k_cache, "k_cache", 4, route, k) || !fp8_format(k->shape[3], format, layout_d_qk))
    return false;
  if (extra == nullptr) return true;
  KVCacheFormat extra_format;
  int64_t extra_d_qk = 0;
  return read_required(reader, c.extra_k_cache, "extra_k_cache", 4, route, extra) &&
         fp8_format(extra->shape[3], &extra_format, &extra_d_qk) && extra_format == *format;
}

// ---------------------------------------------------------------------------------------------------------------
// Object style
// ---------------------------------------------------------------------------------------------------------------

// The shapes and flags a FlashMLASchedMeta was planned for: the fields of its config (decode.py, _Config) that a
// later call must repeat. topk, extra_page_block_size and extra_topk are None in the config where absent (0 here).
struct PlannedCall {
  int64_t b, s_q, h_q, page_block_size, h_k;
  bool causal, sparse;
  int64_t topk, extra_page_block_size, extra_topk;
  bool has_extra;
  int64_t d_qk, d_v;
  int device_id;
  bool topk_length_given, extra_topk_length_given;

  static PlannedCall of(nb::handle config) {
    auto integer = [&](const char* name) {
      const nb::object v = config.attr(name);
      return v.is_none() ? int64_t{0} : nb::cast<int64_t>(v);
    };
    auto flag = [&](const char* name) { return nb::cast<bool>(config.attr(name)); };
    return PlannedCall{.b = integer("b"), .s_q = integer("s_q"), .h_q = integer("h_q"),
                       .page_block_size = integer("page_block_size"), .h_k = integer("h_k"),
                       .causal = flag("causal"), .sparse = flag("is_fp8_kvcache"), .topk = integer("topk"),
                       .extra_page_block_size = integer("extra_page_block_size"), .extra_topk = integer("extra_topk"),
                       .has_extra = !config.attr("extra_topk").is_none(), .d_qk = integer("d_qk"),
                       .d_v = integer("d_v"), .device_id = nb::cast<int>(config.attr("device").attr("index")),
                       .topk_length_given = flag("topk_length_given"),
                       .extra_topk_length_given = flag("extra_topk_length_given")};
  }

  bool same_q(const TensorRef& q) const {
    return q.device_id == device_id && q.shape[0] == b && q.shape[1] == s_q && q.shape[2] == h_q && q.shape[3] == d_qk;
  }
};

class DecodeStep {
 public:
  // `config`: the planned call's config (decode.py, _Config); `checks(config, <call>)`: the layer's check function
  // for a call this object turns down; `problem`: the family's fields as keyword arguments (bind_decode_problem.h).
  DecodeStep(nb::handle metadata, nb::handle num_splits, nb::handle merge_counters, nb::handle partial_o,
             nb::handle partial_lse, nb::object config, nb::object checks, const nb::kwargs& problem)
      : planned_(PlannedCall::of(config)), config_(std::move(config)), checks_(std::move(checks)) {
    const FamilyDecodeProblem p = decode_problem_from_kwargs(problem, DecodeFamily::kByKeyword, "DecodeStep");
    if (p.sparse != planned_.sparse)
      throw nb::value_error("DecodeStep: the problem's family is not the config's (is_fp8_kvcache)");
    dense_ = p.dense;
    sparse_ = p.sparse_problem;
    TensorReader reader;
    schedule_.metadata = reader.read(metadata, "tile_scheduler_metadata");
    schedule_.num_splits = reader.read(num_splits, "num_splits");
    schedule_.merge_counters = reader.read(merge_counters, "merge_counters");
    split_.partial_o = reader.read(partial_o, "partial_o");
    split_.partial_lse = reader.read(partial_lse, "partial_lse");
    api_ = reader.api();
    owners_ = nb::make_tuple(metadata, num_splits, merge_counters, partial_o, partial_lse);
  }

  // Computes the schedule on the GPU from cache_seqlens (dense) or topk_length / extra_topk_length (sparse).
  void plan(nb::handle cache_seqlens, nb::handle topk_length, nb::handle extra_topk_length, nb::handle stream) {
    TensorReader reader;
    const TensorRef seqlens = reader.read(cache_seqlens, "cache_seqlens");
    const TensorRef lengths = reader.read(topk_length, "topk_length");
    const TensorRef extra_lengths = reader.read(extra_topk_length, "extra_topk_length");
    const CallStream s = call_stream(api_, stream, planned_.device_id);
    launch_on(planned_.device_id, s, &order_, [&] {
      return planned_.sparse ? plan_decode(sparse_, lengths, extra_lengths, schedule_, s.stream)
                             : plan_decode(dense_, seqlens, schedule_, s.stream);
    });
  }

  // One call of the step (flash_mla_with_kvcache's arguments) -> (out, lse); raises what is wrong with a call that
  // is not the planned one.
  nb::object decode(nb::handle q, nb::handle k_cache, nb::handle block_table, nb::handle cache_seqlens,
                    nb::handle head_dim_v, nb::handle softmax_scale, nb::handle causal, nb::handle is_fp8_kvcache,
                    nb::handle indices, nb::handle attn_sink, nb::handle extra_k_cache, nb::handle extra_indices,
                    nb::handle topk_length, nb::handle extra_topk_length, nb::handle out, nb::handle lse,
                    nb::handle stream) {
    const DecodeCall c{q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache,
                       indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length};
    TensorReader reader;
    CallOutputs o;
    auto check = [&] { c.check(checks_, config_); };
    if (indices.is_none()) {
      DenseDecodeArgs args;
      accept_or_raise("DecodeStep.decode", [&] { return accept_dense(c, reader, &args, out, lse, &o); }, check);
      DenseDecodeProblem problem = dense_;
      problem.cache_format = dense_format(args.q);  // bf16 or fp16: q's (the C++ API checks the cache's)
      launch(reader, o, softmax_scale, stream, &args, [&](cudaStream_t s) { return dense_decode(problem, args, s); });
    } else {
      SparseDecodeArgs args;
      accept_or_raise("DecodeStep.decode", [&] { return accept_sparse(c, reader, &args, out, lse, &o); }, check);
      launch(reader, o, softmax_scale, stream, &args, [&](cudaStream_t s) { return sparse_decode(sparse_, args, s); });
    }
    return nb::make_tuple(o.out, o.lse);
  }

  // The stream of the last plan or call (as an int), for tests.
  uintptr_t last_stream() const { return reinterpret_cast<uintptr_t>(order_.last_stream()); }

  // Garbage-collector support (gc_slots): the step holds Python objects (its config, the check function and what
  // it refers to), which may refer back to the object that holds the step.
  int visit(visitproc visit, void* arg) const {
    Py_VISIT(config_.ptr());
    Py_VISIT(checks_.ptr());
    Py_VISIT(owners_.ptr());
    return 0;
  }

  void clear() {
    config_ = nb::object();
    checks_ = nb::object();
  }

 private:
  // Completes a call's arguments (the scale, the step's schedule and split buffers, the outputs) and runs `run` on
  // the call's stream, in the step's stream order.
  template <class Args, class Run>
  void launch(const TensorReader& reader, const CallOutputs& o, nb::handle softmax_scale, nb::handle stream,
              Args* args, Run&& run) {
    args->softmax_scale = scale_or_default(softmax_scale, planned_.d_qk);
    args->schedule = schedule_;
    args->split = split_;
    args->out = o.out_ref;
    args->lse = o.lse_ref;
    const CallStream s = call_stream(reader.api(), stream, planned_.device_id);
    launch_on(planned_.device_id, s, &order_, [&] { return run(s.stream); });
  }

  // The caller's outputs, or new ones of the planned shapes; the refusal when they cannot be allocated here.
  const char* planned_outputs(TensorReader& reader, nb::handle out, nb::handle lse, DType dtype, CallOutputs* o) const {
    return prepare_outputs(reader, out, lse, planned_.device_id, dtype, planned_.b, planned_.s_q, planned_.h_q,
                           planned_.d_v, o)
               ? nullptr
               : "outputs to allocate without the framework's allocator";
  }

  // The planned call's tests of a dense call; fills args' tensors and the outputs.
  const char* accept_dense(const DecodeCall& c, TensorReader& reader, DenseDecodeArgs* args, nb::handle out,
                           nb::handle lse, CallOutputs* o) const {
    if (const char* why = dense_mode_refusal(c)) return why;
    if (planned_.sparse) return "a dense call of a sparse schedule";
    if (!read_required(reader, c.q, "q", 4, api_, &args->q) || !planned_.same_q(args->q))
      return "q is not the planned one";
    if (!read_required(reader, c.k_cache, "k_cache", 4, api_, &args->k_cache) ||
        args->k_cache.shape[1] != planned_.page_block_size || args->k_cache.shape[2] != planned_.h_k)
      return "k_cache is not the planned one";
    if (truthy(c.causal) != planned_.causal || int_value(c.head_dim_v) != planned_.d_v)
      return "causal or head_dim_v is not the planned one";
    if (args->k_cache.device_id != args->q.device_id) return "k_cache is on another device than q";
    args->block_table = reader.read(c.block_table, "block_table");
    args->cache_seqlens = reader.read(c.cache_seqlens, "cache_seqlens");
    return planned_outputs(reader, out, lse, args->q.dtype, o);
  }

  // The planned call's tests of a sparse call; fills args' tensors and the outputs.
  const char* accept_sparse(const DecodeCall& c, TensorReader& reader, SparseDecodeArgs* args, nb::handle out,
                            nb::handle lse, CallOutputs* o) const {
    if (const char* why = sparse_mode_refusal(c)) return why;
    if (!planned_.sparse) return "a sparse call of a dense schedule";
    const bool has_extra = !c.extra_k_cache.is_none();
    KVCacheFormat format;
    int64_t layout_d_qk = 0;
    if (!read_required(reader, c.q, "q", 4, api_, &args->q) || !planned_.same_q(args->q))
      return "q is not the planned one";
    if (!read_fp8_caches(reader, c, api_, &args->k_cache, has_extra ? &args->extra_k_cache : nullptr, &format,
                         &layout_d_qk) ||
        layout_d_qk != args->q.shape[3] || args->k_cache.shape[1] != planned_.page_block_size ||
        args->k_cache.shape[2] != planned_.h_k)
      return "an FP8 cache is not the planned one";
    if (!read_required(reader, c.indices, "indices", 3, api_, &args->indices) ||
        args->indices.shape[2] != planned_.topk)
      return "indices are not the planned ones";
    if (has_extra != planned_.has_extra ||
        (has_extra && (!read_required(reader, c.extra_indices, "extra_indices", 3, api_, &args->extra_indices) ||
                       args->extra_k_cache.shape[1] != planned_.extra_page_block_size ||
                       args->extra_indices.shape[2] != planned_.extra_topk)))
      return "the extra cache is not the planned one";
    if (c.topk_length.is_none() == planned_.topk_length_given ||
        c.extra_topk_length.is_none() == planned_.extra_topk_length_given || int_value(c.head_dim_v) != planned_.d_v)
      return "topk_length, extra_topk_length or head_dim_v is not the planned one";
    const int device = args->q.device_id;
    if (args->k_cache.device_id != device || args->indices.device_id != device ||
        (has_extra && (args->extra_k_cache.device_id != device || args->extra_indices.device_id != device)))
      return "a tensor on another device than q";
    args->topk_length = reader.read(c.topk_length, "topk_length");
    args->extra_topk_length = reader.read(c.extra_topk_length, "extra_topk_length");
    args->attn_sink = reader.read(c.attn_sink, "attn_sink");
    return planned_outputs(reader, out, lse, args->q.dtype, o);
  }

  const PlannedCall planned_;
  nb::object config_, checks_;
  DenseDecodeProblem dense_;
  SparseDecodeProblem sparse_;
  DecodeSchedule schedule_;
  DecodeSplitBuffers split_;
  nb::object owners_;  // the schedule's tensors, alive as long as this object
  const dlpack::ExchangeApi* api_ = nullptr;  // of the schedule's framework (its current stream plans), or null
  StreamOrder order_;
};
// ---------------------------------------------------------------------------------------------------------------
// Tensor style
// ---------------------------------------------------------------------------------------------------------------

// Split-KV scratch and merge counters of tensor-style calls, one set per (device, stream): calls on one stream
// run one after another, so they can share it; calls on different streams (threads) never do. A set grows when
// a call needs more (to at least twice its size); the sets it replaces are kept alive, since a CUDA graph
// captured earlier may still write them. The merge counters are allocated zeroed: every decode call leaves
// them zero (include/openmla/decode.h).
class SplitScratchPool {
 public:
  // `allocate(device_index, rows, d_v, counters)` -> (partial_o (rows, d_v) float32, partial_lse (rows,)
  // float32, merge_counters (counters,) int32 zeros), on the device's current stream.
  explicit SplitScratchPool(nb::object allocate) : allocate_(std::move(allocate)) {}

  struct Scratch {
    DecodeSplitBuffers split;
    TensorRef merge_counters;
  };

  Scratch get(int device_id, cudaStream_t stream, int64_t rows, int64_t d_v, int64_t counters) {
    if (const Entry* e = find(device_id, stream);
        e != nullptr && e->rows >= rows && e->d_v == d_v && e->counters >= counters)
      return e->scratch;  // a copy: the GIL is released while it is used, and another thread may grow the pool
    int64_t want_rows = rows, want_counters = std::max<int64_t>(counters, 1);
    if (const Entry* e = find(device_id, stream); e != nullptr && e->d_v == d_v) {
      want_rows = std::max(rows, e->rows < rows ? 2 * e->rows : e->rows);
      want_counters = std::max(want_counters, e->counters < counters ? 2 * e->counters : e->counters);
    }
    if (!allocate_.is_valid()) throw std::runtime_error("openmla: the split-KV scratch pool was cleared");
    // Python code: another thread may run meanwhile and change the pool, so the entry is looked up again after.
    nb::object tensors = allocate_(device_id, want_rows, d_v, want_counters);
    TensorReader reader;
    Entry fresh{.device_id = device_id, .stream = stream, .rows = want_rows, .d_v = d_v, .counters = want_counters,
                .scratch = {}, .owners = tensors};
    fresh.scratch.split.partial_o = reader.read(tensors[0], "partial_o");
    fresh.scratch.split.partial_lse = reader.read(tensors[1], "partial_lse");
    fresh.scratch.merge_counters = reader.read(tensors[2], "merge_counters");
    if (Entry* e = find(device_id, stream)) {
      retired_.push_back(e->owners);
      *e = std::move(fresh);
      return e->scratch;
    }
    entries_.push_back(std::move(fresh));
    return entries_.back().scratch;
  }

  size_t size() const { return entries_.size(); }

  // Garbage-collector support (TensorStyleDecode's): the Python objects the pool holds.
  int visit(visitproc visit, void* arg) const {
    Py_VISIT(allocate_.ptr());
    for (const Entry& e : entries_) Py_VISIT(e.owners.ptr());
    for (const nb::object& o : retired_) Py_VISIT(o.ptr());
    return 0;
  }

  void clear() {
    allocate_ = nb::object();
    entries_.clear();
    retired_.clear();
  }

 private:
  struct Entry {
    int device_id;
    cudaStream_t stream;
    int64_t rows, d_v, counters;
    Scratch scratch;
    nb::object owners;
  };

  Entry* find(int device_id, cudaStream_t stream) {
    for (Entry& e : entries_)
      if (e.device_id == device_id && e.stream == stream) return &e;
    return nullptr;
  }
  nb::object allocate_;
  std::vector<Entry> entries_;
  std::vector<nb::object> retired_;
};

// The tensor style's entry: plan() and decode(), with the split-KV scratch pool of its calls.
class TensorStyleDecode {
 public:
  // `allocate`: SplitScratchPool's allocator. `check_call(tile_scheduler_metadata, num_splits, <call>)` and
  // `check_plan(cache_seqlens)`: the layer's check functions for a call or a plan this entry turns down.
  TensorStyleDecode(nb::object allocate, nb::object check_call, nb::object check_plan)
      : pool_(std::move(allocate)), check_call_(std::move(check_call)), check_plan_(std::move(check_plan)) {}

  // New (tile_scheduler_metadata, num_splits) int32 tensors on `like`'s device (or the caller's, when given), planned
  // on the GPU from cache_seqlens (dense) or topk_length / extra_topk_length (sparse). The problem comes from
  // decode.py (get_mla_metadata's arguments, or the shapes of an object-style call traced by torch.compile).
  nb::object plan(nb::handle like, nb::handle cache_seqlens, nb::handle topk_length, nb::handle extra_topk_length,
                  int64_t batch, int64_t s_q, int64_t h_q, int64_t h_kv, bool sparse, int64_t topk, int64_t extra_topk,
                  nb::handle metadata, nb::handle num_splits, nb::handle stream, bool batch_invariant) {
    TensorReader reader;
    TensorRef where;
    const bool allocate = metadata.is_none() || num_splits.is_none();
    accept_or_raise(
        "TensorStyleDecode.plan",
        [&]() -> const char* {
          where = reader.read(like, "cache_seqlens");
          if (!where.defined() || where.device != DeviceType::kCUDA) return "cache_seqlens is not a CUDA tensor";
          if (allocate && reader.api() == nullptr) return "schedule tensors to allocate without a framework allocator";
          return nullptr;
        },
        [&] { check_plan_(like); });
    const int device_id = where.device_id;
    const TensorRef seqlens = reader.read(cache_seqlens, "cache_seqlens");
    const TensorRef lengths = reader.read(topk_length, "topk_length");
    const TensorRef extra_lengths = reader.read(extra_topk_length, "extra_topk_length");
    // The schedule depends on the batch, the head geometry, the SM count and (sparse) the top-k sizes and lengths,
    // not on the cache layout (each family's default format).
    const int num_sms = device_sm_count(device_id);
    // (batch_invariant: the schedule tensors' shapes are the default's; the split buffers, which the call sizes from
    // its block table, are not needed here.)
    DenseDecodeProblem dense{.batch = batch, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .num_sms = num_sms};
    SparseDecodeProblem sparse_problem{
        .batch = batch, .s_q = s_q, .h_q = h_q, .topk = topk, .extra_topk = extra_topk, .num_sms = num_sms};
    const DecodeWorkspaceSizes sizes = sparse ? decode_workspace_sizes(sparse_problem) : decode_workspace_sizes(dense);
    dense.batch_invariant = sparse_problem.batch_invariant = batch_invariant;
    nb::object md = nb::borrow(metadata), splits = nb::borrow(num_splits);
    if (allocate) {
      md = new_cuda_tensor(*reader.api(), device_id, DType::kInt32, {sizes.num_sm_parts, kDecodeScheduleRecordInts});
      splits = new_cuda_tensor(*reader.api(), device_id, DType::kInt32, {sizes.num_splits_ints});
    }
    DecodeSchedule schedule;
    schedule.metadata = reader.read(md, "tile_scheduler_metadata");
    schedule.num_splits = reader.read(splits, "num_splits");
    const CallStream s = call_stream(reader.api(), stream, device_id);
    launch_on(device_id, s, nullptr, [&] {
      return sparse ? plan_decode(sparse_problem, lengths, extra_lengths, schedule, s.stream)
                    : plan_decode(dense, seqlens, schedule, s.stream);
    });
    return nb::make_tuple(md, splits);
  }

  // One call with tensor-style metadata (flash_mla_with_kvcache's arguments) -> (out, lse); raises what is wrong
  // with a call it cannot serve.
  nb::object decode(nb::handle q, nb::handle k_cache, nb::handle block_table, nb::handle cache_seqlens,
                    nb::handle head_dim_v, nb::handle metadata, nb::handle num_splits, nb::handle softmax_scale,
                    nb::handle causal, nb::handle is_fp8_kvcache, nb::handle indices, nb::handle attn_sink,
                    nb::handle extra_k_cache, nb::handle extra_indices, nb::handle topk_length,
                    nb::handle extra_topk_length, nb::handle out, nb::handle lse, nb::handle stream,
                    bool batch_invariant) {
    const DecodeCall c{q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache,
                       indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length};
    TensorReader reader;
    Call call;
    accept_or_raise(
        "TensorStyleDecode.decode", [&] { return accept(c, metadata, num_splits, out, lse, stream, reader, &call); },
        [&] { c.check(check_call_, metadata, num_splits); });
    const int device_id = call.q.device_id;
    call.dense_problem.num_sms = call.sparse_problem.num_sms = device_sm_count(device_id);
    if (batch_invariant) {  // the plan's mode (get_mla_metadata(..., batch_invariant=True)); split slots by the table
      call.dense_problem.batch_invariant = call.sparse_problem.batch_invariant = true;
      if (!call.sparse && call.block_table.defined() && call.block_table.ndim == 2)
        call.dense_problem.max_blocks_per_seq = call.block_table.shape[1];
    }
    const CallStream s = call_stream(reader.api(), stream, device_id);
    const DecodeWorkspaceSizes sizes = call.sparse ? decode_workspace_sizes(call.sparse_problem)
                                                   : decode_workspace_sizes(call.dense_problem);
    const SplitScratchPool::Scratch scratch =
        pool_.get(device_id, s.stream, sizes.partial_rows, call.d_v, sizes.merge_counter_ints);
    DecodeSchedule schedule = call.schedule;
    schedule.merge_counters = scratch.merge_counters;
    const float scale = scale_or_default(softmax_scale, call.q.shape[3]);
    if (!call.sparse) {
      DenseDecodeArgs args{.q = call.q, .k_cache = call.k_cache, .block_table = call.block_table,
                           .cache_seqlens = call.cache_seqlens, .softmax_scale = scale, .schedule = schedule,
                           .split = scratch.split, .out = call.outputs.out_ref, .lse = call.outputs.lse_ref};
      launch_on(device_id, s, nullptr, [&] { return dense_decode(call.dense_problem, args, s.stream); });
    } else {
      SparseDecodeArgs args{.q = call.q, .k_cache = call.k_cache, .indices = call.indices,
                            .topk_length = call.topk_length, .attn_sink = call.attn_sink,
                            .extra_k_cache = call.extra_k_cache, .extra_indices = call.extra_indices,
                            .extra_topk_length = call.extra_topk_length, .softmax_scale = scale,
                            .schedule = schedule, .split = scratch.split, .out = call.outputs.out_ref,
                            .lse = call.outputs.lse_ref};
      launch_on(device_id, s, nullptr, [&] { return sparse_decode(call.sparse_problem, args, s.stream); });
    }
    return nb::make_tuple(call.outputs.out, call.outputs.lse);
  }

  size_t pool_size() const { return pool_.size(); }

  // Garbage-collector support (gc_slots): the entry holds Python objects (the allocator and the check functions,
  // which refer back to the module that holds the entry), so the cycle must be visible to Python's collector.
  int visit(visitproc visit, void* arg) const {
    Py_VISIT(check_call_.ptr());
    Py_VISIT(check_plan_.ptr());
    return pool_.visit(visit, arg);
  }

  void clear() {
    check_call_ = nb::object();
    check_plan_ = nb::object();
    pool_.clear();
  }

 private:
  // One call's problem and tensors (the SM count and the split-KV scratch come later).
  struct Call {
    bool sparse = false;
    int64_t d_v = 0;
    DenseDecodeProblem dense_problem;
    SparseDecodeProblem sparse_problem;
    DecodeSchedule schedule;
    TensorRef q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
        extra_topk_length;
    CallOutputs outputs;
  };

  // The layer's tests of a tensor-style call (no schedule to compare with: the C++ API checks the metadata).
  const char* accept(const DecodeCall& c, nb::handle metadata, nb::handle num_splits, nb::handle out, nb::handle lse,
                     nb::handle stream, TensorReader& reader, Call* call) const {
    // The schedule: torch tensors or anything with __dlpack__ (the C++ API checks what they hold).
    call->schedule.metadata = reader.read(metadata, "tile_scheduler_metadata");
    if (!call->schedule.metadata.defined() ||
        (reader.last_route() == nullptr && !PyObject_HasAttrString(metadata.ptr(), "__dlpack__")))
      return "tile_scheduler_metadata is not a tensor";
    call->schedule.num_splits = reader.read(num_splits, "num_splits");
    if (!call->schedule.num_splits.defined()) return "num_splits is None";
    call->sparse = !c.indices.is_none();
    if (const char* why = call->sparse ? sparse_mode_refusal(c) : dense_mode_refusal(c)) return why;
    call->d_v = int_value(c.head_dim_v);
    // q decides the framework; without one with the exchange API the caller gives the stream.
    TensorRef& q = call->q;
    q = reader.read(c.q, "q");
    const dlpack::ExchangeApi* route = reader.last_route();
    if (!q.defined() || q.device != DeviceType::kCUDA || q.ndim != 4) return "q is not a 4-dimensional CUDA tensor";
    if (route == nullptr && stream.is_none()) return "q is not a tensor of a framework with the DLPack exchange API";
    if (!call->sparse) {
      if (!read_required(reader, c.k_cache, "k_cache", 4, route, &call->k_cache))
        return "k_cache is not a 4-dimensional CUDA tensor of q's framework";
      const TensorRef& k = call->k_cache;
      call->dense_problem = DenseDecodeProblem{.batch = q.shape[0], .s_q = q.shape[1], .h_q = q.shape[2],
                                               .h_kv = k.shape[2], .d_qk = q.shape[3], .d_v = call->d_v,
                                               .page_block_size = k.shape[1], .cache_format = dense_format(q),
                                               .causal = truthy(c.causal)};
      call->block_table = reader.read(c.block_table, "block_table");
      call->cache_seqlens = reader.read(c.cache_seqlens, "cache_seqlens");
    } else {
      const bool has_extra = !c.extra_k_cache.is_none();
      KVCacheFormat format;
      int64_t layout_d_qk = 0;
      if (!read_fp8_caches(reader, c, route, &call->k_cache, has_extra ? &call->extra_k_cache : nullptr, &format,
                           &layout_d_qk) ||
          layout_d_qk != q.shape[3])
        return "an FP8 cache is not one of q's layout";
      if (!read_required(reader, c.indices, "indices", 3, route, &call->indices) ||
          (has_extra && !read_required(reader, c.extra_indices, "extra_indices", 3, route, &call->extra_indices)))
        return "indices are not 3-dimensional CUDA tensors of q's framework";
      call->sparse_problem = SparseDecodeProblem{
          .batch = q.shape[0], .s_q = q.shape[1], .h_q = q.shape[2], .d_qk = q.shape[3], .d_v = call->d_v,
          .page_block_size = call->k_cache.shape[1], .cache_format = format, .topk = call->indices.shape[2],
          .extra_topk = has_extra ? call->extra_indices.shape[2] : 0,
          .extra_page_block_size = has_extra ? call->extra_k_cache.shape[1] : 0};
      call->topk_length = reader.read(c.topk_length, "topk_length");
      call->attn_sink = reader.read(c.attn_sink, "attn_sink");
      call->extra_topk_length = reader.read(c.extra_topk_length, "extra_topk_length");
    }
    if (!prepare_outputs(reader, out, lse, q.device_id, q.dtype, q.shape[0], q.shape[1], q.shape[2], call->d_v,
                         &call->outputs))
      return "outputs to allocate without the framework's allocator";
    return nullptr;
  }

  SplitScratchPool pool_;
  nb::object check_call_, check_plan_;
};

// The type slots of a bound class T that holds Python objects, for Python's cycle collector: T::visit reports them,
// T::clear drops them.
template <class T>
int gc_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<T>(self)->visit(visit, arg);
}

template <class T>
int gc_clear(PyObject* self) {
  nb::inst_ptr<T>(self)->clear();
  return 0;
}

template <class T>
PyType_Slot* gc_slots() {
  static PyType_Slot slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(&gc_traverse<T>)},
                                {Py_tp_clear, reinterpret_cast<void*>(&gc_clear<T>)},
                                {0, nullptr}};
  return slots;
}

// What the reader makes of one object (tests): (data pointer, shape, strides, dtype name, device, device id,
// read through the exchange API).
nb::tuple read_tensor(nb::handle obj) {
  TensorReader reader;
  const TensorRef t = reader.read(obj, "tensor");
  nb::list shape, stride;
  for (int i = 0; i < t.ndim; ++i) {
    shape.append(t.shape[i]);
    stride.append(t.stride[i]);
  }
  return nb::make_tuple(reinterpret_cast<uintptr_t>(t.data), nb::tuple(shape), nb::tuple(stride),
                        std::string(dtype_name(t.dtype)), t.device == DeviceType::kCUDA ? "cuda" : "cpu", t.device_id,
                        reader.api() != nullptr);
}

}  // namespace

void bind_decode_step(nb::module_& m) {
  nb::class_<DecodeStep>(m, "DecodeStep",
                         "The problem and schedule of one decoding step (the object style's FlashMLASchedMeta): "
                         "every call of the step goes through decode(). Built by python/openmla/decode.py.",
                         nb::type_slots(gc_slots<DecodeStep>()))
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, nb::handle, nb::object, nb::object,
                    const nb::kwargs&>(),
           nb::arg("tile_scheduler_metadata"), nb::arg("num_splits"), nb::arg("merge_counters"), nb::arg("partial_o"),
           nb::arg("partial_lse"), nb::kw_only(), nb::arg("config"), nb::arg("checks"), nb::arg("problem"))
      .def("plan", &DecodeStep::plan, nb::arg("cache_seqlens").none(), nb::arg("topk_length").none(),
           nb::arg("extra_topk_length").none(), nb::arg("stream").none() = nb::none(),
           "Plans the schedule on the stream (default: the framework's current stream of the schedule's device).")
      .def("decode", &DecodeStep::decode, nb::arg("q").none(), nb::arg("k_cache").none(),
           nb::arg("block_table").none(), nb::arg("cache_seqlens").none(), nb::arg("head_dim_v").none(),
           nb::arg("softmax_scale").none(), nb::arg("causal").none(), nb::arg("is_fp8_kvcache").none(),
           nb::arg("indices").none(), nb::arg("attn_sink").none(), nb::arg("extra_k_cache").none(),
           nb::arg("extra_indices").none(), nb::arg("topk_length").none(), nb::arg("extra_topk_length").none(),
           nb::arg("out").none(), nb::arg("lse").none(), nb::arg("stream").none() = nb::none(),
           "One call of the step with flash_mla_with_kvcache's arguments -> (out, lse); a call that is not the "
           "planned one raises the error flash_mla_with_kvcache names for it.")
      .def_prop_ro("last_stream", &DecodeStep::last_stream, "cudaStream_t (int) of the last plan or call.");

  nb::class_<TensorStyleDecode>(m, "TensorStyleDecode",
                                "The tensor style's entry (get_mla_metadata(cache_seqlens, ...)): plan() makes the "
                                "schedule tensors, decode() is every call that passes them; the split-KV scratch of "
                                "those calls comes from a pool kept per (device, stream).",
                                nb::type_slots(gc_slots<TensorStyleDecode>()))
      .def(nb::init<nb::object, nb::object, nb::object>(), nb::arg("allocate"), nb::arg("check_call"),
           nb::arg("check_plan"))
      .def("plan", &TensorStyleDecode::plan, nb::arg("like").none(), nb::arg("cache_seqlens").none(),
           nb::arg("topk_length").none(), nb::arg("extra_topk_length").none(), nb::arg("batch"), nb::arg("s_q"),
           nb::arg("h_q"), nb::arg("h_kv"), nb::arg("sparse"), nb::arg("topk"), nb::arg("extra_topk"),
           nb::arg("tile_scheduler_metadata").none() = nb::none(), nb::arg("num_splits").none() = nb::none(),
           nb::arg("stream").none() = nb::none(), nb::arg("batch_invariant") = false,
           "(tile_scheduler_metadata, num_splits) planned on the GPU on like's device: new tensors, or the given "
           "ones (with stream: for tensors without the DLPack exchange API); batch_invariant: the batch-invariant "
           "schedule (docs/decode-schedule.md).")
      .def("decode", &TensorStyleDecode::decode, nb::arg("q").none(), nb::arg("k_cache").none(),
           nb::arg("block_table").none(), nb::arg("cache_seqlens").none(), nb::arg("head_dim_v").none(),
           nb::arg("tile_scheduler_metadata").none(), nb::arg("num_splits").none(), nb::arg("softmax_scale").none(),
           nb::arg("causal").none(), nb::arg("is_fp8_kvcache").none(), nb::arg("indices").none(),
           nb::arg("attn_sink").none(), nb::arg("extra_k_cache").none(), nb::arg("extra_indices").none(),
           nb::arg("topk_length").none(), nb::arg("extra_topk_length").none(), nb::arg("out").none(),
           nb::arg("lse").none(), nb::arg("stream").none() = nb::none(), nb::arg("batch_invariant") = false,
           "One call with tensor-style metadata, flash_mla_with_kvcache's arguments -> (out, lse); a call it cannot "
           "serve raises the error flash_mla_with_kvcache names for it. batch_invariant: the metadata's mode.")
      .def("__len__", &TensorStyleDecode::pool_size, "Split-KV scratch sets in the pool, one per (device, stream).");

  m.def("device_sm_count", &device_sm_count, nb::arg("device_id"), "SM count of a CUDA device (queried once).");
  m.def("read_tensor", &read_tensor, nb::arg("tensor"),
        "(data_ptr, shape, strides, dtype, device type, device id, via exchange API) as the decode entries read it.");
}

}  // namespace openmla::py
