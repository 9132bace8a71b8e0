"""Question: what does a request switch cost the dense-decode main kernel, step by step?

Request timeline of the dense-decode main kernel: where a CTA's time goes between its block loops.

Needs the trace build (the kernel stamps %globaltimer only when compiled with it):

    DIAG_TRACE=ON DIAG=none bash tools/diag/diag_run.sh      # or: cmake -DOPENMLA_SPARSE_TRACE=ON ... _openmla
    PYTHONPATH=python python3 tools/diag/trace_dense_decode.py --b 128 --s-q 2 --s-k 4096

Thread 0 of every CTA stamps each step of its first 8 requests (src/kernels/dense_decode/kernel.cuh, struct
Timeline): prologue start / done, first K tiles landed, block loop done, epilogue staged / stored / done, and the
request's block count. The traced call is the last of three, made after the benchmark's L2 flush. Printed: the
median of each step over all (CTA, request) pairs, the cost of a request switch (epilogue + next prologue +
wait for its first tiles) against the block-loop time per block, and the spread of the CTAs' end times
(partition imbalance). Inputs come from benchmarks/bench_dense_decode.make_inputs.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/diag/ -> the repository
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

CTAS, REQS, EVENTS = 1024, 8, 8  # kernel.cuh, struct Timeline
START, PRO_DONE, FIRST, LOOP_DONE, STAGED, STORED, DONE, BLOCKS = range(EVENTS)


def med(v):
    v = [x for x in v if x is not None]
    return f"{np.median(v) / 1e3:8.2f}" if v else "       -"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--s-q", type=int, default=2)
    ap.add_argument("--h-q", type=int, default=128)
    ap.add_argument("--s-k", type=int, default=4096)
    args = ap.parse_args()

    import torch

    import bench_dense_decode as bdd
    import harness
    import openmla
    from openmla import _openmla

    if not hasattr(_openmla, "_dense_decode_timeline"):
        sys.exit("this build has no trace: configure with -DOPENMLA_SPARSE_TRACE=ON")
    q, k_cache, block_table, seqlens, _ = bdd.make_inputs(args.b, args.s_q, args.h_q, 1, args.s_k, varlen=True)
    meta, _ = openmla.get_mla_metadata()
    flush = harness.flush_buffer()
    for i in range(3):
        if i == 2:
            torch.cuda.synchronize()
            _openmla._dense_decode_timeline_clear()
            flush.zero_()
        openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta, causal=False)
    torch.cuda.synchronize()
    t = np.array(_openmla._dense_decode_timeline(CTAS * REQS * EVENTS), dtype=np.int64).reshape(CTAS, REQS, EVENTS)

    ran = [c for c in range(CTAS) if t[c, 0, START] != 0]
    if not ran:
        sys.exit("timeline empty")
    t0 = min(t[c, 0, START] for c in ran)
    steps = {k: [] for k in ("prologue", "first tiles", "epilogue: stage", "epilogue: store", "epilogue: sync")}
    per_block, switch, loop_total, switch_total, ends = [], [], 0, 0, []
    for c in ran:
        reqs = [k for k in range(REQS) if t[c, k, START] != 0 and t[c, k, DONE] != 0]
        ends.append(max(t[c, k, DONE] for k in reqs) - t0)
        for k in reqs:
            steps["prologue"].append(t[c, k, PRO_DONE] - t[c, k, START])
            blocks = t[c, k, BLOCKS]
            if blocks > 0 and t[c, k, FIRST] != 0:
                steps["first tiles"].append(t[c, k, FIRST] - t[c, k, PRO_DONE])
                loop = t[c, k, LOOP_DONE] - t[c, k, FIRST]
                loop_total += loop
                if blocks > 2:
                    per_block.append(loop / (blocks - 0.5))  # FIRST comes after the first block's Q K^T
            steps["epilogue: stage"].append(t[c, k, STAGED] - t[c, k, LOOP_DONE])
            steps["epilogue: store"].append(t[c, k, STORED] - t[c, k, STAGED])
            steps["epilogue: sync"].append(t[c, k, DONE] - t[c, k, STORED])
            if k + 1 in reqs and t[c, k + 1, FIRST] != 0:
                sw = t[c, k + 1, FIRST] - t[c, k, LOOP_DONE]
                switch.append(sw)
                switch_total += sw
    print(f"dense timeline: b={args.b} s_q={args.s_q} h_q={args.h_q} s_k={args.s_k} varlen; {len(ran)} CTAs traced "
          f"(first {REQS} requests each); us, medians over (CTA, request)")
    for name, v in steps.items():
        print(f"  {name:18s} {med(v)}")
    print(f"  {'loop per block':18s} {med(per_block)}")
    print(f"  {'request switch':18s} {med(switch)}   (loop done -> next request's first tiles landed; "
          f"{len(switch)} switches)")
    if loop_total:
        print(f"  switches / (switches + loops) over the traced requests: {100 * switch_total / (switch_total + loop_total):.1f} %")
    ends = np.array(ends) / 1e3
    print(f"  CTA end times: min {ends.min():.1f}  median {np.median(ends):.1f}  p90 {np.percentile(ends, 90):.1f}  "
          f"max {ends.max():.1f} us after the first start")


if __name__ == "__main__":
    main()
