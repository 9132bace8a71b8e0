#!/usr/bin/env bash
# A/B benchmark of several source trees on ONE warm GPU machine (card-to-card spread is 1-2 %, so versions are
# compared only inside one call; docs/perf-method.md). Each tree is built (the Python extension only) and the
# trees' benchmark runs alternate, ROUNDS times, so a clock drift hits every version alike.
#
#   AB_TREES=".ab/base .ab/v16 ." AB_SUITE=dense_decode AB_FILTER='sq2_sk4096' [AB_ROUNDS=2] bash tools/ab_bench.sh
#
# A tree other than "." is a `git archive <rev>` extracted under .ab/ (ignored by git: carry it to the device):
#   mkdir -p .ab/base && git archive <rev> | tar -x -C .ab/base
# It reuses this checkout's .deps. Prints one table: case x tree, ratio to the target per round, and the median.
# JSON per tree and round under ${OUT:-build-gpu/ab}/.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
trees=(${AB_TREES:?set AB_TREES})
suite=${AB_SUITE:-dense_decode}
filter=${AB_FILTER:-.}
rounds=${AB_ROUNDS:-2}
out=${OUT:-$root/build-gpu/ab}
mkdir -p "$out"
py=$(command -v python3)
jobs=$(nproc)

# AB_CMAKE_ARGS: extra CMake arguments for every tree (e.g. only the family under test:
#   -DOPENMLA_ENABLE_DENSE_DECODE=OFF -DOPENMLA_ENABLE_KV_CACHE=OFF -DOPENMLA_ENABLE_SPARSE_PREFILL=OFF).
# The trees build concurrently (each with all cores; ninja's jobs share them).
cmake_args=(${AB_CMAKE_ARGS:-})
pids=()
for t in "${trees[@]}"; do
  [[ $t != . && ! -e $t/.deps ]] && ln -sfn "$root/.deps" "$t/.deps"
  name=$(echo "$t" | tr '/.' '__')
  echo "== build $t"
  (cd "$t" && cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" "${cmake_args[@]}" \
      >"$out/build_$name.log" 2>&1 && cmake --build build-ab -j "$jobs" --target _openmla >>"$out/build_$name.log" 2>&1) &
  pids+=($!)
done
i=0
for t in "${trees[@]}"; do
  name=$(echo "$t" | tr '/.' '__')
  if ! wait "${pids[$i]}"; then echo "build of $t FAILED"; tail -30 "$out/build_$name.log"; exit 1; fi
  i=$((i + 1))
done
[[ -n ${AB_BUILD_ONLY:-} ]] && exit 0

for r in $(seq 1 "$rounds"); do
  for t in "${trees[@]}"; do
    name=$(echo "$t" | tr '/.' '__')
    (cd "$t" && PYTHONPATH="$PWD/python:$root/.deps/py" "$py" benchmarks/run.py --suite "$suite" --filter "$filter" \
        --json "$out/ab_${name}_r$r.json" >"$out/ab_${name}_r$r.log" 2>&1) || { echo "bench $t round $r failed"; tail -20 "$out/ab_${name}_r$r.log"; }
  done
done

"$py" - "$out" "$rounds" "${trees[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, trees = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for t in trees:
    name = t.replace("/", "_").replace(".", "_")
    for r in range(1, rounds + 1):
        p = os.path.join(out, f"ab_{name}_r{r}.json")
        if not os.path.exists(p):
            continue
        data = json.load(open(p))
        recs = data["records"] if isinstance(data, dict) and "records" in data else data
        for rec in recs:
            key = rec.get("name") or rec.get("case")
            val = rec.get("ratio")
            if val is None and rec.get("time_us"):
                val = rec["time_us"]
            rows.setdefault(key, {}).setdefault(t, []).append((val, rec.get("time_us")))
print(f"{'case':44s} " + " ".join(f"{t[-14:]:>26s}" for t in trees))
for key, per in rows.items():
    cells = []
    for t in trees:
        v = per.get(t, [])
        if not v:
            cells.append(f"{'-':>26s}"); continue
        ratios = [x[0] for x in v if x[0] is not None]
        times = [x[1] for x in v if x[1] is not None]
        cells.append(f"{'/'.join(f'{x:.3f}' for x in ratios):>17s} {statistics.median(times):7.1f}us")
    print(f"{key[:44]:44s} " + " ".join(cells))
PY
