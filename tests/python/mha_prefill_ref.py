"""Torch fp32 reference of dense varlen MHA prefill (flash_attn_varlen_func) and its tolerances.

The contract is include/openmla/prefill.h (docs/contracts.md section 7): sequence i owns query rows
[cu_q[i], cu_q[i + 1]) and key rows [cu_k[i], cu_k[i + 1]); query row t (within the sequence) of head h sees key j
when not causal, or when j <= t + s_k - s_q (bottom-right); head h reads kv head h // (h_q // h_kv). out = softmax(z) v
with z = scale q.k; lse = logsumexp(z) (natural log); a row that sees no key gets out = 0 and lse = +inf.

Deliberately plain: per sequence and chunk of rows, all heads at once (the kv heads expanded), full fp32 matmuls
(TF32 off, set by the tests), no online softmax. Runs on whatever device its inputs live on.
"""
from __future__ import annotations

import math

import torch

from dense_decode_ref import check_is_allclose  # flash_mla's metric (docs/contracts.md section 8)

# flash_mla's tolerances (docs/contracts.md section 8): out abs / rel / cosine, lse abs / rel. The absolute lse
# tolerance is 1e-5 rather than flash_mla's 1e-6: with q, k ~ N(0, 1) the logits are N(0, 1) but each is a sum of
# d_qk products whose magnitudes add up to ~0.64 sqrt(d_qk) ~ 9 (scaled), so the fp32 rounding of the tensor cores'
# accumulation, in another order than the reference's, is ~1e-6 absolute; a row that sees one key has lse = its
# logit, which can be ~0, where the relative tolerance does not help. flash_mla's own tests keep lse away from 0
# (every row sees >= 20 keys of logits ~0.01). Large logits (q x s) scale it by s.
OUT_TOL = dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
LSE_TOL = dict(abs_tol=1e-5, rel_tol=8.01 / 65536)

_CHUNK_ELEMS = 1 << 27  # logits per chunk (512 MB of fp32)


def mha_prefill_ref(q, k, v, cu_q, cu_k, softmax_scale, causal, rows=None):
    """Reference of ``flash_attn_varlen_func`` for rows inside sequences.

    q (total_q, h_q, d_qk), k (total_k, h_kv, d_qk), v (total_k, h_kv, d_v); cu_q, cu_k: sequences of ints (host).
    ``rows``: optional list of query rows (of q) to compute; default every row inside a sequence. Rows outside every
    sequence are skipped. Returns (rows, out (n, h_q, d_v) float32, lse (n, h_q) float32) where `rows` is the list of
    query rows computed, in sequence order (the kernel's bf16 out is compared with the unrounded fp32 values).
    """
    h_q, h_kv = q.shape[1], k.shape[1]
    d_v = v.shape[2]
    kv_head = torch.arange(h_q, device=q.device) // (h_q // h_kv)  # head h reads kv head h // (h_q // h_kv)
    wanted = None if rows is None else set(int(r) for r in rows)
    out_rows, outs, lses = [], [], []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        s_q, s_k = q1 - q0, k1 - k0
        local = [t for t in range(s_q) if wanted is None or q0 + t in wanted]
        if not local:
            continue
        idx = torch.tensor(local, device=q.device, dtype=torch.long)
        out = torch.zeros((len(local), h_q, d_v), dtype=torch.float32, device=q.device)
        lse = torch.full((len(local), h_q), math.inf, dtype=torch.float32, device=q.device)
        if s_k > 0:
            kk = k[k0:k1].float()[:, kv_head, :]  # (s_k, h_q, d_qk)
            vv = v[k0:k1].float()[:, kv_head, :]  # (s_k, h_q, d_v)
            key = torch.arange(s_k, device=q.device)
            row_chunk = max(1, _CHUNK_ELEMS // max(1, s_k * h_q))
            for r0 in range(0, len(local), row_chunk):
                ridx = idx[r0:r0 + row_chunk]
                z = torch.einsum("nhd,shd->hns", q[q0 + ridx].float(), kk) * softmax_scale  # (h_q, n, s_k)
                if causal:
                    visible = key[None, :] <= (ridx[:, None] + s_k - s_q)  # (n, s_k)
                    z = z.masked_fill(~visible[None], -math.inf)
                row_lse = torch.logsumexp(z, dim=-1)  # (h_q, n)
                empty = torch.isneginf(row_lse)
                p = torch.exp(z - row_lse[..., None]).masked_fill(empty[..., None], 0.0)
                o = torch.einsum("hns,shd->nhd", p, vv)
                out[r0:r0 + row_chunk] = torch.where(empty.t()[..., None], 0.0, o)
                lse[r0:r0 + row_chunk] = row_lse.t().masked_fill(empty.t(), math.inf)
        out_rows += [q0 + t for t in local]
        outs.append(out)
        lses.append(lse)
    if not outs:
        return [], torch.zeros((0, h_q, d_v), device=q.device), torch.zeros((0, h_q), device=q.device)
    return out_rows, torch.cat(outs), torch.cat(lses)


def check_mha_prefill(out, lse, ref, what="", logit_scale=1.0):
    """Compares a kernel's out (total_q, h_q, d_v) and lse (total_q, h_q) on the reference's rows; `logit_scale`:
    how much larger than N(0, 1) the logits are (it scales lse's absolute tolerance)."""
    rows, ref_out, ref_lse = ref
    if not rows:
        return
    idx = torch.tensor(rows, device=out.device, dtype=torch.long)
    check_is_allclose(f"out{what}", out[idx].to(torch.float32), ref_out, **OUT_TOL)
    check_is_allclose(f"lse{what}", lse[idx], ref_lse, **dict(LSE_TOL, abs_tol=LSE_TOL["abs_tol"] * max(1.0, logit_scale)))
