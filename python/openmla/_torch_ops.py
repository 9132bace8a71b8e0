"""OpenMLA's entries as torch custom ops: ``torch.ops.openmla.*``.

Registered through ``torch.library`` when ``openmla`` is imported and torch is importable (building OpenMLA needs
no torch). Each op has a fake (meta) implementation and a schema that declares what it writes, so that
``torch.compile(fullgraph=True)`` traces them without a graph break, CUDA-graph capture works, and
``torch.library.opcheck`` passes. The CUDA implementations are the package's own paths (the decode ops: the tensor
style's, ``decode._plan_metadata`` and ``decode._tensor_style``, the same entry as flash_mla_with_kvcache's); under
``torch.compile`` the package's ``get_mla_metadata`` / ``flash_mla_with_kvcache`` turn into these ops by
themselves (both schedule styles), so engines need not call them directly.

==============================  =====================================================================================
op                              what it is
==============================  =====================================================================================
``get_mla_metadata``            the tensor style of :func:`openmla.get_mla_metadata` -> (tile_scheduler_metadata,
                                num_splits), new tensors
``plan_schedule``               the plan of an object-style schedule (FlashMLASchedMeta) traced by torch.compile:
                                (tile_scheduler_metadata, num_splits) from the call's shapes and lengths
``flash_mla_with_kvcache``      decode with tensor-style metadata -> (out, lse), new tensors
``flash_mla_with_kvcache_out``  the same into the caller's ``out`` and ``lse`` (declared mutated), returns nothing
``quantize_kv_cache``           bf16 cache -> new FP8 cache (``_out``: into ``out``, declared mutated)
``dequantize_kv_cache``         FP8 cache -> new bf16 cache (``_out``: into ``out``, declared mutated)
``append_kv_cache``             new tokens into an FP8 cache (``cache`` declared mutated)
``flash_mla_sparse_fwd``        sparse prefill -> (out, max_logits, lse), new tensors (``_out``: into the caller's
                                three, declared mutated)
``flash_attn_varlen_fwd``       dense MHA prefill forward -> (out, lse), new tensors; differentiable in q, k, v (its
                                autograd formula is ``flash_attn_varlen_bwd``; lse carries no gradient)
``flash_attn_varlen_bwd``       dense MHA prefill backward -> (dq, dk, dv), new tensors
``merge_attn_states``           partial attention states -> (out, lse_out), new tensors (``_out``: into the caller's
                                two, declared mutated)
==============================  =====================================================================================

Only ``flash_attn_varlen_fwd`` is differentiable (``torch.library.register_autograd``), so that
``torch.compile(fullgraph=True)`` traces a training step's forward and backward; under ``torch.compile`` the
package's ``flash_attn_varlen_func`` and its packed variants turn into it. The other ops are inference kernels.
Dispatch through torch adds a few microseconds per call to the package functions' host cost (``host_overhead``
benchmark, op ``torch_op_dense_decode``).
"""
from __future__ import annotations

import torch

from . import _openmla as _C
from . import decode as _decode
from . import kv_cache as _kv_cache
from . import mha as _mha
from . import merge as _merge
from . import prefill as _prefill

NAMESPACE = "openmla"

# The decode arguments shared by the two decode ops (flash_mla_with_kvcache's, with the tensor-style schedule).
_DECODE_ARGS = ("Tensor q, Tensor k_cache, Tensor? block_table, Tensor? cache_seqlens, SymInt head_dim_v, "
                "Tensor tile_scheduler_metadata, Tensor num_splits, float? softmax_scale=None, bool causal=False, "
                "bool is_fp8_kvcache=False, Tensor? indices=None, Tensor? attn_sink=None, Tensor? extra_k_cache=None, "
                "Tensor? extra_indices_in_kvcache=None, Tensor? topk_length=None, Tensor? extra_topk_length=None, "
                "bool batch_invariant=False")

#: Op name -> schema. `Tensor(a!)` marks an argument the op writes.
SCHEMAS = {
    "get_mla_metadata": ("get_mla_metadata(Tensor cache_seqlens, SymInt num_q_tokens_per_head_k, SymInt num_heads_k, "
                         "SymInt? num_heads_q=None, bool is_fp8_kvcache=False, SymInt? topk=None, "
                         "bool batch_invariant=False) -> (Tensor, Tensor)"),
    "plan_schedule": ("plan_schedule(Tensor like, Tensor? cache_seqlens, Tensor? topk_length, Tensor? extra_topk_length, "
                      "SymInt batch, SymInt s_q, SymInt h_q, SymInt h_kv, bool sparse, SymInt topk, SymInt extra_topk, "
                      "bool batch_invariant=False) -> (Tensor, Tensor)"),
    "flash_mla_with_kvcache": f"flash_mla_with_kvcache({_DECODE_ARGS}) -> (Tensor, Tensor)",
    "flash_mla_with_kvcache_out": f"flash_mla_with_kvcache_out({_DECODE_ARGS}, *, Tensor(a!) out, Tensor(b!) lse) -> ()",
    "quantize_kv_cache": "quantize_kv_cache(Tensor kv_bf16, str format='v32') -> Tensor",
    "quantize_kv_cache_out": "quantize_kv_cache_out(Tensor kv_bf16, str format, *, Tensor(a!) out) -> ()",
    "dequantize_kv_cache": "dequantize_kv_cache(Tensor cache, str format='v32') -> Tensor",
    "dequantize_kv_cache_out": "dequantize_kv_cache_out(Tensor cache, str format, *, Tensor(a!) out) -> ()",
    "append_kv_cache": "append_kv_cache(Tensor new_kv, Tensor slots, Tensor(a!) cache, str format='v32') -> ()",
    "flash_mla_sparse_fwd": ("flash_mla_sparse_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, SymInt d_v=512, "
                             "Tensor? attn_sink=None, Tensor? topk_length=None) -> (Tensor, Tensor, Tensor)"),
    "flash_mla_sparse_fwd_out": ("flash_mla_sparse_fwd_out(Tensor q, Tensor kv, Tensor indices, float sm_scale, "
                                 "SymInt d_v=512, Tensor? attn_sink=None, Tensor? topk_length=None, *, Tensor(a!) out, "
                                 "Tensor(b!) max_logits, Tensor(c!) lse) -> ()"),
    "flash_attn_varlen_fwd": ("flash_attn_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_qo, "
                              "Tensor cu_seqlens_kv, SymInt max_seqlen_qo, float? softmax_scale=None, bool causal=False, "
                              "bool deterministic=False) -> (Tensor, Tensor)"),
    "flash_attn_varlen_bwd": ("flash_attn_varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                              "Tensor cu_seqlens_qo, Tensor cu_seqlens_kv, float? softmax_scale=None, bool causal=False, "
                              "bool deterministic=False) -> (Tensor, Tensor, Tensor)"),
    "merge_attn_states": "merge_attn_states(Tensor outs, Tensor lses, ScalarType? out_dtype=None) -> (Tensor, Tensor)",
    "merge_attn_states_out": "merge_attn_states_out(Tensor outs, Tensor lses, *, Tensor(a!) out, Tensor(b!) lse_out) -> ()",
}

# SM count the fake implementations assume for tensors that are not on a CUDA device (meta tensors on a machine
# without a GPU): an H100's. Only the schedule's first dimension (num_sm_parts) depends on it.
_FAKE_SM_COUNT = 132


# ---------------------------------------------------------------------------------------------------------------
# CUDA implementations: the package functions
# ---------------------------------------------------------------------------------------------------------------
def _get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None, is_fp8_kvcache=False,
                      topk=None, batch_invariant=False):
    return _decode.get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache,
                                    topk, batch_invariant)


def _flash_mla_with_kvcache_out(*args, out, lse, **kwargs):
    _decode._tensor_style(*args, out=out, lse=lse, **kwargs)


def _quantize_out(kv_bf16, format, *, out):
    _kv_cache.quantize_kv_cache(kv_bf16, format, out=out)


def _dequantize_out(cache, format, *, out):
    _kv_cache.dequantize_kv_cache(cache, format, out=out)


def _sparse_prefill_out(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, *, out, max_logits,
                        lse):
    _prefill.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out=out,
                                  max_logits=max_logits, lse=lse)


def _mha_fwd(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale=None, causal=False,
             deterministic=False):
    del deterministic  # the backward's (its autograd formula reads it)
    _mha._check_ranks(torch, q, k, v, cu_seqlens_qo, cu_seqlens_kv)
    return _mha._run_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal)


def _mha_bwd(dout, q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv, softmax_scale=None, causal=False,
             deterministic=False):
    _mha._check_ranks(torch, q, k, v, cu_seqlens_qo, cu_seqlens_kv)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    _mha._run_backward(dout, q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv, softmax_scale, causal, deterministic,
                       dq, dk, dv)
    return dq, dk, dv


def _merge_states(outs, lses, out_dtype=None):
    return _merge.merge_attn_states(outs, lses, out_dtype=out_dtype)


def _merge_states_out(outs, lses, *, out, lse_out):
    _merge.merge_attn_states(outs, lses, out=out, lse_out=lse_out)


_IMPLS = {
    "get_mla_metadata": _get_mla_metadata,
    # The tensor style's one path (decode.py): what flash_mla_with_kvcache takes with tensor-style metadata.
    "plan_schedule": _decode._plan_metadata,
    "flash_mla_with_kvcache": _decode._tensor_style,
    "flash_mla_with_kvcache_out": _flash_mla_with_kvcache_out,
    "quantize_kv_cache": _kv_cache.quantize_kv_cache,
    "quantize_kv_cache_out": _quantize_out,
    "dequantize_kv_cache": _kv_cache.dequantize_kv_cache,
    "dequantize_kv_cache_out": _dequantize_out,
    "append_kv_cache": _kv_cache.append_kv_cache,
    "flash_mla_sparse_fwd": _prefill.flash_mla_sparse_fwd,
    "flash_mla_sparse_fwd_out": _sparse_prefill_out,
    "flash_attn_varlen_fwd": _mha_fwd,
    "flash_attn_varlen_bwd": _mha_bwd,
    "merge_attn_states": _merge_states,
    "merge_attn_states_out": _merge_states_out,
}


# ---------------------------------------------------------------------------------------------------------------
# Fake (meta) implementations: shapes, dtypes, strides and devices of the results, without running anything
# ---------------------------------------------------------------------------------------------------------------
def _num_sm_parts(device, s_q, h_q, h_kv, sparse) -> int:
    """The schedule's partition count on `device` (it depends on the head geometry and the SM count only)."""
    sms = _FAKE_SM_COUNT
    if device.type == "cuda":
        try:
            sms = _C.device_sm_count(device.index if device.index is not None else torch.cuda.current_device())
        except RuntimeError:  # fake CUDA tensors on a machine without a usable GPU: nothing will run
            pass
    family = dict(sparse=True, topk=1) if sparse else dict(h_kv=int(h_kv))  # each family's own fields
    sizes = _C.get_decode_workspace_sizes(batch=1, s_q=int(s_q), h_q=int(h_q), num_sms=sms, **family)
    return int(sizes["num_sm_parts"])


def _new_schedule(like, batch, parts):
    return (like.new_empty((parts, _C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32),
            like.new_empty((batch + 1,), dtype=torch.int32))


def _fake_get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                           is_fp8_kvcache=False, topk=None, batch_invariant=False):
    b, s_q, h_q, h_kv, sparse, _ = _decode._metadata_problem(
        cache_seqlens, int(num_q_tokens_per_head_k), int(num_heads_k), None if num_heads_q is None else int(num_heads_q),
        is_fp8_kvcache, None if topk is None else int(topk))
    return _new_schedule(cache_seqlens, cache_seqlens.shape[0], _num_sm_parts(cache_seqlens.device, s_q, h_q, h_kv,
                                                                              sparse))


def _fake_plan_schedule(like, cache_seqlens, topk_length, extra_topk_length, batch, s_q, h_q, h_kv, sparse, topk,
                        extra_topk, batch_invariant=False):
    return _new_schedule(like, batch, _num_sm_parts(like.device, s_q, h_q, h_kv, sparse))


def _fake_decode_outputs(q, head_dim_v):
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    out = q.new_empty((b, s_q, h_q, head_dim_v))
    # flash_mla's lse layout: a transposed view of (b, s_q, h_q) storage.
    lse = q.new_empty((b, s_q, h_q), dtype=torch.float32).transpose(1, 2)
    return out, lse


def _fake_flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, *args, **kwargs):
    return _fake_decode_outputs(q, head_dim_v)


def _fake_flash_mla_with_kvcache_out(*args, out, lse, **kwargs):
    return None


def _fake_quantize(kv_bf16, format="v32"):
    num_blocks, page_size = kv_bf16.shape[0], kv_bf16.shape[1]
    bpt = _kv_cache.bytes_per_token(format)
    stride = -(-page_size * bpt // 16) * 16  # the real function's default: pages rounded up to 16 bytes
    return torch.empty_strided((num_blocks, page_size, 1, bpt), (stride, bpt, bpt, 1), dtype=torch.uint8,
                               device=kv_bf16.device)


def _fake_dequantize(cache, format="v32"):
    return cache.new_empty((cache.shape[0], cache.shape[1], 1, _kv_cache.head_dim(format)), dtype=torch.bfloat16)


def _fake_sparse_prefill(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    s_q, h_q = q.shape[0], q.shape[1]
    return (q.new_empty((s_q, h_q, d_v)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


def _fake_mha_fwd(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale=None, causal=False,
                  deterministic=False):
    total_q, h_q = q.shape[0], q.shape[1]
    # The real outputs' layouts: out packed, lse the transpose of a (h_q, total_q) tensor (flash_mla's).
    return q.new_empty((total_q, h_q, v.shape[2])), q.new_empty((h_q, total_q), dtype=torch.float32).t()


def _fake_mha_bwd(dout, q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv, softmax_scale=None, causal=False,
                  deterministic=False):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _fake_merge_states(outs, lses, out_dtype=None):
    tokens, heads, d_v = outs.shape[1], outs.shape[2], outs.shape[3]
    return (outs.new_empty((tokens, heads, d_v), dtype=out_dtype or outs.dtype),
            outs.new_empty((tokens, heads), dtype=torch.float32))


def _fake_nothing(*args, **kwargs):
    return None


_FAKES = {
    "get_mla_metadata": _fake_get_mla_metadata,
    "plan_schedule": _fake_plan_schedule,
    "flash_mla_with_kvcache": _fake_flash_mla_with_kvcache,
    "flash_mla_with_kvcache_out": _fake_flash_mla_with_kvcache_out,
    "quantize_kv_cache": _fake_quantize,
    "quantize_kv_cache_out": _fake_nothing,
    "dequantize_kv_cache": _fake_dequantize,
    "dequantize_kv_cache_out": _fake_nothing,
    "append_kv_cache": _fake_nothing,
    "flash_mla_sparse_fwd": _fake_sparse_prefill,
    "flash_mla_sparse_fwd_out": _fake_nothing,
    "flash_attn_varlen_fwd": _fake_mha_fwd,
    "flash_attn_varlen_bwd": _fake_mha_bwd,
    "merge_attn_states": _fake_merge_states,
    "merge_attn_states_out": _fake_nothing,
}


# ---------------------------------------------------------------------------------------------------------------
# Autograd of flash_attn_varlen_fwd: the backward op (lse carries no gradient: docs/contracts.md section 7)
# ---------------------------------------------------------------------------------------------------------------
def _mha_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_qo, cu_seqlens_kv, _, softmax_scale, causal, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv)
    ctx.options = (softmax_scale, causal, deterministic)
    ctx.mark_non_differentiable(lse)


def _mha_backward(ctx, dout, dlse):
    del dlse
    q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv = ctx.saved_tensors
    softmax_scale, causal, deterministic = ctx.options
    dq, dk, dv = torch.ops.openmla.flash_attn_varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv,
                                                         softmax_scale, causal, deterministic)
    return dq, dk, dv, None, None, None, None, None, None


# name -> (backward, setup_context) of the differentiable ops.
_AUTOGRAD = {"flash_attn_varlen_fwd": (_mha_backward, _mha_setup_context)}


def _register():
    """Defines the ops once per process (a second copy of the package, or a reload, finds them defined)."""
    namespace = getattr(torch.ops, NAMESPACE)
    if all(hasattr(namespace, name) for name in SCHEMAS):
        return None
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    for name, schema in SCHEMAS.items():
        library.define(schema)
        library.impl(name, _IMPLS[name], "CUDA")
        register_fake(f"{NAMESPACE}::{name}", _FAKES[name], lib=library)
    for name, (backward, setup_context) in _AUTOGRAD.items():
        torch.library.register_autograd(f"{NAMESPACE}::{name}", backward, setup_context=setup_context, lib=library)
    return library


# The Library object must live as long as the registrations.
_LIBRARY = _register()
