"""GPU tests of dense decode over caches of every supported page size (docs/dense-decode.md, "Page sizes").

Each case draws one logical cache in page-64 form (test_dense_decode.make_inputs: NaN in every unused page and in
the tail of each last page, garbage block-table entries past a request's pages), then re-pages the same tokens
into pages of P tokens under a fresh random page permutation, with spare pages no request owns and the tail of
each last page NaN, and lengths that are not multiples of P. The page-P call must equal the page-64 call BIT FOR
BIT: both kernels walk the same 64-token blocks in the same order with the same schedule (its blocks and the
lengths' clamp are the same: the block tables have the same capacity in tokens), every valid row lands in the same
place of shared memory, and rows past a length are masked (logits overwritten with -inf, V rows zeroed) whatever
they hold. Each result is also checked against the fp32 reference.
"""
from __future__ import annotations

import pytest

from test_dense_decode import D_QK, INVALID_PAGE, PAGE, Inputs, _torch, check_against_reference, decode, \
    make_inputs

gpu = pytest.mark.gpu

PAGE_SIZES = (16, 32, 128, 256)


def repage(inp: Inputs, page: int, seed: int, spare_pages: int = 3) -> Inputs:
    """The same logical cache in pages of `page` tokens, under a random page permutation."""
    torch = _torch()
    b = inp.q.shape[0]
    _, _, h_kv, _ = inp.k_cache.shape
    max_blocks = inp.block_table.shape[1]
    capacity = max_blocks * PAGE  # a multiple of 256 tokens (make_inputs pads to 256)
    assert capacity % page == 0
    max_pages = capacity // page
    gen = torch.Generator().manual_seed(seed + 1000 * page)
    lens = [int(x) for x in inp.cache_seqlens.tolist()]
    used = [(n + page - 1) // page for n in lens]
    num_pages = sum(used) + spare_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    k = torch.full((num_pages, page, h_kv, D_QK), float("nan"), dtype=inp.k_cache.dtype, device=inp.k_cache.device)
    table = torch.full((b, max_pages), INVALID_PAGE, dtype=torch.int32)
    cursor = 0
    for i, n in enumerate(lens):
        if n == 0:
            continue
        blocks = inp.block_table[i, :(n + PAGE - 1) // PAGE].long()
        tokens = inp.k_cache[blocks].reshape(-1, h_kv, D_QK)[:n]  # the request's L tokens, in order
        for j in range(used[i]):
            phys = perm[cursor]
            cursor += 1
            table[i, j] = phys
            rows = tokens[j * page:(j + 1) * page]
            k[phys, :rows.shape[0]] = rows  # the rest of the last page stays NaN
    return Inputs(q=inp.q, k_cache=k, block_table=table.to(inp.q.device), cache_seqlens=inp.cache_seqlens)


def lengths(b, s_k, page, seed):
    """Lengths that are not multiples of the page size (nor of 64), one of them shorter than a page."""
    import random

    rng = random.Random(seed)
    lens = [max(int(rng.gauss(s_k, s_k / 2)), 2) for _ in range(b)]
    lens = [n + 1 if n % page == 0 or n % PAGE == 0 else n for n in lens]
    lens[0] = min(page, PAGE) - 3  # inside the first page and the first block
    return lens


CASES = [
    # (b, s_q, h_q, h_kv, s_k, causal, dtype)
    (4, 1, 128, 1, 700, False, "bf16"),
    (4, 2, 128, 1, 700, True, "bf16"),
    (3, 2, 16, 2, 1500, True, "bf16"),
    (5, 1, 64, 1, 300, False, "fp16"),
]


@gpu
@pytest.mark.parametrize("page", PAGE_SIZES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-sq{}-hq{}-hkv{}-sk{}{}-{}".format(
    c[0], c[1], c[2], c[3], c[4], "-causal" if c[5] else "", c[6]))
def test_page_size_matches_page64_bitwise(case, page):
    torch = _torch()
    b, s_q, h_q, h_kv, s_k, causal, dtype = case
    seed = 7 * b + s_q + page
    lens = lengths(b, s_k, page, seed)
    inp64 = make_inputs(b, s_q, h_q, h_kv, seqlens=lens, dtype=dtype, seed=seed)
    inp = repage(inp64, page, seed)
    out64, lse64 = decode(inp64, causal)
    out, lse = decode(inp, causal)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), out64.view(torch.int16)), \
        f"page {page}: out differs from page 64 (max abs diff {float((out.float() - out64.float()).abs().max())})"
    assert torch.equal(lse.view(torch.int32), lse64.view(torch.int32)), f"page {page}: lse differs from page 64"
    check_against_reference(inp, out, lse, causal, f"page {page}")


@gpu
@pytest.mark.parametrize("page", PAGE_SIZES)
def test_page_size_split_requests_and_many_partitions(page):
    """Long requests split over several partitions (the in-kernel merge and the combine) at every page size."""
    torch = _torch()
    lens = [8000 + 37, 5 * 64 + 11, 3000 + 1]
    inp64 = make_inputs(3, 2, 128, 1, seqlens=lens, seed=page)
    inp = repage(inp64, page, page)
    out64, lse64 = decode(inp64, True)
    out, lse = decode(inp, True)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), out64.view(torch.int16)), f"page {page}: out differs from page 64"
    assert torch.equal(lse.view(torch.int32), lse64.view(torch.int32)), f"page {page}: lse differs from page 64"
    check_against_reference(inp, out, lse, True, f"page {page} split")


@gpu
@pytest.mark.parametrize("page", (3, 48, 512))  # (1-8: test_dense_decode_small_pages.py)
def test_unsupported_page_size_is_refused(page):
    torch = _torch()
    inp64 = make_inputs(2, 1, 16, 1, seqlens=[100, 200], seed=1)
    k = torch.zeros((4, page, 1, D_QK), dtype=inp64.q.dtype, device=inp64.q.device)
    bad = Inputs(q=inp64.q, k_cache=k, block_table=inp64.block_table, cache_seqlens=inp64.cache_seqlens)
    with pytest.raises(ValueError, match=r"page_block_size"):
        decode(bad, False)


@gpu
def test_page_size_checked_mode_accepts_new_page_sizes():
    """Checked mode's block-table rule counts pages of the cache's size: a valid page-16 call reports nothing,
    and an out-of-range entry inside a request's pages is reported."""
    import openmla

    torch = _torch()
    lens = [100, 37]
    inp = repage(make_inputs(2, 1, 16, 1, seqlens=lens, seed=3), 16, 3)
    openmla.set_checked_mode(True)
    try:
        openmla.check_status()  # clears an earlier record
        decode(inp, False)
        torch.cuda.synchronize()
        openmla.check_status()  # nothing recorded: must not raise
        bt = inp.block_table.clone()
        bt[0, 6] = inp.k_cache.shape[0] + 5  # tokens [96, 100) of request 0: read
        decode(Inputs(q=inp.q, k_cache=inp.k_cache, block_table=bt, cache_seqlens=inp.cache_seqlens), False)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=r"block_table"):
            openmla.check_status()
    finally:
        openmla.set_checked_mode(False)

