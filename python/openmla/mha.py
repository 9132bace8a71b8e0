"""Dense MHA prefill with DeepSeek ``flash_mla``'s Python interface: ``flash_attn_varlen_func`` and its packed variants.

In MLA serving, prompt tokens run as ordinary multi-head attention once the latent is expanded: d_qk = 192 (128 NoPE +
64 RoPE), d_v = 128. ``flash_mla`` ships this kernel for Blackwell only; OpenMLA's is for Hopper (sm_90a)::

    import openmla as flash_mla
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                                                causal=True)

Status: implemented and verified on an H100 (docs/mha-prefill.md, "Status");
``openmla.query_capability("dense_prefill")`` says whether it runs here, with the reason when not. Forward only: the
backward (autograd) is not implemented yet.

Argument checks (dtypes, shapes, strides, devices) live in the C++ API; its messages reach the caller unchanged as
ValueError (bad argument), NotImplementedError (not supported) or RuntimeError (CUDA). See docs/mha-prefill.md.
"""
from __future__ import annotations

import math
import numbers

import contextlib

from . import _openmla as _C
from ._runtime import _torch, require_torch, stream_of, torch_tensors_read_in_place

if _torch is not None:
    # The per-call entry reads torch tensors itself (no DLPack export, no Python call into torch): see
    # python/csrc/bind_mha_call.cpp and docs/integration.md, "Host cost per call".
    _IN_PLACE = torch_tensors_read_in_place()
    # Tensor attributes without the cost of active torch-function modes (set_default_device installs one).
    _plain_torch = getattr(_torch._C, "DisableTorchFunction", contextlib.nullcontext)
else:  # pragma: no cover - depends on the machine
    _IN_PLACE = False
    _plain_torch = contextlib.nullcontext

__all__ = ["flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]


def _check_options(dropout_p, softmax_scale, max_seqlen_qo, name_max="max_seqlen_qo"):
    """The checks of plain Python arguments, made before anything else (no torch needed)."""
    if not isinstance(dropout_p, numbers.Real) or dropout_p != 0.0:
        raise ValueError(f"argument 'dropout_p' is {dropout_p!r}; dropout is not supported (it must be 0.0, as in "
                         "flash_mla)")
    if softmax_scale is not None:
        if not isinstance(softmax_scale, numbers.Real) or not (softmax_scale > 0 and math.isfinite(softmax_scale)):
            raise ValueError(f"argument 'softmax_scale' is {softmax_scale!r}; it must be a positive finite number "
                             "(None: d_qk ** -0.5)")
    if not isinstance(max_seqlen_qo, numbers.Integral) or isinstance(max_seqlen_qo, bool) or max_seqlen_qo < 0:
        raise ValueError(f"argument '{name_max}' is {max_seqlen_qo!r}; it must be an int >= 0 (the longest query "
                         "sequence; it only sizes the grid)")


def _forward(what, q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal, out, lse):
    if _IN_PLACE:  # the per-call entry; None when the checks below must name what is wrong
        if _torch.is_grad_enabled():
            with _plain_torch():
                needs_grad = any(getattr(t, "requires_grad", False) for t in (q, k, v))
        else:
            needs_grad = False
        if not needs_grad:
            res = _C.mha_prefill_call(q, k, v, cu_seqlens_qo, cu_seqlens_kv, int(max_seqlen_qo),
                                      0.0 if softmax_scale is None else float(softmax_scale), bool(causal), out, lse)
            if res is not None:
                return res
    torch = require_torch(what)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"argument '{name}' must be a 3-dimensional torch.Tensor (total, heads, head_dim), got {shape}")
    for name, t in (("cu_seqlens_qo", cu_seqlens_qo), ("cu_seqlens_kv", cu_seqlens_kv)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] < 2:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"argument '{name}' must be a (batch + 1,) int32 torch.Tensor with batch >= 1, got {shape}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError(f"openmla.{what}: the backward pass is not implemented yet; call it under "
                                  "torch.no_grad() or torch.inference_mode(), or detach q, k and v")
    total_q, h_q, d_qk = (int(x) for x in q.shape)
    h_kv, d_v = int(k.shape[1]), int(v.shape[2])
    batch = int(cu_seqlens_qo.shape[0]) - 1
    # problem.dtype follows q; a q of another dtype is named by the C++ check of q.
    dtype = "float16" if q.dtype == torch.float16 else "bfloat16"
    problem = dict(batch=batch, h_q=h_q, h_kv=h_kv, d_qk=d_qk, d_v=d_v, dtype=dtype, causal=bool(causal),
                   max_seqlen_qo=int(max_seqlen_qo))
    if out is None:
        out = torch.empty((total_q, h_q, d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        # flash_mla's layout: the transpose of a (h_q, total_q) tensor, contiguous along the tokens.
        lse = torch.empty((h_q, total_q), dtype=torch.float32, device=q.device).t()
    # The tile counter: a fresh allocation per call (torch's caching allocator makes it cheap), so calls on different
    # streams never share one.
    workspace = torch.empty(_C.get_mha_prefill_workspace_size(**problem), dtype=torch.uint8, device=q.device)
    _C.mha_prefill(q, k, v, cu_seqlens_qo, cu_seqlens_kv, workspace, out, lse,
                   softmax_scale=0.0 if softmax_scale is None else float(softmax_scale), stream=stream_of(q), **problem)
    return out, lse


def flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p=0.0,
                           softmax_scale=None, causal=False, deterministic=False, is_varlen=True, *, out=None,
                           lse=None):
    """Dense varlen multi-head attention forward (flash_mla-compatible; Hopper).

    Args:
      q: (total_q, h_q, d_qk) bfloat16 or float16 CUDA tensor; (d_qk, d_v) = (192, 128) (MLA) or (128, 128). Last
        dim contiguous, the other strides multiples of 8 elements (views into a packed qkv tensor are fine).
      k: (total_k, h_kv, d_qk), q's dtype; h_q must be a multiple of h_kv (MHA or GQA: head h reads kv head
        h // (h_q // h_kv)).
      v: (total_k, h_kv, d_v), q's dtype.
      cu_seqlens_qo, cu_seqlens_kv: (batch + 1,) int32: sequence i owns query rows [cu_seqlens_qo[i],
        cu_seqlens_qo[i + 1]) and key rows [cu_seqlens_kv[i], cu_seqlens_kv[i + 1]); lengths may be 0 and may differ
        between queries and keys (chunked prefill).
      max_seqlen_qo: the longest query sequence (an int); it only sizes the grid (a wrong value costs speed, never
        correctness). max_seqlen_kv: accepted, not used.
      dropout_p: must be 0.0.
      softmax_scale: default d_qk ** -0.5.
      causal: bottom-right aligned: query i of a sequence sees key j iff j <= i + s_k - s_q.
      deterministic: accepted either way: the forward is always bitwise deterministic (no atomics in the arithmetic).
      is_varlen: accepted either way (the kernel always reads the cumulative lengths).
      out, lse: optional caller-owned outputs of the shapes below (written in place and returned); lse any strides.

    Returns:
      (out, lse): out (total_q, h_q, d_v) in q's dtype; lse (total_q, h_q) float32, natural log of the sum of
      exp(scaled logits), allocated as the transpose of a (h_q, total_q) tensor as flash_mla does. A query row that
      sees no key gets out = 0 and lse = +inf. Rows past cu_seqlens_qo[batch] are not written.

    Raises:
      ValueError: a bad argument (the message names it). NotImplementedError: an unsupported shape, the family not
      built, or inputs requiring grad. RuntimeError: a CUDA error.
    """
    del max_seqlen_kv, deterministic, is_varlen
    _check_options(dropout_p, softmax_scale, max_seqlen_qo)
    return _forward("flash_attn_varlen_func", q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale,
                    causal, out, lse)


def _split_last(t, name, sizes, what):
    """Views of `t` along its last dimension (sizes in elements), after checking the shape."""
    torch = require_torch(what)
    if not isinstance(t, torch.Tensor) or t.dim() != 3:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"argument '{name}' must be a 3-dimensional torch.Tensor, got {shape}")
    if int(t.shape[-1]) != sum(sizes) or min(sizes) <= 0:
        raise ValueError(f"argument '{name}' has last dimension {int(t.shape[-1])}; with head_dim_qk = {sizes[0]} it "
                         f"must split into {' + '.join(str(s) for s in sizes)} with d_v > 0")
    views, start = [], 0
    for s in sizes:
        views.append(t[..., start:start + s])
        start += s
    return views


def _head_dim(head_dim_qk):
    if not isinstance(head_dim_qk, numbers.Integral) or isinstance(head_dim_qk, bool) or head_dim_qk <= 0:
        raise ValueError(f"argument 'head_dim_qk' is {head_dim_qk!r}; it must be a positive int (192 or 128)")
    return int(head_dim_qk)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, head_dim_qk, dropout_p=0.0, softmax_scale=None,
                                     causal=False, deterministic=False, is_varlen=True, *, out=None, lse=None):
    """flash_attn_varlen_func on one packed tensor: qkv (total, h, 2 * head_dim_qk + d_v) is split along its last
    dimension into q | k | v (views, no copy); h_q = h_kv = h, and cu_seqlens serves queries and keys."""
    del deterministic, is_varlen
    d_qk = _head_dim(head_dim_qk)
    _check_options(dropout_p, softmax_scale, max_seqlen, "max_seqlen")
    width = int(qkv.shape[-1]) if hasattr(qkv, "shape") and len(qkv.shape) == 3 else 0
    q, k, v = _split_last(qkv, "qkv", (d_qk, d_qk, width - 2 * d_qk), "flash_attn_varlen_qkvpacked_func")
    return _forward("flash_attn_varlen_qkvpacked_func", q, k, v, cu_seqlens, cu_seqlens, max_seqlen, softmax_scale,
                    causal, out, lse)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, head_dim_qk,
                                    dropout_p=0.0, softmax_scale=None, causal=False, deterministic=False,
                                    is_varlen=True, *, out=None, lse=None):
    """flash_attn_varlen_func with keys and values in one tensor: kv (total_k, h_kv, head_dim_qk + d_v) is split along
    its last dimension into k | v (views, no copy)."""
    del max_seqlen_kv, deterministic, is_varlen
    d_qk = _head_dim(head_dim_qk)
    _check_options(dropout_p, softmax_scale, max_seqlen_qo)
    width = int(kv.shape[-1]) if hasattr(kv, "shape") and len(kv.shape) == 3 else 0
    k, v = _split_last(kv, "kv", (d_qk, width - d_qk), "flash_attn_varlen_kvpacked_func")
    return _forward("flash_attn_varlen_kvpacked_func", q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                    softmax_scale, causal, out, lse)
