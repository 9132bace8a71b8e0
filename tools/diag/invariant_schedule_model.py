"""Work model of the batch-invariant decode schedule against the default one (docs/decode-schedule.md,
"Batch invariance"): the modelled ratio_to_default (default time / invariant time) of the decode_batch_invariant
suite's rows, for the invariant cut rules side by side.

The model: a partition's time is its blocks x BLOCK_US plus one SWITCH_US per work item it runs (a request's range in
the default schedule, a chunk in the invariant one); the call's time is that of its slowest partition. Both modes
merge their split requests in the main kernel (decisions dense-v15 and schedule-v3), which the model leaves out on
both sides. Lengths are drawn as the suite draws them, N(s_k, s_k / 2) clamped to s_q, 20 seeds (Python's generator,
not torch's: the suite's exact lengths differ, their statistics do not).

Rules modelled for the invariant schedule:
  greedy   the rule of decision schedule-v1: chunks dealt in request order, a partition closed before a chunk that
           would take it past its target ceil(remaining / (parts - p)) by more than it is short of it without it;
  optimal  the optimal contiguous cut of the same chunk sequence (decision schedule-v4): the smallest maximum load
           whose greedy packing fits the partitions;
  alt      the optimal cut of the chunk sequence with the requests in alternating order (longest, shortest, second
           longest, second shortest, ...), ties by request index.

Plain Python, no GPU: python3 tools/diag/invariant_schedule_model.py
"""
from __future__ import annotations

import math
import random

BLOCK = 64
OVERHEAD = 5        # the schedulers' per-item overhead, in blocks
CHUNK = 64          # kDecodeInvariantChunkTokens / 64
BLOCK_US = 2.05     # one 64-token block of a b = 128, h_q = 128 CTA (H100/H200 measurements, docs/decode-schedule.md)
SWITCH_US = 4.0     # one work item's prologue and epilogue
SEEDS = 20


def default_parts_time(blocks, parts):
    """The default pass (PartitionWalk, payload ceil(total / parts) + overhead): per-partition (blocks, items)."""
    total = sum(n + OVERHEAD for n in blocks)
    payload = math.ceil(total / parts) + OVERHEAD
    loads = []
    cur_blocks, cur_items, budget = 0, 0, payload
    for n in blocks:
        rem = n
        while True:
            if budget >= rem + OVERHEAD:
                budget -= rem + OVERHEAD
                cur_blocks += rem
                cur_items += 1
                break
            if budget - OVERHEAD > 0:
                take = budget - OVERHEAD
                rem -= take
                cur_blocks += take
                cur_items += 1
            loads.append((cur_blocks, cur_items))
            cur_blocks, cur_items, budget = 0, 0, payload
    loads.append((cur_blocks, cur_items))
    return max(b * BLOCK_US + i * SWITCH_US for b, i in loads)


def chunk_costs(blocks):
    out = []
    for n in blocks:
        for b0 in range(0, n, CHUNK):
            out.append(min(CHUNK, n - b0))
    return out


def parts_time(groups):
    return max(sum(g) * BLOCK_US + len(g) * SWITCH_US for g in groups)


def cut_greedy_target(chunks, parts):
    remaining = sum(c + OVERHEAD for c in chunks)
    groups, cur, used, p = [], [], 0, 0
    target = 0
    for c in chunks:
        cost = c + OVERHEAD
        if cur and p < parts - 1 and used + cost > target and used + cost - target >= target - used:
            groups.append(cur)
            remaining -= used
            p += 1
            cur, used = [], 0
        if not cur:
            target = math.ceil(remaining / (parts - p))
        cur.append(c)
        used += cost
    groups.append(cur)
    return groups


def greedy_pack(chunks, load):
    groups, cur, used = [], [], 0
    for c in chunks:
        cost = c + OVERHEAD
        if cur and used + cost > load:
            groups.append(cur)
            cur, used = [], 0
        cur.append(c)
        used += cost
    if cur:
        groups.append(cur)
    return groups


def cut_optimal(chunks, parts):
    total = sum(c + OVERHEAD for c in chunks)
    share = math.ceil(total / parts)
    for j in range(CHUNK + OVERHEAD + 1):
        load = share + j
        if load < max(c + OVERHEAD for c in chunks):
            continue
        groups = greedy_pack(chunks, load)
        if len(groups) <= parts:
            return groups
    raise AssertionError("the upper bound always fits")


def alternating(blocks):
    order = sorted(range(len(blocks)), key=lambda i: (-blocks[i], i))
    out = []
    lo, hi = len(order) - 1, 0
    while hi <= lo:
        out.append(blocks[order[hi]])
        hi += 1
        if hi <= lo:
            out.append(blocks[order[lo]])
            lo -= 1
    return out


def row(b, s_q, s_k, parts, varlen=True):
    ratios = {"greedy": [], "optimal": [], "alt": []}
    for seed in range(SEEDS):
        rng = random.Random(seed)
        if varlen:
            lens = [max(s_q, int(rng.gauss(s_k, s_k / 2))) for _ in range(b)]
        else:
            lens = [s_k] * b
        blocks = [max(1, math.ceil(n / BLOCK)) for n in lens]
        t_default = default_parts_time(blocks, parts)
        chunks = chunk_costs(blocks)
        ratios["greedy"].append(t_default / parts_time(cut_greedy_target(chunks, parts)))
        ratios["optimal"].append(t_default / parts_time(cut_optimal(chunks, parts)))
        ratios["alt"].append(t_default / parts_time(cut_optimal(chunk_costs(alternating(blocks)), parts)))
    return {k: sum(v) / len(v) for k, v in ratios.items()}


def main():
    rows = []
    for s_q, parts in ((1, 66), (2, 33)):
        for s_k in (4096, 8192, 16384, 32768):
            rows.append((f"b128 h_q128 s_q{s_q} {s_k // 1024}K varlen", row(128, s_q, s_k, parts)))
    for s_k in (4096, 32768):
        rows.append((f"b128 h_q16 s_q1 {s_k // 1024}K varlen", row(128, 1, s_k, 132)))
    for b in (1, 8, 32):
        for s_k in (8192, 32768):
            rows.append((f"b{b} h_q128 s_q1 {s_k // 1024}K fixed", row(b, 1, s_k, 66, varlen=False)))
    print(f"{'row':32s} {'greedy':>8s} {'optimal':>8s} {'alt':>8s}")
    for name, r in rows:
        print(f"{name:32s} {r['greedy']:8.3f} {r['optimal']:8.3f} {r['alt']:8.3f}")


if __name__ == "__main__":
    main()
