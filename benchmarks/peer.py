"""The peer, FlashMLA, timed in the same run as OpenMLA: its whole call on the same inputs, by the same method.

Whenever `flash_mla` (DeepSeek's FlashMLA, built from .peer/ by tools/peer_flashmla.sh) is importable, the dense
decode, sparse decode and sparse prefill benchmarks call `measure()` after timing their own call. It builds
FlashMLA's call on the row's tensors (FlashMLA's API is the one openmla mirrors, and the FP8 cache is the same
656-byte V3.2 layout, so the tensors are shared), checks once that FlashMLA's outputs agree with ours within the
tests' tolerances, then times FlashMLA's eager call exactly like ours: the call once (the schedule object
FlashMLA's get_mla_metadata returns is filled by that first call, outside the timed region, as ours is), a 0.3 s
pause, then harness.time_cupti (8 GB flush before every call, CUPTI span of the call's kernels, median).

Fields added to every dense decode, sparse decode and sparse prefill record (peer_fields, measure):

  flashmla_us        FlashMLA's time: same run (CUPTI span of its whole call), or, where it did not run here, the
                     docs/targets.md figure as a time (a TFLOP/s or GB/s target converted with the row's FLOPs or
                     bytes), or None (no figure: a shape FlashMLA's SM90 kernels do not serve)
  ratio_to_flashmla  flashmla_us / time_us (> 1: OpenMLA is faster), or None
  flashmla_source    "same_run", "targets.md" or None: where flashmla_us came from
  flashmla_note      why there is no same-run figure (flash_mla not importable, shape not served, its call failed)
  same run only:
  flashmla_timing_method, flashmla_kernels ([short name, median us] per kernel of its call),
  flashmla_main_kernel_us (its longest kernel: the attention kernel; FlashMLA's published dense figures are that
                     kernel alone), flashmla_timing_note (only when there is something to say)
  peer_max_abs_diff  max |ours - FlashMLA| of `out` (and peer_max_abs_diff_<name> for lse, max_logits)
  peer_agrees        True when every output agrees within the tests' tolerances (TOLERANCES); False shows a
                     mismatched comparison; peer_check says what failed

The existing `target` / `ratio` fields (the fixed docs/targets.md figures) are left as they were.
OPENMLA_BENCH_PEER=0 turns the peer off. Importing this module needs neither torch nor a GPU; the pure parts
(unsupported_reason, target_as_us, peer_fields, compare_outputs with numpy arrays, measure with a stub peer) are
tested on the CPU (tests/python/test_bench_peer.py).
"""
from __future__ import annotations

import os

PEER_MODULE = "flash_mla"
PEER_VERSION = "FlashMLA 9241ae3"  # the build tools/peer_flashmla.sh makes (docs/targets.md was measured with it)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests' tolerances (tests/python/dense_decode_ref.py, sparse_decode_ref.py, sparse_prefill_ref.py: FlashMLA's
# own test tolerances), applied with FlashMLA's output as the reference.
_DECODE_LSE_TOL = dict(abs_tol=1e-6, rel_tol=8.01 / 65536)
TOLERANCES = {
    "dense_decode": {"out": dict(abs_tol=8e-4, rel_tol=2.01 / 128, cos_diff_tol=5e-6), "lse": _DECODE_LSE_TOL},
    "sparse_decode": {"out": dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6), "lse": _DECODE_LSE_TOL},
    "sparse_prefill": {"out": dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6),
                       "max_logits": dict(abs_tol=1e-6, rel_tol=8.01 / 65536),
                       "lse": dict(abs_tol=1e-6, rel_tol=8.01 / 65536)},
}


# ------------------------------------------------------------------------------------------------
# Is the peer here, and does it serve this shape? (pure)
# ------------------------------------------------------------------------------------------------
def load_peer():
    """(module, None) when FlashMLA is importable, else (None, why). OPENMLA_BENCH_PEER=0 turns it off.

    A module named flash_mla that is openmla itself (an alias some engines install) is refused: comparing
    OpenMLA with itself would read as a ratio of 1."""
    if os.environ.get("OPENMLA_BENCH_PEER", "1") == "0":
        return None, "the peer is off (OPENMLA_BENCH_PEER=0)"
    try:
        import importlib

        mod = importlib.import_module(PEER_MODULE)
    except Exception as err:
        return None, (f"{PEER_MODULE} is not importable ({type(err).__name__}: {err}; "
                      "tools/peer_flashmla.sh builds it on the GPU machine)")
    path = os.path.abspath(getattr(mod, "__file__", None) or "")
    if hasattr(mod, "build_commit") or path.startswith(os.path.join(ROOT, "python") + os.sep):
        return None, f"{PEER_MODULE} resolves to openmla itself ({path}), not FlashMLA"
    missing = [f for f in ("get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd")
               if not callable(getattr(mod, f, None))]
    if missing:
        return None, f"{PEER_MODULE} ({path}) lacks {', '.join(missing)}"
    return mod, None


def describe_peer() -> dict:
    """What run.py records at the top of the JSON: {"module", "available", "file", "version"} or the reason."""
    mod, why = load_peer()
    if mod is None:
        return {"module": PEER_MODULE, "available": False, "why": why}
    return {"module": PEER_MODULE, "available": True, "file": getattr(mod, "__file__", None),
            "version": getattr(mod, "__version__", None), "build": PEER_VERSION}


def unsupported_reason(suite: str, *, h_q: int, d_qk: int, topk: int | None = None, h_kv: int = 1, page: int = 64,
                       d_v: int = 512, dtype: str = "bf16") -> str | None:
    """None when FlashMLA 9241ae3's SM90 kernels serve this shape, else why not (docs/flashmla-facts.md, section 1;
    the peer is built with FLASH_MLA_DISABLE_FP16=1, so its dense decode is bf16 only)."""
    if d_v != 512:
        return f"FlashMLA needs d_v = 512 (got {d_v})"
    if suite == "dense_decode":
        if d_qk != 576:
            return f"FlashMLA's SM90 dense decode serves d_qk = 576 only (got {d_qk}: no dense MODEL1 on SM90)"
        if page != 64:
            return f"FlashMLA's dense decode needs page 64 (got {page})"
        if dtype != "bf16":
            return f"the peer is built without fp16 dense decode (FLASH_MLA_DISABLE_FP16=1; got {dtype})"
        if h_kv < 1 or h_q % h_kv:
            return f"FlashMLA's dense decode needs h_q % h_kv == 0 (got h_q {h_q}, h_kv {h_kv})"
        return None
    if suite not in ("sparse_decode", "sparse_prefill"):
        raise ValueError(f"unknown suite {suite!r}: dense_decode, sparse_decode or sparse_prefill")
    what = "sparse decode" if suite == "sparse_decode" else "sparse prefill"
    if h_kv != 1:
        return f"FlashMLA's {what} needs h_kv = 1 (got {h_kv})"
    if d_qk not in (576, 512):
        return f"FlashMLA's {what} serves d_qk 576 (V3.2) or 512 (MODEL1) (got {d_qk})"
    if h_q not in (64, 128):
        return f"FlashMLA's SM90 {what} serves h_q 64 and 128 only (got {h_q}; engines pad to 64)"
    multiple = 64 if suite == "sparse_decode" else 128
    if topk is None or topk <= 0 or topk % multiple:
        return f"FlashMLA's SM90 {what} needs topk a positive multiple of {multiple} (got {topk})"
    return None


def target_as_us(target, flops=None, nbytes=None) -> float | None:
    """A docs/targets.md target ({"time_us": v}, {"tflops": v} or {"gbps": v}) as a time in us, or None."""
    if not target:
        return None
    if target.get("time_us"):
        return float(target["time_us"])
    if target.get("tflops") and flops:
        return flops / (float(target["tflops"]) * 1e12) * 1e6
    if target.get("gbps") and nbytes:
        return nbytes / (float(target["gbps"]) * 1e9) * 1e6
    return None


def peer_fields(time_us: float, *, peer_us: float | None = None, fallback_us: float | None = None,
                note: str | None = None) -> dict:
    """The flashmla_* fields of a record: the same-run figure when there is one, else the docs/targets.md one."""
    if peer_us is not None:
        us, source = float(peer_us), "same_run"
    elif fallback_us is not None:
        us, source = float(fallback_us), "targets.md"
    else:
        us, source = None, None
    fields = {"flashmla_us": us, "ratio_to_flashmla": us / time_us if us is not None and time_us else None,
              "flashmla_source": source}
    if note:
        fields["flashmla_note"] = note + ("; flashmla_us is docs/targets.md's figure" if source == "targets.md"
                                          else "")
    return fields


# ------------------------------------------------------------------------------------------------
# Do the outputs agree? (torch tensors on the GPU, or numpy arrays on the CPU)
# ------------------------------------------------------------------------------------------------
def _namespace(x):
    if type(x).__module__.split(".")[0] == "torch":
        import torch

        return torch
    import numpy

    return numpy


def _as_f32(x, xp):
    if xp.__name__ == "torch":
        return x.detach().float()
    return xp.asarray(x, dtype=xp.float32)


def compare_outputs(ours, peer, abs_tol: float, rel_tol: float, cos_diff_tol: float = 1e-7) -> dict:
    """ours against peer (the reference), as the tests' check_is_allclose does it, without raising.

    +inf, -inf and NaN must sit at the same positions (then they are zeroed); every other element needs
    |a - r| < abs_tol or |a - r| / (|r| + 1e-6) < rel_tol; the cosine difference 1 - 2 sum(a r) / sum(a a + r r)
    (float64 sums) must not exceed cos_diff_tol. Elementwise work in float32 (a 4096 x 128 x 512 prefill output is
    268M elements). Returns {"max_abs_diff", "bad", "numel", "cos_diff", "ok", "why"}."""
    xp = _namespace(ours)
    a, r = _as_f32(ours, xp), _as_f32(peer, xp)
    if tuple(a.shape) != tuple(r.shape):
        return {"max_abs_diff": None, "bad": None, "numel": None, "cos_diff": None, "ok": False,
                "why": f"shape {tuple(a.shape)} vs the peer's {tuple(r.shape)}"}
    anomalies = 0
    for test in (xp.isnan, lambda t: t == float("inf"), lambda t: t == float("-inf")):
        ma, mr = test(a), test(r)
        anomalies += int((ma != mr).sum())
    special = ~xp.isfinite(a) | ~xp.isfinite(r)
    zero = xp.zeros_like(a)
    a, r = xp.where(special, zero, a), xp.where(special, zero, r)
    abs_err = abs(a - r)
    rel_err = abs_err / (abs(r) + 1e-6)
    bad = int((~((abs_err < abs_tol) | (rel_err < rel_tol))).sum())
    numel = int(abs_err.size if xp.__name__ == "numpy" else abs_err.numel())
    max_abs = float(abs_err.max()) if numel else 0.0
    den = float((a * a + r * r).sum(dtype=xp.float64))
    cos = 0.0 if float((r * r).sum(dtype=xp.float64)) < 1e-12 else 1.0 - 2.0 * float((a * r).sum(dtype=xp.float64)) / den
    why = []
    if anomalies:
        why.append(f"{anomalies} inf/NaN position(s) differ")
    if bad:
        why.append(f"{bad} of {numel} elements exceed abs {abs_tol:g} and rel {rel_tol:g}")
    if abs(cos) > cos_diff_tol:
        why.append(f"cosine difference {cos:.3g} exceeds {cos_diff_tol:g}")
    return {"max_abs_diff": max_abs, "bad": bad, "numel": numel, "cos_diff": cos, "ok": not why,
            "why": "; ".join(why)}


def agreement_fields(suite: str, ours: dict, peer: dict) -> dict:
    """peer_max_abs_diff (out), peer_max_abs_diff_<name> (the others), peer_agrees and, when False, peer_check."""
    fields, failed = {}, []
    for name, tol in TOLERANCES[suite].items():
        if name not in ours or name not in peer:
            continue
        c = compare_outputs(ours[name], peer[name], **tol)
        fields["peer_max_abs_diff" if name == "out" else f"peer_max_abs_diff_{name}"] = c["max_abs_diff"]
        if not c["ok"]:
            failed.append(f"{name}: {c['why']}")
    fields["peer_agrees"] = not failed
    if failed:
        fields["peer_check"] = "; ".join(failed) + " (tests' tolerances, FlashMLA's output as the reference)"
    return fields


# ------------------------------------------------------------------------------------------------
# The same-run measurement
# ------------------------------------------------------------------------------------------------
def measure(harness, suite: str, time_us: float, *, ours: dict, make_call, unsupported: str | None = None,
            fallback_us: float | None = None) -> dict:
    """The flashmla_* and peer_* fields of one row.

    harness      the run's Harness (rest_before_timing, time_cupti: the methods our own figure was taken with)
    suite        "dense_decode", "sparse_decode" or "sparse_prefill" (picks the tolerances)
    time_us      our figure (the ratio's denominator)
    ours         {"out": ..., "lse": ..., ["max_logits": ...]}: our outputs for these inputs
    make_call    make_call(flash_mla) -> call: builds FlashMLA's call on the row's tensors (its schedule object
                 created there, empty); call() launches it and returns the outputs as a dict named like `ours`
    unsupported  unsupported_reason(...) of the row: no peer call, the reason is recorded
    fallback_us  the docs/targets.md figure as a time (target_as_us), used when there is no same-run figure

    Never raises for the peer's sake: a failed peer call is recorded in flashmla_note and the fallback used."""
    mod, why = load_peer()
    if mod is None or unsupported:
        return peer_fields(time_us, fallback_us=fallback_us, note=unsupported or why)
    try:
        call = make_call(mod)
        # The first call fills FlashMLA's schedule (outside any timed region, as ours); its outputs are checked once.
        fields = agreement_fields(suite, ours, call())
        harness.rest_before_timing(call)
        t = harness.time_cupti(call)
    except Exception as err:
        return peer_fields(time_us, fallback_us=fallback_us,
                           note=f"the FlashMLA call failed ({type(err).__name__}: {str(err).strip()[:300]})")
    peer_us = t.span_us if t.method == "cupti" else t.median_us
    out = peer_fields(time_us, peer_us=peer_us)
    out["flashmla_timing_method"] = t.method
    out["flashmla_kernels"] = [[name, us] for name, us in t.kernels]
    out["flashmla_main_kernel_us"] = max((us for _, us in t.kernels), default=None)
    if t.note:
        out["flashmla_timing_note"] = t.note
    out.update(fields)
    return out
