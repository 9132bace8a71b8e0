"""Argument checking of the dense MHA prefill backward binding (openmla._openmla.mha_prefill_bwd), without a GPU and
without torch.

As test_mha_prefill_api.py does for the forward: every check of the C++ API runs before its first CUDA call
(src/api/mha_prefill_bwd.cpp), so bad calls are exercised with "CUDA" arrays that are really host memory
(test_decode_api.fake_cuda). Nothing ever dereferences them: each call below is rejected by validation. The messages
are the C++ ones (tests/cpp/test_mha_prefill_bwd_api.cpp checks every one of them); here: that they arrive unchanged,
as the right exception, naming the argument.
"""
import numpy as np
import pytest

from openmla import _openmla as C
from test_decode_api import _real_cuda_device_present, fake_cuda

pytestmark = pytest.mark.skipif(
    _real_cuda_device_present(),
    reason="validation-only tests with fake device pointers; they run on machines without a GPU")

PROBLEM = dict(batch=2, total_q=300, h_q=8, h_kv=2, d_qk=192, d_v=128, dtype="bfloat16", causal=True,
               deterministic=False, num_sms=132)
WORKSPACE_BYTES = C.get_mha_prefill_bwd_workspace_size(**PROBLEM)


def args(**overrides):
    """Positional arguments of C.mha_prefill_bwd for PROBLEM (fake CUDA arrays: 300 query rows, 500 key rows)."""
    make = {
        "q": lambda: fake_cuda((300, 8, 192)),
        "k": lambda: fake_cuda((500, 2, 192)),
        "v": lambda: fake_cuda((500, 2, 128)),
        "out": lambda: fake_cuda((300, 8, 128)),
        "dout": lambda: fake_cuda((300, 8, 128)),
        "lse": lambda: fake_cuda((300, 8), "fp32", strides=[1, 300]),
        "cu_seqlens_qo": lambda: fake_cuda((3,), "int32"),
        "cu_seqlens_kv": lambda: fake_cuda((3,), "int32"),
        "workspace": lambda: fake_cuda((WORKSPACE_BYTES,), "uint8", align=256),
        "dq": lambda: fake_cuda((300, 8, 192)),
        "dk": lambda: fake_cuda((500, 2, 192)),
        "dv": lambda: fake_cuda((500, 2, 128)),
    }
    return [overrides[name] if name in overrides else make[name]() for name in make]


@pytest.mark.parametrize("override,problem,exc,pattern", [
    (dict(q=fake_cuda((300, 8, 192), "fp16")), {}, ValueError, r"argument 'q' has dtype float16, expected bfloat16"),
    (dict(q=fake_cuda((299, 8, 192))), {}, ValueError, r"argument 'q' has size 299 in dimension 0 \(problem.total_q\)"),
    (dict(k=fake_cuda((500, 3, 192))), {}, ValueError, r"argument 'k' has size 3 in dimension 1 \(h_kv\)"),
    (dict(v=fake_cuda((499, 2, 128))), {}, ValueError, r"argument 'v' has size 499 in dimension 0"),
    (dict(out=fake_cuda((300, 8, 192))), {}, ValueError, r"argument 'out' has size 192 in dimension 2 \(d_v\)"),
    (dict(dout=fake_cuda((300, 8, 128), "fp32")), {}, ValueError, r"argument 'dout' has dtype float32"),
    (dict(dout=fake_cuda((300, 8, 128), strides=[0, 0, 1])), {}, ValueError, r"argument 'dout' has stride 0"),
    (dict(lse=fake_cuda((300, 8), "bf16")), {}, ValueError, r"argument 'lse' has dtype bfloat16"),
    (dict(cu_seqlens_qo=fake_cuda((3,), "int64")), {}, ValueError, r"argument 'cu_seqlens_qo' has dtype int64"),
    (dict(cu_seqlens_kv=fake_cuda((4,), "int32")), {}, ValueError, r"argument 'cu_seqlens_kv' has size 4"),
    (dict(workspace=fake_cuda((8,), "uint8", align=256)), {}, ValueError,
     rf"argument 'workspace' has 8 bytes; get_mha_prefill_bwd_workspace_size asks for {WORKSPACE_BYTES}"),
    (dict(dq=fake_cuda((300, 8, 128))), {}, ValueError, r"argument 'dq' has size 128 in dimension 2 \(d_qk\)"),
    (dict(dk=fake_cuda((500, 2, 192), "fp16")), {}, ValueError, r"argument 'dk' has dtype float16"),
    (dict(dv=fake_cuda((500, 2, 128), device_id=1)), {}, ValueError, r"all tensors must be on the same device"),
    (dict(q=np.zeros((300, 8, 192), dtype=np.float16)), {"dtype": "float16"}, ValueError,
     r"argument 'q' must be a CUDA tensor"),
    ({}, {"h_q": 7}, ValueError, r"argument 'problem.h_q' is 7"),
    ({}, {"total_q": -1}, ValueError, r"argument 'problem.total_q' is -1"),
    ({}, {"d_qk": 576}, NotImplementedError, r"\(d_qk, d_v\) = \(192, 128\) or \(128, 128\)"),
])
def test_errors_arrive_unchanged(override, problem, exc, pattern):
    with pytest.raises(exc, match=pattern):
        C.mha_prefill_bwd(*args(**override), softmax_scale=0.0, stream=0, **dict(PROBLEM, **problem))


def test_bad_softmax_scale_and_dtype_name():
    with pytest.raises(ValueError, match=r"argument 'softmax_scale' is -2"):
        C.mha_prefill_bwd(*args(), softmax_scale=-2.0, stream=0, **PROBLEM)
    with pytest.raises(ValueError, match=r"argument 'dtype': unknown dtype name 'bf17'"):
        C.mha_prefill_bwd(*args(), softmax_scale=0.0, stream=0, **dict(PROBLEM, dtype="bf17"))


def test_workspace_size():
    assert WORKSPACE_BYTES >= 8 * (300 + 64 * 2 + 64) * 192 * 4  # the fp32 dq accumulator at least
    assert C.get_mha_prefill_bwd_workspace_size(**dict(PROBLEM, causal=False, deterministic=True)) == WORKSPACE_BYTES
    with pytest.raises(ValueError, match=r"argument 'problem.batch' is 0"):
        C.get_mha_prefill_bwd_workspace_size(**dict(PROBLEM, batch=0))
    with pytest.raises(NotImplementedError, match=r"\(d_qk, d_v\)"):
        C.get_mha_prefill_bwd_workspace_size(**dict(PROBLEM, d_v=512))
    with pytest.raises(ValueError, match=r"argument 'dtype': unknown dtype name"):
        C.get_mha_prefill_bwd_workspace_size(**dict(PROBLEM, dtype="int4"))
