"""Fault injection through the Python API: the garbage engines really pass, and the strides frameworks really export.

For each kind of garbage (block-table entries out of range or negative, lengths beyond the block table or negative,
indices INT_MIN / INT_MAX / -1 / beyond the cache, topk_length above topk or negative, append slots out of range, a
NaN sink, NaN in unused pages, a schedule planned for other lengths): the call does not fail, the valid requests get
the reference's results, and in checked mode (openmla.set_checked_mode / OPENMLA_CHECK=1) openmla.check_status()
raises a ValueError naming the argument, the position and the value. A cache larger than 2^32 bytes whose used pages
sit at its end gives results bitwise equal to a small cache holding the same pages. The stride of a size-1
dimension of any tensor argument (0, 1, arbitrary) never changes a result, and neither does a one-page cache.

The host side of the same suite is tests/cpp/test_faults.cpp and tests/cpp/test_checked_mode.cpp; the
compute-sanitizer cases of the garbage kinds are in tests/gpu/; the time of a step with each kind of garbage beside
the valid step is benchmarks/bench_fault.py (rows fault_*).

Torch is imported inside the tests only: without torch or a Hopper GPU every GPU test is collected and skipped with
its reason (conftest.py).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

import test_dense_decode as dense
import test_sparse_decode as sparse

gpu = pytest.mark.gpu

INT32_MAX = 2 ** 31 - 1
INT32_MIN = -2 ** 31
DEVICE = "cuda"


def _torch():
    import torch

    return torch


def _openmla():
    import openmla

    return openmla


@pytest.fixture(autouse=True)
def _full_fp32_reference():
    """The references' fp32 matmuls must be real fp32 (TF32 off), as in the other GPU tests."""
    try:
        import torch
    except Exception:
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture
def checked():
    """Checked mode on for the test (and off again after), starting from an empty violation record."""
    om = _openmla()
    before = om.checked_mode()
    om.set_checked_mode(True)
    _drain()
    yield om
    _drain()
    om.set_checked_mode(before)


def _drain():
    try:
        _openmla().check_status()
    except ValueError:
        pass


def expect_violation(pattern):
    """check_status() raises a ValueError whose message matches `pattern` (a regular expression)."""
    with pytest.raises(ValueError, match=pattern):
        _openmla().check_status()


def expect_clean():
    _openmla().check_status()  # raises if checked mode recorded anything


# ---------------------------------------------------------------------------------------------------------------
# The switch (no GPU needed)
# ---------------------------------------------------------------------------------------------------------------
def test_checked_mode_switch():
    om = _openmla()
    before = om.checked_mode()
    om.set_checked_mode(True)
    assert om.checked_mode() is True
    om.set_checked_mode(False)
    assert om.checked_mode() is False
    om.set_checked_mode(before)
    for name in ("set_checked_mode", "checked_mode", "check_status"):
        assert name in om.__all__


# ---------------------------------------------------------------------------------------------------------------
# Dense decode
# ---------------------------------------------------------------------------------------------------------------
# b = 6, s_q = 2, h_q = 128, lengths <= 512: the block table has 8 columns (capacity 512); request 2 owns all 8.
DENSE_LENS = [300, 77, 512, 130, 0, 450]
GARBAGE_REQ = 2


def _dense_inputs(seed=0, lens=DENSE_LENS):
    return dense.make_inputs(6, 2, 128, 1, seqlens=list(lens), seed=seed)


def _check_dense_rows(out, lse, ref_out, ref_lse, rows, what):
    dense._ref().check_dense_decode(out[rows], lse[rows], ref_out[rows], ref_lse[rows], what=f" [{what}]")


@gpu
@pytest.mark.parametrize("value", ["num_blocks", -1, INT32_MIN, INT32_MAX, 2147480000])
def test_dense_block_table_entry_out_of_range(checked, value):
    torch = _torch()
    inp = _dense_inputs(seed=1)
    torch.cuda.synchronize()
    ref_out, ref_lse = dense.reference(inp, causal=True)
    bad = inp.k_cache.shape[0] if value == "num_blocks" else value
    inp.block_table[GARBAGE_REQ, 3] = bad  # a page the request reads (512 tokens: pages 0..7)
    out, lse = dense.decode(inp, causal=True)
    torch.cuda.synchronize()
    valid = [i for i in range(6) if i != GARBAGE_REQ]
    _check_dense_rows(out, lse, ref_out, ref_lse, valid, f"block_table entry {bad}")
    expect_violation(rf"dense_decode: argument 'block_table'\[{GARBAGE_REQ}, 3\] is {bad}, outside \[0, num_blocks")


@gpu
@pytest.mark.parametrize("length", [INT32_MAX, 513, 100000, -5, INT32_MIN])
def test_dense_length_beyond_the_block_table_or_negative(checked, length):
    """A length past the block table's capacity is clamped to it (the request attends to its whole row), a negative
    one counts as 0; the schedule clamps the same way (benchmarks/bench_fault.py times it)."""
    torch = _torch()
    inp = _dense_inputs(seed=2)
    torch.cuda.synchronize()
    ref_out, ref_lse = dense.reference(inp, causal=True)  # request 2 at 512 = its whole row = the clamped length
    inp.cache_seqlens[GARBAGE_REQ] = length
    out, lse = dense.decode(inp, causal=True)
    torch.cuda.synchronize()
    if length > 0:
        _check_dense_rows(out, lse, ref_out, ref_lse, list(range(6)), f"length {length} clamped")
    else:
        valid = [i for i in range(6) if i != GARBAGE_REQ]
        _check_dense_rows(out, lse, ref_out, ref_lse, valid, f"length {length}")
        assert bool((out[GARBAGE_REQ] == 0).all()) and bool(torch.isposinf(lse[GARBAGE_REQ]).all())
    reason = "negative" if length < 0 else r"past the block table's capacity max_blocks_per_seq \* page_block_size = 512"
    # The planning kernel sees the length first (the schedule is planned on this first call) and names itself.
    expect_violation(rf"(plan_decode|dense_decode): argument 'cache_seqlens'\[{GARBAGE_REQ}\] is {length}, {reason}")


@gpu
def test_dense_nan_in_unused_pages_and_tails_is_never_read(checked):
    """Every page no request owns and the tail of every last page hold NaN (make_inputs), block-table entries past
    each request's pages hold 2147480000: results equal the reference and checked mode finds nothing."""
    torch = _torch()
    inp = _dense_inputs(seed=3)
    out, lse = dense.decode(inp, causal=True)
    dense.check_against_reference(inp, out, lse, causal=True, what="NaN pages")
    assert not bool(out.isnan().any())
    torch.cuda.synchronize()
    expect_clean()


@gpu
def test_dense_schedule_planned_for_other_lengths(checked):
    """A schedule reused with other length values than it was planned with: no failure, no write outside the
    call's buffers (tests/gpu: compute-sanitizer), and checked mode names the schedule."""
    torch = _torch()
    om = _openmla()
    inp = _dense_inputs(seed=4)
    meta, _ = om.get_mla_metadata()
    dense.decode(inp, causal=True, meta=meta)  # plans with DENSE_LENS
    torch.cuda.synchronize()
    expect_clean()
    # Other lengths inside each request's own pages (the block table stays valid): only the schedule is wrong.
    inp.cache_seqlens.copy_(torch.tensor([40, 120, 500, 3, 0, 12], dtype=torch.int32, device=DEVICE))
    out, lse = dense.decode(inp, causal=True, meta=meta)
    torch.cuda.synchronize()
    assert out.shape == (6, 2, 128, 512)
    expect_violation(r"dense_decode: argument 'schedule' was planned for other lengths than this call's")


@gpu
@pytest.mark.parametrize("stride", [0, 1, 12345])
def test_dense_size1_strides_and_one_page(stride):
    """b = 1, s_q = 1, h_kv = 1, a one-page cache, one block-table column: every tensor argument has size-1
    dimensions, given stride 0, 1 (torch <= 2.8's DLPack export of k_cache.unsqueeze(-2)) or an arbitrary value."""
    torch = _torch()
    inp = dense.make_inputs(1, 1, 64, 1, seqlens=[50], seed=5)
    page = int(inp.block_table[0, 0])  # the one page the request uses
    kc = inp.k_cache[page:page + 1].clone()
    bt = torch.zeros((1, 1), dtype=torch.int32, device=DEVICE)
    plain = dense.Inputs(inp.q, kc, bt, inp.cache_seqlens)
    out_ref, lse_ref = dense.decode(plain, causal=False)
    dense.check_against_reference(plain, out_ref, lse_ref, causal=False, what="one page")

    def weird(t, keep):
        """t as a view whose size-1 dimensions (those not in `keep`) have stride `stride`."""
        strides = [stride if (n == 1 and i not in keep) else s for i, (n, s) in enumerate(zip(t.shape, t.stride()))]
        return torch.as_strided(t, t.shape, strides)

    out = torch.full((1, 1, 64, 512), float("nan"), dtype=inp.q.dtype, device=DEVICE)
    lse_buf = torch.full((1, 64, 1), float("nan"), dtype=torch.float32, device=DEVICE)
    args = dense.Inputs(weird(inp.q, ()), weird(kc, ()), weird(bt, ()), weird(inp.cache_seqlens, ()))
    got_out, got_lse = dense.decode(args, causal=False, out=weird(out, ()), lse=weird(lse_buf, ()))
    torch.cuda.synchronize()
    assert torch.equal(got_out, out_ref) and torch.equal(got_lse, lse_ref)


@gpu
def test_dense_cache_beyond_4_gib():
    """A cache of more than 2^32 bytes whose used pages sit at its end: the same results, bit for bit, as a small
    cache holding the same pages (no 32-bit byte offset anywhere)."""
    torch = _torch()
    page_bytes = 64 * 576 * 2
    num_blocks = (2 ** 32) // page_bytes + 2000  # ~4.4 GB
    small = dense.make_inputs(4, 2, 128, 1, seqlens=[300, 200, 450, 64], seed=6)
    nb_small = small.k_cache.shape[0]
    big_cache = torch.empty((num_blocks, 64, 1, 576), dtype=small.q.dtype, device=DEVICE)
    base = num_blocks - nb_small
    big_cache[base:].copy_(small.k_cache)
    big_table = torch.where(small.block_table == dense.INVALID_PAGE, small.block_table, small.block_table + base)
    assert (base + nb_small - 1) * page_bytes > 2 ** 32
    out_s, lse_s = dense.decode(small, causal=True)
    out_b, lse_b = dense.decode(dense.Inputs(small.q, big_cache, big_table, small.cache_seqlens), causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out_s, out_b) and torch.equal(lse_s, lse_b)
    del big_cache
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# Sparse decode
# ---------------------------------------------------------------------------------------------------------------
SPARSE_CASE = sparse.Case("v32", 4, 2, 128, sparse.Sel(512, 64, 64, lens=True), sink="random", varlen=True)
SPARSE_LENS = [40, 64, 17, 64]


def _sparse_inputs(case=SPARSE_CASE, seed=0, lengths=SPARSE_LENS):
    """test_sparse_decode's inputs without the out-of-range garbage it puts into slots (turned into -1): those are
    tolerated by OpenMLA but reported by checked mode, and each test here injects its own."""
    inp = sparse.make_inputs(case, seed=seed, lengths=lengths)
    for paged in (inp.main, inp.extra):
        if paged is None:
            continue
        idx = paged.indices
        capacity = paged.cache.shape[0] * paged.cache.shape[1]
        idx[(idx != -1) & ((idx < 0) | (idx >= capacity))] = -1
    return inp


@gpu
@pytest.mark.parametrize("value", [INT32_MIN, INT32_MAX, -1, "capacity", "capacity+7", -77])
def test_sparse_index_garbage_in_a_used_slot(checked, value):
    """flash_mla documents only -1 as "unused"; OpenMLA skips every index outside the cache and checked mode names
    those other than -1."""
    inp = _sparse_inputs(seed=7)
    capacity = inp.main.cache.shape[0] * inp.main.cache.shape[1]
    bad = {"capacity": capacity, "capacity+7": capacity + 7}.get(value, value)
    inp.main.indices[1, 0, 5] = bad  # slot 5 < topk_length[1] = 64: used
    out, lse = sparse.decode(inp)
    sparse.check_against_reference(inp, out, lse, what=f"index {bad}")
    if bad == -1:
        expect_clean()
    else:
        expect_violation(rf"sparse_decode: argument 'indices'\[1, 0, 5\] is {bad}, neither -1 nor a token of the "
                         rf"cache \[0, num_blocks \* page_block_size = {capacity}\)")


@gpu
@pytest.mark.parametrize("length", [65, INT32_MAX, -1, INT32_MIN])
def test_sparse_topk_length_out_of_range(checked, length):
    """topk_length above topk or negative is clamped to [0, topk] by the scheduler and the kernel alike."""
    torch = _torch()
    inp = _sparse_inputs(seed=8)
    inp.main.indices[2, :, SPARSE_LENS[2]:] = -1  # read once the length is past 17: no index garbage there
    inp.main.lengths[2] = length
    out, lse = sparse.decode(inp)
    torch.cuda.synchronize()
    ref_out, ref_lse = sparse.reference(inp)
    rows = [0, 1, 3] if length > 0 else [0, 1, 2, 3]  # past topk, request 2 reads slots that hold garbage / NaN
    sparse._ref().check_sparse_decode(out[rows], lse[rows], ref_out[rows], ref_lse[rows], what=f" [length {length}]")
    expect_violation(rf"(plan_decode|sparse_decode): argument 'topk_length'\[2\] is {length}")  # planned first


@gpu
def test_sparse_nan_sink(checked):
    """A NaN sink is garbage for its head only; +-inf are allowed and give the contract's results."""
    torch = _torch()
    inp = _sparse_inputs(seed=9)
    sink = inp.sink.clone()
    sink[17] = float("nan")
    out, lse = sparse.decode(inp, sink=sink)
    torch.cuda.synchronize()
    ref_out, ref_lse = sparse.reference(inp)
    heads = [h for h in range(128) if h != 17]
    sparse._ref().check_sparse_decode(out[:, :, heads], lse[:, heads], ref_out[:, :, heads], ref_lse[:, heads],
                                      what=" [NaN sink]")
    expect_violation(r"sparse_decode: argument 'attn_sink'\[17\] is NaN")


def _sparse_raw_call(inp, problem, metadata, num_splits, ws, topk_length):
    torch = _torch()
    from openmla import _openmla as C

    b, s_q, h_q = problem["batch"], problem["s_q"], problem["h_q"]
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device=DEVICE)
    partial_o = torch.empty((ws["partial_rows"], 512), dtype=torch.float32, device=DEVICE)
    partial_lse = torch.empty((ws["partial_rows"],), dtype=torch.float32, device=DEVICE)
    C.sparse_decode(inp.q, inp.main.cache, inp.main.indices, metadata, num_splits, partial_o, partial_lse, out, lse,
                    topk_length=topk_length, softmax_scale=inp.scale,
                    stream=torch.cuda.current_stream().cuda_stream, **problem)
    return out, lse


@gpu
def test_sparse_schedule_planned_with_lengths_used_without(checked):
    """The out-of-bounds write of the issue: b = 2, h_q = 128, topk = 16384, planned with topk_length [16384, 0],
    called without (host records at small batch). The call now takes its split slots from its own host walk, so it
    writes inside its buffers and its results are exact; the other way round (planned without, called with) it reads
    the device schedule, stays inside its buffers, and checked mode names the schedule."""
    torch = _torch()
    from openmla import _openmla as C

    case = sparse.Case("v32", 2, 1, 128, sparse.Sel(20000, 16384, 64), varlen=False)
    inp = _sparse_inputs(case, seed=10, lengths=None)
    problem = dict(batch=2, s_q=1, h_q=128, h_kv=1, d_qk=576, d_v=512, page_block_size=64, cache_format="fp8_v32",
                   sparse=True, topk=16384, num_sms=C.device_sm_count(0))
    ws = C.get_decode_workspace_sizes(**problem)
    metadata = torch.empty((ws["num_sm_parts"], 8), dtype=torch.int32, device=DEVICE)
    num_splits = torch.empty((3,), dtype=torch.int32, device=DEVICE)
    stream = torch.cuda.current_stream().cuda_stream
    planned = torch.tensor([16384, 0], dtype=torch.int32, device=DEVICE)
    C.plan_decode(None, metadata, num_splits, topk_length=planned, stream=stream, **problem)
    out, lse = _sparse_raw_call(inp, problem, metadata, num_splits, ws, topk_length=None)
    sparse.check_against_reference(inp, out, lse, what="planned with lengths, called without")
    expect_clean()  # the call never reads the device schedule

    C.plan_decode(None, metadata, num_splits, stream=stream, **problem)
    out, lse = _sparse_raw_call(inp, problem, metadata, num_splits, ws, topk_length=planned)
    torch.cuda.synchronize()
    expect_violation(r"sparse_decode: argument 'schedule' was planned for other lengths than this call's")


@gpu
@pytest.mark.parametrize("layout", ["v32", "model1"])
def test_sparse_size1_strides_and_one_page(layout, checked):
    """b = 1, s_q = 1, h_q = 64, a one-page cache (MODEL1 with an odd page size: a page stride that is not a
    multiple of 16 bytes, never used); the size-1 dimensions of every argument get stride 0, 1 or 12345."""
    torch = _torch()
    om = _openmla()
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    d_qk, page = sparse.D_QK[layout], 61
    kv = (torch.randn((1, page, 1, d_qk), generator=gen, device=DEVICE) / 10).clamp_(-1, 1).to(torch.bfloat16)
    cache = om.quantize_kv_cache(kv, layout)
    q = torch.randn((1, 1, 64, d_qk), generator=gen, device=DEVICE).clamp_(-1, 1).to(torch.bfloat16)
    indices = torch.randperm(page, generator=gen, device=DEVICE)[:32].to(torch.int32).view(1, 1, 32)
    lengths = torch.tensor([20], dtype=torch.int32, device=DEVICE)
    sink = torch.randn((64,), generator=gen, device=DEVICE)

    def call(q_, cache_, idx_, len_, sink_):
        meta, _ = om.get_mla_metadata()
        return om.flash_mla_with_kvcache(q_, cache_, None, None, 512, meta, is_fp8_kvcache=True, indices=idx_,
                                         topk_length=len_, attn_sink=sink_)

    out_ref, lse_ref = call(q, cache, indices, lengths, sink)
    values = om.dequantize_kv_cache(cache, layout)
    ref_out, ref_lse = sparse._ref().sparse_decode_ref(q, values, indices, lengths, sink)
    torch.cuda.synchronize()
    sparse._ref().check_sparse_decode(out_ref, lse_ref, ref_out, ref_lse, what=" [one page]")
    for stride in (0, 1, 12345):
        def weird(t):
            st = [stride if n == 1 else s for n, s in zip(t.shape, t.stride())]
            return torch.as_strided(t, t.shape, st)

        out, lse = call(weird(q), weird(cache), weird(indices), weird(lengths), sink)
        torch.cuda.synchronize()
        assert torch.equal(out, out_ref) and torch.equal(lse, lse_ref), stride
    expect_clean()


@gpu
def test_sparse_cache_beyond_4_gib():
    """An FP8 cache of more than 2^32 bytes whose selected pages sit at its end: bitwise the results of a small
    cache holding the same pages."""
    torch = _torch()
    om = _openmla()
    page, bpt = 64, 656
    num_blocks = (2 ** 32) // (page * bpt) + 1000  # ~4.3 GB
    small_pages = 40
    gen = torch.Generator(device=DEVICE).manual_seed(12)
    kv = (torch.randn((small_pages, page, 1, 576), generator=gen, device=DEVICE) / 10).clamp_(-1, 1)
    kv = kv.to(torch.bfloat16)
    small = om.quantize_kv_cache(kv, "v32")
    big = torch.empty((num_blocks, page, 1, bpt), dtype=torch.uint8, device=DEVICE)
    base = num_blocks - small_pages
    om.quantize_kv_cache(kv, "v32", out=big[base:])
    assert base * page * bpt > 2 ** 32
    b, s_q, h_q, topk = 4, 2, 128, 512
    q = torch.randn((b, s_q, h_q, 576), generator=gen, device=DEVICE).clamp_(-1, 1).to(torch.bfloat16)
    idx = torch.randint(0, small_pages * page, (b, s_q, topk), generator=gen, device=DEVICE, dtype=torch.int32)
    idx[:, :, ::7] = -1
    meta, _ = om.get_mla_metadata()
    out_s, lse_s = om.flash_mla_with_kvcache(q, small, None, None, 512, meta, is_fp8_kvcache=True, indices=idx)
    meta, _ = om.get_mla_metadata()
    big_idx = torch.where(idx >= 0, idx + base * page, idx)
    out_b, lse_b = om.flash_mla_with_kvcache(q, big, None, None, 512, meta, is_fp8_kvcache=True, indices=big_idx)
    torch.cuda.synchronize()
    assert torch.equal(out_s, out_b) and torch.equal(lse_s, lse_b)
    del big
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# KV-cache codec and sparse prefill
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("slot_dtype", ["int32", "int64"])
def test_append_slot_out_of_range(checked, slot_dtype):
    torch = _torch()
    om = _openmla()
    gen = torch.Generator(device=DEVICE).manual_seed(13)
    num_blocks, page = 3, 16
    capacity = num_blocks * page
    cache = om.quantize_kv_cache(torch.zeros((num_blocks, page, 1, 576), dtype=torch.bfloat16, device=DEVICE), "v32")
    before = cache.clone()
    new_kv = (torch.randn((4, 576), generator=gen, device=DEVICE) / 10).to(torch.bfloat16)
    huge = 2 ** 40 if slot_dtype == "int64" else INT32_MAX
    slots = torch.tensor([0, capacity, 5, huge], dtype=getattr(torch, slot_dtype), device=DEVICE)
    om.append_kv_cache(new_kv, slots, cache, "v32")
    want = om.quantize_kv_cache(new_kv.view(4, 1, 1, 576), "v32").view(4, 656)
    torch.cuda.synchronize()
    flat, flat_before = cache.view(capacity, 656), before.view(capacity, 656)
    assert torch.equal(flat[0], want[0]) and torch.equal(flat[5], want[2])
    untouched = [i for i in range(capacity) if i not in (0, 5)]
    assert torch.equal(flat[untouched], flat_before[untouched])
    expect_violation(rf"append_kv_cache: argument 'slots'\[1\] is {capacity}, at or past the cache's")


@gpu
def test_codec_size1_strides():
    torch = _torch()
    om = _openmla()
    gen = torch.Generator(device=DEVICE).manual_seed(14)
    kv = (torch.randn((1, 64, 1, 576), generator=gen, device=DEVICE) / 10).to(torch.bfloat16)
    plain = om.quantize_kv_cache(kv, "v32")
    for stride in (0, 1, 12345):
        src = torch.as_strided(kv, kv.shape, (stride, 576, stride, 1))
        dst = torch.empty_like(plain)
        om.quantize_kv_cache(src, "v32", out=torch.as_strided(dst, dst.shape, (stride, 656, stride, 1)))
        assert torch.equal(dst, plain), stride
        back = om.dequantize_kv_cache(torch.as_strided(plain, plain.shape, (stride, 656, stride, 1)), "v32")
        assert torch.equal(back, om.dequantize_kv_cache(plain, "v32")), stride
        cache = om.quantize_kv_cache(torch.zeros_like(kv), "v32")
        rows = kv[0, :3]  # (3, 1, 576): the stride of the size-1 head dimension replaced
        slots = torch.as_strided(torch.tensor([4, 9, 2], dtype=torch.int32, device=DEVICE), (3,), (1,))
        om.append_kv_cache(torch.as_strided(rows, rows.shape, (576, stride, 1)), slots, cache, "v32")
        one = torch.as_strided(torch.tensor([11], dtype=torch.int32, device=DEVICE), (1,), (stride,))
        om.append_kv_cache(torch.as_strided(kv[0, :1], (1, 1, 576), (stride, stride, 1)), one, cache, "v32")
        torch.cuda.synchronize()
        assert torch.equal(cache.view(64, 656)[[4, 9, 2, 11]], plain.view(64, 656)[[0, 1, 2, 0]]), stride


@gpu
def test_sparse_prefill_garbage_and_size1_strides(checked):
    """Sparse prefill skips every index outside [0, s_kv); checked mode names those other than -1, a top-k length
    outside [0, topk] and a NaN sink. One query token with size-1 strides 0, 1, 12345 gives the same results."""
    torch = _torch()
    om = _openmla()
    gen = torch.Generator(device=DEVICE).manual_seed(15)
    s_q, h_q, s_kv, topk = 3, 64, 200, 128
    q = (torch.randn((s_q, h_q, 576), generator=gen, device=DEVICE) / 10).to(torch.bfloat16)
    kv = (torch.randn((s_kv, 1, 576), generator=gen, device=DEVICE) / 10).to(torch.bfloat16)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=gen, device=DEVICE, dtype=torch.int32)
    lens = torch.tensor([100, 128, 7], dtype=torch.int32, device=DEVICE)
    out_ref, ml_ref, lse_ref = om.flash_mla_sparse_fwd(q, kv, idx, 0.5, topk_length=lens)
    torch.cuda.synchronize()
    expect_clean()
    garbage = idx.clone()
    garbage[1, 0, 3] = s_kv + 5
    garbage[2, 0, 50] = INT32_MIN  # past its length: never read, never reported
    out, ml, lse = om.flash_mla_sparse_fwd(q, kv, garbage, 0.5, topk_length=lens)
    torch.cuda.synchronize()
    assert torch.equal(out[0], out_ref[0]) and torch.equal(out[2], out_ref[2])
    expect_violation(rf"sparse_prefill: argument 'indices'\[1, 0, 3\] is {s_kv + 5}, neither -1 nor a row of kv")
    bad_lens = lens.clone()
    bad_lens[0] = -3
    om.flash_mla_sparse_fwd(q, kv, idx, 0.5, topk_length=bad_lens)
    expect_violation(r"sparse_prefill: argument 'topk_length'\[0\] is -3, negative")
    q1, idx1, len1 = q[:1], idx[:1], lens[:1]
    o1, m1, l1 = om.flash_mla_sparse_fwd(q1, kv, idx1, 0.5, topk_length=len1)
    for stride in (0, 1, 12345):
        def weird(t):
            return torch.as_strided(t, t.shape, [stride if n == 1 else s for n, s in zip(t.shape, t.stride())])

        o, m, l = om.flash_mla_sparse_fwd(weird(q1), weird(kv), weird(idx1), 0.5, topk_length=weird(len1))
        torch.cuda.synchronize()
        assert torch.equal(o, o1) and torch.equal(m, m1) and torch.equal(l, l1), stride
    expect_clean()


# ---------------------------------------------------------------------------------------------------------------
# Checked mode: no false positives, graph capture
# ---------------------------------------------------------------------------------------------------------------
@gpu
def test_checked_mode_reports_nothing_for_valid_calls_and_changes_no_result(checked):
    torch = _torch()
    om = _openmla()
    inp = _dense_inputs(seed=16)
    out_on, lse_on = dense.decode(inp, causal=True)
    sinp = _sparse_inputs(replace(SPARSE_CASE, extra=sparse.Sel(300, 100, 53, lens=True)), seed=17)
    sout_on, slse_on = sparse.decode(sinp)
    torch.cuda.synchronize()
    expect_clean()
    om.set_checked_mode(False)
    out_off, lse_off = dense.decode(inp, causal=True)
    sout_off, slse_off = sparse.decode(sinp)
    om.set_checked_mode(True)
    torch.cuda.synchronize()
    assert torch.equal(out_on, out_off) and torch.equal(lse_on, lse_off)
    assert torch.equal(sout_on, sout_off) and torch.equal(slse_on, slse_off)


@gpu
def test_checked_mode_under_cuda_graph_capture(checked):
    """Checked calls are graph-capturable: the check kernel is captured with the call, and a replay with garbage
    written into the static inputs records the violation."""
    torch = _torch()
    om = _openmla()
    inp = _dense_inputs(seed=18)
    meta, _ = om.get_mla_metadata()
    dense.decode(inp, causal=True, meta=meta)  # plan and warm up outside capture
    torch.cuda.synchronize()
    expect_clean()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = dense.decode(inp, causal=True, meta=meta)
    graph.replay()
    torch.cuda.synchronize()
    expect_clean()
    inp.block_table[1, 0] = -9
    graph.replay()
    torch.cuda.synchronize()
    expect_violation(r"dense_decode: argument 'block_table'\[1, 0\] is -9")


@gpu
def test_the_first_violation_is_reported_and_the_record_cleared(checked):
    torch = _torch()
    inp = _dense_inputs(seed=19)
    inp.block_table[3, 2] = 10 ** 9
    inp.block_table[0, 1] = -1
    dense.decode(inp, causal=True)
    inp2 = _dense_inputs(seed=20)
    inp2.cache_seqlens[5] = -1
    dense.decode(inp2, causal=True)
    torch.cuda.synchronize()
    expect_violation(r"argument 'block_table'\[0, 1\] is -1")  # the earlier call, its lowest (request, page)
    expect_clean()
