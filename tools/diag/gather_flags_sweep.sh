#!/usr/bin/env bash
# The dense gather kernel's L2 look-ahead settings side by side (docs/dense-decode.md, "Small pages: the gather
# kernel"): the decode_page_size suite's page-1 rows (each with its page-64 time, same process) once per value of
# OPENMLA_DENSE_GATHER_FLAGS (bits 0-1: prefetch distance in block pairs, 4: evict_normal gathers), on one warm GPU.
#
#   bash tools/diag/gather_flags_sweep.sh [FLAGS...]   # default: "default 4 5 2"; "default" = the built-in flags,
#                                                      # on pages 1, 8 and 64 (DEFAULT_FILTER), the others on page 1, 32K
#                                                      # (FLAG_FILTER, a regex on the suite's case names)
set -uo pipefail
cd "$(dirname "$0")/../.."
flags=("$@")
[[ ${#flags[@]} -eq 0 ]] && flags=(default 4 5 2)
out=${OUT:-/tmp}
for f in "${flags[@]}"; do
  echo "=== OPENMLA_DENSE_GATHER_FLAGS=$f"
  if [[ $f == default ]]; then env_flags=(); filter=${DEFAULT_FILTER:-'page(1|8|64)$'}
  else env_flags=(OPENMLA_DENSE_GATHER_FLAGS=$f); filter=${FLAG_FILTER:-'sk32768_varlen_page1$'}; fi
  env "${env_flags[@]}" PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/run.py \
    --suite decode_page_size --filter "$filter" --reps "${REPS:-20}" --warmup 5 \
    --json "$out/gather_flags_$f.json" > "$out/gather_flags_$f.log" 2>&1 || { echo "run failed:"; tail -5 "$out/gather_flags_$f.log"; }
  python3 - "$out/gather_flags_$f.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no JSON:", e); sys.exit(0)
for r in d.get("records", []):
    print(f"  {r['name']:45s} {r['time_us']:9.1f} us  ratio_to_page64 {r.get('ratio_to_page64', 0):.3f}  "
          f"(page 64 {r.get('page64_time_us', 0):.1f} us)")
PY
done
