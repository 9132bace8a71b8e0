"""Reference and error bound of the FP8 (e4m3) dense MHA prefill forward (docs/fp8-prefill-design.md, "Numerics").

The reference is the fp32 attention of mha_prefill_ref.py on the dequantised inputs (q8 * q_descale etc.). The kernel
differs from it in three places, each bounded per element here:

1. P is rounded to e4m3 for P V (unit roundoff u = 2^-4), with an offset of 2^8 relative to the running row max:
   every p whose max-normalised value is >= 2^-14 is a normal e4m3 number and moves by <= u p; smaller ones round
   with an absolute error <= min(2^-10, p') in the offset units, i.e. <= min(2^-18, p) relative to the row's max.
   l sums the unrounded p. So |d out| <= u (softmax |v|) + sum_{p < 2^-14} min(2^-18, p) |v| / l.
2. The FP8 tensor path sums with reduced precision (measured on an H100: 2-4e-4, ~2^-12, of the largest value over
   128-deep products; tools/diag/micro/fp8_wgmma_probe.sh): the logits move by <= c_z sum_i |q_i k_i| scale with
   c_z = 2^-9 (a 4x margin), which moves p relatively by <= 2 dz (and the lse by <= dz); P V's sums move by
   <= 2^-10 (softmax |v|).
3. out is rounded to bf16 / fp16 (+ u_out |out|).

check_fp8 passes an element when it is inside flash_mla's per-element tolerance or inside 1.1 x this bound; lse
must be within dz_max + LSE_TOL; inf / NaN positions must match exactly. It returns the measured maxima (max |err|,
max err / bound, cosine difference) so that the tests can print them.
"""
from __future__ import annotations

import math

import torch

from dense_decode_ref import check_is_allclose, cos_diff
from mha_prefill_ref import LSE_TOL, OUT_TOL

U_E4M3 = 2.0 ** -4
C_Z = 2.0 ** -9     # logits: the tensor path's summation error per unit of sum |q_i k_i| scale
C_PV = 2.0 ** -10   # P V: per unit of softmax |v|
U_OUT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
# The cosine difference the FP8 results may show (flash_mla's bf16 tolerance is 5e-6; P's e4m3 rounding alone gives
# ~1e-4 on rows that see few keys).
FP8_COS_DIFF_TOL = 2e-3

_CHUNK_ELEMS = 1 << 26


def dequantize(x8, descale, cu, h_kv):
    """x8 (total, heads, d) float8_e4m3fn -> fp32 values x8 * descale[b, g] (sequence b by cu, kv head g of each head).
    descale: None (1), a number, a single-value tensor or a (batch, h_kv) tensor."""
    x = x8.float()
    if descale is None:
        return x
    if not isinstance(descale, torch.Tensor):
        return x * float(descale)
    if descale.numel() == 1:
        return x * float(descale.reshape(()).item())
    heads = x.shape[1]
    group = heads // h_kv
    d = descale.float().to(x.device)
    out = x.clone()
    for b in range(len(cu) - 1):
        r0, r1 = int(cu[b]), int(cu[b + 1])
        if r1 > r0:
            out[r0:r1] *= d[b].repeat_interleave(group)[None, :, None]
    return out


def fp8_ref(q, k, v, cu_q, cu_k, softmax_scale, causal, rows=None):
    """fp32 reference on dequantised fp32 q, k, v (as mha_prefill_ref) with the per-element bounds.
    Returns (rows, out, lse, out_bound, lse_bound) on the reference's rows."""
    h_q, h_kv = q.shape[1], k.shape[1]
    d_v = v.shape[2]
    kv_head = torch.arange(h_q, device=q.device) // (h_q // h_kv)
    wanted = None if rows is None else set(int(r) for r in rows)
    res_rows, outs, lses, obs, lbs = [], [], [], [], []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        s_q, s_k = q1 - q0, k1 - k0
        local = [t for t in range(s_q) if wanted is None or q0 + t in wanted]
        if not local:
            continue
        idx = torch.tensor(local, device=q.device, dtype=torch.long)
        out = torch.zeros((len(local), h_q, d_v), dtype=torch.float32, device=q.device)
        lse = torch.full((len(local), h_q), math.inf, dtype=torch.float32, device=q.device)
        ob = torch.zeros_like(out)
        lb = torch.zeros_like(lse)
        if s_k > 0:
            kk = k[k0:k1].float()[:, kv_head, :]
            vv = v[k0:k1].float()[:, kv_head, :]
            key = torch.arange(s_k, device=q.device)
            row_chunk = max(1, _CHUNK_ELEMS // max(1, s_k * h_q))
            for r0 in range(0, len(local), row_chunk):
                ridx = idx[r0:r0 + row_chunk]
                qr = q[q0 + ridx].float()
                z = torch.einsum("nhd,shd->hns", qr, kk) * softmax_scale
                zabs = torch.einsum("nhd,shd->hns", qr.abs(), kk.abs()) * softmax_scale
                if causal:
                    visible = key[None, :] <= (ridx[:, None] + s_k - s_q)
                    z = z.masked_fill(~visible[None], -math.inf)
                    zabs = zabs.masked_fill(~visible[None], 0.0)
                row_max = z.amax(dim=-1, keepdim=True)
                empty = torch.isneginf(row_max[..., 0])
                pm = torch.exp(z - torch.where(torch.isneginf(row_max), 0.0, row_max))  # max-normalised p
                l = pm.sum(-1, keepdim=True)
                p = (pm / torch.where(l > 0, l, 1.0)).masked_fill(empty[..., None], 0.0)
                o = torch.einsum("hns,shd->nhd", p, vv)
                pav = torch.einsum("hns,shd->nhd", p, vv.abs())
                small = torch.where(pm < 2.0 ** -14, torch.clamp(pm, max=2.0 ** -18), 0.0) / torch.where(l > 0, l, 1.0)
                sub = torch.einsum("hns,shd->nhd", small, vv.abs())
                dz = C_Z * zabs.amax(dim=-1)  # (h, n)
                row_lse = (row_max[..., 0] + torch.log(l[..., 0])).masked_fill(empty, math.inf)
                bound = (U_E4M3 + C_PV + 2 * dz.t()[..., None]) * pav + sub
                out[r0:r0 + row_chunk] = torch.where(empty.t()[..., None], 0.0, o)
                ob[r0:r0 + row_chunk] = bound
                lse[r0:r0 + row_chunk] = row_lse.t()
                lb[r0:r0 + row_chunk] = dz.t()
        res_rows += [q0 + t for t in local]
        outs.append(out)
        lses.append(lse)
        obs.append(ob)
        lbs.append(lb)
    if not outs:
        e = torch.zeros((0, h_q, d_v), device=q.device)
        return [], e, torch.zeros((0, h_q), device=q.device), e, torch.zeros((0, h_q), device=q.device)
    return res_rows, torch.cat(outs), torch.cat(lses), torch.cat(obs), torch.cat(lbs)


def check_fp8(name, out, lse, ref):
    """Checks out / lse of an FP8 call on the reference's rows; returns a dict of the measured errors."""
    rows, r_out, r_lse, o_bound, l_bound = ref
    if not rows:
        return {}
    idx = torch.tensor(rows, device=out.device, dtype=torch.long)
    a = out[idx].float()
    r = r_out.to(a.device)
    finite = torch.isfinite(a) & torch.isfinite(r)
    err = torch.where(finite, (a - r).abs(), 0.0)
    rel = err / (r.abs() + 1e-6)
    inside_fm = (err < OUT_TOL["abs_tol"]) | (rel < OUT_TOL["rel_tol"])
    bound = 1.1 * (o_bound.to(a.device) + U_OUT[out.dtype] * r.abs()) + 1e-5
    bad = ~inside_fm & (err > bound)
    if bool(bad.any()):
        i = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"out{name}: {int(bad.sum())} of {bad.numel()} elements exceed flash_mla's tolerance and "
                             f"the FP8 bound; first at {i} (row {rows[i[0]]}): got {float(a[i]):.6g}, expected "
                             f"{float(r[i]):.6g}, bound {float(bound[i]):.3g} (max abs err {float(err.max()):.3g})")
    check_is_allclose(f"out{name}", a, r, abs_tol=math.inf, rel_tol=math.inf, cos_diff_tol=FP8_COS_DIFF_TOL)
    la = lse[idx].float()
    lr = r_lse.to(la.device)
    lfin = torch.isfinite(la) & torch.isfinite(lr)
    lerr = torch.where(lfin, (la - lr).abs(), 0.0)
    lallowed = 1.1 * l_bound.to(la.device) + LSE_TOL["abs_tol"] + LSE_TOL["rel_tol"] * lr.abs().masked_fill(~lfin, 0)
    lbad = lerr > lallowed
    if bool(lbad.any()):
        i = tuple(torch.nonzero(lbad)[0].tolist())
        raise AssertionError(f"lse{name}: {int(lbad.sum())} of {lbad.numel()} elements exceed the FP8 bound; first at "
                             f"{i}: got {float(la[i]):.8g}, expected {float(lr[i]):.8g}, allowed {float(lallowed[i]):.3g}")
    check_is_allclose(f"lse{name}", la, lr, abs_tol=math.inf, rel_tol=math.inf, cos_diff_tol=1e-5)
    ratio = torch.where(bound > 0, err / bound, 0.0)
    return dict(out_max_abs_err=float(err.max()), out_max_err_over_bound=float(ratio.max()),
                out_max_abs_ref=float(r.abs().max()), out_cos_diff=float(cos_diff(a, r)),
                lse_max_abs_err=float(lerr.max()),
                out_mean_abs_err=float(err.mean()))
