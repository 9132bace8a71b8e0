"""Question: where does each warpgroup of a sparse-decode CTA spend a block, and when does each CTA pass each head step?

clock64 trace of the sparse-decode main kernel: where each warpgroup of one CTA spends a block.

Needs the diagnostics build (the kernel stamps clock64 only when compiled with it):

    cmake -B build-trace -G Ninja -DOPENMLA_SPARSE_TRACE=ON -DOPENMLA_BUILD_TESTS=OFF && ninja -C build-trace _openmla
    PYTHONPATH=python python3 tools/diag/trace_sparse_decode.py --b 128 --h-q 128

Thread 0 of each warpgroup of CTAs x = 0, 1 (query position 0, schedule partition 0) stamps every step of its
first 256 blocks (src/kernels/sparse_decode/kernel.cuh, struct Trace). This prints, per role, the median /
10th / 90th percentile of each step's duration in cycles over the steady-state blocks, and the timeline of a few
blocks. Before that it prints the whole-kernel timeline of every CTA (%globaltimer, ns: entry, init, first Q, first
K block, last block, epilogue, exit) for the last of three calls, made after an L2 flush. Inputs come from benchmarks/bench_sparse_decode.make_inputs (the benchmark's own generator).
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/diag/ -> the repository
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "tools", "diag"))

CTAS, ROLES, ITERS, EVENTS = 2, 3, 256, 6  # kernel.cuh, struct Trace
TL_CTAS, TL_EVENTS = 1024, 12  # kernel.cuh, Trace::kTimelineCtas / kTimelineEvents, in TimelineEvent order
SW_COUNT, SW_EVENTS = 16, 6  # kernel.cuh, Trace::kSwitches / kSwitchEvents
SW_STEPS = ["loop exit", "epilogue barrier", "output stores", "next Q landed", "Q barrier"]
TL_NAMES = ["entry", "init done", "Q ready", "first full", "last block done", "epilogue done", "producer done",
            "exit", "P: work known", "P: index landed", "P: token landed", "P: first V_L sent"]
STEPS = {
    0: ("WG0", ["wait full", "S = QK^T", "softmax + P out", "O_L += P V_L"]),
    1: ("WG1", ["wait P + full", "O_R += P V_R"]),
    2: ("producer", ["wait free (V_L)", "stores (+V_R wait)", "copy + arrive"]),
}


def summarize(tr, cta, skip=4):
    t = tr[cta].astype(np.int64)
    used = [it for it in range(ITERS) if t[0, it, 0] != 0 and t[0, it, 4] != 0]
    if len(used) < skip + 4:
        # Too few blocks for a steady state (b = 2: 3 per CTA): every stamp of every block, in cycles from the
        # producer's first step start (the clock64 stamps of one CTA share one clock).
        print(f"CTA {cta}: only {len(used)} blocks traced; raw stamps (cycles from the producer's first step):")
        # The producer's plain-path events 4 and 5 (round 0 / round 1 stored) fall between its events 1 and 2.
        base = t[2, used[0], 0] if used else 0
        for it in used:
            for role, (name, steps) in STEPS.items():
                ev = [0, 1, 4, 5, 2, 3] if role == 2 and t[2, it, 4] else range(len(steps) + 1)
                print(f"    block {it:3d} {name:9s} " + " ".join(f"{t[role, it, e] - base:7d}" for e in ev))
        return
    steady = used[skip:-1]
    print(f"\nCTA x={cta}: {len(used)} blocks traced, steady state = blocks {steady[0]}..{steady[-1]} (cycles)")
    print(f"  {'role':9s} {'step':18s} {'median':>8s} {'p10':>8s} {'p90':>8s}")
    for role, (name, steps) in STEPS.items():
        for k, step in enumerate(steps):
            d = np.array([t[role, it, k + 1] - t[role, it, k] for it in steady])
            print(f"  {name:9s} {step:18s} {np.median(d):8.0f} {np.percentile(d, 10):8.0f} {np.percentile(d, 90):8.0f}")
        per = np.array([t[role, it + 1, 0] - t[role, it, 0] for it in steady if t[role, it + 1, 0] != 0])
        if len(per):
            print(f"  {name:9s} {'period (block)':18s} {np.median(per):8.0f} {np.percentile(per, 10):8.0f} "
                  f"{np.percentile(per, 90):8.0f}")
    # Hand-offs inside the CTA.
    rel = {
        "full seen by WG0 - local producer arrive": [t[0, it, 1] - t[2, it, 3] for it in steady],
        "P seen by WG1 - WG0 hand-over": [t[1, it, 1] - t[0, it, 3] for it in steady],
        "free seen by producer - WG0 O_L done (it-2)": [t[2, it, 1] - t[0, it - 2, 4] for it in steady if it >= 2],
        "free seen by producer - WG1 O_R done (it-2)": [t[2, it, 1] - t[1, it - 2, 2] for it in steady if it >= 2],
        "WG0 idle: next wait start - O_L done": [t[0, it + 1, 0] - t[0, it, 4] for it in steady if t[0, it + 1, 0]],
    }
    for k, v in rel.items():
        v = np.array(v)
        print(f"  {k:45s} median {np.median(v):7.0f}  p10 {np.percentile(v, 10):7.0f}  p90 {np.percentile(v, 90):7.0f}")
    # The partition as a whole: WG0's periods over every traced block, and the longest ones (request switches:
    # epilogue + next Q; slow gathers), each split into WG0's steps.
    per_all = [(t[0, it + 1, 0] - t[0, it, 0], it) for it in used[:-1] if t[0, it + 1, 0] != 0]
    if per_all:
        med = np.median([d for d, _ in per_all])
        total = sum(d for d, _ in per_all)
        excess = sum(d - med for d, _ in per_all if d > med)
        print(f"  WG0 over blocks {used[0]}..{used[-1]}: {total} cycles = {len(per_all)} x median {med:.0f} "
              f"+ {100 * (total - len(per_all) * med) / total:.1f} % ; above-median excess {excess:.0f} cycles")
        for d, it in sorted(per_all, reverse=True)[:6]:
            steps = " ".join(f"{t[0, it, e + 1] - t[0, it, e]:6d}" for e in range(4))
            print(f"    block {it:3d}: period {d:6d}  (wait full, QK, softmax, PV_L: {steps}; "
                  f"after O_L {t[0, it + 1, 0] - t[0, it, 4]:6d})")
    # A few blocks as a timeline relative to WG0's "before full wait" of the first one.
    it0 = steady[len(steady) // 2]
    base = t[0, it0, 0]
    print(f"  timeline of blocks {it0}..{it0 + 2} (cycles from WG0's wait on block {it0}):")
    for it in range(it0, it0 + 3):
        for role, (name, steps) in STEPS.items():
            n = len(steps) + 1
            print(f"    block {it:3d} {name:9s} " + " ".join(f"{t[role, it, e] - base:7d}" for e in range(n)))


def timeline(tl):
    """Whole-kernel %globaltimer timeline (ns) of every CTA that ran (L2 flushed before the call)."""
    t = tl.astype(np.int64)
    ran = t[:, 0] != 0
    if not ran.any():
        print("timeline: empty")
        return
    t0 = t[ran, 0].min()
    rel = np.where(t != 0, t - t0, -1)
    worked = ran & (t[:, TL_NAMES.index("last block done")] != 0)
    print(f"\nwhole-kernel timeline, ns from the first CTA's entry: {ran.sum()} CTAs ran, {worked.sum()} had work")
    print(f"  {'event':18s} {'min':>8s} {'median':>8s} {'max':>8s}   (over the CTAs with work)")
    for e, name in enumerate(TL_NAMES):
        v = rel[worked, e]
        v = v[v >= 0]
        if len(v):
            print(f"  {name:18s} {v.min():8d} {int(np.median(v)):8d} {v.max():8d}")
    idle = ran & ~worked
    if idle.any():
        print(f"  CTAs without work: entry median {int(np.median(rel[idle, 0]))} ns")
    last = np.argsort(-rel[:, TL_NAMES.index("exit")])[:3]
    for c in last:
        print(f"  latest exit, CTA {c}: " + " ".join(f"{rel[c, e]:7d}" for e in range(TL_EVENTS)))


def switches(sw):
    """WG0's request switches (cycles): from the last block's O_L through the epilogue to the next Q barrier. The
    partition's last request has no next Q: its row stops at the stores issued."""
    rows = [k for k in range(SW_COUNT - 1) if sw[k, 0] != 0 and sw[k, 3] != 0]
    if not rows:
        return
    print("  request switches (WG0 thread 0, cycles per step: " + ", ".join(SW_STEPS) + "; total)")
    for k in rows:
        if sw[k, 5] != 0:
            d = [sw[k, e + 1] - sw[k, e] for e in range(3)] + [sw[k, 4] - sw[k, 3], sw[k, 5] - sw[k, 4]]
            print(f"    request {k} -> {k + 1}: " + " ".join(f"{x:7d}" for x in d) + f"   total {sw[k, 5] - sw[k, 0]:7d}")
        else:
            d = [sw[k, e + 1] - sw[k, e] for e in range(3)]
            print(f"    request {k} (last): " + " ".join(f"{x:7d}" for x in d) + f"   total {sw[k, 3] - sw[k, 0]:7d}")


def main():
    from profile_sparse_decode import add_case_arguments, run_case

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(ap)
    ap.add_argument("--timeline-only", action="store_true", help="print the whole-kernel timeline only")
    ap.add_argument("--no-flush", action="store_true", help="keep the L2 warm before the traced call")
    args = ap.parse_args()

    from openmla import _openmla

    if not hasattr(_openmla, "_sparse_decode_trace"):
        sys.exit("this build has no trace: configure with -DOPENMLA_SPARSE_TRACE=ON")
    _openmla._sparse_decode_timeline_clear()
    run_case(args, calls=3, flush_last=not args.no_flush)
    steps = CTAS * ROLES * ITERS * EVENTS
    tl = TL_CTAS * TL_EVENTS
    flat = np.array(_openmla._sparse_decode_trace(steps + tl + CTAS * SW_COUNT * SW_EVENTS), dtype=np.uint64)
    tr = flat[:steps].reshape(CTAS, ROLES, ITERS, EVENTS)
    sw = flat[steps + tl:].reshape(CTAS, SW_COUNT, SW_EVENTS).astype(np.int64)
    print(f"trace: b={args.b} s_q={args.s_q} h_q={args.h_q} topk={args.topk} L2 {'warm' if args.no_flush else 'flushed'}")
    timeline(flat[steps:steps + tl].reshape(TL_CTAS, TL_EVENTS))
    if not args.timeline_only:
        for cta in range(CTAS if args.h_q > 64 else 1):
            summarize(tr, cta)
            switches(sw[cta])


if __name__ == "__main__":
    main()
