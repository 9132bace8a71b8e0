#!/usr/bin/env bash
# The dense MHA backward's measurement for one GPU call after tools/gpu_check.sh (its build-gpu extension in place):
# the benchmark rows whose names match BWD_FILTER against cuDNN in the same process (default: the b=2 s=4096 rows
# and b=16 s=1024 h=128, default and deterministic), then, unless BWD_NCU=0, ncu's full set on one launch of the main
# kernel of the row BWD_NCU_ROW (clocks untouched: --clock-control none). Everything goes into ONE text file,
# $OUT/extra/bwd.txt (the bench log, its JSON records, the ncu details).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PYTHONPATH="$root/python:$root/.deps/py${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-$root/build-gpu}/extra
mkdir -p "$out"
txt=$out/bwd.txt
tmp=$(mktemp -d)
filter=${BWD_FILTER:-b2_s4k|b16_s1k_d192_causal_h128}
timeout "${BWD_BENCH_TIMEOUT:-400}" python3 benchmarks/run.py --suite mha_prefill_bwd --filter "$filter" \
  --json "$tmp/bwd.json" >"$tmp/bench.log" 2>&1
echo "bench rc=$?" >>"$tmp/bench.log"
{
  echo "== bench (filter $filter)"
  cat "$tmp/bench.log"
  echo "== records"
  python3 - "$tmp/bwd.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # noqa: BLE001
    print("no json:", e); sys.exit(0)
recs = d.get("records", d if isinstance(d, list) else [])
for r in recs:
    print(f"{r.get('name', '?'):44s} {r.get('time_us', 0):10.1f} us {r.get('tflops', 0):7.1f} TF "
          f"ratio_to_cudnn {r.get('ratio_to_cudnn', r.get('params', {}).get('ratio_to_cudnn', '-'))} {r.get('device', '')}")
print(json.dumps(d)[:20000])
PY
} >"$txt" 2>&1
if [[ ${BWD_NCU:-1} == 1 ]]; then
  row=${BWD_NCU_ROW:-^b2_s4k_d192_causal_h128$}
  echo "== ncu ($row, main kernel, launch 4)" >>"$txt"
  MHA_BWD_BENCH_REPS=1 timeout "${BWD_NCU_TIMEOUT:-300}" ncu --clock-control none --set full -k regex:mha_bwd_kernel \
    --launch-skip 3 --launch-count 1 python3 benchmarks/run.py --suite mha_prefill_bwd --filter "$row" \
    --json "$tmp/ncu_bench.json" >"$tmp/ncu.log" 2>&1
  echo "ncu rc=$?" >>"$tmp/ncu.log"
  grep -v "^\[" "$tmp/ncu.log" | tail -400 >>"$txt"
fi
rm -rf "$tmp"
