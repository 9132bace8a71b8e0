"""merge_attn_states (include/openmla/merge.h, python/openmla/merge.py).

Without a GPU: argument errors through the binding (fake CUDA arrays: every error comes before any CUDA call) and the
package function; with torch, the fake implementation of the torch op on meta tensors.
With a Hopper GPU (marker `gpu`): the kernel against a float64 torch reference of the formula (docs/merge-states.md)
and against the CPU reference (reference/src/merge.cpp), every input x output dtype, d_v 512 / 128 / 8 / 1032,
1 to 40 partials, empty partials (+inf and -inf, NaN in their outputs), all-empty rows (exactly 0 and +inf), NaN lse,
strided inputs, lists, NaN-poisoned outputs (every element written), bitwise determinism, CUDA-graph capture.
"""
import math

import numpy as np
import pytest

import openmla
from openmla import _openmla as C
from test_decode_api import fake_cuda

gpu = pytest.mark.gpu


# ---------------------------------------------------------------------------------------------------------------
# Argument errors (no GPU, no torch): the C++ API's messages, unchanged
# ---------------------------------------------------------------------------------------------------------------
def _args(**change):
    a = dict(outs=lambda: fake_cuda((2, 4, 16, 512)), lses=lambda: fake_cuda((2, 4, 16), "fp32"),
             out=lambda: fake_cuda((4, 16, 512)), lse_out=lambda: fake_cuda((4, 16), "fp32"))
    a.update(change)
    return {k: (v() if v is not None else None) for k, v in a.items()}


@pytest.mark.parametrize("change,message", [
    (dict(outs=lambda: fake_cuda((2, 4, 16, 512), "int32")), r"argument 'outs' has dtype int32"),
    (dict(outs=lambda: fake_cuda((0, 4, 16, 512))), r"argument 'outs' has 0 partials .*at least 1"),
    (dict(outs=lambda: fake_cuda((2, 4, 16, 500))), r"argument 'outs' has d_v = 500 .*multiple of 8"),
    (dict(outs=lambda: fake_cuda((2, 4, 16, 512), strides=[4 * 16 * 520, 16 * 520, 516, 1])),
     r"argument 'outs' has stride 516 in dimension 2"),
    (dict(lses=lambda: fake_cuda((2, 4, 16), "bf16")), r"argument 'lses' has dtype bfloat16, expected float32"),
    (dict(lses=lambda: fake_cuda((3, 4, 16), "fp32")), r"argument 'lses' has size 3 in dimension 0 \(partials\)"),
    (dict(out=lambda: fake_cuda((4, 16, 256))), r"argument 'out' has size 256 in dimension 2 \(d_v\)"),
    (dict(out=lambda: fake_cuda((4, 16, 512), "int32")), r"argument 'out' has dtype int32"),
    (dict(lse_out=lambda: fake_cuda((4, 8), "fp32")), r"argument 'lse_out' has size 8 in dimension 1"),
    (dict(lse_out=lambda: fake_cuda((4, 16), "fp32", device_id=1)), r"argument 'lse_out' is on cuda:1"),
])
def test_argument_errors_name_the_argument(change, message):
    a = _args(**change)
    with pytest.raises(ValueError, match=message):
        C.merge_attn_states(a["outs"], a["lses"], a["out"], a["lse_out"])


def test_host_arrays_are_refused():
    outs = np.zeros((2, 4, 16, 512), dtype=np.float32)
    with pytest.raises(ValueError, match=r"argument 'outs' must be a CUDA tensor"):
        openmla.merge_attn_states(outs, np.zeros((2, 4, 16), np.float32), out=np.zeros((4, 16, 512), np.float32),
                                  lse_out=np.zeros((4, 16), np.float32))


def test_exported_with_its_feature():
    assert "merge_attn_states" in openmla.FEATURES
    assert "merge_attn_states" in openmla.__all__
    ok, why = openmla.query_capability("merge_attn_states")
    assert ok or why.startswith("merge_attn_states: ")


def test_fake_implementation_on_meta_tensors():
    torch = pytest.importorskip("torch", reason="the torch op needs PyTorch, which is not installed here")
    outs = torch.empty((3, 5, 16, 512), dtype=torch.bfloat16, device="meta")
    lses = torch.empty((3, 5, 16), dtype=torch.float32, device="meta")
    out, lse = torch.ops.openmla.merge_attn_states(outs, lses, torch.float32)
    assert out.shape == (5, 16, 512) and out.dtype == torch.float32 and out.device.type == "meta"
    assert lse.shape == (5, 16) and lse.dtype == torch.float32
    out, lse = torch.ops.openmla.merge_attn_states(outs, lses)
    assert out.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _torch():
    import torch

    return torch


def merge_ref(outs, lses):
    """float64 torch reference of docs/merge-states.md: (out (T, H, D) float64, lse (T, H) float64)."""
    torch = _torch()
    o, l = outs.double(), lses.double()
    empty = torch.isinf(l)
    finite = torch.where(empty | torch.isnan(l), torch.full_like(l, -math.inf), l)
    m = finite.amax(0)
    shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.where(empty, torch.zeros_like(l), torch.exp(l - shift))
    s = w.sum(0)
    o = torch.where(empty[..., None], torch.zeros_like(o), o)
    out = (w[..., None] * o).sum(0) / s[..., None]
    some = ~empty.all(0)
    out = torch.where(some[..., None], out, torch.zeros_like(out))
    lse = torch.where(some, shift + torch.log(s), torch.full_like(s, math.inf))
    return out, lse


def make_states(P, T, H, D, dtype, seed, empty_frac=0.2, device="cuda"):
    """Partial outputs ~ U(-1, 1) and lse ~ U(-6, 6); about `empty_frac` of the partials empty (half +inf, half
    -inf) with NaN in their outputs; token 0 of every head empty in every partial."""
    torch = _torch()
    g = torch.Generator(device="cpu").manual_seed(seed)
    outs = (torch.rand((P, T, H, D), generator=g) * 2 - 1)
    lses = torch.rand((P, T, H), generator=g) * 12 - 6
    pick = torch.rand((P, T, H), generator=g)
    lses[pick < empty_frac / 2] = math.inf
    lses[(pick >= empty_frac / 2) & (pick < empty_frac)] = -math.inf
    lses[:, 0] = math.inf
    lses[0, 0] = -math.inf
    outs[torch.isinf(lses)] = math.nan
    return outs.to(device=device, dtype=dtype), lses.to(device)


def _poisoned(shape, dtype):
    torch = _torch()
    return torch.full(shape, math.nan, dtype=dtype, device="cuda")


def _tol(dtype):
    torch = _torch()
    if dtype == torch.float32:
        return dict(abs_tol=2e-5, rel_tol=1e-4, cos_diff_tol=1e-8)
    return dict(abs_tol=8e-4, rel_tol=2.01 / 128, cos_diff_tol=5e-6)  # the dense decode out tolerance


def check(out, lse, outs, lses, what=""):
    from dense_decode_ref import LSE_TOL, check_is_allclose

    ref_out, ref_lse = merge_ref(outs, lses)
    # An empty row is exactly 0 and +inf, not close to it.
    empty_rows = torch_isinf_all(lses)
    assert (out.float()[empty_rows] == 0).all(), what
    assert (lse[empty_rows] == math.inf).all(), what
    check_is_allclose(f"out {what}", out.float(), ref_out.to(out.dtype).float(), **_tol(out.dtype))
    check_is_allclose(f"lse {what}", lse, ref_lse.float(), **LSE_TOL)


def torch_isinf_all(lses):
    return _torch().isinf(lses).all(0)


DTYPES = ("bfloat16", "float16", "float32")


@gpu
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_every_dtype_pair(in_dtype, out_dtype):
    torch = _torch()
    ti, to = getattr(torch, in_dtype), getattr(torch, out_dtype)
    outs, lses = make_states(3, 33, 16, 512, ti, seed=1)
    out, lse = _poisoned((33, 16, 512), to), _poisoned((33, 16), torch.float32)
    res = openmla.merge_attn_states(outs, lses, out=out, lse_out=lse)
    assert res[0] is out and res[1] is lse
    assert not out.isnan().any() and not lse.isnan().any()  # every element written
    check(out, lse, outs, lses, f"{in_dtype} -> {out_dtype}")


@gpu
@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8, 33, 40])
@pytest.mark.parametrize("D", [512, 128, 8, 1032])
def test_partials_and_head_dims(P, D):
    torch = _torch()
    outs, lses = make_states(P, 7, 5, D, torch.bfloat16, seed=P * 1000 + D)
    out, lse = openmla.merge_attn_states(outs, lses, out_dtype=torch.float32)
    check(out, lse, outs, lses, f"P={P} D={D}")


@gpu
def test_decode_sized_batch_bitwise_deterministic():
    torch = _torch()
    outs, lses = make_states(4, 128, 128, 512, torch.bfloat16, seed=7)
    out, lse = openmla.merge_attn_states(outs, lses)
    check(out, lse, outs, lses, "b 128 h 128")
    for _ in range(3):
        again, again_lse = openmla.merge_attn_states(outs, lses)
        assert torch.equal(again.view(torch.int16), out.view(torch.int16))
        assert torch.equal(again_lse.view(torch.int32), lse.view(torch.int32))


@gpu
def test_against_the_cpu_reference():
    torch = _torch()
    from openmla import reference as R

    outs, lses = make_states(5, 6, 3, 136, torch.bfloat16, seed=3)
    out, lse = openmla.merge_attn_states(outs, lses, out_dtype=torch.float32)
    o = outs.float().permute(1, 2, 0, 3).cpu().numpy()  # (T, H, P, D) rows of the reference
    l = lses.permute(1, 2, 0).cpu().numpy()
    ref_out, ref_lse = R.merge_partials(o, l, lse_base="e", dtype=np.float64)
    np.testing.assert_allclose(out.cpu().numpy(), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isinf(lse.cpu().numpy()), np.isinf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse.cpu().numpy()[finite], ref_lse[finite], rtol=1e-6, atol=1e-6)


@gpu
def test_empty_and_nan_rows():
    torch = _torch()
    outs = torch.full((3, 4, 2, 128), math.nan, dtype=torch.bfloat16, device="cuda")
    inf = math.inf
    lses = torch.tensor([[[inf, -inf], [0.5, inf], [math.nan, 0.0], [inf, 1.0]],
                         [[-inf, inf], [inf, -inf], [0.0, 0.0], [-inf, inf]],
                         [[inf, inf], [-inf, -inf], [-inf, inf], [inf, inf]]], device="cuda")
    outs[0, 1, 0] = 0.75
    outs[0, 2, 1] = 1.0
    outs[1, 2, :] = -1.0
    outs[0, 3, 1] = 0.5
    out, lse = openmla.merge_attn_states(outs, lses, out_dtype=torch.float32)
    # Row (0, *): every partial empty -> exactly 0 and +inf.
    assert (out[0] == 0).all() and (lse[0] == inf).all()
    # Row (1, 0): only partial 0 (lse 0.5) -> its output, lse 0.5; row (1, 1): all empty.
    assert (out[1, 0] == 0.75).all() and lse[1, 0].item() == pytest.approx(0.5)
    assert (out[1, 1] == 0).all() and lse[1, 1].item() == inf
    # Row (2, 0): a NaN lse -> NaN row. Row (2, 1): partials 0 (1.0) and 1 (-1.0) at equal weight -> 0, lse ln 2.
    assert out[2, 0].isnan().all() and math.isnan(lse[2, 0].item())
    assert (out[2, 1] == 0).all() and lse[2, 1].item() == pytest.approx(math.log(2.0))
    # Row (3, 1): partial 0 only.
    assert (out[3, 1] == 0.5).all() and lse[3, 1].item() == pytest.approx(1.0)


@gpu
def test_strided_inputs_and_lists():
    torch = _torch()
    P, b, s_q, H, D = 2, 6, 2, 16, 512
    outs, _ = make_states(P, b * s_q, H, D, torch.bfloat16, seed=11)
    outs = torch.nan_to_num(outs)  # the lse below is finite where make_states left NaN
    # lse as decode returns it: (b, h, s_q) views of (b, s_q, h) storage, per partial.
    lse_storage = torch.randn((P, b, s_q, H), device="cuda")
    lse_storage[:, 0] = math.inf
    lse_views = [lse_storage[i].transpose(1, 2) for i in range(P)]  # (b, H, s_q)
    lses = torch.stack([v.transpose(1, 2).reshape(b * s_q, H) for v in lse_views])
    # outs as a slice of wider rows (stride of a head 1024 elements).
    wide = torch.full((P, b * s_q, H, 2 * D), math.nan, dtype=torch.bfloat16, device="cuda")
    wide[..., :D] = outs
    out, lse = openmla.merge_attn_states(wide[..., :D], lses)
    check(out, lse, outs, lses, "strided")
    listed, listed_lse = openmla.merge_attn_states(list(outs), list(lses))
    assert torch.equal(listed, out) and torch.equal(listed_lse, lse)
    # lses given with transposed strides (tokens fastest).
    lses_t = lses.transpose(1, 2).contiguous().transpose(1, 2)
    out_t, lse_t = openmla.merge_attn_states(outs, lses_t)
    assert torch.equal(out_t, out) and torch.equal(lse_t, lse)


@gpu
def test_python_argument_errors():
    torch = _torch()
    outs, lses = make_states(2, 4, 16, 512, torch.bfloat16, seed=5)
    with pytest.raises(ValueError, match=r"argument 'outs' is an empty list"):
        openmla.merge_attn_states([], lses)
    with pytest.raises(ValueError, match=r"argument 'out_dtype'"):
        openmla.merge_attn_states(outs, lses, out=torch.empty((4, 16, 512), dtype=torch.bfloat16, device="cuda"),
                                  out_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"argument 'out' overlaps argument 'outs'"):
        openmla.merge_attn_states(outs, lses, out=outs[0])


@gpu
def test_cuda_graph_capture():
    torch = _torch()
    outs, lses = make_states(4, 32, 128, 512, torch.bfloat16, seed=9)
    out = torch.empty((32, 128, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((32, 128), dtype=torch.float32, device="cuda")
    eager, eager_lse = openmla.merge_attn_states(outs, lses)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        openmla.merge_attn_states(outs, lses, out=out, lse_out=lse)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        openmla.merge_attn_states(outs, lses, out=out, lse_out=lse)
    out.fill_(math.nan)
    lse.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)
    new_outs, new_lses = make_states(4, 32, 128, 512, torch.bfloat16, seed=10)
    outs.copy_(new_outs)
    lses.copy_(new_lses)
    graph.replay()
    torch.cuda.synchronize()
    check(out, lse, outs, lses, "graph replay")


@gpu
def test_torch_op_opcheck_and_compile():
    torch = _torch()
    outs, lses = make_states(2, 8, 16, 512, torch.bfloat16, seed=12)
    out = torch.empty((8, 16, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((8, 16), dtype=torch.float32, device="cuda")
    torch.library.opcheck(torch.ops.openmla.merge_attn_states.default, (outs, lses, torch.float32))
    torch.library.opcheck(torch.ops.openmla.merge_attn_states_out.default, (outs, lses), dict(out=out, lse_out=lse))
    eager = openmla.merge_attn_states(outs, lses)
    compiled = torch.compile(lambda o, l: openmla.merge_attn_states(o, l), fullgraph=True)(outs, lses)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
