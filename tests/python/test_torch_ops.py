"""torch.ops.openmla.*: schemas, fake implementations, torch.compile, opcheck and CUDA graphs.

Without a GPU (CI): the schemas (what each op declares it writes), the fake implementations on meta tensors
(shapes, dtypes, strides), argument errors, and torch.compile(fullgraph=True) of a decode step on meta tensors
(no graph break, both schedule styles). These skip with a reason where torch is not installed.
With a Hopper GPU (marker `gpu`): torch.library.opcheck of every op, torch.compile of a decode step against the
eager results (bitwise), CUDA-graph capture of the ops.
"""
import pytest

torch = pytest.importorskip("torch", reason="the torch custom ops need PyTorch, which is not installed here")

import openmla  # noqa: E402
from openmla import _torch_ops  # noqa: E402

gpu = pytest.mark.gpu
D_QK, D_V = 576, 512


def _op(name):
    return getattr(torch.ops.openmla, name).default


# ---------------------------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------------------------
def _written(name):
    return [a.name for a in _op(name)._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


@pytest.mark.parametrize("name,written", [
    ("get_mla_metadata", []),
    ("plan_schedule", []),
    ("flash_mla_with_kvcache", []),
    ("flash_mla_with_kvcache_out", ["out", "lse"]),
    ("quantize_kv_cache", []),
    ("quantize_kv_cache_out", ["out"]),
    ("dequantize_kv_cache", []),
    ("dequantize_kv_cache_out", ["out"]),
    ("append_kv_cache", ["cache"]),
    ("flash_mla_sparse_fwd", []),
    ("flash_mla_sparse_fwd_out", ["out", "max_logits", "lse"]),
    ("flash_attn_varlen_fwd", []),
    ("flash_attn_varlen_bwd", []),
    ("merge_attn_states", []),
    ("merge_attn_states_out", ["out", "lse_out"]),
])
def test_schema_declares_what_each_op_writes(name, written):
    assert _written(name) == written
    schema = _op(name)._schema
    returns = [str(r.type) for r in schema.returns]
    assert returns == {"get_mla_metadata": ["Tensor", "Tensor"], "plan_schedule": ["Tensor", "Tensor"],
                       "flash_mla_with_kvcache": ["Tensor", "Tensor"], "quantize_kv_cache": ["Tensor"],
                       "dequantize_kv_cache": ["Tensor"],
                       "flash_mla_sparse_fwd": ["Tensor", "Tensor", "Tensor"],
                       "flash_attn_varlen_fwd": ["Tensor", "Tensor"],
                       "flash_attn_varlen_bwd": ["Tensor", "Tensor", "Tensor"],
                       "merge_attn_states": ["Tensor", "Tensor"]}.get(name, [])


def test_every_op_is_registered_with_cuda_and_fake_kernels():
    assert set(_torch_ops.SCHEMAS) == {"get_mla_metadata", "plan_schedule", "flash_mla_with_kvcache",
                                       "flash_mla_with_kvcache_out", "quantize_kv_cache", "quantize_kv_cache_out",
                                       "dequantize_kv_cache", "dequantize_kv_cache_out", "append_kv_cache",
                                       "flash_mla_sparse_fwd", "flash_mla_sparse_fwd_out", "flash_attn_varlen_fwd",
                                       "flash_attn_varlen_bwd", "merge_attn_states", "merge_attn_states_out"}
    for name in _torch_ops.SCHEMAS:
        qualified = f"openmla::{name}"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CUDA"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Meta"), name


def test_decode_op_arguments_follow_flash_mla_with_kvcache():
    import inspect

    names = [a.name for a in _op("flash_mla_with_kvcache")._schema.arguments]
    # seqused_q (per-request query lengths) is not traced by torch.compile: the ops do not take it.
    python = [p for p in inspect.signature(openmla.flash_mla_with_kvcache).parameters if p != "seqused_q"]
    # The function's order, without the keyword-only out / lse (its keyword-only batch_invariant is the op's last
    # argument).
    assert names == python[:len(names)]
    # descale_q / descale_k (the FP8 dense cache, keyword-only, last) have no op yet: that path runs eagerly.
    assert [a.name for a in _op("flash_mla_with_kvcache_out")._schema.arguments] == \
        [n for n in python if n not in ("descale_q", "descale_k")]


# ---------------------------------------------------------------------------------------------------------------
# Fake implementations (meta tensors: no GPU needed)
# ---------------------------------------------------------------------------------------------------------------
def _meta_dense(b=4, s_q=2, h_q=64, h_kv=1, blocks=16):
    q = torch.empty((b, s_q, h_q, D_QK), dtype=torch.bfloat16, device="meta")
    k = torch.empty((blocks, 64, h_kv, D_QK), dtype=torch.bfloat16, device="meta")
    bt = torch.empty((b, 4), dtype=torch.int32, device="meta")
    lens = torch.empty((b,), dtype=torch.int32, device="meta")
    return q, k, bt, lens


def test_fake_metadata_shapes():
    _, _, _, lens = _meta_dense(b=4)
    md, ns = torch.ops.openmla.get_mla_metadata(lens, 2 * 64, 1)
    # 132 SMs assumed for meta tensors; 2 * 64 rows per KV head -> 2 m-blocks -> 66 partitions.
    assert md.shape == (66, 8) and md.dtype == torch.int32
    assert ns.shape == (5,) and ns.dtype == torch.int32
    md, ns = torch.ops.openmla.get_mla_metadata(lens, 2 * 128, 1, 128, True, 2048)
    assert md.shape == (33, 8) and ns.shape == (5,)  # sparse: 132 / s_q / ceil(h_q / 64)


def test_fake_metadata_argument_errors():
    _, _, _, lens = _meta_dense(b=4)
    with pytest.raises(ValueError, match="'num_heads_q' is required"):
        torch.ops.openmla.get_mla_metadata(lens, 128, 1, None, True, 2048)
    # is_fp8_kvcache without topk: the FP8 dense cache, whose schedule is dense decode's.
    fp8 = torch.ops.openmla.get_mla_metadata(lens, 128, 1, None, True)
    dense = torch.ops.openmla.get_mla_metadata(lens, 128, 1, None, False)
    assert [t.shape for t in fp8] == [t.shape for t in dense]


def test_fake_decode_outputs_have_flash_mlas_layout():
    q, k, bt, lens = _meta_dense(b=3, s_q=2, h_q=16)
    md, ns = torch.ops.openmla.get_mla_metadata(lens, 2 * 16, 1)
    out, lse = torch.ops.openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, md, ns, None, True)
    assert out.shape == (3, 2, 16, D_V) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == (3, 16, 2) and lse.dtype == torch.float32 and lse.stride() == (32, 1, 16)
    out2 = torch.empty_like(out)
    lse2 = torch.empty((3, 2, 16), dtype=torch.float32, device="meta").transpose(1, 2)
    assert torch.ops.openmla.flash_mla_with_kvcache_out(q, k, bt, lens, D_V, md, ns, out=out2, lse=lse2) is None


@pytest.mark.parametrize("fmt,page,bpt,stride", [("v32", 64, 656, 64 * 656), ("model1", 3, 584, 1760)])
def test_fake_kv_cache_ops(fmt, page, bpt, stride):
    d = 576 if fmt == "v32" else 512
    kv = torch.empty((5, page, 1, d), dtype=torch.bfloat16, device="meta")
    cache = torch.ops.openmla.quantize_kv_cache(kv, fmt)
    # The real function's layout: pages rounded up to 16 bytes.
    assert cache.shape == (5, page, 1, bpt) and cache.dtype == torch.uint8 and cache.stride() == (stride, bpt, bpt, 1)
    back = torch.ops.openmla.dequantize_kv_cache(cache, fmt)
    assert back.shape == (5, page, 1, d) and back.dtype == torch.bfloat16
    slots = torch.empty((7,), dtype=torch.int64, device="meta")
    assert torch.ops.openmla.append_kv_cache(torch.empty((7, d), dtype=torch.bfloat16, device="meta"), slots, cache,
                                             fmt) is None


def test_fake_sparse_prefill_outputs():
    q = torch.empty((100, 16, D_QK), dtype=torch.bfloat16, device="meta")
    kv = torch.empty((300, 1, D_QK), dtype=torch.bfloat16, device="meta")
    idx = torch.empty((100, 1, 64), dtype=torch.int32, device="meta")
    out, max_logits, lse = torch.ops.openmla.flash_mla_sparse_fwd(q, kv, idx, 0.04)
    assert out.shape == (100, 16, D_V) and out.dtype == torch.bfloat16
    assert max_logits.shape == lse.shape == (100, 16) and lse.dtype == max_logits.dtype == torch.float32


# ---------------------------------------------------------------------------------------------------------------
# torch.compile on meta tensors: the traced step has no graph break
# ---------------------------------------------------------------------------------------------------------------
def _compile_no_break(fn, *args):
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    return torch.compile(fn, fullgraph=True, backend="eager")(*args)


def test_compile_tensor_style_step_on_meta():
    q, k, bt, lens = _meta_dense()

    def step(q, k, bt, lens):
        md, ns = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        outs = [openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, md, ns, causal=True) for _ in range(2)]
        return outs[1][0] + outs[0][0], outs[1][1]

    out, lse = _compile_no_break(step, q, k, bt, lens)
    assert out.shape == (4, 2, 64, D_V) and lse.shape == (4, 64, 2)


def test_compile_object_style_step_on_meta():
    q, k, bt, lens = _meta_dense()

    def step(q, k, bt, lens):
        sched, _ = openmla.get_mla_metadata()
        out0, _ = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, sched, causal=True)
        out1, lse1 = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, sched, causal=True)
        return out0 + out1, lse1

    out, lse = _compile_no_break(step, q, k, bt, lens)
    assert out.shape == (4, 2, 64, D_V) and lse.shape == (4, 64, 2)


def test_compile_sparse_step_with_caller_outputs_on_meta():
    b, s_q, h_q, topk = 2, 1, 64, 128
    q = torch.empty((b, s_q, h_q, D_QK), dtype=torch.bfloat16, device="meta")
    cache = torch.empty((8, 64, 1, 656), dtype=torch.uint8, device="meta")
    idx = torch.empty((b, s_q, topk), dtype=torch.int32, device="meta")
    lengths = torch.empty((b,), dtype=torch.int32, device="meta")
    out = torch.empty((b, s_q, h_q, D_V), dtype=torch.bfloat16, device="meta")
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device="meta")

    def step(q, cache, idx, lengths, out, lse):
        sched, _ = openmla.get_mla_metadata()
        return openmla.flash_mla_with_kvcache(q, cache, None, None, D_V, sched, is_fp8_kvcache=True, indices=idx,
                                              topk_length=lengths, out=out, lse=lse)

    got_out, got_lse = _compile_no_break(step, q, cache, idx, lengths, out, lse)
    assert got_out.shape == out.shape and got_lse.shape == lse.shape


# ---------------------------------------------------------------------------------------------------------------
# GPU: opcheck, compile against eager, CUDA graphs
# ---------------------------------------------------------------------------------------------------------------
def _dense_inputs(b=4, s_q=2, h_q=64, h_kv=1, s_k=300, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = -(-s_k // 64)
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    k = (torch.randn((b * pages, 64, h_kv, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    bt = torch.randperm(b * pages, device="cuda").to(torch.int32).view(b, pages)
    lens = torch.randint(1, s_k + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    return q, k, bt, lens


def _sparse_inputs(b=2, s_q=2, h_q=64, topk=256, blocks=16, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda").clamp_(-1, 1).to(torch.bfloat16)
    kv = (torch.randn((blocks, 64, 1, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    cache = openmla.quantize_kv_cache(kv, "v32")
    idx = torch.randint(-1, blocks * 64, (b, s_q, topk), generator=g, device="cuda", dtype=torch.int32)
    lengths = torch.randint(0, topk + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    sink = torch.randn((h_q,), generator=g, device="cuda")
    return q, cache, idx, lengths, sink, kv


@gpu
def test_opcheck_every_op():
    from torch.library import opcheck

    q, k, bt, lens = _dense_inputs()
    md, ns = torch.ops.openmla.get_mla_metadata(lens, 2 * 64, 1)
    out = torch.empty((4, 2, 64, D_V), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((4, 2, 64), dtype=torch.float32, device="cuda").transpose(1, 2)
    sq, cache, idx, lengths, sink, kv = _sparse_inputs()
    smd, sns = torch.ops.openmla.get_mla_metadata(lengths, 2 * 64, 1, 64, True, 256)
    sout = torch.empty((2, 2, 64, D_V), dtype=torch.bfloat16, device="cuda")
    slse = torch.empty((2, 64, 2), dtype=torch.float32, device="cuda")
    new_kv = (torch.randn((5, D_QK), device="cuda") / 10).to(torch.bfloat16)
    slots = torch.tensor([0, 64, 65, -1, 1023], dtype=torch.int64, device="cuda")
    pq = (torch.randn((50, 64, D_QK), device="cuda") / 10).to(torch.bfloat16)
    pkv = (torch.randn((400, 1, D_QK), device="cuda") / 10).to(torch.bfloat16)
    pidx = torch.randint(-1, 400, (50, 1, 128), device="cuda", dtype=torch.int32)
    psink = torch.randn((64,), device="cuda")
    plens = torch.randint(0, 129, (50,), device="cuda", dtype=torch.int32)
    pout = torch.empty((50, 64, D_V), dtype=torch.bfloat16, device="cuda")
    pmax = torch.empty((50, 64), device="cuda")
    plse = torch.empty((50, 64), device="cuda")
    mouts = torch.randn((2, 8, 16, D_V), device="cuda").to(torch.bfloat16)
    mlses = torch.randn((2, 8, 16), device="cuda")
    mout = torch.empty((8, 16, D_V), dtype=torch.bfloat16, device="cuda")
    mlse = torch.empty((8, 16), device="cuda")
    cases = {
        "get_mla_metadata": [((lens, 2 * 64, 1), {}), ((lengths, 2 * 64, 1, 64, True, 256), {})],
        "plan_schedule": [((q, lens, None, None, 4, 2, 64, 1, False, 0, 0), {}),
                          ((sq, None, lengths, None, 2, 2, 64, 1, True, 256, 0), {})],
        "flash_mla_with_kvcache": [((q, k, bt, lens, D_V, md, ns, None, True), {}),
                                   ((sq, cache, None, None, D_V, smd, sns, None, False, True, idx, sink), {})],
        "flash_mla_with_kvcache_out": [((q, k, bt, lens, D_V, md, ns, None, True), {"out": out, "lse": lse}),
                                       ((sq, cache, None, None, D_V, smd, sns, None, False, True, idx, sink),
                                        {"out": sout, "lse": slse})],
        "quantize_kv_cache": [((kv, "v32"), {})],
        "quantize_kv_cache_out": [((kv, "v32"), {"out": torch.empty_like(cache)})],
        "dequantize_kv_cache": [((cache, "v32"), {})],
        "dequantize_kv_cache_out": [((cache, "v32"), {"out": torch.empty_like(kv)})],
        "append_kv_cache": [((new_kv, slots, cache.clone(), "v32"), {})],
        "flash_mla_sparse_fwd": [((pq, pkv, pidx, 0.04), {}), ((pq, pkv, pidx, 0.04, 512, psink, plens), {})],
        "flash_mla_sparse_fwd_out": [((pq, pkv, pidx, 0.04), {"out": pout, "max_logits": pmax, "lse": plse})],
        "merge_attn_states": [((mouts, mlses), {}), ((mouts, mlses, torch.float32), {})],
        "merge_attn_states_out": [((mouts, mlses), {"out": mout, "lse_out": mlse})],
    }
    # The dense MHA ops are opchecked with their own inputs in test_mha_prefill_bwd.py.
    assert set(cases) == set(_torch_ops.SCHEMAS) - {"flash_attn_varlen_fwd", "flash_attn_varlen_bwd"}
    for name, calls in cases.items():
        for args, kwargs in calls:
            opcheck(_op(name), args, kwargs)


@gpu
@pytest.mark.parametrize("style", ["object", "tensor"])
def test_compiled_dense_step_equals_eager(style):
    q, k, bt, lens = _dense_inputs(b=6, s_q=2, h_q=128, s_k=3000)
    q1 = (q.float() * 0.5).to(torch.bfloat16)

    def step(q, q1, k, bt, lens):
        if style == "object":
            sched, splits = openmla.get_mla_metadata()
        else:
            sched, splits = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        out0, lse0 = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, sched, splits, causal=True)
        out1, lse1 = openmla.flash_mla_with_kvcache(q1, k, bt, lens, D_V, sched, splits, causal=True)
        return out0, lse0, out1, lse1

    eager = step(q, q1, k, bt, lens)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(q, q1, k, bt, lens)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


@gpu
def test_compiled_sparse_step_equals_eager():
    q, cache, idx, lengths, sink, _ = _sparse_inputs(b=3, h_q=128)

    def step(q, cache, idx, lengths, sink):
        sched, _ = openmla.get_mla_metadata()
        return openmla.flash_mla_with_kvcache(q, cache, None, None, D_V, sched, is_fp8_kvcache=True, indices=idx,
                                              topk_length=lengths, attn_sink=sink)

    eager = step(q, cache, idx, lengths, sink)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(q, cache, idx, lengths, sink)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@gpu
def test_ops_capture_in_a_cuda_graph():
    q, k, bt, lens = _dense_inputs(b=5, s_q=1, h_q=64, s_k=2000)
    eager_md, eager_ns = torch.ops.openmla.get_mla_metadata(lens, 64, 1)
    eager = torch.ops.openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, eager_md, eager_ns, None, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        md, ns = torch.ops.openmla.get_mla_metadata(lens, 64, 1)
        out, lse = torch.ops.openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, md, ns, None, True)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    # New lengths in place: the captured plan recomputes the schedule.
    lens.copy_(torch.randint(1, 2001, lens.shape, device="cuda", dtype=torch.int32))
    graph.replay()
    md2, ns2 = torch.ops.openmla.get_mla_metadata(lens, 64, 1)
    again = torch.ops.openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, md2, ns2, None, True)
    torch.cuda.synchronize()
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])


@gpu
def test_op_argument_errors_name_the_argument():
    q, k, bt, lens = _dense_inputs()
    md, ns = torch.ops.openmla.get_mla_metadata(lens, 2 * 64, 1)
    with pytest.raises(ValueError, match="'block_table'"):
        torch.ops.openmla.flash_mla_with_kvcache(q, k, bt.long(), lens, D_V, md, ns, None, True)
    with pytest.raises(ValueError, match="metadata"):
        torch.ops.openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, md[:-1], ns, None, True)
