#!/usr/bin/env python3
"""Generates src/common/wgmma_ops.cuh: the wgmma.mma_async wrappers with their long operand lists.

Writing 128 accumulator operands by hand invites mistakes; this script emits them. Run it after changing
the list of shapes below and commit the output.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "src", "common", "wgmma_ops.cuh")

SHAPES = [64, 256]  # N of the m64nNk16 instructions the kernels use
# Shapes added later, emitted after the ones above so that the existing wrappers keep their place in the file:
# N = 128 for dense MHA prefill (S = Q K^T over 128 keys, O += P V over d_v = 128).
ADDED_SHAPES = [128]
# The dense MHA backward: N = 192 (dK += dS^T Q over d_qk = 192), and the transposed-A shared-memory form at N = 64
# (dQ = dS K with dS stored key-major, i.e. MN-major as the A operand).
BWD_SHAPES = [192]
TRANS_A_SHAPES = [64]
# ... and at N = 128 (the d_qk 192 backward's two dQ sub-blocks of one warpgroup in one GEMM), emitted last.
TRANS_A_ADDED_SHAPES = [128]
TYPES = [("bf16", "bf16"), ("f16", "f16")]
# The FP8 prefill (docs/fp8-prefill-design.md): e4m3 x e4m3 -> f32, m64nNk32, shared-memory A (Q K^T) and register A
# (P V). 8-bit wgmma has no transpose immediates: both operands are K-major in shared memory. N = 64 (sparse prefill's
# 64-key blocks), 128 (the dense block, d_v), 192 and 256 (wider key blocks, to measure).
FP8_SHAPES = [64, 128, 192, 256]
FP8_TYPE = "e4m3"


def operand_list(start, count):
    return ", ".join(f"%{i}" for i in range(start, start + count))


def gen_ss(n, t, trans_a=False):
    """SS form; trans_a: A read MN-major (the transposed-A immediate set), a wrapper named *_ss_ta_*."""
    regs = n // 2
    lines = []
    a_what = "smem desc, MN-major: transposed" if trans_a else "smem desc"
    lines.append(f"// D(64x{n}, f32) (+)= A(64x16, {a_what}) * B({n}x16, smem desc); element type {t}.")
    lines.append(f"template <int kTransB>")
    name = f"wgmma_m64n{n}k16_ss{'_ta' if trans_a else ''}_{t}"
    lines.append(f"__device__ __forceinline__ void {name}(float (&d)[{regs}], uint64_t desc_a, uint64_t desc_b, int scale_d) {{")
    lines.append("  asm volatile(")
    lines.append("      \"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" + str(regs + 2) + ", 0;\\n\"")
    lines.append(f"      \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} \"")
    lines.append(f"      \"{{{operand_list(0, regs)}}}, \"")
    lines.append(f"      \"%{regs}, %{regs + 1}, p, 1, 1, {1 if trans_a else 0}, %{regs + 3};\\n}}\\n\"")
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    lines.append(f"      : {outs}")
    lines.append('      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));')
    lines.append("}")
    return "\n".join(lines)


def gen_rs(n, t):
    regs = n // 2
    lines = []
    lines.append(f"// D(64x{n}, f32) (+)= A(64x16, registers) * B({n}x16, smem desc); element type {t}.")
    lines.append(f"template <int kTransB>")
    lines.append(f"__device__ __forceinline__ void wgmma_m64n{n}k16_rs_{t}(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {{")
    lines.append("  asm volatile(")
    lines.append("      \"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" + str(regs + 5) + ", 0;\\n\"")
    lines.append(f"      \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} \"")
    lines.append(f"      \"{{{operand_list(0, regs)}}}, \"")
    lines.append(f"      \"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, %{regs + 6};\\n}}\\n\"")
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    lines.append(f"      : {outs}")
    lines.append('      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB));')
    lines.append("}")
    return "\n".join(lines)


def gen_ss_fp8(n, t):
    regs = n // 2
    lines = []
    lines.append(f"// D(64x{n}, f32) (+)= A(64x32, smem desc, K-major) * B({n}x32, smem desc, K-major); element type {t}.")
    lines.append(f"__device__ __forceinline__ void wgmma_m64n{n}k32_ss_{t}(float (&d)[{regs}], uint64_t desc_a, uint64_t desc_b, int scale_d) {{")
    lines.append("  asm volatile(")
    lines.append("      \"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" + str(regs + 2) + ", 0;\\n\"")
    lines.append(f"      \"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{t}.{t} \"")
    lines.append(f"      \"{{{operand_list(0, regs)}}}, \"")
    lines.append(f"      \"%{regs}, %{regs + 1}, p, 1, 1;\\n}}\\n\"")
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    lines.append(f"      : {outs}")
    lines.append('      : "l"(desc_a), "l"(desc_b), "r"(scale_d));')
    lines.append("}")
    return "\n".join(lines)


def gen_rs_fp8(n, t):
    regs = n // 2
    lines = []
    lines.append(f"// D(64x{n}, f32) (+)= A(64x32, registers: 4 x 4 {t}) * B({n}x32, smem desc, K-major); element type {t}.")
    lines.append(f"__device__ __forceinline__ void wgmma_m64n{n}k32_rs_{t}(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {{")
    lines.append("  asm volatile(")
    lines.append("      \"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" + str(regs + 5) + ", 0;\\n\"")
    lines.append(f"      \"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{t}.{t} \"")
    lines.append(f"      \"{{{operand_list(0, regs)}}}, \"")
    lines.append(f"      \"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1;\\n}}\\n\"")
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    lines.append(f"      : {outs}")
    lines.append('      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));')
    lines.append("}")
    return "\n".join(lines)


def main():
    parts = [
        "// GENERATED by tools/gen_wgmma.py -- do not edit by hand.",
        "// wgmma.mma_async wrappers (sm_90a). Accumulators are fp32; scale_d = 0 overwrites D, 1 accumulates.",
        "// kTransB = 0: B is K-major in shared memory; 1: B is MN-major (transposed), allowed for 16-bit types.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace openmla::ptx {",
        "",
    ]
    for shapes in (SHAPES, ADDED_SHAPES):
        for t, _ in TYPES:
            for n in shapes:
                parts.append(gen_ss(n, t))
                parts.append("")
                parts.append(gen_rs(n, t))
                parts.append("")
    for t, _ in TYPES:
        for n in BWD_SHAPES:
            parts.append(gen_ss(n, t))
            parts.append("")
            parts.append(gen_rs(n, t))
            parts.append("")
        for n in TRANS_A_SHAPES:
            parts.append(gen_ss(n, t, trans_a=True))
            parts.append("")
    for t, _ in TYPES:
        for n in TRANS_A_ADDED_SHAPES:
            parts.append(gen_ss(n, t, trans_a=True))
            parts.append("")
    parts.append("// e4m3 x e4m3 -> f32, k32 (32 bytes of K per slice, as 16 bf16 columns). No kTransB: 8-bit wgmma reads both")
    parts.append("// operands K-major only (the transpose immediates exist for .f16 / .bf16 alone).")
    parts.append("")
    for n in FP8_SHAPES:
        parts.append(gen_ss_fp8(n, FP8_TYPE))
        parts.append("")
        parts.append(gen_rs_fp8(n, FP8_TYPE))
        parts.append("")
    parts.append("}  // namespace openmla::ptx")
    with open(OUT, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
