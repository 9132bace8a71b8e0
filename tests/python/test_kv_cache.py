"""FP8 KV-cache codec through Python.

Without a GPU: argument errors surface as ValueError with the C++ message (numpy host arrays; no torch needed),
and the CPU codec binding round-trips. With a Hopper GPU (``gpu`` marker, torch imported inside the tests): GPU
quantise / dequantise / append are bit-identical to the CPU codec for both layouts, page sizes
{1, 2, 53, 64, 69, 256}, non-contiguous page strides and bf16 strides, inputs with all-zero tokens, huge and tiny
magnitudes and NaN/inf-poisoned tiles; every output is poisoned first so unwritten bytes are caught.
"""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

from openmla import _openmla  # noqa: E402
from openmla import kv_cache as kc  # noqa: E402

BF16 = ml_dtypes.bfloat16
FORMATS = {"v32": (576, 656), "model1": (512, 584)}
PAGE_SIZES = (1, 2, 53, 64, 69, 256)


# ---------------------------------------------------------------------------------------------------------------
# No GPU needed
# ---------------------------------------------------------------------------------------------------------------
def _host_kv(num_blocks=2, page_size=64, d=576):
    return np.zeros((num_blocks, page_size, 1, d), dtype=BF16)


def _host_cache(num_blocks=2, page_size=64, bpt=656):
    return np.zeros((num_blocks, page_size, 1, bpt), dtype=np.uint8)


def _raises(fn, *fragments):
    with pytest.raises(ValueError) as info:
        fn()
    for f in fragments:
        assert f in str(info.value), f"expected {f!r} in: {info.value}"


def test_host_tensor_to_gpu_function():
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "v32"), "argument 'src'", "must be a CUDA tensor", "CPU (host)")
    _raises(lambda: kc.dequantize_kv_cache(_host_cache(), "v32"), "argument 'src'", "CPU (host)")
    _raises(lambda: kc.append_kv_cache(np.zeros((4, 576), BF16), np.zeros(4, np.int32), _host_cache(), "v32"),
            "argument 'new_kv'", "CPU (host)")


def test_wrong_dtype():
    _raises(lambda: kc.quantize_kv_cache(np.zeros((2, 64, 1, 576), np.float32), "v32"),
            "argument 'src'", "float32", "expected bfloat16")
    _raises(lambda: kc.quantize_kv_cache(np.zeros((2, 64, 1, 576), np.float16), "v32"), "argument 'src'", "float16")
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "v32", out=np.zeros((2, 64, 1, 656), np.int32)),
            "argument 'dst'", "int32")
    _raises(lambda: kc.dequantize_kv_cache(_host_cache(), "v32", out=np.zeros((2, 64, 1, 576), np.float32)),
            "argument 'dst'", "float32", "bfloat16")
    _raises(lambda: kc.append_kv_cache(np.zeros((4, 576), np.float32), np.zeros(4, np.int32), _host_cache(), "v32"),
            "argument 'new_kv'", "float32")
    _raises(lambda: kc.append_kv_cache(np.zeros((4, 576), BF16), np.zeros(4, np.float32), _host_cache(), "v32"),
            "argument 'slots'", "float32", "int32 or int64")


def test_wrong_last_dimension():
    _raises(lambda: kc.quantize_kv_cache(_host_kv(d=575), "v32"), "argument 'src'", "size 575", "expected 576")
    _raises(lambda: kc.quantize_kv_cache(_host_kv(d=576), "model1"), "argument 'src'", "expected 512")
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "v32", out=_host_cache(bpt=600)),
            "argument 'dst'", "size 600", "expected 656")
    _raises(lambda: kc.dequantize_kv_cache(_host_cache(bpt=600), "v32"), "argument 'src'", "size 600", "expected 656")
    _raises(lambda: kc.dequantize_kv_cache(_host_cache(bpt=656), "model1"), "argument 'src'", "expected 584")
    _raises(lambda: kc.append_kv_cache(np.zeros((4, 575), BF16), np.zeros(4, np.int32), _host_cache(), "v32"),
            "argument 'new_kv'", "size 575", "expected 576")


def test_misaligned_strides():
    # A bf16 page stride that is not a multiple of 8 elements (16 bytes).
    padded = np.zeros((2, 64 * 576 + 4), dtype=BF16)
    kv = np.lib.stride_tricks.as_strided(padded, (2, 64, 1, 576), (padded.strides[0], 576 * 2, 576 * 2, 2))
    _raises(lambda: kc.quantize_kv_cache(kv, "v32"), "argument 'src'", "multiple of 8 elements")
    # A cache page stride that is not a multiple of 16 bytes, and one smaller than a page.
    storage = np.zeros(2 * (64 * 656 + 8), np.uint8)
    cache = np.lib.stride_tricks.as_strided(storage, (2, 64, 1, 656), (64 * 656 + 8, 656, 656, 1))
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "v32", out=cache), "argument 'dst'", "multiple of 16 bytes")
    _raises(lambda: kc.dequantize_kv_cache(cache, "v32"), "argument 'src'", "multiple of 16 bytes")
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "v32", page_stride_bytes=64 * 656 + 8), "'page_stride_bytes'")
    overlapping = np.lib.stride_tricks.as_strided(storage, (2, 64, 1, 656), (63 * 656, 656, 656, 1))
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "v32", out=overlapping), "argument 'dst'", "smaller than a page")
    rows = np.zeros((4, 580), BF16)[:, :576]
    _raises(lambda: kc.append_kv_cache(rows, np.zeros(4, np.int32), _host_cache(), "v32"),
            "argument 'new_kv'", "stride 580")


def test_mismatched_shapes():
    _raises(lambda: kc.quantize_kv_cache(_host_kv(num_blocks=2), "v32", out=_host_cache(num_blocks=3)),
            "argument 'dst'", "num_blocks = 3", "argument 'src'")
    _raises(lambda: kc.quantize_kv_cache(_host_kv(page_size=64), "v32", out=_host_cache(page_size=32)),
            "argument 'dst'", "page_size = 32")
    _raises(lambda: kc.dequantize_kv_cache(_host_cache(), "v32", out=_host_kv(page_size=63)),
            "argument 'dst'", "page_size = 63")
    _raises(lambda: kc.append_kv_cache(np.zeros((4, 576), BF16), np.zeros(5, np.int32), _host_cache(), "v32"),
            "argument 'slots'", "size 5", "expected 4")
    _raises(lambda: kc.quantize_kv_cache(np.zeros((128, 576), BF16), "v32"), "argument 'src'", "4 dimensions")


def test_wrong_format():
    _raises(lambda: kc.quantize_kv_cache(_host_kv(), "fp8"), "argument 'format'", "'v32'", "'model1'")
    _raises(lambda: kc.dequantize_kv_cache(_host_cache(), "bf16"), "argument 'format'")


def test_format_helpers():
    assert kc.bytes_per_token("v32") == 656 and kc.bytes_per_token("model1") == 584
    assert kc.head_dim("v32") == 576 and kc.head_dim("model1") == 512


def test_layout_constants_of_the_binding():
    """openmla._openmla.fp8_cache_layouts (the library's one definition, src/common/fp8_cache_layout.h) against the
    documented bytes (docs/kv-cache-formats.md, written out here) and the format helpers."""
    layouts = _openmla.fp8_cache_layouts
    assert sorted(layouts) == ["model1", "v32"]
    assert layouts["v32"] == {"head_dim": 576, "nope_dim": 512, "rope_dim": 64, "tile_dim": 128, "num_tiles": 4,
                              "scale_bytes": 4, "bytes_per_token": 656, "data_stride": 656, "rope_offset": 528,
                              "scale_offset": 512}
    assert layouts["model1"] == {"head_dim": 512, "nope_dim": 448, "rope_dim": 64, "tile_dim": 64, "num_tiles": 7,
                                 "scale_bytes": 1, "bytes_per_token": 584, "data_stride": 576, "rope_offset": 448,
                                 "scale_stride": 8}
    for fmt, layout in layouts.items():
        assert (layout["bytes_per_token"], layout["head_dim"]) == (kc.bytes_per_token(fmt), kc.head_dim(fmt))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cpu_codec_round_trip(fmt):
    d, bpt = FORMATS[fmt]
    x = _random_tokens(np.random.default_rng(1), 3 * 5, d, non_finite=False).reshape(3, 5, 1, d)
    cache = _openmla.kv_cache_cpu_encode(x.view(np.uint16), fmt)
    assert cache.shape == (3, 5, 1, bpt) and cache.dtype == np.uint8
    back = _openmla.kv_cache_cpu_decode(cache, fmt).view(BF16).astype(np.float32)
    ref = x.astype(np.float32)
    nope = d - 64
    assert np.array_equal(back[..., nope:], ref[..., nope:]), "RoPE is copied bit for bit"
    tile = 128 if fmt == "v32" else 64
    nope_ref = ref[..., :nope].reshape(3, 5, nope // tile, tile)
    err = np.abs(back[..., :nope].reshape(nope_ref.shape) - nope_ref)
    # Per tile: scale s <= 2 * amax / 448 (and >= 2^-13); normal e4m3 is within 2^-4 relative, subnormals within
    # half their quantum s * 2^-9.
    scale = np.maximum(np.abs(nope_ref).max(axis=-1, keepdims=True) / 224, 2.0**-13)
    # |x| >= 248 * 2^120 rounds to e4m3 256 with scale 2^120: 2^128 overflows to +-inf (a limit of the format).
    overflow = np.abs(nope_ref) >= 248 * 2.0**120
    decoded = back[..., :nope].reshape(nope_ref.shape)
    assert np.all(np.isinf(decoded[overflow]) & (np.sign(decoded[overflow]) == np.sign(nope_ref[overflow])))
    ok = err <= np.maximum(np.abs(nope_ref) / 16, scale / 1024)
    assert np.all(ok | overflow), "e4m3 round trip within half an ulp"


# ---------------------------------------------------------------------------------------------------------------
# Input generation (numpy, bf16 via ml_dtypes)
# ---------------------------------------------------------------------------------------------------------------
def _random_tokens(rng, n, d, non_finite=True):
    """(n, d) bf16 tokens: per 32-dim block magnitudes from 1e-30 to 3e38, all-zero tokens, tiles with amax 448,
    and (non_finite) a few NaN / +-inf values."""
    x = rng.standard_normal((n, d), dtype=np.float32)
    blocks = x.reshape(n, d // 32, 32)
    exps = rng.integers(-40, 40, size=(n, d // 32, 1)).astype(np.float32)
    blocks *= np.exp2(exps)
    kind = rng.integers(0, 12, size=n)
    x[kind == 0] = 0.0                                   # all-zero tokens
    x[kind == 1] = rng.standard_normal((int((kind == 1).sum()), d)) * 1e-30  # tiny
    x[kind == 2] = np.clip(rng.standard_normal((int((kind == 2).sum()), d)) * 3e38, -3.3e38, 3.3e38)  # huge
    x[kind == 3] = np.clip(np.round(rng.standard_normal((int((kind == 3).sum()), d)) * 100), -448, 448)
    x[kind == 3, 7] = 448.0                              # tile amax exactly 448 -> scale 1
    if non_finite:
        rows = np.nonzero(kind == 4)[0]
        x[rows, rng.integers(0, d, size=rows.size)] = np.nan
        rows = np.nonzero(kind == 5)[0]
        x[rows, rng.integers(0, d, size=rows.size)] = np.where(rng.random(rows.size) < 0.5, np.inf, -np.inf)
    return x.astype(BF16)


def _token_byte_mask(fmt, page_size, written):
    """(num_blocks, page_size * bpt) bool: the bytes of each page that belong to the tokens in `written`
    (num_blocks, page_size) bool."""
    nb = written.shape[0]
    if fmt == "v32":
        return np.repeat(written[:, :, None], 656, axis=2).reshape(nb, page_size * 656)
    data = np.repeat(written[:, :, None], 576, axis=2).reshape(nb, page_size * 576)
    scales = np.repeat(written[:, :, None], 8, axis=2).reshape(nb, page_size * 8)
    return np.concatenate([data, scales], axis=1)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
POISON = 0xA5


def _torch_bf16(torch, x_bf16_np, device):
    return torch.from_numpy(np.ascontiguousarray(x_bf16_np).view(np.int16)).view(torch.bfloat16).to(device)


def _bits(torch, t):
    """bf16 torch tensor -> numpy uint16 bit patterns (contiguous copy)."""
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def _padded_bf16(torch, x_np, device, extra_rows=1, extra_dims=8):
    """A non-contiguous (nb, ps, 1, d) bf16 view into a larger poisoned buffer: rows d + 8 elements apart, pages
    (ps + 1) rows apart."""
    nb, ps, _, d = x_np.shape
    big = torch.full((nb, ps + extra_rows, 1, d + extra_dims), float("nan"), dtype=torch.bfloat16, device=device)
    view = big[:, :ps, :, :d]
    view.copy_(_torch_bf16(torch, x_np, device))
    assert not view.is_contiguous()
    return view


def _cache_with_stride(torch, nb, ps, bpt, extra_bytes, device, poison=POISON):
    stride = -(-ps * bpt // 16) * 16 + extra_bytes
    storage = torch.full((nb, stride), poison, dtype=torch.uint8, device=device)
    return storage, torch.as_strided(storage, (nb, ps, 1, bpt), (stride, bpt, bpt, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gpu_quantize_dequantize_bit_identical(fmt, page_size):
    import torch

    d, bpt = FORMATS[fmt]
    rng = np.random.default_rng(page_size * 7 + d)
    nb = max(2, 1536 // page_size)
    x = _random_tokens(rng, nb * page_size, d).reshape(nb, page_size, 1, d)
    want = _openmla.kv_cache_cpu_encode(x.view(np.uint16), fmt).reshape(nb, page_size * bpt)

    for src_contiguous, extra_bytes in ((True, 0), (False, 48), (False, 16 * 37)):
        src = _torch_bf16(torch, x, "cuda") if src_contiguous else _padded_bf16(torch, x, "cuda")
        storage, cache = _cache_with_stride(torch, nb, page_size, bpt, extra_bytes, "cuda")
        out = kc.quantize_kv_cache(src, fmt, out=cache)
        assert out is cache
        torch.cuda.synchronize()
        got = storage.cpu().numpy()
        np.testing.assert_array_equal(got[:, : page_size * bpt], want, err_msg=f"quantise, page stride +{extra_bytes}")
        assert np.all(got[:, page_size * bpt:] == POISON), "bytes between pages must stay untouched"

        # Dequantise into a poisoned, padded bf16 buffer.
        big = torch.full((nb, page_size + 1, 1, d + 8), -12345.0, dtype=torch.bfloat16, device="cuda")
        back = big[:, :page_size, :, :d]
        kc.dequantize_kv_cache(cache, fmt, out=back)
        torch.cuda.synchronize()
        want_back = _openmla.kv_cache_cpu_decode(want.reshape(nb, page_size, 1, bpt), fmt)
        np.testing.assert_array_equal(_bits(torch, back), want_back, err_msg="dequantise")
        poison_bits = np.array(-12345.0, dtype=BF16).view(np.uint16)
        rest = _bits(torch, big)
        rest[:, :page_size, :, :d] = poison_bits
        assert np.all(rest == poison_bits), "padding of the bf16 output must stay untouched"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gpu_allocating_paths_and_fp8_dtype(fmt):
    import torch

    d, bpt = FORMATS[fmt]
    x = _random_tokens(np.random.default_rng(3), 4 * 69, d).reshape(4, 69, 1, d)
    want = _openmla.kv_cache_cpu_encode(x.view(np.uint16), fmt).reshape(4, 69 * bpt)
    src = _torch_bf16(torch, x, "cuda")
    cache = kc.quantize_kv_cache(src, fmt, page_stride_bytes=-(-69 * bpt // 16) * 16 + 64)
    assert cache.dtype == torch.uint8 and cache.shape == (4, 69, 1, bpt) and cache.stride(1) == bpt
    got = torch.as_strided(cache, (4, 69 * bpt), (cache.stride(0), 1)).cpu().numpy()
    np.testing.assert_array_equal(got, want)
    # A float8_e4m3fn cache with pages 16-byte aligned (69 * 584 is not a multiple of 16: MODEL1 pads).
    page_stride = -(-69 * bpt // 16) * 16
    fp8 = torch.empty((4, page_stride), dtype=torch.float8_e4m3fn, device="cuda").as_strided(
        (4, 69, 1, bpt), (page_stride, bpt, bpt, 1))
    kc.quantize_kv_cache(src, fmt, out=fp8)
    fp8_bytes = torch.as_strided(fp8.view(torch.uint8), (4, 69 * bpt), (page_stride, 1))
    np.testing.assert_array_equal(fp8_bytes.cpu().numpy(), want)
    back = kc.dequantize_kv_cache(fp8, fmt)
    assert back.dtype == torch.bfloat16 and back.shape == (4, 69, 1, d)
    np.testing.assert_array_equal(_bits(torch, back),
                                  _openmla.kv_cache_cpu_decode(want.reshape(4, 69, 1, bpt), fmt))


@pytest.mark.gpu
@pytest.mark.parametrize("slot_dtype", ["int32", "int64"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gpu_append_bit_identical(fmt, page_size, slot_dtype):
    import torch

    d, bpt = FORMATS[fmt]
    rng = np.random.default_rng(page_size * 13 + d + len(slot_dtype))
    nb = max(2, 1024 // page_size)
    total = nb * page_size
    n = max(1, total * 2 // 3)
    x = _random_tokens(rng, n, d)
    slots = rng.permutation(total)[:n].astype(np.int64)           # distinct destinations
    skipped = rng.random(n) < 0.2
    slots[skipped] = -rng.integers(1, 1000, size=int(skipped.sum()))  # negative: skipped

    # Expected: poisoned cache, then each written token's bytes from the CPU encoding of its page.
    poison = rng.integers(0, 256, size=(nb, -(-page_size * bpt // 16) * 16 + 32), dtype=np.uint8)
    full = np.zeros((total, d), dtype=BF16)
    written = np.zeros(total, dtype=bool)
    full[slots[~skipped]] = x[~skipped]
    written[slots[~skipped]] = True
    encoded = _openmla.kv_cache_cpu_encode(full.reshape(nb, page_size, 1, d).view(np.uint16), fmt)
    mask = _token_byte_mask(fmt, page_size, written.reshape(nb, page_size))
    want = poison.copy()
    region = want[:, : page_size * bpt]
    region[mask] = encoded.reshape(nb, -1)[mask]

    storage = torch.from_numpy(poison.copy()).cuda()
    cache = torch.as_strided(storage, (nb, page_size, 1, bpt), (storage.stride(0), bpt, bpt, 1))
    # new_kv with a padded row stride, as (n, 1, d) for one format and (n, d) for the other.
    rows = torch.zeros((n, d + 8), dtype=torch.bfloat16, device="cuda")[:, :d]
    rows.copy_(_torch_bf16(torch, x, "cuda"))
    new_kv = rows[:, None, :] if fmt == "v32" else rows
    slots_t = torch.from_numpy(slots.astype(slot_dtype)).cuda()
    kc.append_kv_cache(new_kv, slots_t, cache, fmt)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(storage.cpu().numpy(), want)


@pytest.mark.gpu
def test_gpu_append_nothing_and_all_skipped():
    import torch

    _, cache = _cache_with_stride(torch, 2, 64, 656, 0, "cuda")
    before = cache.clone()
    kc.append_kv_cache(torch.empty((0, 576), dtype=torch.bfloat16, device="cuda"),
                       torch.empty(0, dtype=torch.int32, device="cuda"), cache, "v32")
    kc.append_kv_cache(torch.ones((5, 576), dtype=torch.bfloat16, device="cuda"),
                       torch.full((5,), -1, dtype=torch.int64, device="cuda"), cache, "v32")
    torch.cuda.synchronize()
    assert torch.equal(cache, before)


@pytest.mark.gpu
def test_gpu_errors_name_the_argument():
    import torch

    kv = torch.zeros((2, 64, 1, 576), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="argument 'src' must be a CUDA tensor"):
        kc.quantize_kv_cache(kv.cpu(), "v32", out=torch.empty((2, 64, 1, 656), dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="argument 'dst' must be a CUDA tensor"):
        kc.quantize_kv_cache(kv, "v32", out=torch.empty((2, 64, 1, 656), dtype=torch.uint8))
    with pytest.raises(ValueError, match="argument 'src' has dtype float16"):
        kc.quantize_kv_cache(kv.half(), "v32")
    with pytest.raises(ValueError, match="expected 656"):
        kc.dequantize_kv_cache(torch.empty((2, 64, 1, 600), dtype=torch.uint8, device="cuda"), "v32")
