#!/usr/bin/env bash
# Question: where does a decode kernel's time go on the GPU (clock64 / %globaltimer traces, ncu, per-kernel breakdown)?
# One-call diagnostics on the lent GPU (carry .deps/wheels and .deps/googletest, as tools/gpu_check.sh).
#
# Builds build-trace/ (the Python extension only, the kernels with their trace compiled in) with all
# cores, then runs, as selected by DIAG (space-separated; default "trace ncu-sparse ncu-dense"):
#   trace       tools/diag/kernel_trace.py sparse-decode at h_q 128 (crossover) and 64     -> $OUT/trace.txt
#   trace-b2    the same at b 2, h_q 128, L2 flushed and warm                          -> $OUT/trace.txt
#   ncu-sparse  ncu source-level stall samples of the sparse kernel (b 128, h_q 128)  -> $OUT/ncu_sparse_*.txt
#   ncu-dense   ncu speed-of-light + memory tables of dense decode (b 128, s_q 2, 32K) -> $OUT/ncu_dense.txt
#   ncu-b2      ncu warp-state stalls and stalled SASS lines of the b = 2 main kernel, every cache flushed
#               before it (--cache-control all) and not (none)               -> $OUT/ncu_b2_{all,none}_*.txt
#   timeline    the whole-kernel per-CTA timeline (trace build) at b 2 and 64, h_q 128 -> $OUT/timeline.txt
#   dense-timeline  the dense kernel's request timeline (trace build) at b 128, s_q 2 (4K, 32K) and s_q 1 4K
#               -> $OUT/dense_timeline.txt
#   code        tools/diag/diag_code_b2.py: the b = 2 call after the flush, with and without our code warm in L2
#               -> $OUT/code.txt (best with DIAG_TRACE=OFF)
#   breakdown   tools/diag/breakdown_decode.py: per-kernel durations and gaps of whole calls -> $OUT/breakdown.txt
#               (cases: BREAKDOWN_ARGS, default the sparse b = 2 row and shorter top-k)
# DIAG_TRACE=OFF builds build-diag/ without the trace stamps instead (for timings: the stamps cost a little).
# ncu always runs with --clock-control none (clocks are never touched). Summaries print last.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/build-trace/diag}
mkdir -p "$out"
diag=${DIAG:-trace ncu-sparse ncu-dense}
py=$(command -v python3)
export PYTHONPATH="$root/python:$root/.deps/py${PYTHONPATH:+:$PYTHONPATH}"
t0=$(date +%s)

trace=${DIAG_TRACE:-ON}
bdir=build-trace
[[ $trace == ON ]] || bdir=build-diag
bash tools/setup_deps.sh --offline >"$out/build.log" 2>&1 || { echo "setup_deps failed"; tail -20 "$out/build.log"; exit 1; }
if ! { cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" \
         -DOPENMLA_TRACE="$trace" -DOPENMLA_BUILD_TESTS=OFF >>"$out/build.log" 2>&1 &&
       cmake --build "$bdir" -j "$(nproc)" --target _openmla >>"$out/build.log" 2>&1; }; then
  echo "build failed"; grep -E "error|Error" "$out/build.log" | head -30; exit 1
fi
echo "built in $(( $(date +%s) - t0 )) s"

ncu_sass_top() {  # report -> top stalled SASS lines (tools/diag/ncu_sass_table.py)
  local rep=$1 txt=$2
  ncu -i "$rep" --page source --csv --print-source sass >"$txt.csv" 2>"$txt.err" || { cat "$txt.err"; return; }
  "$py" tools/diag/ncu_sass_table.py "$txt.csv" >"$txt"
}

for d in $diag; do
  case $d in
    trace)
      { timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --b 128 --h-q 128
        timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --b 128 --h-q 64; } >"$out/trace.txt" 2>&1 ;;
    trace-b2)
      { timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --b 2 --h-q 128
        timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --b 2 --h-q 128 --no-flush; } >"$out/trace.txt" 2>&1 ;;
    ncu-sparse)
      timeout 240 ncu --clock-control none -k regex:sparse_decode_kernel --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis \
        --import-source yes -f -o "$out/ncu_sparse" "$py" tools/diag/profile_sparse_decode.py --b 128 --h-q 128 \
        >"$out/ncu_sparse.log" 2>&1
      ncu -i "$out/ncu_sparse.ncu-rep" --print-details all >"$out/ncu_sparse_details.txt" 2>&1
      ncu_sass_top "$out/ncu_sparse.ncu-rep" "$out/ncu_sparse_sass.txt" ;;
    ncu-b2)
      # The b = 2 row's main kernel with every cache flushed before it (ncu --cache-control all: L2 and the SMs'
      # caches, instruction caches included) and without: warp-state stalls (is the first block waiting for its
      # instructions?) and the most stalled SASS lines.
      for cc in all none; do
        timeout 240 ncu --clock-control none --cache-control "$cc" -k regex:sparse_decode_kernel --launch-skip 1 \
          --launch-count 1 --section WarpStateStats --section SourceCounters --import-source yes -f \
          -o "$out/ncu_b2_$cc" "$py" tools/diag/profile_sparse_decode.py --b 2 --h-q 128 >"$out/ncu_b2_$cc.log" 2>&1
        ncu -i "$out/ncu_b2_$cc.ncu-rep" --print-details all >"$out/ncu_b2_${cc}_details.txt" 2>&1
        ncu_sass_top "$out/ncu_b2_$cc.ncu-rep" "$out/ncu_b2_${cc}_sass.txt"
      done ;;
    timeline)
      { timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --timeline-only --b 2 --h-q 128
        timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --timeline-only --b 2 --h-q 128 --no-flush
        timeout 60 "$py" tools/diag/kernel_trace.py sparse-decode --timeline-only --b 64 --h-q 128; } >"$out/timeline.txt" 2>&1 ;;
    dense-timeline)
      { timeout 100 "$py" tools/diag/kernel_trace.py dense-decode --b 128 --s-q 2 --s-k 4096
        timeout 100 "$py" tools/diag/kernel_trace.py dense-decode --b 128 --s-q 2 --s-k 32768
        timeout 100 "$py" tools/diag/kernel_trace.py dense-decode --b 128 --s-q 1 --s-k 4096; } >"$out/dense_timeline.txt" 2>&1 ;;
    code)
      timeout 240 "$py" tools/diag/diag_code_b2.py >"$out/code.txt" 2>&1 ;;
    breakdown)
      # shellcheck disable=SC2086
      timeout 240 "$py" tools/diag/breakdown_decode.py ${BREAKDOWN_ARGS:---sparse b=2 b=2,topk=64 b=2,topk=128 b=2,topk=192 b=2,s_q=1 b=64} \
        >"$out/breakdown.txt" 2>&1 ;;
    ncu-dense)
      timeout 120 ncu --clock-control none -k regex:dense_decode_kernel --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
        --section WarpStateStats "$py" tools/diag/profile_dense_decode.py --b 128 --s-q 2 --s-k 32768 \
        >"$out/ncu_dense.txt" 2>&1 ;;
  esac
done
rm -f "$out"/*.csv
echo "total $(( $(date +%s) - t0 )) s"
for f in code.txt breakdown.txt dense_timeline.txt timeline.txt trace.txt ncu_dense.txt ncu_sparse_sass.txt; do
  [[ -f $out/$f ]] && { echo "===== $f"; head -c 9000 "$out/$f"; }
done
