#!/usr/bin/env python3
"""Compares the loops of two builds of a kernel object at the SASS level.

    python3 tools/sass_loops.py OLD.o NEW.o [--function SUBSTR] [--min-hgmma N] [--show]
    python3 tools/sass_loops.py --offsets OBJ.o [--function SUBSTR] [--min-hgmma N]

Every backward branch of a function closes a loop (its body = the instructions from the branch target to the
branch). The tool prints, per function whose name contains SUBSTR, each innermost loop with at least N HGMMA (its length
and instruction-class counts) and whether its normalised text is identical between the two objects. The text is
normalised so that only the instruction stream counts: addresses, branch targets and register numbers are
replaced by placeholders. --offsets prints where each such loop of one object starts (byte offset in its function,
and that offset modulo 128): the dense pair loop's speed depends on it (docs/dense-decode.md, "Code placement",
decision dense-v17: the same SASS ran up to 5 % slower at other offsets; only 0x40 modulo 128 measured fast). A
changed loop schedule is what lost dense-v10 and dense-v14 (docs/dense-decode.md, "Tried and not kept"); compare
before measuring. Needs cuobjdump (CUDA toolkit, or the nvidia-cuda-cuobjdump wheel).
"""
import argparse
import re
import subprocess
import sys

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def functions(obj):
    out = subprocess.run(["cuobjdump", "-sass", obj], check=True, capture_output=True, text=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is None:
            continue
        m = INSN.search(line)
        if m:
            funcs[cur].append((int(m.group(1), 16), m.group(2)))
    return funcs


def normalise(text):
    text = re.sub(r"`\(\.L_x_\d+\)", "LABEL", text)
    text = re.sub(r"0x[0-9a-f]+", "IMM", text)
    text = re.sub(r"\bU?R\d+\b", "R", text)
    text = re.sub(r"\bU?P\d\b", "P", text)
    text = re.sub(r"\bB\d+\b", "B", text)
    return text


def loops_with_offsets(insns, min_hgmma):
    """(start offset, end offset, body) of every innermost loop with at least min_hgmma HGMMA (the body runs from
    the branch target to the backward branch)."""
    addr_index = {a: i for i, (a, _) in enumerate(insns)}
    found = []
    for i, (addr, text) in enumerate(insns):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target > addr or target not in addr_index:
            continue
        body = [t for _, t in insns[addr_index[target]:i + 1]]
        if sum(1 for t in body if "HGMMA" in t) >= min_hgmma:
            found.append((target, addr, body))
    return [f for f in found if not any(g is not f and f[0] <= g[0] and g[1] <= f[1] for g in found)]


def loops(insns, min_hgmma):
    return loops_with_offsets(insns, min_hgmma)


def summary(body):
    keys = ["HGMMA", "UTMALDG", "SYNCS", "BAR.", "LDS", "STS", "LDG", "STG", "MUFU", "LDL", "STL"]
    return " ".join(f"{k.rstrip('.')}={sum(1 for t in body if k in t)}" for k in keys)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--offsets", action="store_true", help="print the loops' start offsets of one object")
    ap.add_argument("--function", default="")
    ap.add_argument("--min-hgmma", type=int, default=1)
    ap.add_argument("--show", action="store_true", help="print a unified diff of differing loops")
    args = ap.parse_args()
    if args.offsets:
        for name, insns in functions(args.old).items():
            if args.function not in name:
                continue
            # The shortest one: the others are closed by branches back from out-of-line wait stubs at the end.
            found = sorted(loops_with_offsets(insns, args.min_hgmma), key=lambda f: len(f[2]))[:1]
            for start, end, body in found:
                print(f"{name[:90]}: loop {start:#x}..{end:#x}, {len(body)} insns, start % 128 = {start % 128:#x}")
        return 0
    fo, fn = functions(args.old), functions(args.new)
    same_all = True
    # Functions are paired by name, else in order (a changed signature changes the mangled name).
    names_o = [n for n in fo if args.function in n]
    names_n = [n for n in fn if args.function in n]
    pairs = [(n, n) for n in names_o if n in fn] or list(zip(names_o, names_n))
    for name, name_n in pairs:
        lo, ln = loops(fo[name], args.min_hgmma), loops(fn[name_n], args.min_hgmma)
        print(f"{name[:100]}: {len(fo[name])} -> {len(fn[name_n])} instructions, loops {len(lo)} -> {len(ln)}")
        for k in range(max(len(lo), len(ln))):
            a = [normalise(t) for t in lo[k][2]] if k < len(lo) else []
            b = [normalise(t) for t in ln[k][2]] if k < len(ln) else []
            same = a == b
            same_all &= same
            print(f"  loop {k}: {len(a)} -> {len(b)} insns  {'IDENTICAL' if same else 'DIFFERENT'}")
            if k < len(lo):
                print(f"    old {summary(lo[k][2])}")
            if k < len(ln):
                print(f"    new {summary(ln[k][2])}")
            if not same and args.show:
                import difflib
                for d in difflib.unified_diff(a, b, lineterm="", n=1):
                    print("    " + d)
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
