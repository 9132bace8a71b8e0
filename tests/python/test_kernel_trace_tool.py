"""tools/diag/kernel_trace.py without a GPU: the format constants against src/common/trace_format.h and each kernel's
event table against its config.h (struct Trace); the parser on synthetic buffers (its checks, the legacy dense MHA
prefill layout); each kernel's view on a synthetic trace with a known timeline; the command line (--help, load, chain,
events without torch; argument errors)."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "diag", "kernel_trace.py")
FORMAT_H = os.path.join(ROOT, "src", "common", "trace_format.h")


def config_h(kernel):
    return os.path.join(ROOT, "src", "kernels", kernel, "config.h")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("kernel_trace_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(*args):
    """Runs the script in a fresh interpreter where `import torch` fails (as on a machine without torch)."""
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = [{TOOL!r}] + {list(args)!r}; runpy.run_path({TOOL!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------------------------
# The C++ side: trace_format.h and the kernels' struct Trace
# ---------------------------------------------------------------------------------------------------------------
def enum_values(text, name):
    """{enumerator: value} of `enum name ... { ... };` in text (explicit values only)."""
    m = re.search(r"enum\s+(?:class\s+)?" + name + r"\b[^{]*\{(.*?)\};", text, re.S)
    assert m, f"enum {name} not found"
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return {k: int(v) for k, v in re.findall(r"\b(k\w+)\s*=\s*(\d+)", body)}


def trace_struct(kernel):
    text = open(config_h(kernel)).read()
    body = text[text.index("struct Trace {"):]
    return body[:body.index("\n};")]


def constants(body):
    return {k: int(v) for k, v in re.findall(r"\b(k[A-Z]\w*)\s*=\s*(\d+)", body)}


def test_format_matches_trace_format_h(tool):
    text = open(FORMAT_H).read()
    magic = int(re.search(r"kMagic = (0x[0-9a-f]+)ull", text).group(1), 16)
    assert magic == tool.MAGIC and magic.to_bytes(8, "little") == b"OMLTRACE"
    assert int(re.search(r"kVersion = (\d+)", text).group(1)) == tool.VERSION
    sizes = constants(re.search(r"inline constexpr int kHeaderValues.*?;", text).group(0))
    assert (sizes["kHeaderValues"], sizes["kTrackValues"], sizes["kCtaValues"]) == \
        (tool.HEADER_VALUES, tool.TRACK_VALUES, tool.CTA_VALUES)
    head = enum_values(text, "HeaderField")
    assert [head[k] for k in ("kHeadMagic", "kHeadVersion", "kHeadKernel", "kHeadVariant", "kHeadCtas",
                              "kHeadCtaValues", "kHeadTracks", "kHeadValues")] == list(range(8))
    track = enum_values(text, "TrackField")
    assert [track[k] for k in ("kTrackCtas", "kTrackRoles", "kTrackSteps", "kTrackEvents", "kTrackClock",
                               "kTrackOffset")] == [tool.TRACK_CTAS, tool.TRACK_ROLES, tool.TRACK_STEPS,
                                                    tool.TRACK_EVENTS, tool.TRACK_CLOCK, tool.TRACK_OFFSET]
    cta = enum_values(text, "CtaField")
    assert [cta[k] for k in ("kCtaSmid", "kCtaBlock", "kCtaStartClock", "kCtaStartTimer", "kCtaEndClock",
                             "kCtaEndTimer", "kCtaValue", "kCtaScratch")] == \
        [tool.CTA_SMID, tool.CTA_BLOCK, tool.CTA_START_CLOCK, tool.CTA_START_TIMER, tool.CTA_END_CLOCK,
         tool.CTA_END_TIMER, tool.CTA_VALUE, tool.CTA_SCRATCH]
    kernels = enum_values(text, "Kernel")
    assert {k[1:]: v for k, v in kernels.items()} == {
        "DenseDecode": 1, "SparseDecode": 2, "SparsePrefill": 3, "MhaPrefill": 4}
    assert {tool.KERNEL_IDS[n] for n in ("dense_decode", "sparse_decode", "sparse_prefill", "mha_prefill")} == \
        set(kernels.values())
    assert enum_values(text, "Clock") == {"kCycles": tool.CYCLES, "kNanoseconds": tool.NANOSECONDS}


# The same table as tests/cpp/test_trace_format.cpp (Format<Track<2, 4, 256, 6>, Track<1024, 1, 1, 12, ns>>, sparse
# decode, variant 3): the C++ writer and the Python one agree through it.
GOLDEN_TABLE = [0x45434152544C4D4F, 1, 2, 3, 1024, 8, 2, 32788, 2, 4, 256, 6, 0, 8212, 1024, 1, 1, 12, 1, 20500]


def test_table_matches_the_cpp_golden(tool):
    flat, _, _ = tool.build("sparse_decode", 3, [(2, 4, 256, 6, 0), (1024, 1, 1, 12, 1)])
    assert flat[:len(GOLDEN_TABLE)] == GOLDEN_TABLE and len(flat) == GOLDEN_TABLE[7]
    trace = tool.parse(flat)
    assert trace.kernel == "sparse_decode" and trace.variant == 3 and not trace.ctas
    assert [(t.ctas, t.roles, t.steps, t.events, t.clock) for t in trace.tracks] == \
        [(2, 4, 256, 6, 0), (1024, 1, 1, 12, 1)]


def test_event_tables_match_the_kernels(tool):
    dd = trace_struct("dense_decode")
    ev = enum_values(dd, "Event")
    assert len(ev) == len(tool.DD_EVENTS) == constants(dd)["kEvents"] and ev["kBlocks"] == tool.DD_BLOCKS
    assert [ev[k] for k in ("kPrologueStart", "kPrologueDone", "kFirstTiles", "kLoopDone", "kStaged", "kStored",
                            "kDone")] == [tool.DD_START, tool.DD_PRO_DONE, tool.DD_FIRST, tool.DD_LOOP_DONE,
                                          tool.DD_STAGED, tool.DD_STORED, tool.DD_DONE]
    sd = trace_struct("sparse_decode")
    c = constants(sd)
    assert (c["kRoles"], c["kEvents"], c["kTimelineEvents"]) == (len(tool.SD_ROLES), 6, len(tool.SD_TIMELINE))
    assert enum_values(sd, "Role") == {"kRoleWg0": 0, "kRoleWg1": 1, "kRoleProducer": 2, "kRoleSwitch": 3}
    for role, enum in enumerate(("Wg0Event", "Wg1Event", "ProducerEvent", "SwitchEvent")):
        assert len(enum_values(sd, enum)) == len(tool.SD_EVENTS[role]), enum
    tl = enum_values(sd, "TimelineEvent")
    assert tl["kLastBlockDone"] == tool.SD_LAST_BLOCK and tl["kExit"] == tool.SD_EXIT
    assert sorted(tl.values()) == list(range(len(tool.SD_TIMELINE)))
    sp = trace_struct("sparse_prefill")
    assert constants(sp)["kEvents"] == 8 and constants(sp)["kRoles"] == len(tool.SP_ROLES)
    for role, enum in enumerate(("Wg0Event", "Wg1Event", "ProducerEvent")):
        assert len(enum_values(sp, enum)) == len(tool.SP_EVENTS[role]), enum
    mha = trace_struct("mha_prefill")
    c = constants(mha)
    assert (c["kFixedEvents"], c["kBlockEvents"], c["kRoles"]) == (tool.FIXED_EVENTS, tool.BLOCK_EVENTS, 3)
    assert (c["kRoleWg0"], c["kRoleWg1"], c["kRoleProducer"]) == (tool.WG0, tool.WG1, tool.PRODUCER)
    pairs = {
        "kTileStart": tool.TILE_START, "kQReady": tool.Q_READY, "kExchangeEnter": tool.EXCH_ENTER,
        "kExchangePassed": tool.EXCH_PASSED, "kLastPvReady": tool.LAST_PV_READY, "kLastPvTurn": tool.LAST_PV_TURN,
        "kLastPvIssued": tool.LAST_PV_ISSUED, "kLastPvDone": tool.LAST_PV_DONE, "kStoresDone": tool.STORES_DONE,
        "kBlockDataReady": tool.B_DATA_READY, "kBlockTurn": tool.B_TURN, "kBlockIssued": tool.B_ISSUED,
        "kBlockQkDone": tool.B_QK_DONE, "kBlockSoftmaxDone": tool.B_SOFTMAX_DONE, "kBlockPvDone": tool.B_PV_DONE,
        "kRecordPublished": tool.P_RECORD, "kQIssued": tool.P_Q_ISSUED,
        "kProducerExchangeEnter": tool.P_EXCH_ENTER, "kProducerExchangePassed": tool.P_EXCH_PASSED,
        "kMetaBlocks": tool.P_META_BLOCKS, "kMetaCoord": tool.P_META_COORD,
        "kKIssued": tool.P_K_ISSUED, "kVIssued": tool.P_V_ISSUED,
    }
    for name, value in pairs.items():
        assert c[name] == value, name
    assert len(tool.MHA_FIXED[0]) == 9 and len(tool.MHA_FIXED[2]) == 6 and len(tool.MHA_BLOCK[0]) == 6


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------
def test_buffer_errors_name_the_argument(tool):
    flat, _, put_cta = tool.build("dense_decode", 0, [(4, 1, 8, 8, 1)])
    put_cta(1, tool.CTA_SMID, 7 | tool.STAMPED)
    assert list(tool.parse(flat).ctas) == [1]
    with pytest.raises(tool.TraceError, match="argument 'flat'.*magic"):
        tool.parse([1] + flat[1:])
    with pytest.raises(tool.TraceError, match="argument 'flat'.*version"):
        tool.parse(flat[:1] + [2] + flat[2:])
    with pytest.raises(tool.TraceError, match="argument 'flat'.*the header says"):
        tool.parse(flat[:-1])
    with pytest.raises(tool.TraceError, match="argument 'flat'.*disagree"):
        tool.parse(flat[:5] + [9] + flat[6:])
    bad = list(flat)
    bad[tool.HEADER_VALUES + tool.TRACK_OFFSET] += 1
    with pytest.raises(tool.TraceError, match="argument 'flat'.*track 0"):
        tool.parse(bad)
    with pytest.raises(tool.TraceError, match="argument 'flat'.*shorter"):
        tool.parse([tool.MAGIC])


def test_cta_header_and_clock(tool):
    flat, put, put_cta = tool.build("sparse_prefill", 576, [(2, 3, 4, 8, 0)])
    for field, value in ((tool.CTA_SMID, 5 | tool.STAMPED), (tool.CTA_BLOCK, 1 | 2 << 32 | 3 << 48),
                         (tool.CTA_START_CLOCK, 1), (tool.CTA_START_TIMER, 1000), (tool.CTA_END_CLOCK, 10001),
                         (tool.CTA_END_TIMER, 6000), (tool.CTA_VALUE, 12)):
        put_cta(0, field, value)
    put(0, 1, 2, 3, 4, 99)
    trace = tool.parse(flat)
    cta = trace.ctas[0]
    assert (cta.smid, cta.block, cta.value) == (5, (1, 2, 3), 12) and 1 not in trace.ctas
    assert trace.ns_per_cycle() == pytest.approx(0.5)
    tr = trace.tracks[0]
    assert tr.at(1, 2, 3, 4) == 99 and tr.at(1, 2, 3, 5) is None and tr.record(1, 2, 3)[4] == 99
    assert tool.variant_label(trace) == "d_qk 576"


# ---------------------------------------------------------------------------------------------------------------
# Dense decode
# ---------------------------------------------------------------------------------------------------------------
def dense_decode_trace(tool):
    """3 CTAs with 2 requests each (us): start S; prologue 2; first tiles 3 later; 10 blocks in 19 (loop done); stage 1,
    store 1, sync 1; the next request starts when the previous is done. CTA c starts at 100 c ns."""
    flat, put, put_cta = tool.build("dense_decode", 0, [(8, 1, 8, 8, 1)])
    for c in range(3):
        s = 1000 * (1 + 0.1 * c)
        put_cta(c, tool.CTA_SMID, c | tool.STAMPED)
        for k in range(2):
            times = [s, s + 2, s + 5, s + 24, s + 25, s + 26, s + 27]
            for ev, t in enumerate(times):
                put(0, c, 0, k, ev, int(t * 1000))
            put(0, c, 0, k, tool.DD_BLOCKS, 10)
            s += 27
    return flat


def test_dense_decode_view(tool):
    out = io.StringIO()
    tool.dense_decode_report(tool.parse(dense_decode_trace(tool)), dict(b=2, s_q=2, h_q=128, s_k=640), out)
    text = out.getvalue()
    assert "b=2 s_q=2 h_q=128 s_k=640 varlen (bf16); 3 CTAs traced (first 8 requests each)" in text
    lines = {ln.split("  ")[1].strip(): ln for ln in text.splitlines()[1:] if ln.startswith("  ") and "  " in ln[2:]}
    assert lines["prologue"].split()[-1] == "2.00" and lines["first tiles"].split()[-1] == "3.00"
    assert lines["loop per block"].split()[-1] == f"{19 / 9.5:.2f}"
    # Loop done -> the next request's first tiles: the epilogue (3) + the prologue (2) + the first tiles (3).
    assert "   8.00   (loop done -> next request's first tiles landed; 3 switches)" in text
    assert "CTA end times: min 54.0  median 154.0" in text


# ---------------------------------------------------------------------------------------------------------------
# Sparse decode
# ---------------------------------------------------------------------------------------------------------------
def sparse_decode_trace(tool, blocks=12):
    """CTA 0 and 1: `blocks` blocks of 1000 cycles. WG0: wait at 1000 b, full +100, S +300, P +500, O_L +800. WG1: wait
    +300, P + full +550, O_R +900. Producer: start 1000 b - 400, V_L free +50, stores +250, arrived +300 (plain
    path). Two request switches of WG0 (steps 10, 20, 30, 40, 50 cycles). Timeline: CTAs 0-3 (3 without work)."""
    flat, put, put_cta = tool.build("sparse_decode", 0, [(2, 4, 256, 6, 0), (1024, 1, 1, 12, 1)])
    for c in range(2):
        put_cta(c, tool.CTA_SMID, (10 + c) | tool.STAMPED)
        put_cta(c, tool.CTA_BLOCK, c)
        for b in range(blocks):
            t = 10000 + 1000 * b
            for ev, dt in enumerate((0, 100, 300, 500, 800)):
                put(0, c, 0, b, ev, t + dt)
            for ev, dt in enumerate((300, 550, 900)):
                put(0, c, 1, b, ev, t + dt)
            for ev, dt in enumerate((-400, -350, -150, -100)):
                put(0, c, 2, b, ev, t + dt)
        for k in range(2):
            base = 50000 + 1000 * k
            for ev, dt in enumerate((0, 10, 30, 60, 100, 150) if k == 0 else (0, 10, 30, 60)):
                put(0, c, 3, k, ev, base + dt)
    for c in range(4):
        if c >= 2:
            put_cta(c, tool.CTA_SMID, c | tool.STAMPED)
            put_cta(c, tool.CTA_BLOCK, c | 1 << 32)
        put(1, c, 0, 0, 0, 5000 + c)
        put(1, c, 0, 0, tool.SD_EXIT, 9000 + 10 * c)
        if c == 0:
            put(1, c, 0, 0, tool.SD_LAST_BLOCK, 8000)
    return flat


def test_sparse_decode_view(tool):
    trace = tool.parse(sparse_decode_trace(tool))
    out = io.StringIO()
    tool.sparse_decode_report(trace, dict(b=128, s_q=2, h_q=128, topk=2048), out)
    text = out.getvalue()
    assert text.startswith("trace: b=128 s_q=2 h_q=128 topk=2048 (V3.2, plain), L2 flushed")
    assert "4 CTAs ran, 1 had work" in text and "CTAs without work: entry median 2 ns" in text
    assert "latest exit, CTA 3 (block 3,1,0, SM 3):" in text
    steps = {" ".join(ln.split()[:-3]): ln.split()[-3:] for ln in text.splitlines() if ln.startswith("  WG")}
    assert steps["WG0 wait full"] == ["100", "100", "100"] and steps["WG0 O_L += P V_L"] == ["300", "300", "300"]
    assert steps["WG0 period (block)"][0] == "1000" and steps["WG1 O_R += P V_R"][0] == "350"
    assert "CTA 1 (block 1,0,0, SM 11): 12 blocks traced, steady state = blocks 4..10" in text
    assert "request 0 -> 1:      10      20      30      40      50   total     150" in text
    assert "request 1 (last):      10      20      30   total      60" in text


def test_sparse_decode_few_blocks_prints_every_stamp(tool):
    out = io.StringIO()
    tool.sparse_decode_blocks(tool.parse(sparse_decode_trace(tool, blocks=3)), 0, file=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("CTA 0: only 3 blocks traced") and len(lines) == 1 + 3 * 3
    assert lines[3].split()[3:] == ["0", "50", "250", "300"]  # the producer, from its first step start


# ---------------------------------------------------------------------------------------------------------------
# Sparse prefill
# ---------------------------------------------------------------------------------------------------------------
def test_sparse_prefill_view(tool):
    flat, put, put_cta = tool.build("sparse_prefill", 512, [(2, 3, 96, 8, 0)])
    put_cta(0, tool.CTA_SMID, 3 | tool.STAMPED)
    for k in range(60):
        for r in range(3):
            for ev in range(8 if r == 2 or k % 10 == 9 else 7):
                put(0, 0, r, k, ev, 100000 + 6000 * k + 100 * r + 200 * ev)
    out = io.StringIO()
    tool.sparse_prefill_report(tool.parse(flat), dict(d_qk=512, h_q=64, s_q=1024, s_kv=8192, topk=512), out)
    text = out.getvalue()
    assert text.startswith("d_qk 512, h_q 64, s_q 1024, s_kv 8192, topk 512 (d_qk 512): CTA 0 (block 0,0,0, SM 3)")
    assert "  WG0       period 6000 | S0 done 200 | m0 published 200" in text
    assert "  producer  period 6000 |" in text and "prefetch 200" in text
    assert "WG1       start=100  S1 done=300" in text
    assert "tile epilogue (WG0, last pair's P1V1_L -> epilogue done): median 200 cycles over 6 tiles" in text


# ---------------------------------------------------------------------------------------------------------------
# Dense MHA prefill: a synthetic trace with a known timeline (and the same in the legacy layout)
# ---------------------------------------------------------------------------------------------------------------
MHA_TILES = ((2, 0, 3), (1, 0, 2), (0, 1, 1))


def mha_timeline(tool, put, put_head, tiles=MHA_TILES, max_blocks=4):
    """CTA 0 runs `tiles` (m_block, head, blocks), CTA 1 nothing, in this timeline per warpgroup w (offset 10 w):
    start S; Q ready S + 100; block j: data ready S + 200 + 1000 j, turn + 20, issued + 30, Q K^T done + 500,
    softmax done + 400 (masked) / + 300, P V done 1200 after its Q K^T done; last P V step: ready S + 200 + 1000 nb,
    turn + 20, issued + 30, done + 400; stores + 250; exchange 60 + 10 w; producer exchange 50. The next tile starts
    300 after WG0's last P V done. put(role, tile, ev, value), put_head(field, value) with the legacy field names."""
    put_head("smid", 5 | 1 << 63)
    put_head("start_clock", 1)
    put_head("start_timer", 1000)
    put_head("end_clock", 10001)
    put_head("end_timer", 6000)
    put_head("tiles", len(tiles))
    s = 1000
    for t, (m_block, h, nb) in enumerate(tiles):
        for w in (0, 1):
            st = s + 10 * w
            put(w, t, tool.TILE_START, st)
            put(w, t, tool.Q_READY, st + 100)
            for j in range(min(nb, max_blocks)):
                b = tool.FIXED_EVENTS + j * tool.BLOCK_EVENTS
                ready = st + 200 + 1000 * j
                masked = j == 0  # causal, s_q = s_k = 384: the diagonal block, visited first
                put(w, t, b + tool.B_DATA_READY, ready)
                put(w, t, b + tool.B_TURN, ready + 20)
                put(w, t, b + tool.B_ISSUED, ready + 30)
                put(w, t, b + tool.B_QK_DONE, ready + 500)
                put(w, t, b + tool.B_SOFTMAX_DONE, ready + 500 + (400 if masked else 300))
                put(w, t, b + tool.B_PV_DONE, ready + 1700)
            last = st + 200 + 1000 * nb
            put(w, t, tool.LAST_PV_READY, last)
            put(w, t, tool.LAST_PV_TURN, last + 20)
            put(w, t, tool.LAST_PV_ISSUED, last + 30)
            put(w, t, tool.LAST_PV_DONE, last + 400)
            put(w, t, tool.STORES_DONE, last + 650)
            exch = st + 200 + 1000 * (nb - 1) + 505
            put(w, t, tool.EXCH_ENTER, exch)
            put(w, t, tool.EXCH_PASSED, exch + 60 + 10 * w)
        put(2, t, tool.P_EXCH_ENTER, s + 5)
        put(2, t, tool.P_EXCH_PASSED, s + 55)
        put(2, t, tool.P_META_BLOCKS, nb | 1 << 63)
        put(2, t, tool.P_META_COORD, h << 32 | m_block)
        s = s + 200 + 1000 * nb + 400 + 300


HEAD_FIELDS = {"smid": 0, "start_clock": 2, "start_timer": 3, "end_clock": 4, "end_timer": 5, "tiles": 6}


def mha_trace(tool, max_blocks=4, variant=192 | 1 << 17):
    events = tool.FIXED_EVENTS + max_blocks * tool.BLOCK_EVENTS
    flat, put, put_cta = tool.build("mha_prefill", variant, [(2, 3, 4, events, 0)])
    mha_timeline(tool, lambda r, t, e, v: put(0, 0, r, t, e, v), lambda f, v: put_cta(0, HEAD_FIELDS[f], v),
                 max_blocks=max_blocks)
    return flat


def legacy_mha_trace(tool, max_blocks=4):
    """The same timeline in the layout before the common format (magic MHAT1, per CTA an 8-value header)."""
    events = tool.FIXED_EVENTS + max_blocks * tool.BLOCK_EVENTS
    per_cta = 8 + 3 * 4 * events
    flat = [tool.LEGACY_MHA_MAGIC, 2, 3, 4, max_blocks, 8, tool.FIXED_EVENTS, tool.BLOCK_EVENTS] + [0] * (2 * per_cta)
    legacy = {"smid": 0, "start_clock": 1, "start_timer": 2, "end_clock": 3, "end_timer": 4, "tiles": 5}

    def put(role, tile, ev, value):
        flat[8 + 8 + (role * 4 + tile) * events + ev] = value

    def put_head(field, value):
        flat[8 + legacy[field]] = value

    mha_timeline(tool, put, put_head, max_blocks=max_blocks)
    return flat


def test_mha_parse_synthetic(tool):
    trace = tool.parse(mha_trace(tool))
    assert list(trace.ctas) == [0]  # CTA 1 never started (no SM stamp)
    ctas = tool.mha_tiles(trace)
    assert ctas[0]["smid"] == 5 and ctas[0]["tiles_run"] == 3
    assert [(t["blocks"], t["head"], t["m_block"]) for t in ctas[0]["tiles"]] == [(3, 0, 2), (2, 0, 1), (1, 1, 0)]
    assert trace.ns_per_cycle() == pytest.approx(0.5)
    assert tool.variant_label(trace) == "d_qk 192, bf16, staged O"


def check_mha_metrics(tool, trace):
    (_, rows), = tool.analyse(tool.mha_tiles(trace), 384, 384, True)
    first, second, third = rows
    for r in rows:
        assert r["q_wait"] == [100, 100]
        assert r["first_qk"] == [700, 700]
        # Arrivals: producer at the tile's start + 5, WG0 / WG1 after their last Q K^T (WG1 10 later): the exchange
        # completes at WG1's arrival.
        assert r["exch"] == [10, 0, 1000 * (r["blocks"] - 1) + 710]
        assert r["epi"] == [250, 250]
        assert r["turn"] == 20
    assert first["period"] == 1000 and second["period"] == 1000 and third["period"] is None
    assert first["gap"] == [None, None] and first["idle"] is None
    # Switch: last P V done 300 before the next start, first Q K^T done 700 after it.
    assert second["gap"] == [1000, 1000] and third["gap"] == [1000, 1000]
    # Idle windows [-300, +230] (WG0) and [-290, +240] (WG1) around the next start overlap by 520.
    assert second["idle"] == 520
    assert first["mask"] == 100 and second["mask"] == 100 and third["mask"] is None  # one block: no plain one
    assert first["softmax"] == 300
    assert first["tile_time"] == 3000 + 900 and first["overhead"] == 900
    assert third["tile_time"] is None and third["overhead"] is None
    s = tool.summarise(tool.analyse(tool.mha_tiles(trace), 384, 384, True))
    assert s["tiles"] == 3 and s["period"] == 1000 and s["gap WG0"] == 1000 and s["idle"] == 520
    assert s["overhead"] == 900 and s["exch prod"] == 1710


def test_mha_metrics_of_the_synthetic_timeline(tool):
    check_mha_metrics(tool, tool.parse(mha_trace(tool)))


def test_mha_legacy_layout_reads_the_same(tool):
    trace = tool.parse(legacy_mha_trace(tool))
    assert trace.kernel == "mha_prefill" and trace.variant == 0 and trace.ctas[0].block == (0, 0, 0)
    check_mha_metrics(tool, trace)
    assert tool.parse(legacy_mha_trace(tool))  # the conversion leaves its input alone
    with pytest.raises(tool.TraceError, match="argument 'flat'.*legacy layout"):
        tool.parse(legacy_mha_trace(tool)[:-1])


def test_mha_blocks_past_the_traced_ones(tool):
    # 3 blocks, 2 traced: the period comes from the traced ones, the last P V from the fixed events.
    (_, rows), = tool.analyse(tool.mha_tiles(tool.parse(mha_trace(tool, max_blocks=2))), 384, 384, True)
    assert rows[0]["blocks"] == 3 and rows[0]["period"] == 1000 and rows[0]["epi"] == [250, 250]
    assert rows[1]["gap"] == [1000, 1000]


def test_mha_report_and_summary_text(tool):
    cfg = dict(b=1, s=384, h_q=2, d_qk=192, causal=True)
    out = io.StringIO()
    summary = tool.mha_prefill_report(tool.parse(mha_trace(tool)), cfg, out, [0])
    text = out.getvalue()
    assert "b1 s384 d192 causal h2" in text and "SM clock 2.00 GHz" in text and "CTA 0 (SM 5, 3 tiles run" in text
    table = tool.format_summary([(cfg, summary)])
    assert table.splitlines()[1].split()[:3] == ["configuration", "tiles", "blocks"]
    assert table.splitlines()[2].startswith("b1 s384 d192 causal h2")


def test_block_needs_mask_matches_varlen(tool):
    # common/varlen.h: under causal with s_q = s_k the diagonal block of each query block is the only masked one.
    for m in range(4):
        assert [tool.block_needs_mask(512, 512, m, n, True) for n in range(m + 1)] == [False] * m + [True]
    assert not tool.block_needs_mask(512, 512, 3, 3, False)
    assert tool.block_needs_mask(500, 500, 0, 3, False)  # keys past s_k


def test_events_view_names_every_stamp(tool):
    out = io.StringIO()
    tool.events_report(tool.parse(mha_trace(tool)), 0, steps=(0, 1), file=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "mha_prefill (d_qk 192, bf16, staged O), CTA 0 (block 0,0,0, SM 5, kernel value 3)"
    assert lines[1] == "  track 0 (3 roles x 4 steps x 34 events, cycles from 1000)"
    assert lines[2].startswith("    WG0      step   0: tile start=0  Q ready=100  exchange enter=2705")
    assert "block 0 data ready=200  block 0 turn=220" in lines[2]
    assert lines[4].startswith("    producer step   0: record published=") or "meta blocks=3  meta coord=2" in lines[4]
    assert "meta blocks=3  meta coord=2" in lines[4]


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------
def test_help_without_torch():
    proc = run_tool("--help")
    assert proc.returncode == 0, proc.stderr
    assert "-DOPENMLA_TRACE=ON" in proc.stdout and "--target _openmla" in proc.stdout
    for command in ("dense-decode", "sparse-decode", "sparse-prefill", "mha-prefill", "load", "chain", "events"):
        assert command in proc.stdout
    proc = run_tool("mha-prefill", "--help")
    assert proc.returncode == 0 and "--d-qk" in proc.stdout and "--dump" in proc.stdout


def write_dump(tool, path):
    entries = [
        {"kernel": "dense_decode", "config": dict(b=2, s_q=2, h_q=128, s_k=640), "trace": dense_decode_trace(tool)},
        {"kernel": "sparse_decode", "config": dict(b=128, s_q=2, h_q=128, topk=2048),
         "trace": sparse_decode_trace(tool)},
        {"kernel": "mha_prefill", "config": dict(b=1, s=384, h_q=2, d_qk=192, causal=True), "trace": mha_trace(tool)},
    ]
    path.write_text(json.dumps(entries))
    return entries


def test_load_every_kernel_without_torch(tool, tmp_path):
    dump = tmp_path / "trace.json"
    write_dump(tool, dump)
    legacy = tmp_path / "legacy.json"  # a dump of trace_mha_prefill.py: no "kernel"
    legacy.write_text(json.dumps([{"config": dict(b=1, s=384, h_q=2, d_qk=192, causal=True),
                                   "trace": legacy_mha_trace(tool)}]))
    proc = run_tool("load", str(dump), str(legacy), "--ctas", "0,1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dense timeline: b=2 s_q=2" in out and "whole-kernel timeline" in out and "CTA 0 (SM 5, 3 tiles run" in out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("b1 s384 d192 causal h2") and lines[-2].startswith("b1 s384 d192 causal h2")
    assert lines[-4].startswith("summary")


def test_events_and_chain_without_torch(tool, tmp_path):
    dump = tmp_path / "trace.json"
    write_dump(tool, dump)
    proc = run_tool("events", str(dump), "--entry", "1", "--cta", "0", "--track", "0", "--steps", "0:1")
    assert proc.returncode == 0, proc.stderr
    # From the track's first stamp (the producer's first step start, 9600).
    assert "switch   step   0: loop done=40400  Q released=40410" in proc.stdout
    proc = run_tool("chain", str(dump))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "== b1 s384 d192 causal h2"


def test_mha_default_rows_and_one_configuration(tool):
    parser = tool.build_parser()
    rows = tool.mha_configurations(parser.parse_args(["mha-prefill"]))
    assert [tool.label("mha_prefill", c) for c in rows] == ["b16 s1024 d192 causal h128", "b2 s4096 d128 causal h128",
                                                            "b2 s4096 d192 causal h128"]
    one = tool.mha_configurations(parser.parse_args(["mha-prefill", "--b", "16", "--s", "1024", "--h-q", "16",
                                                     "--no-causal"]))
    assert one == [dict(b=16, s=1024, h_q=16, d_qk=192, causal=False, fp16=False, warmup=3)]


@pytest.mark.parametrize("args,needle", [
    (["mha-prefill", "--ctas", "x"], "argument --ctas"),
    (["mha-prefill", "--d-qk", "64"], "argument --d-qk"),
    (["mha-prefill", "--b", "0"], "argument --b: must be >= 1"),
    (["mha-prefill", "--warmup", "-1"], "argument --warmup"),
    (["sparse-prefill", "--d-qk", "128"], "argument --d-qk"),
    (["events", "x.json", "--steps", "3:1"], "argument --steps"),
    (["dense-decode"], "openmla"),  # no trace build here (or no torch): says which
])
def test_argument_errors(args, needle):
    proc = run_tool(*args)
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout


def test_run_flow_writes_a_dump(tool, tmp_path, monkeypatch, capsys):
    # The GPU part replaced by a synthetic trace: main() runs each configuration, prints its view, writes the dump,
    # and a failed configuration is reported without losing the others.
    monkeypatch.setattr(tool, "_extension", lambda: (None, None))
    calls = []

    def fake_run(cfg):
        calls.append(cfg)
        if cfg["d_qk"] == 128:
            raise RuntimeError("no such variant here")
        return mha_trace(tool)

    monkeypatch.setattr(tool, "run_mha_prefill", fake_run)
    dump = tmp_path / "mha.json"
    assert tool.main(["mha-prefill", "--dump", str(dump)]) == 1  # one of the three reference rows failed
    out = capsys.readouterr().out
    assert [c["d_qk"] for c in calls] == [192, 128, 192]
    assert "== b2 s4096 d128 causal h128: failed: RuntimeError: no such variant here" in out
    assert out.strip().splitlines()[-1].startswith("b2 s4096 d192 causal h128")
    entries = json.loads(dump.read_text())
    assert [e["kernel"] for e in entries] == ["mha_prefill"] * 2 and entries[0]["trace"] == mha_trace(tool)
    monkeypatch.setattr(tool, "run_dense_decode", lambda cfg: dense_decode_trace(tool))
    assert tool.main(["dense-decode", "--b", "2", "--s-k", "640"]) == 0
    assert "dense timeline: b=2 s_q=2 h_q=128 s_k=640 varlen" in capsys.readouterr().out


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    proc = run_tool("load", str(bad))
    assert proc.returncode != 0 and "argument 'path'" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# A dump recorded on the H100 (legacy layout, committed with the session's results)
# ---------------------------------------------------------------------------------------------------------------
DUMP = os.path.join(ROOT, "benchmarks", "results", "traces-2026-11-25-s12", "trace_mha_b2s4096dqk128.json.gz")


def test_chain_of_a_recorded_dump():
    if not os.path.exists(DUMP):
        pytest.skip(f"recorded dump {DUMP} not in this checkout")
    res = run_tool("chain", DUMP)
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()[1:]}
    assert set(lines) == {"turnwait", "issue", "issue2qk", "softmax", "post", "qk_from_turn", "idle"}
    # The recorded run: thousands of steady-state steps, a softmax of ~1,500 cycles (the point of the analysis).
    assert int(lines["softmax"][-1]) > 1000
    assert 1000 < float(lines["softmax"][2]) < 2500
