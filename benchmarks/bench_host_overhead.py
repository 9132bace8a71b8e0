"""Host cost per call of the Python entry points: what an engine pays on the CPU for every layer it runs eagerly.

Each record is one way of calling (params `op`), with `host_us` = wall time per call, beside FlashMLA's 48-86 us
(its flash_mla_with_kvcache measured on an H100 the same way: schedule reused, no synchronisation). time_us repeats host_us (run.py's
table column); the target is FlashMLA's best figure (48 us), so ratio = 48 / host_us (> 1: less host time).

Fresh process: the suite measures every op in one child process (the first case starts it; the others read its
results), because benchmarks/run.py runs suites that use torch.profiler before this one, and CUPTI stays attached to
the CUDA runtime afterwards: every CUDA call of the per-call path then costs more (tools/diag/host_profile.py on an
H100: check_launch_context 0.35 -> 1.82 us, dense decode with out= 18.8 -> 26.3 us per call), which no engine pays.
OPENMLA_HOST_BENCH_IN_PROCESS=1 measures in the calling process instead.

Method: the calls are queued behind a GPU sleep kernel (torch.cuda._sleep) that outlasts the timed loop, so no
kernel runs while the host enqueues and nothing waits for the GPU; `CALLS` calls per round, wall time by
time.perf_counter, no synchronisation until the round ends; the figure is the median over `ROUNDS` rounds of the
mean per call. Outputs the call allocates are released right away and come back from torch's caching allocator
(no cudaMalloc after the warm-up), as in a model step.

Ops (dense: b 64, s_q 1, h_q 128, 4K-token cache, causal; sparse: V3.2 FP8 cache, b 64, s_q 2, h_q 128, topk 2048,
attention sink; `sparse_decode_b2` the b = 2 row, whose schedule records the host builds):
  dense_decode                  flash_mla_with_kvcache, FlashMLASchedMeta planned, outputs allocated by the call
  dense_decode_out              the same with out= and lse= (no allocation at all)
  dense_decode_default_device   dense_decode under torch.set_default_device("cuda"), as engines and FlashMLA's
                                tests run
  dense_decode_first_call       get_mla_metadata() + the first call, which plans (a new object every call)
  dense_decode_tensor_style     flash_mla_with_kvcache with get_mla_metadata(cache_seqlens, ...)'s tensors
  dense_metadata_tensor_style   get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv) itself (the planning call
                                of the tensor style)
  torch_op_dense_decode         torch.ops.openmla.flash_mla_with_kvcache (tensor style) through torch's dispatcher
  sparse_decode, sparse_decode_out, sparse_decode_default_device, sparse_decode_first_call, sparse_decode_b2,
  torch_op_sparse_decode        the same for sparse decode
  sparse_prefill                flash_mla_sparse_fwd (s_q 256, h_q 128, topk 2048, 16K kv rows, outputs allocated)
  sparse_prefill_call_entry     the binding's per-call entry of sparse prefill (_openmla.sparse_prefill_call), what
                                flash_mla_sparse_fwd calls once it takes the per-call path
  append_kv_cache               openmla.append_kv_cache of 64 new tokens into a V3.2 FP8 cache (every layer of every
                                step in an engine)
  mha_prefill                   flash_attn_varlen_func (dense MHA prefill forward: 2 sequences of 512 tokens, h 128,
                                d_qk 192, d_v 128, causal, outputs allocated)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SUITE = "host_overhead"
DEFAULT = True

CALLS = 300
# The planning ops launch three kernels per call: fewer calls keep the queue behind the sleep short of the
# driver's limit on pending launches (past it the host would wait for the GPU).
FIRST_CALL_CALLS = 100
ROUNDS = 7
WARMUP = 20
FLASHMLA_HOST_US = (48.0, 86.0)  # FlashMLA's host cost per call on an H100, best and worst
D_QK, D_V, PAGE = 576, 512, 64

_DENSE_OPS = ("dense_decode", "dense_decode_out", "dense_decode_default_device", "dense_decode_first_call",
              "dense_decode_tensor_style", "dense_metadata_tensor_style", "torch_op_dense_decode")
_SPARSE_OPS = ("sparse_decode", "sparse_decode_out", "sparse_decode_default_device", "sparse_decode_first_call",
               "sparse_decode_b2", "torch_op_sparse_decode")
_PREFILL_OPS = ("sparse_prefill", "sparse_prefill_call_entry")
_CACHE_OPS = ("append_kv_cache",)
_MHA_OPS = ("mha_prefill",)

TARGETS = {f"host_{op}": {"time_us": FLASHMLA_HOST_US[0]}
           for op in _DENSE_OPS + _SPARSE_OPS + _PREFILL_OPS + _CACHE_OPS + _MHA_OPS}


def cases(quick=False):
    """Every op; each takes well under a second, so `quick` keeps them all."""
    del quick
    ops = _DENSE_OPS + _SPARSE_OPS + _PREFILL_OPS + _CACHE_OPS + _MHA_OPS
    return [dict(name=f"host_{op}", op=op) for op in ops]


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------
def _dense_inputs(torch, b=64, s_q=1, h_q=128, s_k=4096):
    pages = (s_k + PAGE - 1) // PAGE
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    k_cache = torch.randn((b * pages, PAGE, 1, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    block_table = torch.randperm(b * pages, device="cuda", dtype=torch.int32).view(b, pages)
    cache_seqlens = torch.full((b,), s_k, dtype=torch.int32, device="cuda")
    return q, k_cache, block_table, cache_seqlens


def _sparse_inputs(torch, openmla, b, s_q=2, h_q=128, topk=2048, tokens=64 * 1024):
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).clamp_(-1, 1)
    kv = torch.randn((tokens // PAGE, PAGE, 1, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    k_cache = openmla.quantize_kv_cache(kv, "v32")
    indices = torch.randint(0, tokens, (b, s_q, topk), generator=g, device="cuda", dtype=torch.int32)
    attn_sink = torch.randn((h_q,), generator=g, device="cuda", dtype=torch.float32)
    return q, k_cache, indices, attn_sink


# ---------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------
def measure_host_us(torch, call, calls=CALLS, rounds=ROUNDS, warmup=WARMUP):
    """Median over `rounds` of the mean wall time per call of `calls` calls queued behind a GPU sleep."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    # Cycles the sleep must cover: the first round's wall time, measured unhidden, times a margin.
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    unhidden = time.perf_counter() - t0
    torch.cuda.synchronize()
    clock_hz = 2.0e9  # above any Hopper SM clock: the sleep lasts at least as long as asked
    sleep_cycles = int(max(unhidden * 4, 5e-3) * clock_hz)
    samples = []
    for _ in range(rounds):
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples), samples


def _op_call(torch, openmla, op):
    """The zero-argument callable of one op, with its inputs bound, and a description."""
    ops = torch.ops.openmla
    if op.startswith("dense") or op == "torch_op_dense_decode":
        q, k_cache, block_table, seqlens = _dense_inputs(torch)
        b, s_q, h_q = q.shape[:3]
        if op in ("dense_decode", "dense_decode_default_device", "dense_decode_out"):
            meta, _ = openmla.get_mla_metadata()
            openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True)  # plans
            if op == "dense_decode_out":
                out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device="cuda")
                lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device="cuda").transpose(1, 2)
                return lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta,
                                                              causal=True, out=out, lse=lse)
            return lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True)
        if op == "dense_decode_first_call":
            def first():
                meta, _ = openmla.get_mla_metadata()
                return openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True)
            return first
        tile_md, num_splits = openmla.get_mla_metadata(seqlens, s_q * h_q, 1)
        if op == "dense_decode_tensor_style":
            return lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, tile_md, num_splits,
                                                          causal=True)
        if op == "dense_metadata_tensor_style":
            return lambda: openmla.get_mla_metadata(seqlens, s_q * h_q, 1)
        if op == "torch_op_dense_decode":
            return lambda: ops.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, tile_md, num_splits,
                                                      None, True)
    b = 2 if op == "sparse_decode_b2" else 64
    q, k_cache, indices, sink = _sparse_inputs(torch, openmla, b)
    b, s_q, h_q = q.shape[:3]
    if op == "sparse_decode_first_call":
        def first():
            meta, _ = openmla.get_mla_metadata()
            return openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True,
                                                  indices=indices, attn_sink=sink)
        return first
    if op == "torch_op_sparse_decode":
        lengths = torch.full((b,), 1, dtype=torch.int32, device="cuda")
        tile_md, num_splits = openmla.get_mla_metadata(lengths, s_q * h_q, 1, h_q, True, indices.shape[-1])
        return lambda: ops.flash_mla_with_kvcache(q, k_cache, None, None, D_V, tile_md, num_splits, None, False, True,
                                                  indices, sink)
    meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True, indices=indices,
                                   attn_sink=sink)  # plans
    if op == "sparse_decode_out":
        out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device="cuda")
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device="cuda").transpose(1, 2)
        return lambda: openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True,
                                                      indices=indices, attn_sink=sink, out=out, lse=lse)
    return lambda: openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True,
                                                  indices=indices, attn_sink=sink)


def _prefill_call(torch, openmla, op, s_q=256, h_q=128, topk=2048, s_kv=16384):
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn((s_q, h_q, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    kv = torch.randn((s_kv, 1, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), generator=g, device="cuda", dtype=torch.int32)
    scale = D_QK ** -0.5
    if op == "sparse_prefill":
        return lambda: openmla.flash_mla_sparse_fwd(q, kv, indices, scale)
    entry = openmla._openmla.sparse_prefill_call
    return lambda: entry(q, kv, indices, scale, D_V, None, None, None, None, None)


def _append_call(torch, openmla):
    g = torch.Generator(device="cuda").manual_seed(3)
    kv = torch.randn((1024, PAGE, 1, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    cache = openmla.quantize_kv_cache(kv, "v32")
    new = torch.randn((64, D_QK), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    slots = torch.randperm(1024 * PAGE, device="cuda")[:64]
    return lambda: openmla.append_kv_cache(new, slots, cache, "v32")


def _mha_call(torch, openmla, b=2, s=512, h=128):
    g = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn((b * s, h, 192), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    k = torch.randn((b * s, h, 192), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    v = torch.randn((b * s, h, 128), generator=g, device="cuda", dtype=torch.bfloat16).div_(10)
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device="cuda")
    return lambda: openmla.flash_attn_varlen_func(q, k, v, cu, cu, s, s, causal=True)


CHILD_TIMEOUT_S = 280
_child_results = None  # op -> record (or {"error": text}) of the child process, once it ran


def _results_from_child():
    """Every op measured in one fresh process (see the module's docstring): op -> record or {"error": ...}."""
    global _child_results
    if _child_results is None:
        with tempfile.TemporaryDirectory(prefix="openmla_host_bench_") as tmp:
            path = os.path.join(tmp, "host_overhead.json")
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path], capture_output=True,
                                  text=True, timeout=CHILD_TIMEOUT_S)
            if proc.returncode != 0 or not os.path.exists(path):
                raise RuntimeError(f"the host_overhead child process failed (rc {proc.returncode}):\n"
                                   f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            with open(path) as f:
                _child_results = json.load(f)
    return _child_results


def run(case, harness):
    if os.environ.get("OPENMLA_HOST_BENCH_IN_PROCESS", "") in ("", "0"):
        rec = _results_from_child().get(case["op"])
        if rec is None or "error" in rec:
            raise RuntimeError(f"op {case['op']}: " + (rec["error"] if rec else "not measured by the child process"))
        return rec
    return _measure(case)


def _measure(case):
    import torch

    import openmla

    op = case["op"]
    if op in _CACHE_OPS:
        call = _append_call(torch, openmla)
    elif op in _MHA_OPS:
        call = _mha_call(torch, openmla)
    elif op in _PREFILL_OPS:
        call = _prefill_call(torch, openmla, op)
    else:
        call = _op_call(torch, openmla, op)
    default_device = op.endswith("_default_device")
    if default_device:
        torch.set_default_device("cuda")
    calls = FIRST_CALL_CALLS if op.endswith("_first_call") or op == "dense_metadata_tensor_style" else CALLS
    try:
        host_us, samples = measure_host_us(torch, call, calls=calls)
    finally:
        if default_device:
            torch.set_default_device(None)
    del call
    torch.cuda.synchronize()
    return {
        "params": {"op": op},
        "time_us": host_us,
        "host_us": host_us,
        "samples_us": samples,
        "flashmla_host_us": list(FLASHMLA_HOST_US),
        "calls_per_round": calls,
        "timing_method": "host wall time per call, calls queued behind a GPU sleep, median of rounds",
        "process": "fresh" if os.environ.get("OPENMLA_HOST_BENCH_CHILD") == "1" else "caller's",
    }


if __name__ == "__main__":  # standalone: python3 benchmarks/bench_host_overhead.py [--child out.json]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    if len(sys.argv) == 3 and sys.argv[1] == "--child":  # the suite's fresh process: every op, results as JSON
        os.environ["OPENMLA_HOST_BENCH_CHILD"] = "1"
        results = {}
        for c in cases():
            try:
                results[c["op"]] = _measure(c)
            except Exception as err:  # noqa: BLE001 - reported per op by the parent
                results[c["op"]] = {"error": f"{type(err).__name__}: {err}"}
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
        sys.exit(0)
    print(f"{'op':<30} {'host_us':>8}   FlashMLA {FLASHMLA_HOST_US[0]:.0f}-{FLASHMLA_HOST_US[1]:.0f} us")
    for c in cases():
        r = _measure(c)
        print(f"{c['op']:<30} {r['host_us']:8.1f}")
