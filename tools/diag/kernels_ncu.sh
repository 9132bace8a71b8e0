#!/usr/bin/env bash
# Question: where do the dense decode's slow variants (small-page gather kernel, FP8 kernel) lose time against the
# page-64 kernel on the same rows? Profiles one launch of each case with a focused ncu section set (clocks never
# touched) and writes $OUT/kernels_ncu.txt: a side-by-side metric table, then each kernel's most stalled SASS lines.
# Runs on the GPU machine after tools/gpu_check.sh (build-gpu extension on PYTHONPATH).
#   KNCU_CASES  space-separated "label:kernel_regex:profile_dense_decode.py arguments with commas for spaces"
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/build-gpu/gpu_check}
py=$(command -v python3)
export PYTHONPATH="$root/python:$root/.deps/py${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d)
txt=$out/kernels_ncu.txt
: >"$txt"
default_cases="p64_h16:dense_decode_kernel:--b,128,--s-q,1,--h-q,16,--s-k,32768
p1_h16:dense_decode_gather_kernel:--b,128,--s-q,1,--h-q,16,--s-k,32768,--page-size,1
fp8_h16:dense_decode_fp8_kernel:--b,128,--s-q,1,--h-q,16,--s-k,32768,--fp8
p64_h128:dense_decode_kernel:--b,128,--s-q,1,--h-q,128,--s-k,4096
p1_h128:dense_decode_gather_kernel:--b,128,--s-q,1,--h-q,128,--s-k,4096,--page-size,1"
labels=()
for c in ${KNCU_CASES:-$default_cases}; do
  IFS=: read -r label kname args <<<"$c"
  labels+=("$label")
  timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
    --section InstructionStats --section SourceCounters \
    -k "regex:$kname" --launch-skip 1 --launch-count 1 -f -o "$tmp/$label" \
    "$py" tools/diag/profile_dense_decode.py ${args//,/ } >"$tmp/$label.log" 2>&1 ||
    { echo "ncu $label failed:"; tail -5 "$tmp/$label.log"; } >>"$txt"
  ncu -i "$tmp/$label.ncu-rep" --page raw --csv >"$tmp/${label}_raw.csv" 2>/dev/null
  ncu -i "$tmp/$label.ncu-rep" --page source --csv --print-source sass >"$tmp/${label}_sass.csv" 2>/dev/null
done
"$py" - "$tmp" "${labels[@]}" >>"$txt" <<'PY'
import csv, os, sys
tmp, labels = sys.argv[1], sys.argv[2:]
def raw(l):
    p = os.path.join(tmp, f"{l}_raw.csv")
    rows = [r for r in csv.reader(open(p))] if os.path.exists(p) else []
    rows = [r for r in rows if r]
    return dict(zip(rows[0], rows[2])) if len(rows) >= 3 else {}
d = {l: raw(l) for l in labels}
want = ("gpu__time_duration.sum", "sm__throughput.avg.pct", "sm__pipe_tensor", "smsp__inst_executed.sum",
        "smsp__issue_active.avg.pct", "dram__bytes_read.sum", "dram__throughput.avg.pct", "lts__t_sector_hit_rate",
        "l1tex__data_bank_conflicts", "smsp__average_warps_issue_stalled", "smsp__average_warp_latency_issue_stalled",
        "sm__inst_executed_pipe_lsu", "smsp__inst_executed_op_ldgsts", "launch__registers", "lts__throughput.avg.pct",
        "l1tex__throughput.avg.pct", "smsp__warps_issue_stalled")
keys = sorted({k for v in d.values() for k in v if any(k.startswith(w) for w in want)})
print("metric".ljust(80) + "".join(f"{l:>18s}" for l in labels))
for k in keys:
    vals = [d[l].get(k, "") for l in labels]
    if len(set(vals)) > 1:
        print(k[:80].ljust(80) + "".join(f"{v[:17]:>18s}" for v in vals))
PY
for l in "${labels[@]}"; do
  "$py" tools/diag/ncu_sass_table.py "$tmp/${l}_sass.csv" --label "$l" --top 25 --opcodes >>"$txt" 2>&1
done
rm -rf "$tmp"
echo "kernels_ncu: wrote $txt ($(wc -l <"$txt") lines)"
