"""GPU tests of dense decode over caches of 1, 2, 4 and 8 tokens per page: the gather kernel (docs/dense-decode.md,
"Small pages: the gather kernel"). At page 1 the block table is a per-token slot list.

As in test_dense_decode_page_sizes.py, each case draws one logical cache in page-64 form (NaN in every unused page and
in the tail of each last page, garbage block-table entries past a request's pages), then re-pages the same tokens into
pages of P tokens under a fresh random permutation (block-table entries in random order), with spare pages no request
owns filled with NaN, the tail of each last page NaN, and lengths that are multiples of neither P nor 64. The page-P
call must equal the page-64 call BIT FOR BIT: the kernels walk the same 64-token blocks in the same order under the
same schedule, every valid row lands in the same place of shared memory, and rows past a length are masked whatever
they hold (the gather kernel zero-fills them; the page-64 kernel zeroes its V rows). Each result is also checked
against the fp32 reference.
"""
from __future__ import annotations

import pytest

from test_dense_decode import D_QK, D_V, INVALID_PAGE, PAGE, Inputs, _openmla, _torch, check_against_reference, \
    decode, make_inputs

gpu = pytest.mark.gpu

SMALL_PAGES = (1, 2, 4, 8)


def repage(inp: Inputs, page: int, seed: int, spare_pages: int = 5) -> Inputs:
    """The same logical cache in pages of `page` tokens, under a random page permutation (vectorised per request: at
    page 1 a request of 8K tokens is 8K pages)."""
    torch = _torch()
    dev = inp.q.device
    b = inp.q.shape[0]
    _, _, h_kv, _ = inp.k_cache.shape
    capacity = inp.block_table.shape[1] * PAGE  # a multiple of 256 tokens (make_inputs pads to 256)
    assert capacity % page == 0
    max_pages = capacity // page
    gen = torch.Generator().manual_seed(seed + 1000 * page)
    lens = [int(x) for x in inp.cache_seqlens.tolist()]
    used = [(n + page - 1) // page for n in lens]
    num_pages = sum(used) + spare_pages
    perm = torch.randperm(num_pages, generator=gen)
    k = torch.full((num_pages * page, h_kv, D_QK), float("nan"), dtype=inp.k_cache.dtype, device=dev)
    table = torch.full((b, max_pages), INVALID_PAGE, dtype=torch.int32)
    cursor = 0
    for i, n in enumerate(lens):
        if n == 0:
            continue
        blocks = inp.block_table[i, :(n + PAGE - 1) // PAGE].long()
        tokens = inp.k_cache[blocks].reshape(-1, h_kv, D_QK)[:n]  # the request's L tokens, in order
        phys = perm[cursor:cursor + used[i]]
        cursor += used[i]
        table[i, :used[i]] = phys.to(torch.int32)
        rows = (phys[:, None] * page + torch.arange(page)[None, :]).reshape(-1)[:n]  # token j -> its cache row
        k[rows.to(dev)] = tokens  # the rest of the last page stays NaN
    return Inputs(q=inp.q, k_cache=k.view(num_pages, page, h_kv, D_QK), block_table=table.to(dev),
                  cache_seqlens=inp.cache_seqlens)


def lengths(b, s_k, seed):
    """Lengths that are multiples of neither 8 nor 64, one of them shorter than a page of 8 and one a single token."""
    import random

    rng = random.Random(seed)
    lens = [max(int(rng.gauss(s_k, s_k / 2)), 2) for _ in range(b)]
    lens = [n + 1 if n % 8 == 0 else n for n in lens]
    lens[0] = 5
    if b > 2:
        lens[2] = 1
    return lens


def assert_bitwise(out, lse, out64, lse64, what):
    torch = _torch()
    if not torch.equal(out.view(torch.int16), out64.view(torch.int16)):
        diff = (out.float() - out64.float()).abs()
        bad = torch.nonzero(out.view(torch.int16) != out64.view(torch.int16))[0].tolist()
        raise AssertionError(f"{what}: out differs from page 64 (max abs diff {float(diff.nan_to_num(1e9).max())}, "
                             f"first differing index {bad}: {float(out[tuple(bad)])} vs {float(out64[tuple(bad)])})")
    if not torch.equal(lse.view(torch.int32), lse64.view(torch.int32)):
        bad = torch.nonzero(lse.view(torch.int32) != lse64.view(torch.int32))[0].tolist()
        raise AssertionError(f"{what}: lse differs from page 64, first at {bad}: {float(lse[tuple(bad)])} vs "
                             f"{float(lse64[tuple(bad)])}")


CASES = [
    # (b, s_q, h_q, h_kv, s_k, causal, dtype)
    (4, 1, 128, 1, 700, False, "bf16"),   # compute-bound shape (2 m-blocks)
    (4, 2, 128, 1, 700, True, "bf16"),    # 4 m-blocks, causal
    (3, 2, 16, 2, 1500, True, "bf16"),    # memory-bound shape, h_kv = 2
    (5, 1, 64, 1, 300, False, "fp16"),
    (6, 3, 9, 3, 200, True, "bf16"),      # odd heads, 3 query rows per kv head and position
]


@gpu
@pytest.mark.parametrize("page", SMALL_PAGES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-sq{}-hq{}-hkv{}-sk{}{}-{}".format(
    c[0], c[1], c[2], c[3], c[4], "-causal" if c[5] else "", c[6]))
def test_small_page_matches_page64_bitwise(case, page):
    b, s_q, h_q, h_kv, s_k, causal, dtype = case
    seed = 7 * b + s_q + page
    inp64 = make_inputs(b, s_q, h_q, h_kv, seqlens=lengths(b, s_k, seed), dtype=dtype, seed=seed)
    inp = repage(inp64, page, seed)
    out64, lse64 = decode(inp64, causal)
    out, lse = decode(inp, causal)
    _torch().cuda.synchronize()
    assert_bitwise(out, lse, out64, lse64, f"page {page}")
    check_against_reference(inp, out, lse, causal, f"page {page}")


@gpu
@pytest.mark.parametrize("page", SMALL_PAGES)
def test_small_page_split_requests_and_many_partitions(page):
    """Long requests split over several partitions (the in-kernel merge and the combine) at every small page size."""
    lens = [8000 + 37, 5 * 64 + 11, 3000 + 1]
    inp64 = make_inputs(3, 2, 128, 1, seqlens=lens, seed=page)
    inp = repage(inp64, page, page)
    out64, lse64 = decode(inp64, True)
    out, lse = decode(inp, True)
    _torch().cuda.synchronize()
    assert_bitwise(out, lse, out64, lse64, f"page {page} split")
    check_against_reference(inp, out, lse, True, f"page {page} split")


@gpu
def test_page1_many_requests_and_empty_ones():
    """More requests than SMs at page 1, some empty (the prologue's gathers of a request without blocks, the
    epilogue's look-ahead at an empty next request)."""
    import random

    rng = random.Random(5)
    lens = [0 if rng.random() < 0.2 else rng.randint(1, 600) for _ in range(200)]
    lens[0] = 0
    inp64 = make_inputs(len(lens), 1, 16, 1, seqlens=lens, seed=11)
    inp = repage(inp64, 1, 11)
    out64, lse64 = decode(inp64, False)
    out, lse = decode(inp, False)
    _torch().cuda.synchronize()
    assert_bitwise(out, lse, out64, lse64, "page 1, 200 requests")
    check_against_reference(inp, out, lse, False, "page 1, 200 requests")


@gpu
@pytest.mark.parametrize("page", (1, 8))
def test_entries_outside_the_cache_read_zeros(page):
    """A block-table entry inside a request's pages but outside [0, num_blocks) (or negative) reads zeros, as the TMA
    kernels' bounds do: the same results as the entry pointing at a page of zeros."""
    torch = _torch()
    lens = [300, 129]
    inp = repage(make_inputs(2, 1, 16, 1, seqlens=lens, seed=4), page, 4)
    num_pages = inp.k_cache.shape[0]
    zero = torch.zeros((1,) + tuple(inp.k_cache.shape[1:]), dtype=inp.k_cache.dtype, device=inp.k_cache.device)
    k = torch.cat([inp.k_cache, zero])  # page `num_pages` is all zeros
    bad = inp.block_table.clone()
    good = inp.block_table.clone()
    bad[0, 3] = num_pages + 7
    bad[1, 1] = -1
    good[0, 3] = num_pages
    good[1, 1] = num_pages
    out_bad, lse_bad = decode(Inputs(inp.q, k, bad, inp.cache_seqlens), False)
    out_good, lse_good = decode(Inputs(inp.q, k, good, inp.cache_seqlens), False)
    torch.cuda.synchronize()
    assert_bitwise(out_bad, lse_bad, out_good, lse_good, f"page {page}: entries outside the cache")


@gpu
@pytest.mark.parametrize("page", (1, 4))
def test_small_page_cuda_graph_capture_and_replay(page):
    """One decoding step captured whole at page 1 / 4 (get_mla_metadata() and two layers sharing the schedule);
    replays after changing cache_seqlens in place give the eager results for the new lengths."""
    torch = _torch()
    om = _openmla()
    lens1 = [300, 2048, 1, 0, 1000, 64, 65, 1500]
    lens2 = [2048, 0, 2048, 17, 1, 2000, 128, 5]
    clean = [2048] * len(lens1)  # every token either step may read holds data
    base = make_inputs(len(lens1), 2, 128, 1, seqlens=clean, seed=24)
    layer0 = repage(base, page, 24)
    layer0.cache_seqlens.copy_(torch.tensor(lens1, dtype=torch.int32))
    g = torch.Generator(device="cuda").manual_seed(25)
    q1 = (torch.randn(layer0.q.shape, generator=g, device="cuda") / 10).clamp_(-1, 1).to(layer0.q.dtype)
    layer1 = Inputs(q1, layer0.k_cache, layer0.block_table, layer0.cache_seqlens)

    decode(layer0, True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta, _ = om.get_mla_metadata()
        out0, lse0 = decode(layer0, True, meta=meta)
        out1, lse1 = decode(layer1, True, meta=meta)

    for step, lens in enumerate((lens1, lens2)):
        layer0.cache_seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        out0.fill_(float("nan"))
        out1.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(layer0, out0, lse0, True, f"graph page {page} layer 0 step {step}")
        check_against_reference(layer1, out1, lse1, True, f"graph page {page} layer 1 step {step}")
        eager = decode(layer1, True)
        torch.cuda.synchronize()
        assert torch.equal(eager[0], out1) and torch.equal(eager[1], lse1)


@gpu
@pytest.mark.parametrize("page", (3, 6, 12, 48, 512))
def test_unsupported_small_page_size_is_refused(page):
    torch = _torch()
    inp64 = make_inputs(2, 1, 16, 1, seqlens=[100, 200], seed=1)
    k = torch.zeros((4, page, 1, D_QK), dtype=inp64.q.dtype, device=inp64.q.device)
    bad = Inputs(q=inp64.q, k_cache=k, block_table=inp64.block_table, cache_seqlens=inp64.cache_seqlens)
    with pytest.raises(ValueError, match=r"page_block_size.*1, 2, 4, 8, 16"):
        decode(bad, False)


@gpu
@pytest.mark.parametrize("page", (1, 8))
def test_small_page_batch_invariant_matches_page64(page):
    """The gather kernel's batch-invariant twin: bit for bit the page-64 invariant call on the same logical cache
    (requests of several 4096-token chunks, one of them split over partitions), and a request's bits the same alone
    and inside the batch (test_batch_invariant.py checks the invariance itself on many batches)."""
    om = _openmla()
    torch = _torch()
    lens = [9000 + 13, 1, 4096, 4097, 300 + 5]
    inp64 = make_inputs(len(lens), 2, 64, 1, seqlens=lens, seed=30 + page)
    inp = repage(inp64, page, 30 + page)

    def invariant(x, rows=None):
        if rows is not None:
            x = Inputs(x.q[rows].contiguous(), x.k_cache, x.block_table[rows].contiguous(),
                       x.cache_seqlens[rows].contiguous())
        meta, _ = om.get_mla_metadata(batch_invariant=True)
        return decode(x, True, meta=meta)

    out64, lse64 = invariant(inp64)
    out, lse = invariant(inp)
    torch.cuda.synchronize()
    assert_bitwise(out, lse, out64, lse64, f"page {page} batch-invariant")
    check_against_reference(inp, out, lse, True, f"page {page} batch-invariant")
    for i in (0, 3):
        alone, alone_lse = invariant(inp, [i])
        torch.cuda.synchronize()
        assert_bitwise(alone, alone_lse, out[i:i + 1], lse[i:i + 1], f"page {page}: request {i} alone")


@gpu
def test_small_page_checked_mode():
    """Checked mode counts pages of the cache's size: a valid page-1 call reports nothing, an entry outside the cache
    inside a request's tokens is reported."""
    import openmla

    torch = _torch()
    inp = repage(make_inputs(2, 1, 16, 1, seqlens=[100, 37], seed=3), 1, 3)
    openmla.set_checked_mode(True)
    try:
        openmla.check_status()  # clears an earlier record
        decode(inp, False)
        torch.cuda.synchronize()
        openmla.check_status()  # nothing recorded: must not raise
        bt = inp.block_table.clone()
        bt[0, 99] = inp.k_cache.shape[0] + 5  # token 99 of request 0: read
        decode(Inputs(q=inp.q, k_cache=inp.k_cache, block_table=bt, cache_seqlens=inp.cache_seqlens), False)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=r"block_table"):
            openmla.check_status()
    finally:
        openmla.set_checked_mode(False)


@gpu
def test_small_page_output_fully_written():
    """NaN-poisoned out / lse buffers are completely overwritten at page 1 (every row, every column)."""
    torch = _torch()
    inp = repage(make_inputs(3, 2, 32, 1, seqlens=[77, 1, 600], seed=9), 1, 9)
    out = torch.full((3, 2, 32, D_V), float("nan"), dtype=inp.q.dtype, device="cuda")
    lse = torch.full((3, 2, 32), float("nan"), dtype=torch.float32, device="cuda").transpose(1, 2)
    decode(inp, True, out=out, lse=lse)
    torch.cuda.synchronize()
    assert not bool(out.isnan().any()) and not bool(lse.isnan().any())
    check_against_reference(inp, out, lse, True, "page 1 poisoned outputs")
