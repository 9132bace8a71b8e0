#!/usr/bin/env python3
"""Question: where does a traced kernel spend its time, step by step? The one reader of every kernel's trace.

A trace build (CMake -DOPENMLA_TRACE=ON) compiles clock64 / %globaltimer stamps into dense decode, sparse decode,
sparse prefill and dense MHA prefill, all in one format (src/common/trace_format.h): a header (magic "OMLTRACE",
version, kernel, variant, CTA slots, tracks), a table of tracks (CTAs x roles x steps x events, clock), one header per
CTA (SM, block index, start and end clock64 and %globaltimer, a kernel value), then the records. The binding's
_trace(kernel, clear) returns the trace of the kernel's last launch; this tool runs a call, reads it, parses it with one
parser and prints the kernel's view (each kernel's event names: the tables below, checked against its config.h by
tests/python/test_kernel_trace_tool.py):

  dense-decode    request timeline: median of each step over (CTA, request), the cost of a request switch against
                  the loop time per block, the spread of the CTAs' end times (partition imbalance)
  sparse-decode   whole-kernel timeline of every CTA (ns: entry, init, first Q, first K block, last block, epilogue,
                  exit, the producer's first loads); per role of CTAs 0 and 1, the median / p10 / p90 cycles of each
                  step over the steady-state blocks, the hand-offs, the longest periods, a few blocks as a timeline;
                  WG0's request switches
  sparse-prefill  per role of CTA 0, the median cycles between consecutive events over its pairs, the pair period,
                  one pair as a timeline, the tile epilogue
  mha-prefill     per traced tile: blocks, Q wait, first Q K^T, period, tile-switch gap and idle time, exchange
                  waits, epilogue, mask cost, turn, overhead (--help of the sub-command); a summary table per row
  load FILE       the view of every trace of a --dump file, without a GPU (dumps of trace_mha_prefill.py, the tool
                  this one replaced, load too)
  chain FILE      dense MHA prefill: the critical chain of a consumer step over the steady-state steps of a dump
                  (turn wait, issue, Q K^T, softmax, post, idle; was mha_step_chain.py)
  events FILE     every stamp of a CTA with its event name, per role and step (any kernel; --cta, --track, --steps)

Each run sub-command takes --dump FILE (JSON: kernel, configuration and trace of each call). How to run (GPU machine,
repository root; the build copies the extension into python/openmla/, replacing the production one there until the
next build of build/):

    bash tools/setup_deps.sh --offline && \\
    cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPENMLA_TRACE=ON -DOPENMLA_BUILD_TESTS=OFF \\
      -DPython_EXECUTABLE=$(which python3) && cmake --build build-trace -j16 --target _openmla && \\
    PYTHONPATH=python:.deps/py python3 tools/diag/kernel_trace.py mha-prefill --dump $OUT/trace_mha.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/diag/ -> the repository

# ---- The format (src/common/trace_format.h) ------------------------------------------------------------------------
MAGIC = int.from_bytes(b"OMLTRACE", "little")
VERSION = 1
HEADER_VALUES, TRACK_VALUES, CTA_VALUES = 8, 6, 8
HEAD_MAGIC, HEAD_VERSION, HEAD_KERNEL, HEAD_VARIANT, HEAD_CTAS, HEAD_CTA_VALUES, HEAD_TRACKS, HEAD_VALUES = range(8)
TRACK_CTAS, TRACK_ROLES, TRACK_STEPS, TRACK_EVENTS, TRACK_CLOCK, TRACK_OFFSET = range(6)
CTA_SMID, CTA_BLOCK, CTA_START_CLOCK, CTA_START_TIMER, CTA_END_CLOCK, CTA_END_TIMER, CTA_VALUE, CTA_SCRATCH = range(8)
CYCLES, NANOSECONDS = 0, 1
KERNELS = {1: "dense_decode", 2: "sparse_decode", 3: "sparse_prefill", 4: "mha_prefill"}
KERNEL_IDS = {v: k for k, v in KERNELS.items()}
LEGACY_MHA_MAGIC = 0x4D48415431  # "MHAT1": the dense MHA prefill's own layout before the common format
STAMPED = 1 << 63


class TraceError(ValueError):
    """The buffer is not a trace this tool understands."""


class Track:
    """One track of a parsed trace: records [cta][role][step][event]; 0 = never stamped."""

    def __init__(self, flat, ctas, roles, steps, events, clock, offset):
        self.ctas, self.roles, self.steps, self.events, self.clock = ctas, roles, steps, events, clock
        self._flat, self._offset = flat, offset

    def raw(self, cta, role, step, ev):
        return self._flat[self._offset + ((cta * self.roles + role) * self.steps + step) * self.events + ev]

    def at(self, cta, role, step, ev):
        return self.raw(cta, role, step, ev) or None

    def record(self, cta, role, step):
        """The events of one step, None where never stamped."""
        base = self._offset + ((cta * self.roles + role) * self.steps + step) * self.events
        return [x or None for x in self._flat[base:base + self.events]]


class Cta:
    """A CTA header that was stamped (src/common/trace_format.h, CtaField)."""

    def __init__(self, index, values):
        self.index = index
        self.smid = values[CTA_SMID] & 0xFFFFFFFF
        b = values[CTA_BLOCK]
        self.block = (b & 0xFFFFFFFF, (b >> 32) & 0xFFFF, b >> 48)
        self.start_clock, self.start_timer = values[CTA_START_CLOCK] or None, values[CTA_START_TIMER] or None
        self.end_clock, self.end_timer = values[CTA_END_CLOCK] or None, values[CTA_END_TIMER] or None
        self.value = values[CTA_VALUE]


class Trace:
    """A parsed trace: kernel (name), variant (code), version, ctas {index: Cta} (stamped headers), tracks."""

    def __init__(self, kernel, variant, version, ctas, tracks):
        self.kernel, self.variant, self.version, self.ctas, self.tracks = kernel, variant, version, ctas, tracks

    def ns_per_cycle(self):
        """Nanoseconds per SM cycle from the CTAs' start / end stamps of both clocks (median), or None."""
        r = [(c.end_timer - c.start_timer) / (c.end_clock - c.start_clock) for c in self.ctas.values()
             if None not in (c.start_clock, c.end_clock, c.start_timer, c.end_timer) and c.end_clock > c.start_clock]
        return statistics.median(r) if r else None


def parse(flat):
    """The flat buffer of _trace(kernel) (or of a dump) -> Trace. A dense MHA prefill trace in the layout before the
    common format (magic "MHAT1") is converted first."""
    flat = [int(x) for x in flat]
    if flat and flat[0] == LEGACY_MHA_MAGIC:
        flat = from_legacy_mha(flat)
    if len(flat) < HEADER_VALUES:
        raise TraceError(f"argument 'flat': {len(flat)} values, shorter than the header")
    head = flat[:HEADER_VALUES]
    if head[HEAD_MAGIC] != MAGIC:
        raise TraceError(f"argument 'flat': magic {head[HEAD_MAGIC]:#x}, expected {MAGIC:#x} (not a kernel trace)")
    if head[HEAD_VERSION] != VERSION:
        raise TraceError(f"argument 'flat': format version {head[HEAD_VERSION]}, this tool reads {VERSION}")
    if head[HEAD_KERNEL] not in KERNELS:
        raise TraceError(f"argument 'flat': unknown kernel id {head[HEAD_KERNEL]}")
    if head[HEAD_CTA_VALUES] != CTA_VALUES or not 1 <= head[HEAD_TRACKS] <= 4:
        raise TraceError(f"argument 'flat': header {head} does not match this tool's format (CTA header values "
                         f"{CTA_VALUES}, 1 to 4 tracks): the tool and the build disagree")
    if len(flat) != head[HEAD_VALUES]:
        raise TraceError(f"argument 'flat': {len(flat)} values, the header says {head[HEAD_VALUES]}")
    ntracks, nctas = head[HEAD_TRACKS], head[HEAD_CTAS]
    table_end = HEADER_VALUES + ntracks * TRACK_VALUES
    offset = table_end + nctas * CTA_VALUES
    tracks = []
    for t in range(ntracks):
        row = flat[HEADER_VALUES + t * TRACK_VALUES:HEADER_VALUES + (t + 1) * TRACK_VALUES]
        ctas, roles, steps, events, clock, start = row
        if start != offset or ctas > nctas or clock not in (CYCLES, NANOSECONDS):
            raise TraceError(f"argument 'flat': track {t} {row} does not fit the header (records expected at "
                             f"{offset}, at most {nctas} CTAs)")
        tracks.append(Track(flat, ctas, roles, steps, events, clock, start))
        offset += ctas * roles * steps * events
    if offset != len(flat):
        raise TraceError(f"argument 'flat': the tracks end at {offset}, the trace at {len(flat)}")
    ctas = {}
    for c in range(nctas):
        values = flat[table_end + c * CTA_VALUES:table_end + (c + 1) * CTA_VALUES]
        if values[CTA_SMID] & STAMPED:
            ctas[c] = Cta(c, values)
    return Trace(KERNELS[head[HEAD_KERNEL]], head[HEAD_VARIANT], head[HEAD_VERSION], ctas, tracks)


def build(kernel, variant, tracks):
    """An empty trace (all zeros) of `kernel` with `tracks` [(ctas, roles, steps, events, clock)], as the host reader
    writes its header (Format::write_table): (flat, put, put_cta), where put(track, cta, role, step, ev, value) and
    put_cta(cta, field, value) fill it. For tests and the legacy conversion."""
    nctas = max(t[0] for t in tracks)
    table_end = HEADER_VALUES + len(tracks) * TRACK_VALUES
    offsets, offset = [], table_end + nctas * CTA_VALUES
    for t in tracks:
        offsets.append(offset)
        offset += t[0] * t[1] * t[2] * t[3]
    flat = [MAGIC, VERSION, KERNEL_IDS[kernel], variant, nctas, CTA_VALUES, len(tracks), offset]
    for t, start in zip(tracks, offsets):
        flat += list(t) + [start]
    flat += [0] * (offset - len(flat))

    def put(track, cta, role, step, ev, value):
        _, roles, steps, events, _ = tracks[track]
        flat[offsets[track] + ((cta * roles + role) * steps + step) * events + ev] = value

    def put_cta(cta, field, value):
        flat[table_end + cta * CTA_VALUES + field] = value

    return flat, put, put_cta


def from_legacy_mha(flat):
    """A dense MHA prefill trace in its own layout before the common format (magic, ctas, roles, tiles, max_blocks,
    header_values, fixed_events, block_events; per CTA a header of smid, start clock, start timer, end clock, end timer,
    tiles run, then the records) -> the common format (variant 0: unknown)."""
    if len(flat) < 8:
        raise TraceError(f"argument 'flat': {len(flat)} values, shorter than the legacy layout header")
    _, nctas, roles, tiles, max_blocks, header_values, fixed, block_events = flat[:8]
    events = fixed + max_blocks * block_events
    per_cta = header_values + roles * tiles * events
    if len(flat) != 8 + nctas * per_cta:
        raise TraceError(f"argument 'flat': {len(flat)} values, the legacy layout {flat[:8]} needs "
                         f"{8 + nctas * per_cta}")
    out, _, put_cta = build("mha_prefill", 0, [(nctas, roles, tiles, events, CYCLES)])
    records = HEADER_VALUES + TRACK_VALUES + nctas * CTA_VALUES
    for c in range(nctas):
        base = 8 + c * per_cta
        h = flat[base:base + header_values]
        if h[0]:
            for field, value in zip((CTA_SMID, CTA_START_CLOCK, CTA_START_TIMER, CTA_END_CLOCK, CTA_END_TIMER,
                                     CTA_VALUE), h[:6]):
                put_cta(c, field, value)
            put_cta(c, CTA_BLOCK, c)
        n = roles * tiles * events
        out[records + c * n:records + (c + 1) * n] = flat[base + header_values:base + per_cta]
    return out


# ---- The kernels' event tables (each kernel's config.h, struct Trace) ----------------------------------------------
# Dense decode: one track, role 0 = the CTA, step = the partition's request.
DD_EVENTS = ("prologue start", "prologue done", "first tiles", "loop done", "staged", "stored", "done", "blocks")
DD_START, DD_PRO_DONE, DD_FIRST, DD_LOOP_DONE, DD_STAGED, DD_STORED, DD_DONE, DD_BLOCKS = range(8)
# Sparse decode: track 0 (clock64) roles WG0, WG1, producer, request switches; track 1 (ns) the per-CTA timeline.
SD_ROLES = ("WG0", "WG1", "producer", "switch")
SD_EVENTS = (
    ("wait", "full", "S = QK^T", "P handed", "O_L done"),
    ("wait", "P + full", "O_R done"),
    ("start", "V_L free", "stores issued", "full arrived", "round 0 stored", "round 1 stored"),
    ("loop done", "Q released", "epilogue barrier", "stores issued", "next Q landed", "Q barrier"),
)
SD_STEPS = {  # the steps between consecutive events, per role
    0: ("WG0", ["wait full", "S = QK^T", "softmax + P out", "O_L += P V_L"]),
    1: ("WG1", ["wait P + full", "O_R += P V_R"]),
    2: ("producer", ["wait free (V_L)", "stores (+V_R wait)", "copy + arrive"]),
}
SD_SWITCH_STEPS = ["loop exit", "epilogue barrier", "output stores", "next Q landed", "Q barrier"]
SD_TIMELINE = ("entry", "init done", "Q ready", "first full", "last block done", "epilogue done", "producer done",
               "exit", "P: work known", "P: index landed", "P: token landed", "P: first V_L sent")
SD_LAST_BLOCK, SD_EXIT = SD_TIMELINE.index("last block done"), SD_TIMELINE.index("exit")
# Sparse prefill: one track, roles WG0, WG1, producer, step = the CTA's block pair.
SP_ROLES = ("WG0", "WG1", "producer")
SP_EVENTS = (
    ("start", "S0 done", "m0 published", "P0V0_L done", "a1 received", "P0 stored", "P1V1_L done", "epilogue"),
    ("start", "S1 done", "m0 received", "P1 stored", "P1V1_R done", "P0 received", "P0V0_R done", "epilogue"),
    ("start", "K0 V_L", "K1 V_R", "K0 V_R", "K0 RoPE", "K1 RoPE", "K1 V_L", "prefetch"),
)
# Dense MHA prefill: one track, roles WG0, WG1, producer, step = the CTA's tile; a step's events are the fixed ones,
# then BLOCK_EVENTS per visited key block (visit order).
FIXED_EVENTS, BLOCK_EVENTS = 10, 6
WG0, WG1, PRODUCER = 0, 1, 2
TILE_START, Q_READY, EXCH_ENTER, EXCH_PASSED, LAST_PV_READY, LAST_PV_TURN, LAST_PV_ISSUED, LAST_PV_DONE, \
    STORES_DONE = range(9)
B_DATA_READY, B_TURN, B_ISSUED, B_QK_DONE, B_SOFTMAX_DONE, B_PV_DONE = range(6)
P_RECORD, P_Q_ISSUED, P_EXCH_ENTER, P_EXCH_PASSED, P_META_BLOCKS, P_META_COORD = range(6)
P_K_ISSUED, P_V_ISSUED = range(2)
MHA_ROLES = ("WG0", "WG1", "producer")
MHA_FIXED = (("tile start", "Q ready", "exchange enter", "exchange passed", "last PV ready", "last PV turn",
              "last PV issued", "last PV done", "stores done"),) * 2 + \
    (("record published", "Q issued", "exchange enter", "exchange passed", "meta blocks", "meta coord"),)
MHA_BLOCK = (("data ready", "turn", "issued", "QK done", "softmax done", "PV done"),) * 2 + (("K issued", "V issued"),)


def event_name(kernel, track, role, ev):
    """The name of event `ev` of `role` in `track` of `kernel` (the events view)."""
    if kernel == "dense_decode":
        return DD_EVENTS[ev]
    if kernel == "sparse_decode":
        names = SD_EVENTS[role] if track == 0 else SD_TIMELINE
    elif kernel == "sparse_prefill":
        names = SP_EVENTS[role]
    else:
        if ev >= FIXED_EVENTS:
            j, e = divmod(ev - FIXED_EVENTS, BLOCK_EVENTS)
            return f"block {j} {MHA_BLOCK[role][e]}" if e < len(MHA_BLOCK[role]) else f"block {j} event {e}"
        names = MHA_FIXED[role]
    return names[ev] if ev < len(names) else f"event {ev}"


def role_name(kernel, track, role):
    if kernel == "sparse_decode":
        return SD_ROLES[role] if track == 0 else "CTA"
    if kernel in ("sparse_prefill", "mha_prefill"):
        return (SP_ROLES if kernel == "sparse_prefill" else MHA_ROLES)[role]
    return "CTA"


VALUE_EVENTS = {("dense_decode", 0, 0, DD_BLOCKS), ("mha_prefill", 0, PRODUCER, P_META_BLOCKS),
                ("mha_prefill", 0, PRODUCER, P_META_COORD)}


def variant_label(trace):
    v = trace.variant
    if trace.kernel == "dense_decode":
        return "fp16" if v & 1 else "bf16"
    if trace.kernel == "sparse_decode":
        return ("MODEL1" if v & 1 else "V3.2") + (", crossover" if v & 2 else ", plain")
    if trace.kernel == "sparse_prefill":
        return f"d_qk {v}"
    if v == 0:
        return "variant unknown (legacy layout)"
    return f"d_qk {v & 0xFFFF}, {'fp16' if v >> 16 & 1 else 'bf16'}, {'staged' if v >> 17 & 1 else 'registers'} O"


# ---- Helpers -------------------------------------------------------------------------------------------------------
def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _pct(xs, q):
    """numpy.percentile's default (linear) of xs, q in [0, 100]."""
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def _d(a, b):
    """b - a, or None when either is missing."""
    return None if a is None or b is None else b - a


def _f(x):
    return "-" if x is None else f"{x:.0f}"


def _out(file):
    return file or sys.stdout


# ---- Dense decode: the request timeline (ns) -----------------------------------------------------------------------
def dense_decode_report(trace, cfg, file=None):
    """Medians of each step over (CTA, request), the request switch, the spread of the CTAs' end times (us)."""
    file = _out(file)
    tr = trace.tracks[0]
    reqs_traced = tr.steps

    def t(c, k, e):
        return tr.raw(c, 0, k, e)

    def med(v):
        v = [x for x in v if x is not None]
        return f"{statistics.median(v) / 1e3:8.2f}" if v else "       -"

    ran = [c for c in range(tr.ctas) if t(c, 0, DD_START) != 0]
    if not ran:
        print("dense timeline: empty", file=file)
        return
    t0 = min(t(c, 0, DD_START) for c in ran)
    steps = {k: [] for k in ("prologue", "first tiles", "epilogue: stage", "epilogue: store", "epilogue: sync")}
    per_block, switch, loop_total, switch_total, ends = [], [], 0, 0, []
    for c in ran:
        reqs = [k for k in range(reqs_traced) if t(c, k, DD_START) != 0 and t(c, k, DD_DONE) != 0]
        if reqs:
            ends.append(max(t(c, k, DD_DONE) for k in reqs) - t0)
        for k in reqs:
            steps["prologue"].append(t(c, k, DD_PRO_DONE) - t(c, k, DD_START))
            blocks = t(c, k, DD_BLOCKS)
            if blocks > 0 and t(c, k, DD_FIRST) != 0:
                steps["first tiles"].append(t(c, k, DD_FIRST) - t(c, k, DD_PRO_DONE))
                loop = t(c, k, DD_LOOP_DONE) - t(c, k, DD_FIRST)
                loop_total += loop
                if blocks > 2:
                    per_block.append(loop / (blocks - 0.5))  # FIRST comes after the first block's Q K^T
            steps["epilogue: stage"].append(t(c, k, DD_STAGED) - t(c, k, DD_LOOP_DONE))
            steps["epilogue: store"].append(t(c, k, DD_STORED) - t(c, k, DD_STAGED))
            steps["epilogue: sync"].append(t(c, k, DD_DONE) - t(c, k, DD_STORED))
            if k + 1 in reqs and t(c, k + 1, DD_FIRST) != 0:
                sw = t(c, k + 1, DD_FIRST) - t(c, k, DD_LOOP_DONE)
                switch.append(sw)
                switch_total += sw
    print(f"dense timeline: {label(trace.kernel, cfg)} ({variant_label(trace)}); {len(ran)} CTAs traced (first "
          f"{reqs_traced} requests each); us, medians over (CTA, request)", file=file)
    for name, v in steps.items():
        print(f"  {name:18s} {med(v)}", file=file)
    print(f"  {'loop per block':18s} {med(per_block)}", file=file)
    print(f"  {'request switch':18s} {med(switch)}   (loop done -> next request's first tiles landed; "
          f"{len(switch)} switches)", file=file)
    if loop_total:
        print(f"  switches / (switches + loops) over the traced requests: "
              f"{100 * switch_total / (switch_total + loop_total):.1f} %", file=file)
    if ends:
        ends = [e / 1e3 for e in ends]
        print(f"  CTA end times: min {min(ends):.1f}  median {statistics.median(ends):.1f}  p90 {_pct(ends, 90):.1f}  "
              f"max {max(ends):.1f} us after the first start", file=file)


# ---- Sparse decode: per-CTA timeline (ns), block steps and request switches (cycles) -------------------------------
def sparse_decode_blocks(trace, cta, skip=4, file=None):
    """Per role of CTA `cta`: each step's median / p10 / p90 over the steady-state blocks, the hand-offs, the longest
    periods and a few blocks as a timeline (cycles); every stamp when too few blocks were traced."""
    file = _out(file)
    tr = trace.tracks[0]

    def t(role, it, e):
        return tr.raw(cta, role, it, e)

    used = [it for it in range(tr.steps) if t(0, it, 0) != 0 and t(0, it, 4) != 0]
    if len(used) < skip + 4:
        # Too few blocks for a steady state (b = 2: 3 per CTA): every stamp of every block, in cycles from the
        # producer's first step start (the clock64 stamps of one CTA share one clock).
        print(f"CTA {cta}: only {len(used)} blocks traced; raw stamps (cycles from the producer's first step):",
              file=file)
        base = t(2, used[0], 0) if used else 0
        for it in used:
            for role, (name, steps) in SD_STEPS.items():
                # The producer's plain-path events 4 and 5 (round 0 / round 1 stored) fall between its events 1 and 2.
                ev = [0, 1, 4, 5, 2, 3] if role == 2 and t(2, it, 4) else range(len(steps) + 1)
                print(f"    block {it:3d} {name:9s} " + " ".join(f"{t(role, it, e) - base:7d}" for e in ev), file=file)
        return
    steady = used[skip:-1]
    print(f"\nCTA {cta}{_block_of(trace, cta)}: {len(used)} blocks traced, steady state = blocks "
          f"{steady[0]}..{steady[-1]} (cycles)", file=file)
    print(f"  {'role':9s} {'step':18s} {'median':>8s} {'p10':>8s} {'p90':>8s}", file=file)
    for role, (name, steps) in SD_STEPS.items():
        for k, step in enumerate(steps):
            d = [t(role, it, k + 1) - t(role, it, k) for it in steady]
            print(f"  {name:9s} {step:18s} {statistics.median(d):8.0f} {_pct(d, 10):8.0f} {_pct(d, 90):8.0f}",
                  file=file)
        per = [t(role, it + 1, 0) - t(role, it, 0) for it in steady if t(role, it + 1, 0) != 0]
        if per:
            print(f"  {name:9s} {'period (block)':18s} {statistics.median(per):8.0f} {_pct(per, 10):8.0f} "
                  f"{_pct(per, 90):8.0f}", file=file)
    rel = {  # hand-offs inside the CTA
        "full seen by WG0 - local producer arrive": [t(0, it, 1) - t(2, it, 3) for it in steady],
        "P seen by WG1 - WG0 hand-over": [t(1, it, 1) - t(0, it, 3) for it in steady],
        "free seen by producer - WG0 O_L done (it-2)": [t(2, it, 1) - t(0, it - 2, 4) for it in steady if it >= 2],
        "free seen by producer - WG1 O_R done (it-2)": [t(2, it, 1) - t(1, it - 2, 2) for it in steady if it >= 2],
        "WG0 idle: next wait start - O_L done": [t(0, it + 1, 0) - t(0, it, 4) for it in steady if t(0, it + 1, 0)],
    }
    for k, v in rel.items():
        if v:
            print(f"  {k:45s} median {statistics.median(v):7.0f}  p10 {_pct(v, 10):7.0f}  p90 {_pct(v, 90):7.0f}",
                  file=file)
    # The partition as a whole: WG0's periods over every traced block, and the longest ones (request switches:
    # epilogue + next Q; slow gathers), each split into WG0's steps.
    per_all = [(t(0, it + 1, 0) - t(0, it, 0), it) for it in used[:-1] if t(0, it + 1, 0) != 0]
    if per_all:
        med = statistics.median([d for d, _ in per_all])
        total = sum(d for d, _ in per_all)
        excess = sum(d - med for d, _ in per_all if d > med)
        print(f"  WG0 over blocks {used[0]}..{used[-1]}: {total} cycles = {len(per_all)} x median {med:.0f} "
              f"+ {100 * (total - len(per_all) * med) / total:.1f} % ; above-median excess {excess:.0f} cycles",
              file=file)
        for d, it in sorted(per_all, reverse=True)[:6]:
            steps = " ".join(f"{t(0, it, e + 1) - t(0, it, e):6d}" for e in range(4))
            print(f"    block {it:3d}: period {d:6d}  (wait full, QK, softmax, PV_L: {steps}; "
                  f"after O_L {t(0, it + 1, 0) - t(0, it, 4):6d})", file=file)
    it0 = steady[len(steady) // 2]  # a few blocks as a timeline relative to WG0's "before full wait" of the first
    base = t(0, it0, 0)
    print(f"  timeline of blocks {it0}..{it0 + 2} (cycles from WG0's wait on block {it0}):", file=file)
    for it in range(it0, min(it0 + 3, tr.steps)):
        for role, (name, steps) in SD_STEPS.items():
            cells = " ".join(f"{t(role, it, e) - base:7d}" for e in range(len(steps) + 1))
            print(f"    block {it:3d} {name:9s} {cells}", file=file)


def sparse_decode_timeline(trace, file=None):
    """Whole-kernel %globaltimer timeline (ns) of every CTA that ran."""
    file = _out(file)
    tl = trace.tracks[1]
    t = [[tl.raw(c, 0, 0, e) for e in range(tl.events)] for c in range(tl.ctas)]
    ran = [c for c in range(tl.ctas) if t[c][0] != 0]
    if not ran:
        print("timeline: empty", file=file)
        return
    t0 = min(t[c][0] for c in ran)
    rel = [[v - t0 if v else -1 for v in row] for row in t]
    worked = [c for c in ran if t[c][SD_LAST_BLOCK] != 0]
    print(f"\nwhole-kernel timeline, ns from the first CTA's entry: {len(ran)} CTAs ran, {len(worked)} had work",
          file=file)
    print(f"  {'event':18s} {'min':>8s} {'median':>8s} {'max':>8s}   (over the CTAs with work)", file=file)
    for e, name in enumerate(SD_TIMELINE[:tl.events]):
        v = [rel[c][e] for c in worked if rel[c][e] >= 0]
        if v:
            print(f"  {name:18s} {min(v):8d} {int(statistics.median(v)):8d} {max(v):8d}", file=file)
    idle = [c for c in ran if t[c][SD_LAST_BLOCK] == 0]
    if idle:
        print(f"  CTAs without work: entry median {int(statistics.median(rel[c][0] for c in idle))} ns", file=file)
    for c in sorted(range(tl.ctas), key=lambda c: -rel[c][SD_EXIT])[:3]:
        print(f"  latest exit, CTA {c}{_block_of(trace, c)}: " + " ".join(f"{rel[c][e]:7d}" for e in range(tl.events)),
              file=file)


def sparse_decode_switches(trace, cta, file=None):
    """WG0's request switches (cycles): from the last block's O_L through the epilogue to the next Q barrier. The
    partition's last request has no next Q: its row stops at the stores issued."""
    file = _out(file)
    tr = trace.tracks[0]

    def sw(k, e):
        return tr.raw(cta, 3, k, e)

    rows = [k for k in range(min(tr.steps, 16) - 1) if sw(k, 0) != 0 and sw(k, 3) != 0]
    if not rows:
        return
    print("  request switches (WG0 thread 0, cycles per step: " + ", ".join(SD_SWITCH_STEPS) + "; total)", file=file)
    for k in rows:
        if sw(k, 5) != 0:
            d = [sw(k, e + 1) - sw(k, e) for e in range(3)] + [sw(k, 4) - sw(k, 3), sw(k, 5) - sw(k, 4)]
            cells = " ".join(f"{x:7d}" for x in d)
            print(f"    request {k} -> {k + 1}: {cells}   total {sw(k, 5) - sw(k, 0):7d}", file=file)
        else:
            d = [sw(k, e + 1) - sw(k, e) for e in range(3)]
            print(f"    request {k} (last): " + " ".join(f"{x:7d}" for x in d) + f"   total {sw(k, 3) - sw(k, 0):7d}",
                  file=file)


def sparse_decode_report(trace, cfg, file=None):
    file = _out(file)
    print(f"trace: {label(trace.kernel, cfg)} ({variant_label(trace)}), L2 "
          f"{'warm' if cfg.get('no_flush') else 'flushed'}", file=file)
    sparse_decode_timeline(trace, file)
    if not cfg.get("timeline_only"):
        for cta in range(trace.tracks[0].ctas if cfg.get("h_q", 128) > 64 else 1):
            sparse_decode_blocks(trace, cta, file=file)
            sparse_decode_switches(trace, cta, file=file)


def _block_of(trace, cta):
    c = trace.ctas.get(cta)
    return f" (block {c.block[0]},{c.block[1]},{c.block[2]}, SM {c.smid})" if c else ""


# ---- Sparse prefill: the pair steps (cycles) -----------------------------------------------------------------------
def sparse_prefill_report(trace, cfg, file=None, cta=0, pair=40):
    """Per role of CTA `cta`: the median cycles between consecutive events over pairs 4.., the pair period; one pair
    as a timeline; the tile epilogue."""
    file = _out(file)
    tr = trace.tracks[0]

    def at(role, k, ev):
        return tr.raw(cta, role, k, ev)

    pairs = range(4, tr.steps - 1)
    print(f"{label(trace.kernel, cfg)} ({variant_label(trace)}): CTA {cta}{_block_of(trace, cta)}, pairs "
          f"4..{tr.steps - 1}, median cycles from the previous event", file=file)
    for r, role in enumerate(SP_ROLES):
        cells = []
        for ev in range(1, 7 if role != "producer" else 8):
            d = [at(r, k, ev) - at(r, k, ev - 1) for k in pairs if at(r, k, ev) and at(r, k, ev - 1)]
            cells.append(f"{SP_EVENTS[r][ev]} {statistics.median(d):.0f}" if d else f"{SP_EVENTS[r][ev]} -")
        period = [at(r, k + 1, 0) - at(r, k, 0) for k in pairs if at(r, k + 1, 0) and at(r, k, 0)]
        print(f"  {role:9s} period {_f(_median(period))} | " + " | ".join(cells), file=file)
    k = min(pair, tr.steps - 1)
    t0 = at(0, k, 0)
    print(f"pair {k} timeline (cycles after WG0's start):", file=file)
    for r, role in enumerate(SP_ROLES):
        print(f"  {role:9s} " + "  ".join(f"{SP_EVENTS[r][ev]}={at(r, k, ev) - t0}"
                                          for ev in range(tr.events) if at(r, k, ev)), file=file)
    ep = [at(0, k, 7) - at(0, k, 6) for k in range(tr.steps) if at(0, k, 7) and at(0, k, 6)]
    if ep:
        print(f"  tile epilogue (WG0, last pair's P1V1_L -> epilogue done): median {statistics.median(ep):.0f} cycles "
              f"over {len(ep)} tiles", file=file)


# ---- Dense MHA prefill: per-tile metrics (cycles) ------------------------------------------------------------------
BLOCK_M = BLOCK_N = 128


def mha_tiles(trace):
    """The trace's traced tiles per CTA: [{"cta", "smid", "tiles_run", "tiles": [tile, ...]}], a tile {"index",
    "blocks", "head", "m_block", "roles": [WG0, WG1, producer]}, each role {"fixed": [...], "blocks": [[...] per
    visited block]} with None for a value never stamped. Only tiles the producer described are kept (a CTA with fewer
    tiles than traced has zeros after its last)."""
    tr = trace.tracks[0]
    if tr.roles != 3 or tr.events < FIXED_EVENTS or (tr.events - FIXED_EVENTS) % BLOCK_EVENTS:
        raise TraceError(f"argument 'trace': track {tr.roles} roles x {tr.events} events is not the dense MHA "
                         f"prefill's (3 roles, {FIXED_EVENTS} + n x {BLOCK_EVENTS} events)")
    max_blocks = (tr.events - FIXED_EVENTS) // BLOCK_EVENTS
    out = []
    for c in range(tr.ctas):
        head = trace.ctas.get(c)
        if head is None:
            continue  # the grid had fewer CTAs
        tiles = []
        for t in range(tr.steps):
            roles = []
            for r in range(tr.roles):
                rec = tr.record(c, r, t)
                roles.append({"fixed": rec[:FIXED_EVENTS],
                              "blocks": [rec[FIXED_EVENTS + j * BLOCK_EVENTS:FIXED_EVENTS + (j + 1) * BLOCK_EVENTS]
                                         for j in range(max_blocks)]})
            meta = roles[PRODUCER]["fixed"]
            if meta[P_META_BLOCKS] is None:
                break
            coord = meta[P_META_COORD] or 0
            tiles.append({"index": t, "blocks": meta[P_META_BLOCKS] & (STAMPED - 1), "head": coord >> 32,
                          "m_block": coord & 0xFFFFFFFF, "roles": roles})
        out.append({"cta": c, "smid": head.smid, "tiles_run": head.value, "tiles": tiles})
    return out


def row_key_limit(s_q, s_k, row, causal):  # src/common/varlen.h (varlen::row_key_limit, Tiles::block_needs_mask)
    return min(s_k - 1, row + s_k - s_q) if causal else s_k - 1


def block_needs_mask(s_q, s_k, m_block, n_block, causal):
    return n_block * BLOCK_N + BLOCK_N - 1 > row_key_limit(s_q, s_k, m_block * BLOCK_M, causal)


def _overlap(a0, a1, b0, b1):
    if None in (a0, a1, b0, b1):
        return None
    return max(0, min(a1, b1) - max(a0, b0))


def analyse_tile(tile, prev, nxt, s_q, s_k, causal):
    """Metrics of one tile (dict); `prev` / `nxt`: the CTA's tile before / after it, or None."""
    nb = tile["blocks"]
    wgs = tile["roles"][:2]
    prod = tile["roles"][PRODUCER]
    row = {"tile": tile["index"], "blocks": nb, "head": tile["head"], "m_block": tile["m_block"]}
    kept = min(nb, len(wgs[0]["blocks"]))
    per = []
    for w, r in enumerate(wgs):
        f, blks = r["fixed"], r["blocks"][:kept]
        m = {"q_wait": _d(f[TILE_START], f[Q_READY]),
             "first_qk": _d(f[TILE_START], blks[0][B_QK_DONE]) if kept else None,
             "periods": [_d(blks[j - 1][B_QK_DONE], blks[j][B_QK_DONE]) for j in range(1, kept)],
             "exch_enter": f[EXCH_ENTER], "epi": _d(f[LAST_PV_DONE], f[STORES_DONE]),
             "turn": _median([_d(b[B_DATA_READY], b[B_TURN]) for b in blks] +
                             [_d(f[LAST_PV_READY], f[LAST_PV_TURN])] if nb else [])}
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


def analyse(ctas, s_q, s_k, causal):
    """Per traced CTA (mha_tiles), the rows of its tiles: [(cta dict, [row, ...]), ...]."""
    out = []
    for cta in ctas:
        tiles = cta["tiles"]
        rows = [analyse_tile(t, tiles[i - 1] if i else None, tiles[i + 1] if i + 1 < len(tiles) else None, s_q, s_k,
                             causal) for i, t in enumerate(tiles)]
        out.append((cta, rows))
    return out


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


def _pair(xs):
    return "/".join(_f(x) for x in xs)


TILE_HEADER = ("tile  head  m   blocks  q-wait     ->QK0       period  gap         idle   exch(WG0/WG1/prod)  "
               "epi        mask   turn   overhead")


def format_tile(r):
    return (f"{r['tile']:4d}  {r['head']:4d}  {r['m_block']:2d}  {r['blocks']:6d}  {_pair(r['q_wait']):9s}  "
            f"{_pair(r['first_qk']):10s}  {_f(r['period']):6s}  {_pair(r['gap']):10s}  {_f(r['idle']):5s}  "
            f"{_pair(r['exch']):18s}  {_pair(r['epi']):9s}  {_f(r['mask']):5s}  {_f(r['turn']):5s}  "
            f"{_f(r['overhead'])}")


def mha_prefill_report(trace, cfg, file=None, show_ctas=(0,)):
    """Prints the per-tile lines of the CTAs in `show_ctas`; returns the summary dict (the summary table's row)."""
    file = _out(file)
    analysed = analyse(mha_tiles(trace), cfg["s"], cfg["s"], cfg["causal"])
    npc = trace.ns_per_cycle()
    clock = f"{1 / npc:.2f} GHz" if npc else "unknown"
    print(f"== {label(trace.kernel, cfg)} ({variant_label(trace)}): {len(trace.ctas)} CTAs traced, SM clock {clock}; "
          "cycles; WG0/WG1 where two", file=file)
    for cta, rows in analysed:
        if cta["cta"] not in show_ctas:
            continue
        print(f"CTA {cta['cta']} (SM {cta['smid']}, {cta['tiles_run'] or '?'} tiles run, {len(rows)} traced)",
              file=file)
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
    lines.append(f"{'configuration':28s}" + "".join(f"{c:>10s}" for c in SUMMARY_COLUMNS) + f"{'ns/cyc':>8s}")
    for cfg, s in results:
        npc = s.get("ns_per_cycle")
        lines.append(f"{label('mha_prefill', cfg):28s}" + "".join(f"{_f(s[c]):>10s}" for c in SUMMARY_COLUMNS) +
                     f"{(f'{npc:.3f}' if npc else '-'):>8s}")
    return "\n".join(lines)


CHAIN_KEYS = ("turnwait", "issue", "issue2qk", "softmax", "post", "qk_from_turn")


def mha_chain(ctas, min_blocks=6):
    """The critical chain of a consumer step: {key: [cycles per step]} over the steady-state steps (blocks 2 .. n-3 of
    tiles with at least `min_blocks` blocks, every traced CTA but its first tile, both warpgroups). turnwait: data
    ready -> turn (since decision mha-v0.18 the issue's start: the stamps' own cost); issue: -> GEMMs issued;
    issue2qk: -> S done; softmax: -> softmax done; post: -> the next step's data ready; qk_from_turn: turn -> S done;
    idle: WG1's S done -> WG0's next turn (the tensor cores run WG1's P V, then wait for WG0)."""
    acc = {k: [] for k in CHAIN_KEYS + ("idle",)}
    for cta in ctas:
        for tile in cta["tiles"][1:]:  # the CTA's first tile includes the kernel's start-up
            n = min(tile["blocks"], len(tile["roles"][0]["blocks"]))
            if tile["blocks"] < min_blocks:
                continue
            for wg in (WG0, WG1):
                steps = tile["roles"][wg]["blocks"]
                for j in range(2, n - 2):
                    ready, turn, issued, qk, sm, _ = steps[j]
                    nxt = steps[j + 1][B_DATA_READY]
                    if None in (ready, turn, issued, qk, sm, nxt):
                        continue
                    links = (turn - ready, issued - turn, qk - issued, sm - qk, nxt - sm, qk - turn)
                    for k, v in zip(CHAIN_KEYS, links):
                        acc[k].append(v)
            w0, w1 = tile["roles"][WG0]["blocks"], tile["roles"][WG1]["blocks"]
            for j in range(2, n - 2):
                if w1[j][B_QK_DONE] and w0[j + 1][B_TURN]:
                    acc["idle"].append(w0[j + 1][B_TURN] - w1[j][B_QK_DONE])
    return acc


def chain_report(cfg, acc, file=None):
    file = _out(file)
    print(f"== {label('mha_prefill', cfg)}", file=file)
    for k, v in acc.items():
        if not v:
            print(f"  {k:13s} -", file=file)
            continue
        s = sorted(v)
        print(f"  {k:13s} median {statistics.median(s):7.0f}   p10 {s[len(s) // 10]:6d}   p90 {s[9 * len(s) // 10]:6d}"
              f"   steps {len(s)}", file=file)


# ---- Any kernel: every stamp with its name -------------------------------------------------------------------------
def events_report(trace, cta, track=None, steps=None, file=None):
    """Every stamp of CTA `cta`, per track, role and step, with its event name: times relative to the CTA's first
    stamp of the track (cycles or ns, the track's clock), values as they are."""
    file = _out(file)
    head = trace.ctas.get(cta)
    where = (f"block {head.block[0]},{head.block[1]},{head.block[2]}, SM {head.smid}, kernel value {head.value}"
             if head else "no CTA header")
    print(f"{trace.kernel} ({variant_label(trace)}), CTA {cta} ({where})", file=file)
    for ti, tr in enumerate(trace.tracks):
        if track is not None and ti != track:
            continue
        if cta >= tr.ctas:
            continue
        unit = "cycles" if tr.clock == CYCLES else "ns"
        times = [tr.raw(cta, r, s, e) for r in range(tr.roles) for s in range(tr.steps) for e in range(tr.events)
                 if tr.raw(cta, r, s, e) and (trace.kernel, ti, r, e) not in VALUE_EVENTS]
        base = min(times) if times else 0
        print(f"  track {ti} ({tr.roles} roles x {tr.steps} steps x {tr.events} events, {unit} from {base})", file=file)
        for r in range(tr.roles):
            for s in range(tr.steps) if steps is None else range(*steps):
                if s >= tr.steps:
                    break
                cells = []
                for e in range(tr.events):
                    v = tr.raw(cta, r, s, e)
                    if v:
                        shown = v & (STAMPED - 1) if (trace.kernel, ti, r, e) in VALUE_EVENTS else v - base
                        cells.append(f"{event_name(trace.kernel, ti, r, e)}={shown}")
                if cells:
                    print(f"    {role_name(trace.kernel, ti, r):8s} step {s:3d}: " + "  ".join(cells), file=file)


# ---- Running a traced call (GPU), dumps ----------------------------------------------------------------------------
def label(kernel, cfg):
    g = cfg.get
    if kernel == "dense_decode":
        return f"b={g('b')} s_q={g('s_q')} h_q={g('h_q')} s_k={g('s_k')} varlen"
    if kernel == "sparse_decode":
        return f"b={g('b')} s_q={g('s_q')} h_q={g('h_q')} topk={g('topk')}"
    if kernel == "sparse_prefill":
        return f"d_qk {g('d_qk')}, h_q {g('h_q')}, s_q {g('s_q')}, s_kv {g('s_kv')}, topk {g('topk')}"
    return f"b{g('b')} s{g('s')} d{g('d_qk')} {'causal' if g('causal') else 'full'} h{g('h_q')}"


def _extension():
    """The trace build's module and torch with a CUDA device, or SystemExit saying what is missing."""
    for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tools", "diag")):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        from openmla import _openmla as C
    except ImportError as e:
        raise SystemExit(f"openmla is not importable ({e}): build the extension (see --help)")
    if not hasattr(C, "_trace"):
        raise SystemExit("not a trace build: configure with -DOPENMLA_TRACE=ON and build _openmla (see --help)")
    try:
        import torch
    except ImportError:
        raise SystemExit("torch is not importable: the tool needs torch with a CUDA device")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: the tool runs the kernel (or analyses a --dump file with 'load')")
    return C, torch


def run_dense_decode(cfg):
    """Three calls; the trace is of the last, made after the benchmark's L2 flush."""
    C, torch = _extension()
    import bench_dense_decode as bdd
    import harness
    import openmla

    q, k_cache, block_table, seqlens, _ = bdd.make_inputs(cfg["b"], cfg["s_q"], cfg["h_q"], 1, cfg["s_k"], varlen=True)
    meta, _ = openmla.get_mla_metadata()
    flush = harness.flush_buffer()
    for i in range(3):
        if i == 2:
            torch.cuda.synchronize()
            C._trace("dense_decode", clear=True)
            flush.zero_()
        openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta, causal=False)
    torch.cuda.synchronize()
    return C._trace("dense_decode")


def run_sparse_decode(cfg):
    """Three calls (profile_sparse_decode.run_case); the trace is of the last, after an L2 flush unless no_flush."""
    C, _ = _extension()
    from profile_sparse_decode import run_case

    C._trace("sparse_decode", clear=True)
    run_case(argparse.Namespace(**cfg), calls=3, flush_last=not cfg["no_flush"])
    return C._trace("sparse_decode")


def run_sparse_prefill(cfg):
    """Three warm-up calls, then the traced one."""
    C, torch = _extension()
    import bench_sparse_prefill as b
    import openmla

    q, kv, indices, sink = b.make_inputs(cfg["s_q"], cfg["s_kv"], cfg["topk"], cfg["h_q"], cfg["d_qk"])
    for _ in range(3):
        openmla.flash_mla_sparse_fwd(q, kv, indices, cfg["d_qk"] ** -0.5, attn_sink=sink)
    torch.cuda.synchronize()
    C._trace("sparse_prefill", clear=True)
    openmla.flash_mla_sparse_fwd(q, kv, indices, cfg["d_qk"] ** -0.5, attn_sink=sink)
    return C._trace("sparse_prefill")


def run_mha_prefill(cfg):
    """`warmup` calls, then the traced one."""
    C, torch = _extension()
    import bench_mha_prefill_fwd as bench
    import openmla

    q, k, v, cu = bench.make_inputs([cfg["s"]] * cfg["b"], cfg["h_q"], cfg["h_q"], cfg["d_qk"], 128)
    if cfg.get("fp16"):
        q, k, v = q.half(), k.half(), v.half()

    def call():
        openmla.flash_attn_varlen_func(q, k, v, cu, cu, cfg["s"], cfg["s"], causal=cfg["causal"])

    for _ in range(cfg.get("warmup", 3)):
        call()
    torch.cuda.synchronize()
    C._trace("mha_prefill", clear=True)
    call()
    return C._trace("mha_prefill")


def load_dump(path):
    """The entries of a --dump file (plain or gzipped JSON): [{"kernel", "config", "trace"}]; entries without
    "kernel" (dumps of trace_mha_prefill.py) are dense MHA prefill."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    if not isinstance(data, list) or not data or not all(isinstance(e, dict) and "trace" in e for e in data):
        raise SystemExit(f"argument 'path': {path} is not a --dump file of kernel_trace.py")
    for e in data:
        e.setdefault("kernel", "mha_prefill")
        e.setdefault("config", {})
    return data


# ---- Command line --------------------------------------------------------------------------------------------------
MHA_DEFAULT_ROWS = (
    dict(b=16, s=1024, h_q=128, d_qk=192, causal=True),
    dict(b=2, s=4096, h_q=128, d_qk=128, causal=True),
    dict(b=2, s=4096, h_q=128, d_qk=192, causal=True),
)


def parse_ctas(text):
    try:
        ctas = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"argument --ctas: '{text}' is not a comma-separated list of CTA numbers")
    if not ctas or min(ctas) < 0:
        raise argparse.ArgumentTypeError(f"argument --ctas: '{text}' names no CTA number >= 0")
    return ctas


def parse_steps(text):
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"argument --steps: '{text}' is not FIRST:END")
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"argument --steps: '{text}' needs 0 <= FIRST < END")
    return a, b


def build_parser():
    doc = __doc__.splitlines()
    ap = argparse.ArgumentParser(description=doc[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(doc[1:]))
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dump = argparse.ArgumentParser(add_help=False)
    dump.add_argument("--dump", metavar="FILE", help="write the configuration and the raw trace as JSON")

    def ints(p, **defaults):  # integer options with their defaults
        for name, default in defaults.items():
            p.add_argument("--" + name.replace("_", "-"), type=int, default=default, help=f"(default {default})")

    p = sub.add_parser("dense-decode", parents=[dump], help="trace one dense decode call (request timeline)")
    ints(p, b=128, s_q=2, h_q=128, s_k=4096)
    p = sub.add_parser("sparse-decode", parents=[dump], help="trace one sparse decode call (steps, switches, timeline)")
    ints(p, b=128, s_q=2, h_q=128, topk=2048, s_k=32768)
    p.add_argument("--timeline-only", action="store_true", help="print the whole-kernel timeline only")
    p.add_argument("--no-flush", action="store_true", help="keep the L2 warm before the traced call")
    p = sub.add_parser("sparse-prefill", parents=[dump], help="trace one sparse prefill call (pair steps)")
    p.add_argument("--d-qk", type=int, default=576, choices=(576, 512))
    ints(p, h_q=128, s_q=1024, s_kv=8192, topk=2048)

    p = sub.add_parser("mha-prefill", parents=[dump], help="trace dense MHA prefill calls (per-tile metrics); with no "
                       "configuration argument the reference rows b16 s1024 d192, b2 s4096 d128, b2 s4096 d192 "
                       "(causal, h128)")
    p.add_argument("--b", type=int, help="sequences (default with another configuration argument: 2)")
    p.add_argument("--s", type=int, help="tokens per sequence, s_q = s_k (default 4096)")
    p.add_argument("--h-q", type=int, help="query heads, h_kv = h_q (default 128)")
    p.add_argument("--d-qk", type=int, choices=(192, 128), help="Q/K head dimension; d_v is 128 (default 192)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None, help="causal (default) or not")
    p.add_argument("--fp16", action="store_true", help="fp16 operands (default bf16)")
    p.add_argument("--ctas", type=parse_ctas, default=[0], help="CTAs whose tiles are printed (default 0)")
    p.add_argument("--warmup", type=int, default=3, help="calls before the traced one (default 3)")

    p = sub.add_parser("load", help="the views of the traces of --dump files (no GPU needed)")
    p.add_argument("dumps", nargs="+", metavar="FILE", help="--dump files (.json or .json.gz)")
    p.add_argument("--ctas", type=parse_ctas, default=[0], help="dense MHA prefill: CTAs whose tiles are printed")

    p = sub.add_parser("chain", help="dense MHA prefill: the critical chain of a consumer step, from --dump files")
    p.add_argument("dumps", nargs="+", metavar="FILE", help="--dump files (.json or .json.gz)")

    p = sub.add_parser("events", help="every stamp of a CTA with its event name (any kernel; from a --dump file)")
    p.add_argument("dump", metavar="FILE", help="a --dump file (.json or .json.gz)")
    p.add_argument("--entry", type=int, default=0, help="which trace of the file (default 0)")
    p.add_argument("--cta", type=int, default=0, help="CTA slot (linear CTA id; default 0)")
    p.add_argument("--track", type=int, help="only this track")
    p.add_argument("--steps", type=parse_steps, help="only steps FIRST:END")
    return ap


def mha_configurations(args):
    given = {k: getattr(args, k) for k in ("b", "s", "h_q", "d_qk", "causal")}
    if all(v is None for v in given.values()):
        rows = [dict(c) for c in MHA_DEFAULT_ROWS]
    else:
        cfg = dict(b=2, s=4096, h_q=128, d_qk=192, causal=True)
        cfg.update({k: v for k, v in given.items() if v is not None})
        for k in ("b", "s", "h_q"):
            if cfg[k] < 1:
                raise SystemExit(f"argument --{k.replace('_', '-')}: must be >= 1, got {cfg[k]}")
        rows = [cfg]
    for cfg in rows:
        cfg.update(fp16=args.fp16, warmup=args.warmup)
    return rows


def report(entry, file=None, ctas=(0,)):
    """The view of one dump entry; the summary dict for dense MHA prefill, else None."""
    trace = parse(entry["trace"])
    if trace.kernel != entry["kernel"]:
        raise TraceError(f"argument 'entry': a {trace.kernel} trace recorded as {entry['kernel']}")
    cfg = entry["config"]
    if trace.kernel == "dense_decode":
        dense_decode_report(trace, cfg, file)
    elif trace.kernel == "sparse_decode":
        sparse_decode_report(trace, cfg, file)
    elif trace.kernel == "sparse_prefill":
        sparse_prefill_report(trace, cfg, file)
    else:
        return mha_prefill_report(trace, cfg, file, ctas)
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("load", "chain", "events"):
        if args.command == "events":
            entries = load_dump(args.dump)
            if not 0 <= args.entry < len(entries):
                raise SystemExit(f"argument --entry: {args.dump} holds {len(entries)} traces")
            events_report(parse(entries[args.entry]["trace"]), args.cta, args.track, args.steps)
            return 0
        results = []
        for path in args.dumps:
            for entry in load_dump(path):
                if args.command == "chain":
                    if entry["kernel"] == "mha_prefill":
                        chain_report(entry["config"], mha_chain(mha_tiles(parse(entry["trace"]))))
                    continue
                summary = report(entry, ctas=args.ctas)
                print()
                if summary is not None:
                    results.append((entry["config"], summary))
        if results:
            print(format_summary(results))
        return 0
    if args.command == "mha-prefill" and args.warmup < 0:
        print(f"argument --warmup: must be >= 0, got {args.warmup}", file=sys.stderr)
        return 2
    kernel = args.command.replace("-", "_")
    if kernel == "mha_prefill":
        configs = mha_configurations(args)
    else:
        configs = [{k: v for k, v in vars(args).items() if k not in ("command", "dump")}]
    run = {"dense_decode": run_dense_decode, "sparse_decode": run_sparse_decode,
           "sparse_prefill": run_sparse_prefill, "mha_prefill": run_mha_prefill}[kernel]
    _extension()  # before the first configuration: say what is missing once
    entries, results, failed = [], [], 0
    for cfg in configs:
        try:
            entries.append({"kernel": kernel, "config": cfg, "trace": [int(x) for x in run(cfg)]})
        except Exception as e:  # report and go on: one call of the tool should give every row it can
            failed += 1
            print(f"== {label(kernel, cfg)}: failed: {type(e).__name__}: {e}", flush=True)
            continue
        finally:
            if args.dump:  # after every configuration, so a later failure keeps the earlier traces
                with open(args.dump, "w") as fh:
                    json.dump(entries, fh)
        summary = report(entries[-1], ctas=getattr(args, "ctas", (0,)))
        if summary is not None:
            results.append((cfg, summary))
            print()
    if kernel == "mha_prefill":
        print(format_summary(results))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TraceError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
