"""Dense MHA prefill forward with FP8 (float8_e4m3fn) q, k, v against our bf16 forward on the same values, measured
in the same process.

Rows: those of bench_mha_prefill_fwd.py (h_q = h_kv = 128: b2 s4k d192 causal / full, b1 s8k and s32k causal, b2 s4k
d128 causal, b16 s1k, the varlen batch of 16; h_q = 16: b2 s4k, b1 s32k, b16 s1k). Inputs: the bf16 suite's N(0, 1)
q, k, v times 32, rounded to e4m3, with descales (batch, h_kv) = 1/32 (a power of two, so the dequantised values are
exact in bf16 and both kernels see the same numbers). Both are timed with CUDA events, an 8 GB flush before each
(harness.time_cuda), median of 50; FLOPs as the bf16 suite.

Columns: time_us (FP8, the process's default key block: block_n), bf16_time_us, ratio_to_bf16 = bf16 time / FP8 time
(the target of the row: > 1 is faster; the goal is >= 1.3 on the s >= 4096 rows), max_abs_diff_vs_bf16 and
max_abs_diff_lse_vs_bf16 (the two outputs on every row). The A/B of the kernel's two key blocks (decision fp8-d5), on
every row in the same process (set through openmla._openmla._set_mha_prefill_fp8_block_n; the default's time is not
taken twice): bn128_time_us, bn192_time_us, bn128_ratio_to_bf16, bn192_ratio_to_bf16, ratio_bn192_to_bn128 = 128's
time / 192's (> 1: 192 is faster), and max_abs_diff_bn192_vs_bn128 (out of the two kernels; both round P to e4m3,
so they differ by P's rounding and the summation order, not by more than the FP8 error).
"""
from __future__ import annotations

import os
import subprocess
import sys

import bench_mha_prefill_fwd as fwd

SUITE = "mha_prefill_fwd_fp8"
DEFAULT = False
K = 1024
QUANT = 32.0
SMOKE_TIMEOUT_S = 90
# The FP8 kernel's key blocks, each timed on every row (heuristics::mha_prefill_fp8_block_n).
BLOCK_NS = (128, 192)


def cases(quick=False):
    del quick
    why = fwd._build_gap()
    if why:
        print(f"[{SUITE}] skipped: {why}", flush=True)
        return []
    out = []
    for c in fwd._all_cases():
        c = dict(c)
        c["peer"] = None
        c["name"] = c["name"] + "_fp8"
        out.append(c)
    return out


_SMOKE = r"""
import torch, openmla
from openmla import _openmla as C
cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
q = (torch.randn((300, 4, 192), device="cuda") * 32).to(torch.float8_e4m3fn)
k = (torch.randn((300, 2, 192), device="cuda") * 32).to(torch.float8_e4m3fn)
v = (torch.randn((300, 2, 128), device="cuda") * 32).to(torch.float8_e4m3fn)
d = torch.full((2, 2), 1 / 32, device="cuda")
for block_n in (128, 192):
    C._set_mha_prefill_fp8_block_n(block_n)
    out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 200, 200, causal=True, q_descale=d, k_descale=d,
                                              v_descale=d)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out.float()).all()) and bool(torch.isfinite(lse).all()), block_n
print("smoke ok")
"""
_smoke_result = None


def _smoke():
    global _smoke_result
    if _smoke_result is None:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(here)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "python"), os.path.join(root, ".deps", "py"),
                                                           os.environ.get("PYTHONPATH", "")]))
        try:
            proc = subprocess.run([sys.executable, "-c", _SMOKE], env=env, capture_output=True, text=True,
                                  timeout=SMOKE_TIMEOUT_S)
            _smoke_result = (proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:])
        except subprocess.TimeoutExpired:
            _smoke_result = (False, f"no answer within {SMOKE_TIMEOUT_S} s (a hang?)")
    return _smoke_result


def run(case, harness):
    import torch

    import openmla

    ok, report = _smoke()
    if not ok:
        raise RuntimeError(f"FP8 dense MHA prefill smoke call failed, not timing: {report}")
    b, s, h_q, h_kv, d_qk, d_v, causal = (case[k] for k in ("b", "s_q", "h_q", "h_kv", "d_qk", "d_v", "causal"))
    lengths = fwd.varlen_lengths(b, 512, s) if case["varlen"] else [s] * b
    q, k, v, cu = fwd.make_inputs(lengths, h_q, h_kv, d_qk, d_v)
    f8 = torch.float8_e4m3fn
    q8, k8, v8 = ((t.float() * QUANT).to(f8) for t in (q, k, v))
    del q, k, v
    qb, kb, vb = ((t.float() / QUANT).bfloat16() for t in (q8, k8, v8))
    ds = torch.full((len(lengths), h_kv), 1.0 / QUANT, dtype=torch.float32, device=q8.device)
    total = q8.shape[0]
    out = torch.empty((total, h_q, d_v), dtype=torch.bfloat16, device=q8.device)
    lse = torch.empty((h_q, total), dtype=torch.float32, device=q8.device).t()
    out_b = torch.empty_like(out)
    lse_b = torch.empty_like(lse)
    m = max(lengths)

    def ours_fp8():
        openmla.flash_attn_varlen_func(q8, k8, v8, cu, cu, m, m, causal=causal, out=out, lse=lse, q_descale=ds,
                                       k_descale=ds, v_descale=ds)

    def ours_bf16():
        openmla.flash_attn_varlen_func(qb, kb, vb, cu, cu, m, m, causal=causal, out=out_b, lse=lse_b)

    from openmla import _openmla as C

    default_bn = C._mha_prefill_fp8_block_n()
    harness.rest_before_timing(ours_fp8)
    t = harness.time_cuda(ours_fp8)
    out_by_bn = {default_bn: out.clone()}
    harness.rest_before_timing(ours_bf16)
    tb = harness.time_cuda(ours_bf16)
    # The other key block, same inputs, same process.
    t_bn = {default_bn: t}
    try:
        for bn in BLOCK_NS:
            if bn == default_bn:
                continue
            C._set_mha_prefill_fp8_block_n(bn)
            harness.rest_before_timing(ours_fp8)
            t_bn[bn] = harness.time_cuda(ours_fp8)
            out_by_bn[bn] = out.clone()
    finally:
        C._set_mha_prefill_fp8_block_n(None)
    flops = harness.formulas.dense_prefill_fwd_flops(lengths, lengths, h_q, d_qk, d_v, causal)
    record = {
        "params": {k: case[k] for k in ("b", "s_q", "s_k", "h_q", "h_kv", "d_qk", "d_v", "causal")},
        "time_us": t.median_us,
        "flops": flops,
        "timing_method": "events",
        "out_finite": bool(torch.isfinite(out.float()).all()),
        "bf16_time_us": tb.median_us,
        "bf16_tflops": flops / (tb.median_us * 1e-6) / 1e12,
        "ratio_to_bf16": tb.median_us / t.median_us,
        "target": {"time_us": tb.median_us},  # run.py: ratio = bf16 time / ours
        "max_abs_diff_vs_bf16": float((out.float() - out_b.float()).abs().max()),
        "max_abs_diff_lse_vs_bf16": float((lse - lse_b).abs().max()),
        "block_n": default_bn,
    }
    for bn, tt in t_bn.items():
        record[f"bn{bn}_time_us"] = tt.median_us
        record[f"bn{bn}_ratio_to_bf16"] = tb.median_us / tt.median_us
    if 128 in t_bn and 192 in t_bn:
        record["ratio_bn192_to_bn128"] = t_bn[128].median_us / t_bn[192].median_us
        record["max_abs_diff_bn192_vs_bn128"] = float((out_by_bn[192].float() - out_by_bn[128].float()).abs().max())
    if case["varlen"]:
        record["params"]["lengths"] = lengths
    del q8, k8, v8, qb, kb, vb, out, lse, out_b, lse_b, out_by_bn
    torch.cuda.empty_cache()
    return record
