"""Dense MHA prefill with DeepSeek ``flash_mla``'s Python interface: ``flash_attn_varlen_func`` and its packed variants.

In MLA serving, prompt tokens run as ordinary multi-head attention once the latent is expanded: d_qk = 192 (128 NoPE +
64 RoPE), d_v = 128. ``flash_mla`` ships this kernel for Blackwell only; OpenMLA's is for Hopper (sm_90a)::

    import openmla as flash_mla
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                                                causal=True)

Status: the forward is implemented and verified on an H100 (docs/mha-prefill.md, "Status");
``openmla.query_capability("dense_prefill")`` says whether it runs here, with the reason when not.

Differentiable: when q, k or v require grad (and grad mode is on), the functions run under autograd and
``out.backward(dout)`` computes dq, dk, dv with the backward kernel (include/openmla/prefill.h, mha_prefill_bwd).
``lse`` is returned as a value that carries no gradient (it is marked non-differentiable). ``deterministic=True`` makes
the backward add dq's partial sums in a fixed order, so the gradients are bitwise identical from run to run. Under
``torch.compile`` the functions become the custom ops ``torch.ops.openmla.flash_attn_varlen_fwd`` / ``_bwd``
(python/openmla/_torch_ops.py), whose registered autograd formula traces the backward too.

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
    _is_compiling = getattr(getattr(_torch, "compiler", None), "is_compiling", None) or (lambda: False)
else:  # pragma: no cover - depends on the machine
    _IN_PLACE = False
    _plain_torch = contextlib.nullcontext
    _is_compiling = lambda: False  # noqa: E731

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


def _is_fp8(t):
    f8 = getattr(_torch, "float8_e4m3fn", None)
    return f8 is not None and getattr(t, "dtype", None) == f8


def _forward(what, q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal, deterministic, out,
             lse, packed=None, fp8=None):
    """The three functions' one path. `packed`: (kind, d_qk, sources) when q, k, v are views of the caller's packed
    tensors ("qkv": (qkv,), "kv": (q, kv)), so that the backward returns one gradient per packed tensor. `fp8`:
    (q_descale, k_descale, v_descale, out_dtype) when any of them was given (None: none was; FP8 inputs are then
    recognised by q's dtype)."""
    if _is_compiling():  # torch.compile: the registered ops (no graph break; their autograd formula is registered)
        if fp8 is None and not _is_fp8(q):
            return _traced_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal,
                                   deterministic, out, lse)
    elif _IN_PLACE and fp8 is None:  # the per-call entry (None for FP8 inputs); None when the checks must name an error
        if _torch.is_grad_enabled():
            with _plain_torch():
                needs_grad = any(getattr(t, "requires_grad", False) for t in (q, k, v))
        else:
            needs_grad = False
        if not needs_grad:
            try:
                res = _C.mha_prefill_call(q, k, v, cu_seqlens_qo, cu_seqlens_kv, int(max_seqlen_qo),
                                          0.0 if softmax_scale is None else float(softmax_scale), bool(causal), out,
                                          lse)
            except (RuntimeError, ValueError):
                # torch cannot export a meta tensor (the checks below name it), and a float8 tensor may come in a
                # DLPack dtype the per-call entry does not read (the general path takes FP8 inputs); anything else
                # raises.
                if not (_is_fp8(q) or any(getattr(t, "is_meta", False)
                                          for t in (q, k, v, cu_seqlens_qo, cu_seqlens_kv, out, lse))):
                    raise
                res = None
            if res is not None:
                return res
    torch = require_torch(what)
    _check_ranks(torch, q, k, v, cu_seqlens_qo, cu_seqlens_kv)
    _refuse_meta_tensors(what, q=q, k=k, v=v, cu_seqlens_qo=cu_seqlens_qo, cu_seqlens_kv=cu_seqlens_kv, out=out,
                         lse=lse)
    if fp8 is not None and not _is_fp8(q) and all(d is None for d in fp8[:3]):
        if fp8[3] != q.dtype:  # out_dtype alone, with 16-bit inputs
            raise ValueError(f"argument 'out_dtype' is {fp8[3]}; only float8_e4m3fn inputs take an output dtype other "
                             f"than q's ({q.dtype})")
        fp8 = None
    if fp8 is not None or _is_fp8(q):
        # FP8 inputs (or descales given, which the C++ API refuses for 16-bit inputs): forward only.
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError(f"openmla.{what}: float8_e4m3fn inputs are forward-only (there is no FP8 "
                                      "backward): call it under torch.no_grad() or pass detached q, k, v")
        q_descale, k_descale, v_descale, out_dtype = fp8 if fp8 is not None else (None, None, None, None)
        return _run_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal, out, lse,
                            descales=(q_descale, k_descale, v_descale), out_dtype=out_dtype)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        _refuse_outputs_under_autograd(what, out, lse)
        kind, d_qk, sources = packed if packed is not None else ("separate", 0, (q, k, v))
        sources = tuple(sources) + (None,) * (3 - len(sources))
        return _VarlenAttention.apply(kind, d_qk, *sources, cu_seqlens_qo, cu_seqlens_kv, int(max_seqlen_qo),
                                      softmax_scale, bool(causal), bool(deterministic))
    return _run_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal, out, lse)


def _check_ranks(torch, q, k, v, cu_seqlens_qo, cu_seqlens_kv):
    """torch tensors of the ranks the binding reads (the C++ API checks everything else)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"argument '{name}' must be a 3-dimensional torch.Tensor (total, heads, head_dim), got {shape}")
    for name, t in (("cu_seqlens_qo", cu_seqlens_qo), ("cu_seqlens_kv", cu_seqlens_kv)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] < 2:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"argument '{name}' must be a (batch + 1,) int32 torch.Tensor with batch >= 1, got {shape}")


def _refuse_meta_tensors(what, **tensors):
    """Meta tensors carry no data: outside torch.compile (where the ops' fake implementations take them) they are a
    caller error, named here because the binding cannot even read them."""
    for name, t in tensors.items():
        if getattr(t, "is_meta", False):
            raise ValueError(f"argument '{name}' is a meta tensor; openmla.{what} runs on CUDA tensors (meta tensors "
                             "are traced by torch.compile through torch.ops.openmla.flash_attn_varlen_fwd)")


def _refuse_outputs_under_autograd(what, out, lse):
    for name, t in (("out", out), ("lse", lse)):
        if t is not None:
            raise ValueError(f"argument '{name}': openmla.{what} allocates its outputs when q, k or v require grad "
                             f"(caller-owned outputs are for inference: call it under torch.no_grad(), or leave "
                             f"'{name}' out)")


def _problem_dtype(torch, q):
    # problem.dtype follows q; a q of another dtype is named by the C++ check of q.
    return "float16" if q.dtype == torch.float16 else "bfloat16"


def _descale_tensor(torch, x, name, device):
    """A descale as the binding takes it: None, a float32 tensor (any shape: the C++ API checks it), or a Python
    number (one value for every sequence and kv head)."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return torch.full((1,), float(x), dtype=torch.float32, device=device)
    raise ValueError(f"argument '{name}' must be a float32 torch.Tensor of shape (batch, h_kv), a single-value "
                     f"tensor or a number, got {type(x).__name__}")


def _byte_view(t):
    """An FP8 operand as its uint8 view (DLPack exports without a float8 dtype; the binding reads the bytes as e4m3)."""
    return t.view(_torch.uint8) if _is_fp8(t) else t


def _run_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal, out=None, lse=None,
                 descales=(None, None, None), out_dtype=None):
    """The forward through the DLPack binding (torch tensors of the right ranks); allocates what is not given."""
    torch = _torch
    total_q, h_q, d_qk = (int(x) for x in q.shape)
    h_kv, d_v = int(k.shape[1]), int(v.shape[2])
    batch = int(cu_seqlens_qo.shape[0]) - 1
    fp8 = _is_fp8(q)
    if fp8:
        if out_dtype is None:
            out_dtype = out.dtype if out is not None else torch.bfloat16
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"argument 'out_dtype' is {out_dtype}; the output of float8_e4m3fn inputs is "
                             "torch.bfloat16 or torch.float16")
        dtype = "float8_e4m3fn"
    else:
        if out_dtype is not None and out_dtype != q.dtype:
            raise ValueError(f"argument 'out_dtype' is {out_dtype}; only float8_e4m3fn inputs take an output dtype "
                             f"other than q's ({q.dtype})")
        out_dtype = q.dtype
        dtype = _problem_dtype(torch, q)
    problem = dict(batch=batch, h_q=h_q, h_kv=h_kv, d_qk=d_qk, d_v=d_v, dtype=dtype, causal=bool(causal),
                   max_seqlen_qo=int(max_seqlen_qo))
    extra = {}
    if any(d is not None for d in descales):
        extra = {name: _descale_tensor(torch, d, name, q.device)
                 for name, d in zip(("q_descale", "k_descale", "v_descale"), descales)}
    if fp8:
        q, k, v = _byte_view(q), _byte_view(k), _byte_view(v)
    if out is None:
        out = torch.empty((total_q, h_q, d_v), dtype=out_dtype, device=q.device)
    if lse is None:
        # flash_mla's layout: the transpose of a (h_q, total_q) tensor, contiguous along the tokens.
        lse = torch.empty((h_q, total_q), dtype=torch.float32, device=q.device).t()
    # The tile counter: a fresh allocation per call (torch's caching allocator makes it cheap), so calls on different
    # streams never share one.
    workspace = torch.empty(_C.get_mha_prefill_workspace_size(**problem), dtype=torch.uint8, device=q.device)
    _C.mha_prefill(q, k, v, cu_seqlens_qo, cu_seqlens_kv, workspace, out, lse,
                   softmax_scale=0.0 if softmax_scale is None else float(softmax_scale), stream=stream_of(q), **problem,
                   **extra)
    return out, lse


def _rows_operand(t):
    """`t` itself when the backward can read it as it is (last dim contiguous, the other strides positive multiples of
    8 elements, 16-byte aligned: include/openmla/prefill.h), else a packed copy. Incoming gradients need not have
    such strides (out.sum() hands back an expanded tensor of stride 0)."""
    shape, stride = t.shape, t.stride()
    ok = (shape[-1] <= 1 or stride[-1] == 1) and t.data_ptr() % 16 == 0 and all(
        n <= 1 or (st > 0 and st % 8 == 0) for n, st in zip(shape[:-1], stride[:-1]))
    return t if ok else t.clone(memory_format=_torch.contiguous_format)


def _run_backward(dout, q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv, softmax_scale, causal, deterministic, dq, dk,
                  dv):
    """dq, dk, dv (written) of sum(out * dout), through the DLPack binding; the workspace is allocated here."""
    torch = _torch
    total_q, h_q, d_qk = (int(x) for x in q.shape)
    problem = dict(batch=int(cu_seqlens_qo.shape[0]) - 1, total_q=total_q, h_q=h_q, h_kv=int(k.shape[1]), d_qk=d_qk,
                   d_v=int(v.shape[2]), dtype=_problem_dtype(torch, q), causal=bool(causal),
                   deterministic=bool(deterministic))
    workspace = torch.empty(_C.get_mha_prefill_bwd_workspace_size(**problem), dtype=torch.uint8, device=q.device)
    _C.mha_prefill_bwd(q, k, v, out, _rows_operand(dout), lse, cu_seqlens_qo, cu_seqlens_kv, workspace, dq, dk, dv,
                       softmax_scale=0.0 if softmax_scale is None else float(softmax_scale), stream=stream_of(q),
                       **problem)


def _split_packed(kind, d_qk, a, b, c):
    """(q, k, v) views of the sources of _VarlenAttention (see _forward's `packed`)."""
    if kind == "qkv":
        return a[..., :d_qk], a[..., d_qk:2 * d_qk], a[..., 2 * d_qk:]
    if kind == "kv":
        return a, b[..., :d_qk], b[..., d_qk:]
    return a, b, c


if _torch is not None:

    class _VarlenAttention(_torch.autograd.Function):
        """flash_attn_varlen_func under autograd (eager). The differentiable inputs are the caller's tensors: q, k, v,
        or the packed qkv / kv, whose gradient the backward returns as one tensor. lse is marked non-differentiable:
        a gradient reaching it is ignored (docs/contracts.md section 7)."""

        @staticmethod
        def forward(ctx, kind, d_qk, a, b, c, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal,
                    deterministic):
            q, k, v = _split_packed(kind, d_qk, a, b, c)
            out, lse = _run_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal)
            ctx.save_for_backward(a, b, c, out, lse, cu_seqlens_qo, cu_seqlens_kv)
            ctx.options = (kind, d_qk, softmax_scale, causal, deterministic)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            del dlse  # lse carries no gradient
            a, b, c, out, lse, cu_seqlens_qo, cu_seqlens_kv = ctx.saved_tensors
            kind, d_qk, softmax_scale, causal, deterministic = ctx.options
            q, k, v = _split_packed(kind, d_qk, a, b, c)
            dq, dk, dv = (_torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
            _run_backward(dout, q, k, v, out, lse, cu_seqlens_qo, cu_seqlens_kv, softmax_scale, causal, deterministic,
                          dq, dk, dv)
            # A packed input's gradient is assembled once (one concatenation; the C++ API refuses interleaved views of
            # one output, whose byte ranges overlap), rather than by autograd's slice gradients (a zero-filled tensor
            # per view, then their sum).
            wanted = ctx.needs_input_grad[2:5]
            if kind == "qkv":
                grads = (_torch.cat([dq, dk, dv], dim=-1) if wanted[0] else None, None, None)
            elif kind == "kv":
                grads = (dq, _torch.cat([dk, dv], dim=-1) if wanted[1] else None, None)
            else:
                grads = (dq, dk, dv)
            return (None, None) + tuple(g if w else None for g, w in zip(grads, wanted)) + (None,) * 6


def _traced_forward(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale, causal, deterministic, out,
                    lse):
    """flash_attn_varlen_func as torch.compile traces it: the forward op, whose registered autograd formula is the
    backward op. Caller-owned outputs receive a copy (no grad) or are refused (grad), as in eager mode."""
    torch = _torch
    _check_ranks(torch, q, k, v, cu_seqlens_qo, cu_seqlens_kv)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        _refuse_outputs_under_autograd("flash_attn_varlen_func", out, lse)
    res = torch.ops.openmla.flash_attn_varlen_fwd(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                                                  None if softmax_scale is None else float(softmax_scale),
                                                  bool(causal), bool(deterministic))
    if out is None and lse is None:
        return res
    if out is not None:
        out.copy_(res[0])
    if lse is not None:
        lse.copy_(res[1])
    return (res[0] if out is None else out), (res[1] if lse is None else lse)


def _fp8_options(q_descale, k_descale, v_descale, out_dtype):
    """_forward's `fp8`: None when no FP8 option was given (the fast path stays open)."""
    if q_descale is None and k_descale is None and v_descale is None and out_dtype is None:
        return None
    return (q_descale, k_descale, v_descale, out_dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p=0.0,
                           softmax_scale=None, causal=False, deterministic=False, is_varlen=True, *, out=None,
                           lse=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
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
      deterministic: the backward's choice: True adds dq's partial sums in a fixed order, so dq, dk, dv are bitwise
        identical from run to run (dk and dv always are); False (default) lets them arrive in any order. The forward
        is always bitwise deterministic (no atomics in its arithmetic).
      is_varlen: accepted either way (the kernel always reads the cumulative lengths).
      out, lse: optional caller-owned outputs of the shapes below (written in place and returned); lse any strides.
        Inference only: with inputs that require grad they must be left out (ValueError).

    Returns:
      (out, lse): out (total_q, h_q, d_v) in q's dtype; lse (total_q, h_q) float32, natural log of the sum of
      exp(scaled logits), allocated as the transpose of a (h_q, total_q) tensor as flash_mla does. A query row that
      sees no key gets out = 0 and lse = +inf. Rows past cu_seqlens_qo[batch] are not written.

    Autograd: when grad mode is on and q, k or v requires grad, out is differentiable: the backward kernel returns
    the gradients of sum(out * dout) for q, k and v (GQA: a kv head's gradient sums its query heads; a row that sees
    no key gets dq = 0, a key that no row sees dk = dv = 0). lse carries no gradient (non-differentiable).

    FP8 (FlashAttention-3's FP8 API; forward only): q, k, v torch.float8_e4m3fn (strides multiples of 16 elements),
    with q_descale, k_descale, v_descale: float32 tensors of shape (batch, h_kv) (the true values are q * q_descale
    etc. per sequence and kv head), single-value tensors or numbers; None means 1. out is torch.bfloat16 unless
    out_dtype (or the given out) says torch.float16; lse as above. Both GEMMs run in FP8 on the tensor cores and P is
    quantised to e4m3 for P V (docs/fp8-prefill-design.md gives the error against an fp32 reference). Inputs that
    require grad raise NotImplementedError; under torch.compile an FP8 call runs eagerly (a graph break).

    Raises:
      ValueError: a bad argument (the message names it). NotImplementedError: an unsupported shape or the family not
      built. RuntimeError: a CUDA error.
    """
    del max_seqlen_kv, is_varlen
    _check_options(dropout_p, softmax_scale, max_seqlen_qo)
    return _forward("flash_attn_varlen_func", q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, softmax_scale,
                    causal, deterministic, out, lse, fp8=_fp8_options(q_descale, k_descale, v_descale, out_dtype))


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
                                     causal=False, deterministic=False, is_varlen=True, *, out=None, lse=None,
                                     q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """flash_attn_varlen_func on one packed tensor: qkv (total, h, 2 * head_dim_qk + d_v) is split along its last
    dimension into q | k | v (views, no copy); h_q = h_kv = h, and cu_seqlens serves queries and keys. Differentiable
    through qkv (its gradient is assembled as one tensor). A float8_e4m3fn qkv takes the FP8 forward (descales and
    out_dtype as flash_attn_varlen_func's; the row stride must be a multiple of 16 elements)."""
    del is_varlen
    d_qk = _head_dim(head_dim_qk)
    _check_options(dropout_p, softmax_scale, max_seqlen, "max_seqlen")
    width = int(qkv.shape[-1]) if hasattr(qkv, "shape") and len(qkv.shape) == 3 else 0
    q, k, v = _split_last(qkv, "qkv", (d_qk, d_qk, width - 2 * d_qk), "flash_attn_varlen_qkvpacked_func")
    return _forward("flash_attn_varlen_qkvpacked_func", q, k, v, cu_seqlens, cu_seqlens, max_seqlen, softmax_scale,
                    causal, deterministic, out, lse, packed=("qkv", d_qk, (qkv,)),
                    fp8=_fp8_options(q_descale, k_descale, v_descale, out_dtype))


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, head_dim_qk,
                                    dropout_p=0.0, softmax_scale=None, causal=False, deterministic=False,
                                    is_varlen=True, *, out=None, lse=None, q_descale=None, k_descale=None,
                                    v_descale=None, out_dtype=None):
    """flash_attn_varlen_func with keys and values in one tensor: kv (total_k, h_kv, head_dim_qk + d_v) is split along
    its last dimension into k | v (views, no copy). Differentiable through q and kv (kv's gradient is assembled as one
    tensor). float8_e4m3fn q and kv take the FP8 forward (descales and out_dtype as flash_attn_varlen_func's)."""
    del max_seqlen_kv, is_varlen
    d_qk = _head_dim(head_dim_qk)
    _check_options(dropout_p, softmax_scale, max_seqlen_qo)
    width = int(kv.shape[-1]) if hasattr(kv, "shape") and len(kv.shape) == 3 else 0
    k, v = _split_last(kv, "kv", (d_qk, width - d_qk), "flash_attn_varlen_kvpacked_func")
    return _forward("flash_attn_varlen_kvpacked_func", q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                    softmax_scale, causal, deterministic, out, lse, packed=("kv", d_qk, (q, kv)),
                    fp8=_fp8_options(q_descale, k_descale, v_descale, out_dtype))
