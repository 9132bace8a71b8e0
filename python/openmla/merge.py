"""Merging partial attention states: the last step of decode context parallelism (DCP).

Under DCP each rank decodes over its own slice of every request's tokens with :func:`openmla.flash_mla_with_kvcache`
(or sparse decode), which returns per (token, head) row the output normalised by its own softmax sum and that sum's
natural log (lse; ``+inf`` for a row that saw no key). After the ranks' states are all-gathered,
:func:`merge_attn_states` combines them into what one decode over all the tokens returns::

    m = max of the non-empty lse_i;  w_i = exp(lse_i - m);  out = sum_i w_i o_i / sum_i w_i;  lse = m + ln(sum_i w_i)

in fp32. An lse of +inf or -inf marks an empty partial (its output is never read); when every partial is empty the
row is out = 0, lse = +inf, as a decode row without keys. A NaN lse makes its row NaN. Bitwise deterministic.
docs/merge-states.md has the design; docs/integration.md, "Decode context parallelism", the engine's call sequence.
"""
from __future__ import annotations

from . import _openmla as _C
from ._runtime import _torch, is_torch_tensor, require_torch, stream_of

__all__ = ["merge_attn_states"]

if _torch is not None:
    _is_compiling = getattr(getattr(_torch, "compiler", None), "is_compiling", None) or (lambda: False)
else:  # pragma: no cover - depends on the machine
    _is_compiling = None


def merge_attn_states(outs, lses, *, out=None, lse_out=None, out_dtype=None):
    """Merges P partial attention states per (token, head) row into one.

    Args:
      outs: (P, tokens, heads, d_v) bfloat16 / float16 / float32 CUDA tensor (the partial outputs stacked, e.g. the
        result of an all-gather into one tensor), or a list of P (tokens, heads, d_v) tensors (stacked here: one
        copy). P >= 1; d_v a multiple of 8 (512 for MLA); last dim contiguous, other strides multiples of 16 bytes.
      lses: (P, tokens, heads) float32, natural log (flash_mla_with_kvcache's lse, transposed to (tokens, heads)
        rows), or a list of P (tokens, heads) tensors. Any strides. +inf or -inf: that partial is empty.
      out: optional (tokens, heads, d_v) output, written (any of the three dtypes; last dim contiguous).
      lse_out: optional (tokens, heads) float32 output, written.
      out_dtype: the dtype of the allocated ``out`` when ``out`` is None (default: outs' dtype).

    Returns:
      (out, lse_out): out (tokens, heads, d_v); lse_out (tokens, heads) float32, natural log, +inf where every partial
      is empty (out 0 there).

    Raises:
      ValueError: a bad argument (the message names it). RuntimeError: a CUDA error. Never synchronises; capturable
      in a CUDA graph when ``outs``/``lses`` are tensors (not lists) and the outputs are given.
    """
    if isinstance(outs, (list, tuple)):
        outs = _stack(outs, "outs")
    if isinstance(lses, (list, tuple)):
        lses = _stack(lses, "lses")
    if out is not None and out_dtype is not None and out.dtype != out_dtype:
        raise ValueError(f"argument 'out_dtype' is {out_dtype} but argument 'out' has dtype {out.dtype}; pass one")
    if _is_compiling is not None and _is_compiling():  # torch.compile: the registered op (no graph break)
        if out is None and lse_out is None:
            return _torch.ops.openmla.merge_attn_states(outs, lses, out_dtype)
        out, lse_out = _allocate(outs, out, lse_out, out_dtype)
        _torch.ops.openmla.merge_attn_states_out(outs, lses, out=out, lse_out=lse_out)
        return out, lse_out
    out, lse_out = _allocate(outs, out, lse_out, out_dtype)
    if is_torch_tensor(outs) and outs.is_cuda:
        with _torch.cuda.device(outs.device):
            _C.merge_attn_states(outs, lses, out, lse_out, stream_of(outs))
    else:  # host arrays: the C++ API names the argument that is not on a CUDA device
        _C.merge_attn_states(outs, lses, out, lse_out, 0)
    return out, lse_out


def _stack(tensors, name):
    if len(tensors) == 0:
        raise ValueError(f"argument '{name}' is an empty list; merge_attn_states needs at least 1 partial")
    torch = require_torch("merge_attn_states")
    return torch.stack(list(tensors))


def _allocate(outs, out, lse_out, out_dtype):
    """The outputs the caller did not pass, allocated on outs' device (shapes from outs)."""
    if out is not None and lse_out is not None:
        return out, lse_out
    torch = require_torch("merge_attn_states")
    if not isinstance(outs, torch.Tensor) or outs.dim() != 4:
        shape = tuple(outs.shape) if hasattr(outs, "shape") else type(outs).__name__
        raise ValueError(f"argument 'outs' must be a (num_partials, tokens, heads, d_v) tensor or a list of (tokens, "
                         f"heads, d_v) tensors, got {shape}")
    tokens, heads, d_v = (int(s) for s in outs.shape[1:])
    if out is None:
        out = torch.empty((tokens, heads, d_v), dtype=out_dtype or outs.dtype, device=outs.device)
    if lse_out is None:
        lse_out = torch.empty((tokens, heads), dtype=torch.float32, device=outs.device)
    return out, lse_out
