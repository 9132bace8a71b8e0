#!/usr/bin/env bash
# Dense decode: how the pair loop's address changes its speed (perf-notes, session 6, "The pair loop's placement").
# For each N, the kernel's never-taken placement shim gets N copies of its prefetch (the loop's SASS stays the same;
# it moves 16 bytes per copy), the Python extension is rebuilt incrementally, and the benchmark runs the selected
# dense rows once. The source file is restored at the end.
#
#   SWEEP_N="1 25 5 9 17 33 1" SWEEP_FILTER='sq2_sk32768_varlen$|sq2_sk4096_varlen$' bash tools/placement_sweep.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
kernel=src/kernels/dense_decode/kernel.cuh
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
  "$py" - "$kernel" "$n" <<'PY'
import sys
path, n = sys.argv[1], int(sys.argv[2])
s = open(path).read()
line = '      asm volatile("prefetch.global.L2 [%0+0];" ::"l"(params.q) : "memory");\n'
assert s.count(line) == 1, "the placement shim's prefetch line is not in the kernel"
open(path, "w").write(s.replace(line, line * n, 1))
PY
  if ! cmake --build "$bdir" -j "$(nproc)" --target _openmla >"$out/build_$n.log" 2>&1; then
    echo "N=$n: build failed"; tail -5 "$out/build_$n.log"; continue
  fi
  offs=""
  if command -v cuobjdump >/dev/null; then
    offs=$("$py" tools/sass_loops.py --offsets "$bdir/CMakeFiles/openmla.dir/src/kernels/dense_decode/launch.cu.o" \
           --min-hgmma 80 2>/dev/null | head -1 | grep -oE 'loop 0x[0-9a-f]+.*')
  fi
  PYTHONPATH="$root/python:$root/.deps/py" "$py" benchmarks/run.py --suite dense_decode \
      --filter "${SWEEP_FILTER:-sq2_sk32768_varlen\$|sq2_sk4096_varlen\$}" --json "$out/n$n.json" >"$out/bench_$n.log" 2>&1
  "$py" - "$out/n$n.json" "$n" "$offs" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cells = "  ".join(f"{r['name'].replace('b128_hq128_', '')} {r['ratio']:.3f} ({r['time_us']:.1f} us)" for r in d["records"])
print(f"N={sys.argv[2]:>3}  {sys.argv[3]}  {cells}")
PY
done
