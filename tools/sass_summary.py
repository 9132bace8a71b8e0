#!/usr/bin/env python3
"""Counts the SASS instructions that matter for a wgmma kernel, per function, from `cuobjdump -sass` output.

    cuobjdump -sass build-gpu/CMakeFiles/openmla.dir/src/kernels/dense_decode/instantiations/bf16.cu.o | \
        python3 tools/sass_summary.py

HGMMA = tensor-core wgmma; WARPGROUP.DEPBAR = a wait for wgmma groups (wgmma.wait_group, or one ptxas
inserted); WARPGROUP.ARRIVE = wgmma.fence (written or injected); UTMALDG = TMA loads; SYNCS.* = mbarrier
traffic; BAR.* = named barriers; LDL/STL = local memory (spills).
"""
import re
import sys

KEYS = ["HGMMA", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "UTMALDG", "SYNCS.ARRIVE", "SYNCS.PHASECHK", "BAR.SYNC",
        "BAR.ARV", "LDL", "STL", "MUFU.EX2"]


def main():
    counts, order, cur = {}, [], None
    for line in sys.stdin:
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            counts[cur] = {k: 0 for k in KEYS}
            order.append(cur)
            continue
        if cur is None:
            continue
        for k in KEYS:
            if re.search(r"\b" + re.escape(k) + r"\b", line):
                counts[cur][k] += 1
    for f in order:
        print(f[:110])
        print("   " + "  ".join(f"{k}={v}" for k, v in counts[f].items() if v))


if __name__ == "__main__":
    main()
