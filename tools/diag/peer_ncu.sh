#!/usr/bin/env bash
# Question: where does our dense decode kernel differ from FlashMLA's on the same card and the same inputs?
# Runs on the GPU machine after tools/gpu_check.sh (its build-gpu extension is on PYTHONPATH) with the peer built
# (tools/peer_flashmla.sh finds the build of the same call). Profiles one launch of each main kernel with ncu's
# full set (clocks never touched: --clock-control none) and writes one text file, $OUT/ncu_compare.txt:
# a side-by-side table of chosen metrics, then each kernel's most stalled SASS lines.
#   PEER_NCU_CASES  space-separated "b,s_q,s_k[,causal]" (default "128,1,16384")
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/build-gpu/gpu_check}
py=$(command -v python3)
export PYTHONPATH="$root/python:$root/.deps/py${PYTHONPATH:+:$PYTHONPATH}"
if ! env_line=$(bash tools/peer_flashmla.sh 2>/dev/null); then echo "peer_ncu: the peer is not built"; exit 1; fi
eval "$env_line"
tmp=$(mktemp -d)
txt=$out/ncu_compare.txt
: >"$txt"
for c in ${PEER_NCU_CASES:-128,1,16384}; do
  IFS=, read -r b sq sk causal <<<"$c"
  cflag=; [[ ${causal:-} == causal ]] && cflag=--causal
  for who in ours peer; do
    if [[ $who == ours ]]; then kname=regex:dense_decode_kernel; pflag=; else kname=regex:flash_fwd_splitkv_mla_kernel; pflag=--peer; fi
    timeout 200 ncu --clock-control none --set full -k "$kname" --launch-skip 1 --launch-count 1 -f \
      -o "$tmp/${who}_${b}_${sq}_${sk}" "$py" tools/diag/profile_dense_decode.py --b "$b" --s-q "$sq" --s-k "$sk" $cflag $pflag \
      >"$tmp/${who}.log" 2>&1 || { echo "ncu $who failed:"; tail -5 "$tmp/${who}.log"; } >>"$txt"
    ncu -i "$tmp/${who}_${b}_${sq}_${sk}.ncu-rep" --page raw --csv >"$tmp/${who}_raw.csv" 2>/dev/null
    ncu -i "$tmp/${who}_${b}_${sq}_${sk}.ncu-rep" --page source --csv --print-source sass >"$tmp/${who}_sass.csv" 2>/dev/null
  done
  "$py" - "$tmp" "$b,$sq,$sk,${causal:-}" >>"$txt" <<'PY'
import csv, os, sys
tmp, case = sys.argv[1:3]
def raw(who):
    p = os.path.join(tmp, f"{who}_raw.csv")
    if not os.path.exists(p):
        return {}
    rows = [r for r in csv.reader(open(p)) if r]
    if len(rows) < 3:
        return {}
    return dict(zip(rows[0], rows[2]))  # header, units, first kernel
o, p = raw("ours"), raw("peer")
print(f"===== case b,s_q,s_k,causal = {case}")
keys = [k for k in o if k in p]
want = ("gpu__time_duration.sum", "sm__throughput", "sm__inst_executed_pipe_tensor", "sm__pipe_tensor",
        "smsp__inst_executed.sum", "smsp__issue_active", "sm__warps_active", "launch__", "dram__bytes_read.sum",
        "dram__throughput", "lts__t_sector_hit_rate", "l1tex__data_bank_conflicts", "smsp__average_warp",
        "smsp__pcsamp_warps_issue_stalled", "smsp__warp_issue_stalled", "sm__cycles_elapsed.avg",
        "smsp__cycles_active", "smsp__inst_executed_op", "sm__sass_inst_executed_op_shared", "smsp__sass_inst_executed_op",
        "l1tex__t_bytes", "lts__t_bytes", "smsp__thread_inst_executed_per_inst", "sm__ctas_launched")
for k in keys:
    if any(k.startswith(w) for w in want) and (o[k] != p[k]):
        print(f"{k[:90]:90s} {o[k][:22]:>22s} {p[k][:22]:>22s}")
PY
  for who in ours peer; do
    "$py" tools/diag/ncu_sass_table.py "$tmp/${who}_sass.csv" --label "$who" --top 30 --opcodes >>"$txt"
  done
done
rm -rf "$tmp"
echo "peer_ncu: wrote $txt ($(wc -l <"$txt") lines)"
