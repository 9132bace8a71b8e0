#!/usr/bin/env python3
"""Question: where does a sparse-prefill block pair spend its cycles, per warpgroup and producer step?

Reads the clock64 trace of a trace build
(CMake -DOPENMLA_TRACE=ON; kernel.cuh, struct Trace) after one call and prints, per role, the median cycles
between consecutive events over the traced pairs of CTA 0, and the pair period.

    PYTHONPATH=python python3 tools/diag/trace_sparse_prefill.py [--d-qk 576] [--h-q 128] [--s-kv 8192] [--topk 2048]
"""
from __future__ import annotations

import argparse
import statistics
import sys

ROLES = ("WG0", "WG1", "producer")
EVENTS = {
    "WG0": ("start", "S0 done", "m0 published", "P0V0_L done", "a1 received", "P0 stored", "P1V1_L done", "epilogue"),
    "WG1": ("start", "S1 done", "m0 received", "P1 stored", "P1V1_R done", "P0 received", "P0V0_R done", "epilogue"),
    "producer": ("start", "K0 V_L", "K1 V_R", "K0 V_R", "K0 RoPE", "K1 RoPE", "K1 V_L", "prefetch"),
}
CTAS, NROLES, PAIRS, NEV = 2, 3, 96, 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-qk", type=int, default=576)
    ap.add_argument("--h-q", type=int, default=128)
    ap.add_argument("--s-q", type=int, default=1024)
    ap.add_argument("--s-kv", type=int, default=8192)
    ap.add_argument("--topk", type=int, default=2048)
    args = ap.parse_args()
    import torch

    import openmla
    from openmla import _openmla as C

    if not hasattr(C, "_sparse_prefill_trace"):
        print("not a trace build: configure with -DOPENMLA_TRACE=ON")
        return 1
    sys.path.insert(0, "benchmarks")
    import bench_sparse_prefill as b

    q, kv, indices, sink = b.make_inputs(args.s_q, args.s_kv, args.topk, args.h_q, args.d_qk)
    for _ in range(3):  # warm
        openmla.flash_mla_sparse_fwd(q, kv, indices, args.d_qk ** -0.5, attn_sink=sink)
    torch.cuda.synchronize()
    C._sparse_prefill_trace(args.d_qk, 0, clear=True)
    openmla.flash_mla_sparse_fwd(q, kv, indices, args.d_qk ** -0.5, attn_sink=sink)
    flat = C._sparse_prefill_trace(args.d_qk, CTAS * NROLES * PAIRS * NEV)

    def at(cta, role, pair, ev):
        return flat[((cta * NROLES + role) * PAIRS + pair) * NEV + ev]

    print(f"d_qk {args.d_qk}, h_q {args.h_q}, s_q {args.s_q}, s_kv {args.s_kv}, topk {args.topk}: CTA 0, "
          f"pairs 4..{PAIRS - 1}, median cycles from the previous event")
    pairs = range(4, PAIRS - 1)
    for r, role in enumerate(ROLES):
        cells = []
        for ev in range(1, 7 if role != "producer" else 8):
            d = [at(0, r, k, ev) - at(0, r, k, ev - 1) for k in pairs if at(0, r, k, ev) and at(0, r, k, ev - 1)]
            cells.append(f"{EVENTS[role][ev]} {statistics.median(d):.0f}" if d else f"{EVENTS[role][ev]} -")
        period = [at(0, r, k + 1, 0) - at(0, r, k, 0) for k in pairs if at(0, r, k + 1, 0) and at(0, r, k, 0)]
        print(f"  {role:9s} period {statistics.median(period):.0f} | " + " | ".join(cells))
    # One pair as a timeline relative to WG0's start.
    k = 40
    t0 = at(0, 0, k, 0)
    print(f"pair {k} timeline (cycles after WG0's start):")
    for r, role in enumerate(ROLES):
        print(f"  {role:9s} " + "  ".join(f"{EVENTS[role][ev]}={int(at(0, r, k, ev)) - int(t0)}"
                                          for ev in range(NEV) if at(0, r, k, ev)))
    ep = [at(0, 0, k, 7) - at(0, 0, k, 6) for k in range(PAIRS) if at(0, 0, k, 7) and at(0, 0, k, 6)]
    if ep:
        print(f"  tile epilogue (WG0, last pair's P1V1_L -> epilogue done): median {statistics.median(ep):.0f} cycles "
              f"over {len(ep)} tiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
