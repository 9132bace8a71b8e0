"""Dense MLA decode over an FP8 e4m3 cache with per-tensor scales (openmla.flash_mla_with_kvcache with a float8_e4m3fn
k_cache, descale_q / descale_k; docs/dense-decode.md, "FP8 cache").

GPU tests compare the FP8 call with (a) our bf16 dense decode on the dequantised cache and (b) the torch fp32 reference
on the dequantised values, on fresh random inputs: unused pages and the tail of each last page NaN (e4m3 0x7F),
block-table entries past each request's pages 2147480000, out / lse poisoned with NaN before the call. The argument
tests run on the CPU through the binding with fake device pointers.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from openmla import _openmla as C

gpu = pytest.mark.gpu

D_QK, D_V = 576, 512
INVALID_PAGE = 2147480000
E4M3_NAN = 0x7F


def _torch():
    import torch

    return torch


def _ref():
    import dense_decode_ref

    return dense_decode_ref


def _openmla():
    import openmla

    return openmla


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------
def make_inputs(b, s_q, h_q, lens, page, q_fp8=False, pow2_scale=False, seed=0):
    """(q, q_deq, k_fp8, k_deq32, block_table, cache_seqlens, descale_q, descale_k): q_deq / k_deq32 are the values
    the FP8 tensors stand for, in fp32 (NaN where the cache is poisoned)."""
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    pages_per_req = [max(1, (L + page - 1) // page) for L in lens]
    max_pages = max(pages_per_req)
    num_pages = sum(pages_per_req) + 3
    k = (torch.randn((num_pages, page, 1, D_QK), generator=g, device=dev) / 10 +
         (torch.rand((), generator=g, device=dev) - 0.5) / 10).clamp(-1, 1)
    amax = float(k.abs().max())
    dk = 2.0 ** math.ceil(math.log2(amax / 448)) if pow2_scale else amax / 448 * 1.37
    k_fp8 = (k / dk).to(torch.float8_e4m3fn)
    perm = torch.randperm(num_pages, generator=g, device=dev).to(torch.int32)
    bt = torch.full((b, max_pages), INVALID_PAGE, dtype=torch.int32, device=dev)
    used = torch.zeros(num_pages, dtype=torch.bool, device=dev)
    at = 0
    for i, L in enumerate(lens):
        n = (L + page - 1) // page
        bt[i, :n] = perm[at:at + n]
        used[perm[at:at + n].long()] = True
        # The tail of the last page past L: NaN.
        if n and L % page:
            k_fp8.view(torch.uint8)[perm[at + n - 1].long(), L % page:] = E4M3_NAN
        at += n
    k_fp8.view(torch.uint8)[~used] = E4M3_NAN  # unused pages: NaN
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g, device=dev) / 10).clamp(-1, 1)
    if q_fp8:
        dq = float(q.abs().max()) / 448
        dq = 2.0 ** math.ceil(math.log2(dq)) if pow2_scale else dq * 1.11
        q_in = (q / dq).to(torch.float8_e4m3fn)
        q_deq = q_in.float() * dq
    else:
        dq = None
        q_in = q.to(torch.bfloat16)
        q_deq = q_in.float()
    k_deq32 = k_fp8.float() * dk
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    return q_in, q_deq, k_fp8, k_deq32, bt, lens_t, dq, dk


def poisoned_outputs(b, s_q, h_q):
    torch = _torch()
    out = torch.full((b, s_q, h_q, D_V), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((b, s_q, h_q), float("nan"), dtype=torch.float32, device="cuda").transpose(1, 2)
    return out, lse


def run_fp8(q, k_fp8, bt, lens, dq, dk, causal, sched=None, scale_as_tensor=True, softmax_scale=None):
    torch = _torch()
    om = _openmla()
    b, s_q, h_q, _ = q.shape
    out, lse = poisoned_outputs(b, s_q, h_q)
    if sched is None:
        sched, _ = om.get_mla_metadata()
    as_arg = (lambda v: None if v is None else torch.tensor([v], dtype=torch.float32, device="cuda")) \
        if scale_as_tensor else (lambda v: v)
    res = om.flash_mla_with_kvcache(q, k_fp8, bt, lens, D_V, sched, softmax_scale=softmax_scale, causal=causal,
                                    is_fp8_kvcache=True, descale_q=as_arg(dq), descale_k=as_arg(dk), out=out,
                                    lse=lse)
    assert res[0] is out and res[1] is lse
    return out, lse


# The lse tolerance against the BF16 decode when the dequantised values are not exact in bf16 (a scale that is not a
# power of two): that call's cache (and q) are rounded to bf16, which moves every logit by up to ~2^-9 of |q||k| (a
# request of one token: lse = its logit; measured up to 7.6e-5 on H100). The fp32 reference (exact values) keeps the
# dense decode tolerances.
LSE_TOL_ROUNDED_BF16 = dict(abs_tol=2e-4, rel_tol=8.01 / 65536)
# ... and out: the same perturbation moves a weight of P by up to ~2^-9 relative (one element of 6.4M measured 8.5e-4 off
# at b = 98 on H200; the fp32 reference keeps 8e-4).
OUT_TOL_ROUNDED_BF16 = dict(abs_tol=2e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)


def check_against_bf16_and_reference(q_deq, k_deq32, bt, lens, causal, out, lse, what, softmax_scale=None,
                                     exact=False):
    """(a) our bf16 dense decode on the bf16-rounded dequantised cache (and q): `exact` says the rounding is exact
    (power-of-two scales), then with the dense decode tolerances; (b) the fp32 reference on the exact dequantised
    values."""
    torch = _torch()
    om = _openmla()
    ref = _ref()
    page = k_deq32.shape[1]
    b, s_q, h_q, _ = q_deq.shape
    assert not torch.isnan(out).any(), f"{what}: NaN left in out (an element not written?)"
    assert not torch.isnan(lse).any(), f"{what}: NaN left in lse (an element not written?)"
    ref_out, ref_lse = ref.dense_decode_ref(q_deq, k_deq32, bt, lens, softmax_scale=softmax_scale, causal=causal)
    ref.check_dense_decode(out.float(), lse, ref_out, ref_lse, what=f" ({what}, fp32 reference)")
    if page in om.DENSE_PAGE_SIZES:
        sched, _ = om.get_mla_metadata()
        bf_out, bf_lse = om.flash_mla_with_kvcache(q_deq.to(torch.bfloat16), k_deq32.to(torch.bfloat16), bt, lens,
                                                   D_V, sched, softmax_scale=softmax_scale, causal=causal)
        tag = f" ({what}, bf16 decode on the dequantised cache)"
        if exact:
            ref.check_dense_decode(out, lse, bf_out, bf_lse, what=tag)
        else:
            ref.check_is_allclose(f"out{tag}", out, bf_out, **OUT_TOL_ROUNDED_BF16)
            ref.check_is_allclose(f"lse{tag}", lse, bf_lse, **LSE_TOL_ROUNDED_BF16)


CASES = [
    # b, s_q, h_q, s_k, page, causal, q_fp8, pow2
    (4, 1, 16, 1000, 64, False, False, False),
    (3, 2, 32, 777, 64, True, False, True),
    (2, 1, 64, 4096, 64, False, True, False),
    (2, 2, 128, 2000, 64, True, True, True),
    (5, 1, 128, 300, 16, False, False, False),
    (3, 1, 128, 600, 1, False, False, False),
    (3, 2, 16, 520, 100, True, False, False),
    (2, 4, 8, 900, 256, True, True, False),
    (1, 1, 128, 16384, 64, False, False, False),  # long: split over many partitions, combined
    (6, 3, 9, 333, 32, True, False, False),
]


@gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-sq{}-hq{}-sk{}-p{}{}{}{}".format(
    c[0], c[1], c[2], c[3], c[4], "-causal" if c[5] else "", "-qfp8" if c[6] else "", "-pow2" if c[7] else ""))
def test_fp8_dense_decode_matches_bf16_decode_and_reference(case):
    b, s_q, h_q, s_k, page, causal, q_fp8, pow2 = case
    rng = random.Random(s_k + h_q)
    lens = [max(1, s_k + rng.randint(-s_k // 4, s_k // 4)) for _ in range(b)]
    if b > 2:
        lens[1] = 0  # an empty request: out 0, lse +inf
    q, q_deq, k_fp8, k_deq32, bt, lens_t, dq, dk = make_inputs(b, s_q, h_q, lens, page, q_fp8, pow2, seed=b * s_k)
    out, lse = run_fp8(q, k_fp8, bt, lens_t, dq, dk, causal)
    check_against_bf16_and_reference(q_deq, k_deq32, bt, lens_t, causal, out, lse, str(case), exact=pow2)


@gpu
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[8], CASES[6], CASES[9]],
                         ids=["sq2-hq32", "sq2-hq128-qfp8", "long", "p100-causal", "sq3-hq9-p32"])
def test_pv_r_beside_pv_l(case):
    """The kernel with WG1's P V_R issued as soon as P is ready, with the token loads skipping L1, and the early-Q K^T
    kernels (the benchmark's A/Bs) compute the same results, bit for bit."""
    b, s_q, h_q, s_k, page, causal, q_fp8, pow2 = case
    lens = [s_k + 13 * i for i in range(b)]
    q, q_deq, k_fp8, k_deq32, bt, lens_t, dq, dk = make_inputs(b, s_q, h_q, lens, page, q_fp8, pow2, seed=5)
    results = []
    try:
        for hold, no_alloc, early in ((False, False, False), (True, False, False), (True, True, False),
                                      (True, False, True), (False, False, True)):
            C._set_dense_fp8_hold_pv_r(hold)
            C._set_dense_fp8_k_l1_no_allocate(no_alloc)
            C._set_dense_fp8_early_qk(early)
            results.append(run_fp8(q, k_fp8, bt, lens_t, dq, dk, causal))
    finally:
        C._set_dense_fp8_hold_pv_r(None)
        C._set_dense_fp8_k_l1_no_allocate(False)
        C._set_dense_fp8_early_qk(None)
    (out, lse), (held, held_lse) = results[:2]
    for i, (o_i, l_i) in enumerate(results[2:]):  # no L1 allocation; early Q K^T held and not: the same arithmetic
        _torch().testing.assert_close(o_i, out, rtol=0, atol=0, msg=lambda m: f"variant {i + 2}: {m}")
        _torch().testing.assert_close(l_i, lse, rtol=0, atol=0, msg=lambda m: f"variant {i + 2}: {m}")
    check_against_bf16_and_reference(q_deq, k_deq32, bt, lens_t, causal, out, lse, f"{case} no hold")
    _torch().testing.assert_close(held, out, rtol=0, atol=0)  # the same arithmetic in another order of issue
    _torch().testing.assert_close(held_lse, lse, rtol=0, atol=0)


@gpu
def test_host_scales_and_softmax_scale():
    q, q_deq, k_fp8, k_deq32, bt, lens_t, dq, dk = make_inputs(3, 2, 64, [500, 70, 129], 64, q_fp8=True)
    out, lse = run_fp8(q, k_fp8, bt, lens_t, dq, dk, True, scale_as_tensor=False, softmax_scale=0.07)
    check_against_bf16_and_reference(q_deq, k_deq32, bt, lens_t, True, out, lse, "host scales", softmax_scale=0.07)


@gpu
def test_short_prompts_and_every_batch_size():
    """Prompts of 1..200 tokens (67..128 in every batch: the fork crash's range) at batch sizes sampled over 1..256,
    h_q 128, each with a fresh schedule (the object style's plan) and the tensor style's metadata."""
    torch = _torch()
    om = _openmla()
    ref = _ref()
    sizes = sorted(set(list(range(1, 17)) + list(range(17, 257, 9)) + [31, 32, 33, 63, 64, 65, 66, 127, 128, 129,
                                                                          131, 132, 133, 255, 256]))
    rng = random.Random(7)
    for b in sizes:
        lens = [rng.choice([rng.randint(1, 200), rng.randint(67, 128)]) for _ in range(b)]
        q, q_deq, k_fp8, k_deq32, bt, lens_t, dq, dk = make_inputs(b, 1, 128, lens, 64, seed=b)
        out, lse = run_fp8(q, k_fp8, bt, lens_t, dq, dk, False)
        sched, _ = om.get_mla_metadata()
        bf_out, bf_lse = om.flash_mla_with_kvcache(q_deq.to(torch.bfloat16), k_deq32.to(torch.bfloat16), bt, lens_t,
                                                   D_V, sched)
        assert not torch.isnan(out).any() and not torch.isnan(lse).any(), f"b={b}: unwritten outputs"
        ref.check_is_allclose(f"out (b={b}, bf16 decode)", out, bf_out, **OUT_TOL_ROUNDED_BF16)
        ref.check_is_allclose(f"lse (b={b}, bf16 decode)", lse, bf_lse, **LSE_TOL_ROUNDED_BF16)
        n = min(b, 4)  # the fp32 reference on a few requests
        r_out, r_lse = ref.dense_decode_ref(q_deq[:n], k_deq32, bt[:n], lens_t[:n])
        ref.check_dense_decode(out[:n].float(), lse[:n], r_out, r_lse, what=f" (b={b}, reference)")
        md, ns = om.get_mla_metadata(lens_t, 128, 1, is_fp8_kvcache=True)
        t_out, t_lse = om.flash_mla_with_kvcache_fp8(q, k_fp8, bt, lens_t, D_V, md, ns,
                                                     descale_k=torch.tensor([dk], device="cuda"))
        assert torch.equal(t_out, out) and torch.equal(t_lse, lse), f"b={b}: tensor style differs from object style"


@gpu
def test_graph_capture_replays_with_new_lengths_and_scales():
    torch = _torch()
    om = _openmla()
    ref = _ref()
    b, s_q, h_q, page = 8, 2, 128, 64
    lens = [3000, 5, 67, 128, 1, 640, 999, 200]
    q, q_deq, k_fp8, k_deq32, bt, lens_t, dq, dk = make_inputs(b, s_q, h_q, lens, page, q_fp8=True)
    dq_t = torch.tensor([dq], dtype=torch.float32, device="cuda")
    dk_t = torch.tensor([dk], dtype=torch.float32, device="cuda")
    out, lse = poisoned_outputs(b, s_q, h_q)
    static_lens = lens_t.clone()
    sched_holder = {}

    def step():
        sched, _ = om.get_mla_metadata()
        sched_holder["s"] = sched
        om.flash_mla_with_kvcache(q, k_fp8, bt, static_lens, D_V, sched, causal=True, is_fp8_kvcache=True,
                                  descale_q=dq_t, descale_k=dk_t, out=out, lse=lse)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for trial in range(3):
        new = [max(0, L - 37 * trial) for L in lens]
        static_lens.copy_(torch.tensor(new, dtype=torch.int32, device="cuda"))
        scale = 1.0 + 0.5 * trial
        dk_t.fill_(dk * scale)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        new_t = torch.tensor(new, dtype=torch.int32, device="cuda")
        check_against_bf16_and_reference(q_deq, k_deq32 * scale, bt, new_t, True, out, lse, f"replay {trial}")


# ---------------------------------------------------------------------------------------------------
# Bad arguments (CPU: the binding with fake device pointers; the checks run before any CUDA call)
# ---------------------------------------------------------------------------------------------------
def _fake():
    import test_decode_api as t

    t._DTYPES.setdefault("fp8", (10, 8))  # DLPack kDLFloat8_e4m3fn
    if t._real_cuda_device_present():
        pytest.skip("validation-only tests with fake device pointers; they run on machines without a GPU")
    return t.fake_cuda


NUM_SMS = 132
# What a valid fake call raises: no device here (RuntimeError), or the decode kernels compiled out (NotImplementedError).
LAUNCH_ERRORS = (RuntimeError, NotImplementedError)


def fp8_problem(**overrides):
    p = dict(batch=4, s_q=2, h_q=16, h_kv=1, d_qk=576, d_v=512, page_block_size=64, cache_format="fp8_e4m3",
             causal=True, num_sms=NUM_SMS)
    p.update(overrides)
    return p


def fp8_args(p, **overrides):
    fake = _fake()
    sizes = C.get_decode_workspace_sizes(**p)
    b, s_q, h_q, page = p["batch"], p["s_q"], p["h_q"], p["page_block_size"]
    make = {
        "q": lambda: fake((b, s_q, h_q, 576), "bf16"),
        "k_cache": lambda: fake((10, page, 1, 576), "fp8"),
        "block_table": lambda: fake((b, 8), "int32"),
        "cache_seqlens": lambda: fake((b,), "int32"),
        "metadata": lambda: fake((sizes["num_sm_parts"], 8), "int32"),
        "num_splits": lambda: fake((b + 1,), "int32"),
        "partial_o": lambda: fake((sizes["partial_rows"], 512), "fp32"),
        "partial_lse": lambda: fake((sizes["partial_rows"],), "fp32"),
        "out": lambda: fake((b, s_q, h_q, 512), "bf16"),
        "lse": lambda: fake((b, h_q, s_q), "fp32", strides=[s_q * h_q, 1, h_q]),
    }
    kw = {name: overrides.pop(name) for name in list(overrides) if name not in make}
    return [overrides[n] if n in overrides else make[n]() for n in make], kw


def expect_fp8_error(p, match, exc=ValueError, **overrides):
    args, kw = fp8_args(p, **overrides)
    with pytest.raises(exc, match=match) as info:
        C.dense_decode_fp8(*args, **kw, **p)
    return str(info.value)


def test_valid_fake_call_reaches_the_launch():
    # Every check passes: the call fails only where it needs the device (no GPU here).
    args, kw = fp8_args(fp8_problem())
    with pytest.raises(LAUNCH_ERRORS):
        C.dense_decode_fp8(*args, **kw, **fp8_problem())


@pytest.mark.parametrize("overrides,match", [
    (dict(q="fp16"), r"argument 'q' has dtype float16; FP8 dense decode takes a bfloat16 or float8_e4m3 q"),
    (dict(q="fp32"), r"argument 'q' has dtype float32"),
    (dict(k_cache="bf16"), r"argument 'k_cache'"),
    (dict(k_cache="fp16"), r"argument 'k_cache'"),
    (dict(out="fp16"), r"argument 'out'"),
])
def test_wrong_dtypes_are_named(overrides, match):
    fake = _fake()
    shapes = dict(q=(4, 2, 16, 576), k_cache=(10, 64, 1, 576), out=(4, 2, 16, 512))
    over = {n: fake(shapes[n], dt) for n, dt in overrides.items()}
    expect_fp8_error(fp8_problem(), match, **over)


def test_fp8_q_is_accepted_and_its_strides_checked():
    fake = _fake()
    args, kw = fp8_args(fp8_problem(), q=fake((4, 2, 16, 576), "fp8"))
    with pytest.raises(LAUNCH_ERRORS):  # valid: only the launch needs the device
        C.dense_decode_fp8(*args, **kw, **fp8_problem())
    # A byte view with q_fp8=True is the same.
    args, kw = fp8_args(fp8_problem(), q=fake((4, 2, 16, 576), "uint8"), q_fp8=True)
    with pytest.raises(LAUNCH_ERRORS):
        C.dense_decode_fp8(*args, **kw, **fp8_problem())
    expect_fp8_error(fp8_problem(), r"argument 'q' has dtype uint8", q=fake((4, 2, 16, 576), "uint8"))
    expect_fp8_error(fp8_problem(), r"'q'", q=fake((4, 2, 16, 576), "fp8", strides=[2 * 16 * 584, 16 * 584, 584, 1]))


@pytest.mark.parametrize("scale,match", [
    (lambda f: f((1,), "bf16"), r"argument 'descale_k' has dtype bfloat16"),
    (lambda f: f((2,), "fp32"), r"argument 'descale_k' has shape \(2,\)"),
    (lambda f: f((1, 1), "fp32"), r"argument 'descale_k' has shape"),
    (lambda f: np.ones(1, dtype=np.float32), r"'descale_k'"),
])
def test_bad_descale_tensor_is_named(scale, match):
    fake = _fake()
    expect_fp8_error(fp8_problem(), match, descale_k=scale(fake))


@pytest.mark.parametrize("kw,match", [
    (dict(descale_q_value=0.0), r"argument 'descale_q_value' is 0; a per-tensor scale must be finite and > 0"),
    (dict(descale_k_value=float("nan")), r"argument 'descale_k_value' is nan"),
    (dict(descale_k_value=-1.0), r"argument 'descale_k_value' is -1"),
])
def test_bad_host_scales_are_named(kw, match):
    expect_fp8_error(fp8_problem(), match, **kw)


def test_scale_given_twice_is_rejected():
    fake = _fake()
    expect_fp8_error(fp8_problem(), r"'descale_k' and 'descale_k_value' were both given",
                     descale_k=fake((1,), "fp32"), descale_k_value=2.0)


@pytest.mark.parametrize("p,match", [
    (fp8_problem(cache_format="bf16"), r"argument 'problem.cache_format' is bfloat16; dense_decode_fp8"),
    (fp8_problem(h_kv=2, h_q=16), r"h_kv"),
    (fp8_problem(d_qk=512), r"d_qk"),
    (fp8_problem(batch_invariant=True, max_blocks_per_seq=8), r"batch_invariant"),
])
def test_bad_problem_is_named(p, match):
    fake = _fake()
    over = {}
    if p["h_kv"] != 1:
        over["k_cache"] = fake((10, 64, 2, 576), "fp8")
    expect_fp8_error(p, match, **over)


def test_cache_shape_and_strides_are_checked():
    fake = _fake()
    p = fp8_problem()
    expect_fp8_error(p, r"'k_cache'", k_cache=fake((10, 32, 1, 576), "fp8"))  # page size != problem's
    expect_fp8_error(p, r"'k_cache'", k_cache=fake((10, 64, 1, 656), "uint8"))  # a V3.2 sparse layout
    expect_fp8_error(p, r"row stride \(dim 1\) must be a multiple of 16",
                     k_cache=fake((10, 64, 1, 576), "fp8", strides=[64 * 584, 584, 584, 1]))


@pytest.mark.parametrize("page", [1, 3, 17, 100, 1000])
def test_any_page_size_is_accepted(page):
    fake = _fake()
    p = fp8_problem(page_block_size=page)
    args, kw = fp8_args(p)
    with pytest.raises(LAUNCH_ERRORS):  # valid: only the launch needs the device
        C.dense_decode_fp8(*args, **kw, **p)


def test_bf16_dense_decode_names_the_fp8_entry():
    import test_decode_api as t

    if t._real_cuda_device_present():
        pytest.skip("validation-only test with fake device pointers")
    p = t.problem(cache_format="fp8_e4m3")
    with pytest.raises(ValueError, match=r"dense_decode_fp8"):
        C.dense_decode(*t.dense_args(dict(p, cache_format="bf16")), softmax_scale=0.0, stream=0, **p)


def test_python_layer_routes_and_checks_fp8_calls():
    """flash_mla_with_kvcache: an FP8 flag, descale or FP8-planned schedule takes the FP8 path, whose own checks name
    the argument before any tensor is touched."""
    om = _openmla()
    torch = pytest.importorskip("torch")
    q = torch.zeros((2, 1, 16, 576), dtype=torch.bfloat16)
    k16 = torch.zeros((4, 64, 1, 576), dtype=torch.bfloat16)
    sched, _ = om.get_mla_metadata()
    bt = torch.zeros((2, 1), dtype=torch.int32)
    lens = torch.zeros((2,), dtype=torch.int32)
    with pytest.raises(ValueError, match=r"argument 'q' must be a CUDA tensor"):
        om.flash_mla_with_kvcache(q, k16, bt, lens, 512, sched, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match=r"'attn_sink' is a sparse-decode argument"):
        om.flash_mla_with_kvcache(q, k16, bt, lens, 512, sched, descale_k=1.0, attn_sink=lens)
    with pytest.raises(ValueError, match=r"batch_invariant"):
        om.flash_mla_with_kvcache(q, k16, bt, lens, 512, sched, descale_k=1.0, batch_invariant=True)
    assert "flash_mla_with_kvcache_fp8" in om.__all__
    with pytest.raises(ValueError, match=r"argument 'q' must be a CUDA tensor"):
        om.flash_mla_with_kvcache_fp8(q, k16, bt, lens, 512, sched, descale_k=0.5)
    with pytest.raises(TypeError, match=r"argument 'descale_q' must be None, a float"):
        from openmla import decode_fp8

        decode_fp8._scale_args("x", "descale_q")
