#!/usr/bin/env bash
# OpenMLA: the one-call GPU check, for the lent Hopper machine (16 cores, torch, no network).
#
# From the tree plus the carried .deps/wheels and .deps/googletest it: installs the dependencies offline,
# builds build-gpu/ with all cores (ptxas register/smem report kept), runs the C++ tests, the Python
# tests (GPU tests run here), the sanitizer program under compute-sanitizer memcheck / racecheck /
# synccheck, and the benchmarks (default suites of benchmarks/run.py: dense_decode, kv_cache, sparse_decode);
# then prints a short summary table LAST, with every benchmark row. A failing stage is recorded
# and the next one still runs, so one call gives all the information; the exit status is non-zero if
# any stage failed.
#
# Typical call through the device tool (carry .deps/wheels and .deps/googletest):
#   OPENMLA_GIT_COMMIT=<short sha> bash tools/gpu_check.sh
# With FlashMLA timed in the same run (carry .peer too; docs/perf-method.md, "The peer in the same run"):
#   OPENMLA_GIT_COMMIT=<short sha> GPU_CHECK_BENCH_ONLY=1 GPU_CHECK_PEER=1 bash tools/gpu_check.sh
#
# Files under $OUT (at most 8, what comes back): build.log ptxas.txt cpp_tests.log pytest.log
# sanitize.log bench.log bench.json results/<date>_<device>_<commit>.json (copy the last one into
# benchmarks/results/ and commit it). Without $OUT the logs go to build-gpu/gpu_check/ and the
# history JSON straight into benchmarks/results/.
#
# Environment (all optional):
#   GPU_CHECK_BENCH_ONLY=1       build the extension and run the benchmarks only
#   GPU_CHECK_SKIP_CPP=1         skip the C++ tests        GTEST_FILTER=...   select C++ tests (gtest's own)
#   GPU_CHECK_SKIP_PYTEST=1      skip the Python tests     PYTEST_K=...       pytest -k expression
#   GPU_CHECK_SKIP_SANITIZE=1    skip compute-sanitizer    GPU_CHECK_SANITIZE_TOOLS="memcheck racecheck"
#                                                          GPU_CHECK_SANITIZE_FAMILIES="kv_cache" (default: all:
#                                                          kv_cache dense_decode sparse_decode sparse_prefill faults mha_prefill)
#                                                          GPU_CHECK_SANITIZE_ARGS="--racecheck-report hazard --print-limit 20"
#   GPU_CHECK_SKIP_BENCH=1       skip the benchmarks       BENCH_SUITE=sparse_decode (comma-separated; default:
#                                                          every default suite)  BENCH_FILTER=<regex>
#   GPU_CHECK_BENCH_ARGS="..."   extra arguments for benchmarks/run.py (e.g. --quick)
#   GPU_CHECK_PEER=1             build FlashMLA 9241ae3 (tools/peer_flashmla.sh, from the carried .peer/) before the
#                                benchmarks, so that they time it in the same run (flashmla_us, ratio_to_flashmla;
#                                its messages are appended to build.log); the benchmark time limit becomes 540 s unless
#                                BENCH_TIMEOUT is set (every peer row is timed twice: ours, then FlashMLA's)
#   OPENMLA_GIT_COMMIT=<sha>     commit recorded in the build and the benchmark JSON (the tree sent
#                                to the GPU machine has no .git)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t_start=$(date +%s)

build_dir=${GPU_CHECK_BUILD_DIR:-build-gpu}
jobs=$(nproc)
py=$(command -v python3)
if [[ -n "${OUT:-}" ]]; then
  logs=$OUT
  history_dir=$OUT/results
else
  logs=$root/$build_dir/gpu_check
  history_dir=$root/benchmarks/results
fi
mkdir -p "$logs" "$build_dir"
export PYTHONPATH="$root/python:$root/.deps/py${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

bench_only=${GPU_CHECK_BENCH_ONLY:-0}
skip_cpp=${GPU_CHECK_SKIP_CPP:-$bench_only}
skip_pytest=${GPU_CHECK_SKIP_PYTEST:-$bench_only}
skip_sanitize=${GPU_CHECK_SKIP_SANITIZE:-$bench_only}
skip_bench=${GPU_CHECK_SKIP_BENCH:-0}
sanitize_tools=${GPU_CHECK_SANITIZE_TOOLS:-memcheck racecheck synccheck}

# ---- stage bookkeeping ------------------------------------------------------------------------------
# shellcheck source=tools/stages.sh
source "$root/tools/stages.sh"

echo "gpu_check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), $jobs cores"

# The peer's build (GPU_CHECK_PEER=1) starts now, beside ours, and stage 6 waits for it.
peer_pid=
if [[ ${GPU_CHECK_PEER:-0} == 1 ]]; then
  peer_env_file=$(mktemp); peer_msg=$(mktemp)
  bash tools/peer_flashmla.sh >"$peer_env_file" 2>"$peer_msg" &
  peer_pid=$!
fi

# ---- 1. dependencies (offline: from the carried wheels) ---------------------------------------------
begin deps
if bash tools/setup_deps.sh --offline >"$logs/build.log" 2>&1; then
  record ok ""
else
  record FAIL "tools/setup_deps.sh --offline: see build.log"
fi

# ---- 2. configure and build -------------------------------------------------------------------------
begin build
build_ok=0
targets=()
[[ $bench_only == 1 ]] && targets=(--target _openmla)
if cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" \
      -DOPENMLA_PTXAS_VERBOSE=ON >>"$logs/build.log" 2>&1 &&
   cmake --build "$build_dir" -j "$jobs" "${targets[@]}" >>"$logs/build.log" 2>&1; then
  build_ok=1
fi
# ptxas report: each kernel's registers, spills, smem. Merged with the previous build's report kept in
# build-gpu/, so an incremental build (warm machine) still lists every kernel.
ptxas_summary=$("$py" - "$logs/build.log" "$build_dir/ptxas_kernels.json" "$logs/ptxas.txt" <<'PY'
import json, os, re, subprocess, sys
log, store, out = sys.argv[1:4]
kernels = json.load(open(store)) if os.path.exists(store) else {}
entry = props = None
for line in open(log, errors="replace"):
    m = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
    if m:
        entry = m.group(1); kernels[entry] = {"arch": m.group(2), "lines": []}; continue
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        props = m.group(1); continue
    if entry is None or "ptxas" not in line and "bytes stack frame" not in line:
        continue
    k = kernels[entry]
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and props == entry:
        k["stack"], k["spill_st"], k["spill_ld"] = map(int, m.groups())
    m = re.search(r"Used (\d+) registers", line)
    if m:
        k["regs"] = int(m.group(1))
        s = re.search(r"(\d+) bytes smem", line); k["smem"] = int(s.group(1)) if s else 0
    k["lines"].append(line.strip())
json.dump(kernels, open(store, "w"), indent=1)
names = sorted(kernels)
try:
    dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    assert len(dem) == len(names)
except Exception:
    dem = names
with open(out, "w") as f:
    f.write(f"{'regs':>5} {'smem':>7} {'stack':>6} {'spill st/ld':>12}  kernel\n")
    for n, d in zip(names, dem):
        k = kernels[n]
        f.write(f"{k.get('regs', '?'):>5} {k.get('smem', '?'):>7} {k.get('stack', '?'):>6} "
                f"{str(k.get('spill_st', '?')) + '/' + str(k.get('spill_ld', '?')):>12}  {d[:200]}\n")
    f.write("\n# raw ptxas lines per kernel\n")
    for n in names:
        f.write(f"\n{n}\n" + "".join(f"  {l}\n" for l in kernels[n]["lines"]))
    warn = sorted({l.strip() for l in open(log, errors="replace") if "ptxas warning" in l})
    if warn:
        f.write("\n# ptxas warnings of this build\n" + "\n".join(warn) + "\n")
spilling = [n for n in names if kernels[n].get("spill_st", 0) or kernels[n].get("spill_ld", 0)]
regs = [kernels[n].get("regs", 0) for n in names]
hinted = [n for n in names if any("(C75" in l for l in kernels[n]["lines"])]  # wgmma serialisation notes
print(f"{len(names)} kernels, max {max(regs) if regs else 0} regs, "
      + (f"{len(spilling)} SPILLING" if spilling else "no spills")
      + (f", {len(hinted)} with wgmma notes (C75xx, see ptxas.txt)" if hinted else ""))
PY
)
# SASS of the wgmma kernels: a WARPGROUP.DEPBAR after (nearly) every HGMMA means ptxas serialised the
# tensor-core pipeline, silently (dense-v2 and dense-v3 lost 10-15 % that way: docs/dense-decode.md, "Guards").
sass_note=""
serial_total=0
if (( build_ok )) && command -v cuobjdump >/dev/null; then
  for obj in "$build_dir"/CMakeFiles/openmla.dir/src/kernels/{dense_decode,sparse_decode,sparse_prefill,mha_prefill}/instantiations/*.cu.o; do
    [[ -f $obj ]] || continue
    echo -e "\n# SASS summary (tools/sass_summary.py) of $obj" >>"$logs/ptxas.txt"
    cuobjdump -sass "$obj" 2>/dev/null | "$py" tools/sass_summary.py >>"$logs/ptxas.txt"
    serial=$(cuobjdump -sass "$obj" 2>/dev/null | "$py" tools/sass_summary.py |
             grep -oE 'HGMMA=[0-9]+  WARPGROUP.DEPBAR=[0-9]+' |
             awk -F'[= ]+' '$4 * 2 > $2 {n++} END {print n + 0}')
    serial_total=$(( serial_total + serial ))
  done
  (( serial_total > 0 )) && sass_note=", $serial_total kernel(s) with wgmma SERIALISED (see ptxas.txt)"
  # Where the dense pair loop landed: its speed depends on it by up to 5 % (docs/dense-decode.md, "Code placement",
  # decision dense-v17: only a loop starting at 0x40 modulo 128 measured fast).
  dense_objs=("$build_dir"/CMakeFiles/openmla.dir/src/kernels/dense_decode/instantiations/*.cu.o)
  if [[ -f ${dense_objs[0]} ]]; then
    offs=$(for o in "${dense_objs[@]}"; do "$py" tools/sass_loops.py --offsets "$o" --min-hgmma 80 2>/dev/null; done |
           tee -a "$logs/ptxas.txt" | grep -oE 'start % 128 = 0x[0-9a-f]+' | awk '{print $NF}' | sort -u | tr '\n' ' ')
    [[ $offs == "0x40 " ]] || sass_note="$sass_note, dense pair loop MOVED (start % 128 = ${offs:-?}; see ptxas.txt)"
  fi
fi
if (( build_ok )); then
  record ok "$ptxas_summary$sass_note"
else
  record FAIL "see build.log"
  echo "---- last build errors ----"
  grep -E "error|Error|FAILED" "$logs/build.log" | tail -n 20
fi

# ---- 3. C++ tests -----------------------------------------------------------------------------------
if [[ $skip_cpp == 1 ]]; then
  skip "cpp tests" "skipped by request"
elif [[ ! -x $build_dir/openmla_tests ]]; then
  begin "cpp tests"; record FAIL "openmla_tests not built"
else
  begin "cpp tests"
  timeout -k 5 "${CPP_TIMEOUT:-180}" "$build_dir/openmla_tests" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} \
      >"$logs/cpp_tests.log" 2>&1
  rc=$?
  passed=$(grep -oP '^\[  PASSED  \] \K\d+' "$logs/cpp_tests.log" | tail -1)
  failed=$(grep -oP '^\[  FAILED  \] \K\d+(?= tests?, listed below)' "$logs/cpp_tests.log" | tail -1)
  skipped=$(grep -oP '^\[  SKIPPED \] \K\d+(?= tests?, listed below)' "$logs/cpp_tests.log" | tail -1)
  d="${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
  if (( rc == 0 )); then record ok "$d"; else
    [[ -z $passed ]] && d="crashed (rc $rc) before the summary; see cpp_tests.log"
    record FAIL "$d"
    grep '^\[  FAILED  \] [A-Za-z]' "$logs/cpp_tests.log" | sort -u | head -n 10
  fi
fi

# ---- 4. Python tests (GPU tests run here) -----------------------------------------------------------
if [[ $skip_pytest == 1 ]]; then
  skip pytest "skipped by request"
else
  begin pytest
  kargs=()
  [[ -n ${PYTEST_K:-} ]] && kargs=(-k "$PYTEST_K")
  # A kernel that hangs must not eat the whole device call: every stage runs under a time limit.
  timeout -k 5 "${PYTEST_TIMEOUT:-300}" "$py" -m pytest tests/python -q -rs --maxfail="${PYTEST_MAXFAIL:-25}" \
      "${kargs[@]}" >"$logs/pytest.log" 2>&1
  rc=$?
  line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$logs/pytest.log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  if (( rc == 0 )); then record ok "$line"; else
    record FAIL "${line:-rc $rc, see pytest.log}"
    grep -E '^(FAILED|ERROR) ' "$logs/pytest.log" | head -n 10
  fi
fi

# ---- 5. compute-sanitizer ---------------------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
: >"$logs/sanitize.log"
for tool in $sanitize_tools; do
  if [[ $skip_sanitize == 1 ]]; then
    skip "$tool" "skipped by request"; continue
  fi
  begin "$tool"
  if [[ -z $sanitizer ]]; then record FAIL "compute-sanitizer not found"; continue; fi
  if [[ ! -x $build_dir/openmla_sanitize ]]; then record FAIL "openmla_sanitize not built"; continue; fi
  echo "===== compute-sanitizer --tool $tool" >>"$logs/sanitize.log"
  # shellcheck disable=SC2086  # the families are separate arguments
  timeout -k 5 "${SANITIZE_TIMEOUT:-120}" "$sanitizer" --tool "$tool" --error-exitcode 86 ${GPU_CHECK_SANITIZE_ARGS:-} \
      "$build_dir/openmla_sanitize" \
      ${GPU_CHECK_SANITIZE_FAMILIES:-} >>"$logs/sanitize.log" 2>&1
  rc=$?
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitize.log" | tail -1 | sed 's/^=* *//')
  ran=$(grep -oE '[0-9]+ famil(y|ies) run, [0-9]+ failed' "$logs/sanitize.log" | tail -1)
  skipped_f=$(grep -c '^\[ SKIPPED \]' <(sed -n "/===== compute-sanitizer --tool $tool/,\$p" "$logs/sanitize.log"))
  d="${summary:-no summary}; ${ran:-no result line}"
  (( skipped_f > 0 )) && d+=", $skipped_f famil$( ((skipped_f == 1)) && echo y || echo ies) not linked"
  if (( rc == 0 )); then record ok "$d"; elif (( rc == 86 )); then record FAIL "sanitizer errors: $d"; else
    record FAIL "rc $rc: $d"; fi
done
[[ -z $sanitize_tools ]] && skip sanitize "no tools selected"

# ---- 6. the peer (GPU_CHECK_PEER=1): FlashMLA built, so that the benchmarks time it in the same run -------
bench_timeout=${BENCH_TIMEOUT:-300}
if [[ ${GPU_CHECK_PEER:-0} == 1 ]]; then
  begin peer
  wait "$peer_pid"
  rc=$?
  peer_env=$(cat "$peer_env_file")
  { echo "===== tools/peer_flashmla.sh (rc $rc)"; cat "$peer_msg"; } >>"$logs/build.log"
  if (( rc == 0 )); then
    eval "$peer_env"
    record ok "$(tail -1 "$peer_msg" | sed 's/^peer_flashmla: //')"
    bench_timeout=${BENCH_TIMEOUT:-540}
  else
    record FAIL "tools/peer_flashmla.sh: $(tail -1 "$peer_msg" | cut -c1-120); see build.log"
  fi
  rm -f "$peer_msg" "$peer_env_file"
fi

# ---- 7. benchmarks ----------------------------------------------------------------------------------
if [[ $skip_bench == 1 ]]; then
  skip bench "skipped by request"
else
  begin bench
  # shellcheck disable=SC2206
  bargs=(${GPU_CHECK_BENCH_ARGS:-})
  timeout -k 5 "$bench_timeout" "$py" benchmarks/run.py --json "$logs/bench.json" --history-dir "$history_dir" \
      ${BENCH_SUITE:+--suite "$BENCH_SUITE"} ${BENCH_FILTER:+--filter "$BENCH_FILTER"} "${bargs[@]}" \
      >"$logs/bench.log" 2>&1
  rc=$?
  # "N records (suite n, ...), M errors"; "skipped: <why>" when run.py found no usable GPU.
  n=$("$py" - "$logs/bench.json" 2>/dev/null <<'PY'
import collections, json, sys
d = json.load(open(sys.argv[1]))
if d.get("skipped"):
    print("skipped: " + d["skipped"])
else:
    per = collections.Counter(r["suite"] for r in d["records"])
    same = [r for r in d["records"] if r.get("flashmla_source") == "same_run"]
    differ = sum(1 for r in same if r.get("peer_agrees") is False)
    peer = (f"; FlashMLA timed on {len(same)} rows" + (f", {differ} with outputs that DIFFER" if differ else "")
            if (d.get("peer") or {}).get("available") else "")
    print(f"{len(d['records'])} records ({', '.join(f'{s} {k}' for s, k in per.items()) or 'none'}), "
          f"{len(d['errors'])} errors{peer}")
PY
)
  if [[ $n == skipped:* ]]; then record FAIL "$n"  # this script runs on the GPU machine: no GPU is a failure
  elif (( rc == 0 )); then record ok "$n"; else
    why=$(grep -E '^[A-Za-z]*(Error|Exception)' "$logs/bench.log" | tail -1 | cut -c1-100)
    record FAIL "rc $rc${n:+, $n}${why:+: $why}; see bench.log"
  fi
fi

# ---- summary (last) ---------------------------------------------------------------------------------
any_fail=0
echo
echo "==================== gpu_check summary: $(elapsed) total, commit ${OPENMLA_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)} ===================="
printf '%-11s %-8s %6s  %s\n' stage result time detail
for s in "${stages[@]}"; do
  [[ ${result[$s]} == FAIL ]] && any_fail=1
  printf '%-11s %-8s %5ss  %s\n' "$s" "${result[$s]}" "${seconds[$s]}" "${detail[$s]}"
done
if [[ -f $logs/bench.log ]] && [[ $skip_bench != 1 ]]; then
  echo
  # The benchmark table: from the device line to the case count.
  sed -n '/^device: /,/case(s) in/p' "$logs/bench.log"
  ls "$history_dir"/*.json >/dev/null 2>&1 && echo "history JSON: $(ls -t "$history_dir"/*.json | head -1)"
fi
echo "logs: $logs"
if (( any_fail )); then echo "gpu_check: FAILED"; exit 1; fi
echo "gpu_check: all stages ok"
