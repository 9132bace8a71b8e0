"""Build options through the binding, without a GPU and without torch.

A build may leave a kernel family out (CMake OPENMLA_ENABLE_<FAMILY>=OFF). Then every entry point of the family raises
NotImplementedError naming the entry, the family and the option, after its argument checks (src/api/families.h), and
query_capability says "compiled out" with the option. A trace build (OPENMLA_TRACE=ON) binds the trace reader _trace;
reading the trace of an absent family's kernel raises the same way (src/api/trace.h). The calls use fake CUDA arrays
(test_decode_api.fake_cuda) with num_sms given, so a family that is absent answers before any CUDA call; a built
family's call would reach the device, so its case is skipped. In the default build every family is there: these tests
run for real on the family-off build of tools/test.sh (every family off, OPENMLA_TRACE on).
"""
import re

import pytest

from openmla import _openmla as C
from test_decode_api import _real_cuda_device_present, fake_cuda

pytestmark = pytest.mark.skipif(
    _real_cuda_device_present(),
    reason="validation-only tests with fake device pointers; they run on machines without a GPU")

OPTION = {  # capability feature -> the CMake option of its family
    "kv_cache_quantize": "OPENMLA_ENABLE_KV_CACHE",
    "dense_decode": "OPENMLA_ENABLE_DENSE_DECODE",
    "sparse_decode": "OPENMLA_ENABLE_DENSE_DECODE",
    "sparse_prefill": "OPENMLA_ENABLE_SPARSE_PREFILL",
    "dense_prefill": "OPENMLA_ENABLE_MHA_PREFILL",
    "merge_attn_states": "OPENMLA_ENABLE_MERGE_STATES",
}


def compiled_out(feature):
    return "compiled out" in C.query_capability(feature)[1]


def expect_not_built(feature, entry, call):
    if not compiled_out(feature):
        pytest.skip(f"{feature} is built: a valid call would reach the device")
    with pytest.raises(NotImplementedError,
                       match=rf"^{entry}: this build has no .+ \(CMake {OPTION[feature]}=OFF\)$"):
        call()


@pytest.mark.parametrize("feature", sorted(OPTION))
def test_capability_names_the_option(feature):
    supported, reason = C.query_capability(feature)
    if compiled_out(feature):
        assert not supported
        assert reason == f"{feature}: compiled out ({OPTION[feature]}=OFF)"


# ---- Decode: b = 2, s_q = 2; dense h_q 16 (132 partitions), sparse h_q 128 over a V3.2 cache ---------------------
DENSE = dict(batch=2, s_q=2, h_q=16, h_kv=1, d_qk=576, d_v=512, page_block_size=64, cache_format="bf16", causal=True,
             num_sms=132)
SPARSE = dict(batch=2, s_q=2, h_q=128, h_kv=1, d_qk=576, d_v=512, page_block_size=64, cache_format="fp8_v32",
              sparse=True, topk=128, num_sms=132)


def schedule(p):
    sizes = C.get_decode_workspace_sizes(**p)
    return (fake_cuda((sizes["num_sm_parts"], 8), "int32"), fake_cuda((p["batch"] + 1,), "int32"),
            fake_cuda((sizes["partial_rows"], 512), "fp32"), fake_cuda((sizes["partial_rows"],), "fp32"))


def outputs(p):
    b, s_q, h_q = p["batch"], p["s_q"], p["h_q"]
    return fake_cuda((b, s_q, h_q, 512)), fake_cuda((b, h_q, s_q), "fp32", strides=[s_q * h_q, 1, h_q])


def test_plan_decode_dense():
    meta, splits, _, _ = schedule(DENSE)
    expect_not_built("dense_decode", "plan_decode",
                     lambda: C.plan_decode(fake_cuda((2,), "int32"), meta, splits, **DENSE))


def test_plan_decode_sparse():
    meta, splits, _, _ = schedule(SPARSE)
    expect_not_built("sparse_decode", "plan_decode", lambda: C.plan_decode(None, meta, splits, **SPARSE))


def test_dense_decode():
    meta, splits, partial_o, partial_lse = schedule(DENSE)
    out, lse = outputs(DENSE)
    expect_not_built("dense_decode", "dense_decode", lambda: C.dense_decode(
        fake_cuda((2, 2, 16, 576)), fake_cuda((10, 64, 1, 576)), fake_cuda((2, 8), "int32"), fake_cuda((2,), "int32"),
        meta, splits, partial_o, partial_lse, out, lse, **DENSE))


def test_sparse_decode():
    meta, splits, partial_o, partial_lse = schedule(SPARSE)
    out, lse = outputs(SPARSE)
    expect_not_built("sparse_decode", "sparse_decode", lambda: C.sparse_decode(
        fake_cuda((2, 2, 128, 576)), fake_cuda((10, 64, 1, 656), "uint8"), fake_cuda((2, 2, 128), "int32"),
        meta, splits, partial_o, partial_lse, out, lse, **SPARSE))


# ---- FP8 KV-cache codec: 4 pages of 64 tokens, V3.2 layout ---------------------------------------------------------
def test_kv_cache_quantize():
    expect_not_built("kv_cache_quantize", "quantize_kv_cache", lambda: C.kv_cache_quantize(
        fake_cuda((4, 64, 1, 576)), fake_cuda((4, 64, 1, 656), "uint8"), "v32"))


def test_kv_cache_dequantize():
    expect_not_built("kv_cache_quantize", "dequantize_kv_cache", lambda: C.kv_cache_dequantize(
        fake_cuda((4, 64, 1, 656), "uint8"), fake_cuda((4, 64, 1, 576)), "v32"))


def test_kv_cache_append():
    expect_not_built("kv_cache_quantize", "append_kv_cache", lambda: C.kv_cache_append(
        fake_cuda((3, 576)), fake_cuda((3,), "int32"), fake_cuda((4, 64, 1, 656), "uint8"), "v32"))


# ---- Prefill -------------------------------------------------------------------------------------------------------
def test_sparse_prefill():
    expect_not_built("sparse_prefill", "sparse_prefill", lambda: C.sparse_prefill(
        fake_cuda((100, 64, 576)), fake_cuda((4096, 1, 576)), fake_cuda((100, 1, 256), "int32"),
        fake_cuda((100, 64, 512)), fake_cuda((100, 64), "fp32"), fake_cuda((100, 64), "fp32")))


def test_mha_prefill():
    expect_not_built("dense_prefill", "mha_prefill", lambda: C.mha_prefill(
        fake_cuda((300, 8, 192)), fake_cuda((500, 2, 192)), fake_cuda((500, 2, 128)), fake_cuda((3,), "int32"),
        fake_cuda((3,), "int32"), fake_cuda((16,), "uint8"), fake_cuda((300, 8, 128)),
        fake_cuda((300, 8), "fp32", strides=[1, 300]),
        batch=2, h_q=8, h_kv=2, d_qk=192, d_v=128, dtype="bfloat16", causal=True, num_sms=132))


def test_mha_prefill_bwd():
    problem = dict(batch=2, total_q=300, h_q=8, h_kv=2, d_qk=192, d_v=128, dtype="bfloat16", causal=True,
                   deterministic=True, num_sms=132)
    workspace = C.get_mha_prefill_bwd_workspace_size(**problem)  # host-only: answers in every build
    expect_not_built("dense_prefill", "mha_prefill_bwd", lambda: C.mha_prefill_bwd(
        fake_cuda((300, 8, 192)), fake_cuda((500, 2, 192)), fake_cuda((500, 2, 128)), fake_cuda((300, 8, 128)),
        fake_cuda((300, 8, 128)), fake_cuda((300, 8), "fp32", strides=[1, 300]), fake_cuda((3,), "int32"),
        fake_cuda((3,), "int32"), fake_cuda((workspace,), "uint8", align=256), fake_cuda((300, 8, 192)),
        fake_cuda((500, 2, 192)), fake_cuda((500, 2, 128)), softmax_scale=0.0, **problem))


# ---- Merge ---------------------------------------------------------------------------------------------------------
def test_merge_attn_states():
    expect_not_built("merge_attn_states", "merge_attn_states", lambda: C.merge_attn_states(
        fake_cuda((2, 4, 16, 512)), fake_cuda((2, 4, 16), "fp32"), fake_cuda((4, 16, 512)),
        fake_cuda((4, 16), "fp32")))


def test_argument_errors_come_first():
    # The caller's mistake is named in every build, before the family's answer.
    with pytest.raises(ValueError, match=r"argument 'q' has dtype float32"):
        C.mha_prefill(
            fake_cuda((300, 8, 192), "fp32"), fake_cuda((500, 2, 192)), fake_cuda((500, 2, 128)),
            fake_cuda((3,), "int32"), fake_cuda((3,), "int32"), fake_cuda((16,), "uint8"), fake_cuda((300, 8, 128)),
            fake_cuda((300, 8), "fp32", strides=[1, 300]),
            batch=2, h_q=8, h_kv=2, d_qk=192, d_v=128, dtype="bfloat16", num_sms=132)
    with pytest.raises(ValueError, match=r"argument 'dst'"):
        C.kv_cache_quantize(fake_cuda((4, 64, 1, 576)), fake_cuda((5, 64, 1, 656), "uint8"), "v32")
    with pytest.raises(ValueError, match=r"argument 'lses' has size 8 in dimension 2"):
        C.merge_attn_states(fake_cuda((2, 4, 16, 512)), fake_cuda((2, 4, 8), "fp32"), fake_cuda((4, 16, 512)))


# ---- The trace reader (trace builds only) ---------------------------------------------------------------------------
TRACED = [  # (kernel, feature of its family)
    ("dense_decode", "dense_decode"),
    ("sparse_decode", "sparse_decode"),
    ("sparse_prefill", "sparse_prefill"),
    ("mha_prefill", "dense_prefill"),
]


@pytest.mark.parametrize("clear", [False, True], ids=["read", "clear"])
@pytest.mark.parametrize("kernel,feature", TRACED, ids=[k for k, _ in TRACED])
def test_trace_of_an_absent_family(kernel, feature, clear):
    if not hasattr(C, "_trace"):
        pytest.skip("not a trace build (CMake OPENMLA_TRACE=OFF): the module has no trace reader")
    expect_not_built(feature, re.escape(f"{kernel}_trace"), lambda: C._trace(kernel, clear=clear))


def test_trace_names_an_unknown_kernel():
    if not hasattr(C, "_trace"):
        pytest.skip("not a trace build (CMake OPENMLA_TRACE=OFF): the module has no trace reader")
    with pytest.raises(ValueError, match=r"argument 'kernel': no traced kernel 'dense_prefill'"):
        C._trace("dense_prefill")
