"""MLA decode with DeepSeek ``flash_mla``'s Python interface: dense mode over a paged BF16/FP16 cache, and
sparse top-k mode over an FP8 cache (DeepSeek-V3.2 / MODEL1 sparse attention, selected by ``indices``).

Drop-in usage (one schedule object per decoding step, shared by every layer of that step)::

    import openmla as flash_mla

    sched_meta, _ = flash_mla.get_mla_metadata()
    for layer in layers:
        out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache[layer], block_table, cache_seqlens, 512,
                                                    sched_meta, causal=True)
        # sparse: flash_mla.flash_mla_with_kvcache(q, fp8_cache[layer], None, None, 512, sched_meta,
        #                                          is_fp8_kvcache=True, indices=indices[layer], ...)

The first call that receives ``sched_meta`` allocates the schedule and the split-KV scratch buffers on
q's device and computes the schedule on the GPU from ``cache_seqlens`` (dense) or ``topk_length`` /
``extra_topk_length`` (sparse), with no host synchronisation; later calls reuse them. Everything here is
CUDA-graph capturable: capture ``get_mla_metadata()`` and the calls of one step together and the schedule
is recomputed from the (updated in place) lengths on every replay. See docs/python-api.md.

Argument checks (dtypes, shapes, strides, devices) live in the C++ API; its messages reach the caller
unchanged as ValueError (bad argument), NotImplementedError (not supported) or RuntimeError (CUDA).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from . import _openmla as _C
from ._runtime import as_byte_view, is_torch_tensor, require_torch, stream_of

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache"]

# FP8 cache layouts of sparse mode, told apart by the cache's last dimension (bytes per token):
# bytes per token -> (problem.cache_format, d_qk, name for messages).
_FP8_LAYOUTS = {656: ("fp8_v32", 576, "V3.2"), 584: ("fp8_model1", 512, "MODEL1")}
# Arguments that only sparse mode (indices given) takes.
_SPARSE_ONLY = ("attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length")


@dataclasses.dataclass(frozen=True)
class _Config:
    """The shapes and flags a schedule was planned for (flash_mla's ``FlashMLASchedMeta.Config`` fields,
    then the ones OpenMLA also checks)."""

    b: int
    s_q: int
    h_q: int
    page_block_size: int
    h_k: int
    causal: bool
    is_fp8_kvcache: bool
    topk: Optional[int]
    extra_page_block_size: Optional[int]
    extra_topk: Optional[int]
    # OpenMLA: the split buffers are sized by d_v and live on one device.
    d_qk: int
    d_v: int
    device: Any
    # OpenMLA, sparse mode: the schedule depends on whether per-request lengths were given (their values are
    # not checked: that would need a host synchronisation).
    topk_length_given: bool = False
    extra_topk_length_given: bool = False


class FlashMLASchedMeta:
    """Decode schedule of one decoding step, filled on first use by :func:`flash_mla_with_kvcache`.

    Fields (flash_mla-compatible):
      have_initialized (bool): False until the first call planned the schedule.
      config: the shapes and flags of that call (b, s_q, h_q, page_block_size, h_k, causal,
        is_fp8_kvcache, topk, extra_page_block_size, extra_topk; topk and the extra fields are None in dense
        mode and when no extra cache is given; OpenMLA adds d_qk, d_v, device, topk_length_given,
        extra_topk_length_given).
      tile_scheduler_metadata: (num_sm_parts, 8) int32 CUDA tensor, one work record per SM partition.
      num_splits: (b + 1,) int32 CUDA tensor, exclusive prefix sum of the per-request split counts.
    OpenMLA additions: partial_o (partial_rows, d_v) float32 and partial_lse (partial_rows,) float32, the
    split-KV scratch of this step; merge_counters (merge_counter_ints,) int32, zeroed by the plan, with which
    dense decode merges requests split in two chunks inside its main kernel; workspace_sizes, the dict from
    ``get_decode_workspace_sizes``.

    Reuse the object only across calls with the same shapes, flags and length values (``cache_seqlens`` in
    dense mode, ``topk_length`` / ``extra_topk_length`` in sparse mode; every layer of one step). A call whose
    shapes or flags differ raises ValueError naming the field; the length values are not checked (that would
    need a host synchronisation).
    """

    Config = _Config

    def __init__(self):
        self.have_initialized: bool = False
        self.config: Optional[_Config] = None
        self.tile_scheduler_metadata = None
        self.num_splits = None
        self.partial_o = None
        self.partial_lse = None
        self.merge_counters = None
        self.workspace_sizes: Optional[dict] = None

    def __repr__(self) -> str:
        if not self.have_initialized:
            return "FlashMLASchedMeta(have_initialized=False)"
        return f"FlashMLASchedMeta(have_initialized=True, config={self.config})"


def get_mla_metadata(*args, **kwargs):
    """Returns ``(FlashMLASchedMeta(), None)``: an empty schedule for one decoding step.

    Every argument is accepted and ignored (flash_mla kept the old positional signature
    ``(cache_seqlens, s_q * h_q // h_kv, h_kv, h_q, is_fp8, topk)`` for compatibility; the schedule is now
    computed inside the first :func:`flash_mla_with_kvcache` call). Allocates nothing and launches nothing,
    so it may be called inside CUDA-graph capture.
    """
    del args, kwargs
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, *, out=None, lse=None):
    """MLA decode attention over a paged KV cache (flash_mla-compatible): dense, or sparse when ``indices`` is given.

    Dense mode (``indices`` None):
      q: (b, s_q, h_q, d_qk) bfloat16 or float16 CUDA tensor, d_qk = 576. Last dim contiguous; other
        strides free (multiples of 8 elements).
      k_cache: (num_blocks, page_block_size, h_kv, d_qk), q's dtype, same device; page_block_size = 64;
        h_q % h_kv == 0. V is the first head_dim_v dims of K (MLA's shared latent). Last dim contiguous.
      block_table: (b, max_blocks_per_seq) int32; entry [i, j] is the page holding tokens
        [64 j, 64 j + 64) of request i. Entries past ceil(cache_seqlens[i] / 64) are never read.
      cache_seqlens: (b,) int32, contiguous; 0 allowed (out = 0, lse = +inf for that request).
      causal: bottom-right aligned mask (query i of s_q sees keys j <= L - s_q + i); ignored when s_q = 1.
      is_fp8_kvcache must be False and the sparse-mode arguments None.

    Sparse mode (``indices`` given; DeepSeek-V3.2 sparse attention over an FP8 cache):
      q: (b, s_q, h_q, d_qk) bfloat16 CUDA tensor; any h_q >= 1 (64 and 128 are the fast paths), any s_q >= 1.
      k_cache: (num_blocks, page_block_size, 1, bytes_per_token) FP8 cache (float8_e4m3fn, int8 or uint8; a
        byte buffer as written by :func:`openmla.quantize_kv_cache`). The layout follows the last dimension:
        656 -> V3.2 (d_qk 576), 584 -> MODEL1 (d_qk 512, block-structured pages). Any page size; stride(1)
        must equal bytes_per_token, stride(0) (page stride) is free (a multiple of 16 bytes).
      block_table, cache_seqlens: ignored (may be None): the pages are folded into the indices.
      is_fp8_kvcache: must be True. causal: must be False.
      indices: (b, s_q, topk) int32, last dim contiguous, any topk >= 1: index = page * page_block_size +
        offset_in_page. -1, and any value outside [0, num_blocks * page_block_size), is skipped (never read).
      topk_length: optional (b,) int32, per REQUEST: only slots [0, topk_length[i]) of request i are used (the
        others are never read and may hold garbage).
      attn_sink: optional (h_q,) float32 (natural-log units, +-inf allowed): out is multiplied by
        1 / (1 + exp(attn_sink[h] - lse)); lse is not changed. +inf gives out = 0, -inf has no effect.
      extra_k_cache: optional second FP8 cache (same layout, its own page size) whose selection
        extra_indices_in_kvcache (b, s_q, extra_topk) int32 is attended together with the main one under one
        softmax; extra_topk_length: optional (b,) int32, as topk_length for the extra indices.

    Both modes:
      head_dim_v: 512.
      tile_scheduler_metadata: the FlashMLASchedMeta from :func:`get_mla_metadata`, planned on first use.
      num_splits: must be None (kept for flash_mla's positional order).
      softmax_scale: scale of q.k; None means q.shape[-1] ** -0.5.
      out: optional (b, s_q, h_q, head_dim_v) tensor of q's dtype to write into (last dim contiguous).
      lse: optional (b, h_q, s_q) float32 tensor to write into (any strides).

    Returns:
      (out, lse): out (b, s_q, h_q, head_dim_v) in q's dtype; lse (b, h_q, s_q) float32, the natural log
      of the sum of exp(softmax_scale * q.k) over the visible (dense) or selected valid (sparse) keys, +inf
      for a row with no such key, whose out is 0 (whatever the sink). A freshly allocated lse is a transposed
      view of (b, s_q, h_q) storage (do not assume contiguity). When ``out`` / ``lse`` are given, those same
      tensors are returned.

    Raises:
      ValueError: a bad argument (the message names it), or a reused schedule whose recorded shapes or
        flags differ from this call's (the message names the field).
      NotImplementedError: an unsupported combination (e.g. an FP8 cache in dense mode).
      RuntimeError: a CUDA error.
    """
    sched = tile_scheduler_metadata
    if not isinstance(sched, FlashMLASchedMeta):
        raise TypeError("argument 'tile_scheduler_metadata' must be the FlashMLASchedMeta returned by "
                        f"openmla.get_mla_metadata(), got {type(sched).__name__}")
    if num_splits is not None:
        raise ValueError("argument 'num_splits' must be None: the split counts are kept in the FlashMLASchedMeta "
                         "passed as tile_scheduler_metadata (get_mla_metadata() returns None for num_splits)")
    if indices is not None:
        return _sparse_decode(q, k_cache, head_dim_v, sched, softmax_scale, causal, is_fp8_kvcache, indices,
                              attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length,
                              out, lse)
    sparse_args = dict(attn_sink=attn_sink, extra_k_cache=extra_k_cache,
                       extra_indices_in_kvcache=extra_indices_in_kvcache, topk_length=topk_length,
                       extra_topk_length=extra_topk_length)
    for name in _SPARSE_ONLY:
        if sparse_args[name] is not None:
            raise ValueError(f"argument '{name}' is a sparse-decode argument but 'indices' is None: pass indices "
                             "(with is_fp8_kvcache=True) for sparse decode; dense decode takes no " + name)
    if is_fp8_kvcache:
        raise NotImplementedError("is_fp8_kvcache=True without 'indices': dense decode over an FP8 cache is not "
                                  "supported (as in flash_mla, FP8 caches are read by sparse decode only: pass "
                                  "indices)")

    torch = require_torch("flash_mla_with_kvcache")
    # Only what allocating the outputs and the workspace needs is checked here; the C++ API checks the rest.
    _require_cuda_tensor(q, "q", "(b, s_q, h_q, d_qk)")
    _require_cuda_tensor(k_cache, "k_cache", "(num_blocks, page_block_size, h_kv, d_qk)")
    b, s_q, h_q, d_qk = (int(x) for x in q.shape)
    d_v = int(head_dim_v)
    config = _Config(b=b, s_q=s_q, h_q=h_q, page_block_size=int(k_cache.shape[1]), h_k=int(k_cache.shape[2]),
                     causal=bool(causal), is_fp8_kvcache=False, topk=None, extra_page_block_size=None,
                     extra_topk=None, d_qk=d_qk, d_v=d_v, device=q.device)
    problem = dict(batch=b, s_q=s_q, h_q=h_q, h_kv=config.h_k, d_qk=d_qk, d_v=d_v,
                   page_block_size=config.page_block_size,
                   cache_format="fp16" if q.dtype == torch.float16 else "bf16", causal=config.causal,
                   num_sms=torch.cuda.get_device_properties(q.device).multi_processor_count)
    scale = float(q.shape[-1]) ** -0.5 if softmax_scale is None else float(softmax_scale)

    def plan(metadata, splits, counters, stream):
        _C.plan_decode(_dl(cache_seqlens), _dl(metadata), _dl(splits), merge_counters=_dl(counters), stream=stream,
                       **problem)

    def launch(out, lse, stream):
        _C.dense_decode(_dl(q), _dl(k_cache), _dl(block_table), _dl(cache_seqlens),
                        _dl(sched.tile_scheduler_metadata), _dl(sched.num_splits), _dl(sched.partial_o),
                        _dl(sched.partial_lse), _dl(out), _dl(lse), merge_counters=_dl(sched.merge_counters),
                        softmax_scale=scale, stream=stream, **problem)

    return _run(torch, sched, config, problem, q, plan, launch, out, lse)


def _sparse_decode(q, k_cache, head_dim_v, sched, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                   extra_k_cache, extra_indices, topk_length, extra_topk_length, out, lse):
    """Sparse mode of :func:`flash_mla_with_kvcache` (indices given)."""
    # Checks that need no tensor: the mode's flags and which optional arguments go together.
    if not is_fp8_kvcache:
        raise ValueError("argument 'is_fp8_kvcache' is False but 'indices' was given: sparse decode reads an FP8 "
                         "cache only; pass is_fp8_kvcache=True (and an FP8 k_cache)")
    if causal:
        raise ValueError("argument 'causal' must be False in sparse decode (indices given): the selection is "
                         "given by the indices")
    if extra_k_cache is None:
        for name, value in (("extra_indices_in_kvcache", extra_indices), ("extra_topk_length", extra_topk_length)):
            if value is not None:
                raise ValueError(f"argument '{name}' was given without 'extra_k_cache'")
    elif extra_indices is None:
        raise ValueError("argument 'extra_indices_in_kvcache' is required when 'extra_k_cache' is given")
    # The FP8 layout follows the caches' last dimension (a shape check only).
    cache_format, layout_d_qk, layout_name = _fp8_layout(k_cache, "k_cache")
    if extra_k_cache is not None:
        extra_format = _fp8_layout(extra_k_cache, "extra_k_cache")[0]
        if extra_format != cache_format:
            raise ValueError(f"argument 'extra_k_cache' has {int(extra_k_cache.shape[-1])} bytes per token but "
                             f"'k_cache' has {int(k_cache.shape[-1])}: both caches must have the same FP8 layout")

    torch = require_torch("flash_mla_with_kvcache")
    _require_cuda_tensor(q, "q", "(b, s_q, h_q, d_qk)")
    _require_cuda_tensor(k_cache, "k_cache", "(num_blocks, page_block_size, 1, bytes_per_token)")
    _require_cuda_tensor(indices, "indices", "(b, s_q, topk)", ndim=3)
    if extra_k_cache is not None:
        _require_cuda_tensor(extra_k_cache, "extra_k_cache", "(num_blocks, page_block_size, 1, bytes_per_token)")
        _require_cuda_tensor(extra_indices, "extra_indices_in_kvcache", "(b, s_q, extra_topk)", ndim=3)
    b, s_q, h_q, d_qk = (int(x) for x in q.shape)
    if d_qk != layout_d_qk:
        raise ValueError(f"argument 'q' has d_qk = {d_qk} but 'k_cache' ({int(k_cache.shape[-1])} bytes per token) "
                         f"is the {layout_name} FP8 layout, whose d_qk is {layout_d_qk}")
    d_v = int(head_dim_v)
    topk = int(indices.shape[-1])
    extra_topk = int(extra_indices.shape[-1]) if extra_k_cache is not None else None
    extra_page = int(extra_k_cache.shape[1]) if extra_k_cache is not None else None
    config = _Config(b=b, s_q=s_q, h_q=h_q, page_block_size=int(k_cache.shape[1]), h_k=int(k_cache.shape[2]),
                     causal=False, is_fp8_kvcache=True, topk=topk, extra_page_block_size=extra_page,
                     extra_topk=extra_topk, d_qk=d_qk, d_v=d_v, device=q.device,
                     topk_length_given=topk_length is not None, extra_topk_length_given=extra_topk_length is not None)
    problem = dict(batch=b, s_q=s_q, h_q=h_q, h_kv=config.h_k, d_qk=d_qk, d_v=d_v,
                   page_block_size=config.page_block_size, cache_format=cache_format, causal=False, sparse=True,
                   topk=topk, extra_topk=extra_topk or 0, extra_page_block_size=extra_page or 0,
                   num_sms=torch.cuda.get_device_properties(q.device).multi_processor_count)
    scale = float(q.shape[-1]) ** -0.5 if softmax_scale is None else float(softmax_scale)
    # The C++ API reads FP8 caches as bytes; a uint8 view also spares DLPack the float8 dtype.
    cache_bytes = as_byte_view(k_cache)
    extra_bytes = None if extra_k_cache is None else as_byte_view(extra_k_cache)

    def plan(metadata, splits, counters, stream):
        # cache_seqlens plays no part in sparse decode: the schedule follows topk / topk_length. The sparse main
        # kernel does not merge in-kernel (the combine kernel merges its split requests); the counters are only
        # zeroed.
        _C.plan_decode(None, _dl(metadata), _dl(splits), topk_length=_opt(topk_length), merge_counters=_dl(counters),
                       extra_topk_length=_opt(extra_topk_length), stream=stream, **problem)

    def launch(out, lse, stream):
        _C.sparse_decode(_dl(q), _dl(cache_bytes), _dl(indices), _dl(sched.tile_scheduler_metadata),
                         _dl(sched.num_splits), _dl(sched.partial_o), _dl(sched.partial_lse), _dl(out), _dl(lse),
                         topk_length=_opt(topk_length), attn_sink=_opt(attn_sink), extra_k_cache=_opt(extra_bytes),
                         extra_indices=_opt(extra_indices), extra_topk_length=_opt(extra_topk_length),
                         softmax_scale=scale, stream=stream, **problem)

    return _run(torch, sched, config, problem, q, plan, launch, out, lse)


def _run(torch, sched: FlashMLASchedMeta, config: _Config, problem: dict, q, plan, launch, out, lse):
    """Plans on first use (or checks the recorded config), allocates missing outputs, launches on q's stream."""
    b, s_q, h_q, d_v = config.b, config.s_q, config.h_q, config.d_v
    with torch.cuda.device(q.device):
        stream = stream_of(q)
        planned_now = not sched.have_initialized
        if planned_now:
            _plan(torch, sched, config, problem, plan, stream)
        else:
            _check_same_config(sched.config, config)
        if out is None:
            out = torch.empty((b, s_q, h_q, d_v), dtype=q.dtype, device=q.device)
        if lse is None:
            # Stored position-major like the kernel's rows, returned in flash_mla's logical order.
            lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
        try:
            launch(out, lse, stream)
        except Exception:
            # The arguments were rejected (nothing ran): do not pin this call's shapes on the schedule.
            if planned_now:
                sched.__init__()
            raise
    return out, lse


def _dl(t):
    """What the binding receives for a tensor: the tensor itself.

    nanobind imports it through Tensor.__dlpack__(max_version=...) without a stream argument, so torch
    inserts no cross-stream synchronisation (CUDA-graph capture is unaffected) and nanobind owns the capsule
    for the duration of the call. Handing it raw capsules from torch.utils.dlpack.to_dlpack instead crashed
    the interpreter when the C++ API rejected a call (seen on the GPU machine with Python 3.12), so the
    per-tensor export cost (a few microseconds, invisible under CUDA graphs) is accepted.
    """
    return t


def _opt(t):
    return None if t is None else _dl(t)


def _require_cuda_tensor(t, name: str, shape: str, ndim: int = 4) -> None:
    if not is_torch_tensor(t):
        raise TypeError(f"argument '{name}' must be a torch.Tensor {shape}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"argument '{name}' must have {ndim} dimensions {shape}, got shape {tuple(t.shape)}")
    if not t.is_cuda:
        raise ValueError(f"argument '{name}' must be a CUDA tensor, got a tensor on {t.device}")


def _fp8_layout(cache, name: str):
    """(cache_format, d_qk, layout name) of an FP8 cache, from its last dimension (bytes per token)."""
    shape = getattr(cache, "shape", None)
    if shape is None:
        raise TypeError(f"argument '{name}' must be a torch.Tensor (num_blocks, page_block_size, 1, bytes_per_token), "
                        f"got {type(cache).__name__}")
    if len(shape) != 4:
        raise ValueError(f"argument '{name}' must have 4 dimensions (num_blocks, page_block_size, 1, bytes_per_token),"
                         f" got shape {tuple(int(x) for x in shape)}")
    bytes_per_token = int(shape[-1])
    if bytes_per_token not in _FP8_LAYOUTS:
        raise ValueError(f"argument '{name}' has last dimension {bytes_per_token}; sparse decode needs an FP8 cache "
                         "with 656 bytes per token (V3.2 layout, d_qk 576) or 584 (MODEL1 layout, d_qk 512)")
    return _FP8_LAYOUTS[bytes_per_token]


def _plan(torch, sched: FlashMLASchedMeta, config: _Config, problem: dict, plan, stream: int) -> None:
    """First use: size (this also validates the problem), allocate on q's device, plan on `stream`."""
    sizes = _C.get_decode_workspace_sizes(**problem)
    dev = config.device
    metadata = torch.empty((sizes["num_sm_parts"], _C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32, device=dev)
    splits = torch.empty((sizes["num_splits_ints"],), dtype=torch.int32, device=dev)
    partial_o = torch.empty((sizes["partial_rows"], config.d_v), dtype=torch.float32, device=dev)
    partial_lse = torch.empty((sizes["partial_rows"],), dtype=torch.float32, device=dev)
    # Zeroed by every plan; dense decode's in-kernel merge of two-chunk split requests counts with them.
    counters = torch.empty((max(int(sizes["merge_counter_ints"]), 1),), dtype=torch.int32, device=dev)
    plan(metadata, splits, counters, stream)
    # Recorded only once planning succeeded, so a failed first call leaves the object reusable.
    sched.tile_scheduler_metadata = metadata
    sched.num_splits = splits
    sched.partial_o = partial_o
    sched.partial_lse = partial_lse
    sched.merge_counters = counters
    sched.workspace_sizes = sizes
    sched.config = config
    sched.have_initialized = True


def _check_same_config(planned: _Config, current: _Config) -> None:
    for field in dataclasses.fields(_Config):
        was, now = getattr(planned, field.name), getattr(current, field.name)
        if was != now:
            raise ValueError(
                f"tile_scheduler_metadata was planned for {field.name}={was!r} but this call has "
                f"{field.name}={now!r}: a FlashMLASchedMeta can only be reused by calls with the same shapes and "
                "flags (one object per decoding step, shared by its layers); get a new one from get_mla_metadata()")
