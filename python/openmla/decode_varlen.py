"""Per-request query lengths in decode (``flash_mla_with_kvcache(..., seqused_q=...)``): speculative decoding with a
different number of draft tokens per request, replayable in a full CUDA graph captured at the largest shapes.

``q`` stays ``(b, s_q, h_q, d_qk)`` with ``s_q`` the LARGEST query length; ``seqused_q`` is a ``(b,)`` int32 CUDA
tensor, request ``i`` having ``seqused_q[i]`` query rows (0 to ``s_q``; values outside are clamped on the device).
Rows ``j >= seqused_q[i]`` get ``out = 0`` and ``lse = +inf`` (the empty-row convention). Dense decode masks causally
bottom-right per request: row ``j`` of request ``i`` sees keys ``< cache_seqlens[i] - seqused_q[i] + 1 + j``. Sparse
decode attends row ``j``'s own indices (never read for rows past the length). Nothing synchronises the host: the
schedule is planned on the GPU from both lengths by the step's first call, and every replay of a graph that captured
the step plans again from the values the lengths hold then. Design: docs/dense-decode.md and docs/sparse-decode.md,
"Per-request query lengths"; the engine's call: docs/integration.md.

Object style only (one ``FlashMLASchedMeta`` per step, shared by its layers); an object planned with ``seqused_q``
serves calls with ``seqused_q`` only, and the reverse. Not with ``batch_invariant``.
"""
from __future__ import annotations

from . import _openmla as _C
from . import decode as _dec
from ._runtime import as_byte_view


class _VarlenStep:
    """A FlashMLASchedMeta's planned state for calls with per-request query lengths (its ``_varlen``)."""

    __slots__ = ("config", "problem", "metadata", "splits", "partial_o", "partial_lse", "counters", "lengths")


def _stream(device):
    return _dec._torch.cuda.current_stream(device).cuda_stream


def varlen_call(sched, num_splits, q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length,
                seqused_q, batch_invariant, out, lse):
    """flash_mla_with_kvcache with ``seqused_q`` given (see the module doc)."""
    torch = _dec._torch
    if _dec._is_compiling():
        raise NotImplementedError("flash_mla_with_kvcache(..., seqused_q=...) is not traced by torch.compile; call it "
                                  "from an opaque custom op (as vLLM's attention layer does) or eagerly")
    if not isinstance(sched, _dec.FlashMLASchedMeta) or num_splits is not None:
        raise ValueError("argument 'seqused_q' needs the object style: pass the FlashMLASchedMeta of "
                         "openmla.get_mla_metadata() (no arguments) and num_splits=None (tensor-style metadata has no "
                         "per-request query lengths)")
    if batch_invariant or sched.batch_invariant:
        raise NotImplementedError("argument 'seqused_q' (per-request query lengths) cannot be combined with "
                                  "batch_invariant")
    if not _dec.is_torch_tensor(seqused_q):
        raise TypeError(f"argument 'seqused_q' must be a (b,) int32 CUDA torch.Tensor, got {type(seqused_q).__name__}")
    with _dec._plain_torch():
        cache_format, config = _dec._check_call(q, k_cache, block_table, cache_seqlens, head_dim_v, causal,
                                                is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices,
                                                topk_length, extra_topk_length)
        sparse = config.is_fp8_kvcache
        state = getattr(sched, "_varlen", None)
        if state is None:
            if sched._step is not None or sched._traced is not None or sched.have_initialized:
                raise ValueError("argument 'seqused_q' was given but this FlashMLASchedMeta was planned by a call "
                                 "without it: one object per step, planned by the step's first call, serves calls of "
                                 "that kind only; get a new one from get_mla_metadata()")
            with _dec._PLAN_LOCK:
                state = getattr(sched, "_varlen", None)
                if state is None:
                    state = _plan(sched, config, cache_format, cache_seqlens, topk_length, extra_topk_length,
                                  block_table, seqused_q)
        else:
            _dec._check_same_config(state.config, config)
        dev = q.device
        if out is None:
            out = torch.empty((config.b, config.s_q, config.h_q, config.d_v), dtype=q.dtype, device=dev)
        if lse is None:
            lse = torch.empty((config.b, config.s_q, config.h_q), dtype=torch.float32, device=dev).transpose(1, 2)
        scale = 0.0 if softmax_scale is None else float(softmax_scale)
        stream = _stream(dev)
        if sparse:
            _C.sparse_decode(q, as_byte_view(k_cache), indices, state.metadata, state.splits, state.partial_o,
                             state.partial_lse, out, lse, topk_length, attn_sink,
                             None if extra_k_cache is None else as_byte_view(extra_k_cache), extra_indices,
                             extra_topk_length, scale, stream, seqused_q, state.lengths, **state.problem)
        else:
            _C.dense_decode(q, k_cache, block_table, cache_seqlens, state.metadata, state.splits, state.partial_o,
                            state.partial_lse, out, lse, state.counters, scale, stream, seqused_q, state.lengths,
                            **state.problem)
    return out, lse


def _plan(sched, config, cache_format, cache_seqlens, topk_length, extra_topk_length, block_table, seqused_q):
    """First call of the step: size, allocate on q's device, plan on the current stream (the lengths' kernel, then
    the scheduler), and fill the object's flash_mla fields."""
    torch = _dec._torch
    dev = config.device
    sparse = config.is_fp8_kvcache
    problem = dict(batch=config.b, s_q=config.s_q, h_q=config.h_q, d_qk=config.d_qk, d_v=config.d_v,
                   page_block_size=config.page_block_size, cache_format=cache_format,
                   num_sms=_C.device_sm_count(_dec._device_index(dev)), varlen_q=True)
    if sparse:
        problem.update(sparse=True, topk=config.topk, extra_topk=config.extra_topk or 0,
                       extra_page_block_size=config.extra_page_block_size or 0)
    else:
        problem.update(h_kv=config.h_k, causal=config.causal,
                       max_blocks_per_seq=int(block_table.shape[1]) if getattr(block_table, "ndim", 0) == 2 else 0)
    sizes = _C.get_decode_workspace_sizes(**problem)
    st = _VarlenStep()
    st.config = config
    st.problem = problem
    st.metadata = torch.empty((sizes["num_sm_parts"], _C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32, device=dev)
    st.splits = torch.empty((sizes["num_splits_ints"],), dtype=torch.int32, device=dev)
    st.partial_o = torch.empty((sizes["partial_rows"], config.d_v), dtype=torch.float32, device=dev)
    st.partial_lse = torch.empty((sizes["partial_rows"],), dtype=torch.float32, device=dev)
    st.counters = torch.empty((max(int(sizes["merge_counter_ints"]), 1),), dtype=torch.int32, device=dev)
    st.lengths = torch.empty((max(int(sizes["varlen_ints"]), 1),), dtype=torch.int32, device=dev)
    _C.plan_decode(None if sparse else cache_seqlens, st.metadata, st.splits, topk_length if sparse else None,
                   extra_topk_length if sparse else None, st.counters, _stream(dev), seqused_q, st.lengths, **problem)
    sched.tile_scheduler_metadata = st.metadata
    sched.num_splits = st.splits
    sched.partial_o = st.partial_o
    sched.partial_lse = st.partial_lse
    sched.merge_counters = st.counters
    sched.workspace_sizes = sizes
    sched.config = config
    sched.have_initialized = True
    sched._varlen = st  # published last
    return st
