"""Question: where do the microseconds of one Python call go (the host_overhead suite's ops, piece by piece)?

Run on the GPU machine after the extension is built (tools/gpu_check.sh builds it; or `cmake --build build-gpu
--target _openmla`):

    PYTHONPATH=python:.deps/py python3 tools/diag/host_profile.py [--quick]

Prints one table (under 60 s): per row the median, 10th and 90th percentile of the per-call time in us, over batches
of 32 calls. Modes:
  host   no GPU work in the call (Python and torch calls, the binding's steps)
  busy   the calls are queued behind torch.cuda._sleep (the GPU runs nothing while the host enqueues), as
         benchmarks/bench_host_overhead.py measures; calls that allocate release their outputs at once, so the
         caching allocator hands the same blocks back
Sections: the Python and torch calls an entry may make; the binding's steps timed inside the binding
(_openmla._host_probe: tensor read, current stream, an output allocation, GIL release, device switch, the C++ API's
launch-context checks); each entry called directly (DecodeStep.decode, TensorStyleDecode.decode,
sparse_prefill_call, kv_cache_append_call) and through the package function, with and without caller outputs
and torch.set_default_device("cuda"); the same after a torch.profiler session in the process (the benchmark suites
that run before host_overhead use one: a difference here means the suite should run in a fresh process).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

PER_BATCH = 32
D_QK, D_V, PAGE = 576, 512, 64


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, mode, per_call_us, note=""):
        row = (name, mode, statistics.median(per_call_us), percentile(per_call_us, 0.1),
               percentile(per_call_us, 0.9), note)
        self.rows.append(row)
        print(f"  {name:<62} {mode:<4} {row[2]:8.2f} {row[3]:8.2f} {row[4]:8.2f}  {note}", flush=True)

    @staticmethod
    def section(title):
        print(f"\n-- {title}", flush=True)


def time_host(fn, batches):
    """Per-call us of `batches` batches of PER_BATCH calls of fn (no GPU work expected)."""
    for _ in range(PER_BATCH):
        fn()
    out = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(PER_BATCH):
            fn()
        out.append((time.perf_counter_ns() - t0) / PER_BATCH / 1e3)
    return out


def time_busy(torch, fn, batches):
    """Per-call us of fn queued behind a GPU sleep that outlasts each batch (nothing runs while the host enqueues)."""
    for _ in range(PER_BATCH):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(PER_BATCH):
        fn()
    unhidden = time.perf_counter() - t0
    torch.cuda.synchronize()
    cycles = int(max(unhidden * 4, 2e-3) * 2.0e9)  # 2 GHz: above any Hopper SM clock, so the sleep lasts long enough
    out = []
    for _ in range(batches):
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter_ns()
        for _ in range(PER_BATCH):
            fn()
        out.append((time.perf_counter_ns() - t0) / PER_BATCH / 1e3)
        torch.cuda.synchronize()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches per row")
    args = parser.parse_args()
    batches = 15 if args.quick else 60

    import torch

    if not torch.cuda.is_available():
        print("host_profile: no CUDA device; nothing to measure")
        return 0
    import openmla
    from openmla import _openmla as C
    from openmla import decode as dec

    print(f"host_profile: {torch.cuda.get_device_name()}, torch {torch.__version__}, openmla {openmla.version()} "
          f"({openmla.build_commit()}); per-call path: {dec._IN_PLACE}; {batches} batches of {PER_BATCH} calls")
    print(f"  {'what (per call)':<62} {'mode':<4} {'med_us':>8} {'p10_us':>8} {'p90_us':>8}")
    t_start = time.perf_counter()
    table = Table()
    host = lambda name, fn, note="": table.add(name, "host", time_host(fn, batches), note)  # noqa: E731
    busy = lambda name, fn, note="": table.add(name, "busy", time_busy(torch, fn, batches), note)  # noqa: E731

    # ---- inputs: the host_overhead suite's problems
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h_q, s_k = 64, 128, 4096
    pages = s_k // PAGE
    q = (torch.randn((b, 1, h_q, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    k_cache = (torch.randn((b * pages, PAGE, 1, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    block_table = torch.randperm(b * pages, device="cuda", dtype=torch.int32).view(b, pages)
    seqlens = torch.full((b,), s_k, dtype=torch.int32, device="cuda")
    meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True)
    step = meta._step
    out = torch.empty((b, 1, h_q, D_V), dtype=q.dtype, device="cuda")
    lse = torch.empty((b, 1, h_q), dtype=torch.float32, device="cuda").transpose(1, 2)
    tile_md, num_splits = openmla.get_mla_metadata(seqlens, h_q, 1)

    sb, s_q, topk, tokens = 64, 2, 2048, 64 * 1024
    sq = torch.randn((sb, s_q, h_q, D_QK), generator=g, device="cuda").clamp_(-1, 1).to(torch.bfloat16)
    kv = (torch.randn((tokens // PAGE, PAGE, 1, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    fp8 = openmla.quantize_kv_cache(kv, "v32")
    indices = torch.randint(0, tokens, (sb, s_q, topk), generator=g, device="cuda", dtype=torch.int32)
    sink = torch.randn((h_q,), generator=g, device="cuda")
    smeta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(sq, fp8, None, None, D_V, smeta, is_fp8_kvcache=True, indices=indices,
                                   attn_sink=sink)
    sstep = smeta._step
    sout = torch.empty((sb, s_q, h_q, D_V), dtype=sq.dtype, device="cuda")
    slse = torch.empty((sb, s_q, h_q), dtype=torch.float32, device="cuda").transpose(1, 2)

    pq = (torch.randn((256, h_q, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    pkv = (torch.randn((16384, 1, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    pidx = torch.randint(0, 16384, (256, 1, topk), generator=g, device="cuda", dtype=torch.int32)
    scale = D_QK ** -0.5

    new_kv = (torch.randn((64, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    slots = torch.randperm(tokens, device="cuda")[:64]

    mq = (torch.randn((4096, h_q, 192), generator=g, device="cuda") / 10).to(torch.bfloat16)
    mk = (torch.randn((4096, h_q, 192), generator=g, device="cuda") / 10).to(torch.bfloat16)
    mv = (torch.randn((4096, h_q, 128), generator=g, device="cuda") / 10).to(torch.bfloat16)
    cu = torch.tensor([0, 2048, 4096], dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()

    # ---- Python and torch calls
    table.section("Python and torch calls an entry may make (no GPU work)")
    host("empty Python function call", lambda: None)
    host("binding call: _openmla.device_sm_count(0) (cached)", lambda: C.device_sm_count(0))
    is_compiling = torch.compiler.is_compiling
    in_place = dec._IN_PLACE
    host("torch.compiler.is_compiling()", is_compiling)
    host("getattr(FlashMLASchedMeta, '_step')", lambda: getattr(meta, "_step", None))
    host("torch.cuda.current_device()", torch.cuda.current_device)
    host("torch.cuda.current_stream()", torch.cuda.current_stream)
    host("torch.cuda.current_stream(q.device).cuda_stream", lambda: torch.cuda.current_stream(q.device).cuda_stream)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        host("torch._C._cuda_getCurrentRawStream(0)", lambda: raw(0))
    host("q.device", lambda: q.device)
    host("q.shape + q.dtype + q.data_ptr()", lambda: (q.shape, q.dtype, q.data_ptr()))
    host("q.__dlpack__() (a DLPack capsule export)", lambda: q.__dlpack__())
    for default in (False, True):
        suffix = ", default device cuda" if default else ""
        if default:
            torch.set_default_device("cuda")
        try:
            host("torch.empty(out) + torch.empty(lse).transpose" + suffix,
                 lambda: (torch.empty((b, 1, h_q, D_V), dtype=q.dtype, device=q.device),
                          torch.empty((b, 1, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)))
            host("is_compiling + 2 tests + getattr (the object style's Python before its entry)" + suffix,
                 lambda: (is_compiling(), sink is not None and getattr(meta, "_step", None) is not None
                          and in_place))
        finally:
            if default:
                torch.set_default_device(None)

    # ---- the binding's steps, timed inside the binding
    table.section("the binding's steps (timed in C++ by _openmla._host_probe)")
    probe = getattr(C, "_host_probe", None)
    if probe is None:
        print("  (this build has no _openmla._host_probe)")
    else:
        for what, t, note in (("noop", q, "loop overhead"), ("read", q, "one tensor"), ("stream", q, ""),
                              ("alloc", out, "decode out (64, 1, 128, 512) bf16"),
                              ("alloc_strided", lse, "decode lse, transposed view"),
                              ("alloc_pair", out, "decode out + lse in one allocation"),
                              ("gil", q, "release + re-acquire"), ("scoped_device", q, "already current"),
                              ("launch_context", q, "pending error, current device, stream's device"),
                              ("launch_context_known", q, "the same, torch's stream vouched for"),
                              ("sm_count", q, "cached")):
            try:
                per_call = [x / 1e3 for x in probe(what, batches, t)]
            except ValueError as err:  # a step this build does not have
                print(f"  _host_probe('{what}'): {err}")
                continue
            table.add(f"_host_probe('{what}')", "host", per_call, note)

    # ---- the entries
    table.section("entries called directly (busy: behind a GPU sleep)")
    # DecodeStep.decode's arguments: flash_mla_with_kvcache's (schedule aside), then out and lse.
    dense_args = (q, k_cache, block_table, seqlens, D_V, None, True, False, None, None, None, None, None, None)
    busy("DecodeStep.decode dense, outputs allocated", lambda: step.decode(*dense_args, None, None))
    busy("DecodeStep.decode dense, out= lse= given", lambda: step.decode(*dense_args, out, lse))
    sparse_args = (sq, fp8, None, None, D_V, None, False, True, indices, sink, None, None, None, None)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        busy("DecodeStep.decode dense, out= lse= given, on a side stream (not the legacy one)",
             lambda: step.decode(*dense_args, out, lse))
    torch.cuda.synchronize()
    step.decode(*dense_args, out, lse)  # back on the default stream (the object orders the two)
    busy("DecodeStep.decode sparse, outputs allocated", lambda: sstep.decode(*sparse_args, None, None))
    busy("DecodeStep.decode sparse, out= lse= given", lambda: sstep.decode(*sparse_args, sout, slse))
    busy("TensorStyleDecode.decode (dense), outputs allocated",
         lambda: dec._TENSOR_STYLE.decode(q, k_cache, block_table, seqlens, D_V, tile_md, num_splits, None, True, False,
                                          None, None, None, None, None, None, None, None))
    busy("sparse_prefill_call, outputs allocated",
         lambda: C.sparse_prefill_call(pq, pkv, pidx, scale, D_V, None, None, None, None, None))
    busy("kv_cache_append_call", lambda: C.kv_cache_append_call(new_kv, slots, fp8, "v32"))

    table.section("package functions (busy)")
    for default in (False, True):
        suffix = ", default device cuda" if default else ""
        if default:
            torch.set_default_device("cuda")
        try:
            busy("flash_mla_with_kvcache dense" + suffix,
                 lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True))
            busy("flash_mla_with_kvcache dense, out= lse=" + suffix,
                 lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True,
                                                        out=out, lse=lse))
            busy("flash_mla_with_kvcache sparse" + suffix,
                 lambda: openmla.flash_mla_with_kvcache(sq, fp8, None, None, D_V, smeta, is_fp8_kvcache=True,
                                                        indices=indices, attn_sink=sink))
            busy("flash_mla_sparse_fwd" + suffix, lambda: openmla.flash_mla_sparse_fwd(pq, pkv, pidx, scale))
            busy("flash_attn_varlen_func (MHA prefill, 2 x 2048 tokens)" + suffix,
                 lambda: openmla.flash_attn_varlen_func(mq, mk, mv, cu, cu, 2048, 2048, causal=True))
        finally:
            if default:
                torch.set_default_device(None)
    busy("torch.ops.openmla.flash_mla_with_kvcache (dense tensor style)",
         lambda: torch.ops.openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, tile_md, num_splits,
                                                          None, True))
    busy("get_mla_metadata() + first call (plans)",
         lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, openmla.get_mla_metadata()[0],
                                                causal=True))

    # ---- deep queues: the suite queues 300 calls behind one sleep
    table.section("per-call us against the calls already queued behind one sleep (median of 7 sweeps)")
    for name, fn in (("DecodeStep.decode dense, out= lse= given", lambda: step.decode(*dense_args, out, lse)),
                     ("DecodeStep.decode dense, outputs allocated", lambda: step.decode(*dense_args, None, None))):
        sweeps = []
        for _ in range(7):
            torch.cuda._sleep(int(40e-3 * 2.0e9))  # 40 ms: longer than 320 calls take
            per_batch = []
            for _ in range(10):
                t0 = time.perf_counter_ns()
                for _ in range(PER_BATCH):
                    fn()
                per_batch.append((time.perf_counter_ns() - t0) / PER_BATCH / 1e3)
            torch.cuda.synchronize()
            sweeps.append(per_batch)
        series = "  ".join(f"{i * PER_BATCH}:{statistics.median(s[i] for s in sweeps):.1f}" for i in range(10))
        print(f"  {name}: {series}", flush=True)

    # ---- after a profiler session in this process
    table.section("after a torch.profiler session in this process (as the suites before host_overhead leave it)")
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            for _ in range(4):
                step.decode(*dense_args, out, lse)
            torch.cuda.synchronize()
        busy("DecodeStep.decode dense, out= lse= given (after the profiler)",
             lambda: step.decode(*dense_args, out, lse))
        busy("flash_mla_with_kvcache dense (after the profiler)",
             lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=True))
        if probe is not None:
            table.add("_host_probe('launch_context') (after the profiler)", "host",
                      [x / 1e3 for x in probe("launch_context", batches, q)])
    except Exception as err:  # noqa: BLE001 - a diagnostic: say why and go on
        print(f"  (profiler section skipped: {type(err).__name__}: {err})")

    torch.cuda.synchronize()
    print(f"\nhost_profile: {len(table.rows)} rows in {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
