"""Dense MLA decode over an FP8 e4m3 paged cache with per-tensor scales: the path ``flash_mla_with_kvcache`` takes
when ``indices`` is None and the cache is FP8 (``is_fp8_kvcache=True`` or a float8_e4m3fn ``k_cache``), with vLLM's
FlashMLA-fork arguments ``descale_q`` / ``descale_k``::

    sched, _ = openmla.get_mla_metadata()
    out, lse = openmla.flash_mla_with_kvcache(q, kv_cache_fp8, block_table, seq_lens, 512, sched,
                                              softmax_scale=scale, causal=True, is_fp8_kvcache=True,
                                              descale_q=q_scale, descale_k=k_scale)

  k_cache: (num_blocks, page_block_size, 1, 576) float8_e4m3fn (uint8 / int8 views accepted), any page size >= 1;
    holds k / descale_k (V is the first 512 dims of the same latent: one scale for K and V).
  q: (b, s_q, h_q, 576) bfloat16, or float8_e4m3fn holding q / descale_q.
  descale_q, descale_k: float32 CUDA tensors of one element (shape (1,) or 0-d; read on the GPU, so the call stays
    graph-capturable with changing scales) or Python floats; None means 1.
  out: (b, s_q, h_q, 512) bfloat16; lse (b, h_q, s_q) float32, the natural-log sum of exp(softmax_scale * q.k) of
    the dequantised q and k.

The schedule is dense decode's (same shapes, same num_sm_parts), in either style: a FlashMLASchedMeta planned on first
use, or the tensors of ``get_mla_metadata(cache_seqlens, s_q * h_q, 1)`` (``is_fp8_kvcache=True`` accepted there
too). Not supported here (ValueError): batch_invariant, h_kv > 1. Design note: docs/dense-decode.md, "FP8 cache".
"""
from __future__ import annotations

from . import _openmla as _C
from ._runtime import as_byte_view, is_torch_tensor, require_torch

try:  # torch is optional: importing OpenMLA needs neither torch nor a GPU
    import torch as _torch
except Exception:  # pragma: no cover - depends on the machine
    _torch = None

D_QK = 576


def flash_mla_with_kvcache_fp8(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, softmax_scale=None, causal=False, descale_q=None, descale_k=None, *,
                               out=None, lse=None):
    """vLLM's FlashMLA-fork entry for the FP8 dense cache, by name: ``flash_mla_with_kvcache(...,
    is_fp8_kvcache=True, descale_q=descale_q, descale_k=descale_k)`` (see the module's doc)."""
    from .decode import flash_mla_with_kvcache

    return flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                  num_splits, softmax_scale, causal, True, descale_q=descale_q, descale_k=descale_k,
                                  out=out, lse=lse)


def _is_byte_dtype(t) -> bool:
    return is_torch_tensor(t) and t.element_size() == 1


def wants_fp8_path(k_cache, is_fp8_kvcache, indices, descale_q, descale_k, sched) -> bool:
    """Whether a flash_mla_with_kvcache call is (or claims to be) an FP8 dense call: no indices and an FP8 flag, a
    1-byte cache, a descale argument, or a FlashMLASchedMeta this path planned."""
    if indices is not None:
        return False
    return (bool(is_fp8_kvcache) or _is_byte_dtype(k_cache) or descale_q is not None or descale_k is not None
            or getattr(sched, "_fp8_problem", None) is not None)


def _scale_args(value, name):
    """(tensor or None, host value) of a descale argument."""
    if value is None:
        return None, 1.0
    if is_torch_tensor(value):
        return value, 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"argument '{name}' must be None, a float or a float32 CUDA tensor of one element, got "
                        f"{type(value).__name__}")
    return None, float(value)


def _check(q, k_cache, block_table, cache_seqlens, head_dim_v, is_fp8_kvcache, attn_sink, extra_k_cache,
           extra_indices, topk_length, extra_topk_length, batch_invariant):
    torch = require_torch("flash_mla_with_kvcache")
    for name, value in (("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices), ("topk_length", topk_length),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise ValueError(f"argument '{name}' is a sparse-decode argument but 'indices' is None: FP8 dense decode "
                             f"takes no {name}")
    if batch_invariant:
        raise ValueError("argument 'batch_invariant' is True: FP8 dense decode has no batch-invariant schedule yet")
    for name, t, shape in (("q", q, "(b, s_q, h_q, 576)"), ("k_cache", k_cache, "(num_blocks, page_block_size, 1, 576)")):
        if not is_torch_tensor(t):
            raise TypeError(f"argument '{name}' must be a torch.Tensor {shape}, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"argument '{name}' must have 4 dimensions {shape}, got shape {tuple(t.shape)}")
        if not t.is_cuda:
            raise ValueError(f"argument '{name}' must be a CUDA tensor, got a tensor on {t.device}")
    if not _is_byte_dtype(k_cache):
        raise ValueError(f"argument 'k_cache' has dtype {k_cache.dtype} but the call is an FP8 dense decode "
                         f"(is_fp8_kvcache={bool(is_fp8_kvcache)}, descale given or an FP8-planned schedule): the cache "
                         "must be float8_e4m3fn (num_blocks, page_block_size, 1, 576); a bf16 / fp16 cache takes no "
                         "is_fp8_kvcache, descale_q or descale_k")
    if k_cache.dtype not in (torch.float8_e4m3fn, torch.uint8, torch.int8):
        raise ValueError(f"argument 'k_cache' has dtype {k_cache.dtype}; FP8 dense decode reads e4m3 "
                         "(torch.float8_e4m3fn, or a uint8 / int8 view of e4m3 bytes)")
    if q.element_size() == 1 and q.dtype != torch.float8_e4m3fn:
        raise ValueError(f"argument 'q' has dtype {q.dtype}; an 8-bit q must be torch.float8_e4m3fn")
    for name, value in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        if value is None:
            raise ValueError(f"argument '{name}' is None, but dense decode (indices=None) needs it")
    if head_dim_v != 512:
        raise ValueError(f"argument 'head_dim_v' is {head_dim_v!r}; dense MLA decode has d_v = 512")


def _problem(q, k_cache, block_table, head_dim_v, causal):
    b, s_q, h_q, d_qk = (int(x) for x in q.shape)
    return dict(batch=b, s_q=s_q, h_q=h_q, h_kv=int(k_cache.shape[2]), d_qk=d_qk, d_v=int(head_dim_v),
                page_block_size=int(k_cache.shape[1]), cache_format="fp8_e4m3", causal=bool(causal),
                num_sms=_C.device_sm_count(q.device.index if q.device.index is not None
                                           else _torch.cuda.current_device()),
                max_blocks_per_seq=int(block_table.shape[1]) if getattr(block_table, "ndim", 0) == 2 else 0)


def call(q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits, softmax_scale, causal,
         is_fp8_kvcache, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length, descale_q,
         descale_k, batch_invariant, out, lse):
    """flash_mla_with_kvcache's FP8 dense path (decode.py routes here when wants_fp8_path)."""
    from . import decode as _dec  # the schedule object and its config record

    _check(q, k_cache, block_table, cache_seqlens, head_dim_v, is_fp8_kvcache, attn_sink, extra_k_cache,
           extra_indices, topk_length, extra_topk_length, batch_invariant or getattr(sched, "batch_invariant", False))
    torch = _torch
    dq_t, dq_v = _scale_args(descale_q, "descale_q")
    dk_t, dk_v = _scale_args(descale_k, "descale_k")
    problem = _problem(q, k_cache, block_table, head_dim_v, causal)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    counters = None
    if isinstance(sched, _dec.FlashMLASchedMeta):
        if num_splits is not None:
            raise ValueError("argument 'num_splits' must be None with a FlashMLASchedMeta (object style)")
        config = _dec._Config(b=problem["batch"], s_q=problem["s_q"], h_q=problem["h_q"],
                              page_block_size=problem["page_block_size"], h_k=problem["h_kv"], causal=bool(causal),
                              is_fp8_kvcache=True, topk=None, extra_page_block_size=None, extra_topk=None,
                              d_qk=problem["d_qk"], d_v=problem["d_v"], device=q.device)
        with _dec._PLAN_LOCK:
            if sched.have_initialized:
                _dec._check_same_config(sched.config, config)
            else:
                sizes = _C.get_decode_workspace_sizes(**problem)
                dev = q.device
                metadata = torch.empty((sizes["num_sm_parts"], _C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32,
                                       device=dev)
                splits = torch.empty((sizes["num_splits_ints"],), dtype=torch.int32, device=dev)
                _C.plan_decode(cache_seqlens, metadata, splits, stream=stream, **problem)
                sched.tile_scheduler_metadata = metadata
                sched.num_splits = splits
                sched.partial_o = torch.empty((sizes["partial_rows"], problem["d_v"]), dtype=torch.float32, device=dev)
                sched.partial_lse = torch.empty((sizes["partial_rows"],), dtype=torch.float32, device=dev)
                sched.workspace_sizes = sizes
                sched.config = config
                sched._fp8_problem = problem
                sched.have_initialized = True
        metadata, splits = sched.tile_scheduler_metadata, sched.num_splits
        partial_o, partial_lse = sched.partial_o, sched.partial_lse
    else:
        if not is_torch_tensor(sched) or num_splits is None:
            raise ValueError("argument 'tile_scheduler_metadata' must be a FlashMLASchedMeta (num_splits None) or the "
                             "tensors of get_mla_metadata(cache_seqlens, ...) (both given)")
        metadata, splits = sched, num_splits
        sizes = _C.get_decode_workspace_sizes(**problem)
        partial_o = torch.empty((sizes["partial_rows"], problem["d_v"]), dtype=torch.float32, device=q.device)
        partial_lse = torch.empty((sizes["partial_rows"],), dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty((problem["batch"], problem["s_q"], problem["h_q"], problem["d_v"]), dtype=torch.bfloat16,
                          device=q.device)
    if lse is None:
        lse = torch.empty((problem["batch"], problem["s_q"], problem["h_q"]), dtype=torch.float32,
                          device=q.device).transpose(1, 2)
    q_fp8 = q.dtype == torch.float8_e4m3fn
    _C.dense_decode_fp8(as_byte_view(q) if q_fp8 else q, as_byte_view(k_cache), block_table, cache_seqlens, metadata,
                        splits, partial_o, partial_lse, out, lse, descale_q=dq_t, descale_k=dk_t,
                        descale_q_value=dq_v, descale_k_value=dk_v, merge_counters=counters,
                        softmax_scale=0.0 if softmax_scale is None else float(softmax_scale), q_fp8=q_fp8,
                        stream=stream, **problem)
    return out, lse
