#!/usr/bin/env python3
"""Question: what do Nsight Compute (or compute-sanitizer) see in one dense-decode case? Runs it for them.

Runs one dense-decode case a few times, for Nsight Compute / compute-sanitizer on the GPU machine.

    ncu --clock-control none -k regex:dense_decode_kernel -c 1 --section WarpStateStats \
        python3 tools/diag/profile_dense_decode.py --b 128 --s-q 2 --s-k 8192
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402

import openmla  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--s-q", type=int, default=2)
    ap.add_argument("--s-k", type=int, default=8192)
    ap.add_argument("--h-q", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--peer", action="store_true", help="call FlashMLA (flash_mla) instead of openmla, same inputs")
    ap.add_argument("--page-size", type=int, default=64, help="cache page size (1-256; 1-8 run the gather kernel)")
    ap.add_argument("--fp8", action="store_true", help="an e4m3 cache with per-tensor scales (the FP8 dense kernel)")
    a = ap.parse_args()
    torch.manual_seed(0)
    page = a.page_size
    seqlens = torch.full((a.b,), a.s_k, dtype=torch.int32, device="cuda")
    blocks_per_seq = (a.s_k + page - 1) // page
    num_blocks = a.b * blocks_per_seq
    cache = (torch.randn(num_blocks, page, 1, 576, device="cuda") / 10).to(torch.bfloat16)
    extra = {}
    if a.fp8:
        cache = cache.to(torch.float8_e4m3fn)
        one = torch.ones(1, dtype=torch.float32, device="cuda")
        extra = dict(is_fp8_kvcache=True, descale_q=one, descale_k=one)
    table = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(a.b, blocks_per_seq)
    q = (torch.randn(a.b, a.s_q, a.h_q, 576, device="cuda") / 10).to(torch.bfloat16)
    mod = openmla
    if a.peer:
        import flash_mla as mod
    meta, _ = mod.get_mla_metadata()
    for _ in range(a.iters):
        mod.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, causal=a.causal, **extra)
    torch.cuda.synchronize()
    print("profile_dense_decode: done")


if __name__ == "__main__":
    main()
