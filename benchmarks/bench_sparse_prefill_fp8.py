"""Sparse prefill straight from the paged FP8 cache (openmla.flash_mla_sparse_fwd_fp8, bf16 compute), beside the
pipeline an engine runs today, in the same run.

Rows (s_q = 4096, attention sink on, sm_scale = d_qk ** -0.5, page size 64, a cache of exactly s_kv tokens):
  - V3.2 (d_qk 576, 656 B/token) h_q 128, topk 2048, s_kv 8K and 32K;
  - MODEL1 (d_qk 512, 584 B/token) h_q 128, topk 1024, s_kv 8K.
Inputs as bench_sparse_prefill.py (q, kv ~ N(0, 1) / 10, distinct random rows per token, no topk_length), kv
quantised into the cache by openmla.quantize_kv_cache; the indices are its slots.

Figures of a row (CUPTI spans with an 8 GB flush before every call, as the other prefill suites):
  time_us          ours: flash_mla_sparse_fwd_fp8 on the FP8 cache;
  pipeline_us      what an engine with an FP8 cache runs today: dequantize_kv_cache of the request's tokens (the
                   s_kv-token cache) into a bf16 buffer, then our bf16 sparse prefill on it: dequant_us + bf16_us, the
                   two kernels' spans timed alone (as under a CUDA graph); pipeline_span_us is the eager pair's span
                   (it includes the host's gap between the two launches);
  ratio_to_pipeline      pipeline_us / time_us;
  ratio_to_flashmla_bf16 FlashMLA's bf16 kernel on the lent H100 (docs/targets.md; the "ratio" of the record) /
                   time_us.
out_matches_pipeline: ours and the pipeline's outputs are bitwise equal (the kernel dequantises exactly and runs
the bf16 kernel's consumers).
"""
from __future__ import annotations

SUITE = "sparse_prefill_fp8"
DEFAULT = False

S_Q = 4096
D_V = 512
PAGE = 64
K = 1024

# FlashMLA's bf16 sparse prefill on the lent H100 (docs/targets.md), by (d_qk, h_q, topk, s_kv).
_FLASHMLA_BF16_US_H100 = {
    (576, 128, 2048, 8 * K): 3423, (576, 128, 2048, 32 * K): 3736,
    (512, 128, 1024, 8 * K): 1760,
}


def _case(d_qk, h_q, topk, s_kv):
    layout = "v32" if d_qk == 576 else "model1"
    key = (d_qk, h_q, topk, s_kv)
    return dict(name=f"{layout}_hq{h_q}_topk{topk}_skv{s_kv // K}k_sq{S_Q}_page{PAGE}_sink", s_q=S_Q, s_kv=s_kv,
                topk=topk, h_q=h_q, d_qk=d_qk, page_size=PAGE, attn_sink=True,
                target={"h100": {"time_us": _FLASHMLA_BF16_US_H100[key]}})


def cases(quick=False):
    del quick
    return [_case(576, 128, 2048, 8 * K), _case(576, 128, 2048, 32 * K), _case(512, 128, 1024, 8 * K)]


TARGETS = {c["name"]: c["target"] for c in cases()}


def run(case, harness):
    import torch

    import bench_sparse_prefill
    import openmla

    s_q, s_kv, topk, h_q, d_qk, ps = (case["s_q"], case["s_kv"], case["topk"], case["h_q"], case["d_qk"],
                                      case["page_size"])
    fmt = "v32" if d_qk == 576 else "model1"
    q, kv, indices, sink = bench_sparse_prefill.make_inputs(s_q, s_kv, topk, h_q, d_qk)
    cache = openmla.quantize_kv_cache(kv.reshape(s_kv // ps, ps, 1, d_qk), fmt)
    del kv
    deq = torch.empty((s_kv // ps, ps, 1, d_qk), dtype=torch.bfloat16, device=q.device)
    deq_rows = deq.view(s_kv, 1, d_qk)
    out = torch.empty((s_q, h_q, D_V), dtype=torch.bfloat16, device=q.device)
    mx = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    out_p = torch.empty_like(out)
    mx_p, lse_p = torch.empty_like(mx), torch.empty_like(lse)
    scale = d_qk ** -0.5

    def ours():
        openmla.flash_mla_sparse_fwd_fp8(q, cache, indices, scale, attn_sink=sink, out=out, max_logits=mx, lse=lse)

    def dequant():
        openmla.dequantize_kv_cache(cache, fmt, out=deq)

    def bf16():
        openmla.flash_mla_sparse_fwd(q, deq_rows, indices, scale, attn_sink=sink, out=out_p, max_logits=mx_p,
                                     lse=lse_p)

    def pipeline():
        dequant()
        bf16()

    def span(call):
        harness.rest_before_timing(call)
        t = harness.time_cupti(call)
        return (t.span_us if t.method == "cupti" else t.median_us), t

    time_us, t = span(ours)
    pipeline_span_us, _ = span(pipeline)
    dequant_us, _ = span(dequant)
    bf16_us, _ = span(bf16)
    pipeline_us = dequant_us + bf16_us
    torch.cuda.synchronize()
    f = harness.formulas
    record = {
        "params": {k: v for k, v in case.items() if k not in ("name", "target")},
        "time_us": time_us,
        "flops": f.sparse_prefill_flops(s_q, topk, h_q, d_qk, D_V),
        "bytes": s_q * topk * (656 if d_qk == 576 else 584) + 2 * s_q * h_q * (d_qk + D_V),
        "timing_method": t.method,
        "kernels": [[n, us] for n, us in t.kernels] if t.method == "cupti" else [],
        "pipeline_us": pipeline_us,
        "pipeline_span_us": pipeline_span_us,
        "ratio_to_bf16_kernel": bf16_us / time_us,
        "dequant_us": dequant_us,
        "bf16_us": bf16_us,
        "ratio_to_pipeline": pipeline_us / time_us,
        "out_finite": bool(torch.isfinite(out.float()).all()),
        "out_matches_pipeline": bool(torch.equal(out.view(torch.int16), out_p.view(torch.int16))
                                     and torch.equal(lse, lse_p) and torch.equal(mx, mx_p)),
    }
    dev = (getattr(harness, "device", "") or "").lower()
    target = next((v for k, v in case["target"].items() if k in dev), None)
    if target is not None:
        record["target"] = target
        record["ratio"] = target["time_us"] / time_us
        record["ratio_to_flashmla_bf16"] = record["ratio"]
    if t.note:
        record["timing_note"] = t.note
    del q, cache, deq, indices, sink, out, mx, lse, out_p, mx_p, lse_p
    torch.cuda.empty_cache()
    return record
