"""tools/diag/trace_mha_prefill.py without a GPU: its event constants against src/kernels/mha_prefill/config.h (struct
Trace), parsing and the per-tile metrics on a synthetic trace with a known timeline, the buffer checks, and the command
line (--help and --load without torch, argument errors)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "diag", "trace_mha_prefill.py")
CONFIG = os.path.join(ROOT, "src", "kernels", "mha_prefill", "config.h")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("trace_mha_prefill_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(*args):
    """Runs the script in a fresh interpreter where `import torch` fails (as on a machine without torch)."""
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = [{TOOL!r}] + {list(args)!r}; runpy.run_path({TOOL!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------------------------
# The layout the kernel writes (config.h) and the one the tool reads
# ---------------------------------------------------------------------------------------------------------------
def cpp_constants():
    text = open(CONFIG).read()
    body = text[text.index("struct Trace {"):]
    body = body[:body.index("\n};")]
    values = {}
    for name, value in re.findall(r"\b(k[A-Z]\w*)\s*=\s*(\d+)", body):
        values[name] = int(value)
    return values


def test_constants_match_config_h(tool):
    c = cpp_constants()
    assert (c["kFixedEvents"], c["kBlockEvents"], c["kRoles"]) == (tool.FIXED_EVENTS, tool.BLOCK_EVENTS, 3)
    assert (c["kRoleWg0"], c["kRoleWg1"], c["kRoleProducer"]) == (tool.WG0, tool.WG1, tool.PRODUCER)
    pairs = {
        "kHeadSmid": tool.HEAD_SMID, "kHeadStartClock": tool.HEAD_START_CLOCK, "kHeadStartTimer": tool.HEAD_START_TIMER,
        "kHeadEndClock": tool.HEAD_END_CLOCK, "kHeadEndTimer": tool.HEAD_END_TIMER, "kHeadTilesTaken": tool.HEAD_TILES,
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
    assert max(v for k, v in c.items() if k in pairs and not k.startswith(("kHead", "kBlock", "kK", "kV"))) < \
        tool.FIXED_EVENTS
    assert c["kHeaderValues"] > tool.HEAD_TILES


# ---------------------------------------------------------------------------------------------------------------
# A synthetic trace with a known timeline
# ---------------------------------------------------------------------------------------------------------------
LAYOUT = dict(ctas=2, roles=3, tiles=4, max_blocks=4, header_values=8)


def synthetic(tool, tiles=((2, 0, 3), (1, 0, 2), (0, 1, 1)), max_blocks=4):
    """Flat buffer: CTA 0 runs `tiles` (m_block, head, blocks), CTA 1 runs nothing, in this timeline per warpgroup w
    (offset 10 w): start S; Q ready S + 100; block j: data ready S + 200 + 1000 j, turn + 20, issued + 30, Q K^T done
    + 500, softmax done + 400 (masked) / + 300, P V done 1200 after its Q K^T done; last P V step: ready
    S + 200 + 1000 nb, turn + 20, issued + 30, done + 400; stores + 250; exchange 60 + 10 w; producer exchange 50.
    The next tile starts 300 after WG0's last P V done."""
    fixed, block_events = tool.FIXED_EVENTS, tool.BLOCK_EVENTS
    layout = dict(LAYOUT, max_blocks=max_blocks)
    events = fixed + max_blocks * block_events
    per_cta = layout["header_values"] + 3 * layout["tiles"] * events
    flat = [tool.MAGIC, layout["ctas"], 3, layout["tiles"], max_blocks, layout["header_values"], fixed, block_events]
    flat += [0] * (layout["ctas"] * per_cta)
    base = len(tool.LAYOUT_FIELDS)

    def put(cta, role, tile, ev, value):
        flat[base + cta * per_cta + layout["header_values"] + (role * layout["tiles"] + tile) * events + ev] = value

    def head(cta, i, value):
        flat[base + cta * per_cta + i] = value

    head(0, tool.HEAD_SMID, 5 | 1 << 63)
    head(0, tool.HEAD_START_CLOCK, 1)
    head(0, tool.HEAD_START_TIMER, 1000)
    head(0, tool.HEAD_END_CLOCK, 10001)
    head(0, tool.HEAD_END_TIMER, 6000)
    head(0, tool.HEAD_TILES, len(tiles))
    s = 1000
    for t, (m_block, h, nb) in enumerate(tiles):
        for w in (0, 1):
            st = s + 10 * w
            put(0, w, t, tool.TILE_START, st)
            put(0, w, t, tool.Q_READY, st + 100)
            for j in range(min(nb, max_blocks)):
                b = tool.FIXED_EVENTS + j * block_events
                ready = st + 200 + 1000 * j
                masked = j == 0  # causal, s_q = s_k = 384: the diagonal block, visited first
                put(0, w, t, b + tool.B_DATA_READY, ready)
                put(0, w, t, b + tool.B_TURN, ready + 20)
                put(0, w, t, b + tool.B_ISSUED, ready + 30)
                put(0, w, t, b + tool.B_QK_DONE, ready + 500)
                put(0, w, t, b + tool.B_SOFTMAX_DONE, ready + 500 + (400 if masked else 300))
                put(0, w, t, b + tool.B_PV_DONE, ready + 1700)
            last = st + 200 + 1000 * nb
            put(0, w, t, tool.LAST_PV_READY, last)
            put(0, w, t, tool.LAST_PV_TURN, last + 20)
            put(0, w, t, tool.LAST_PV_ISSUED, last + 30)
            put(0, w, t, tool.LAST_PV_DONE, last + 400)
            put(0, w, t, tool.STORES_DONE, last + 650)
            exch = st + 200 + 1000 * (nb - 1) + 505
            put(0, w, t, tool.EXCH_ENTER, exch)
            put(0, w, t, tool.EXCH_PASSED, exch + 60 + 10 * w)
        put(0, 2, t, tool.P_EXCH_ENTER, s + 5)
        put(0, 2, t, tool.P_EXCH_PASSED, s + 55)
        put(0, 2, t, tool.P_META_BLOCKS, nb | 1 << 63)
        put(0, 2, t, tool.P_META_COORD, h << 32 | m_block)
        s = s + 200 + 1000 * nb + 400 + 300
    return flat


def test_parse_synthetic(tool):
    trace = tool.parse(synthetic(tool))
    assert trace["layout"]["tiles"] == 4
    assert len(trace["ctas"]) == 1  # CTA 1 never started (no SM stamp)
    cta = trace["ctas"][0]
    assert cta["smid"] == 5
    assert [(t["blocks"], t["head"], t["m_block"]) for t in cta["tiles"]] == [(3, 0, 2), (2, 0, 1), (1, 1, 0)]
    assert tool.ns_per_cycle(trace) == pytest.approx(0.5)


def test_metrics_of_the_synthetic_timeline(tool):
    trace = tool.parse(synthetic(tool))
    (_, rows), = tool.analyse(trace, 384, 384, True)
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
    s = tool.summarise(tool.analyse(trace, 384, 384, True))
    assert s["tiles"] == 3 and s["period"] == 1000 and s["gap WG0"] == 1000 and s["idle"] == 520
    assert s["overhead"] == 900 and s["exch prod"] == 1710


def test_blocks_past_the_traced_ones(tool):
    # 3 blocks, 2 traced: the period comes from the traced ones, the last P V from the fixed events.
    trace = tool.parse(synthetic(tool, max_blocks=2))
    (_, rows), = tool.analyse(trace, 384, 384, True)
    assert rows[0]["blocks"] == 3 and rows[0]["period"] == 1000 and rows[0]["epi"] == [250, 250]
    assert rows[1]["gap"] == [1000, 1000]


def test_report_and_summary_text(tool, capsys):
    cfg = dict(b=1, s=384, h_q=2, d_qk=192, causal=True)
    summary = tool.report(cfg, tool.parse(synthetic(tool)), [0])
    text = capsys.readouterr().out
    assert "b1 s384 d192 causal h2" in text and "SM clock 2.00 GHz" in text and "CTA 0 (SM 5, 3 tiles run" in text
    table = tool.format_summary([(cfg, summary)])
    assert table.splitlines()[1].split()[:3] == ["configuration", "tiles", "blocks"]
    assert table.splitlines()[2].startswith("b1 s384 d192 causal h2")


def test_buffer_errors_name_the_argument(tool):
    flat = synthetic(tool)
    with pytest.raises(tool.TraceError, match="argument 'flat'.*magic"):
        tool.parse([1] + flat[1:])
    with pytest.raises(tool.TraceError, match="argument 'flat'.*needs"):
        tool.parse(flat[:-1])
    with pytest.raises(tool.TraceError, match="argument 'flat'.*disagree"):
        tool.parse(flat[:6] + [tool.FIXED_EVENTS + 1] + flat[7:])
    with pytest.raises(tool.TraceError, match="argument 'flat'.*shorter"):
        tool.parse([tool.MAGIC])


def test_block_needs_mask_matches_tile_math(tool):
    # tile_math.h: under causal with s_q = s_k the diagonal block of each query block is the only masked one.
    for m in range(4):
        assert [tool.block_needs_mask(512, 512, m, n, True) for n in range(m + 1)] == [False] * m + [True]
    assert not tool.block_needs_mask(512, 512, 3, 3, False)
    assert tool.block_needs_mask(500, 500, 0, 3, False)  # keys past s_k


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------
def test_help_without_torch():
    proc = run_tool("--help")
    assert proc.returncode == 0, proc.stderr
    assert "-DOPENMLA_TRACE=ON" in proc.stdout and "--target _openmla" in proc.stdout and "--d-qk" in proc.stdout


def test_load_without_torch(tool, tmp_path):
    dump = tmp_path / "trace.json"
    cfg = dict(b=1, s=384, h_q=2, d_qk=192, causal=True)
    dump.write_text(json.dumps([{"config": cfg, "trace": synthetic(tool)}]))
    proc = run_tool("--load", str(dump), "--ctas", "0,1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("b1 s384 d192 causal h2") and lines[-3].startswith("summary")


def test_default_rows_and_one_configuration(tool):
    parser = tool.build_parser()
    rows = tool.configurations(parser.parse_args([]))
    assert [tool.label(c) for c in rows] == ["b16 s1024 d192 causal h128", "b2 s4096 d128 causal h128",
                                             "b2 s4096 d192 causal h128"]
    one = tool.configurations(parser.parse_args(["--b", "16", "--s", "1024", "--h-q", "16", "--no-causal"]))
    assert one == [dict(b=16, s=1024, h_q=16, d_qk=192, causal=False)]


@pytest.mark.parametrize("args,needle", [
    (["--ctas", "x"], "argument --ctas"),
    (["--d-qk", "64"], "argument --d-qk"),
    (["--b", "0"], "argument --b: must be >= 1"),
    (["--warmup", "-1"], "argument --warmup"),
])
def test_argument_errors(args, needle):
    proc = run_tool(*args)
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout


# ---------------------------------------------------------------------------------------------------------------
# tools/diag/mha_step_chain.py on a dump recorded on the H100 (committed with the session's results)
# ---------------------------------------------------------------------------------------------------------------
CHAIN = os.path.join(ROOT, "tools", "diag", "mha_step_chain.py")
DUMP = os.path.join(ROOT, "benchmarks", "results", "traces-2026-11-25-s12", "trace_mha_b2s4096dqk128.json.gz")


def test_step_chain_of_a_recorded_dump():
    if not os.path.exists(DUMP):
        pytest.skip(f"recorded dump {DUMP} not in this checkout")
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = [{CHAIN!r}, {DUMP!r}]; runpy.run_path({CHAIN!r}, run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()[1:]}
    assert set(lines) == {"turnwait", "issue", "issue2qk", "softmax", "post", "qk_from_turn", "idle"}
    # The recorded run: thousands of steady-state steps, a softmax of ~1,500 cycles (the point of the tool).
    assert int(lines["softmax"][-1]) > 1000
    assert 1000 < float(lines["softmax"][2]) < 2500


def test_step_chain_rejects_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = [{CHAIN!r}, {str(bad)!r}]; runpy.run_path({CHAIN!r}, run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "argument 'path'" in res.stderr
