"""Torch fp32 reference of sparse MLA decode (flash_mla_with_kvcache with indices) and its tolerances.

Follows docs/contracts.md sections 9 (reference) and 8 (metric, shared with the dense tests through
dense_decode_ref.check_is_allclose). It runs on the DEQUANTISED cache, so quantisation error
is not part of the comparison: kernel and reference differ only by the kernel's arithmetic. Runs on
whatever device its inputs live on (the GPU tests keep it there; the CPU cross-check runs it on the CPU).
Deliberately plain: rows gathered in chunks, full fp32 matmuls, no online softmax.

Validity of an index slot (the contract of include/openmla/decode.h): the slot lies before the request's
topk_length (clamped to [0, topk]) and its index is a token of the cache, 0 <= index < num_blocks *
page_block_size. -1 is the value flash_mla documents; any other out-of-range value is skipped as well
(an OpenMLA extension; the C++ CPU reference throws on those instead).
"""
from __future__ import annotations

import math

import torch

from dense_decode_ref import check_is_allclose  # flash_mla's metric (docs/contracts.md section 8)

# flash_mla's sparse decode tolerances (docs/contracts.md section 8).
OUT_TOL = dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
LSE_TOL = dict(abs_tol=1e-6, rel_tol=8.01 / 65536)

_CHUNK_BYTES = 1 << 29  # working set of one chunk of query rows (gathered keys, logits)


def valid_slots(indices, topk_length, num_tokens):
    """(b, s_q, topk) bool: the slot is used (before topk_length) and its index is a token of the cache."""
    idx = indices.long()
    valid = (idx >= 0) & (idx < num_tokens)
    if topk_length is not None:
        topk = indices.shape[-1]
        used = topk_length.to(device=indices.device, dtype=torch.long).clamp(0, topk)
        valid &= torch.arange(topk, device=indices.device)[None, None, :] < used[:, None, None]
    return valid


def sparse_decode_ref(q, kv, indices, topk_length=None, attn_sink=None, extra_kv=None, extra_indices=None,
                      extra_topk_length=None, softmax_scale=None, head_dim_v=512):
    """Reference of ``flash_mla_with_kvcache`` in sparse mode.

    q: (b, s_q, h_q, d_qk); kv: (num_blocks, page, 1, d_qk) dequantised cache (bf16 or float; poisoned rows
    may hold NaN: they are never selected); indices: (b, s_q, topk) int; topk_length: (b,) int or None;
    attn_sink: (h_q,) float32 or None; extra_kv / extra_indices / extra_topk_length: the second cache, own
    page size, attended under the same softmax. Returns out (b, s_q, h_q, head_dim_v) in q's dtype (computed
    in fp32, rounded once) and lse (b, h_q, s_q) float32 (natural log, +inf for a row without a valid token,
    whose out is exactly 0 whatever the sink). The sink multiplies out by 1 / (1 + exp(sink - lse)) and
    never changes lse.
    """
    b, s_q, h_q, d_qk = q.shape
    dev = q.device
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    sources = [(kv, indices, topk_length)]
    if extra_kv is not None:
        sources.append((extra_kv, extra_indices, extra_topk_length))
    flat, idx, valid = [], [], []
    for cache, ind, lens in sources:
        tokens = cache.reshape(-1, d_qk)
        ok = valid_slots(ind.to(dev), None if lens is None else lens.to(dev), tokens.shape[0])
        flat.append(tokens)
        idx.append(torch.where(ok, ind.to(device=dev, dtype=torch.long), 0).reshape(b * s_q, -1))
        valid.append(ok.reshape(b * s_q, -1))
    total = sum(i.shape[1] for i in idx)

    rows = b * s_q
    qf = q.reshape(rows, h_q, d_qk).to(torch.float32)
    out = torch.zeros((rows, h_q, head_dim_v), dtype=torch.float32, device=dev)
    lse = torch.full((rows, h_q), math.inf, dtype=torch.float32, device=dev)
    sink = None if attn_sink is None else attn_sink.to(device=dev, dtype=torch.float32)
    per_row = total * (d_qk * 6 + h_q * 12)  # bf16 + fp32 keys, three (h_q, total) fp32 tensors
    chunk = max(1, _CHUNK_BYTES // max(per_row, 1))
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        keys = torch.cat([t[i[r0:r1]] for t, i in zip(flat, idx)], dim=1).to(torch.float32)  # (c, total, d_qk)
        ok = torch.cat([v[r0:r1] for v in valid], dim=1)  # (c, total)
        keys = torch.where(ok[..., None], keys, 0.0)  # skipped slots: no NaN can reach the products
        logits = torch.einsum("chd,ctd->cht", qf[r0:r1], keys) * softmax_scale
        logits = logits.masked_fill(~ok[:, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # (c, h_q); -inf where no slot is valid
        empty = torch.isneginf(row_lse)
        probs = torch.exp(logits - row_lse[..., None]).masked_fill(empty[..., None], 0.0)
        o = torch.einsum("cht,ctv->chv", probs, keys[..., :head_dim_v])
        if sink is not None:
            # 1 / (1 + exp(sink - lse)) = sigmoid(lse - sink): 0 for sink = +inf, 1 for sink = -inf.
            o = o * torch.sigmoid(row_lse - sink[None, :])[..., None]
        out[r0:r1] = torch.where(empty[..., None], 0.0, o)
        lse[r0:r1] = row_lse.masked_fill(empty, math.inf)
    out = out.reshape(b, s_q, h_q, head_dim_v).to(q.dtype)
    lse = lse.reshape(b, s_q, h_q).transpose(1, 2).contiguous()
    return out, lse


def check_sparse_decode(out, lse, ref_out, ref_lse, what=""):
    """Compares a kernel's (out, lse) with the reference's under the sparse decode tolerances."""
    check_is_allclose(f"out{what}", out, ref_out, **OUT_TOL)
    check_is_allclose(f"lse{what}", lse, ref_lse, **LSE_TOL)
