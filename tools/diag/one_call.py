#!/usr/bin/env python3
"""One warm call of a prefill kernel, for a profiler to attach to (ncu, nsys): the benchmark's inputs for one row.

    ncu -k regex:mha_prefill --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python3 tools/diag/one_call.py mha --b 2 --s 4096 --d-qk 192
    ncu -k regex:e4m3 --launch-skip 2 --launch-count 1 --set full \\
        python3 tools/diag/one_call.py mha --b 2 --s 4096 --d-qk 192 --no-causal --fp8
    ncu -k regex:sparse_prefill --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python3 tools/diag/one_call.py sparse --s-kv 8192 --h-q 128 --topk 2048 --d-qk 576

Runs the call three times (two warm-ups, then the one to profile) and synchronises.
"""
import argparse
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # the suites import as top-level modules (benchmarks/run.py)
sys.path.insert(1, os.path.join(ROOT, "python"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=["mha", "sparse"])
    p.add_argument("--b", type=int, default=2, help="mha: sequences")
    p.add_argument("--s", type=int, default=4096, help="mha: tokens per sequence (s_q = s_k)")
    p.add_argument("--h-q", type=int, default=128)
    p.add_argument("--d-qk", type=int, default=None, help="mha: 192 (default) / 128; sparse: 576 (default) / 512")
    p.add_argument("--no-causal", action="store_true", help="mha: full attention")
    p.add_argument("--fp8", action="store_true", help="mha: float8_e4m3fn q, k, v (the FP8 kernel), descales 1/32")
    p.add_argument("--s-q", type=int, default=4096, help="sparse: query tokens")
    p.add_argument("--s-kv", type=int, default=8192, help="sparse: kv rows")
    p.add_argument("--topk", type=int, default=2048, help="sparse: top-k")
    args = p.parse_args(argv)
    if args.d_qk is None:
        args.d_qk = 192 if args.family == "mha" else 576

    import torch

    import openmla

    if args.family == "mha":
        import bench_mha_prefill_fwd as bench

        lengths = [args.s] * args.b
        q, k, v, cu = bench.make_inputs(lengths, args.h_q, args.h_q, args.d_qk, 128)

        def call():
            openmla.flash_attn_varlen_func(q, k, v, cu, cu, args.s, args.s, causal=not args.no_causal)

        if args.fp8:  # the FP8 suite's inputs: the bf16 values x 32 in e4m3, descales 1/32
            q, k, v = ((t.float() * 32).to(torch.float8_e4m3fn) for t in (q, k, v))
            ds = torch.full((args.b, args.h_q), 1 / 32, dtype=torch.float32, device=q.device)

            def call():
                openmla.flash_attn_varlen_func(q, k, v, cu, cu, args.s, args.s, causal=not args.no_causal,
                                               q_descale=ds, k_descale=ds, v_descale=ds)
    else:
        import bench_sparse_prefill as bench

        q, kv, indices, sink = bench.make_inputs(args.s_q, args.s_kv, args.topk, args.h_q, args.d_qk)

        def call():
            openmla.flash_mla_sparse_fwd(q, kv, indices, args.d_qk ** -0.5, attn_sink=sink)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print(f"{args.family}: 3 calls done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
