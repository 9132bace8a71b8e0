"""Torch fp32 reference of dense MLA decode and the comparison metric of the GPU tests.

Follows docs/contracts.md sections 9 (reference) and 8 (metric). Runs on whatever
device its inputs live on (the GPU tests keep it there; it also runs on the CPU). Deliberately plain:
one request at a time, full fp32 matmuls, no online softmax.
"""
from __future__ import annotations

import math

import torch

INVALID_PAGE = 2147480000  # what the tests write into unused block-table entries (flash_mla's tests do too)


def dense_decode_ref(q, k_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, causal=False):
    """Reference of ``flash_mla_with_kvcache`` in dense mode.

    q: (b, s_q, h_q, d_qk); k_cache: (num_blocks, page, h_kv, d_qk); block_table: (b, max_blocks) int;
    cache_seqlens: (b,) int. Returns out (b, s_q, h_q, head_dim_v) in q's dtype (computed in fp32, then
    rounded once) and lse (b, h_q, s_q) float32 (natural log; +inf for a row that sees no key, whose out
    is 0).

    Per request of length L: gather the first L tokens through the block table, NaN -> 0, logits = scale *
    q.k in fp32 (head h reads KV head h // (h_q / h_kv), i.e. repeat_interleave of the KV heads), -inf
    outside tril(diagonal = L - s_q) when causal and s_q > 1, lse = logsumexp, out = softmax @ V with V
    the first head_dim_v dims of K.
    """
    b, s_q, h_q, d_qk = q.shape
    _, page, h_kv, _ = k_cache.shape
    group = h_q // h_kv
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    dev = q.device
    out = torch.zeros((b, s_q, h_q, head_dim_v), dtype=torch.float32, device=dev)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float32, device=dev)
    seqlens = [int(x) for x in cache_seqlens.tolist()]  # host copy: the reference may synchronise
    for i, length in enumerate(seqlens):
        if length == 0:
            continue
        num_pages = (length + page - 1) // page
        pages = block_table[i, :num_pages].to(device=k_cache.device, dtype=torch.long)
        kv = k_cache[pages].reshape(num_pages * page, h_kv, d_qk)[:length].to(device=dev, dtype=torch.float32)
        kv = torch.nan_to_num(kv, nan=0.0)
        # Grouping the query heads as (h_kv, group) is exactly repeat_interleave(group) of the KV heads,
        # without materialising h_q copies of the cache.
        qi = q[i].to(torch.float32).reshape(s_q, h_kv, group, d_qk)
        logits = torch.einsum("sjgd,ljd->jgsl", qi, kv) * softmax_scale  # (h_kv, group, s_q, L)
        if causal and s_q > 1:
            visible = torch.ones((s_q, length), dtype=torch.bool, device=dev).tril(diagonal=length - s_q)
            logits = logits.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # (h_kv, group, s_q); -inf where no key is visible
        empty = torch.isneginf(row_lse)
        probs = torch.exp(logits - row_lse.unsqueeze(-1))
        probs = probs.masked_fill(empty.unsqueeze(-1), 0.0)  # exp(-inf - -inf) is NaN: those rows are 0
        oi = torch.einsum("jgsl,ljd->sjgd", probs, kv[..., :head_dim_v])  # (s_q, h_kv, group, d_v)
        out[i] = oi.reshape(s_q, h_q, head_dim_v)
        lse[i] = row_lse.masked_fill(empty, math.inf).reshape(h_q, s_q)
    return out.to(q.dtype), lse


def cos_diff(ans, ref) -> float:
    """1 - 2 sum(a r) / sum(a^2 + r^2) in float64 (0 when ref is all zero)."""
    a = ans.to(torch.float64)
    r = ref.to(torch.float64)
    if float((r * r).sum()) < 1e-12:
        return 0.0
    return float(1.0 - 2.0 * (a * r).sum() / (a * a + r * r).sum())


def check_is_allclose(name, ans, ref, abs_tol, rel_tol, cos_diff_tol=1e-7):
    """flash_mla's comparison (docs/contracts.md section 8). Raises AssertionError with a description on failure.

    Shapes (and dtypes) must match; +inf, -inf and NaN must sit at exactly the same positions in both
    (then they are zeroed); every other element needs |a - r| < abs_tol or |a - r| / (|r| + 1e-6) <
    rel_tol; and the cosine difference of the whole tensors must not exceed cos_diff_tol.
    """
    assert ans.shape == ref.shape, f"{name}: shape {tuple(ans.shape)} != reference {tuple(ref.shape)}"
    assert ans.dtype == ref.dtype, f"{name}: dtype {ans.dtype} != reference {ref.dtype}"
    a = ans.to(torch.float32).clone()
    r = ref.to(device=ans.device, dtype=torch.float32).clone()
    for kind, test in (("+inf", torch.isposinf), ("-inf", torch.isneginf), ("NaN", torch.isnan)):
        in_a, in_r = test(a), test(r)
        if not torch.equal(in_a, in_r):
            where = torch.nonzero(in_a != in_r)[:5].tolist()
            raise AssertionError(f"{name}: {kind} positions differ ({int(in_a.sum())} in result, {int(in_r.sum())} "
                                 f"in reference; first mismatches at {where})")
        a[in_a] = 0.0
        r[in_r] = 0.0
    abs_err = (a - r).abs()
    rel_err = abs_err / (r.abs() + 1e-6)
    bad = ~((abs_err < abs_tol) | (rel_err < rel_tol))
    if bool(bad.any()):
        first = torch.nonzero(bad)[0].tolist()
        idx = tuple(first)
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements exceed abs {abs_tol:g} and rel "
                             f"{rel_tol:g}; first at {idx}: got {float(a[idx]):.8g}, expected {float(r[idx]):.8g} "
                             f"(max abs err {float(abs_err.max()):.3g})")
    cd = cos_diff(a, r)
    if abs(cd) > cos_diff_tol:
        raise AssertionError(f"{name}: cosine difference {cd:.3g} exceeds {cos_diff_tol:g}")


# Tolerances of flash_mla's dense decode test (docs/contracts.md section 8).
OUT_TOL = dict(abs_tol=8e-4, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
LSE_TOL = dict(abs_tol=1e-6, rel_tol=8.01 / 65536)


def check_dense_decode(out, lse, ref_out, ref_lse, what=""):
    """Compares a kernel's (out, lse) with the reference's under the dense decode tolerances."""
    check_is_allclose(f"out{what}", out, ref_out, **OUT_TOL)
    check_is_allclose(f"lse{what}", lse, ref_lse, **LSE_TOL)
