#!/usr/bin/env bash
# How a kernel's loop addresses change its speed (docs/dense-decode.md, "Code placement", decision dense-v17).
# Dense decode (default): for each N, the kernel's never-taken placement shim gets N copies of its prefetch (the
# pair loop's SASS stays the same; it moves 16 bytes per copy). Sparse decode (SWEEP_KERNEL=sparse; 0-4 prefetches
# measured flat, docs/sparse-decode.md): a never-taken block of N prefetches is inserted at the kernel's entry
# (N = 0: the shipped kernel), which moves every role's loops. Each build is incremental (the Python extension
# only) and the benchmark runs the selected rows once. The source file is restored at the end.
#
#   SWEEP_N="1 25 5 9 17 33 1" SWEEP_FILTER='sq2_sk32768_varlen$|sq2_sk4096_varlen$' bash tools/placement_sweep.sh
#   SWEEP_KERNEL=sparse SWEEP_N="0 1 2 4 8 0" SWEEP_FILTER='b2_|b64_|b128_hq128' bash tools/placement_sweep.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
which=${SWEEP_KERNEL:-dense}
if [[ $which == sparse ]]; then
  kernel=src/kernels/sparse_decode/kernel.cuh
  suite=sparse_decode
  default_filter='b2_|b64_|b128_hq128'
else
  kernel=src/kernels/dense_decode/kernel.cuh
  suite=dense_decode
  default_filter='sq2_sk32768_varlen$|sq2_sk4096_varlen$'
fi
bdir=${SWEEP_BUILD_DIR:-build-gpu}
out=${OUT:-$root/$bdir/placement}
mkdir -p "$out"
py=$(command -v python3)
cp "$kernel" "$out/kernel.cuh.orig"
trap 'cp "$out/kernel.cuh.orig" "$root/$kernel"' EXIT
bash tools/setup_deps.sh --offline >"$out/setup.log" 2>&1 || { echo "setup_deps failed"; exit 1; }
cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" >"$out/cmake.log" 2>&1 || exit 1
for n in ${SWEEP_N:-1 25 5 9 17 33 1}; do
  cp "$out/kernel.cuh.orig" "$kernel"
  "$py" - "$kernel" "$n" "$which" <<'PY'
import sys
path, n, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = open(path).read()
if which == "sparse":
    anchor = "  if (tid == 0) OPENMLA_TIMELINE(kEntry);\n"
    assert s.count(anchor) == 1, "the sparse kernel's entry stamp is not where the sweep expects it"
    line = '    asm volatile("prefetch.global.L2 [%0+0];" ::"l"(p.q) : "memory");\n'
    shim = ("  if (p.batch < 0) {  // placement sweep (tools/placement_sweep.sh), never taken\n" + line * n + "  }\n") if n else ""
    s = s.replace(anchor, anchor + shim, 1)
else:
    line = '      asm volatile("prefetch.global.L2 [%0+0];" ::"l"(params.q) : "memory");\n'
    assert s.count(line) == 1, "the placement shim's prefetch line is not in the kernel"
    s = s.replace(line, line * n, 1)
open(path, "w").write(s)
PY
  if ! cmake --build "$bdir" -j "$(nproc)" --target _openmla >"$out/build_$n.log" 2>&1; then
    echo "N=$n: build failed"; tail -5 "$out/build_$n.log"; continue
  fi
  offs=""
  if [[ $which == dense ]] && command -v cuobjdump >/dev/null; then
    offs=$("$py" tools/sass_loops.py --offsets "$bdir/CMakeFiles/openmla.dir/src/kernels/dense_decode/launch.cu.o" \
           --min-hgmma 80 2>/dev/null | head -1 | grep -oE 'loop 0x[0-9a-f]+.*')
  elif command -v cuobjdump >/dev/null; then
    # The V3.2 crossover kernel (second function): WG1's block loop (4 HGMMA) and WG0's (36 + 4).
    obj="$bdir/CMakeFiles/openmla.dir/src/kernels/sparse_decode/launch.cu.o"
    offs="WG1 $("$py" tools/sass_loops.py --offsets "$obj" --min-hgmma 4 2>/dev/null | sed -n 2p | grep -oE '0x[0-9a-f]+\.\.' | head -1)"
    offs="$offs WG0 $("$py" tools/sass_loops.py --offsets "$obj" --min-hgmma 30 2>/dev/null | sed -n 2p | grep -oE '0x[0-9a-f]+\.\.' | head -1)"
  fi
  PYTHONPATH="$root/python:$root/.deps/py" "$py" benchmarks/run.py --suite "$suite" \
      --filter "${SWEEP_FILTER:-$default_filter}" --json "$out/n$n.json" >"$out/bench_$n.log" 2>&1
  "$py" - "$out/n$n.json" "$n" "$offs" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cells = "  ".join(f"{r['name'].replace('b128_hq128_', '')} {r['ratio']:.3f} ({r['time_us']:.1f} us)"
                  for r in d["records"])
print(f"N={sys.argv[2]:>3}  {sys.argv[3]}  {cells}")
PY
done
