"""Dense BF16 MLA decode at every supported page size (docs/dense-decode.md, "Page sizes").

Not in the default run: `python3 benchmarks/run.py --suite decode_page_size`.

Rows: the compute-bound rows of the dense suite (b = 128, h_q = 128, s_q = 1, s_k 4K and 32K, varlen) and the
memory-bound rows (h_q = 16), each at page sizes 1 and 8 (the gather kernel), 16, 32, 64, 128 and 256. Every case of one row uses the same lengths
(the dense suite's seed) and a fresh random page order; the timing is the dense suite's (harness.time_decode_call:
CUPTI span of the whole eager call, 8 GB flush before each call). `ratio_to_page64` = the page-64 time of the same row
in the same run / this case's time (> 1: faster than page 64); the page-64 case of each row runs first, and a case
whose row has no page-64 time yet (a --filter that left it out) times page 64 itself first.
"""
from __future__ import annotations

SUITE = "decode_page_size"
DEFAULT = False

D_QK, D_V = 576, 512
SEED = 0
PAGE_SIZES = (64, 1, 8, 16, 32, 128, 256)  # 64 first: the others' ratio_to_page64 reads its time
ROWS = [
    # (b, s_q, h_q, s_k): compute-bound, then memory-bound
    (128, 1, 128, 4096),
    (128, 1, 128, 32768),
    (128, 1, 16, 4096),
    (128, 1, 16, 32768),
]

_page64_us: dict[str, float] = {}


def _row_name(b, s_q, h_q, s_k):
    return f"b{b}_hq{h_q}_sq{s_q}_sk{s_k}_varlen"


def cases(quick=False):
    rows = [r for r in ROWS if not quick or r[3] == 4096]
    return [dict(name=f"{_row_name(*r)}_page{p}", row=_row_name(*r), b=r[0], s_q=r[1], h_q=r[2], h_kv=1, s_k=r[3],
                 page_size=p, causal=False) for r in rows for p in PAGE_SIZES]


def make_inputs(b, s_q, h_q, h_kv, s_k, page, seed=SEED, device="cuda"):
    """The dense suite's lengths (same seed) in pages of `page` tokens, scattered at random."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    lens = torch.normal(float(s_k), s_k / 2, (b,), generator=gen).clamp(min=s_q).to(torch.int64)
    pages = (lens + page - 1) // page
    total_pages = int(pages.sum())
    order = torch.randperm(total_pages, generator=torch.Generator().manual_seed(seed + page)).to(torch.int32)
    block_table = torch.zeros((b, int(pages.max())), dtype=torch.int32)  # unused entries: page 0, never read
    start = 0
    for i, n in enumerate(pages.tolist()):
        block_table[i, :n] = order[start:start + n]
        start += n
    g = torch.Generator(device=device).manual_seed(seed)
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g, device=device, dtype=torch.bfloat16) / 10).clamp_(-1, 1)
    k_cache = (torch.randn((total_pages, page, h_kv, D_QK), generator=g, device=device, dtype=torch.bfloat16)
               / 10).clamp_(-1, 1)
    return q, k_cache, block_table.to(device), lens.to(device=device, dtype=torch.int32), float(lens.double().mean())


def _time(case, page, harness):
    import torch

    import openmla

    b, s_q, h_q, h_kv, s_k = case["b"], case["s_q"], case["h_q"], case["h_kv"], case["s_k"]
    q, k_cache, block_table, seqlens, mean_sk = make_inputs(b, s_q, h_q, h_kv, s_k, page)
    out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
    meta, _ = openmla.get_mla_metadata()

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=case["causal"], out=out,
                                       lse=lse)

    timing = harness.time_decode_call(call)
    del q, k_cache, block_table, seqlens, out, lse, meta
    torch.cuda.empty_cache()
    return timing, mean_sk


def run(case, harness):
    page = case["page_size"]
    timing, mean_sk = _time(case, page, harness)
    time_us = timing["time_us"]
    if page == 64:
        _page64_us[case["row"]] = time_us
    elif case["row"] not in _page64_us:
        _page64_us[case["row"]] = _time(case, 64, harness)[0]["time_us"]
    b, s_q, h_q, h_kv = case["b"], case["s_q"], case["h_q"], case["h_kv"]
    f = harness.formulas
    flops = f.decode_flops(b, s_q, h_q, mean_sk, D_QK, D_V)
    nbytes = f.dense_decode_bytes(b, s_q, h_q, h_kv, mean_sk, D_QK, D_V)
    return {
        "params": {k: v for k, v in case.items() if k not in ("name", "row")},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "ratio_to_page64": _page64_us[case["row"]] / time_us,
        "page64_time_us": _page64_us[case["row"]],
        **{k: v for k, v in timing.items() if k != "time_us"},
        "mean_sk": mean_sk,
    }
