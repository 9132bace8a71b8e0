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
# The one rounding flash_mla's metric does not allow for: like every Hopper attention kernel (FlashAttention-3,
# cuDNN), the kernel rounds P to the operand type before P V (docs/mha-prefill.md, "Masking and numerics"). With
# round-to-nearest of relative error <= u (2^-8 for bf16, 2^-11 for fp16) on each p_j and l summed from the unrounded
# p, out_i moves by at most u sum_j p_j |v_ji| / l = u (softmax |V|)_i, plus u |out_i| for out's own rounding. Over
# hundreds of keys these errors average out and flash_mla's per-element tolerance holds; on rows that see a handful of
# keys (causal rows near the diagonal, short sequences) they do not, and the bf16 error reaches ~1e-2 (fp16: 8x less).
# An element outside flash_mla's tolerance passes only within this bound (x 1.1 for the fp32 terms); the cosine
# difference of the whole tensor is checked as flash_mla does.
P_ROUNDING_U = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
LSE_TOL = dict(abs_tol=1e-5, rel_tol=8.01 / 65536)

_CHUNK_ELEMS = 1 << 27  # logits per chunk (512 MB of fp32)


def mha_prefill_ref(q, k, v, cu_q, cu_k, softmax_scale, causal, rows=None):
    """Reference of ``flash_attn_varlen_func`` for rows inside sequences.

    q (total_q, h_q, d_qk), k (total_k, h_kv, d_qk), v (total_k, h_kv, d_v); cu_q, cu_k: sequences of ints (host).
    ``rows``: optional list of query rows (of q) to compute; default every row inside a sequence. Rows outside every
    sequence are skipped. Returns (rows, out (n, h_q, d_v) float32, lse (n, h_q) float32, p_abs_v (n, h_q, d_v)
    float32) where `rows` is the list of query rows computed, in sequence order (the kernel's bf16 out is compared with
    the unrounded fp32 values) and p_abs_v = softmax(z) |v|, the scale of the P-rounding error (P_ROUNDING_U).
    """
    h_q, h_kv = q.shape[1], k.shape[1]
    d_v = v.shape[2]
    kv_head = torch.arange(h_q, device=q.device) // (h_q // h_kv)  # head h reads kv head h // (h_q // h_kv)
    wanted = None if rows is None else set(int(r) for r in rows)
    out_rows, outs, lses, bounds = [], [], [], []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        s_q, s_k = q1 - q0, k1 - k0
        local = [t for t in range(s_q) if wanted is None or q0 + t in wanted]
        if not local:
            continue
        idx = torch.tensor(local, device=q.device, dtype=torch.long)
        out = torch.zeros((len(local), h_q, d_v), dtype=torch.float32, device=q.device)
        lse = torch.full((len(local), h_q), math.inf, dtype=torch.float32, device=q.device)
        bound = torch.zeros((len(local), h_q, d_v), dtype=torch.float32, device=q.device)
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
                bound[r0:r0 + row_chunk] = torch.einsum("hns,shd->nhd", p, vv.abs())
                lse[r0:r0 + row_chunk] = row_lse.t().masked_fill(empty.t(), math.inf)
        out_rows += [q0 + t for t in local]
        outs.append(out)
        lses.append(lse)
        bounds.append(bound)
    if not outs:
        empty_out = torch.zeros((0, h_q, d_v), device=q.device)
        return [], empty_out, torch.zeros((0, h_q), device=q.device), empty_out
    return out_rows, torch.cat(outs), torch.cat(lses), torch.cat(bounds)


def check_out(name, ans, ref, p_abs_v, u):
    """flash_mla's metric with OUT_TOL, except that an element outside its per-element tolerance passes when it lies
    within the P-rounding bound 1.1 u (p_abs_v + |ref|) (P_ROUNDING_U). The inf/NaN positions must match exactly and
    the cosine difference is flash_mla's."""
    a = ans.to(torch.float32)
    r = ref.to(device=ans.device, dtype=torch.float32)
    finite = torch.isfinite(a) & torch.isfinite(r)
    abs_err = torch.where(finite, (a - r).abs(), 0.0)
    rel_err = abs_err / (r.abs() + 1e-6)
    outside = ~((abs_err < OUT_TOL["abs_tol"]) | (rel_err < OUT_TOL["rel_tol"]))
    bound = 1.1 * u * (p_abs_v.to(a.device) + r.abs()) + 1e-6
    bad = outside & (abs_err > bound)
    if bool(bad.any()):
        idx = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements exceed both flash_mla's tolerance "
                             f"and the P-rounding bound; first at {idx}: got {float(a[idx]):.8g}, expected "
                             f"{float(r[idx]):.8g}, bound {float(bound[idx]):.3g} (max abs err {float(abs_err.max()):.3g})")
    # The anomalies and the cosine difference, as flash_mla checks them (the per-element test passes trivially here).
    check_is_allclose(name, a, r, abs_tol=math.inf, rel_tol=math.inf, cos_diff_tol=OUT_TOL["cos_diff_tol"])


def check_mha_prefill(out, lse, ref, what="", logit_scale=1.0):
    """Compares a kernel's out (total_q, h_q, d_v) and lse (total_q, h_q) on the reference's rows; `logit_scale`:
    how much larger than N(0, 1) the logits are (it scales lse's absolute tolerance)."""
    rows, ref_out, ref_lse, p_abs_v = ref
    if not rows:
        return
    idx = torch.tensor(rows, device=out.device, dtype=torch.long)
    check_out(f"out{what}", out[idx], ref_out, p_abs_v, P_ROUNDING_U[out.dtype])
    check_is_allclose(f"lse{what}", lse[idx], ref_lse, **dict(LSE_TOL, abs_tol=LSE_TOL["abs_tol"] * max(1.0, logit_scale)))


# ---------------------------------------------------------------------------------------------------------------
# Backward: torch autograd of plain attention, and FlashAttention's test criterion
# ---------------------------------------------------------------------------------------------------------------
def mha_grad_ref(q, k, v, cu_q, cu_k, dout, softmax_scale, causal, compute_dtype=torch.float32, skip=()):
    """out and the gradients of sum(out * dout) by torch autograd of plain attention, every operation in
    `compute_dtype` (float32: the reference; bfloat16 / float16: the low-precision reference whose error scales the
    tolerance, as FlashAttention's tests compute theirs: logits, softmax and both products rounded to that dtype).

    Per sequence (sequences in `skip` are left out: their rows stay 0), GQA by repeat_interleave of the kv heads,
    causal bottom-right; a row that sees no key gets out = 0 and contributes nothing. Returns float32 tensors of the
    inputs' shapes: (out, dq, dk, dv); rows outside the computed sequences are 0.
    """
    h_q, h_kv = q.shape[1], k.shape[1]
    group = h_q // h_kv
    f32 = dict(dtype=torch.float32, device=q.device)
    out = torch.zeros((q.shape[0], h_q, v.shape[2]), **f32)
    dq, dk, dv = (torch.zeros(t.shape, **f32) for t in (q, k, v))
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        s_q, s_k = q1 - q0, k1 - k0
        if i in skip or s_q == 0 or s_k == 0:
            continue
        qi, ki, vi = (t.detach().to(compute_dtype).requires_grad_(True) for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        with torch.enable_grad():
            z = torch.einsum("thd,shd->hts", qi, ki.repeat_interleave(group, dim=1)) * softmax_scale
            if causal:
                rows = torch.arange(s_q, device=q.device)[:, None]
                visible = torch.arange(s_k, device=q.device)[None, :] <= rows + (s_k - s_q)  # (s_q, s_k)
                # Rows without a visible key: logits 0 (a finite softmax), then every probability masked to 0.
                z = z.masked_fill(~visible, -math.inf).masked_fill(~visible.any(-1, keepdim=True), 0.0)
                p = torch.softmax(z, dim=-1).masked_fill(~visible, 0.0)
            else:
                p = torch.softmax(z, dim=-1)
            o = torch.einsum("hts,shd->thd", p.to(compute_dtype), vi.repeat_interleave(group, dim=1))
            o.backward(dout[q0:q1].detach().to(compute_dtype))
        out[q0:q1] = o.detach().float()
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = qi.grad.float(), ki.grad.float(), vi.grad.float()
    return out, dq, dk, dv


# The small absolute term of grad_within_tolerance: what fp32 rounding alone leaves where the low-precision reference
# happens to be exact (a row that sees one key has dq = 0 in every precision, up to ~1e-7 of the kernel's order).
GRAD_EPS = 1e-5


def grad_within_tolerance(name, ours, ref, ref_lowp, rows=None, eps=GRAD_EPS, factor=2.0):
    """FlashAttention's backward criterion: max |ours - ref| <= factor * max |ref_lowp - ref| + eps * max(1, max |ref|),
    with ref the float32 reference and ref_lowp the same computation in the inputs' dtype (mha_grad_ref). `rows`:
    the rows (dimension 0) to compare, default all. Every compared element of `ours` must be finite. Returns
    (error, allowed) so that callers can report the margin."""
    a = ours.float()
    r, lp = ref.to(a.device), ref_lowp.to(a.device)
    if rows is not None:
        idx = torch.as_tensor(rows, dtype=torch.long, device=a.device)
        a, r, lp = a[idx], r[idx], lp[idx]
    if a.numel() == 0:
        return 0.0, 0.0
    bad = ~torch.isfinite(a)
    if bool(bad.any()):
        first = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} of {a.numel()} elements are not finite; first at {first}: "
                             f"{float(a[first])}")
    err = float((a - r).abs().max())
    base = float((lp - r).abs().max())
    allowed = factor * base + eps * max(1.0, float(r.abs().max()))
    if not err <= allowed:
        where = tuple(torch.nonzero((a - r).abs() == err)[0].tolist())
        raise AssertionError(f"{name}: max |ours - fp32 ref| = {err:.4g} at {where} (got {float(a[where]):.6g}, "
                             f"expected {float(r[where]):.6g}) exceeds {factor:g} x the low-precision reference's "
                             f"{base:.4g} + eps = {allowed:.4g}")
    return err, allowed
