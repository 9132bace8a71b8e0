"""CPU reference implementations of every OpenMLA attention computation (``openmla.reference``).

Deliberately naive C++ (``reference/``, one query row at a time, double accumulation) behind a thin binding.
Use it to check GPU kernels or to understand the contracts; it is slow by design.

Conventions (docs/reference.md has the details):

* Inputs are CPU arrays of any strides: numpy (float32, float64, float16, ``ml_dtypes.bfloat16``; a uint16
  array is read as bf16 bit patterns) or CPU/GPU torch tensors (copied to the CPU). Index arrays are int32.
* Outputs are new numpy arrays of ``dtype`` (float32 by default; pass ``np.float64`` for the full precision
  the reference computes in).
* ``lse`` is the NATURAL log of the sum of exp(scaled logits). A row with no visible/valid key gets out = 0
  and lse = +inf (max_logits = -inf), with or without a sink.
* ``attn_sink[h]`` multiplies out by 1 / (1 + exp(sink - lse)) and never changes lse.
"""
from __future__ import annotations

import numpy as np

from ._openmla import ref as _ref

try:  # numpy has no bfloat16; ml_dtypes provides one
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    _BF16 = None

__all__ = [
    "dense_decode",
    "sparse_decode",
    "sparse_prefill",
    "mha_forward",
    "mha_backward",
    "merge_partials",
    "fp8_encode_pages",
    "fp8_decode_pages",
    "FP8_BYTES_PER_TOKEN",
]

#: Bytes per token of the FP8 cache layouts ("v32": d_qk 576, "model1": d_qk 512). Written out here on purpose, as
#: the CPU reference keeps its own definition of the layouts (not the library's _openmla.fp8_cache_layouts).
FP8_BYTES_PER_TOKEN = {"v32": 656, "model1": 584}
_HEAD_DIM = {"v32": 576, "model1": 512}


def _to_numpy(x):
    """A numpy view of `x` (torch tensors are moved to the CPU; bf16 ones are reinterpreted as uint16)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        if t.dtype in (torch.float8_e4m3fn, torch.int8):
            return t.view(torch.uint8).numpy()
        return t.numpy()
    return np.asarray(x)


def _real(x, name):
    """A real-valued input as the binding takes it: bf16 becomes its uint16 bit pattern (read with half='bf16')."""
    a = _to_numpy(x)
    if _BF16 is not None and a.dtype == _BF16:
        return a.view(np.uint16)
    if a.dtype in (np.float32, np.float64, np.float16, np.uint16):
        return a
    if a.dtype.kind in "iub":
        raise TypeError(f"argument '{name}': expected a floating-point array, got {a.dtype}")
    return a.astype(np.float32)


def _int32(x, name):
    if x is None:
        return None
    a = _to_numpy(x)
    if a.dtype != np.int32:
        if a.dtype.kind not in "iu":
            raise TypeError(f"argument '{name}': expected an integer array, got {a.dtype}")
        a = a.astype(np.int32)
    return a


def _sink(x, n, name="attn_sink"):
    if x is None:
        return None
    a = np.ascontiguousarray(_to_numpy(x), dtype=np.float32)
    if a.ndim == 0:
        a = np.full(n, float(a), dtype=np.float32)
    return a


def _bytes(x, name):
    a = _to_numpy(x)
    if a.dtype.itemsize != 1:
        raise TypeError(f"argument '{name}': an FP8 cache is a byte array (uint8/int8/float8), got {a.dtype}")
    return a.view(np.uint8)


def _cache(x, name):
    """An FP8 byte cache stays bytes; anything else is a dequantised real-valued cache."""
    a = _to_numpy(x)
    if a.dtype.itemsize == 1:
        return a.view(np.uint8)
    return _real(a, name)


def _out(arrays, dtype):
    return tuple(np.asarray(a, dtype=dtype) for a in arrays)


def dense_decode(q, k_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, causal=False,
                 dtype=np.float32):
    """Dense paged MLA decode.

    q (b, s_q, h_q, d_qk); k_cache (num_blocks, page_size, h_kv, d_qk), any page size, V = first
    ``head_dim_v`` dims of K; block_table (b, max_blocks) int32 (entries past ceil(L/page_size) unused);
    cache_seqlens (b,) int32 (0 allowed). ``softmax_scale`` defaults to d_qk ** -0.5. ``causal`` is the
    bottom-right mask (query i sees keys j <= L - s_q + i), ignored when s_q == 1. Head h reads kv head
    h // (h_q // h_kv).

    Returns (out (b, s_q, h_q, head_dim_v), lse (b, h_q, s_q)).
    """
    q = _real(q, "q")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    res = _ref.dense_decode(q, _real(k_cache, "k_cache"), _int32(block_table, "block_table"),
                            np.ascontiguousarray(_int32(cache_seqlens, "cache_seqlens")), int(head_dim_v), scale,
                            bool(causal))
    return _out(res, dtype)


def sparse_decode(q, k_cache, indices, softmax_scale=None, head_dim_v=512, topk_length=None, attn_sink=None,
                  extra_k_cache=None, extra_indices=None, extra_topk_length=None, dtype=np.float32):
    """Sparse decode over a paged single-head token cache.

    k_cache: FP8 bytes (num_blocks, page_size, 1, 656 | 584) (V3.2 / MODEL1 layout, inferred from the last
    dimension; each page contiguous, any page stride), or dequantised values (num_blocks, page_size, 1, d_qk).
    indices (b, s_q, topk) int32, index = page * page_size + offset, -1 = invalid (the only invalid value).
    topk_length (b,) per REQUEST; attn_sink (h_q,) float32. The optional extra cache (own page size) with
    extra_indices (b, s_q, extra_topk) and extra_topk_length (b,) joins the main selection under one softmax.
    ``softmax_scale`` defaults to d_qk ** -0.5.

    Returns (out (b, s_q, h_q, head_dim_v), lse (b, h_q, s_q)).
    """
    q = _real(q, "q")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    res = _ref.sparse_decode(
        q, _cache(k_cache, "k_cache"), _int32(indices, "indices"), scale, int(head_dim_v),
        topk_length=_int32(topk_length, "topk_length"), attn_sink=_sink(attn_sink, q.shape[2]),
        extra_k_cache=None if extra_k_cache is None else _cache(extra_k_cache, "extra_k_cache"),
        extra_indices=_int32(extra_indices, "extra_indices"),
        extra_topk_length=_int32(extra_topk_length, "extra_topk_length"))
    return _out(res, dtype)


def sparse_prefill(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, dtype=np.float32):
    """Sparse prefill (``flash_mla_sparse_fwd``).

    q (s_q, h_q, d_qk); kv (s_kv, h_kv, d_qk), V = first d_v dims; indices (s_q, h_kv, topk) int32, invalid
    when < 0 or >= s_kv or at a slot >= topk_length[t] (topk_length (s_q,) is per QUERY TOKEN);
    attn_sink (h_q,) float32.

    Returns (out (s_q, h_q, d_v), max_logits (s_q, h_q), lse (s_q, h_q)); max_logits -inf and lse +inf
    for a token without a valid index.
    """
    q = _real(q, "q")
    res = _ref.sparse_prefill(q, _real(kv, "kv"), _int32(indices, "indices"), float(sm_scale), int(d_v),
                              attn_sink=_sink(attn_sink, q.shape[1]), topk_length=_int32(topk_length, "topk_length"))
    return _out(res, dtype)


def _mha_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale):
    q = _real(q, "q")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return (q, _real(k, "k"), _real(v, "v"), np.ascontiguousarray(_int32(cu_seqlens_q, "cu_seqlens_q")),
            np.ascontiguousarray(_int32(cu_seqlens_k, "cu_seqlens_k")), scale)


def mha_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False, dtype=np.float32):
    """Dense varlen MHA prefill forward.

    q (total_q, h_q, d_qk), k (total_k, h_kv, d_qk), v (total_k, h_kv, d_v) (d_qk != d_v allowed, GQA),
    cu_seqlens_q / cu_seqlens_k (b + 1,) int32. ``causal`` is bottom-right (query i of a request sees keys
    j <= i + s_k - s_q). ``softmax_scale`` defaults to d_qk ** -0.5.

    Returns (out (total_q, h_q, d_v), lse (total_q, h_q)).
    """
    q, k, v, cu_q, cu_k, scale = _mha_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale)
    return _out(_ref.mha_forward(q, k, v, cu_q, cu_k, scale, bool(causal)), dtype)


def mha_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, dout, softmax_scale=None, causal=False, dtype=np.float32):
    """Gradients of sum(out * dout) with respect to q, k and v (the forward is recomputed in double).

    Returns (dq (total_q, h_q, d_qk), dk (total_k, h_kv, d_qk), dv (total_k, h_kv, d_v)).
    """
    q, k, v, cu_q, cu_k, scale = _mha_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale)
    return _out(_ref.mha_backward(q, k, v, cu_q, cu_k, _real(dout, "dout"), scale, bool(causal)), dtype)


def merge_partials(o, lse, lse_base=2, attn_sink=None, dtype=np.float32):
    """Merges split-KV partial results, like the decode combine kernel.

    o (..., n, d_v): each partial normalised by its own row sum (ignored where its lse is -inf);
    lse (..., n): log of each partial's row sum, in base ``lse_base`` (2, as the GPU's split-KV buffers
    store it, or ``"e"``); attn_sink: None, a scalar or an array of shape (...) (natural units).

    Returns (out (..., d_v), lse (...)) with lse in natural log (+inf where every partial is empty).
    """
    o = _real(o, "o")
    lse = _real(lse, "lse")
    if o.ndim < 2 or lse.shape != o.shape[:-1]:
        raise ValueError(f"argument 'lse': expected shape {o.shape[:-1]} to match o {o.shape}")
    lead = o.shape[:-2]
    rows = int(np.prod(lead)) if lead else 1
    base = {2: "2", "2": "2", "e": "e", np.e: "e"}.get(lse_base)
    if base is None:
        raise ValueError(f"argument 'lse_base': expected 2 or 'e', got {lse_base!r}")
    sink = None
    if attn_sink is not None:
        sink = np.ascontiguousarray(np.broadcast_to(np.asarray(_to_numpy(attn_sink), dtype=np.float32), lead)
                                    .reshape(rows))
    out, out_lse = _ref.merge_partials(o.reshape((rows,) + o.shape[-2:]), lse.reshape(rows, lse.shape[-1]), base,
                                       sink)
    return _out((out.reshape(lead + (o.shape[-1],)), out_lse.reshape(lead)), dtype)


def _layout_of(values_or_bytes_dim, name):
    for layout, dim in _HEAD_DIM.items():
        if values_or_bytes_dim == dim:
            return layout
    raise ValueError(f"argument '{name}': last dimension {values_or_bytes_dim} is not an FP8 layout's d_qk "
                     "(576 for V3.2, 512 for MODEL1)")


def fp8_encode_pages(values, page_stride_bytes=None, out=None):
    """Quantises a bf16 paged cache into the FP8 layout given by its d_qk (576 -> V3.2, 512 -> MODEL1).

    values (num_blocks, page_size, 1, d_qk) bf16 (``ml_dtypes.bfloat16`` or uint16 bit patterns), any strides.
    Writes into ``out`` (a uint8 (num_blocks, page_size, 1, bytes) array whose pages are contiguous) when
    given, else allocates one whose pages are ``page_stride_bytes`` apart (default: packed). Returns it.
    """
    v = _real(values, "values")
    if v.dtype != np.uint16:
        raise TypeError(f"argument 'values': expected bfloat16 (or uint16 bit patterns), got {v.dtype}")
    if v.ndim != 4:
        raise ValueError(f"argument 'values': expected (num_blocks, page_size, 1, d_qk), got {v.shape}")
    layout = _layout_of(v.shape[-1], "values")
    bpt = FP8_BYTES_PER_TOKEN[layout]
    num_blocks, page_size = v.shape[0], v.shape[1]
    if out is None:
        stride = page_size * bpt if page_stride_bytes is None else int(page_stride_bytes)
        if stride < page_size * bpt:
            raise ValueError(f"argument 'page_stride_bytes': {stride} is smaller than one page ({page_size * bpt})")
        buf = np.zeros(max(num_blocks * stride, 1), dtype=np.uint8)
        out = np.lib.stride_tricks.as_strided(buf, shape=(num_blocks, page_size, 1, bpt),
                                              strides=(stride, bpt, bpt, 1))
    _ref.fp8_encode_pages(v, _bytes(out, "out"))
    return out


def fp8_decode_pages(cache, as_float=False):
    """Dequantises an FP8 byte cache (num_blocks, page_size, 1, 656 | 584) through the CPU codec.

    Returns (num_blocks, page_size, 1, d_qk) values: float32 when ``as_float``, else bf16
    (``ml_dtypes.bfloat16`` when available, otherwise uint16 bit patterns).
    """
    bits = _ref.fp8_decode_pages(_bytes(cache, "cache"))
    if as_float:
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(_BF16) if _BF16 is not None else bits
