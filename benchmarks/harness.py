"""The one timing helper of OpenMLA's benchmarks, and the two ceilings every figure is compared with.

How a call is timed (docs/perf-method.md has the reasoning):
  - warm-up calls first (lazy initialisation, schedule building, clocks up);
  - before EVERY timed call an 8 GB buffer is zeroed (as FlashMLA's own harness does, whose figures
    targets.md holds): the call starts with a cold L2 as it would in a model (another layer's weights went
    through L2 in between), and after ~2.7 ms of memory-bound work rather than right after the previous
    heavy call, the same power state as the reference figures (back-to-back compute-bound calls lower the
    SM clock: docs/perf-method.md). The flush runs outside the timed region: the CUDA events are recorded
    around fn only, on the same stream, after the flush; the flush kernel also keeps the GPU busy while
    the host enqueues fn, so host launch overhead is hidden the way it is in a captured model step;
  - one host synchronisation after all repetitions; the result is the median of the per-call times.

Torch is imported lazily: importing this module needs neither torch nor a GPU.
"""
from __future__ import annotations

import datetime
import os
import statistics
import subprocess
from dataclasses import dataclass, field

import formulas  # noqa: F401  (re-exported as Harness.formulas; benchmarks/ is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flush buffer: the reference harness's 8 GB (OPENMLA_BENCH_FLUSH_BYTES overrides it, e.g. 268435456 for
# back-to-back timing), at most a quarter of the free device memory, and never below twice the L2
# (H100: 50 MB, H200: 60 MB) or 256 MiB.
_FLUSH_BYTES = 8_000_000_000
_MIN_FLUSH_BYTES = 256 << 20
_flush_buffers: dict = {}


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

    harness.time_cuda(fn, ...)  the timing helper, with this run's default warm-up and repetitions
    harness.time_graph_and_eager(call)  (graph replay us, eager us) of a call that plans on first use
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

    def time_graph_and_eager(self, call) -> tuple[float, float]:
        """(graph_us, eager_us): call() once (it plans what it plans on first use), captures one more call in a
        CUDA graph and times its replay (the figure reported), then times the eager call (wrapper included)."""
        torch = _torch()
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize()
        return self.time_cuda(graph.replay).median_us, self.time_cuda(call).median_us
