"""Decode with per-request query lengths (flash_mla_with_kvcache(..., seqused_q=...); docs/dense-decode.md and
docs/sparse-decode.md, "Per-request query lengths") against the uniform call at the same total query rows.

Rows: dense b = 128 (h_q 128, compute-bound; h_q 16, memory-bound), varlen cache lengths N(s_k, s_k / 2), causal;
the query lengths cycle through 1 .. s_max (mean m) against the uniform s_q = m call of the same requests and cache
("mixed"), and every length at s_max against the uniform s_q = s_max call ("full": the price of the varlen kernels
and of their partition count). Sparse V3.2 FP8 decode (h_q 128, topk 2048, sink on) likewise. Inputs from bench_dense_decode.make_inputs /
bench_sparse_decode.make_inputs at s_max query rows (the uniform call reads the first m rows), timed with
harness.time_decode_call (CUPTI span of the whole call, 8 GB flush before each call, median), each schedule planned by
its first call, outside the timed region.

Each record: time_us (varlen), uniform_time_us, ratio_to_uniform = uniform time / varlen time (1.0: the same speed;
below 1: the varlen call is slower), query_rows (both calls), num_sm_parts (the varlen call's); dense rows also
uniform_parts_time_us: the same varlen call planned with the uniform s_max call's partition count (uniform_parts), the
A/B of the varlen partition count. Not part of the default run:
python3 benchmarks/run.py --suite decode_varlen_q.
"""
from __future__ import annotations

SUITE = "decode_varlen_q"
DEFAULT = False

D_V = 512


def cases(quick=False):
    rows = [
        dict(kind="dense", b=128, h_q=128, s_max=3, lengths="mixed", s_k=4096),
        dict(kind="dense", b=128, h_q=128, s_max=3, lengths="mixed", s_k=16384),
        dict(kind="dense", b=128, h_q=128, s_max=3, lengths="full", s_k=4096),
        dict(kind="dense", b=128, h_q=16, s_max=3, lengths="mixed", s_k=4096),
        dict(kind="sparse", b=64, h_q=128, s_max=3, lengths="mixed", topk=2048, s_k=32768),
    ]
    for r in rows:
        r["name"] = (f"{r['kind']}_b{r['b']}_hq{r['h_q']}_smax{r['s_max']}_{r['lengths']}_sk{r['s_k']}"
                     + (f"_topk{r['topk']}" if r["kind"] == "sparse" else ""))
    if quick:
        return [r for r in rows if r["s_k"] == 4096 and r["kind"] == "dense"]
    return rows


def _binding_varlen_call(q, k_cache, block_table, seqlens, used, out, lse, num_sms):
    """The dense varlen call through the binding with a given num_sms (the problem field the partition count follows):
    planned here, returns the call. num_sms = SMs // s_max gives the uniform s_max call's partition count, the A/B of
    the varlen partition count (docs/dense-decode.md, "Per-request query lengths")."""
    import torch

    from openmla import _openmla as C

    b, s_max, h_q, _ = q.shape
    problem = dict(batch=b, s_q=s_max, h_q=h_q, h_kv=1, d_qk=576, d_v=D_V, page_block_size=int(k_cache.shape[1]),
                   cache_format="bf16", causal=True, num_sms=num_sms, varlen_q=True,
                   max_blocks_per_seq=int(block_table.shape[1]))
    sizes = C.get_decode_workspace_sizes(**problem)
    dev = q.device
    meta = torch.empty((sizes["num_sm_parts"], C.DECODE_SCHEDULE_RECORD_INTS), dtype=torch.int32, device=dev)
    splits = torch.empty((sizes["num_splits_ints"],), dtype=torch.int32, device=dev)
    po = torch.empty((sizes["partial_rows"], D_V), dtype=torch.float32, device=dev)
    pl = torch.empty((sizes["partial_rows"],), dtype=torch.float32, device=dev)
    counters = torch.empty((max(sizes["merge_counter_ints"], 1),), dtype=torch.int32, device=dev)
    lengths = torch.empty((sizes["varlen_ints"],), dtype=torch.int32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    C.plan_decode(seqlens, meta, splits, None, None, counters, stream, used, lengths, **problem)

    def call():
        C.dense_decode(q, k_cache, block_table, seqlens, meta, splits, po, pl, out, lse, counters, 0.0,
                       torch.cuda.current_stream(dev).cuda_stream, used, lengths, **problem)
    return call, sizes["num_sm_parts"]


def _lengths(b, s_max, kind):
    """(per-request lengths, the uniform s_q with the same total): 1 .. s_max cycled (mean (1 + s_max) / 2, an
    integer for odd s_max), or s_max everywhere."""
    if kind == "full":
        return [s_max] * b, s_max
    assert s_max % 2 == 1, "mixed lengths 1 .. s_max need an odd s_max for an integer mean"
    return [1 + i % s_max for i in range(b)], (1 + s_max) // 2


def run(case, harness):
    import torch

    import openmla

    f = harness.formulas
    b, h_q, s_max = case["b"], case["h_q"], case["s_max"]
    lens, s_uni = _lengths(b, s_max, case["lengths"])
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty((b, s_max, h_q, D_V), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((b, s_max, h_q), dtype=torch.float32, device="cuda").transpose(1, 2)
    out_u = torch.empty((b, s_uni, h_q, D_V), dtype=torch.bfloat16, device="cuda")
    lse_u = torch.empty((b, s_uni, h_q), dtype=torch.float32, device="cuda").transpose(1, 2)
    if case["kind"] == "dense":
        import bench_dense_decode as dense

        q, k_cache, block_table, seqlens, mean_sk = dense.make_inputs(b, s_max, h_q, 1, case["s_k"], True)
        q_u = q[:, :s_uni].contiguous()
        meta_v, _ = openmla.get_mla_metadata()
        meta_u, _ = openmla.get_mla_metadata()

        def varlen():
            return openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta_v, causal=True,
                                                  seqused_q=used, out=out, lse=lse)

        def uniform():
            return openmla.flash_mla_with_kvcache(q_u, k_cache, block_table, seqlens, D_V, meta_u, causal=True,
                                                  out=out_u, lse=lse_u)

        flops = f.decode_flops(b, s_uni, h_q, mean_sk, dense.D_QK, D_V)
        nbytes = f.dense_decode_bytes(b, s_uni, h_q, 1, mean_sk, dense.D_QK, D_V)
        # A/B of the varlen partition count: the same varlen call with the uniform s_max call's count.
        # (num_sms' / one position's m-blocks = SMs / all positions' m-blocks: the uniform call's count.)
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        m_all, m_one = -(-s_max * h_q // 64), -(-h_q // 64)
        ab_call, ab_parts = _binding_varlen_call(q, k_cache, block_table, seqlens, used, out, lse,
                                                 sms // m_all * m_one)
    else:
        import bench_sparse_decode as sparse

        q, k_cache, indices, attn_sink, _, stats = sparse.make_inputs(b, s_max, h_q, case["topk"], case["s_k"], True)
        q_u, idx_u = q[:, :s_uni].contiguous(), indices[:, :s_uni].contiguous()
        meta_v, _ = openmla.get_mla_metadata()
        meta_u, _ = openmla.get_mla_metadata()

        def varlen():
            return openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta_v, is_fp8_kvcache=True,
                                                  indices=indices, attn_sink=attn_sink, seqused_q=used, out=out,
                                                  lse=lse)

        def uniform():
            return openmla.flash_mla_with_kvcache(q_u, k_cache, None, None, D_V, meta_u, is_fp8_kvcache=True,
                                                  indices=idx_u, attn_sink=attn_sink, out=out_u, lse=lse_u)

        flops = f.sparse_decode_flops(b, s_uni, h_q, f.sparse_decode_mean_attended(case["topk"]), sparse.D_QK, D_V)
        nbytes = f.sparse_decode_bytes(b, s_uni, h_q, stats["unique_tokens"] * s_uni // s_max, sparse.D_QK, D_V)
    uni = harness.time_decode_call(uniform)
    var = harness.time_decode_call(varlen)
    ab = None
    if case["kind"] == "dense" and ab_parts != meta_v.workspace_sizes["num_sm_parts"]:
        ab = harness.time_decode_call(ab_call)
    time_us = var["time_us"]
    record = {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "tflops": flops / (time_us * 1e-6) / 1e12,
        "gbps": nbytes / (time_us * 1e-6) / 1e9,
        "query_rows": b * s_uni,
        "uniform_s_q": s_uni,
        "uniform_time_us": uni["time_us"],
        "ratio_to_uniform": uni["time_us"] / time_us,
        "num_sm_parts": meta_v.workspace_sizes["num_sm_parts"],
        # dense: the varlen call with the uniform s_max call's partition count (its time; that count)
        "uniform_parts_time_us": None if ab is None else ab["time_us"],
        "uniform_parts": None if ab is None else ab_parts,
        "main_kernel_us": var.get("main_kernel_us"),
        "uniform_main_kernel_us": uni.get("main_kernel_us"),
        "kernels": var.get("kernels"),
        "timing_method": var.get("timing_method"),
    }
    del q, k_cache, out, lse, out_u, lse_u
    torch.cuda.empty_cache()
    return record


if __name__ == "__main__":  # standalone: python3 benchmarks/bench_decode_varlen_q.py [--quick]
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import harness as harness_mod

    quick = "--quick" in sys.argv
    h = harness_mod.Harness({}, quick=quick, reps=20 if quick else 50)
    print(f"device: {h.device}")
    print(f"{'case':<52} {'uniform_us':>10} {'varlen_us':>10} {'ratio':>6}")
    for c in cases(quick):
        r = run(c, h)
        print(f"{c['name']:<52} {r['uniform_time_us']:10.1f} {r['time_us']:10.1f} {r['ratio_to_uniform']:6.3f}")
