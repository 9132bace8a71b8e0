#!/usr/bin/env python3
"""The two dense MHA prefill kernels on the benchmark's rows: O from the registers against O staged through shared
memory with TMA stores (docs/mha-prefill.md, decision mha-v0.14), forced through the C binding's `epilogue`.

    PYTHONPATH=python:.deps/py python3 tools/diag/mha_epilogue_ab.py [--rounds 2] [--filter REGEX]

The launch plan picks the staged kernel when total_q <= 2048 * batch (heuristics/mha_prefill_launch.h); this tool
says whether that threshold still holds after a kernel change. Same inputs as the `mha_prefill_fwd` suite, CUDA events
with the L2 flushed before each call (benchmarks/harness.py, time_cuda), the two kernels interleaved per round.
Prints per row the median time of each kernel per round and the ratio registers / staged (> 1: staged is faster),
and which one the plan picks.
"""
import argparse
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # the suites import as top-level modules (benchmarks/run.py)
sys.path.insert(1, os.path.join(ROOT, "python"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--filter", default="", help="regex on the case name")
    args = p.parse_args(argv)

    import torch

    import bench_mha_prefill_fwd as bench
    import harness
    import openmla

    print(f"{'case':32s} {'plan':>9s}  " + "  ".join(f"{'registers':>10s} {'staged':>10s} {'ratio':>6s}"
                                                      for _ in range(args.rounds)))
    for case in bench._all_cases():
        if args.filter and not re.search(args.filter, case["name"]):
            continue
        b, s, h_q, h_kv, d_qk, d_v, causal = (case[k] for k in ("b", "s_q", "h_q", "h_kv", "d_qk", "d_v", "causal"))
        lengths = bench.varlen_lengths(b, 512, s) if case["varlen"] else [s] * b
        q, k, v, cu = bench.make_inputs(lengths, h_q, h_kv, d_qk, d_v)
        total = q.shape[0]
        out = torch.empty((total, h_q, d_v), dtype=q.dtype, device=q.device)
        lse = torch.empty((h_q, total), dtype=torch.float32, device=q.device).t()
        problem = dict(batch=len(lengths), h_q=h_q, h_kv=h_kv, d_qk=d_qk, d_v=d_v, dtype="bfloat16", causal=causal,
                       max_seqlen_qo=max(lengths))
        workspace = torch.empty(openmla._openmla.get_mha_prefill_workspace_size(**problem), dtype=torch.uint8,
                                device=q.device)

        def call(epilogue):
            return lambda: openmla._openmla.mha_prefill(q, k, v, cu, cu, workspace, out, lse, softmax_scale=0.0,
                                                        epilogue=epilogue,
                                                        stream=torch.cuda.current_stream().cuda_stream, **problem)

        plan = "staged" if total <= 2048 * len(lengths) else "registers"
        cells = []
        for _ in range(args.rounds):
            t_reg = harness.time_cuda(call("registers")).median_us
            t_stg = harness.time_cuda(call("staged")).median_us
            cells.append(f"{t_reg:10.1f} {t_stg:10.1f} {t_reg / t_stg:6.3f}")
        print(f"{case['name']:32s} {plan:>9s}  " + "  ".join(cells), flush=True)
        del q, k, v, cu, out, lse, workspace
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
