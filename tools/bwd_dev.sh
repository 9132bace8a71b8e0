#!/usr/bin/env bash
# The dense MHA backward's development run on a GPU machine (one device call): offline deps, build the sanitize
# program and the quick timing (16 cores), the backward's sanitize cases plain and under memcheck / racecheck /
# synccheck, then the timing table. Carry .deps/wheels and .deps/googletest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_deps.sh --offline > /tmp/deps.log 2>&1 || tail -5 /tmp/deps.log
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v python3)" > /tmp/cfg.log 2>&1 || tail -20 /tmp/cfg.log
cmake --build build-gpu -j "$(nproc)" --target openmla_sanitize openmla_mha_bwd_timing 2>&1 | grep -E "error|FAILED" | head -20
./build-gpu/openmla_sanitize mha_prefill_bwd 2>&1 | tail -${BWD_DEV_CASE_LINES:-12}
if [[ "${BWD_DEV_SANITIZE:-1}" == 1 ]]; then
  for t in memcheck racecheck synccheck; do
    echo "== $t"
    timeout 300 compute-sanitizer --tool "$t" --print-limit 3 ./build-gpu/openmla_sanitize mha_prefill_bwd 2>&1 |
      grep -v "^    [a-z]* d[qkv]:\|Host Frame\|^  case" | tail -6
  done
fi
./build-gpu/openmla_mha_bwd_timing "${BWD_DEV_REPS:-10}"
