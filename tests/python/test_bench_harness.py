"""CPU-only tests of the benchmark harness's CUPTI timing logic (benchmarks/harness.py): splitting a recorded
kernel stream into calls, kernel short names, and the decode record's timing fields. No torch, no GPU."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import harness  # noqa: E402

FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, std::array<char*, 1ul> >" \
       "(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)"
MAIN = "void openmla::sparse_decode_kernel<true>(openmla::SparseDecodeParams)"
COMBINE = "void openmla::combine_kernel(openmla::CombineParams)"


def _stream(calls, flush_launches=2, t0=100.0):
    """Synthetic (name, start_us, dur_us) records: per call, `flush_launches` fill kernels of 1000 us, then the
    call's kernels given as (name, gap_after_previous_end_us, dur_us); returns the records in stream order."""
    records, t = [], t0
    for kernels in calls:
        for _ in range(flush_launches):
            records.append((FILL, t, 1000.0))
            t += 1000.0
        for name, gap, dur in kernels:
            t += gap
            records.append((name, t, dur))
            t += dur
        t += 50.0
    return records


def test_split_regular_calls():
    calls = [[(MAIN, 2.0, 20.0 + i), (COMBINE, 1.0, 3.0)] for i in range(5)]
    split = harness.split_kernel_calls(_stream(calls), expected_calls=5)
    assert split.names == [MAIN, COMBINE]
    assert split.found == 5 and split.dropped == 0
    assert split.spans_us == pytest.approx([24.0 + i for i in range(5)])
    assert split.durations_us[0] == pytest.approx([20.0 + i for i in range(5)])
    assert split.durations_us[1] == pytest.approx([3.0] * 5)


def test_split_flush_name_given_and_unsorted_input():
    calls = [[(MAIN, 2.0, 20.0), (COMBINE, 1.0, 3.0)] for _ in range(4)]
    records = list(reversed(_stream(calls, flush_launches=3)))
    split = harness.split_kernel_calls(records, FILL, expected_calls=4)
    assert split.found == 4 and split.names == [MAIN, COMBINE]
    assert split.spans_us == pytest.approx([24.0] * 4)


def test_split_overlapping_kernels_span_is_last_end_minus_first_start():
    # PDL: the combine kernel starts before the main kernel ends; the span is max(end) - min(start).
    records = _stream([[(MAIN, 0.0, 20.0), (COMBINE, -5.0, 3.0)] for _ in range(3)])
    split = harness.split_kernel_calls(records, expected_calls=3)
    assert split.spans_us == pytest.approx([20.0] * 3)


def test_split_drops_malformed_call():
    good = [(MAIN, 2.0, 20.0), (COMBINE, 1.0, 3.0)]
    calls = [good, good, [(MAIN, 2.0, 99.0)], good, [(MAIN, 2.0, 20.0), ("void stray_kernel()", 0.0, 1.0),
                                                      (COMBINE, 1.0, 3.0)], good]
    split = harness.split_kernel_calls(_stream(calls), expected_calls=6)
    assert split.found == 6 and split.dropped == 2
    assert len(split.spans_us) == 4
    assert split.spans_us == pytest.approx([24.0] * 4)
    assert split.durations_us[0] == pytest.approx([20.0] * 4)  # the malformed call's 99 us is not counted


def test_split_raises_when_fewer_than_half_remain():
    good = [(MAIN, 2.0, 20.0), (COMBINE, 1.0, 3.0)]
    calls = [good, good, [(MAIN, 2.0, 20.0)], [(COMBINE, 2.0, 3.0)], [(MAIN, 1.0, 5.0), (MAIN, 1.0, 5.0)]]
    with pytest.raises(ValueError, match="only 2 of 5"):
        harness.split_kernel_calls(_stream(calls), expected_calls=5)
    # Calls missing from the stream altogether (fewer found than iterations) count against the half too.
    with pytest.raises(ValueError, match="only 2 of 6"):
        harness.split_kernel_calls(_stream([good, good]), expected_calls=6)


def test_split_raises_when_flush_name_occurs_inside_the_call():
    # The call itself launches a kernel named like the flush: more calls than iterations.
    calls = [[(MAIN, 2.0, 20.0), (FILL, 1.0, 2.0), (COMBINE, 1.0, 3.0)] for _ in range(3)]
    with pytest.raises(ValueError, match="also occurs inside the call"):
        harness.split_kernel_calls(_stream(calls, flush_launches=1), expected_calls=3)


def test_split_ignores_kernels_before_first_flush_and_rejects_empty():
    records = [("void leftover()", 0.0, 5.0)] + _stream([[(MAIN, 2.0, 20.0)]] * 2)
    split = harness.split_kernel_calls(records, FILL, expected_calls=2)
    assert split.found == 2 and split.names == [MAIN]
    with pytest.raises(ValueError, match="no kernels recorded"):
        harness.split_kernel_calls([])
    with pytest.raises(ValueError, match="launched nothing"):
        harness.split_kernel_calls([(FILL, 0.0, 1.0), (FILL, 2.0, 1.0)])


def test_short_kernel_name():
    assert harness.short_kernel_name(MAIN) == "sparse_decode_kernel"
    assert harness.short_kernel_name(COMBINE) == "combine_kernel"
    assert harness.short_kernel_name(FILL) == "vectorized_elementwise_kernel"
    assert harness.short_kernel_name("void (anonymous namespace)::probe<1>(int)") == "probe"
    assert harness.short_kernel_name("_Z6kernelPf") == "_Z6kernelPf"


def test_kernel_timing_lookup():
    t = harness.KernelTiming("cupti", 24.0, [24.0], [("sparse_decode_kernel", 20.0), ("combine_kernel", 3.0)])
    assert t.median_us == 24.0
    assert t.kernel_us("decode_kernel") == 20.0
    assert t.kernel_us("combine") == 3.0
    assert t.kernel_us("nothing") is None


def _fake_harness(monkeypatch, timing, graph_us=28.6, eager_us=30.0):
    h = harness.Harness({})
    monkeypatch.setattr(h, "time_graph_and_eager", lambda call: (graph_us, eager_us))
    monkeypatch.setattr(h, "time_cupti", lambda call: timing)
    monkeypatch.setattr(h, "rest_before_timing", lambda call: None)
    return h


def test_time_decode_call_cupti_fields(monkeypatch):
    t = harness.KernelTiming("cupti", 25.3, [25.3] * 3, [("sparse_decode_kernel", 20.0), ("combine_kernel", 3.0)],
                             calls=3)
    fields = _fake_harness(monkeypatch, t).time_decode_call(lambda: None)
    assert fields == {"time_us": 25.3, "timing_method": "cupti", "graph_event_time_us": 28.6,
                      "eager_time_us": 30.0, "main_kernel_us": 20.0,
                      "kernels": [["sparse_decode_kernel", 20.0], ["combine_kernel", 3.0]]}
    # No kernel with the main kernel's name: the call's first kernel.
    t = harness.KernelTiming("cupti", 25.3, [25.3], [("other_kernel", 21.0), ("combine_kernel", 3.0)])
    assert _fake_harness(monkeypatch, t).time_decode_call(lambda: None)["main_kernel_us"] == 21.0


def test_time_decode_call_events_fallback(monkeypatch):
    t = harness.KernelTiming("events", 30.0, [30.0], note="CUPTI timing unavailable: no CUPTI")
    fields = _fake_harness(monkeypatch, t).time_decode_call(lambda: None)
    assert fields["timing_method"] == "events"
    assert fields["time_us"] == 28.6  # the event-timed graph replay, the figure used before CUPTI timing
    assert fields["main_kernel_us"] is None and fields["kernels"] == []
    assert "no CUPTI" in fields["timing_note"] and "graph replay" in fields["timing_note"]


# ------------------------------------------------------------------------------------------------
# time_cupti's glue, against a fake torch whose "GPU" appends kernel records to a timeline
# ------------------------------------------------------------------------------------------------
class _FakeEvent:
    def __init__(self, name, start, end, device="DeviceType.CUDA"):
        self.name, self.device_type = name, device
        self.time_range = type("Interval", (), {"start": start, "end": end})()


class _FakeGpu:
    def __init__(self):
        self.t, self.events, self.recording = 0.0, [], False

    def launch(self, name, dur, gap=1.0):
        self.t += gap
        if self.recording:
            self.events.append(_FakeEvent("cudaLaunchKernel", self.t - 0.5, self.t, "DeviceType.CPU"))
            self.events.append(_FakeEvent(name, self.t, self.t + dur))
        self.t += dur


def _fake_torch(monkeypatch, gpu, record_kernels=True, events_api=True):
    import json
    import types

    class Profile:
        def __init__(self, activities):
            assert activities == ["CUDA"]

        def __enter__(self):
            gpu.recording = record_kernels
            return self

        def __exit__(self, *exc):
            gpu.recording = False

        def events(self):
            if not events_api:
                raise RuntimeError("no events() in this build")
            return list(gpu.events)

        def export_chrome_trace(self, path):
            trace = [{"cat": "kernel" if e.device_type.endswith("CUDA") else "cuda_runtime", "name": e.name,
                      "ts": e.time_range.start, "dur": e.time_range.end - e.time_range.start}
                     for e in gpu.events if not e.name.startswith("Memset")]
            with open(path, "w") as f:
                json.dump({"traceEvents": trace}, f)

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None)
    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="CUDA")
    profiler.profile = Profile
    torch.profiler = profiler
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)
    flush = types.SimpleNamespace(zero_=lambda: [gpu.launch(FILL, 1000.0) for _ in range(4)])
    monkeypatch.setattr(harness, "_flush_buffer", lambda torch_module: flush)


@pytest.mark.parametrize("events_api", [True, False], ids=["events", "chrome-trace"])
def test_time_cupti_with_fake_profiler(monkeypatch, events_api):
    gpu = _FakeGpu()
    _fake_torch(monkeypatch, gpu, events_api=events_api)
    durations = iter([20.0 + i for i in range(100)])

    def call():
        gpu.launch(MAIN, next(durations), gap=2.0)
        gpu.launch("Memset (Device)", 1.0, gap=0.0)  # not a kernel: left out
        gpu.launch(COMBINE, 3.0)

    t = harness.time_cupti(call, warmup=3, reps=5)
    assert t.method == "cupti" and t.calls == 5 and t.dropped == 0 and t.note == ""
    # warm-up used durations 20..22; the timed calls 23..27; span = main + memset + gap 1 + combine
    assert t.samples_us == pytest.approx([d + 1.0 + 1.0 + 3.0 for d in (23, 24, 25, 26, 27)])
    assert t.span_us == pytest.approx(30.0)
    assert t.kernels == [("sparse_decode_kernel", pytest.approx(25.0)), ("combine_kernel", pytest.approx(3.0))]


def test_time_cupti_falls_back_to_events_without_kernels(monkeypatch):
    gpu = _FakeGpu()
    _fake_torch(monkeypatch, gpu, record_kernels=False)
    seen = {}

    def fake_time_cuda(fn, *, warmup, reps, flush_l2):
        seen.update(warmup=warmup, reps=reps, flush_l2=flush_l2)
        return harness.Timing(28.6, [28.6] * reps)

    monkeypatch.setattr(harness, "time_cuda", fake_time_cuda)
    t = harness.time_cupti(lambda: gpu.launch(MAIN, 20.0), warmup=2, reps=7)
    assert t.method == "events" and t.span_us == 28.6 and t.kernels == []
    assert "no kernel" in t.note
    assert seen == {"warmup": 0, "reps": 7, "flush_l2": True}  # warmed up already
