#!/usr/bin/env python3
"""Question: which SASS lines of a profiled kernel stall most, and which instructions did it execute?

Reads the CSV of ncu's source page (`ncu -i REP --page source --csv --print-source sass > F.csv`) and prints the
columns found, the total stall samples, optionally the executed warp instructions by opcode (--opcodes), and the
--top most stalled SASS lines with their stall reasons. Used by tools/diag/diag_run.sh and tools/diag/peer_ncu.sh.

    python3 tools/diag/ncu_sass_table.py F.csv [--label ours] [--top 30] [--opcodes]
"""
import argparse
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", "")) if x not in ("", None) else 0.0
    except ValueError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--label", default="")
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--opcodes", action="store_true", help="also the executed warp instructions by opcode")
    a = ap.parse_args(argv)
    prefix = f"--- {a.label}: " if a.label else ""
    try:
        rows = [r for r in csv.reader(open(a.csv)) if r]
    except OSError as e:
        print(f"{prefix}no source page ({e})")
        return 0
    # The page may start with lines that are not the table (kernel name, notes): the header is the first row that
    # names both the address and the source columns.
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if start is None:
        print(f"{prefix}no table header found; first rows:")
        for r in rows[:8]:
            print("  ", r[:12])
        return 0
    hdr = rows[start]

    def col(*names):
        for name in names:
            if name in hdr:
                return hdr.index(name)
        return None

    samp = col("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All Cycles)")
    src, addr, ex = col("Source"), col("Address"), col("Instructions Executed")
    print(f"{prefix}columns:", hdr)
    if samp is None:
        return 0
    data = [(num(r[samp]), r) for r in rows[start + 1:] if len(r) == len(hdr) and num(r[samp]) is not None]
    if not data:
        print("no parsable rows; rows after the header:")
        for r in rows[start + 1:start + 6]:
            print("  ", r[:12])
        return 0
    total = sum(d[0] for d in data) or 1
    executed = sum(num(r[ex]) or 0 for _, r in data) if ex is not None else 0
    print(f"total samples {total:.0f} over {len(data)} SASS lines, {executed:.0f} warp instructions executed")
    if a.opcodes and ex is not None and src is not None:
        ops = {}
        for _, r in data:
            words = r[src].split()
            if words and words[0].startswith("@"):
                words = words[1:]
            op = words[0].split(".")[0] if words else "?"
            ops[op] = ops.get(op, 0) + (num(r[ex]) or 0)
        print("    executed by opcode:", ", ".join(f"{k} {v:.0f}" for k, v in sorted(ops.items(), key=lambda x: -x[1])[:24]))
    stall_cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") or ("Stall" in h and "Sampling" not in h)]
    for s_, r in sorted(data, key=lambda x: -x[0])[:a.top]:
        extra = " ".join(f"{hdr[i]}={r[i]}" for i in stall_cols if r[i] not in ("", "0"))[:300]
        print(f"{100 * s_ / total:5.1f}%  {r[addr] if addr is not None else ''}  {r[src][:90] if src is not None else ''}  {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
