#!/usr/bin/env python3
"""The critical chain of one consumer step of dense MHA prefill, from a trace dump (no GPU needed).

    python3 tools/diag/mha_step_chain.py benchmarks/results/traces-2026-11-25-s12/trace_mha_b2s4096dqk128.json.gz

A consumer warpgroup's step (kernel.cuh, main loop) is: wait for its K/V block, take the GEMM turn, issue
Q K^T (+ the previous block's P V), wait for S, softmax, wait for P V, rescale O, convert P; then the next step.
The input is a `--dump` file of tools/diag/trace_mha_prefill.py (plain or gzipped JSON). For the steady-state steps
(blocks 2 .. n-3 of tiles with at least 6 blocks, every traced CTA, both warpgroups) it prints the median, 10th and
90th percentile (SM cycles) of:

  turnwait      block data ready -> turn acquired
  issue         turn acquired -> GEMMs issued (the issue blocks while the tensor cores work through the queue)
  issue2qk      issued -> S = Q K^T done
  softmax       S done -> mask and online-softmax step done
  post          softmax done -> the next step's data ready (wait for P V, release V, rescale O, convert P, loop)
  qk_from_turn  turn acquired -> S done
  idle          WG1's S done -> WG0's next turn: the tensor cores run WG1's P V, then wait for WG0

A warpgroup's period is about turnwait + qk_from_turn + softmax + post: when that exceeds the tensor cores' work
for both warpgroups, the softmax chain (not the GEMMs) sets the pace (docs/history/mha-prefill-sessions.md, "Where the time goes").
Since decision mha-v0.18 the kernel has no turns: the "turn" stamp marks the start of the issue, so turnwait is the
stamps' own cost (~50 cycles) and "turn" below reads "issue start".
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_mha_prefill as tool  # noqa: E402  (the parser of the trace layout)

STEP_KEYS = ("turnwait", "issue", "issue2qk", "softmax", "post", "qk_from_turn")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    if not isinstance(data, list) or not data or "trace" not in data[0]:
        raise ValueError(f"argument 'path': {path} is not a --dump file of trace_mha_prefill.py")
    return data


def chain(parsed, min_blocks=6):
    """{key: [cycles per step]} over the steady-state steps of every traced CTA and both warpgroups."""
    acc = {k: [] for k in STEP_KEYS + ("idle",)}
    for cta in parsed["ctas"]:
        for tile in cta["tiles"][1:]:  # the CTA's first tile includes the kernel's start-up
            n = min(tile["blocks"], len(tile["roles"][0]["blocks"]))
            if tile["blocks"] < min_blocks:
                continue
            for wg in (tool.WG0, tool.WG1):
                steps = tile["roles"][wg]["blocks"]
                for j in range(2, n - 2):
                    ready, turn, issued, qk, sm, _ = steps[j]
                    nxt = steps[j + 1][tool.B_DATA_READY]
                    if None in (ready, turn, issued, qk, sm, nxt):
                        continue
                    for k, v in zip(STEP_KEYS, (turn - ready, issued - turn, qk - issued, sm - qk, nxt - sm, qk - turn)):
                        acc[k].append(v)
            w0, w1 = tile["roles"][tool.WG0]["blocks"], tile["roles"][tool.WG1]["blocks"]
            for j in range(2, n - 2):
                if w1[j][tool.B_QK_DONE] and w0[j + 1][tool.B_TURN]:
                    acc["idle"].append(w0[j + 1][tool.B_TURN] - w1[j][tool.B_QK_DONE])
    return acc


def report(cfg, acc, file=sys.stdout):
    print(f"== {tool.label(cfg)}", file=file)
    for k, v in acc.items():
        if not v:
            print(f"  {k:13s} -", file=file)
            continue
        s = sorted(v)
        print(f"  {k:13s} median {statistics.median(s):7.0f}   p10 {s[len(s) // 10]:6d}   p90 {s[9 * len(s) // 10]:6d}"
              f"   steps {len(s)}", file=file)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dumps", nargs="+", help="--dump files of trace_mha_prefill.py (.json or .json.gz)")
    args = p.parse_args(argv)
    for path in args.dumps:
        for entry in load(path):
            report(entry["config"], chain(tool.parse(entry["trace"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
