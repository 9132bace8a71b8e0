"""Dense MLA decode over an FP8 e4m3 cache (per-tensor scales) against our BF16 dense decode on the same shape.

Not in the default run: `python3 benchmarks/run.py --suite dense_decode_fp8`.

Rows (few: the device time is short): memory-bound (b = 128, s_q = 1, h_q = 16, s_k 32K varlen) and compute-bound
(b = 128, h_q = 128, s_k 4K varlen, s_q 1 and 2), page 64, q bf16 (the s_q = 2 row also with q e4m3). The dense suite's
lengths and page order (seed 0); the cache is the dense suite's bf16 values quantised to e4m3 with a per-tensor scale
(amax / 448). Both calls timed like the dense suite (harness.time_decode_call: CUPTI span of the whole eager call, an
8 GB flush before each call); the BF16 call reads the dequantised cache.

gbps counts the bytes the FP8 call moves: q (bf16 or e4m3) + each request's tokens once at 576 bytes + the bf16
output, so run.py's pct_copy_ceiling is the fraction of the copy ceiling in FP8 bytes (the issue's memory-bound aim:
>= 95 %). tflops: formulas.decode_flops. ratio_to_bf16 = the BF16 call's time / the FP8 call's time (> 1: FP8 faster;
compute-bound aim >= 1.0). late_qk_time_us / early_qk_time_us / early_qk_speedup: the A/B of decision dense-fp8-v4 (the
kernels where WG0 issues the next Q K^T behind its P V_L against the others; > 1: early is faster); time_us is the side
the library uses by default (plan_early_qk).
"""
from __future__ import annotations

SUITE = "dense_decode_fp8"
DEFAULT = False

D_QK, D_V, PAGE = 576, 512, 64
ROWS = [
    # (b, s_q, h_q, s_k, q_fp8)
    (128, 1, 16, 32768, False),
    (128, 1, 128, 4096, False),
    (128, 2, 128, 4096, False),
    (128, 2, 128, 4096, True),
]


def cases(quick=False):
    rows = [r for r in ROWS if not quick or not r[4]]
    return [dict(name=f"b{b}_hq{h_q}_sq{s_q}_sk{s_k}_varlen{'_qfp8' if qf else ''}", b=b, s_q=s_q, h_q=h_q, h_kv=1,
                 s_k=s_k, q_fp8=qf, causal=False) for b, s_q, h_q, s_k, qf in rows]


def run(case, harness):
    import torch

    import bench_dense_decode as dense  # the dense suite's inputs (same lengths and page order)
    import openmla

    b, s_q, h_q, s_k = case["b"], case["s_q"], case["h_q"], case["s_k"]
    q, k_bf16, block_table, seqlens, mean_sk = dense.make_inputs(b, s_q, h_q, 1, s_k, True)
    dk = float(k_bf16.abs().max()) / 448.0
    k_fp8 = (k_bf16.float() / dk).to(torch.float8_e4m3fn) if k_bf16.numel() < 2 ** 31 else None
    if k_fp8 is None:  # convert page by page (float copies of the whole cache would not fit beside it)
        k_fp8 = torch.empty(k_bf16.shape, dtype=torch.float8_e4m3fn, device=k_bf16.device)
        for i in range(0, k_bf16.shape[0], 4096):
            k_fp8[i:i + 4096] = (k_bf16[i:i + 4096].float() / dk).to(torch.float8_e4m3fn)
    del k_bf16
    k_deq = torch.empty((k_fp8.shape), dtype=torch.bfloat16, device=k_fp8.device)
    for i in range(0, k_fp8.shape[0], 4096):
        k_deq[i:i + 4096] = (k_fp8[i:i + 4096].float() * dk).to(torch.bfloat16)
    dk_t = torch.tensor([dk], dtype=torch.float32, device=q.device)
    if case["q_fp8"]:
        dq = float(q.abs().max()) / 448.0
        q_in = (q.float() / dq).to(torch.float8_e4m3fn)
        dq_t = torch.tensor([dq], dtype=torch.float32, device=q.device)
    else:
        q_in, dq_t = q, None
    out = torch.empty((b, s_q, h_q, D_V), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
    out16 = torch.empty_like(out)
    lse16 = torch.empty_like(lse)
    meta8, _ = openmla.get_mla_metadata()
    meta16, _ = openmla.get_mla_metadata()

    def call_fp8():
        openmla.flash_mla_with_kvcache(q_in, k_fp8, block_table, seqlens, D_V, meta8, is_fp8_kvcache=True,
                                       descale_q=dq_t, descale_k=dk_t, out=out, lse=lse)

    def call_bf16():
        openmla.flash_mla_with_kvcache(q, k_deq, block_table, seqlens, D_V, meta16, out=out16, lse=lse16)

    # The launch plan's kernel (P V_R not held, evict_last loads), then the A/B of decision dense-fp8-v4 (the early-Q K^T
    # kernels). Decisions dense-fp8-v2 / v3 (held P V_R, loads without L1 allocation) were measured 3-4 % slower on every
    # row of the previous run and are not timed again (their hooks stay: openmla._openmla._set_dense_fp8_*).
    hook = openmla._openmla._set_dense_fp8_early_qk
    try:
        hook(False)
        late = harness.time_decode_call(call_fp8, main_kernel="dense_decode_fp8_kernel")
        hook(True)
        early = harness.time_decode_call(call_fp8, main_kernel="dense_decode_fp8_kernel")
    finally:
        hook(None)
    plan_early = bool(openmla._openmla.DENSE_FP8_EARLY_QK_DEFAULT)
    timing = early if plan_early else late
    bf16 = harness.time_decode_call(call_bf16)
    time_us = timing["time_us"]
    f = harness.formulas
    flops = f.decode_flops(b, s_q, h_q, mean_sk, D_QK, D_V)
    q_bytes = 1 if case["q_fp8"] else 2
    nbytes = float(b) * (s_q * h_q * D_QK * q_bytes + mean_sk * D_QK * 1 + s_q * h_q * D_V * 2)
    # Agreement with the BF16 call on the dequantised cache (a sanity figure; the tests check the tolerances).
    max_abs_diff = float((out.float() - out16.float()).abs().max())
    record = {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "tflops": flops / (time_us * 1e-6) / 1e12,
        "gbps": nbytes / (time_us * 1e-6) / 1e9,
        "bf16_time_us": bf16["time_us"],
        "ratio_to_bf16": bf16["time_us"] / time_us,
        "plan_early_qk": plan_early,
        "late_qk_time_us": late["time_us"],
        "early_qk_time_us": early["time_us"],
        "early_qk_speedup": late["time_us"] / early["time_us"],
        **{k: v for k, v in timing.items() if k != "time_us"},
        "mean_sk": mean_sk,
        "max_abs_diff_to_bf16": max_abs_diff,
        "num_sm_parts": int(meta8.tile_scheduler_metadata.shape[0]),
    }
    del q, q_in, k_fp8, k_deq, block_table, seqlens, out, lse, out16, lse16, meta8, meta16
    torch.cuda.empty_cache()
    return record
