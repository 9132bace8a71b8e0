"""CPU-only tests of the same-run peer comparison (benchmarks/peer.py) and its columns in run.py's table: which
shapes FlashMLA serves, the fallback to the docs/targets.md figures, the record fields, the output check (numpy
arrays stand in for tensors) and measure() against a stub flash_mla module. No torch, no GPU."""
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import harness  # noqa: E402
import peer  # noqa: E402

np = pytest.importorskip("numpy")


# ------------------------------------------------------------------------------------------------
# Which shapes the peer serves
# ------------------------------------------------------------------------------------------------
def test_unsupported_reason_dense_decode():
    assert peer.unsupported_reason("dense_decode", h_q=128, d_qk=576) is None
    assert peer.unsupported_reason("dense_decode", h_q=16, d_qk=576) is None
    assert peer.unsupported_reason("dense_decode", h_q=9, d_qk=576, h_kv=3) is None
    assert "576" in peer.unsupported_reason("dense_decode", h_q=128, d_qk=512)
    assert "page 64" in peer.unsupported_reason("dense_decode", h_q=128, d_qk=576, page=32)
    assert "fp16" in peer.unsupported_reason("dense_decode", h_q=128, d_qk=576, dtype="fp16")
    assert "h_kv" in peer.unsupported_reason("dense_decode", h_q=128, d_qk=576, h_kv=3)


def test_unsupported_reason_sparse():
    for suite in ("sparse_decode", "sparse_prefill"):
        assert peer.unsupported_reason(suite, h_q=128, d_qk=576, topk=2048) is None
        assert peer.unsupported_reason(suite, h_q=64, d_qk=512, topk=512) is None  # MODEL1 is served
        assert "h_q 64 and 128" in peer.unsupported_reason(suite, h_q=16, d_qk=576, topk=2048)
        assert "h_kv" in peer.unsupported_reason(suite, h_q=64, d_qk=576, topk=2048, h_kv=2)
        assert "d_qk" in peer.unsupported_reason(suite, h_q=64, d_qk=128, topk=2048)
        assert "d_v" in peer.unsupported_reason(suite, h_q=64, d_qk=576, topk=2048, d_v=128)
    assert peer.unsupported_reason("sparse_decode", h_q=64, d_qk=576, topk=64) is None
    assert "multiple of 128" in peer.unsupported_reason("sparse_prefill", h_q=64, d_qk=576, topk=64)
    assert "multiple of 64" in peer.unsupported_reason("sparse_decode", h_q=64, d_qk=576, topk=100)
    with pytest.raises(ValueError, match="unknown suite"):
        peer.unsupported_reason("mha_prefill", h_q=64, d_qk=192)


def test_bench_rows_served_as_documented():
    """Every row of the three suites: FlashMLA serves all but the h_q = 16 sparse rows."""
    import bench_sparse_decode
    import bench_sparse_prefill

    for c in bench_sparse_decode.cases():
        why = peer.unsupported_reason("sparse_decode", h_q=c["h_q"], d_qk=576, topk=c["topk"])
        assert (why is None) == (c["h_q"] != 16), c["name"]
    for c in bench_sparse_prefill.cases():
        heads = c["padded_to"] or c["h_q"]
        why = peer.unsupported_reason("sparse_prefill", h_q=heads, d_qk=c["d_qk"], topk=c["topk"])
        assert (why is None) == (heads != 16), c["name"]


# ------------------------------------------------------------------------------------------------
# Fallback figures and the record fields
# ------------------------------------------------------------------------------------------------
def test_target_as_us():
    assert peer.target_as_us({"time_us": 21.4}) == 21.4
    assert peer.target_as_us({"tflops": 500}, flops=1e12) == pytest.approx(2000.0)  # 1 TFLOP at 500 TFLOP/s: 2 ms
    assert peer.target_as_us({"gbps": 2000}, nbytes=4e9) == pytest.approx(2000.0)
    assert peer.target_as_us({"tflops": 500}) is None  # no FLOP count: no time
    assert peer.target_as_us(None) is None and peer.target_as_us({}) is None


def test_peer_fields_sources():
    same = peer.peer_fields(20.0, peer_us=25.0, fallback_us=30.0)
    assert same == {"flashmla_us": 25.0, "ratio_to_flashmla": 1.25, "flashmla_source": "same_run"}
    fallback = peer.peer_fields(20.0, fallback_us=30.0, note="flash_mla is not importable")
    assert fallback["flashmla_source"] == "targets.md" and fallback["ratio_to_flashmla"] == 1.5
    assert fallback["flashmla_note"].startswith("flash_mla is not importable") and "targets.md" in \
        fallback["flashmla_note"]
    none = peer.peer_fields(20.0, note="FlashMLA's SM90 sparse decode serves h_q 64 and 128 only")
    assert none["flashmla_us"] is None and none["ratio_to_flashmla"] is None and none["flashmla_source"] is None
    assert "targets.md" not in none["flashmla_note"]


def test_fallback_ratio_equals_the_target_ratio():
    """Without the peer, ratio_to_flashmla is the ratio run.py computes from the same docs/targets.md figure."""
    flops, time_us, target = 3.2e12, 5000.0, {"tflops": 622}
    f = peer.peer_fields(time_us, fallback_us=peer.target_as_us(target, flops))
    assert f["ratio_to_flashmla"] == pytest.approx(flops / (time_us * 1e-6) / 1e12 / 622)


# ------------------------------------------------------------------------------------------------
# The output check
# ------------------------------------------------------------------------------------------------
def test_compare_outputs_agreement_and_tolerances():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((4, 2, 8, 16)).astype(np.float32)
    c = peer.compare_outputs(r.copy(), r, abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
    assert c["ok"] and c["max_abs_diff"] == 0.0 and c["bad"] == 0 and c["numel"] == r.size
    # One bf16 ulp off on every tenth element: inside the relative and the cosine tolerance.
    a = np.where(np.arange(r.size).reshape(r.shape) % 10 == 0, r * (1 + 1 / 128), r).astype(np.float32)
    c = peer.compare_outputs(a, r, abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
    assert c["ok"] and 0 < c["cos_diff"] < 5e-6
    # The same ulp on every element: each element passes, the cosine difference ((1/128)^2 / 2) does not.
    c = peer.compare_outputs(r * (1 + 1 / 128), r, abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)
    assert c["bad"] == 0 and not c["ok"] and "cosine" in c["why"]
    b = r.copy()
    b[1, 0, 3, 5] += 0.5
    c = peer.compare_outputs(b, r, abs_tol=1e-3, rel_tol=2.01 / 128)
    assert not c["ok"] and c["bad"] == 1 and c["max_abs_diff"] == pytest.approx(0.5)
    assert "1 of 1024 elements" in c["why"]


def test_compare_outputs_anomalies_shapes_and_cosine():
    r = np.array([1.0, np.inf, -np.inf, np.nan, 2.0], dtype=np.float32)
    assert peer.compare_outputs(r.copy(), r, abs_tol=1e-6, rel_tol=1e-4)["ok"]  # same positions: zeroed, agree
    a = r.copy()
    a[1] = 3.0
    c = peer.compare_outputs(a, r, abs_tol=1e-6, rel_tol=1e-4)
    assert not c["ok"] and "inf/NaN" in c["why"]
    c = peer.compare_outputs(np.zeros((2, 3)), np.zeros((3, 2)), abs_tol=1, rel_tol=1)
    assert not c["ok"] and "shape" in c["why"] and c["max_abs_diff"] is None
    # Inside the elementwise tolerance everywhere but not in direction: the cosine check catches it.
    x = np.full(1000, 1e-4, dtype=np.float32)
    c = peer.compare_outputs(-x, x, abs_tol=1e-3, rel_tol=0.0, cos_diff_tol=5e-6)
    assert c["bad"] == 0 and not c["ok"] and "cosine" in c["why"]


def test_agreement_fields_names():
    out = np.ones((2, 3), dtype=np.float32)
    lse = np.full((2, 3), 5.0, dtype=np.float32)
    f = peer.agreement_fields("sparse_prefill", {"out": out, "lse": lse, "max_logits": lse},
                              {"out": out, "lse": lse + 0.01, "max_logits": lse})
    assert f["peer_max_abs_diff"] == 0.0 and f["peer_max_abs_diff_max_logits"] == 0.0
    assert f["peer_max_abs_diff_lse"] == pytest.approx(0.01, rel=1e-3)
    assert f["peer_agrees"] is False and f["peer_check"].startswith("lse:")


# ------------------------------------------------------------------------------------------------
# load_peer and measure against a stub flash_mla
# ------------------------------------------------------------------------------------------------
def _stub_flash_mla(outputs, calls):
    mod = types.ModuleType("flash_mla")
    mod.__file__ = "/opt/peer/FlashMLA/flash_mla/__init__.py"
    mod.__version__ = "1.0.0"

    def get_mla_metadata(*args, **kwargs):
        calls.append("get_mla_metadata")
        return types.SimpleNamespace(have_initialized=False), None

    def flash_mla_with_kvcache(*args, **kwargs):
        calls.append("flash_mla_with_kvcache")
        return outputs["out"], outputs["lse"]

    def flash_mla_sparse_fwd(*args, **kwargs):
        calls.append("flash_mla_sparse_fwd")
        return outputs["out"], outputs["max_logits"], outputs["lse"]

    mod.get_mla_metadata, mod.flash_mla_with_kvcache = get_mla_metadata, flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd
    return mod


class _FakeHarness:
    """rest_before_timing / time_cupti as the bench modules use them; records what was called."""

    def __init__(self, timing):
        self.timing, self.events = timing, []

    def rest_before_timing(self, call):
        self.events.append("rest")
        call()

    def time_cupti(self, call):
        self.events.append("cupti")
        call()
        return self.timing


def _decode_call(fm):
    sched, _ = fm.get_mla_metadata()  # created here, filled by the first call: outside the timed region

    def call():
        o, lse = fm.flash_mla_with_kvcache("q", "k_cache", "block_table", "seqlens", 512, sched)
        return {"out": o, "lse": lse}

    return call


def test_load_peer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import fails
    mod, why = peer.load_peer()
    assert mod is None and "not importable" in why
    assert peer.describe_peer() == {"module": "flash_mla", "available": False, "why": why}
    stub = _stub_flash_mla({}, [])
    monkeypatch.setitem(sys.modules, "flash_mla", stub)
    assert peer.load_peer() == (stub, None)
    info = peer.describe_peer()
    assert info["available"] and info["file"] == stub.__file__ and info["version"] == "1.0.0"
    monkeypatch.setenv("OPENMLA_BENCH_PEER", "0")
    assert peer.load_peer()[0] is None and "OPENMLA_BENCH_PEER=0" in peer.load_peer()[1]
    monkeypatch.delenv("OPENMLA_BENCH_PEER")
    alias = types.ModuleType("flash_mla")  # openmla installed under FlashMLA's name: not a peer
    alias.__file__, alias.build_commit = os.path.join(ROOT, "python", "openmla", "__init__.py"), lambda: "x"
    monkeypatch.setitem(sys.modules, "flash_mla", alias)
    assert "openmla itself" in peer.load_peer()[1]
    partial = types.ModuleType("flash_mla")
    partial.__file__, partial.get_mla_metadata = "/opt/flash_mla/__init__.py", lambda: None
    monkeypatch.setitem(sys.modules, "flash_mla", partial)
    assert "lacks flash_mla_with_kvcache, flash_mla_sparse_fwd" in peer.load_peer()[1]


def test_measure_same_run(monkeypatch):
    out = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    lse = np.full((2, 4), 7.0, dtype=np.float32)
    calls = []
    monkeypatch.setitem(sys.modules, "flash_mla", _stub_flash_mla({"out": out, "lse": lse}, calls))
    t = harness.KernelTiming("cupti", 25.0, [25.0], [("flash_fwd_splitkv_mla_kernel", 22.0), ("combine", 2.5)])
    h = _FakeHarness(t)
    f = peer.measure(h, "sparse_decode", 20.0, ours={"out": out.copy(), "lse": lse.copy()}, make_call=_decode_call,
                     fallback_us=21.4)
    assert f["flashmla_us"] == 25.0 and f["ratio_to_flashmla"] == 1.25 and f["flashmla_source"] == "same_run"
    assert f["flashmla_timing_method"] == "cupti" and f["flashmla_main_kernel_us"] == 22.0
    assert f["flashmla_kernels"] == [["flash_fwd_splitkv_mla_kernel", 22.0], ["combine", 2.5]]
    assert f["peer_max_abs_diff"] == 0.0 and f["peer_max_abs_diff_lse"] == 0.0 and f["peer_agrees"] is True
    assert "flashmla_note" not in f and "peer_check" not in f
    # One schedule object, the check's call first (it fills the schedule), then the rest and the timed pass.
    assert calls[0] == "get_mla_metadata" and calls.count("get_mla_metadata") == 1
    assert h.events == ["rest", "cupti"]


def test_measure_disagreeing_peer_is_visible(monkeypatch):
    out = np.ones((2, 32), dtype=np.float32)
    lse = np.full((2, 4), 7.0, dtype=np.float32)
    monkeypatch.setitem(sys.modules, "flash_mla", _stub_flash_mla({"out": out * 1.5, "lse": lse}, []))
    h = _FakeHarness(harness.KernelTiming("cupti", 25.0, [25.0], [("k", 25.0)]))
    f = peer.measure(h, "dense_decode", 20.0, ours={"out": out, "lse": lse}, make_call=_decode_call)
    assert f["flashmla_source"] == "same_run"  # still timed, but flagged
    assert f["peer_agrees"] is False and f["peer_max_abs_diff"] == pytest.approx(0.5)
    assert f["peer_check"].startswith("out: 64 of 64 elements")


def test_measure_prefill_outputs(monkeypatch):
    out = np.ones((3, 64, 8), dtype=np.float32)
    stats = np.full((3, 64), 2.0, dtype=np.float32)
    monkeypatch.setitem(sys.modules, "flash_mla",
                        _stub_flash_mla({"out": out, "lse": stats, "max_logits": stats - 1}, []))

    def make_call(fm):
        def call():
            o, m, l = fm.flash_mla_sparse_fwd("q", "kv", "indices", 0.04)
            return {"out": o, "max_logits": m, "lse": l}

        return call

    h = _FakeHarness(harness.KernelTiming("cupti", 3000.0, [3000.0], [("sparse_attn_fwd_kernel", 3000.0)]))
    f = peer.measure(h, "sparse_prefill", 3100.0, ours={"out": out, "max_logits": stats - 1, "lse": stats},
                     make_call=make_call, fallback_us=3423)
    assert f["ratio_to_flashmla"] == pytest.approx(3000 / 3100) and f["peer_agrees"] is True
    assert {"peer_max_abs_diff", "peer_max_abs_diff_lse", "peer_max_abs_diff_max_logits"} <= set(f)


def test_measure_fallbacks(monkeypatch):
    h = _FakeHarness(None)
    never = lambda fm: pytest.fail("the peer must not be called")  # noqa: E731
    # flash_mla absent: docs/targets.md's figure, and why.
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    f = peer.measure(h, "sparse_decode", 20.0, ours={}, make_call=never, fallback_us=21.4)
    assert f["flashmla_source"] == "targets.md" and f["flashmla_us"] == 21.4
    assert f["ratio_to_flashmla"] == pytest.approx(1.07) and "not importable" in f["flashmla_note"]
    assert "peer_agrees" not in f and h.events == []
    # Present but the shape is not served: no call, the reason, no figure.
    monkeypatch.setitem(sys.modules, "flash_mla", _stub_flash_mla({}, []))
    why = peer.unsupported_reason("sparse_decode", h_q=16, d_qk=576, topk=2048)
    f = peer.measure(h, "sparse_decode", 20.0, ours={}, make_call=never, unsupported=why)
    assert f == {"flashmla_us": None, "ratio_to_flashmla": None, "flashmla_source": None, "flashmla_note": why}

    # Present but its call fails: recorded, the fallback figure kept, nothing raised.
    def broken(fm):
        def call():
            raise RuntimeError("CUDA error: no kernel image is available")

        return call

    f = peer.measure(h, "sparse_decode", 20.0, ours={}, make_call=broken, fallback_us=21.4)
    assert f["flashmla_source"] == "targets.md" and "the FlashMLA call failed (RuntimeError" in f["flashmla_note"]


# ------------------------------------------------------------------------------------------------
# run.py: the record keeps its required fields, the table shows the same-run ratio
# ------------------------------------------------------------------------------------------------
def _record(**extra):
    import run

    mod = types.SimpleNamespace(TARGETS={})
    rec = {"time_us": 20.0, "flops": 2e9, "bytes": 1e6, "target": {"time_us": 21.4}, **extra}
    return run.complete_record(mod, "sparse_decode", {"name": "v32_b2", "b": 2}, rec,
                               {"copy_gbps": 3000.0, "matmul_tflops": 780.0}, "NVIDIA H100 80GB HBM3", "abc", "now")


def test_complete_record_keeps_required_and_peer_fields():
    r = _record(**peer.peer_fields(20.0, peer_us=25.0), peer_max_abs_diff=0.0, peer_agrees=True)
    for k in ("suite", "name", "params", "time_us", "tflops", "gbps", "device", "git_commit"):
        assert k in r
    assert r["ratio"] == pytest.approx(21.4 / 20.0)  # the docs/targets.md ratio, as before
    assert r["ratio_to_flashmla"] == 1.25 and r["flashmla_source"] == "same_run" and r["peer_max_abs_diff"] == 0.0


def test_table_shows_same_run_ratio(capsys):
    import run

    same = _record(**peer.peer_fields(20.0, peer_us=25.0), peer_agrees=True)
    differ = dict(_record(**peer.peer_fields(20.0, peer_us=30.0), peer_agrees=False,
                          peer_check="out: 3 of 9 elements exceed"), name="v32_differ")
    fallback = dict(_record(**peer.peer_fields(20.0, fallback_us=21.4, note="flash_mla is not importable")),
                    name="v32_fallback")
    unserved = dict(_record(**peer.peer_fields(20.0, note="serves h_q 64 and 128 only")), name="v32_hq16")
    assert run.peer_columns(same) == ("25.00", "1.250")
    assert run.peer_columns(differ) == ("30.00", "1.500!")
    assert run.peer_columns(fallback) == ("-", "-")  # the ratio column already shows the targets.md figure
    info = {"module": "flash_mla", "available": True, "file": "/tmp/peer/FlashMLA/flash_mla/__init__.py"}
    run.print_table([same, differ, fallback, unserved], [], None, "H100", "abc", info)
    text = capsys.readouterr().out
    assert "fmla_us" in text and "fmla_x" in text and "1.250" in text and "1.500!" in text
    assert "FlashMLA: serves h_q 64 and 128 only" in text
    assert "FlashMLA outputs differ: out: 3 of 9" in text
    run.print_table([fallback], [], None, "H100", "abc", {"module": "flash_mla", "available": False,
                                                          "why": "not importable"})
    text = capsys.readouterr().out
    assert "FlashMLA not timed in this run (not importable)" in text
    assert "FlashMLA: flash_mla" not in text  # no per-row note when the peer is absent altogether
