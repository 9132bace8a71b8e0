"""Torch fp32 reference of sparse MLA prefill (flash_mla_sparse_fwd) and its tolerances.

The contract is include/openmla/prefill.h: a slot of token t is valid when it lies before topk_length[t]
(clamped to [0, topk]; all slots without topk_length) and its index is a row of kv, 0 <= index < s_kv; any other
value is invalid and never read. logits = sm_scale * q.k over the valid slots; max_logits = their max (-inf if
none); lse = natural log of the sum of their exp (+inf if none, whose out is exactly 0); the sink divides out by
(1 + exp(sink - lse)) and never changes lse or max_logits.

Deliberately plain: query tokens in chunks, full fp32 matmuls (no TF32), no online softmax. Runs on whatever device
its inputs live on.
"""
from __future__ import annotations

import math

import torch

from dense_decode_ref import check_is_allclose  # flash_mla's metric (docs: tolerances), shared with decode

OUT_TOL = dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
STAT_TOL = dict(abs_tol=1e-6, rel_tol=8.01 / 65536)

_CHUNK_BYTES = 1 << 30  # working set of one chunk of query tokens (gathered keys, logits)


def valid_slots(indices, topk_length, s_kv):
    """(s_q, topk) bool: the slot is used (before topk_length) and its index is a row of kv."""
    idx = indices.long()
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        topk = indices.shape[-1]
        used = topk_length.to(device=indices.device, dtype=torch.long).clamp(0, topk)
        valid &= torch.arange(topk, device=indices.device)[None, :] < used[:, None]
    return valid


def sparse_prefill_ref(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, rows=None):
    """Reference of ``flash_mla_sparse_fwd``: q (s_q, h_q, d_qk), kv (s_kv, 1, d_qk) (rows nobody selects may
    hold NaN), indices (s_q, 1, topk) int, topk_length (s_q,) int or None, attn_sink (h_q,) float32 or None.
    ``rows``: optional 1-D tensor of token numbers to compute (the others are not returned).
    Returns out (n, h_q, d_v), max_logits and lse (n, h_q), all float32 (the kernel's bf16 out is compared
    with the unrounded fp32 values)."""
    s_q, h_q, d_qk = q.shape
    s_kv = kv.shape[0]
    dev = q.device
    idx_all = indices[:, 0, :].to(dev)
    lens = None if topk_length is None else topk_length.to(dev)
    if rows is None:
        rows = torch.arange(s_q, device=dev)
    rows = rows.to(dev)
    n = rows.numel()
    topk = idx_all.shape[-1]
    keys_flat = kv[:, 0, :]
    out = torch.zeros((n, h_q, d_v), dtype=torch.float32, device=dev)
    lse = torch.full((n, h_q), math.inf, dtype=torch.float32, device=dev)
    mx = torch.full((n, h_q), -math.inf, dtype=torch.float32, device=dev)
    sink = None if attn_sink is None else attn_sink.to(device=dev, dtype=torch.float32)
    per_row = topk * (d_qk * 6 + h_q * 12)
    chunk = max(1, _CHUNK_BYTES // max(per_row, 1))
    for r0 in range(0, n, chunk):
        r = rows[r0:r0 + chunk]
        ind = idx_all[r]
        ok = valid_slots(ind, None if lens is None else lens[r], s_kv)
        keys = keys_flat[torch.where(ok, ind.long(), 0)].to(torch.float32)  # (c, topk, d_qk)
        keys = torch.where(ok[..., None], keys, 0.0)  # invalid slots: no NaN can reach the products
        logits = torch.einsum("chd,ctd->cht", q[r].to(torch.float32), keys) * sm_scale
        logits = logits.masked_fill(~ok[:, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        empty = torch.isneginf(row_lse)
        probs = torch.exp(logits - row_lse[..., None]).masked_fill(empty[..., None], 0.0)
        o = torch.einsum("cht,ctv->chv", probs, keys[..., :d_v])
        if sink is not None:
            o = o * torch.sigmoid(row_lse - sink[None, :])[..., None]  # 1 / (1 + exp(sink - lse))
        out[r0:r0 + chunk] = torch.where(empty[..., None], 0.0, o)
        lse[r0:r0 + chunk] = row_lse.masked_fill(empty, math.inf)
        mx[r0:r0 + chunk] = logits.amax(dim=-1)
    return out, mx, lse


def check_sparse_prefill(out, max_logits, lse, ref, what="", stat_abs_tol=None):
    """Compares a kernel's results with the reference's (out, max_logits, lse) under the tolerances above
    (`stat_abs_tol` replaces the absolute tolerance of max_logits and lse)."""
    ref_out, ref_mx, ref_lse = ref
    stat = dict(STAT_TOL) if stat_abs_tol is None else dict(STAT_TOL, abs_tol=stat_abs_tol)
    check_is_allclose(f"out{what}", out.to(torch.float32), ref_out, **OUT_TOL)
    check_is_allclose(f"max_logits{what}", max_logits, ref_mx, **stat)
    check_is_allclose(f"lse{what}", lse, ref_lse, **stat)
