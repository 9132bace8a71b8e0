"""MLA decode with DeepSeek ``flash_mla``'s Python interface: dense mode over a paged BF16/FP16 cache, and
sparse top-k mode over an FP8 cache (DeepSeek-V3.2 / MODEL1 sparse attention, selected by ``indices``).

Two ways to hold the schedule, as in flash_mla's two API generations (docs/python-api.md):

* Object style (flash_mla today, vLLM): one ``FlashMLASchedMeta`` per decoding step, shared by every layer::

      import openmla as flash_mla

      sched_meta, _ = flash_mla.get_mla_metadata()
      for layer in layers:
          out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache[layer], block_table, cache_seqlens, 512,
                                                      sched_meta, causal=True)

  The first call that receives ``sched_meta`` allocates the schedule and the split-KV scratch on q's device and
  computes the schedule on the GPU from ``cache_seqlens`` (dense) or ``topk_length`` / ``extra_topk_length``
  (sparse), with no host synchronisation; later calls reuse them.

* Tensor style (flash_mla's older API, SGLang): the schedule as two int32 tensors, planned on the GPU when
  ``get_mla_metadata`` is called with arguments::

      tile_md, num_splits = flash_mla.get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
      out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, tile_md, num_splits,
                                                  causal=True)

  The split-KV scratch of tensor-style calls comes from a pool kept per (device, stream).

Everything here is CUDA-graph capturable, and under ``torch.compile`` both styles become the torch custom ops
``torch.ops.openmla.*`` (python/openmla/_torch_ops.py).

One path per style: each style has one entry in the binding (python/csrc/bind_decode_step.cpp) that every call of
that style goes through, ``DecodeStep.decode`` (the object style; a FlashMLASchedMeta holds its DecodeStep once the
first call planned it) and ``TensorStyleDecode.decode`` (the tensor style, and the torch op). With torch >= 2.10 (the
DLPack C exchange API) the function calls the entry at once, and the entry reads the tensors and the current stream
and allocates missing outputs without a Python call into torch; the first call of an object plans it first, and
where torch has no exchange API the outputs and the stream come from torch first. An entry serves the call or
raises: the checks the flash_mla layer makes before the C++ API's (``_check_call``: the mode arguments, torch CUDA
tensors, a reused schedule's shapes) are tested by the entry too, and a call that fails one raises the error of
those checks. Argument checks of dtypes, shapes, strides and devices live in the C++ API and run on every call;
their messages reach the caller unchanged as ValueError (bad argument), NotImplementedError (not supported) or
RuntimeError (CUDA).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Optional

from . import _openmla as _C
from . import decode_fp8 as _fp8
from ._runtime import as_byte_view, is_torch_tensor, require_torch, torch_tensors_read_in_place

try:  # torch is optional: importing OpenMLA needs neither torch nor a GPU
    import torch as _torch
except Exception:  # pragma: no cover - depends on the machine
    _torch = None

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache"]

# FP8 cache layouts of sparse mode, told apart by the cache's last dimension (bytes per token):
# bytes per token -> (problem.cache_format, d_qk, name for messages). The sizes are the C++ definition's
# (src/common/fp8_cache_layout.h, through the binding).
_FP8_LAYOUTS = {_C.fp8_cache_layouts[f]["bytes_per_token"]: ("fp8_" + f, _C.fp8_cache_layouts[f]["head_dim"], name)
                for f, name in (("v32", "V3.2"), ("model1", "MODEL1"))}
# Arguments that only sparse mode (indices given) takes.
_SPARSE_ONLY = ("attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length")


if _torch is not None:
    _IN_PLACE = torch_tensors_read_in_place()
    _is_compiling = getattr(getattr(_torch, "compiler", None), "is_compiling", None) or (lambda: False)
    # The few torch calls of the Python side (first use, no exchange API), without the cost of active torch-function
    # modes (set_default_device installs one: every tensor attribute then goes through Python).
    _plain_torch = getattr(_torch._C, "DisableTorchFunction", contextlib.nullcontext)
else:  # pragma: no cover - depends on the machine
    _IN_PLACE = False
    _is_compiling = lambda: False  # noqa: E731
    _plain_torch = contextlib.nullcontext

# First-use planning of any FlashMLASchedMeta: the object is planned once even when threads share it.
_PLAN_LOCK = threading.Lock()


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
    """Decode schedule of one decoding step (the object style), filled on first use by
    :func:`flash_mla_with_kvcache`.

    Fields (flash_mla-compatible):
      have_initialized (bool): False until the first call planned the schedule.
      config: the shapes and flags of that call (b, s_q, h_q, page_block_size, h_k, causal,
        is_fp8_kvcache, topk, extra_page_block_size, extra_topk; topk and the extra fields are None in dense
        mode and when no extra cache is given; OpenMLA adds d_qk, d_v, device, topk_length_given,
        extra_topk_length_given).
      tile_scheduler_metadata: (num_sm_parts, 8) int32 CUDA tensor, one work record per SM partition.
      num_splits: (b + 1,) int32 CUDA tensor, exclusive prefix sum of the per-request split counts.
    OpenMLA additions: batch_invariant (bool, from get_mla_metadata: a request's results do not depend on the rest
    of the batch; docs/decode-schedule.md, "Batch invariance"); partial_o (partial_rows, d_v) float32 and
    partial_lse (partial_rows,) float32, the
    split-KV scratch of this step; merge_counters (merge_counter_ints,) int32, zeroed by the plan, with which
    dense decode merges requests split in two chunks inside its main kernel; workspace_sizes, the dict from
    ``get_decode_workspace_sizes``.

    Reuse the object only across calls with the same shapes, flags and length values (``cache_seqlens`` in
    dense mode, ``topk_length`` / ``extra_topk_length`` in sparse mode; every layer of one step). A call whose
    shapes or flags differ raises ValueError naming the field; the length values are not checked (that would
    need a host synchronisation).

    Threads: the first use plans under a lock, so an object shared by threads is planned once. Calls that share
    the object share its schedule and split-KV scratch: a call on another CUDA stream than the previous one
    first waits (on the GPU) for the work already enqueued with the object, so sharing across streams is correct
    but serialised. For concurrent streams, use one object per stream.
    """

    Config = _Config
    # The binding's DecodeStep once planned (the object style's entry: every call of the step), and the
    # (metadata, num_splits) tensors of a plan traced by torch.compile.
    _step = None
    _traced = None
    # The planned state of a step whose calls pass seqused_q (decode_varlen.py); None otherwise.
    _varlen = None

    def __init__(self, batch_invariant: bool = False):
        #: OpenMLA: plan the batch-invariant schedule (get_mla_metadata(batch_invariant=True); docs/decode-schedule.md).
        self.batch_invariant: bool = bool(batch_invariant)
        self.have_initialized: bool = False
        self.config: Optional[_Config] = None
        self.tile_scheduler_metadata = None
        self.num_splits = None
        self.partial_o = None
        self.partial_lse = None
        self.merge_counters = None
        self.workspace_sizes: Optional[dict] = None

    def __repr__(self) -> str:
        mode = ", batch_invariant=True" if self.batch_invariant else ""
        if not self.have_initialized:
            return f"FlashMLASchedMeta(have_initialized=False{mode})"
        return f"FlashMLASchedMeta(have_initialized=True{mode}, config={self.config})"


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=None, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None, batch_invariant=False):
    """The schedule of one decoding step, in either of flash_mla's two styles.

    Without ``cache_seqlens`` (object style, flash_mla today): returns ``(FlashMLASchedMeta(), None)``, an
    empty schedule that the first :func:`flash_mla_with_kvcache` call receiving it plans. The other arguments
    are ignored. Allocates nothing and launches nothing, so it may be called inside CUDA-graph capture.

    With ``cache_seqlens`` (tensor style, flash_mla's older API, SGLang): returns
    ``(tile_scheduler_metadata, num_splits)``, new int32 tensors on cache_seqlens' device, computed on the GPU
    on the current stream (no host synchronisation):

      cache_seqlens: (b,) int32 CUDA tensor, the cached lengths (dense); in sparse mode only its length b is used.
      num_q_tokens_per_head_k: s_q * h_q // h_kv, query rows per KV head.
      num_heads_k: h_kv.
      num_heads_q: h_q (needed in sparse mode; in dense mode it only splits the rows into s_q and h_q).
      is_fp8_kvcache, topk: sparse mode (both given): the schedule of sparse decode over topk slots per query.

    Returns (num_sm_parts, 8) and (b + 1,) int32 tensors, to pass to :func:`flash_mla_with_kvcache` as
    ``tile_scheduler_metadata`` and ``num_splits``. Their shapes depend on the head geometry and b only, so they
    can be copied into static buffers of a captured CUDA graph (SGLang's pattern).

    ``batch_invariant`` (OpenMLA, both styles): plan the batch-invariant schedule, with which a request's ``out`` and
    ``lse`` bits do not depend on the other requests of the batch (vLLM's batch-invariant mode; each request is split
    into chunks of 4096 tokens or top-k slots fixed by its own length: docs/decode-schedule.md, "Batch invariance").
    The object keeps the mode; tensor-style metadata needs ``batch_invariant=True`` on the decode calls too.
    """
    if cache_seqlens is None:
        return FlashMLASchedMeta(batch_invariant), None
    b, s_q, h_q, h_kv, sparse, topk = _metadata_problem(cache_seqlens, num_q_tokens_per_head_k, num_heads_k,
                                                        num_heads_q, is_fp8_kvcache, topk)
    if _is_compiling():
        return _torch.ops.openmla.get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                                                   bool(is_fp8_kvcache), topk, bool(batch_invariant))
    return _plan_metadata(cache_seqlens, cache_seqlens, None, None, b, s_q, h_q, h_kv, sparse, topk or 0, 0,
                          bool(batch_invariant))


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, *, batch_invariant=False, seqused_q=None, out=None, lse=None,
                           descale_q=None, descale_k=None):
    """MLA decode attention over a paged KV cache (flash_mla-compatible): dense, or sparse when ``indices`` is given.

    Dense mode (``indices`` None):
      q: (b, s_q, h_q, d_qk) bfloat16 or float16 CUDA tensor, d_qk = 576. Last dim contiguous; other
        strides free (multiples of 8 elements).
      k_cache: (num_blocks, page_block_size, h_kv, d_qk), q's dtype, same device; page_block_size 1, 2, 4, 8, 16,
        32, 64, 128 or 256 (DENSE_PAGE_SIZES; the page size is k_cache.shape[1], as in flash_mla; at page 1 the block
        table is the per-token slot list);
        h_q % h_kv == 0. V is the first head_dim_v dims of K (MLA's shared latent). Last dim contiguous.
      block_table: (b, max_blocks_per_seq) int32; entry [i, j] is the page holding tokens
        [P j, P j + P) of request i (P = page_block_size). Entries past ceil(cache_seqlens[i] / P) are never read.
      cache_seqlens: (b,) int32, contiguous; 0 allowed (out = 0, lse = +inf for that request).
      causal: bottom-right aligned mask (query i of s_q sees keys j <= L - s_q + i); ignored when s_q = 1.
      the sparse-mode arguments None; is_fp8_kvcache True (or a float8_e4m3fn k_cache): the FP8 cache below.

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
      tile_scheduler_metadata, num_splits: the schedule, in either style of :func:`get_mla_metadata`: a
        FlashMLASchedMeta (planned on first use) with num_splits None, or the two tensors of
        get_mla_metadata(cache_seqlens, ...).
      softmax_scale: scale of q.k; None means q.shape[-1] ** -0.5.
      out: optional (b, s_q, h_q, head_dim_v) tensor of q's dtype to write into (last dim contiguous).
      lse: optional (b, h_q, s_q) float32 tensor to write into (any strides).
      descale_q, descale_k: keyword-only, dense mode over an FP8 e4m3 cache (k_cache float8_e4m3fn (num_blocks,
        page_block_size, 1, 576), any page size; q bf16 or float8_e4m3fn): the per-tensor scales, float32 CUDA tensors
        of one element or floats (None: 1). Output bf16. See openmla.decode_fp8 and docs/integration.md.
      batch_invariant: OpenMLA, keyword-only: tensor-style metadata planned by get_mla_metadata(...,
        batch_invariant=True) (the call's split buffers are sized for it). A FlashMLASchedMeta keeps its own mode:
        True here with an object planned without it raises ValueError.
      seqused_q: OpenMLA, keyword-only: per-request query lengths, a (b,) int32 CUDA tensor (speculative decoding
        with a different number of draft tokens per request). q stays (b, s_q, h_q, d_qk) with s_q the largest
        length; rows past seqused_q[i] get out 0 and lse +inf; causal is bottom-right per request. Object style only,
        not with batch_invariant; graph-capturable, no host synchronisation (openmla/decode_varlen.py).

    Returns:
      (out, lse): out (b, s_q, h_q, head_dim_v) in q's dtype; lse (b, h_q, s_q) float32, the natural log
      of the sum of exp(softmax_scale * q.k) over the visible (dense) or selected valid (sparse) keys, +inf
      for a row with no such key, whose out is 0 (whatever the sink). A freshly allocated lse is a transposed
      view of (b, s_q, h_q) storage (do not assume contiguity). When ``out`` / ``lse`` are given, those same
      tensors are returned and nothing is allocated.

    Raises:
      ValueError: a bad argument (the message names it), or a reused schedule whose recorded shapes or
        flags differ from this call's (the message names the field).
      NotImplementedError: an unsupported combination (e.g. an FP8 cache in dense mode).
      RuntimeError: a CUDA error.
    """
    if seqused_q is not None:  # per-request query lengths (decode_varlen.py)
        if _fp8.wants_fp8_path(k_cache, is_fp8_kvcache, indices, descale_q, descale_k, tile_scheduler_metadata):
            raise ValueError("argument 'seqused_q': per-request query lengths are not served with the dense FP8 cache "
                             "(descale_q / descale_k); use the uniform s_q")
        from .decode_varlen import varlen_call
        return varlen_call(tile_scheduler_metadata, num_splits, q, k_cache, block_table, cache_seqlens, head_dim_v,
                           softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                           extra_indices_in_kvcache, topk_length, extra_topk_length, seqused_q, batch_invariant, out,
                           lse)
    if _fp8.wants_fp8_path(k_cache, is_fp8_kvcache, indices, descale_q, descale_k, tile_scheduler_metadata):
        return _fp8.call(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                         softmax_scale, causal, is_fp8_kvcache, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                         topk_length, extra_topk_length, descale_q, descale_k, batch_invariant, out, lse)
    if _is_compiling():
        return _traced_call(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                            softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                            extra_indices_in_kvcache, topk_length, extra_topk_length, out, lse, batch_invariant)
    if batch_invariant:
        _check_invariant_object(tile_scheduler_metadata, num_splits)
        if num_splits is not None:
            return _tensor_style(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                 num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                                 extra_indices_in_kvcache, topk_length, extra_topk_length, True, out=out, lse=lse)
    if num_splits is None:
        # Object style: the planned step's entry, every layer's call (it raises what is wrong with a call).
        step = getattr(tile_scheduler_metadata, "_step", None)
        if step is not None and _IN_PLACE:
            return step.decode(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                               is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                               topk_length, extra_topk_length, out, lse)
        return _object_style(tile_scheduler_metadata, q, k_cache, block_table, cache_seqlens, head_dim_v,
                             softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                             extra_indices_in_kvcache, topk_length, extra_topk_length, out, lse)
    # Tensor style: its entry (torch without the DLPack exchange API: _tensor_style prepares the call first).
    if _IN_PLACE:
        return _TENSOR_STYLE.decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                    num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                                    extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length, out, lse)
    return _tensor_style(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                         softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                         extra_indices_in_kvcache, topk_length, extra_topk_length, out=out, lse=lse)


# ---------------------------------------------------------------------------------------------------------------
# The checks before the C++ API's: what only this layer knows. The entries test the same conditions and call these
# functions when one fails (python/csrc/bind_decode_step.cpp), so every call raises these errors, whichever way it
# came; the object style's first call and calls without the DLPack exchange API run them first.
# ---------------------------------------------------------------------------------------------------------------
def _check_call(q, k_cache, block_table, cache_seqlens, head_dim_v, causal, is_fp8_kvcache, indices, attn_sink,
                extra_k_cache, extra_indices, topk_length, extra_topk_length):
    """The mode arguments, the torch CUDA tensors the call needs, the FP8 layout: raises what is wrong, else returns
    (cache_format, config) of the call."""
    if indices is not None:
        return _sparse_config(q, k_cache, head_dim_v, causal, is_fp8_kvcache, indices, extra_k_cache, extra_indices,
                              topk_length, extra_topk_length)
    _check_dense_mode(block_table, cache_seqlens, is_fp8_kvcache, attn_sink, extra_k_cache, extra_indices,
                      topk_length, extra_topk_length)
    torch = require_torch("flash_mla_with_kvcache")
    # Only what the schedule and the outputs need is checked here; the C++ API checks the rest.
    _require_cuda_tensor(q, "q", "(b, s_q, h_q, d_qk)")
    _require_cuda_tensor(k_cache, "k_cache", "(num_blocks, page_block_size, h_kv, d_qk)")
    b, s_q, h_q, d_qk = (int(x) for x in q.shape)
    config = _Config(b=b, s_q=s_q, h_q=h_q, page_block_size=int(k_cache.shape[1]), h_k=int(k_cache.shape[2]),
                     causal=bool(causal), is_fp8_kvcache=False, topk=None, extra_page_block_size=None,
                     extra_topk=None, d_qk=d_qk, d_v=int(head_dim_v), device=q.device)
    return ("fp16" if q.dtype == torch.float16 else "bf16"), config


def _check_planned_call(planned: _Config, q, k_cache, block_table, cache_seqlens, head_dim_v, causal, is_fp8_kvcache,
                        indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length):
    """DecodeStep.decode's check function: a call of a planned FlashMLASchedMeta, also against the planned config
    and the schedule's device."""
    with _plain_torch():
        _, config = _check_call(q, k_cache, block_table, cache_seqlens, head_dim_v, causal, is_fp8_kvcache, indices,
                                attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length)
        _check_same_config(planned, config)
        others = (("k_cache", k_cache), ("indices", indices), ("extra_k_cache", extra_k_cache),
                  ("extra_indices_in_kvcache", extra_indices))
        for name, t in others:
            if t is not None and t.device != q.device:
                raise ValueError(f"argument '{name}' is on {t.device} but 'q' and the schedule are on {q.device}: "
                                 "every tensor of a call must be on one device")


def _check_tensor_call(sched, num_splits, q, k_cache, block_table, cache_seqlens, head_dim_v, causal,
                       is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices, topk_length,
                       extra_topk_length):
    """TensorStyleDecode.decode's check function: the schedule's style, then the call; returns (cache_format,
    config)."""
    _schedule_style(sched, num_splits)
    with _plain_torch():
        return _check_call(q, k_cache, block_table, cache_seqlens, head_dim_v, causal, is_fp8_kvcache, indices,
                           attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length)


def _check_plan_like(like) -> None:
    """TensorStyleDecode.plan's check function: the tensor whose device the schedule goes to."""
    require_torch("get_mla_metadata")
    if not is_torch_tensor(like) or not like.is_cuda:
        raise ValueError(f"argument 'cache_seqlens' must be a CUDA tensor, got {type(like).__name__}"
                         + (f" on {like.device}" if is_torch_tensor(like) else ""))


def _sparse_config(q, k_cache, head_dim_v, causal, is_fp8_kvcache, indices, extra_k_cache, extra_indices,
                   topk_length, extra_topk_length):
    """Sparse mode's checks that come before the C++ API, and the config of the call."""
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

    require_torch("flash_mla_with_kvcache")
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
    extra = extra_k_cache is not None
    config = _Config(b=b, s_q=s_q, h_q=h_q, page_block_size=int(k_cache.shape[1]), h_k=int(k_cache.shape[2]),
                     causal=False, is_fp8_kvcache=True, topk=int(indices.shape[-1]),
                     extra_page_block_size=int(extra_k_cache.shape[1]) if extra else None,
                     extra_topk=int(extra_indices.shape[-1]) if extra else None, d_qk=d_qk, d_v=int(head_dim_v),
                     device=q.device, topk_length_given=topk_length is not None,
                     extra_topk_length_given=extra_topk_length is not None)
    return cache_format, config


def _check_dense_mode(block_table, cache_seqlens, is_fp8_kvcache, attn_sink, extra_k_cache, extra_indices,
                      topk_length, extra_topk_length) -> None:
    sparse_args = dict(attn_sink=attn_sink, extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices,
                       topk_length=topk_length, extra_topk_length=extra_topk_length)
    for name in _SPARSE_ONLY:
        if sparse_args[name] is not None:
            raise ValueError(f"argument '{name}' is a sparse-decode argument but 'indices' is None: pass indices "
                             "(with is_fp8_kvcache=True) for sparse decode; dense decode takes no " + name)
    if is_fp8_kvcache:
        raise NotImplementedError("is_fp8_kvcache=True without 'indices': dense decode over an FP8 cache is not "
                                  "supported (as in flash_mla, FP8 caches are read by sparse decode only: pass "
                                  "indices)")
    for name, value, shape in (("block_table", block_table, "(b, max_blocks_per_seq) int32"),
                               ("cache_seqlens", cache_seqlens, "(b,) int32")):
        if value is None:
            raise ValueError(f"argument '{name}' is None, but dense decode (indices=None) needs it: a {shape} CUDA "
                             "tensor (only sparse decode, with indices, takes None here)")


def _schedule_style(sched, num_splits) -> bool:
    """True for the tensor style (metadata and num_splits tensors), False for a FlashMLASchedMeta; else raises."""
    if isinstance(sched, FlashMLASchedMeta):
        if num_splits is not None:
            raise ValueError("argument 'num_splits' must be None with a FlashMLASchedMeta (object style: the split "
                             "counts are kept in the object); pass the tensors of get_mla_metadata(cache_seqlens, ...) "
                             "as tile_scheduler_metadata and num_splits for the tensor style")
        return False
    if is_torch_tensor(sched) or hasattr(sched, "__dlpack__"):
        if num_splits is None:
            raise ValueError("argument 'num_splits' is None but 'tile_scheduler_metadata' is a tensor: the tensor "
                             "style passes both tensors of get_mla_metadata(cache_seqlens, ...); for the object style "
                             "pass the FlashMLASchedMeta of get_mla_metadata() (no arguments) and num_splits=None")
        return True
    raise TypeError("argument 'tile_scheduler_metadata' must be the FlashMLASchedMeta of openmla.get_mla_metadata() "
                    "or the tile_scheduler_metadata tensor of get_mla_metadata(cache_seqlens, ...), got "
                    f"{type(sched).__name__}")


def _check_invariant_object(sched, num_splits) -> None:
    """flash_mla_with_kvcache(..., batch_invariant=True) with an object: the object must have been made so."""
    if num_splits is None and isinstance(sched, FlashMLASchedMeta) and not sched.batch_invariant:
        raise ValueError("argument 'batch_invariant' is True but the FlashMLASchedMeta was made without it: an object "
                         "keeps the mode of get_mla_metadata(batch_invariant=...); get one from "
                         "get_mla_metadata(batch_invariant=True)")


# ---------------------------------------------------------------------------------------------------------------
# Object style: DecodeStep.decode
# ---------------------------------------------------------------------------------------------------------------
def _object_style(sched, q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache,
                  indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length, out, lse):
    """The object style's calls that need Python before the step's entry: the first call of a FlashMLASchedMeta,
    which plans it (under a lock, so threads that share the object plan it once), and every call where torch has no
    DLPack exchange API (outputs and stream from torch). Each then goes through DecodeStep.decode."""
    _schedule_style(sched, None)
    if sched._varlen is not None:
        raise ValueError("argument 'seqused_q' is None but this FlashMLASchedMeta was planned by a call with "
                         "per-request query lengths: every call of its step must pass seqused_q")
    with _plain_torch():
        cache_format, config = _check_call(q, k_cache, block_table, cache_seqlens, head_dim_v, causal, is_fp8_kvcache,
                                           indices, attn_sink, extra_k_cache, extra_indices, topk_length,
                                           extra_topk_length)
        stream = None
        if not _IN_PLACE:
            k_cache, extra_k_cache, out, lse, stream = _from_torch(q, config, k_cache, extra_k_cache, out, lse)
        args = (q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache, indices,
                attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length, out, lse, stream)
        step = sched._step
        if step is None:
            with _PLAN_LOCK:
                step = sched._step
                if step is None:
                    step = _plan_step(sched, config, cache_format, cache_seqlens, topk_length, extra_topk_length,
                                      block_table, stream)
                    try:
                        result = step.decode(*args)
                    except Exception:
                        # The arguments were rejected (nothing ran but the plan): the object stays unused, so it
                        # can be reused with correct arguments.
                        sched.__init__(sched.batch_invariant)
                        raise
                    sched._step = step  # published last: other threads see a planned object or none
                    return result
        return step.decode(*args)


def _plan_step(sched: FlashMLASchedMeta, config: _Config, cache_format: str, cache_seqlens, topk_length,
               extra_topk_length, block_table, stream):
    """First use: size (this also validates the problem), allocate on q's device, plan on the current stream (or
    `stream`), and fill the object's fields. Returns its DecodeStep, the entry of every call of the step.

    Dense: the block table's width goes into the plan (max_blocks_per_seq), so lengths past it are clamped as the
    kernel clamps them and one garbage length costs no more than a valid one; later calls use the same width."""
    torch = _torch
    dev = config.device
    sparse = config.is_fp8_kvcache
    problem = dict(batch=config.b, s_q=config.s_q, h_q=config.h_q, d_qk=config.d_qk, d_v=config.d_v,
                   page_block_size=config.page_block_size, cache_format=cache_format,
                   num_sms=_C.device_sm_count(_device_index(dev)), batch_invariant=sched.batch_invariant)
    if sparse:  # SparseDecodeProblem's own fields
        problem.update(sparse=True, topk=config.topk, extra_topk=config.extra_topk or 0,
                       extra_page_block_size=config.extra_page_block_size or 0)
    else:  # DenseDecodeProblem's
        problem.update(h_kv=config.h_k, causal=config.causal,
                       max_blocks_per_seq=int(block_table.shape[1]) if getattr(block_table, "ndim", 0) == 2 else 0)
    sizes = _C.get_decode_workspace_sizes(**problem)
    metadata = torch.empty((sizes["num_sm_parts"], _C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32, device=dev)
    splits = torch.empty((sizes["num_splits_ints"],), dtype=torch.int32, device=dev)
    partial_o = torch.empty((sizes["partial_rows"], config.d_v), dtype=torch.float32, device=dev)
    partial_lse = torch.empty((sizes["partial_rows"],), dtype=torch.float32, device=dev)
    # Zeroed by every plan; dense decode's in-kernel merge of two-chunk split requests counts with them.
    counters = torch.empty((max(int(sizes["merge_counter_ints"]), 1),), dtype=torch.int32, device=dev)
    step = _C.DecodeStep(metadata, splits, counters, partial_o, partial_lse, config=config, checks=_check_planned_call,
                         **problem)
    step.plan(None if sparse else cache_seqlens, topk_length, extra_topk_length, stream)
    sched.tile_scheduler_metadata = metadata
    sched.num_splits = splits
    sched.partial_o = partial_o
    sched.partial_lse = partial_lse
    sched.merge_counters = counters
    sched.workspace_sizes = sizes
    sched.config = config
    sched.have_initialized = True
    return step


# ---------------------------------------------------------------------------------------------------------------
# Tensor style: TensorStyleDecode.plan / .decode
# ---------------------------------------------------------------------------------------------------------------
def _tensor_style(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                  softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                  extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None,
                  batch_invariant=False, *, out=None, lse=None):
    """A call with the tensors of get_mla_metadata(cache_seqlens, ...) (flash_mla_with_kvcache's arguments, and the
    metadata's mode `batch_invariant`): its one entry is TensorStyleDecode.decode, which the torch op
    torch.ops.openmla.flash_mla_with_kvcache calls through here too. Where torch has no DLPack exchange API, the
    outputs and the stream come from torch first."""
    batch_invariant = bool(batch_invariant)
    if _IN_PLACE:
        return _TENSOR_STYLE.decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                    num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                                    extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length, out, lse,
                                    batch_invariant=batch_invariant)
    _, config = _check_tensor_call(tile_scheduler_metadata, num_splits, q, k_cache, block_table, cache_seqlens,
                                   head_dim_v, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                                   extra_indices_in_kvcache, topk_length, extra_topk_length)
    with _plain_torch():
        k_cache, extra_k_cache, out, lse, stream = _from_torch(q, config, k_cache, extra_k_cache, out, lse)
    return _TENSOR_STYLE.decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                                extra_indices_in_kvcache, topk_length, extra_topk_length, out, lse, stream,
                                batch_invariant=batch_invariant)


def _from_torch(q, config: _Config, k_cache, extra_k_cache, out, lse):
    """What an entry takes from torch itself through the DLPack exchange API, for torch without it: the outputs
    (allocated where not given), torch's current stream, and FP8 caches as uint8 views (older DLPack exports have no
    float8 dtype). Returns (k_cache, extra_k_cache, out, lse, stream)."""
    torch = _torch
    if out is None:
        out = torch.empty((config.b, config.s_q, config.h_q, config.d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        # Stored position-major like the kernel's rows, returned in flash_mla's logical order.
        lse = torch.empty((config.b, config.s_q, config.h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
    if config.is_fp8_kvcache:
        k_cache = as_byte_view(k_cache)
        extra_k_cache = None if extra_k_cache is None else as_byte_view(extra_k_cache)
    return k_cache, extra_k_cache, out, lse, torch.cuda.current_stream(q.device).cuda_stream


def _allocate_scratch(device_index: int, rows: int, d_v: int, counters: int):
    """The split-KV scratch of tensor-style calls on one (device, stream), for the entry's pool (on a pool miss
    only: the first call on a stream, or a call larger than any before). The counters start at zero."""
    torch = _torch
    with _plain_torch():
        dev = torch.device("cuda", device_index)
        return (torch.empty((rows, d_v), dtype=torch.float32, device=dev),
                torch.empty((rows,), dtype=torch.float32, device=dev),
                torch.zeros((counters,), dtype=torch.int32, device=dev))


_TENSOR_STYLE = _C.TensorStyleDecode(_allocate_scratch, _check_tensor_call, _check_plan_like)


def _metadata_problem(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk):
    """(b, s_q, h_q, h_kv, sparse, topk) of get_mla_metadata's tensor style, checked."""
    shape = getattr(cache_seqlens, "shape", None)
    if shape is None or len(shape) != 1:
        raise TypeError("argument 'cache_seqlens' must be a (b,) int32 CUDA tensor (tensor style; call "
                        f"get_mla_metadata() without arguments for the object style), got {type(cache_seqlens).__name__}"
                        + (f" of shape {tuple(shape)}" if shape is not None else ""))
    for name, value in (("num_q_tokens_per_head_k", num_q_tokens_per_head_k), ("num_heads_k", num_heads_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"argument '{name}' must be a positive int, got {value!r}")
    if num_heads_q is not None and (not isinstance(num_heads_q, int) or isinstance(num_heads_q, bool)
                                    or num_heads_q < 1):
        raise ValueError(f"argument 'num_heads_q' must be None or a positive int, got {num_heads_q!r}")
    rows, h_kv = num_q_tokens_per_head_k, num_heads_k
    # is_fp8_kvcache without topk: dense decode over an FP8 e4m3 cache, whose schedule is dense decode's.
    sparse = topk is not None
    if sparse:
        if not is_fp8_kvcache:
            raise ValueError("argument 'topk' was given but 'is_fp8_kvcache' is False: sparse decode reads an FP8 "
                             "cache only; pass is_fp8_kvcache=True")
        if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
            raise ValueError(f"argument 'topk' must be a positive int, got {topk!r}")
        if num_heads_q is None:
            raise ValueError("argument 'num_heads_q' is required in sparse mode (topk given): the schedule depends on "
                             "the query heads")
        if h_kv != 1:
            raise ValueError(f"argument 'num_heads_k' is {h_kv}; sparse decode attends one latent KV head (1)")
    h_q = num_heads_q if num_heads_q is not None else rows * h_kv
    if (rows * h_kv) % h_q != 0:
        raise ValueError(f"argument 'num_q_tokens_per_head_k' ({rows}) times num_heads_k ({h_kv}) is not a multiple "
                         f"of num_heads_q ({h_q}): it must be s_q * num_heads_q // num_heads_k")
    return shape[0], rows * h_kv // h_q, h_q, h_kv, sparse, topk  # shape[0] stays symbolic under torch.compile


def _plan_metadata(like, cache_seqlens, topk_length, extra_topk_length, batch, s_q, h_q, h_kv, sparse, topk,
                   extra_topk, batch_invariant=False):
    """(tile_scheduler_metadata, num_splits) on like's device, planned on the GPU from cache_seqlens (dense) or
    topk_length / extra_topk_length (sparse): get_mla_metadata's tensor style and the torch op plan_schedule. Its one
    entry is TensorStyleDecode.plan; where torch has no DLPack exchange API, the tensors and the stream come from
    torch first."""
    batch_invariant = bool(batch_invariant)
    if _IN_PLACE:
        return _TENSOR_STYLE.plan(like, cache_seqlens, topk_length, extra_topk_length, batch, s_q, h_q, h_kv, sparse,
                                  topk, extra_topk, batch_invariant=batch_invariant)
    _check_plan_like(like)
    torch = _torch
    with _plain_torch():
        dev = like.device
        problem = dict(batch=batch, s_q=s_q, h_q=h_q, num_sms=_C.device_sm_count(_device_index(dev)))
        problem.update(dict(sparse=True, topk=topk, extra_topk=extra_topk) if sparse else dict(h_kv=h_kv))
        sizes = _C.get_decode_workspace_sizes(**problem)
        metadata = torch.empty((sizes["num_sm_parts"], _C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32, device=dev)
        splits = torch.empty((sizes["num_splits_ints"],), dtype=torch.int32, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
    return _TENSOR_STYLE.plan(like, cache_seqlens, topk_length, extra_topk_length, batch, s_q, h_q, h_kv, sparse, topk,
                              extra_topk, metadata, splits, stream, batch_invariant=batch_invariant)


def _device_index(device) -> int:
    return device.index if device.index is not None else _torch.cuda.current_device()


# ---------------------------------------------------------------------------------------------------------------
# torch.compile: both styles become the custom ops of _torch_ops.py
# ---------------------------------------------------------------------------------------------------------------
def _traced_call(q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits, softmax_scale, causal,
                 is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length,
                 out, lse, batch_invariant=False):
    """flash_mla_with_kvcache as torch.compile traces it: a FlashMLASchedMeta is planned by the plan op the first
    time the traced code uses it (like the first layer's call in eager mode), then every call is one decode op."""
    ops = _torch.ops.openmla
    if batch_invariant:
        _check_invariant_object(sched, num_splits)
    if isinstance(sched, FlashMLASchedMeta):
        if num_splits is not None:
            raise ValueError("argument 'num_splits' must be None with a FlashMLASchedMeta (object style)")
        batch_invariant = sched.batch_invariant
        if sched._traced is None:
            sparse = indices is not None
            has_extra = sparse and extra_k_cache is not None
            sched._traced = ops.plan_schedule(
                q, None if sparse else cache_seqlens, topk_length if sparse else None,
                extra_topk_length if has_extra else None, q.shape[0], q.shape[1], q.shape[2], k_cache.shape[2],
                sparse, indices.shape[-1] if sparse else 0, extra_indices.shape[-1] if has_extra else 0,
                sched.batch_invariant)
        metadata, num_splits = sched._traced
    else:
        metadata = sched
    args = (q, k_cache, block_table, cache_seqlens, head_dim_v, metadata, num_splits, softmax_scale, bool(causal),
            bool(is_fp8_kvcache), indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length,
            bool(batch_invariant))
    if out is None and lse is None:
        return ops.flash_mla_with_kvcache(*args)
    if out is None:
        out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], head_dim_v))
    if lse is None:
        lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=_torch.float32).transpose(1, 2)
    ops.flash_mla_with_kvcache_out(*args, out=out, lse=lse)
    return out, lse


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------
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
        known = " or ".join(f"{bpt} ({layout} layout, d_qk {d_qk})" for bpt, (_, d_qk, layout) in _FP8_LAYOUTS.items())
        raise ValueError(f"argument '{name}' has last dimension {bytes_per_token}; sparse decode needs an FP8 cache "
                         f"with {known} bytes per token")
    return _FP8_LAYOUTS[bytes_per_token]


def _check_same_config(planned: _Config, current: _Config) -> None:
    for field in dataclasses.fields(_Config):
        was, now = getattr(planned, field.name), getattr(current, field.name)
        if was != now:
            raise ValueError(
                f"tile_scheduler_metadata was planned for {field.name}={was!r} but this call has "
                f"{field.name}={now!r}: a FlashMLASchedMeta can only be reused by calls with the same shapes and "
                "flags (one object per decoding step, shared by its layers); get a new one from get_mla_metadata()")
