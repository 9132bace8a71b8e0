"""Question: does this build give the same outputs, bit for bit, as another build (e.g. the one before a refactor)?

Runs a fixed matrix of 167 cases through the flash_mla-compatible Python API only -- get_mla_metadata,
flash_mla_with_kvcache (dense and sparse), quantize_kv_cache, dequantize_kv_cache, append_kv_cache: functions that
20f0c84, the build before the architecture refactor, has too -- with whichever `openmla` is first on PYTHONPATH,
and records for every output tensor its shape, dtype and the sha256 of its bytes in a JSON file. Run it once under
each build (separate processes), then compare the two files:

    PYTHONPATH=python:.deps/py python3 tools/compare_outputs.py --out now.json [--save-tensors DIR]
    PYTHONPATH=.ab/pre/python:.deps/py python3 tools/compare_outputs.py --out pre.json [--save-tensors DIR]
    python3 tools/compare_outputs.py --check pre.json now.json      # exit status 1 on any difference
    python3 tools/compare_outputs.py --list                         # the case names (no torch, no GPU)

tools/compare_builds.sh does all of it on the GPU machine, both builds included (docs/architecture.md,
"Device layer").

The inputs are the same for every build: seeded per case (from the case's name), drawn on the GPU with a
torch.Generator, and built with the same conventions as the GPU tests (tests/python/test_dense_decode.py,
test_sparse_decode.py, test_kv_cache.py): NaN in every unused dense cache row, garbage block-table entries past
each request's pages, FP8 tokens no slot selects poisoned with 0xFF bytes, invalid and out-of-range indices,
garbage past topk_length, NaN-filled out / lse buffers. The sparse caches are quantised by the build under test,
so a GPU fingerprint of every case's inputs is recorded too: `--check` reports "inputs differ" when a codec
difference (or a non-deterministic generator) changed them. Each attention case also calls again with a fresh
schedule and allocated outputs and records whether that repeat gave the same bytes (a build that is not
deterministic cannot be compared bit for bit).

With --save-tensors DIR every output's raw bytes go to DIR as well, and --check then prints the largest absolute
difference of each differing float tensor (numpy needed for that part only).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Optional

FORMAT_VERSION = 1
DEVICE = "cuda"

# Dense decode (docs/contracts.md section 10: flash_mla's test inputs).
D_QK_DENSE, D_V, PAGE = 576, 512, 64
INVALID_PAGE = 2147480000
# Sparse decode: the two FP8 layouts (docs/kv-cache-formats.md).
SPARSE_D_QK = {"v32": 576, "model1": 512}
BYTES_PER_TOKEN = {"v32": 656, "model1": 584}
MODEL1_PAGE_ALIGN = 576  # flash_mla's MODEL1 allocator rounds every page up to a multiple of 576 bytes
SPARE_PAGES = 3          # pages no request owns (poisoned)
INT32_MAX = 2 ** 31 - 1
# The codec.
CODEC_FORMATS = {"v32": (576, 656), "model1": (512, 584)}
CODEC_POISON = 0xA5


def case_seed(name: str) -> int:
    """Every case's inputs depend on its name only, so adding or removing cases leaves the others' inputs alone."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


# ---------------------------------------------------------------------------------------------------------------
# Cases (plain data: listing them needs neither torch nor a GPU)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseCase:
    group: str
    b: int
    s_q: int
    h_q: int
    h_kv: int
    s_k: int
    varlen: bool = False
    causal: bool = False
    dtype: str = "bf16"
    zero_len: bool = False
    lens: Optional[tuple] = None   # explicit per-request lengths instead of drawn ones
    out_buf: str = "none"          # "none" (allocated), "nan" (NaN-filled out and transposed lse), "nan-lse-contig"
    layers: int = 1                # calls sharing one schedule (new q per layer, same cache)
    noncontig: bool = False        # q, k_cache, block_table as slices of padded tensors
    scale: Optional[float] = None

    family = "dense_decode"

    @property
    def name(self) -> str:
        s = f"dense/{self.group}/b{self.b}-sq{self.s_q}-hq{self.h_q}-hkv{self.h_kv}"
        s += f"-lens{len(self.lens)}" if self.lens is not None else f"-sk{self.s_k}"
        for flag in ("varlen", "causal", "zero_len", "noncontig"):
            if getattr(self, flag):
                s += "-" + flag
        s += "-" + self.dtype
        if self.out_buf != "none":
            s += "-out_" + self.out_buf
        if self.layers > 1:
            s += f"-layers{self.layers}"
        if self.scale is not None:
            s += f"-scale{self.scale}"
        return s


@dataclass(frozen=True)
class Sel:
    """One FP8 cache and its selection: tokens per request (mean), slots per query row, page size, and whether
    per-request lengths (topk_length / extra_topk_length) are given."""

    s_k: int
    topk: int
    page: int
    lens: bool = False

    def __str__(self):
        return f"sk{self.s_k}-topk{self.topk}-page{self.page}{'-len' if self.lens else ''}"


@dataclass(frozen=True)
class SparseCase:
    group: str
    layout: str
    b: int
    s_q: int
    h_q: int
    main: Sel
    extra: Optional[Sel] = None
    sink: str = "none"          # "none", "random" (N(0,1), ~31% +inf, ~31% -inf), "+inf", "-inf"
    varlen: bool = True
    all_invalid: bool = False   # every slot is -1 or out of range
    zero_len: bool = False      # about half of the requests get length 0 (needs lens)
    out_buf: str = "nan"        # as DenseCase.out_buf
    cache_dtype: str = "uint8"  # uint8, int8 or float8_e4m3fn view of the byte cache
    big_values: bool = False    # every third token x 2^20 (scales above 2^7), q x 2^-20
    layers: int = 1
    noncontig: bool = False     # q and indices as slices of padded tensors

    family = "sparse_decode"

    @property
    def name(self) -> str:
        s = f"sparse/{self.group}/{self.layout}-b{self.b}-sq{self.s_q}-hq{self.h_q}-{self.main}"
        if self.extra is not None:
            s += f"-extra[{self.extra}]"
        if self.sink != "none":
            s += f"-sink{self.sink}"
        for flag in ("all_invalid", "zero_len", "big_values", "noncontig"):
            if getattr(self, flag):
                s += "-" + flag
        if not self.varlen:
            s += "-fixedlen"
        s += "-out_" + self.out_buf
        if self.cache_dtype != "uint8":
            s += "-" + self.cache_dtype
        if self.layers > 1:
            s += f"-layers{self.layers}"
        return s


@dataclass(frozen=True)
class CodecCase:
    op: str                    # "quantize" (then dequantize), "quantize_alloc" or "append"
    fmt: str
    page_size: int
    padded_src: bool = False   # bf16 source as a non-contiguous view (rows and pages padded)
    extra_bytes: int = 0       # page stride beyond the packed, 16-byte aligned page
    slot_dtype: str = "int32"  # append
    empty: bool = False        # append: no rows, then rows whose slots are all negative

    family = "kv_cache"

    @property
    def name(self) -> str:
        s = f"kv_cache/{self.op}/{self.fmt}-page{self.page_size}"
        if self.padded_src:
            s += "-padded_src"
        if self.extra_bytes:
            s += f"-stride+{self.extra_bytes}"
        if self.op == "append":
            s += "-" + self.slot_dtype
        if self.empty:
            s += "-empty"
        return s


def dense_cases() -> list:
    cases = []
    # The main grid: h_q 16 / 64 / 128 (h_kv 1) x s_q 1 / 2 x causal x dtype x a small and a large batch.
    i = 0
    for h_q in (16, 64, 128):
        for s_q in (1, 2):
            for causal in (False, True):
                for dtype in ("bf16", "fp16"):
                    for b, s_k in ((6, 140), (64, 4096)):
                        out_buf = ("none", "nan", "nan-lse-contig")[i % 3]
                        cases.append(DenseCase("grid", b, s_q, h_q, 1, s_k, varlen=True, causal=causal, dtype=dtype,
                                               out_buf=out_buf))
                        i += 1
    # Split-KV: few long requests spread over every SM partition (the combine kernel writes the result).
    cases += [
        DenseCase("split", 1, 1, 128, 1, 65536),
        DenseCase("split", 1, 2, 128, 1, 65536, causal=True),
        DenseCase("split", 1, 1, 16, 1, 32768 + 37),
        DenseCase("split", 1, 2, 64, 1, 16384 + 1, causal=True, out_buf="nan"),
        DenseCase("split", 2, 2, 128, 1, 40000, varlen=True, causal=True),
        DenseCase("split", 1, 1, 64, 1, 20000, dtype="fp16"),
        DenseCase("split", 4, 2, 16, 1, 30000, varlen=True, causal=True, dtype="fp16", out_buf="nan-lse-contig"),
        DenseCase("split", 8, 2, 128, 1, 0, causal=True, lens=(131072, 5, 0, 64, 1, 4096, 63, 65)),
    ]
    # Requests split in exactly two chunks (merged inside the main kernel), and more requests than SMs.
    cases += [
        DenseCase("merge", 64, 2, 128, 1, 2048, varlen=True, causal=True),
        DenseCase("merge", 132, 1, 16, 2, 700, varlen=True),
        DenseCase("merge", 40, 3, 9, 3, 1500, varlen=True, causal=True, zero_len=True, dtype="fp16"),
        DenseCase("many", 140, 1, 64, 1, 140, varlen=True),
        DenseCase("many", 200, 2, 128, 1, 140, varlen=True, causal=True, out_buf="nan"),
        DenseCase("many", 264, 1, 16, 1, 20, varlen=True),
        DenseCase("many", 133, 4, 9, 3, 140, varlen=True, causal=True, zero_len=True),
    ]
    # Empty requests and causal rows that see no key.
    cases += [
        DenseCase("empty", 128, 2, 128, 1, 4096, varlen=True, zero_len=True),
        DenseCase("empty", 128, 2, 128, 1, 4096, varlen=True, causal=True, zero_len=True),
        DenseCase("empty", 64, 4, 16, 2, 140, varlen=True, causal=True, zero_len=True, out_buf="nan"),
        DenseCase("empty", 6, 1, 63, 3, 20, zero_len=True),
        DenseCase("empty", 8, 2, 128, 1, 0, causal=True, lens=(0,) * 8, out_buf="nan"),
        DenseCase("empty", 8, 1, 16, 2, 0, causal=True, lens=(0,) * 8, out_buf="nan"),
        DenseCase("empty", 10, 2, 64, 2, 0, causal=True, lens=(1, 2, 3, 4, 5, 0, 64, 65, 1, 3), out_buf="nan"),
        DenseCase("empty", 10, 4, 64, 2, 0, causal=True, lens=(1, 2, 3, 4, 5, 0, 64, 65, 1, 3), out_buf="nan"),
    ]
    # Other head geometries (GQA: h_kv > 1, h_q not a multiple of 16).
    cases += [
        DenseCase("heads", 2, 1, 1, 1, 140, varlen=True),
        DenseCase("heads", 6, 2, 3, 1, 4096, varlen=True, causal=True, out_buf="nan"),
        DenseCase("heads", 64, 4, 9, 3, 140, varlen=True, causal=True),
        DenseCase("heads", 6, 1, 63, 3, 4096, dtype="fp16"),
        DenseCase("heads", 2, 4, 126, 3, 140, varlen=True, causal=True, dtype="fp16", out_buf="nan-lse-contig"),
        DenseCase("heads", 64, 2, 16, 2, 140, varlen=True),
        DenseCase("heads", 6, 4, 64, 8, 4096, causal=True, out_buf="nan"),
        DenseCase("heads", 2, 2, 128, 8, 140, varlen=True, causal=True),
    ]
    # Strided inputs, one schedule shared by several layers, an explicit softmax scale.
    cases += [
        DenseCase("noncontig", 6, 2, 128, 1, 4096, varlen=True, causal=True, noncontig=True),
        DenseCase("noncontig", 9, 4, 126, 3, 140, varlen=True, causal=True, dtype="fp16", noncontig=True),
        DenseCase("layers", 64, 2, 128, 1, 4096, varlen=True, causal=True, layers=3),
        DenseCase("layers", 6, 4, 63, 3, 140, varlen=True, causal=True, layers=2, out_buf="nan"),
        DenseCase("scale", 6, 2, 64, 1, 140, varlen=True, causal=True, scale=0.2),
    ]
    return cases


# flash_mla's (s_k, topk, page size) triples of the main cache, and the extra caches' (docs/contracts.md section 10).
MAIN_SELS = [(512, 64, 2), (512, 64, 64), (512, 64, 69), (1024, 576, 61), (2046, 2048, 64), (2046, 2048, 576)]
EXTRA_SELS = [(512, 64, 2), (1024, 128, 256), (300, 100, 53), (2046, 512, 64), (512, 37, 69), (1024, 576, 61),
              (700, 64, 576)]
CACHE_DTYPES = ("uint8", "int8", "float8_e4m3fn")


def sparse_cases() -> list:
    cases = []
    # h_q = 128: both layouts x the six triples x s_q 1 / 3, each combination of (sink, topk_length, extra cache)
    # at least once per layout, batches 4 / 74 / 321 (the crossover and the plain kernel, split and not).
    rng = random.Random(20261123)
    for layout in ("v32", "model1"):
        features = [(s, n, e) for s in (False, True) for n in (False, True) for e in (False, True)]
        features += rng.sample(features, 4)
        rng.shuffle(features)
        batches = [4, 74, 321] * 4
        rng.shuffle(batches)
        slot = 0
        for s_k, topk, page in MAIN_SELS:
            for s_q in (1, 3):
                sink, lens, extra = features[slot]
                extra_sel = Sel(*EXTRA_SELS[rng.randrange(len(EXTRA_SELS))], lens=rng.random() < 0.5) if extra else None
                cases.append(SparseCase("grid", layout, batches[slot], s_q, 128, Sel(s_k, topk, page, lens), extra_sel,
                                        sink="random" if sink else "none",
                                        out_buf=("nan", "nan-lse-contig", "nan", "none")[slot % 4],
                                        cache_dtype=CACHE_DTYPES[slot % 3]))
                slot += 1
    # Other head counts (64-head tiles, partial tiles, a lone head).
    rng = random.Random(7)
    for h_q in (8, 16, 32, 64):
        for layout in ("v32", "model1"):
            main = Sel(*rng.choice(MAIN_SELS[:4]), lens=rng.random() < 0.5)
            extra = Sel(*rng.choice(EXTRA_SELS), lens=rng.random() < 0.5) if rng.random() < 0.5 else None
            cases.append(SparseCase("heads", layout, rng.choice((4, 74)), rng.choice((1, 2, 3, 5)), h_q, main, extra,
                                    sink=rng.choice(("none", "random")),
                                    out_buf="nan-lse-contig" if rng.random() < 0.3 else "nan"))
    cases += [
        SparseCase("heads", "v32", 5, 2, 1, Sel(512, 64, 61, lens=True), sink="random"),
        SparseCase("heads", "model1", 5, 3, 100, Sel(300, 100, 53), Sel(512, 64, 64, lens=True), sink="random"),
    ]
    # topk not a multiple of 64.
    cases += [
        SparseCase("odd_topk", "v32", 6, 2, 128, Sel(300, 37, 53, lens=True), Sel(200, 100, 256, lens=True),
                   sink="random"),
        SparseCase("odd_topk", "model1", 6, 2, 128, Sel(300, 100, 256), Sel(200, 1, 53, lens=True), sink="random"),
        SparseCase("odd_topk", "v32", 74, 1, 64, Sel(512, 1, 61), Sel(100, 37, 2)),
        SparseCase("odd_topk", "model1", 74, 3, 64, Sel(512, 37, 2, lens=True), Sel(512, 100, 69), sink="random"),
        SparseCase("odd_topk", "v32", 9, 3, 16, Sel(1024, 100, 256, lens=True), sink="random"),
        SparseCase("odd_topk", "model1", 9, 1, 128, Sel(64, 1, 53, lens=True)),
    ]
    # Rows without a valid token: every slot invalid, or topk_length 0.
    cases += [
        SparseCase("empty", "v32", 74, 2, 128, Sel(1024, 576, 61), sink="random", all_invalid=True),
        SparseCase("empty", "model1", 74, 2, 128, Sel(1024, 576, 53, lens=True), Sel(512, 64, 61, lens=True),
                   sink="random", all_invalid=True),
        SparseCase("empty", "v32", 4, 1, 64, Sel(512, 64, 53), Sel(2046, 2048, 61), sink="+inf", all_invalid=True),
        SparseCase("empty", "model1", 9, 3, 16, Sel(512, 128, 61), sink="-inf", all_invalid=True, out_buf="none"),
        SparseCase("empty", "v32", 74, 2, 128, Sel(1024, 576, 61, lens=True), sink="random", zero_len=True),
        SparseCase("empty", "model1", 74, 2, 128, Sel(1024, 576, 53, lens=True), Sel(512, 100, 2, lens=True),
                   sink="random", zero_len=True),
        SparseCase("empty", "v32", 32, 3, 32, Sel(2046, 2048, 53, lens=True), Sel(256, 64, 256, lens=True),
                   zero_len=True),
        SparseCase("empty", "model1", 321, 1, 64, Sel(512, 64, 61, lens=True), sink="random", zero_len=True),
    ]
    # Quantisation scales above 2^7 (the two-multiply dequantisation), sinks of +-inf, long selections (split).
    cases += [
        SparseCase("big", "v32", 4, 2, 128, Sel(1024, 576, 61), big_values=True),
        SparseCase("big", "model1", 74, 3, 128, Sel(2046, 2048, 64), Sel(512, 100, 69), big_values=True),
        SparseCase("big", "v32", 9, 3, 64, Sel(2046, 2048, 576), big_values=True),
        SparseCase("sink", "v32", 74, 2, 128, Sel(1024, 576, 61), Sel(512, 64, 53), sink="+inf"),
        SparseCase("sink", "model1", 9, 3, 64, Sel(2046, 2048, 69, lens=True), Sel(700, 64, 576, lens=True),
                   sink="-inf"),
        SparseCase("split", "model1", 2, 1, 128, Sel(20000, 16384, 64), sink="random", varlen=False),
        SparseCase("split", "v32", 1, 1, 128, Sel(20000, 16384, 64), sink="random", varlen=False),
        SparseCase("split", "model1", 2, 2, 64, Sel(9000, 8192, 256, lens=True), Sel(2046, 1024, 61, lens=True),
                   sink="random"),
        SparseCase("split", "v32", 1, 2, 128, Sel(9000, 8192, 61), Sel(2046, 1024, 69), sink="random",
                   all_invalid=True),
        SparseCase("split", "model1", 3, 1, 16, Sel(5000, 4096, 53, lens=True), sink="random", zero_len=True),
    ]
    # One schedule shared by several layers; strided q and indices.
    cases += [
        SparseCase("layers", "v32", 74, 3, 128, Sel(2046, 2048, 64, lens=True), sink="random", layers=3),
        SparseCase("layers", "model1", 9, 2, 64, Sel(9000, 8192, 61, lens=True), Sel(512, 100, 53, lens=True),
                   sink="random", layers=2),
        SparseCase("noncontig", "v32", 6, 2, 128, Sel(1024, 576, 61, lens=True), Sel(300, 100, 53, lens=True),
                   sink="random", noncontig=True),
        SparseCase("noncontig", "model1", 9, 3, 64, Sel(512, 37, 69), sink="random", noncontig=True),
    ]
    return cases


def codec_cases() -> list:
    cases = []
    for fmt in ("v32", "model1"):
        for i, page in enumerate((1, 2, 53, 64, 69, 256)):
            cases.append(CodecCase("quantize", fmt, page, padded_src=i % 2 == 1, extra_bytes=(0, 48, 16 * 37)[i % 3]))
        cases.append(CodecCase("quantize_alloc", fmt, 69, extra_bytes=64))
        for i, page in enumerate((1, 64, 69)):
            cases.append(CodecCase("append", fmt, page, slot_dtype=("int32", "int64")[i % 2]))
    cases.append(CodecCase("append", "v32", 64, empty=True))
    return cases


def all_cases() -> list:
    cases = dense_cases() + sparse_cases() + codec_cases()
    names = [c.name for c in cases]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AssertionError(f"compare_outputs: duplicate case names: {dup}")
    return cases


def cases_digest(cases) -> str:
    """Identifies the case list (names and parameters), so --check can tell files of different matrices apart."""
    text = json.dumps([[c.name, repr(c)] for c in cases])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# Tensors: digests, fingerprints, saved bytes
# ---------------------------------------------------------------------------------------------------------------
def tensor_bytes(t) -> bytes:
    """The raw bytes of a tensor in its logical (row-major) order, copied to the host."""
    c = t.detach().contiguous().cpu()
    n = c.numel() * c.element_size()
    return ctypes.string_at(c.data_ptr(), n) if n else b""


def describe(torch, t, data: bytes) -> dict:
    entry = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "nbytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest()}
    if t.is_floating_point() and t.element_size() > 1:
        entry["nan"] = int(torch.isnan(t).sum())
        entry["inf"] = int(torch.isinf(t).sum())
    return entry


_FP_CHUNK = 1 << 26  # int32 words per step of the fingerprint (bounds its temporary memory)


def fingerprint(torch, tensors) -> str:
    """A cheap GPU digest of input tensors (their bytes in logical order): equal inputs give equal values. Not a
    cryptographic hash; it only tells whether two builds saw the same inputs without copying gigabytes out."""
    acc = 0
    for t in tensors:
        if t is None:
            acc = (acc * 1000003 + 7) % (1 << 64)
            continue
        flat = t.detach().contiguous().view(-1).view(torch.uint8)
        pad = (-flat.numel()) % 4
        if pad or flat.storage_offset() % 4:  # int32 words need a multiple of 4 bytes, 4-byte aligned
            flat = torch.cat([flat, torch.zeros(pad, dtype=torch.uint8, device=flat.device)])
        words = flat.view(torch.int32)
        total = 0
        for start in range(0, words.numel(), _FP_CHUNK):
            w = words[start:start + _FP_CHUNK].to(torch.int64)
            pos = torch.arange(start, start + w.numel(), dtype=torch.int64, device=w.device)
            # int64 products wrap: deterministic on every run of the same torch and GPU.
            mixed = (w + 0x9E3779B9) * (pos * 0x5851F42D4C957F2D + 0x14057B7EF767814F)
            total = (total + int(mixed.sum())) % (1 << 64)
        acc = (acc * 1000003 + total + flat.numel() + len(t.shape)) % (1 << 64)
    return f"{acc:016x}"


def safe_file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:150] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]


def same_bytes(torch, a, b) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))


def run_layers(torch, om, call, qs, buffers, repeat):
    """The decode call on each layer's q with one schedule (`buffers()`: the out= / lse= keywords of a call), and,
    with `repeat`, layer 0 again on a fresh schedule. Returns ({"out", "lse", "out.layer1", ...}, bitwise equal or
    None)."""
    meta, _ = om.get_mla_metadata()
    outputs = {}
    for layer, q_l in enumerate(qs):
        out, lse = call(q_l, meta, **buffers())
        suffix = "" if layer == 0 else f".layer{layer}"
        outputs["out" + suffix], outputs["lse" + suffix] = out, lse
    same = None
    if repeat:
        fresh, _ = om.get_mla_metadata()
        out2, lse2 = call(qs[0], fresh)
        same = same_bytes(torch, outputs["out"], out2) and same_bytes(torch, outputs["lse"], lse2)
    return outputs, same


# ---------------------------------------------------------------------------------------------------------------
# Dense decode
# ---------------------------------------------------------------------------------------------------------------
def dense_lengths(c: DenseCase, rng: random.Random) -> list:
    if c.lens is not None:
        return list(c.lens)
    lens = [max(int(rng.gauss(c.s_k, c.s_k / 2)), c.s_q) if c.varlen else c.s_k for _ in range(c.b)]
    if c.zero_len:
        lens = [0 if rng.random() < 0.5 else n for n in lens]
    return lens


def dense_q(torch, c: DenseCase, gen, dt):
    return (torch.randn((c.b, c.s_q, c.h_q, D_QK_DENSE), generator=gen, device=DEVICE) / 10).clamp_(-1, 1).to(dt)


def out_buffers(torch, b, s_q, h_q, dtype, kind):
    """NaN-filled out and lse buffers (kind "nan": lse a transposed view of (b, s_q, h_q) storage, as allocated by the
    API; "nan-lse-contig": a contiguous (b, h_q, s_q) lse), or nothing (kind "none")."""
    if kind == "none":
        return {}
    out = torch.full((b, s_q, h_q, D_V), float("nan"), dtype=dtype, device=DEVICE)
    if kind == "nan-lse-contig":
        lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device=DEVICE)
    else:
        lse = torch.full((b, s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE).transpose(1, 2)
    return {"out": out, "lse": lse}


def run_dense(torch, om, c: DenseCase, seed: int, repeat: bool):
    rng = random.Random(seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c.dtype]
    lens = dense_lengths(c, rng)
    b = len(lens)
    max_len = max(max(lens), 1)
    max_blocks = (max_len + 255) // 256 * 256 // PAGE  # padded to 256 tokens, as flash_mla's test does
    num_blocks = b * max_blocks
    perm = torch.randperm(num_blocks, generator=gen, device=DEVICE).to(torch.int32).view(b, max_blocks)
    lens64 = torch.tensor(lens, dtype=torch.int64, device=DEVICE)
    cols = torch.arange(max_blocks, dtype=torch.int64, device=DEVICE)
    used = cols[None, :] * PAGE < lens64[:, None]
    block_table = torch.where(used, perm, torch.full_like(perm, INVALID_PAGE))
    valid_rows = torch.zeros(num_blocks, dtype=torch.int64, device=DEVICE)
    valid_rows[perm[used].long()] = (lens64[:, None] - cols[None, :] * PAGE).clamp(0, PAGE)[used]
    poison = torch.arange(PAGE, device=DEVICE)[None, :] >= valid_rows[:, None]
    q = dense_q(torch, c, gen, dt)
    k_cache = (torch.randn((num_blocks, PAGE, c.h_kv, D_QK_DENSE), generator=gen, device=DEVICE, dtype=dt) / 10)
    k_cache.clamp_(-1, 1)
    k_cache[poison] = float("nan")
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    qs = [q] + [dense_q(torch, c, gen, dt) for _ in range(c.layers - 1)]

    if c.noncontig:  # the same values, in padded storage (NaN / garbage around them)
        q_pad = torch.full((b + 1, c.s_q + 1, c.h_q + 1, D_QK_DENSE + 128), float("nan"), dtype=dt, device=DEVICE)
        qs = [q_pad[:b, :c.s_q, :c.h_q, :D_QK_DENSE].copy_(q)]
        k_pad = torch.full((num_blocks + 1, PAGE + 1, c.h_kv + 1, D_QK_DENSE + 64), float("nan"), dtype=dt,
                           device=DEVICE)
        k_cache = k_pad[:num_blocks, :PAGE, :c.h_kv, :D_QK_DENSE].copy_(k_cache)
        bt_pad = torch.full((b + 1, max_blocks + 3), INVALID_PAGE, dtype=torch.int32, device=DEVICE)
        block_table = bt_pad[1:, 2:max_blocks + 2].copy_(block_table)

    inputs = fingerprint(torch, qs + [k_cache, block_table, cache_seqlens])

    def call(q_l, meta, **kw):
        return om.flash_mla_with_kvcache(q_l, k_cache, block_table, cache_seqlens, D_V, meta, causal=c.causal,
                                         softmax_scale=c.scale, **kw)

    return (inputs, *run_layers(torch, om, call, qs, lambda: out_buffers(torch, b, c.s_q, c.h_q, dt, c.out_buf),
                                repeat))


# ---------------------------------------------------------------------------------------------------------------
# Sparse decode
# ---------------------------------------------------------------------------------------------------------------
def sparse_page_stride(layout: str, page: int) -> int:
    bpt = BYTES_PER_TOKEN[layout]
    if layout == "v32":
        return (page + 1) * bpt  # one spare token per page: pages are not contiguous
    return -(-page * bpt // MODEL1_PAGE_ALIGN) * MODEL1_PAGE_ALIGN


def token_byte_views(torch, storage, layout, num_blocks, page, stride):
    """Views of every token's bytes: (num_blocks, page, n) for each contiguous run of one token's bytes."""
    if layout == "v32":
        return [torch.as_strided(storage, (num_blocks, page, 656), (stride, 656, 1))]
    data = torch.as_strided(storage, (num_blocks, page, 576), (stride, 576, 1))  # 448 e4m3 + 64 bf16 RoPE
    scales = torch.as_strided(storage, (num_blocks, page, 8), (stride, 8, 1), page * 576)  # 7 UE8M0 + pad
    return [data, scales]


def garbage_indices(torch, shape, num_tokens, gen):
    """Indices that are neither -1 nor a token: fixed candidates, random huge and random negative values."""
    fixed = torch.tensor([-2, -123456, -2 ** 31, num_tokens, num_tokens + 1, 2147480000, INT32_MAX],
                         dtype=torch.int64, device=DEVICE)
    pick = torch.randint(0, len(fixed) + 2, shape, generator=gen, device=DEVICE)
    huge = torch.randint(num_tokens, INT32_MAX, shape, generator=gen, device=DEVICE)
    negative = torch.randint(-2 ** 31, -1, shape, generator=gen, device=DEVICE)
    other = torch.where(pick == len(fixed), huge, negative)
    return torch.where(pick < len(fixed), fixed[pick.clamp(max=len(fixed) - 1)], other)


@dataclass
class Paged:
    storage: object   # the flat bytes behind `cache`, page padding included
    cache: object     # (num_blocks, page, 1, bytes_per_token) view handed to the API
    indices: object   # (b, s_q, topk) int32
    lengths: object   # (b,) int32 or None


def sparse_paged(torch, om, c: SparseCase, sel: Sel, zero_reqs, rng, gen) -> Paged:
    layout, b, s_q = c.layout, c.b, c.s_q
    d_qk, bpt, page, topk = SPARSE_D_QK[layout], BYTES_PER_TOKEN[layout], sel.page, sel.topk
    # Each request's tokens live on pages of a random placement of all pages.
    seq = [max(1, min(2 * sel.s_k, int(rng.gauss(sel.s_k, sel.s_k / 2)))) if c.varlen else sel.s_k for _ in range(b)]
    n_pages = [-(-n // page) for n in seq]
    num_blocks = sum(n_pages) + SPARE_PAGES
    num_tokens = num_blocks * page
    perm = torch.randperm(num_blocks, generator=gen, device=DEVICE)
    starts = torch.tensor([sum(n_pages[:i]) for i in range(b)], device=DEVICE)
    cols = torch.arange(max(n_pages), device=DEVICE)
    owned = cols[None, :] < torch.tensor(n_pages, device=DEVICE)[:, None]
    block_table = torch.where(owned, perm[(starts[:, None] + cols[None, :]).clamp(max=num_blocks - 1)], 0)

    # topk distinct positions below each request's length, in random slot order, -1 padded.
    seq_t = torch.tensor(seq, device=DEVICE)
    max_len = max(seq)
    key = torch.rand((b, s_q, max_len), generator=gen, device=DEVICE)
    key.masked_fill_(torch.arange(max_len, device=DEVICE)[None, None, :] >= seq_t[:, None, None], 2.0)
    pos = key.argsort(dim=-1)[..., :topk]
    pos = torch.where(pos < seq_t[:, None, None], pos, -1)
    if pos.shape[-1] < topk:
        pos = torch.cat([pos, torch.full((b, s_q, topk - pos.shape[-1]), -1, dtype=pos.dtype, device=DEVICE)], -1)
    pos = pos.gather(-1, torch.rand((b, s_q, topk), generator=gen, device=DEVICE).argsort(dim=-1))
    p = pos.clamp(min=0)
    pages = block_table.gather(1, (p // page).reshape(b, -1)).reshape(b, s_q, topk)
    idx = torch.where(pos >= 0, pages * page + p % page, -1)

    # Invalid slots: some more -1, some out-of-range garbage (or all of them).
    r = torch.rand(idx.shape, generator=gen, device=DEVICE)
    garbage = garbage_indices(torch, idx.shape, num_tokens, gen)
    if c.all_invalid:
        idx = torch.where(r < 0.5, torch.full_like(idx, -1), garbage)
    else:
        idx = torch.where(r < 0.05, torch.full_like(idx, -1), torch.where(r < 0.08, garbage, idx))

    # Per-request lengths; half of the slots past them hold garbage.
    lengths = None
    used = (idx >= 0) & (idx < num_tokens)
    if sel.lens:
        lens = [0 if i in zero_reqs else rng.randint(0, topk) for i in range(b)]
        lengths = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        beyond = torch.arange(topk, device=DEVICE)[None, None, :] >= lengths.long()[:, None, None]
        coin = torch.rand(idx.shape, generator=gen, device=DEVICE) < 0.5
        idx = torch.where(beyond & coin, garbage_indices(torch, idx.shape, num_tokens, gen), idx)
        used &= ~beyond
    indices = idx.to(torch.int32)

    # The cache: random values quantised (by the build under test) into padded pages, then every token no used slot
    # selects, and the page padding, poisoned with 0xFF (e4m3 NaN, NaN scales, NaN bf16 RoPE).
    stride = sparse_page_stride(layout, page)
    storage = torch.full(((num_blocks - 1) * stride + page * bpt,), 255, dtype=torch.uint8, device=DEVICE)
    cache_u8 = torch.as_strided(storage, (num_blocks, page, 1, bpt), (stride, bpt, bpt, 1))
    kv = torch.randn((num_blocks, page, 1, d_qk), generator=gen, device=DEVICE, dtype=torch.bfloat16) / 10
    kv.clamp_(-1, 1)
    if c.big_values:
        kv.view(-1, d_qk)[::3] *= 2.0 ** 20
    om.quantize_kv_cache(kv, layout, out=cache_u8)
    selected = torch.zeros(num_tokens, dtype=torch.bool, device=DEVICE)
    selected[indices[used].long()] = True
    poison = ~selected.view(num_blocks, page)
    for view in token_byte_views(torch, storage, layout, num_blocks, page, stride):
        view[poison] = 255
    cache = cache_u8 if c.cache_dtype == "uint8" else cache_u8.view(getattr(torch, c.cache_dtype))
    return Paged(storage, cache, indices, lengths)


def sparse_sink(torch, kind, h_q, gen):
    if kind == "none":
        return None
    if kind in ("+inf", "-inf"):
        return torch.full((h_q,), float(kind), dtype=torch.float32, device=DEVICE)
    sink = torch.randn((h_q,), generator=gen, device=DEVICE)
    u = torch.randn((h_q,), generator=gen, device=DEVICE)
    sink[u > 0.5] = math.inf
    sink[u < -0.5] = -math.inf
    return sink


def sparse_q(torch, c: SparseCase, gen):
    q = torch.randn((c.b, c.s_q, c.h_q, SPARSE_D_QK[c.layout]), generator=gen, device=DEVICE).clamp_(-1, 1)
    if c.big_values:  # the big tokens' logits as usual (exact power-of-two scaling), the others' near 0
        q *= 2.0 ** -20
    return q.to(torch.bfloat16)


def run_sparse(torch, om, c: SparseCase, seed: int, repeat: bool):
    rng = random.Random(seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    zero_reqs = {i for i in range(c.b) if rng.random() < 0.5} if c.zero_len else set()
    main = sparse_paged(torch, om, c, c.main, zero_reqs, rng, gen)
    extra = None if c.extra is None else sparse_paged(torch, om, c, c.extra, zero_reqs, rng, gen)
    qs = [sparse_q(torch, c, gen) for _ in range(c.layers)]
    sink = sparse_sink(torch, c.sink, c.h_q, gen)
    scale = SPARSE_D_QK[c.layout] ** -0.55  # deliberately not the default
    indices = main.indices
    if c.noncontig:
        b, s_q, h_q, d_qk = qs[0].shape
        q_pad = torch.full((b + 1, s_q + 1, h_q + 1, d_qk + 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        qs = [q_pad[1:, :s_q, 1:, :d_qk].copy_(qs[0])]
        topk = indices.shape[-1]
        idx_pad = torch.full((b + 2, s_q + 1, -(-(topk + 5) // 4) * 4), INT32_MAX, dtype=torch.int32, device=DEVICE)
        indices = idx_pad[2:, 1:, :topk].copy_(indices)

    inputs = fingerprint(torch, qs + [main.storage, indices, main.lengths, sink] +
                         ([extra.storage, extra.indices, extra.lengths] if extra is not None else []))

    def call(q_l, meta, **kw):
        return om.flash_mla_with_kvcache(
            q_l, main.cache, None, None, D_V, meta, softmax_scale=scale, is_fp8_kvcache=True, indices=indices,
            attn_sink=sink, extra_k_cache=None if extra is None else extra.cache,
            extra_indices_in_kvcache=None if extra is None else extra.indices, topk_length=main.lengths,
            extra_topk_length=None if extra is None else extra.lengths, **kw)

    return (inputs, *run_layers(torch, om, call, qs,
                                lambda: out_buffers(torch, c.b, c.s_q, c.h_q, torch.bfloat16, c.out_buf), repeat))


# ---------------------------------------------------------------------------------------------------------------
# FP8 KV-cache codec
# ---------------------------------------------------------------------------------------------------------------
def codec_tokens(torch, n, d, gen):
    """(n, d) bf16 tokens: per 32-dim block magnitudes from 1e-30 to 3e38, all-zero, tiny and huge tokens, tiles with
    amax 448, and a few NaN / +-inf values (the inputs of tests/python/test_kv_cache.py, drawn on the GPU)."""
    x = torch.randn((n, d), generator=gen, device=DEVICE)
    exps = torch.randint(-40, 40, (n, d // 32, 1), generator=gen, device=DEVICE).float()
    x = (x.view(n, d // 32, 32) * torch.exp2(exps)).view(n, d)
    kind = torch.randint(0, 12, (n,), generator=gen, device=DEVICE)
    tiny = torch.randn((n, d), generator=gen, device=DEVICE) * 1e-30
    huge = (torch.randn((n, d), generator=gen, device=DEVICE) * 3e38).clamp(-3.3e38, 3.3e38)
    ints = (torch.randn((n, d), generator=gen, device=DEVICE) * 100).round().clamp(-448, 448)
    ints[:, 7] = 448.0  # tile amax exactly 448 -> scale 1
    x = torch.where((kind == 0)[:, None], torch.zeros_like(x), x)
    x = torch.where((kind == 1)[:, None], tiny, x)
    x = torch.where((kind == 2)[:, None], huge, x)
    x = torch.where((kind == 3)[:, None], ints, x)
    col = torch.randint(0, d, (n,), generator=gen, device=DEVICE)
    special = torch.full((n,), math.inf, device=DEVICE)
    special[torch.rand((n,), generator=gen, device=DEVICE) < 0.5] = -math.inf
    special[kind == 4] = math.nan
    rows = torch.arange(n, device=DEVICE)
    hit = (kind == 4) | (kind == 5)
    x[rows[hit], col[hit]] = special[hit]
    return x.to(torch.bfloat16)


def run_codec(torch, om, c: CodecCase, seed: int, repeat: bool):
    del repeat  # the codec is checked bit for bit against the CPU codec by the tests; one call each here
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    d, bpt = CODEC_FORMATS[c.fmt]
    ps = c.page_size
    packed = -(-ps * bpt // 16) * 16
    outputs = {}
    if c.op in ("quantize", "quantize_alloc"):
        nb = max(2, 1536 // ps)
        x = codec_tokens(torch, nb * ps, d, gen).view(nb, ps, 1, d)
        src = x
        if c.padded_src:  # rows d + 8 elements apart, pages ps + 1 rows apart, NaN around
            big = torch.full((nb, ps + 1, 1, d + 8), float("nan"), dtype=torch.bfloat16, device=DEVICE)
            src = big[:, :ps, :, :d].copy_(x)
        inputs = fingerprint(torch, [x])
        if c.op == "quantize":
            stride = packed + c.extra_bytes
            storage = torch.full((nb, stride), CODEC_POISON, dtype=torch.uint8, device=DEVICE)
            cache = torch.as_strided(storage, (nb, ps, 1, bpt), (stride, bpt, bpt, 1))
            om.quantize_kv_cache(src, c.fmt, out=cache)
            outputs["cache_storage"] = storage  # the bytes between pages must stay untouched
            back = torch.full((nb, ps + 1, 1, d + 8), -12345.0, dtype=torch.bfloat16, device=DEVICE)
            om.dequantize_kv_cache(cache, c.fmt, out=back[:, :ps, :, :d])
            outputs["dequantized_storage"] = back
        else:
            cache = om.quantize_kv_cache(src, c.fmt, page_stride_bytes=packed + c.extra_bytes)
            outputs["cache"] = cache  # the logical tokens only (the allocation's padding is not initialised)
            outputs["dequantized"] = om.dequantize_kv_cache(cache.view(torch.float8_e4m3fn), c.fmt)
        return inputs, outputs, None

    # append: distinct destination slots, about 20% negative (skipped), into a cache of random bytes.
    nb = max(2, 1024 // ps)
    total = nb * ps
    stride = packed + 32
    storage = torch.randint(0, 256, (nb, stride), generator=gen, device=DEVICE, dtype=torch.uint8)
    cache = torch.as_strided(storage, (nb, ps, 1, bpt), (stride, bpt, bpt, 1))
    slot_dt = getattr(torch, c.slot_dtype)
    if c.empty:
        inputs = fingerprint(torch, [storage])
        om.append_kv_cache(torch.empty((0, d), dtype=torch.bfloat16, device=DEVICE),
                           torch.empty(0, dtype=slot_dt, device=DEVICE), cache, c.fmt)
        om.append_kv_cache(torch.ones((5, d), dtype=torch.bfloat16, device=DEVICE),
                           torch.full((5,), -1, dtype=slot_dt, device=DEVICE), cache, c.fmt)
        outputs["cache_storage"] = storage
        return inputs, outputs, None
    n = max(1, total * 2 // 3)
    x = codec_tokens(torch, n, d, gen)
    slots = torch.randperm(total, generator=gen, device=DEVICE)[:n]
    skipped = torch.rand((n,), generator=gen, device=DEVICE) < 0.2
    neg = -torch.randint(1, 1000, (n,), generator=gen, device=DEVICE)
    slots = torch.where(skipped, neg, slots).to(slot_dt)
    rows = torch.zeros((n, d + 8), dtype=torch.bfloat16, device=DEVICE)[:, :d].copy_(x)  # padded row stride
    new_kv = rows[:, None, :] if c.fmt == "v32" else rows
    inputs = fingerprint(torch, [storage, x, slots])
    om.append_kv_cache(new_kv, slots, cache, c.fmt)
    outputs["cache_storage"] = storage
    return inputs, outputs, None


RUNNERS = {"dense_decode": run_dense, "sparse_decode": run_sparse, "kv_cache": run_codec}


# ---------------------------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------------------------
def record(args, cases) -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"compare_outputs: recording needs torch with a CUDA device ({exc})", file=sys.stderr)
        return 2
    try:
        import openmla as om
    except ImportError as exc:
        print(f"compare_outputs: cannot import openmla ({exc}); put the build's python/ folder on PYTHONPATH",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("compare_outputs: no CUDA device: nothing recorded", file=sys.stderr)
        return 2
    tensors_dir = os.path.abspath(args.save_tensors) if args.save_tensors else None
    if tensors_dir:
        os.makedirs(tensors_dir, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    result = {
        "tool": "compare_outputs", "format": FORMAT_VERSION, "cases_digest": cases_digest(cases),
        "openmla": {"version": om.version(), "build_commit": om.build_commit(),
                    "package": os.path.dirname(om.__file__)},
        "torch": torch.__version__, "device": f"{props.name} ({props.multi_processor_count} SMs)",
        "repeat": not args.no_repeat, "tensors_dir": tensors_dir, "cases": {},
    }
    t0 = time.time()
    n_err = 0
    for i, c in enumerate(cases):
        t1 = time.time()
        entry = {"family": c.family}
        try:
            inputs, outputs, same = RUNNERS[c.family](torch, om, c, case_seed(c.name), not args.no_repeat)
            torch.cuda.synchronize()
            entry["inputs"] = inputs
            entry["repeat_identical"] = same
            entry["outputs"] = {}
            for key, t in outputs.items():
                data = tensor_bytes(t)
                desc = describe(torch, t, data)
                if tensors_dir:
                    fname = f"{safe_file_stem(c.name)}.{key}.bin"
                    with open(os.path.join(tensors_dir, fname), "wb") as f:
                        f.write(data)
                    desc["file"] = fname
                entry["outputs"][key] = desc
        except Exception as exc:  # recorded, and the next case still runs
            entry["error"] = f"{type(exc).__name__}: {exc}"
            n_err += 1
        entry["seconds"] = round(time.time() - t1, 3)
        result["cases"][c.name] = entry
        status = entry.get("error", "ok")
        if entry.get("repeat_identical") is False:
            status = "ok, but the repeat gave other bytes (NOT deterministic)"
        print(f"[{i + 1:3d}/{len(cases)}] {c.name}: {status} ({entry['seconds']:.2f} s)", flush=True)
        if (i + 1) % 10 == 0 or i + 1 == len(cases):
            write_json(args.out, result)
    result["seconds"] = round(time.time() - t0, 1)
    write_json(args.out, result)
    print(f"compare_outputs: {len(cases)} cases, {n_err} errors, {result['seconds']} s -> {args.out} "
          f"(openmla {result['openmla']['version']}, commit {result['openmla']['build_commit']})")
    return 0


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------------------------------
def _load_values(path, dtype):
    """A saved tensor as a flat float64 (float dtypes) or int64 numpy array; None without numpy."""
    try:
        import numpy as np
    except ImportError:
        return None
    raw = np.fromfile(path, dtype=np.uint8)
    if dtype == "bfloat16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    table = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "uint8": np.uint8, "int8": np.int8,
             "int32": np.int32, "int64": np.int64, "float8_e4m3fn": np.uint8}
    if dtype not in table:
        return None
    v = raw.view(table[dtype])
    return v.astype(np.float64) if v.dtype.kind == "f" else v.astype(np.int64)


def _tensor_dir(data, json_path):
    d = data.get("tensors_dir")
    if not d:
        return None
    if os.path.isdir(d):
        return d
    near = os.path.join(os.path.dirname(os.path.abspath(json_path)), os.path.basename(d))  # moved with the JSON
    return near if os.path.isdir(near) else None


def _diff_detail(a_desc, b_desc, a_dir, b_dir) -> str:
    """How two differing outputs differ: the max absolute difference where both are finite, the number of elements
    that differ, and where NaN / inf sit differently (saved tensors needed; otherwise the recorded counts)."""
    if a_desc["shape"] != b_desc["shape"] or a_desc["dtype"] != b_desc["dtype"]:
        return f"shape/dtype {a_desc['shape']} {a_desc['dtype']} vs {b_desc['shape']} {b_desc['dtype']}"
    counts = ""
    if "nan" in a_desc and (a_desc["nan"], a_desc["inf"]) != (b_desc.get("nan"), b_desc.get("inf")):
        counts = f"; NaN {a_desc['nan']} vs {b_desc.get('nan')}, inf {a_desc['inf']} vs {b_desc.get('inf')}"
    if not (a_dir and b_dir and "file" in a_desc and "file" in b_desc):
        return "bytes differ (no saved tensors: rerun with --save-tensors for the max abs diff)" + counts
    fa, fb = os.path.join(a_dir, a_desc["file"]), os.path.join(b_dir, b_desc["file"])
    if not (os.path.exists(fa) and os.path.exists(fb)):
        return "bytes differ (saved tensor files missing)" + counts
    a, b = _load_values(fa, a_desc["dtype"]), _load_values(fb, b_desc["dtype"])
    if a is None or b is None or a.shape != b.shape:
        return "bytes differ (tensor files unreadable here: numpy missing or unknown dtype)" + counts
    import numpy as np

    if a.dtype.kind != "f":
        n = int((a != b).sum())
        return f"{n} of {a.size} elements differ, max |a-b| = {int(np.abs(a - b).max()) if n else 0}"
    both_nan = np.isnan(a) & np.isnan(b)
    differ = ~(both_nan | (a == b))
    finite = np.isfinite(a) & np.isfinite(b)
    max_abs = float(np.abs(a[finite] - b[finite]).max()) if finite.any() else 0.0
    special = int((differ & ~finite).sum())
    text = f"max |a-b| = {max_abs:.3g} over {int(differ.sum())} of {a.size} elements"
    if special:
        text += f" ({special} with NaN/inf on one side only or inf of another sign)"
    return text


def check(path_a, path_b, out=None) -> int:
    """Compares two recorded files; prints a table and the differing cases. Returns 0 when every case of both files
    is present in both, ran without error in both, saw the same inputs, repeated identically and gave the same
    bytes; 1 otherwise."""
    out = sys.stdout if out is None else out
    with open(path_a) as f:
        a = json.load(f)
    with open(path_b) as f:
        b = json.load(f)
    for name, data in ((path_a, a), (path_b, b)):
        if data.get("tool") != "compare_outputs" or "cases" not in data:
            raise SystemExit(f"compare_outputs --check: {name} is not a file written by compare_outputs.py --out")
    a_dir, b_dir = _tensor_dir(a, path_a), _tensor_dir(b, path_b)

    def label(data):
        o = data.get("openmla", {})
        return (f"openmla {o.get('version')} (commit {o.get('build_commit')}, {o.get('package')}), "
                f"{data.get('device')}, torch {data.get('torch')}")

    print(f"A: {path_a}: {label(a)}", file=out)
    print(f"B: {path_b}: {label(b)}", file=out)
    if a.get("cases_digest") != b.get("cases_digest"):
        print("note: the two files were written from different case lists (other versions of compare_outputs.py); "
              "the cases of one file only count as different", file=out)

    names = list(a["cases"]) + [n for n in b["cases"] if n not in a["cases"]]
    per_family = {}
    problems = []  # (name, reason)
    for name in names:
        ca, cb = a["cases"].get(name), b["cases"].get(name)
        family = (ca or cb).get("family", "?")
        row = per_family.setdefault(family, [0, 0, 0])
        row[0] += 1
        reasons = []
        if ca is None or cb is None:
            reasons.append(f"only in {'A' if cb is None else 'B'}")
        else:
            for side, c in (("A", ca), ("B", cb)):
                if "error" in c:
                    reasons.append(f"error in {side}: {c['error'][:300]}")
                elif c.get("repeat_identical") is False:
                    reasons.append(f"not deterministic in {side} (a repeat with a fresh schedule gave other bytes)")
            if not reasons:
                if ca.get("inputs") != cb.get("inputs"):
                    reasons.append("inputs differ (the generator or the codec that built them is not the same)")
                oa, ob = ca["outputs"], cb["outputs"]
                for key in list(oa) + [k for k in ob if k not in oa]:
                    if key not in oa or key not in ob:
                        reasons.append(f"{key}: only in {'A' if key in oa else 'B'}")
                    elif oa[key]["sha256"] != ob[key]["sha256"] or oa[key]["shape"] != ob[key]["shape"]:
                        reasons.append(f"{key}: {_diff_detail(oa[key], ob[key], a_dir, b_dir)}")
        if reasons:
            row[2] += 1
            problems.append((name, reasons))
        else:
            row[1] += 1

    total = [sum(r[i] for r in per_family.values()) for i in range(3)]
    print(f"\n{'family':16s} {'cases':>6s} {'identical':>10s} {'different':>10s}", file=out)
    for family, (n, same, diff) in per_family.items():
        print(f"{family:16s} {n:6d} {same:10d} {diff:10d}", file=out)
    print(f"{'all':16s} {total[0]:6d} {total[1]:10d} {total[2]:10d}", file=out)
    if problems:
        print(f"\n{len(problems)} case(s) differ:", file=out)
        for name, reasons in problems:
            print(f"  {name}", file=out)
            for r in reasons:
                print(f"      {r}", file=out)
        print("compare_outputs --check: DIFFERENT", file=out)
        return 1
    print("compare_outputs --check: all outputs bit-identical", file=out)
    return 0


# ---------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Record the outputs of a fixed matrix of openmla calls (sha256 per output tensor) with the "
                    "openmla on PYTHONPATH, or compare two recordings.",
        epilog="Example: compare_outputs.py --out now.json; compare_outputs.py --check pre.json now.json")
    ap.add_argument("--out", metavar="JSON", help="record: run the cases and write their digests here")
    ap.add_argument("--save-tensors", metavar="DIR", help="record: also write every output's raw bytes into DIR")
    ap.add_argument("--filter", metavar="REGEX", help="only the cases whose name matches (re.search)")
    ap.add_argument("--no-repeat", action="store_true",
                    help="record: skip the second call of each attention case (the determinism check)")
    ap.add_argument("--check", nargs=2, metavar=("A.json", "B.json"),
                    help="compare two recordings; exit status 1 on any difference")
    ap.add_argument("--list", action="store_true", help="print the case names and exit (needs no torch)")
    args = ap.parse_args(argv)

    if args.check:
        if args.out or args.list:
            ap.error("argument --check: not allowed with --out or --list")
        return check(*args.check)
    cases = all_cases()
    if args.filter:
        try:
            pattern = re.compile(args.filter)
        except re.error as exc:
            ap.error(f"argument --filter: not a regular expression: {exc}")
        cases = [c for c in cases if pattern.search(c.name)]
    if args.list:
        for c in cases:
            print(c.name)
        counts = {}
        for c in cases:
            counts[c.family] = counts.get(c.family, 0) + 1
        print(f"{len(cases)} cases ({', '.join(f'{k} {v}' for k, v in counts.items())}), digest {cases_digest(cases)}")
        return 0
    if not args.out:
        ap.error("one of --out, --check or --list is required")
    if not cases:
        ap.error(f"argument --filter: no case matches {args.filter!r}")
    return record(args, cases)


if __name__ == "__main__":
    sys.exit(main())
