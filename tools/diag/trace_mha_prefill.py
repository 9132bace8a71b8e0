#!/usr/bin/env python3
"""Question: where does a dense MHA prefill tile lose tensor-core time (tile switch, Q load, exchange, mask, epilogue)?

Runs one call of openmla.flash_attn_varlen_func per configuration in a trace build (CMake -DOPENMLA_TRACE=ON:
src/kernels/mha_prefill/kernel.cuh stamps clock64 at each step of each role for the first 16 tiles of the first 8
CTAs; layout in config.h, struct Trace), reads the trace and prints, per traced tile of the selected CTAs (WG0/WG1
where a value is per consumer warpgroup; all times in SM cycles):

  blocks      key blocks the tile visits (n_end)
  q-wait      tile start (record read) -> Q ready (q_full passed): the Q load left exposed
  ->QK0       tile start -> the first Q K^T done
  period      median per-block period of the tile (one Q K^T done to the next)
  gap         the tensor-pipe gap at the switch into this tile: the warpgroup's last P V done (previous tile) -> its
              first Q K^T done here
  idle        time both warpgroups had no GEMM in flight at that switch: the overlap of [last P V done, first Q K^T
              issued] of WG0 and of WG1 (0: the other warpgroup's GEMMs covered it)
  exch        exchange barrier wait (WG0/WG1/producer): the last of the three arrivals minus this one's. Taken from the
              arrivals only: a stamp right after bar.sync is read before the warp blocks (BAR.SYNC.DEFER_BLOCKING
              defers the wait), so entered -> passed reads ~100 cycles whatever the others do
  epi         epilogue: last P V done -> out and lse stored
  mask        median (softmax done - Q K^T done) of the masked blocks minus that of the unmasked ones
  turn        median wait for the GEMM turn (data ready -> turn acquired) over the tile's blocks; since decision
              mha-v0.18 (no turns) the stamp marks the issue's start and this column is the stamps' own cost
  overhead    tile time (this tile start -> next tile start, WG0) minus blocks x period

then a summary table (medians over every traced tile of every traced CTA; switch values over tiles after the first)
last. With no configuration argument it runs the reference rows: b16 s1024 d192 causal h128, b2 s4096 d128 causal
h128, b2 s4096 d192 causal h128.

How to run it (GPU machine, repository root; the build copies the extension into python/openmla/, replacing the
production one there until the next build of build/ or build-gpu/):

    bash tools/setup_deps.sh --offline && \\
    cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPENMLA_TRACE=ON -DOPENMLA_BUILD_TESTS=OFF \\
      -DPython_EXECUTABLE=$(which python3) && cmake --build build-trace -j16 --target _openmla && \\
    PYTHONPATH=python:.deps/py python3 tools/diag/trace_mha_prefill.py --dump $OUT/trace_mha.json | tee $OUT/trace_mha.txt

One configuration: --b 16 --s 1024 --h-q 128 --d-qk 192 --causal (or --no-causal); --ctas 0,1 prints more CTAs'
tiles; --dump writes the raw traces (JSON) for a later look (tools/diag/trace_mha_prefill.py --load FILE re-reads it
without a GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

# The layout of config.h, struct Trace (checked against the layout header the reader prepends).
MAGIC = 0x4D48415431  # "MHAT1"
LAYOUT_FIELDS = ("magic", "ctas", "roles", "tiles", "max_blocks", "header_values", "fixed_events", "block_events")
FIXED_EVENTS, BLOCK_EVENTS = 10, 6
WG0, WG1, PRODUCER = 0, 1, 2
# Header of a CTA.
HEAD_SMID, HEAD_START_CLOCK, HEAD_START_TIMER, HEAD_END_CLOCK, HEAD_END_TIMER, HEAD_TILES = range(6)
# Fixed events of a consumer warpgroup's tile.
TILE_START, Q_READY, EXCH_ENTER, EXCH_PASSED, LAST_PV_READY, LAST_PV_TURN, LAST_PV_ISSUED, LAST_PV_DONE, \
    STORES_DONE = range(9)
# Events of a consumer warpgroup's visited block.
B_DATA_READY, B_TURN, B_ISSUED, B_QK_DONE, B_SOFTMAX_DONE, B_PV_DONE = range(6)
# Fixed events of the producer's tile, and of its visited block.
P_RECORD, P_Q_ISSUED, P_EXCH_ENTER, P_EXCH_PASSED, P_META_BLOCKS, P_META_COORD = range(6)
P_K_ISSUED, P_V_ISSUED = range(2)

DEFAULT_ROWS = (
    dict(b=16, s=1024, h_q=128, d_qk=192, causal=True),
    dict(b=2, s=4096, h_q=128, d_qk=128, causal=True),
    dict(b=2, s=4096, h_q=128, d_qk=192, causal=True),
)
BLOCK_M = BLOCK_N = 128


class TraceError(ValueError):
    """The buffer is not a trace this tool understands."""


# --------------------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------------------
def parse(flat):
    """The reader's flat buffer -> {"layout": {...}, "ctas": [{"cta", "smid", "header", "tiles": [tile, ...]}]}.

    A tile: {"index", "blocks", "head", "m_block", "roles": [WG0, WG1, producer]}, each role {"fixed": [...],
    "blocks": [[...] per visited block]} with None for a value never stamped. Only tiles the producer described are
    kept (a CTA with fewer tiles than traced has zeros after its last)."""
    flat = [int(x) for x in flat]
    if len(flat) < len(LAYOUT_FIELDS):
        raise TraceError(f"argument 'flat': {len(flat)} values, shorter than the layout header")
    layout = dict(zip(LAYOUT_FIELDS, flat[:len(LAYOUT_FIELDS)]))
    if layout["magic"] != MAGIC:
        raise TraceError(f"argument 'flat': magic {layout['magic']:#x}, expected {MAGIC:#x} (not a dense MHA prefill "
                         "trace, or another layout version)")
    if (layout["fixed_events"], layout["block_events"], layout["roles"]) != (FIXED_EVENTS, BLOCK_EVENTS, 3):
        raise TraceError(f"argument 'flat': layout {layout} does not match this tool's (fixed_events {FIXED_EVENTS}, "
                         f"block_events {BLOCK_EVENTS}, roles 3): the tool and the build disagree")
    events = layout["fixed_events"] + layout["max_blocks"] * layout["block_events"]
    per_cta = layout["header_values"] + layout["roles"] * layout["tiles"] * events
    expected = len(LAYOUT_FIELDS) + layout["ctas"] * per_cta
    if len(flat) != expected:
        raise TraceError(f"argument 'flat': {len(flat)} values, the layout {layout} needs {expected}")

    def val(x):
        return x if x else None

    ctas = []
    for c in range(layout["ctas"]):
        base = len(LAYOUT_FIELDS) + c * per_cta
        header = [val(x) for x in flat[base:base + layout["header_values"]]]
        if header[HEAD_SMID] is None:
            continue  # the grid had fewer CTAs
        tiles = []
        for t in range(layout["tiles"]):
            roles = []
            for r in range(layout["roles"]):
                off = base + layout["header_values"] + (r * layout["tiles"] + t) * events
                rec = flat[off:off + events]
                fixed = [val(x) for x in rec[:FIXED_EVENTS]]
                blocks = [[val(x) for x in rec[FIXED_EVENTS + j * BLOCK_EVENTS:FIXED_EVENTS + (j + 1) * BLOCK_EVENTS]]
                          for j in range(layout["max_blocks"])]
                roles.append({"fixed": fixed, "blocks": blocks})
            meta = roles[PRODUCER]["fixed"]
            if meta[P_META_BLOCKS] is None:
                break
            coord = meta[P_META_COORD] or 0
            tiles.append({"index": t, "blocks": meta[P_META_BLOCKS] & ((1 << 63) - 1), "head": coord >> 32,
                          "m_block": coord & 0xFFFFFFFF, "roles": roles})
        ctas.append({"cta": c, "smid": header[HEAD_SMID] & 0xFFFFFFFF, "header": header, "tiles": tiles})
    return {"layout": layout, "ctas": ctas}


# --------------------------------------------------------------------------------------------------------------------
# Tile arithmetic (src/kernels/mha_prefill/tile_math.h)
# --------------------------------------------------------------------------------------------------------------------
def row_key_limit(s_q, s_k, row, causal):
    return min(s_k - 1, row + s_k - s_q) if causal else s_k - 1


def block_needs_mask(s_q, s_k, m_block, n_block, causal):
    return n_block * BLOCK_N + BLOCK_N - 1 > row_key_limit(s_q, s_k, m_block * BLOCK_M, causal)


# --------------------------------------------------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------------------------------------------------
def _d(a, b):
    """b - a, or None when either is missing."""
    return None if a is None or b is None else b - a


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _overlap(a0, a1, b0, b1):
    if None in (a0, a1, b0, b1):
        return None
    return max(0, min(a1, b1) - max(a0, b0))


def _stamped_blocks(role, n):
    return [b for b in role["blocks"][:n]]


def analyse_tile(tile, prev, nxt, s_q, s_k, causal):
    """Metrics of one tile (dict); `prev` / `nxt`: the CTA's tile before / after it, or None."""
    nb = tile["blocks"]
    wgs = tile["roles"][:2]
    prod = tile["roles"][PRODUCER]
    row = {"tile": tile["index"], "blocks": nb, "head": tile["head"], "m_block": tile["m_block"]}
    kept = min(nb, len(wgs[0]["blocks"]))
    per = []
    for w, r in enumerate(wgs):
        f, blks = r["fixed"], _stamped_blocks(r, kept)
        m = {}
        m["q_wait"] = _d(f[TILE_START], f[Q_READY])
        m["first_qk"] = _d(f[TILE_START], blks[0][B_QK_DONE]) if kept else None
        m["periods"] = [_d(blks[j - 1][B_QK_DONE], blks[j][B_QK_DONE]) for j in range(1, kept)]
        m["exch_enter"] = f[EXCH_ENTER]
        m["epi"] = _d(f[LAST_PV_DONE], f[STORES_DONE])
        m["turn"] = _median([_d(b[B_DATA_READY], b[B_TURN]) for b in blks] +
                            [_d(f[LAST_PV_READY], f[LAST_PV_TURN])] if nb else [])
        masked, plain = [], []
        for j, b in enumerate(blks):
            (masked if block_needs_mask(s_q, s_k, tile["m_block"], nb - 1 - j, causal) else plain).append(
                _d(b[B_QK_DONE], b[B_SOFTMAX_DONE]))
        m["softmax_masked"], m["softmax_plain"] = _median(masked), _median(plain)
        if prev is not None and kept:
            pf = prev["roles"][w]["fixed"]
            m["gap"] = _d(pf[LAST_PV_DONE], blks[0][B_QK_DONE])
            m["idle_window"] = (pf[LAST_PV_DONE], blks[0][B_ISSUED])
        else:
            m["gap"], m["idle_window"] = None, None
        per.append(m)
    row["q_wait"] = [m["q_wait"] for m in per]
    row["first_qk"] = [m["first_qk"] for m in per]
    row["period"] = _median(per[0]["periods"] + per[1]["periods"])
    row["gap"] = [m["gap"] for m in per]
    row["idle"] = (_overlap(*per[0]["idle_window"], *per[1]["idle_window"])
                   if per[0]["idle_window"] and per[1]["idle_window"] else None)
    enters = [per[0]["exch_enter"], per[1]["exch_enter"], prod["fixed"][P_EXCH_ENTER]]
    last = max(enters) if None not in enters else None
    row["exch"] = [None if last is None else last - e for e in enters]
    row["epi"] = [m["epi"] for m in per]
    row["turn"] = _median([m["turn"] for m in per])
    sm, sp = _median([m["softmax_masked"] for m in per]), _median([m["softmax_plain"] for m in per])
    row["mask"] = None if sm is None or sp is None else sm - sp
    row["softmax"] = sp
    tile_time = _d(wgs[0]["fixed"][TILE_START], nxt["roles"][WG0]["fixed"][TILE_START]) if nxt else None
    row["tile_time"] = tile_time
    row["overhead"] = None if tile_time is None or row["period"] is None else tile_time - nb * row["period"]
    return row


def analyse(trace, s_q, s_k, causal):
    """Per traced CTA, the rows of its tiles: [(cta dict, [row, ...]), ...]."""
    out = []
    for cta in trace["ctas"]:
        tiles = cta["tiles"]
        rows = [analyse_tile(t, tiles[i - 1] if i else None, tiles[i + 1] if i + 1 < len(tiles) else None, s_q, s_k,
                             causal) for i, t in enumerate(tiles)]
        out.append((cta, rows))
    return out


def ns_per_cycle(trace):
    """Nanoseconds per SM cycle from the CTAs' start / end stamps of both clocks (median), or None."""
    r = []
    for cta in trace["ctas"]:
        h = cta["header"]
        dc, dt = _d(h[HEAD_START_CLOCK], h[HEAD_END_CLOCK]), _d(h[HEAD_START_TIMER], h[HEAD_END_TIMER])
        if dc and dt and dc > 0:
            r.append(dt / dc)
    return _median(r)


SUMMARY_COLUMNS = ("tiles", "blocks", "q-wait", "->QK0", "period", "gap WG0", "gap WG1", "idle", "exch WG0",
                   "exch WG1", "exch prod", "epi", "mask", "softmax", "turn", "overhead")


def summarise(analysed):
    """Medians over every traced tile (switch values over tiles with a predecessor)."""
    rows = [r for _, rs in analysed for r in rs]

    def med(key, i=None):
        return _median([(r[key][i] if i is not None else r[key]) for r in rows])

    return {
        "tiles": len(rows), "blocks": med("blocks"),
        "q-wait": _median([x for r in rows for x in r["q_wait"]]),
        "->QK0": _median([x for r in rows for x in r["first_qk"]]),
        "period": med("period"), "gap WG0": med("gap", 0), "gap WG1": med("gap", 1), "idle": med("idle"),
        "exch WG0": med("exch", 0), "exch WG1": med("exch", 1), "exch prod": med("exch", 2),
        "epi": _median([x for r in rows for x in r["epi"]]), "mask": med("mask"), "softmax": med("softmax"),
        "turn": med("turn"), "overhead": med("overhead"),
    }


# --------------------------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------------------------
def _f(x):
    return "-" if x is None else f"{x:.0f}"


def _pair(xs):
    return "/".join(_f(x) for x in xs)


TILE_HEADER = ("tile  head  m   blocks  q-wait     ->QK0       period  gap         idle   exch(WG0/WG1/prod)  "
               "epi        mask   turn   overhead")


def format_tile(r):
    return (f"{r['tile']:4d}  {r['head']:4d}  {r['m_block']:2d}  {r['blocks']:6d}  {_pair(r['q_wait']):9s}  "
            f"{_pair(r['first_qk']):10s}  {_f(r['period']):6s}  {_pair(r['gap']):10s}  {_f(r['idle']):5s}  "
            f"{_pair(r['exch']):18s}  {_pair(r['epi']):9s}  {_f(r['mask']):5s}  {_f(r['turn']):5s}  "
            f"{_f(r['overhead'])}")


def label(cfg):
    return f"b{cfg['b']} s{cfg['s']} d{cfg['d_qk']} {'causal' if cfg['causal'] else 'full'} h{cfg['h_q']}"


def report(cfg, trace, show_ctas, file=None):
    """Prints the per-tile lines of the CTAs in `show_ctas` (to `file`, default stdout); returns the summary dict."""
    file = file or sys.stdout
    analysed = analyse(trace, cfg["s"], cfg["s"], cfg["causal"])
    npc = ns_per_cycle(trace)
    clock = f"{1 / npc:.2f} GHz" if npc else "unknown"
    print(f"== {label(cfg)}: {len(trace['ctas'])} CTAs traced, SM clock {clock}; cycles; WG0/WG1 where two",
          file=file)
    for cta, rows in analysed:
        if cta["cta"] not in show_ctas:
            continue
        print(f"CTA {cta['cta']} (SM {cta['smid']}, {cta['header'][HEAD_TILES] or '?'} tiles run, "
              f"{len(rows)} traced)", file=file)
        print("  " + TILE_HEADER, file=file)
        for r in rows:
            print("  " + format_tile(r), file=file)
    summary = summarise(analysed)
    summary["ns_per_cycle"] = npc
    return summary


def format_summary(results):
    """The summary table: one row per configuration."""
    lines = ["summary (medians over the traced tiles; cycles; gap/idle: switch into a tile; mask: masked minus plain "
             "softmax; overhead: tile time - blocks x period)"]
    head = f"{'configuration':28s}" + "".join(f"{c:>10s}" for c in SUMMARY_COLUMNS) + f"{'ns/cyc':>8s}"
    lines.append(head)
    for cfg, s in results:
        cells = "".join(f"{_f(s[c]):>10s}" for c in SUMMARY_COLUMNS)
        npc = s.get("ns_per_cycle")
        lines.append(f"{label(cfg):28s}{cells}{(f'{npc:.3f}' if npc else '-'):>8s}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------------
def trace_call(cfg, fp16=False, warmup=3):
    """Runs the configuration once after `warmup` calls and returns the flat trace of that call."""
    import torch

    import openmla
    from openmla import _openmla as C

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "benchmarks"))
    import bench_mha_prefill_fwd as bench

    q, k, v, cu = bench.make_inputs([cfg["s"]] * cfg["b"], cfg["h_q"], cfg["h_q"], cfg["d_qk"], 128)
    if fp16:
        q, k, v = q.half(), k.half(), v.half()

    def call():
        openmla.flash_attn_varlen_func(q, k, v, cu, cu, cfg["s"], cfg["s"], causal=cfg["causal"])

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    C._mha_prefill_trace(cfg["d_qk"], fp16, clear=True)
    call()
    return C._mha_prefill_trace(cfg["d_qk"], fp16)


def parse_ctas(text):
    try:
        ctas = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"argument --ctas: '{text}' is not a comma-separated list of CTA numbers")
    if not ctas or min(ctas) < 0:
        raise argparse.ArgumentTypeError(f"argument --ctas: '{text}' names no CTA number >= 0")
    return ctas


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--b", type=int, help="sequences (default with another configuration argument: 2)")
    ap.add_argument("--s", type=int, help="tokens per sequence, s_q = s_k (default 4096)")
    ap.add_argument("--h-q", type=int, help="query heads, h_kv = h_q (default 128)")
    ap.add_argument("--d-qk", type=int, choices=(192, 128), help="Q/K head dimension; d_v is 128 (default 192)")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None, help="causal (default) or not")
    ap.add_argument("--fp16", action="store_true", help="fp16 operands (default bf16)")
    ap.add_argument("--ctas", type=parse_ctas, default=[0], help="CTAs whose tiles are printed (default 0)")
    ap.add_argument("--warmup", type=int, default=3, help="calls before the traced one (default 3)")
    ap.add_argument("--dump", metavar="FILE", help="write the configurations and raw traces as JSON")
    ap.add_argument("--load", metavar="FILE", help="analyse a --dump file instead of running (no GPU needed)")
    return ap


def configurations(args):
    given = {k: getattr(args, k) for k in ("b", "s", "h_q", "d_qk", "causal")}
    if all(v is None for v in given.values()):
        return [dict(c) for c in DEFAULT_ROWS]
    cfg = dict(b=2, s=4096, h_q=128, d_qk=192, causal=True)
    cfg.update({k: v for k, v in given.items() if v is not None})
    for k in ("b", "s", "h_q"):
        if cfg[k] < 1:
            raise SystemExit(f"argument --{k.replace('_', '-')}: must be >= 1, got {cfg[k]}")
    return [cfg]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.warmup < 0:
        print(f"argument --warmup: must be >= 0, got {args.warmup}", file=sys.stderr)
        return 2
    configs = None if args.load else configurations(args)
    if args.load:
        with open(args.load) as fh:
            runs = [(r["config"], r["trace"]) for r in json.load(fh)]
    else:
        try:
            from openmla import _openmla as C
        except ImportError as e:
            print(f"openmla is not importable ({e}): build the extension (see --help)", file=sys.stderr)
            return 1
        if not hasattr(C, "_mha_prefill_trace"):
            print("not a trace build: configure with -DOPENMLA_TRACE=ON and build _openmla (see --help)",
                  file=sys.stderr)
            return 1
        try:
            import torch
        except ImportError:
            print("torch is not importable: the tool needs torch with a CUDA device", file=sys.stderr)
            return 1
        if not torch.cuda.is_available():
            print("no CUDA device: the tool runs the kernel (or analyses a --dump file with --load)", file=sys.stderr)
            return 1
        runs, failed = [], 0
        for cfg in configs:
            try:
                runs.append((cfg, [int(x) for x in trace_call(cfg, args.fp16, args.warmup)]))
            except Exception as e:  # report and go on: one call of the tool should give every row it can
                failed += 1
                print(f"== {label(cfg)}: failed: {type(e).__name__}: {e}", flush=True)
            if args.dump:  # after every configuration, so a later failure keeps the earlier traces
                with open(args.dump, "w") as fh:
                    json.dump([{"config": c, "trace": t} for c, t in runs], fh)
    results = []
    for cfg, flat in runs:
        summary = report(cfg, parse(flat), args.ctas)
        results.append((cfg, summary))
        print()
    print(format_summary(results))
    return 1 if not args.load and failed else 0


if __name__ == "__main__":
    sys.exit(main())
