"""Decode context parallelism (DCP): the merge of partial states, and a two-rank decode step against one rank.

Rows (b 128 tokens x h 128 heads x d_v 512, bf16, s_q 1; docs/merge-states.md):

* ``merge_p{2,4,8}_b128_h128``: openmla.merge_attn_states of 2 / 4 / 8 partials (all non-empty), kernel time by
  CUPTI, GB/s over the bytes it must move (partials and their lse read, out and lse written); target 80 % of this
  run's copy ceiling, as the FP8 codec's (the kernel is a streaming read of P rows and a write of one).
* ``decode_1rank_b128_h128_sk32K``: one GPU decodes the whole cache (s_k 32K per request): the dense decode call.
* ``decode_slice_b128_h128_sk16K``: one GPU decodes half of it: what each of two ranks decodes.
* ``dcp2_step_b128_h128_sk32K``: two ranks (two GPUs, NCCL), each with half of every request's tokens: slice decode,
  all_gather of out and lse into one stacked tensor each, merge_attn_states. CUDA-event time of the step on rank 0
  (the ranks start each repetition together after a barrier), median of the repetitions; the record also holds the
  step's parts (decode, all-gather, merge) timed the same way. Needs two visible GPUs: on one GPU the row is not
  listed (a line on stderr says so).

Not in the default run (``benchmarks/run.py --suite dcp_decode``). The step rows are CUDA-event times (the step has a
collective, which CUPTI's span would count from a rank's first kernel to its last anyway); the decode rows are the
dense decode suite's timing (harness.time_decode_call: CUPTI span of the call).
"""
from __future__ import annotations

import os
import sys

SUITE = "dcp_decode"
DEFAULT = False

B, H, D_QK, D_V, PAGE = 128, 128, 576, 512, 64
S_K = 32768
WORLD = 2
TARGET_FRACTION_OF_COPY = 0.8
STEP_REPS = 50
STEP_WARMUP = 10


def _gpu_count():
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - --list without torch lists every row
        return None


def cases(quick=False):
    rows = [dict(name=f"merge_p{p}_b{B}_h{H}", op="merge", partials=p, tokens=B, heads=H, d_v=D_V)
            for p in (2, 4, 8)]
    rows.append(dict(name=f"decode_1rank_b{B}_h{H}_sk32K", op="decode", b=B, h_q=H, s_k=S_K))
    rows.append(dict(name=f"decode_slice_b{B}_h{H}_sk16K", op="decode", b=B, h_q=H, s_k=S_K // WORLD))
    count = _gpu_count()
    if count is None or count >= WORLD:
        rows.append(dict(name=f"dcp2_step_b{B}_h{H}_sk32K", op="dcp_step", b=B, h_q=H, s_k=S_K, world=WORLD))
    else:
        print(f"bench_dcp: dcp2_step_b{B}_h{H}_sk32K needs {WORLD} GPUs, {count} visible: not listed", file=sys.stderr)
    return rows


def merge_bytes(partials, tokens, heads, d_v, in_bytes=2, out_bytes=2):
    """Bytes merge_attn_states must move: every partial row and its lse read, the merged row and lse written."""
    rows = tokens * heads
    return partials * rows * (d_v * in_bytes + 4) + rows * (d_v * out_bytes + 4)


def _states(partials, tokens, heads, d_v, device="cuda"):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    outs = (torch.rand((partials, tokens, heads, d_v), generator=g, device=device) * 2 - 1).to(torch.bfloat16)
    lses = torch.rand((partials, tokens, heads), generator=g, device=device) * 8
    return outs, lses


def _run_merge(case, harness):
    import torch

    import openmla

    p, t, h, d = case["partials"], case["tokens"], case["heads"], case["d_v"]
    outs, lses = _states(p, t, h, d)
    out = torch.empty((t, h, d), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((t, h), dtype=torch.float32, device="cuda")

    def call():
        openmla.merge_attn_states(outs, lses, out=out, lse_out=lse)

    harness.rest_before_timing(call)
    timing = harness.time_cupti(call)
    graph_us, eager_us = harness.time_graph_and_eager(call)
    record = {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": timing.median_us,
        "bytes": merge_bytes(p, t, h, d),
        "timing_method": getattr(timing, "method", "cupti"),
        "graph_event_time_us": graph_us,
        "eager_time_us": eager_us,
    }
    copy_gbps = (getattr(harness, "ceilings", None) or {}).get("copy_gbps")
    if copy_gbps:
        record["target"] = {"gbps": TARGET_FRACTION_OF_COPY * copy_gbps}
    return record


def _run_decode(case, harness):
    import torch

    import openmla
    from bench_dense_decode import make_inputs

    b, h_q, s_k = case["b"], case["h_q"], case["s_k"]
    q, k_cache, block_table, seqlens, mean_sk = make_inputs(b, 1, h_q, 1, s_k, False)
    out = torch.empty((b, 1, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, 1, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
    meta, _ = openmla.get_mla_metadata()

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, out=out, lse=lse)

    timing = harness.time_decode_call(call)
    f = harness.formulas
    return {
        "params": {k: v for k, v in case.items() if k != "name"},
        "flops": f.decode_flops(b, 1, h_q, mean_sk, D_QK, D_V),
        "bytes": f.dense_decode_bytes(b, 1, h_q, 1, mean_sk, D_QK, D_V),
        **timing,
    }


# ---------------------------------------------------------------------------------------------------------------
# The two-rank step (one process per GPU)
# ---------------------------------------------------------------------------------------------------------------
def _step_worker(rank, world, port, case, result_path):
    from datetime import timedelta
    import json
    import statistics

    import torch
    import torch.distributed as dist

    import openmla
    from bench_dense_decode import make_inputs

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        b, h_q, s_k = case["b"], case["h_q"], case["s_k"]
        # Each rank's slice: s_k / world tokens of every request (the layout does not change the cost).
        q, k_cache, block_table, seqlens, _ = make_inputs(b, 1, h_q, 1, s_k // world, False, seed=100 + rank)
        out = torch.empty((b, 1, h_q, D_V), dtype=q.dtype, device=q.device)
        lse = torch.empty((b, 1, h_q), dtype=torch.float32, device=q.device)  # (b, s_q, h) storage: rows ready
        outs = torch.empty((world, b, h_q, D_V), dtype=q.dtype, device=q.device)
        lses = torch.empty((world, b, h_q), dtype=torch.float32, device=q.device)
        merged = torch.empty((b, h_q, D_V), dtype=q.dtype, device=q.device)
        merged_lse = torch.empty((b, h_q), dtype=torch.float32, device=q.device)
        meta, _ = openmla.get_mla_metadata()

        def decode():
            openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, out=out,
                                           lse=lse.transpose(1, 2))

        def gather():
            dist.all_gather_into_tensor(outs, out.view(b, h_q, D_V))
            dist.all_gather_into_tensor(lses, lse.view(b, h_q))

        def merge():
            openmla.merge_attn_states(outs, lses, out=merged, lse_out=merged_lse)

        def step():
            decode()
            gather()
            merge()

        def timed(fn):
            for _ in range(STEP_WARMUP):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(STEP_REPS):
                dist.barrier()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3)
            return statistics.median(samples)

        times = {"step": timed(step), "decode": timed(decode), "all_gather": timed(gather), "merge": timed(merge)}
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(times, f)
    finally:
        dist.destroy_process_group()


def _run_dcp_step(case, harness):
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    world = case["world"]
    if (_gpu_count() or 0) < world:
        raise RuntimeError(f"{case['name']} needs {world} GPUs, {_gpu_count()} visible")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.path.join(tempfile.mkdtemp(prefix="openmla_bench_dcp_"), "times.json")
    here = os.path.dirname(os.path.abspath(__file__))
    python = os.path.join(os.path.dirname(here), "python")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([here, python] + ([old] if old else []))
    mp.spawn(_step_worker, args=(world, port, case, path), nprocs=world, join=True)
    with open(path) as f:
        times = json.load(f)
    f = harness.formulas
    return {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": times["step"],
        "flops": f.decode_flops(case["b"], 1, case["h_q"], float(case["s_k"]), D_QK, D_V),
        "bytes": f.dense_decode_bytes(case["b"], 1, case["h_q"], 1, float(case["s_k"]), D_QK, D_V),
        "timing_method": "events",
        "decode_us": times["decode"],
        "all_gather_us": times["all_gather"],
        "merge_us": times["merge"],
        "note": "tflops / gbps count the whole cache (both ranks' work) over the step time of rank 0",
    }


def run(case, harness):
    if case["op"] == "merge":
        return _run_merge(case, harness)
    if case["op"] == "decode":
        return _run_decode(case, harness)
    return _run_dcp_step(case, harness)
