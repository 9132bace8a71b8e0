// Binding of the per-call decode entries behind python/openmla/decode.py, built for a small host cost per call
// (docs/python-api.md, "Host cost"):
//
//   DecodeStep        the object style (FlashMLASchedMeta): one decoding step's problem and schedule, read once
//                     when the first layer plans; each later layer passes only its own tensors.
//   plan_metadata     the tensor style (get_mla_metadata(cache_seqlens, ...)): plans into new int32 tensors.
//   decode_with_metadata + SplitScratchPool
//                     a call with tensor-style metadata; its split-KV scratch comes from a pool kept per
//                     (device, stream), so no call allocates it once the pool holds one large enough.
//
// Tensors are read through the DLPack C exchange API where the framework has one (object_tensors.h), the stream
// is the framework's current stream of the tensors' device, outputs are allocated by the framework when the
// caller passes none. The C++ API validates every call in full, as for the DLPack binding (bind_decode.cpp).
//
// The call entries return None when the call is not the one they were prepared for (other shapes or flags than
// the plan's, a tensor that is not on the planned CUDA device, an output to allocate without a framework
// allocator): the Python layer then takes its general path, which names what differs.
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "bind_common.h"
#include "object_tensors.h"
#include "openmla/decode.h"

namespace openmla::py {

namespace {

constexpr int64_t kV32BytesPerToken = 656;
constexpr int64_t kModel1BytesPerToken = 584;

// A Python int that is not a bool.
bool read_int(nb::handle h, int64_t* out) {
  if (!PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = v;
  return true;
}

// softmax_scale None -> d_qk ** -0.5, computed as the general path computes it (a double power, then float).
float scale_or_default(nb::handle softmax_scale, int64_t d_qk) {
  if (softmax_scale.is_none()) return static_cast<float>(std::pow(static_cast<double>(d_qk), -0.5));
  return static_cast<float>(nb::cast<double>(softmax_scale));
}

// Python truthiness (flash_mla takes causal=0 / 1 as well as False / True).
bool truthy(nb::handle h) {
  const int v = PyObject_IsTrue(h.ptr());
  if (v < 0) throw nb::python_error();
  return v != 0;
}

bool on_device(const TensorRef& t, int device_id, int ndim) {
  return t.defined() && t.device == DeviceType::kCUDA && t.device_id == device_id && t.ndim == ndim;
}

KVCacheFormat dense_format(const TensorRef& q) {
  return q.dtype == DType::kFloat16 ? KVCacheFormat::kFloat16 : KVCacheFormat::kBFloat16;
}

// The FP8 layout of a cache from its bytes per token (the last dimension); false for any other size.
bool fp8_format(int64_t bytes_per_token, KVCacheFormat* format, int64_t* d_qk) {
  if (bytes_per_token == kV32BytesPerToken) {
    *format = KVCacheFormat::kFp8V32;
    *d_qk = 576;
    return true;
  }
  if (bytes_per_token == kModel1BytesPerToken) {
    *format = KVCacheFormat::kFp8Model1;
    *d_qk = 512;
    return true;
  }
  return false;
}

KVCacheFormat format_from_name(const std::string& name) {
  if (name == "bf16") return KVCacheFormat::kBFloat16;
  if (name == "fp16") return KVCacheFormat::kFloat16;
  if (name == "fp8_v32") return KVCacheFormat::kFp8V32;
  if (name == "fp8_model1") return KVCacheFormat::kFp8Model1;
  throw nb::value_error(("argument 'cache_format': unknown format '" + name + "'").c_str());
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
// Object style
// ---------------------------------------------------------------------------------------------------------------
class DecodeStep {
 public:
  DecodeStep(nb::handle metadata, nb::handle num_splits, nb::handle merge_counters, nb::handle partial_o,
             nb::handle partial_lse, int device_id, bool sparse, int64_t batch, int64_t s_q, int64_t h_q, int64_t h_kv,
             int64_t d_qk, int64_t d_v, int64_t page_block_size, const std::string& cache_format, bool causal,
             int64_t topk, int64_t extra_topk, int64_t extra_page_block_size, int num_sms, bool topk_length_given,
             bool extra_topk_length_given, int64_t max_blocks_per_seq)
      : device_id_(device_id), topk_length_given_(topk_length_given), extra_topk_length_given_(extra_topk_length_given) {
    // max_blocks_per_seq (dense): the block table's width at the first call, so the plan clamps lengths as the kernel
    // does; later calls must pass a block table of that width (the C++ API names it otherwise).
    problem_ = DecodeProblem{.batch = batch, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .d_qk = d_qk, .d_v = d_v,
                             .page_block_size = page_block_size, .cache_format = format_from_name(cache_format),
                             .causal = causal, .sparse = sparse, .topk = topk, .extra_topk = extra_topk,
                             .extra_page_block_size = extra_page_block_size, .num_sms = num_sms,
                             .max_blocks_per_seq = sparse ? 0 : max_blocks_per_seq};
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
    const CallStream s = call_stream(api_, stream, device_id_);
    launch_on(device_id_, s, &order_, [&] {
      return plan_decode(problem_, problem_.sparse ? TensorRef{} : seqlens, lengths, extra_lengths, schedule_,
                         s.stream);
    });
  }

  nb::object dense(nb::handle q, nb::handle k_cache, nb::handle block_table, nb::handle cache_seqlens,
                   nb::handle head_dim_v, nb::handle softmax_scale, nb::handle causal, nb::handle out, nb::handle lse,
                   nb::handle stream) {
    if (problem_.sparse || truthy(causal) != problem_.causal || !has_d_v(head_dim_v)) return nb::none();
    TensorReader reader;
    DenseDecodeArgs args;
    args.q = reader.read(q, "q");
    args.k_cache = reader.read(k_cache, "k_cache");
    if (!same_q(args.q) || !on_device(args.k_cache, device_id_, 4) || args.k_cache.shape[1] != problem_.page_block_size ||
        args.k_cache.shape[2] != problem_.h_kv)
      return nb::none();
    args.block_table = reader.read(block_table, "block_table");
    args.cache_seqlens = reader.read(cache_seqlens, "cache_seqlens");
    CallOutputs o;
    if (!prepare_outputs(reader, out, lse, device_id_, args.q.dtype, problem_.batch, problem_.s_q, problem_.h_q,
                         problem_.d_v, &o))
      return nb::none();
    DecodeProblem problem = problem_;
    problem.cache_format = dense_format(args.q);
    args.softmax_scale = scale_or_default(softmax_scale, problem_.d_qk);
    args.schedule = schedule_;
    args.split = split_;
    args.out = o.out_ref;
    args.lse = o.lse_ref;
    const CallStream s = call_stream(reader.api(), stream, device_id_);
    launch_on(device_id_, s, &order_, [&] { return dense_decode(problem, args, s.stream); });
    return nb::make_tuple(o.out, o.lse);
  }

  nb::object sparse(nb::handle q, nb::handle k_cache, nb::handle indices, nb::handle head_dim_v,
                    nb::handle softmax_scale, nb::handle attn_sink, nb::handle extra_k_cache, nb::handle extra_indices,
                    nb::handle topk_length, nb::handle extra_topk_length, nb::handle out, nb::handle lse,
                    nb::handle stream) {
    const bool has_extra = problem_.extra_topk > 0;
    if (!problem_.sparse || !has_d_v(head_dim_v) || topk_length.is_none() == topk_length_given_ ||
        extra_topk_length.is_none() == extra_topk_length_given_ || extra_k_cache.is_none() == has_extra ||
        extra_indices.is_none() == has_extra)
      return nb::none();
    TensorReader reader;
    SparseDecodeArgs args;
    args.q = reader.read(q, "q");
    args.k_cache = reader.read(k_cache, "k_cache");
    args.indices = reader.read(indices, "indices");
    if (!same_q(args.q) || !same_fp8_cache(args.k_cache, problem_.page_block_size) ||
        !on_device(args.indices, device_id_, 3) || args.indices.shape[2] != problem_.topk)
      return nb::none();
    if (has_extra) {
      args.extra_k_cache = reader.read(extra_k_cache, "extra_k_cache");
      args.extra_indices = reader.read(extra_indices, "extra_indices");
      if (!same_fp8_cache(args.extra_k_cache, problem_.extra_page_block_size) ||
          !on_device(args.extra_indices, device_id_, 3) || args.extra_indices.shape[2] != problem_.extra_topk)
        return nb::none();
    }
    args.topk_length = reader.read(topk_length, "topk_length");
    args.extra_topk_length = reader.read(extra_topk_length, "extra_topk_length");
    args.attn_sink = reader.read(attn_sink, "attn_sink");
    CallOutputs o;
    if (!prepare_outputs(reader, out, lse, device_id_, args.q.dtype, problem_.batch, problem_.s_q, problem_.h_q,
                         problem_.d_v, &o))
      return nb::none();
    args.softmax_scale = scale_or_default(softmax_scale, problem_.d_qk);
    args.schedule = schedule_;
    args.split = split_;
    args.out = o.out_ref;
    args.lse = o.lse_ref;
    const CallStream s = call_stream(reader.api(), stream, device_id_);
    launch_on(device_id_, s, &order_, [&] { return sparse_decode(problem_, args, s.stream); });
    return nb::make_tuple(o.out, o.lse);
  }

  // The stream of the last plan or call (as an int), for tests.
  uintptr_t last_stream() const { return reinterpret_cast<uintptr_t>(order_.last_stream()); }

 private:
  bool has_d_v(nb::handle head_dim_v) const {
    int64_t d_v = 0;
    return read_int(head_dim_v, &d_v) && d_v == problem_.d_v;
  }

  bool same_q(const TensorRef& q) const {
    return on_device(q, device_id_, 4) && q.shape[0] == problem_.batch && q.shape[1] == problem_.s_q &&
           q.shape[2] == problem_.h_q && q.shape[3] == problem_.d_qk;
  }

  bool same_fp8_cache(const TensorRef& cache, int64_t page_block_size) const {
    KVCacheFormat format;
    int64_t d_qk = 0;
    return on_device(cache, device_id_, 4) && cache.shape[1] == page_block_size && cache.shape[2] == problem_.h_kv &&
           fp8_format(cache.shape[3], &format, &d_qk) && format == problem_.cache_format;
  }

  DecodeProblem problem_;
  int device_id_;
  bool topk_length_given_, extra_topk_length_given_;
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

  // Garbage-collector support: the pool holds Python objects (the allocator, which refers back to the module that
  // holds the pool), so the cycle must be visible to Python's collector.
  static int traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    const SplitScratchPool* pool = nb::inst_ptr<SplitScratchPool>(self);
    Py_VISIT(pool->allocate_.ptr());
    for (const Entry& e : pool->entries_) Py_VISIT(e.owners.ptr());
    for (const nb::object& o : pool->retired_) Py_VISIT(o.ptr());
    return 0;
  }

  static int clear(PyObject* self) {
    SplitScratchPool* pool = nb::inst_ptr<SplitScratchPool>(self);
    pool->allocate_ = nb::object();
    pool->entries_.clear();
    pool->retired_.clear();
    return 0;
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

// The workspace sizes of `problem` (host arithmetic; num_sms is set, so no CUDA call).
DecodeWorkspaceSizes sizes_of(const DecodeProblem& problem) {
  DecodeWorkspaceSizes sizes;
  throw_if_error(get_decode_workspace_sizes(problem, &sizes));
  return sizes;
}

// A tensor-style schedule: new (tile_scheduler_metadata, num_splits) int32 tensors on `like`'s device, planned on
// the GPU from cache_seqlens (dense) or topk / topk_length / extra_topk_length (sparse). The problem comes from
// decode.py (get_mla_metadata's arguments, or the shapes of an object-style call traced by torch.compile).
nb::object plan_metadata(nb::handle like, nb::handle cache_seqlens, nb::handle topk_length,
                         nb::handle extra_topk_length, int64_t batch, int64_t s_q, int64_t h_q, int64_t h_kv,
                         bool sparse, int64_t topk, int64_t extra_topk, nb::handle stream) {
  TensorReader reader;
  const TensorRef where = reader.read(like, "cache_seqlens");
  if (!where.defined() || where.device != DeviceType::kCUDA || reader.api() == nullptr) return nb::none();
  const int device_id = where.device_id;
  const TensorRef seqlens = reader.read(cache_seqlens, "cache_seqlens");
  const TensorRef lengths = reader.read(topk_length, "topk_length");
  const TensorRef extra_lengths = reader.read(extra_topk_length, "extra_topk_length");
  // The schedule depends on the batch, the head geometry, the SM count and (sparse) the top-k sizes and lengths,
  // not on the cache layout.
  const DecodeProblem problem{.batch = batch, .s_q = s_q, .h_q = h_q, .h_kv = h_kv,
                              .cache_format = sparse ? KVCacheFormat::kFp8V32 : KVCacheFormat::kBFloat16,
                              .sparse = sparse, .topk = sparse ? topk : 0, .extra_topk = sparse ? extra_topk : 0,
                              .num_sms = device_sm_count(device_id)};
  const DecodeWorkspaceSizes sizes = sizes_of(problem);
  nb::object metadata =
      new_cuda_tensor(*reader.api(), device_id, DType::kInt32, {sizes.num_sm_parts, kDecodeScheduleRecordInts});
  nb::object num_splits = new_cuda_tensor(*reader.api(), device_id, DType::kInt32, {sizes.num_splits_ints});
  DecodeSchedule schedule;
  schedule.metadata = reader.read(metadata, "tile_scheduler_metadata");
  schedule.num_splits = reader.read(num_splits, "num_splits");
  const CallStream s = call_stream(reader.api(), stream, device_id);
  launch_on(device_id, s, nullptr, [&] {
    return plan_decode(problem, sparse ? TensorRef{} : seqlens, lengths, extra_lengths, schedule, s.stream);
  });
  return nb::make_tuple(metadata, num_splits);
}

nb::object decode_with_metadata(SplitScratchPool& pool, nb::handle q, nb::handle k_cache, nb::handle block_table,
                                nb::handle cache_seqlens, nb::handle head_dim_v, nb::handle metadata,
                                nb::handle num_splits, nb::handle softmax_scale, nb::handle causal_flag, nb::handle indices,
                                nb::handle attn_sink, nb::handle extra_k_cache, nb::handle extra_indices,
                                nb::handle topk_length, nb::handle extra_topk_length, nb::handle out, nb::handle lse,
                                nb::handle stream) {
  const bool sparse = !indices.is_none();
  const bool causal = truthy(causal_flag);
  int64_t d_v = 0;
  if (!read_int(head_dim_v, &d_v)) return nb::none();
  // Dense mode takes none of the sparse arguments: the general path names the one given.
  if (!sparse && (!attn_sink.is_none() || !extra_k_cache.is_none() || !extra_indices.is_none() ||
                  !topk_length.is_none() || !extra_topk_length.is_none()))
    return nb::none();
  TensorReader reader;
  const TensorRef q_ref = reader.read(q, "q");
  const TensorRef k_ref = reader.read(k_cache, "k_cache");
  if (!q_ref.defined() || q_ref.device != DeviceType::kCUDA || q_ref.ndim != 4 || !on_device(k_ref, q_ref.device_id, 4))
    return nb::none();
  const int device_id = q_ref.device_id;
  DecodeProblem problem{.batch = q_ref.shape[0], .s_q = q_ref.shape[1], .h_q = q_ref.shape[2], .h_kv = k_ref.shape[2],
                        .d_qk = q_ref.shape[3], .d_v = d_v, .page_block_size = k_ref.shape[1],
                        .cache_format = dense_format(q_ref), .causal = causal, .sparse = sparse,
                        .num_sms = device_sm_count(device_id)};
  TensorRef idx_ref, extra_k_ref, extra_idx_ref;
  if (sparse) {
    int64_t layout_d_qk = 0;
    idx_ref = reader.read(indices, "indices");
    extra_k_ref = reader.read(extra_k_cache, "extra_k_cache");
    extra_idx_ref = reader.read(extra_indices, "extra_indices");
    if (causal || !fp8_format(k_ref.shape[3], &problem.cache_format, &layout_d_qk) || layout_d_qk != problem.d_qk ||
        !on_device(idx_ref, device_id, 3) || extra_k_ref.defined() != extra_idx_ref.defined() ||
        (extra_k_ref.defined() && (!on_device(extra_k_ref, device_id, 4) || !on_device(extra_idx_ref, device_id, 3))))
      return nb::none();
    problem.topk = idx_ref.shape[2];
    problem.extra_topk = extra_k_ref.defined() ? extra_idx_ref.shape[2] : 0;
    problem.extra_page_block_size = extra_k_ref.defined() ? extra_k_ref.shape[1] : 0;
  }
  const DecodeSchedule planned{.metadata = reader.read(metadata, "tile_scheduler_metadata"),
                               .num_splits = reader.read(num_splits, "num_splits"), .merge_counters = {}};
  CallOutputs o;
  if (!prepare_outputs(reader, out, lse, device_id, q_ref.dtype, problem.batch, problem.s_q, problem.h_q, d_v, &o))
    return nb::none();
  const CallStream s = call_stream(reader.api(), stream, device_id);
  const DecodeWorkspaceSizes sizes = sizes_of(problem);
  const SplitScratchPool::Scratch scratch =
      pool.get(device_id, s.stream, sizes.partial_rows, d_v, sizes.merge_counter_ints);
  DecodeSchedule schedule = planned;
  schedule.merge_counters = scratch.merge_counters;
  const float scale = scale_or_default(softmax_scale, problem.d_qk);
  if (!sparse) {
    DenseDecodeArgs args{.q = q_ref, .k_cache = k_ref, .block_table = reader.read(block_table, "block_table"),
                         .cache_seqlens = reader.read(cache_seqlens, "cache_seqlens"), .softmax_scale = scale,
                         .schedule = schedule, .split = scratch.split, .out = o.out_ref, .lse = o.lse_ref};
    launch_on(device_id, s, nullptr, [&] { return dense_decode(problem, args, s.stream); });
  } else {
    SparseDecodeArgs args{.q = q_ref, .k_cache = k_ref, .indices = idx_ref,
                          .topk_length = reader.read(topk_length, "topk_length"),
                          .attn_sink = reader.read(attn_sink, "attn_sink"), .extra_k_cache = extra_k_ref,
                          .extra_indices = extra_idx_ref,
                          .extra_topk_length = reader.read(extra_topk_length, "extra_topk_length"),
                          .softmax_scale = scale, .schedule = schedule, .split = scratch.split, .out = o.out_ref,
                          .lse = o.lse_ref};
    launch_on(device_id, s, nullptr, [&] { return sparse_decode(problem, args, s.stream); });
  }
  return nb::make_tuple(o.out, o.lse);
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
                         "The problem and schedule of one decoding step (the object style's FlashMLASchedMeta), read "
                         "once; each call passes only its own tensors. Built by python/openmla/decode.py.")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, nb::handle, int, bool, int64_t, int64_t, int64_t,
                    int64_t, int64_t, int64_t, int64_t, const std::string&, bool, int64_t, int64_t, int64_t, int, bool,
                    bool, int64_t>(),
           nb::arg("tile_scheduler_metadata"), nb::arg("num_splits"), nb::arg("merge_counters"), nb::arg("partial_o"),
           nb::arg("partial_lse"), nb::kw_only(), nb::arg("device_id"), nb::arg("sparse"), nb::arg("batch"),
           nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d_qk"), nb::arg("d_v"),
           nb::arg("page_block_size"), nb::arg("cache_format"), nb::arg("causal"), nb::arg("topk"),
           nb::arg("extra_topk"), nb::arg("extra_page_block_size"), nb::arg("num_sms"), nb::arg("topk_length_given"),
           nb::arg("extra_topk_length_given"), nb::arg("max_blocks_per_seq") = 0)
      .def("plan", &DecodeStep::plan, nb::arg("cache_seqlens").none(), nb::arg("topk_length").none(),
           nb::arg("extra_topk_length").none(), nb::arg("stream").none() = nb::none(),
           "Plans the schedule on the stream (default: the framework's current stream of the schedule's device).")
      .def("dense", &DecodeStep::dense, nb::arg("q").none(), nb::arg("k_cache").none(), nb::arg("block_table").none(),
           nb::arg("cache_seqlens").none(), nb::arg("head_dim_v").none(), nb::arg("softmax_scale").none(),
           nb::arg("causal").none(), nb::arg("out").none(), nb::arg("lse").none(),
           nb::arg("stream").none() = nb::none(), "Dense decode with the planned schedule -> (out, lse), or None when the call is not the planned one.")
      .def("sparse", &DecodeStep::sparse, nb::arg("q").none(), nb::arg("k_cache").none(), nb::arg("indices").none(),
           nb::arg("head_dim_v").none(), nb::arg("softmax_scale").none(), nb::arg("attn_sink").none(),
           nb::arg("extra_k_cache").none(), nb::arg("extra_indices").none(), nb::arg("topk_length").none(),
           nb::arg("extra_topk_length").none(), nb::arg("out").none(), nb::arg("lse").none(),
           nb::arg("stream").none() = nb::none(),
           "Sparse decode with the planned schedule -> (out, lse), or None when the call is not the planned one.")
      .def_prop_ro("last_stream", &DecodeStep::last_stream, "cudaStream_t (int) of the last plan or call.");

  static PyType_Slot pool_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(&SplitScratchPool::traverse)},
                                     {Py_tp_clear, reinterpret_cast<void*>(&SplitScratchPool::clear)},
                                     {0, nullptr}};
  nb::class_<SplitScratchPool>(m, "SplitScratchPool",
                               "Split-KV scratch of tensor-style decode calls, one set per (device, stream).",
                               nb::type_slots(pool_slots))
      .def(nb::init<nb::object>(), nb::arg("allocate"))
      .def("__len__", &SplitScratchPool::size);

  m.def("plan_metadata", &plan_metadata, nb::arg("like").none(), nb::arg("cache_seqlens").none(),
        nb::arg("topk_length").none(), nb::arg("extra_topk_length").none(), nb::kw_only(), nb::arg("batch"),
        nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("sparse"), nb::arg("topk"), nb::arg("extra_topk"),
        nb::arg("stream").none() = nb::none(),
        "Tensor-style schedule: new (tile_scheduler_metadata, num_splits) planned on the GPU on like's device, or "
        "None when `like` is not a CUDA tensor of a framework with the DLPack exchange API.");
  m.def("device_sm_count", &device_sm_count, nb::arg("device_id"), "SM count of a CUDA device (queried once).");
  m.def("decode_with_metadata", &decode_with_metadata, nb::arg("pool"), nb::arg("q").none(), nb::arg("k_cache").none(),
        nb::arg("block_table").none(), nb::arg("cache_seqlens").none(), nb::arg("head_dim_v").none(),
        nb::arg("tile_scheduler_metadata").none(), nb::arg("num_splits").none(), nb::arg("softmax_scale").none(),
        nb::arg("causal").none(), nb::arg("indices").none(), nb::arg("attn_sink").none(), nb::arg("extra_k_cache").none(),
        nb::arg("extra_indices").none(), nb::arg("topk_length").none(), nb::arg("extra_topk_length").none(),
        nb::arg("out").none(), nb::arg("lse").none(), nb::arg("stream").none() = nb::none(),
        "Decode with tensor-style metadata -> (out, lse), or None when the general path must handle the call.");
  m.def("read_tensor", &read_tensor, nb::arg("tensor"),
        "(data_ptr, shape, strides, dtype, device type, device id, via exchange API) as the decode entries read it.");
}

}  // namespace openmla::py
