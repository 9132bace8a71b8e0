"""The timing helpers of OpenMLA's benchmarks, and the two ceilings every figure is compared with.

Two ways to time a call (docs/perf-method.md has the reasoning):
  - time_cupti: the GPU's own kernel timestamps (CUDA activity records through torch.profiler, i.e.
    CUPTI/kineto), as FlashMLA's harness took the figures of docs/targets.md.
    The figure is the span of the call's kernels: last kernel end - first kernel start, per call, median
    over the calls. The decode benchmarks report it, on the eager call, as time_us: like for like with
    docs/targets.md. Nothing is written to disk (the profiler's events are read in memory).
  - time_cuda: CUDA events recorded around fn on the stream. The decode benchmarks still record the
    event-timed CUDA-graph replay beside the CUPTI span (graph_event_time_us): it contains a few us of
    graph-launch / event overhead that CUPTI's kernel times do not (sparse b = 2: 28.6 us event-timed
    replay vs 25.3 us CUPTI span of the same kernels), which matters on latency-bound rows only. The
    KV-cache codec suite is timed this way (its targets come from the copy ceiling, timed the same way).

Both share the rest of the recipe:
  - warm-up calls first (lazy initialisation, schedule building, clocks up);
  - before EVERY timed call an 8 GB buffer is zeroed (as FlashMLA's own harness does): the call starts
    with a cold L2 as it would in a model (another layer's weights went through L2 in between), and after
    ~2.7 ms of memory-bound work rather than right after the previous heavy call, the same power state as
    the reference figures (back-to-back compute-bound calls lower the SM clock: docs/perf-method.md). The
    flush is outside the timed region (events: recorded around fn only, after the flush on the same
    stream; CUPTI: the flush kernels are the separators between calls and are not part of any call); the
    flush kernel also keeps the GPU busy while the host enqueues fn, so host launch overhead is hidden
    the way it is in a captured model step;
  - one host synchronisation after all repetitions; the result is the median of the per-call times.

Torch is imported lazily: importing this module needs neither torch nor a GPU (split_kernel_calls, the
pure part of time_cupti, is unit-tested on the CPU).
"""
from __future__ import annotations

import collections
import datetime
import time
import json
import os
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field

import formulas  # noqa: F401  (re-exported as Harness.formulas; benchmarks/ is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flush buffer: the reference harness's 8 GB (OPENMLA_BENCH_FLUSH_BYTES overrides it, e.g. 268435456 for
# back-to-back timing), at most a quarter of the free device memory, and never below twice the L2
# (H100: 50 MB, H200: 60 MB) or 256 MiB.
_FLUSH_BYTES = 8_000_000_000
_MIN_FLUSH_BYTES = 256 << 20
_flush_buffers: dict = {}
# Pause before each decode case's reported timing, as FlashMLA's decode tests sleep 0.3 s between perf cases.
COOLDOWN_S = 0.3


def flush_bytes_requested() -> int:
    return int(os.environ.get("OPENMLA_BENCH_FLUSH_BYTES", _FLUSH_BYTES))


def _torch():
    try:
        import torch
    except Exception as err:  # pragma: no cover - depends on the machine
        raise RuntimeError(f"benchmarks need PyTorch with CUDA: {err}") from err
    if not torch.cuda.is_available():
        raise RuntimeError("benchmarks need a CUDA device; none is visible")
    return torch


class SkipCase(Exception):
    """Raised by a benchmark module's run(case, harness) when the case cannot run in this build or on this device for a
    reason that is not a failure (a kernel family not built, a feature the module probes first): run.py prints the
    reason and records it under "skipped_cases" instead of an error."""


@dataclass
class Timing:
    median_us: float
    samples_us: list = field(repr=False)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    @property
    def max_us(self) -> float:
        return max(self.samples_us)


def _flush_buffer(torch):
    dev = torch.cuda.current_device()
    buf = _flush_buffers.get(dev)
    if buf is None:
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
        free, _ = torch.cuda.mem_get_info(dev)
        nbytes = max(_MIN_FLUSH_BYTES, 2 * l2, min(flush_bytes_requested(), free // 4))
        buf = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
        _flush_buffers[dev] = buf
    return buf


def flush_buffer():
    """The buffer the harness zeroes before every timed call (tools that time their own way reuse it)."""
    return _flush_buffer(_torch())


def time_cuda(fn, *, warmup: int = 10, reps: int = 50, flush_l2: bool = True) -> Timing:
    """Times fn() (which launches work on torch's current stream) with CUDA events.

    Returns a Timing: median_us (the figure to report) and all samples in microseconds.
    """
    torch = _torch()
    if reps < 1:
        raise ValueError("argument 'reps' must be >= 1")
    flush = _flush_buffer(torch) if flush_l2 else None
    for _ in range(warmup):
        if flush is not None:
            flush.zero_()
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()  # outside the timed region: the start event is recorded after it on the stream
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return Timing(statistics.median(samples), samples)


# ------------------------------------------------------------------------------------------------
# CUPTI kernel timing (the reference harness's way)
# ------------------------------------------------------------------------------------------------
@dataclass
class KernelTiming:
    """What time_cupti returns.

    method: "cupti" (kernel activity records) or "events" (the fallback: time_cuda's event timing of fn,
            when the profiler is unavailable or recorded no kernel; `note` says why).
    span_us: the figure to report: median over the calls of (last kernel end - first kernel start);
             with "events", the event-timed median.
    samples_us: the per-call spans (or event times), in call order.
    kernels: [(short name, median duration us)] of the call's kernels, in call order ([] with "events").
    calls, dropped: calls kept, and calls dropped because their kernels differed from the usual sequence.
    """

    method: str
    span_us: float
    samples_us: list = field(repr=False)
    kernels: list = field(default_factory=list)
    calls: int = 0
    dropped: int = 0
    note: str = ""

    @property
    def median_us(self) -> float:
        """The same figure as span_us (a Timing-compatible name)."""
        return self.span_us

    def kernel_us(self, name_part: str) -> float | None:
        """Median duration of the first kernel of the call whose short name contains name_part, or None."""
        return next((us for name, us in self.kernels if name_part in name), None)


@dataclass
class CallSplit:
    """split_kernel_calls' result: the calls found in a kernel stream, and what the kept ones took.

    names: the full names of one call's kernels, in order (the same for every kept call);
    spans_us: per kept call, last kernel end - first kernel start;
    durations_us: per kernel position of the call, its durations over the kept calls;
    found: calls found (a flush group followed by at least one kernel); dropped: found - kept.
    """

    names: list
    spans_us: list
    durations_us: list
    found: int
    dropped: int


def short_kernel_name(name: str) -> str:
    """'void openmla::sparse_decode_kernel<...>(Params)' -> 'sparse_decode_kernel' (the function's own name)."""
    s = name.strip().replace("(anonymous namespace)", "anon")
    if s.startswith("void "):
        s = s[len("void "):]
    cut = min((i for i in (s.find("<"), s.find("(")) if i >= 0), default=len(s))
    s = s[:cut].rsplit("::", 1)[-1].strip()
    return s or name.strip()[:60]


def split_kernel_calls(kernels, flush_name: str | None = None, *, expected_calls: int | None = None) -> CallSplit:
    """Splits a recorded kernel stream into calls (pure: no torch, no GPU).

    kernels: (name, start_us, duration_us) per kernel, in any order (sorted by start here).
    flush_name: the name of the kernel every iteration starts with (the flush); None takes the first
      kernel's name, since every iteration starts with the flush. A run of consecutive flush kernels is one
      flush (zeroing 8 GB is several launches of the same fill kernel); the kernels after it, up to the next
      flush, are one call. Kernels before the first flush are ignored.
    expected_calls: the number of iterations recorded; more calls than that means the flush kernel's name
      also occurs inside the call, and the split cannot be trusted (ValueError).

    Every kept call has the same kernel sequence: the most common one; calls that differ (a kernel lost by
    the profiler, a stray kernel) are dropped. Raises ValueError when no call is found or fewer than half of
    the calls (of expected_calls when given) remain.
    """
    records = sorted(((str(n), float(s), float(d)) for n, s, d in kernels), key=lambda k: k[1])
    if not records:
        raise ValueError("no kernels recorded")
    if flush_name is None:
        flush_name = records[0][0]
    calls, cur = [], None
    for name, start, dur in records:
        if name == flush_name:
            if cur:
                calls.append(cur)
            cur = []  # a run of flush kernels is one flush: cur stays empty until fn's first kernel
        elif cur is not None:
            cur.append((name, start, dur))
    if cur:
        calls.append(cur)
    found = len(calls)
    if not found:
        raise ValueError(f"no kernel between the flushes ({flush_name!r}): the call launched nothing that "
                         "the profiler recorded")
    if expected_calls is not None and found > expected_calls:
        raise ValueError(f"{found} calls found in {expected_calls} iterations: the flush kernel's name "
                         f"({flush_name!r}) also occurs inside the call, so the stream cannot be split on it")
    sequences = collections.Counter(tuple(k[0] for k in c) for c in calls)
    names = list(sequences.most_common(1)[0][0])
    kept = [c for c in calls if [k[0] for k in c] == names]
    wanted = expected_calls if expected_calls is not None else found
    if 2 * len(kept) < wanted:
        raise ValueError(f"only {len(kept)} of {wanted} calls have the usual kernel sequence "
                         f"({' -> '.join(short_kernel_name(n) for n in names)}); {found} calls found")
    spans = [max(s + d for _, s, d in c) - min(s for _, s, _ in c) for c in kept]
    durations = [[c[i][2] for c in kept] for i in range(len(names))]
    return CallSplit(names=names, spans_us=spans, durations_us=durations, found=found, dropped=found - len(kept))


_NON_KERNEL_PREFIXES = ("Memcpy", "Memset", "Device Synchronize", "Context Synchronize", "Stream Synchronize",
                        "Event Synchronize", "Stream Wait Event")


def _profiled_kernels(prof) -> list:
    """(name, start_us, duration_us) of every GPU kernel the profiler recorded.

    Read in memory from prof.events() (FunctionEvents on the CUDA device, as FlashMLA's bench.py reads
    them; copies, memsets and synchronisation records left out by name); if that yields nothing, from the
    Chrome trace (events with cat == "kernel"), written to a temporary file that is removed at once."""
    kernels = []
    try:
        for ev in prof.events():
            on_gpu = str(getattr(ev, "device_type", "")).rsplit(".", 1)[-1] == "CUDA"  # DeviceType.CUDA
            if not on_gpu or ev.name.startswith(_NON_KERNEL_PREFIXES):
                continue
            start, end = float(ev.time_range.start), float(ev.time_range.end)
            kernels.append((ev.name, start, end - start))
    except Exception:
        kernels = []
    if kernels:
        return kernels
    fd, path = tempfile.mkstemp(prefix="openmla_cupti_", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.remove(path)
    return [(e["name"], float(e["ts"]), float(e.get("dur", 0.0))) for e in events if e.get("cat") == "kernel"]


def time_cupti(fn, *, warmup: int = 10, reps: int = 50, flush_l2: bool = True) -> KernelTiming:
    """Times fn() (which launches work on torch's current stream) by its kernels' GPU timestamps (CUPTI).

    `warmup` calls (each after the flush), a synchronisation, then under torch.profiler (CUDA activity only)
    `reps` iterations of flush.zero_() (time_cuda's flush buffer) and fn(). The flush kernels separate the
    calls (split_kernel_calls); each call's figure is its span, first kernel start to last kernel end, the
    "end-to-end" time of FlashMLA's harness. With flush_l2=False a 4-byte buffer is zeroed instead, only to
    mark where each call starts.

    Returns a KernelTiming (method "cupti"); if the profiler is unavailable, fails, or records no kernel
    (no CUPTI), falls back to time_cuda's event timing of fn (method "events", `note` says why). A kernel
    stream that cannot be split (see split_kernel_calls) raises ValueError.
    """
    torch = _torch()
    if reps < 1:
        raise ValueError("argument 'reps' must be >= 1")
    marker = _flush_buffer(torch) if flush_l2 else torch.empty(1, dtype=torch.int32, device="cuda")
    for _ in range(warmup):
        if flush_l2:
            marker.zero_()
        fn()
    torch.cuda.synchronize()

    reason, kernels = None, []
    try:
        from torch.profiler import ProfilerActivity, profile
    except Exception as err:  # pragma: no cover - depends on the build of torch
        reason = f"torch.profiler is not available ({type(err).__name__}: {err})"
    if reason is None:
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    marker.zero_()
                    fn()
                torch.cuda.synchronize()
            kernels = _profiled_kernels(prof)
        except Exception as err:  # pragma: no cover - depends on the machine
            reason = f"torch.profiler failed ({type(err).__name__}: {err})"
        else:
            if not kernels:
                reason = "the profiler recorded no kernel (no CUPTI in this environment?)"
    if reason is not None:
        t = time_cuda(fn, warmup=0, reps=reps, flush_l2=flush_l2)
        return KernelTiming("events", t.median_us, t.samples_us, calls=reps,
                            note=f"CUPTI timing unavailable: {reason}; CUDA-event timing instead")

    split = split_kernel_calls(kernels, expected_calls=reps)
    medians = [(short_kernel_name(n), statistics.median(d)) for n, d in zip(split.names, split.durations_us)]
    kept = len(split.spans_us)
    note = "" if kept == reps else (f"{kept} of {reps} calls kept ({split.dropped} dropped: kernel sequence "
                                    f"differed; {max(reps - split.found, 0)} not found in the trace)")
    return KernelTiming("cupti", statistics.median(split.spans_us), split.spans_us, medians,
                        calls=kept, dropped=split.dropped, note=note)


def measure_ceilings(reps: int = 10) -> dict:
    """The two ceilings, measured once per run on the current device (median of `reps`):

    copy_gbps: device-to-device copy of 1 GiB, counting bytes read + written (the roof of
               memory-bound kernels: decode at small h_q, the KV-cache codec);
    matmul_tflops: bf16 8192^3 torch.matmul (cuBLAS), the roof of compute-bound kernels.
    """
    torch = _torch()
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = time_cuda(lambda: dst.copy_(src), warmup=3, reps=reps, flush_l2=False)
    del src, dst

    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
    mm = time_cuda(lambda: torch.matmul(a, b, out=c), warmup=3, reps=reps, flush_l2=False)
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "copy_gbps": 2.0 * nbytes / (copy.median_us * 1e-6) / 1e9,
        "copy_bytes": 2 * nbytes,
        "matmul_tflops": 2.0 * n**3 / (mm.median_us * 1e-6) / 1e12,
        "matmul_shape": [n, n, n],
        "reps": reps,
    }


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:
        pass
    return "cpu"


def device_slug(name: str | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (for file names)."""
    name = (name or device_name()).lower().replace("nvidia", "")
    slug = "".join(ch if ch.isalnum() else "-" for ch in name)
    return "-".join(p for p in slug.split("-") if p) or "unknown"


def git_commit() -> str:
    """The commit benchmarked: $OPENMLA_GIT_COMMIT (set where the tree has no .git, e.g. the GPU
    machine), else `git rev-parse` (with '-dirty' when the tree has changes), else the commit the
    extension was built from."""
    env = os.environ.get("OPENMLA_GIT_COMMIT")
    if env:
        return env
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True).returncode
        return sha + ("-dirty" if dirty else "")
    except Exception:
        pass
    try:
        import openmla

        return openmla.build_commit()
    except Exception:
        return "unknown"


def timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Harness:
    """What run.py hands to each benchmark module's run(case, harness).

    harness.time_cuda(fn, ...)  CUDA-event timing, with this run's default warm-up and repetitions
    harness.time_cupti(fn, ...) CUPTI kernel timing (span of the call's kernels), same defaults
    harness.time_graph_and_eager(call)  (graph replay us, eager us) of a call that plans on first use, by events
    harness.time_decode_call(call)  the timing fields of a decode record: CUPTI span of the eager call as
                                time_us, the event-timed graph replay and eager call beside it
    harness.formulas            benchmarks/formulas.py (FLOP and byte counts)
    harness.ceilings            {"copy_gbps": ..., "matmul_tflops": ...} measured at the start
    harness.device              the device name
    harness.quick               True for a short run (gpu_check): modules may use fewer/smaller cases
    """

    formulas = formulas

    def __init__(self, ceilings: dict, *, warmup: int = 10, reps: int = 50, quick: bool = False):
        self.ceilings = ceilings
        self.warmup = warmup
        self.reps = reps
        self.quick = quick
        self.device = device_name()

    def time_cuda(self, fn, *, warmup: int | None = None, reps: int | None = None, flush_l2: bool = True) -> Timing:
        return time_cuda(fn, warmup=self.warmup if warmup is None else warmup,
                         reps=self.reps if reps is None else reps, flush_l2=flush_l2)

    def time_cupti(self, fn, *, warmup: int | None = None, reps: int | None = None,
                   flush_l2: bool = True) -> KernelTiming:
        return time_cupti(fn, warmup=self.warmup if warmup is None else warmup,
                          reps=self.reps if reps is None else reps, flush_l2=flush_l2)

    def time_graph_and_eager(self, call) -> tuple[float, float]:
        """(graph_us, eager_us) by CUDA events: call() once (it plans what it plans on first use), captures one
        more call in a CUDA graph and times its replay, then times the eager call (wrapper included)."""
        torch = _torch()
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize()
        return self.time_cuda(graph.replay).median_us, self.time_cuda(call).median_us

    def rest_before_timing(self, call) -> None:
        """call() once (it plans on first use), waits for it, then pauses COOLDOWN_S."""
        torch = _torch()
        call()
        torch.cuda.synchronize()
        time.sleep(COOLDOWN_S)

    def time_decode_call(self, call, *, main_kernel: str = "decode_kernel") -> dict:
        """The timing fields of a decode record, timed like the reference (docs/targets.md, FlashMLA's harness):

        time_us              CUPTI span of the eager call's kernels (main kernel + combine), median
                             (time_cupti); the figure the ratio to the target uses
        timing_method        "cupti", or "events" where CUPTI is unavailable: time_us is then the event-timed
                             graph replay (the figure reported before CUPTI timing) and timing_note says why
        graph_event_time_us  CUDA-event time of a CUDA-graph replay of the call (time_graph_and_eager)
        eager_time_us        CUDA-event time of the eager call (Python wrapper included)
        main_kernel_us       median duration of the attention kernel alone (the first kernel whose short name
                             contains `main_kernel`, else the call's first kernel); None with "events"
        kernels              [[short name, median us], ...] of the call's kernels in call order
        timing_note          only when there is something to say (fallback, dropped calls)
        """
        # The reported figure first, from a rested GPU: the call once (it plans on first use), then a pause like the
        # reference's tests take between cases (0.3 s), then the CUPTI pass. Timing it after the graph and eager
        # event passes (100 more heavy calls) let the SM clock sag: dense s_q = 2, 32K read 3605-3688 us by CUPTI
        # right after 3505 us by graph events (nvidia-h100-x1, 281249c).
        self.rest_before_timing(call)
        t = self.time_cupti(call)
        graph_us, eager_us = self.time_graph_and_eager(call)
        fields = {
            "time_us": t.span_us if t.method == "cupti" else graph_us,
            "timing_method": t.method,
            "graph_event_time_us": graph_us,
            "eager_time_us": eager_us,
            "main_kernel_us": None,
            "kernels": [[name, us] for name, us in t.kernels],
        }
        if t.kernels:
            main = t.kernel_us(main_kernel)
            fields["main_kernel_us"] = t.kernels[0][1] if main is None else main
        if t.note:
            fields["timing_note"] = t.note + ("; time_us is the event-timed graph replay" if t.method != "cupti"
                                              else "")
        return fields
