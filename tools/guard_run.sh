#!/usr/bin/env bash
# The GPU side of a refactor's guard (docs/architecture.md, "Device layer"), in stages that fit the device tool's
# 10-minute calls on one warm machine: this tree against an older one extracted under .ab/base (ignored by git: carry
# it with .deps/wheels and .deps/googletest).
#
#   here:  rm -rf .ab/base && mkdir -p .ab/base && git archive <rev> | tar -x -C .ab/base
#   there: OPENMLA_GIT_COMMIT=<sha> GUARD_STAGES="build record" bash tools/guard_run.sh
#
# Stages (GUARD_STAGES, in this order):
#   build   this tree in build-gpu/ (everything, tests and sanitizer program included) and the Python extension of both
#           trees in build-ab/ (tools/ab_bench.sh's folders), all at once with every core
#   record  the prefill GPU tests under both builds with their outputs hashed (tests/python/output_record.py; the
#           older build through OPENMLA_PACKAGE_DIR), then the comparison: every call's outputs bit-identical
#   tests   tools/gpu_check.sh without the benchmarks: C++ tests, every Python test, memcheck / racecheck / synccheck
#   ab      tools/ab_bench.sh, base vs this tree, on GUARD_AB ("suite:filter" words; default: the prefill suites'
#           and dense decode's reference rows), GUARD_AB_ROUNDS rounds (default 2)
#   host    the host_overhead suite under both builds (two rounds each, alternating)
#   trace   the trace build's reader on every traced kernel (tools/diag/kernel_trace.py), then the trace build's
#           extension is replaced by the production one again
#   bench   benchmarks/run.py on GUARD_BENCH_SUITES (default: mha_prefill_fwd,sparse_prefill,dense_decode): the
#           history JSON of this commit
# Everything a stage writes goes under build-gpu/guard/<stage>/ and, with $OUT set, comes back as $OUT/<stage>.tgz
# (the device tool returns at most 8 files). Each stage prints its summary; the exit status is non-zero if one failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
py=$(command -v python3)
jobs=$(nproc)
stages=${GUARD_STAGES:-build record}
base=$root/.ab/base
logs_root=$root/build-gpu/guard
mkdir -p "$logs_root"
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
say() { echo "[guard $(( $(date +%s) - t0 ))s] $*"; }
fail() { say "FAILED: $*"; status=1; }
pack() {  # stage
  [[ -n ${OUT:-} ]] && tar -czf "$OUT/$1.tgz" -C "$logs_root" "$1" 2>/dev/null
}
[[ -f $base/CMakeLists.txt ]] || { echo "guard_run: no older tree in .ab/base (see the header)"; exit 2; }
[[ -e $base/.deps ]] || ln -sfn "$root/.deps" "$base/.deps"
# The device tool copies a carried .ab/ afresh on every call (replacing what a previous call built there), so every
# stage that runs the older tree's extension first makes sure it is built (a no-op when it is).
base_ext() {  # log
  (cd "$base" && cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" &&
     cmake --build build-ab -j "$jobs" --target _openmla) >>"$1" 2>&1 || fail "extension of the base tree ($1)"
}

for stage in $stages; do
  d=$logs_root/$stage
  rm -rf "$d" && mkdir -p "$d"
  say "stage $stage"
  case $stage in
    build)
      bash tools/setup_deps.sh --offline >"$d/deps.log" 2>&1 || fail "setup_deps"
      cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py")
      (cmake -S . -B build-gpu "${cfg[@]}" -DOPENMLA_PTXAS_VERBOSE=ON && cmake --build build-gpu -j "$jobs") \
        >"$d/new_full.log" 2>&1 &
      p1=$!
      (cmake -S . -B build-ab "${cfg[@]}" && cmake --build build-ab -j "$jobs" --target _openmla) >"$d/new_ext.log" 2>&1 &
      p2=$!
      (cd "$base" && cmake -S . -B build-ab "${cfg[@]}" && cmake --build build-ab -j "$jobs" --target _openmla) \
        >"$d/base_ext.log" 2>&1 &
      p3=$!
      wait $p1 || fail "build of this tree (new_full.log)"
      wait $p2 || fail "extension of this tree (new_ext.log)"
      wait $p3 || fail "extension of the base tree (base_ext.log)"
      grep -h "ptxas warning" "$d"/new_full.log | sort -u | head -20
      ;;
    record)
      base_ext "$d/base_ext.log"
      files=(tests/python/test_mha_prefill.py tests/python/test_mha_prefill_api.py tests/python/test_sparse_prefill.py)
      OPENMLA_RECORD_OUTPUTS=$d/new.jsonl PYTHONPATH=$root/.deps/py timeout -k 5 400 \
        "$py" -m pytest -q -p no:cacheprovider "${files[@]}" >"$d/new.log" 2>&1 || fail "prefill tests, this tree"
      tail -1 "$d/new.log"
      OPENMLA_PACKAGE_DIR=$base/python OPENMLA_RECORD_OUTPUTS=$d/base.jsonl PYTHONPATH=$root/.deps/py \
        timeout -k 5 400 "$py" -m pytest -q -p no:cacheprovider "${files[@]}" >"$d/base.log" 2>&1 ||
        fail "prefill tests, base tree"
      tail -1 "$d/base.log"
      "$py" tests/python/output_record.py --check "$d/base.jsonl" "$d/new.jsonl" >"$d/check.txt" 2>&1 ||
        fail "outputs differ (check.txt)"
      grep -v "^$" "$d/check.txt" | tail -15
      ;;
    tests)
      OUT= GPU_CHECK_SKIP_BENCH=1 PYTEST_TIMEOUT=${GUARD_PYTEST_TIMEOUT:-330} SANITIZE_TIMEOUT=${GUARD_SANITIZE_TIMEOUT:-100} \
        bash tools/gpu_check.sh >"$d/gpu_check.log" 2>&1 || fail "gpu_check"
      cp -r build-gpu/gpu_check "$d/logs" 2>/dev/null
      sed -n '/gpu_check summary/,$p' "$d/gpu_check.log"
      ;;
    ab)
      default_ab="sparse_prefill:v32_hq128_topk2048_skv(8k|128k)|v32_hq64_topk2048_skv8k|model1_hq64_topk512_skv8k|model1_hq128_topk1024_skv32k"
      default_ab+=" mha_prefill_fwd:b2_s4k_d192_causal_h128|b2_s4k_d128|b16_s1k_d192_causal_h128|b2_s4k_d192_causal_h16|b16_s1k_d192_causal_h16"
      default_ab+=" dense_decode:b128_hq128_sq1_sk4096_varlen\$|b128_hq128_sq2_sk32768_varlen\$|b128_hq16_sq1_sk4096"
      for spec in ${GUARD_AB:-$default_ab}; do
        suite=${spec%%:*}
        filter=${spec#*:}
        OUT=$d/$suite AB_TREES=".ab/base ." AB_SUITE=$suite AB_FILTER=$filter AB_ROUNDS=${GUARD_AB_ROUNDS:-2} \
          bash tools/ab_bench.sh >"$d/$suite.txt" 2>&1 || fail "ab_bench $suite"
        echo "== $suite"
        grep -v "^== build" "$d/$suite.txt" | tail -30
      done
      ;;
    host)
      base_ext "$d/base_ext.log"
      for r in 1 2 3; do
        for t in "$base" "$root"; do
          name=$([[ $t == "$base" ]] && echo base || echo new)
          (cd "$t" && PYTHONPATH=$t/python:$root/.deps/py timeout -k 5 240 "$py" benchmarks/run.py --suite host_overhead \
             --json "$d/${name}_r$r.json" >"$d/${name}_r$r.log" 2>&1) || fail "host_overhead $name round $r"
        done
      done
      "$py" - "$d" <<'PY'
import json, os, statistics, sys
d = sys.argv[1]
rows = {}
for name in ("base", "new"):
    for r in (1, 2, 3):
        p = os.path.join(d, f"{name}_r{r}.json")
        if not os.path.exists(p):
            continue
        data = json.load(open(p))
        for rec in data["records"] if isinstance(data, dict) else data:
            rows.setdefault(rec["name"], {}).setdefault(name, []).append(rec["time_us"])
print(f"{'host_overhead case':40s} {'base us':>16s} {'new us':>16s} {'new - base':>10s}")
for k, v in rows.items():
    b, n = v.get("base", []), v.get("new", [])
    fmt = lambda x: "/".join(f"{t:.2f}" for t in x) if x else "-"
    delta = f"{statistics.median(n) - statistics.median(b):+.2f}" if b and n else "-"
    print(f"{k:40s} {fmt(b):>16s} {fmt(n):>16s} {delta:>10s}")
PY
      ;;
    trace)
      (cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPENMLA_TRACE=ON -DOPENMLA_BUILD_TESTS=OFF \
         -DPython_EXECUTABLE="$py" && cmake --build build-trace -j "$jobs" --target _openmla) >"$d/build.log" 2>&1 ||
        fail "trace build"
      export PYTHONPATH=$root/python:$root/.deps/py
      run_tool() {  # name args...
        local name=$1; shift
        timeout -k 5 120 "$py" tools/diag/kernel_trace.py "$@" >"$d/$name.txt" 2>&1 || fail "kernel_trace $name"
        echo "== $name: $(wc -l <"$d/$name.txt") lines"; tail -6 "$d/$name.txt"
      }
      run_tool dense_decode dense-decode --b 128 --s-q 2 --s-k 4096 --dump "$d/dd.json"
      run_tool sparse_decode sparse-decode --b 128 --h-q 128 --dump "$d/sd.json"
      run_tool sparse_prefill sparse-prefill --d-qk 576 --h-q 128 --s-kv 8192 --topk 2048 --dump "$d/sp.json"
      run_tool mha_prefill mha-prefill --dump "$d/mha.json"
      run_tool mha_chain chain "$d/mha.json"
      for f in dd sd sp mha; do
        run_tool "events_$f" events "$d/$f.json" --cta 0 --steps 0:2
      done
      unset PYTHONPATH
      # The production extension back in python/openmla/.
      cmake --build build-ab -j "$jobs" --target _openmla >"$d/restore.log" 2>&1 && cp build-ab/_openmla*.so python/openmla/
      ;;
    bench)
      PYTHONPATH=$root/python:$root/.deps/py timeout -k 5 540 "$py" benchmarks/run.py \
        --suite "${GUARD_BENCH_SUITES:-mha_prefill_fwd,sparse_prefill,dense_decode}" --json "$d/bench.json" \
        --history-dir "$d" >"$d/bench.log" 2>&1 || fail "benchmarks"
      sed -n '/^device: /,/case(s) in/p' "$d/bench.log"
      ;;
    *) fail "unknown stage $stage" ;;
  esac
  pack "$stage"
done
say "done, status $status"
exit $status
