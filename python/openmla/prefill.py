"""MLA prefill with DeepSeek ``flash_mla``'s Python interface: sparse top-k prefill (DeepSeek-V3.2 sparse
attention for prompt tokens).

Drop-in usage::

    import openmla as flash_mla
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, sm_scale, topk_length=lengths)

and, straight from the paged FP8 cache that ``flash_mla_with_kvcache(..., is_fp8_kvcache=True)`` reads (indices are
cache slots, bf16 compute, no bf16 copy of the cache)::

    out, max_logits, lse = openmla.flash_mla_sparse_fwd_fp8(q, kv_cache, slot_indices, sm_scale, topk_length=lengths)

Argument checks (dtypes, shapes, strides, devices) live in the C++ API; its messages reach the caller
unchanged as ValueError (bad argument), NotImplementedError (not supported) or RuntimeError (CUDA).
See docs/sparse-prefill.md.
"""
from __future__ import annotations

import math

from . import _openmla as _C
from ._runtime import _torch, as_byte_view, require_torch, stream_of, torch_tensors_read_in_place

__all__ = ["flash_mla_sparse_fwd", "flash_mla_sparse_fwd_fp8"]

if _torch is not None:
    # The per-call entry reads torch tensors itself (no DLPack export, no Python call into torch): see
    # python/csrc/bind_prefill_call.cpp and docs/python-api.md, "Host cost".
    _IN_PLACE = torch_tensors_read_in_place()
    _is_compiling = getattr(getattr(_torch, "compiler", None), "is_compiling", None) or (lambda: False)
else:  # pragma: no cover - depends on the machine
    _IN_PLACE = False
    _is_compiling = None


def _check_q(torch, q):
    """q of both sparse prefill entries: a (s_q, h_q, d_qk) torch.Tensor (the binding checks the rest)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"argument 'q' must be a (s_q, h_q, d_qk) torch.Tensor, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")


def _checked_scale(sm_scale):
    scale = float(sm_scale)
    if not (scale > 0.0 and math.isfinite(scale)):
        raise ValueError(f"argument 'sm_scale' must be a positive finite number, got {sm_scale!r}")
    return scale


def _outputs(torch, q, d_v, out, max_logits, lse):
    """The given outputs, or new ones: out (s_q, h_q, d_v) of q's dtype, max_logits and lse (s_q, h_q) float32."""
    s_q, h_q = int(q.shape[0]), int(q.shape[1])
    if out is None:
        out = torch.empty((s_q, h_q, int(d_v)), dtype=q.dtype, device=q.device)
    if max_logits is None:
        max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    if lse is None:
        lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    return out, max_logits, lse


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, *, out=None,
                         max_logits=None, lse=None):
    """Sparse top-k MLA prefill (flash_mla-compatible): every query token attends to its own selected kv rows.

    Args:
      q: (s_q, h_q, d_qk) bfloat16 CUDA tensor, d_qk = 576 (DeepSeek-V3.2) or 512 (MODEL1). Any h_q >= 1
        (64 and 128 are the fast paths; 8, 16, 32 need no padding to 64), any s_q >= 1. Last dim contiguous,
        other strides multiples of 8 elements.
      kv: (s_kv, 1, d_qk) bfloat16, same device; V is the first d_v dims of each row. Last dim contiguous.
      indices: (s_q, 1, topk) int32, any topk >= 1: the kv rows each query token attends to. Any value < 0 or
        >= s_kv is invalid and never read.
      sm_scale: the softmax scale (a positive float; required, as in flash_mla).
      d_v: 512.
      attn_sink: optional (h_q,) float32 (natural-log units, +-inf allowed): out is divided by
        (1 + exp(attn_sink[h] - lse)); lse and max_logits are not changed. +inf gives out = 0, -inf has no effect.
      topk_length: optional (s_q,) int32, per QUERY TOKEN: only slots [0, topk_length[t]) of token t are used
        (values outside [0, topk] clamp; the other slots are never read and may hold garbage).
      out, max_logits, lse: optional caller-owned outputs of the shapes below (written in place and returned).

    Returns:
      (out, max_logits, lse): out (s_q, h_q, d_v) bfloat16; max_logits (s_q, h_q) float32 = the largest
      sm_scale * q.k over the valid keys (-inf if none); lse (s_q, h_q) float32 = natural log of the sum of
      exp(sm_scale * q.k) over the valid keys (+inf if none, whose out is 0).

    Raises:
      ValueError: a bad argument (the message names it). NotImplementedError: an unsupported shape (e.g.
      d_qk 128). RuntimeError: a CUDA error.
    """
    if _is_compiling is not None and _is_compiling():  # torch.compile: the registered op (no graph break)
        if out is None and max_logits is None and lse is None:
            return _torch.ops.openmla.flash_mla_sparse_fwd(q, kv, indices, float(sm_scale), int(d_v), attn_sink,
                                                           topk_length)
        if out is not None and max_logits is not None and lse is not None:
            _torch.ops.openmla.flash_mla_sparse_fwd_out(q, kv, indices, float(sm_scale), int(d_v), attn_sink,
                                                        topk_length, out=out, max_logits=max_logits, lse=lse)
            return out, max_logits, lse
    elif _IN_PLACE:
        res = _C.sparse_prefill_call(q, kv, indices, sm_scale, int(d_v), attn_sink, topk_length, out, max_logits, lse)
        if res is not None:
            return res
    torch = require_torch("flash_mla_sparse_fwd")
    _check_q(torch, q)
    scale = _checked_scale(sm_scale)
    out, max_logits, lse = _outputs(torch, q, d_v, out, max_logits, lse)
    _C.sparse_prefill(q, kv, indices, out, max_logits, lse, topk_length=topk_length, attn_sink=attn_sink,
                      softmax_scale=scale, d_v=int(d_v), stream=stream_of(q))
    return out, max_logits, lse


# FP8 cache layouts, told apart by the cache's last dimension (bytes per token), as flash_mla_with_kvcache does:
# bytes per token -> format name of the binding. The sizes are the C++ definition's (through the binding).
_FP8_FORMATS = {_C.fp8_cache_layouts[f]["bytes_per_token"]: f for f in ("v32", "model1")}


def flash_mla_sparse_fwd_fp8(q, kv_cache, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, *,
                             kv_cache_format=None, out=None, max_logits=None, lse=None):
    """Sparse top-k MLA prefill straight from the paged FP8 KV cache (bf16 compute).

    The same result as ``flash_mla_sparse_fwd`` on the dequantised cache (``dequantize_kv_cache(kv_cache)`` viewed
    as ``(num_blocks * page_size, 1, d_qk)`` rows), without the dequantised copy: the kernel gathers the selected
    tokens' FP8 bytes and dequantises them in shared memory (docs/sparse-prefill.md, "Sparse prefill from the FP8
    cache").

    Args:
      q: (s_q, h_q, d_qk) bfloat16 CUDA tensor, d_qk = 576 for the V3.2 cache, 512 for MODEL1; layout as
        ``flash_mla_sparse_fwd``.
      kv_cache: (num_blocks, page_size, 1, bytes_per_token) FP8 cache (float8_e4m3fn, int8 or uint8), the tensor
        ``flash_mla_with_kvcache(..., is_fp8_kvcache=True)`` reads: 656 bytes per token (V3.2) or 584 (MODEL1);
        any page_size; pages contiguous, page stride a multiple of 16 bytes.
      indices: (s_q, 1, topk) int32 cache slots, slot = page * page_size + row_in_page (block_table already
        applied, as sparse decode takes them); any value < 0 or >= num_blocks * page_size is invalid and never
        read.
      sm_scale, d_v, attn_sink, topk_length, out, max_logits, lse: as ``flash_mla_sparse_fwd``.
      kv_cache_format: "v32" or "model1"; None: from bytes_per_token (kv_cache.shape[-1]).

    Returns:
      (out, max_logits, lse) as ``flash_mla_sparse_fwd``.

    Raises:
      ValueError: a bad argument (the message names it). RuntimeError: a CUDA error.
    """
    torch = require_torch("flash_mla_sparse_fwd_fp8")
    _check_q(torch, q)
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
        raise ValueError("argument 'kv_cache' must be a (num_blocks, page_size, 1, bytes_per_token) torch.Tensor, "
                         f"got {tuple(kv_cache.shape) if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__}")
    if kv_cache_format is None:
        bpt = int(kv_cache.shape[-1])
        if bpt not in _FP8_FORMATS:
            raise ValueError(f"argument 'kv_cache' has {bpt} bytes per token (shape {tuple(kv_cache.shape)}); an FP8 "
                             "cache has 656 (V3.2) or 584 (MODEL1)")
        kv_cache_format = _FP8_FORMATS[bpt]
    scale = _checked_scale(sm_scale)
    out, max_logits, lse = _outputs(torch, q, d_v, out, max_logits, lse)
    _C.sparse_prefill_fp8(q, as_byte_view(kv_cache), str(kv_cache_format), indices, out, max_logits, lse,
                          topk_length=topk_length, attn_sink=attn_sink, softmax_scale=scale, d_v=int(d_v),
                          stream=stream_of(q))
    return out, max_logits, lse
