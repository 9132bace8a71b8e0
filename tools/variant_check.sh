#!/usr/bin/env bash
# On the GPU machine: every variant tree under .ab/ (tools/variant_trees.sh) is built, then each one's GPU tests of one
# family run (pytest -k, and compute-sanitizer racecheck / synccheck / memcheck of the family's sanitize cases), then
# an A/B benchmark of all trees (tools/ab_bench.sh). A variant that fails its tests is left out of the A/B.
#
#   VARIANT_TREES="base tkt" FAMILY=mha_prefill PYTEST_K=mha AB_SUITE=mha_prefill_fwd AB_FILTER='b16_s1k|b2_s4k' \
#     bash tools/variant_check.sh
#
# FAMILY is the sanitize family (tests/gpu/sanitize_<family>.cpp); SANITIZE_TOOLS (default "racecheck synccheck
# memcheck"; empty: none); SKIP_TESTS=1 times only; TRUSTED_TREES="base" skips the tests of those trees (already
# tested code); PYTEST_TIMEOUT (default 120 s) and SANITIZE_TIMEOUT (90 s) bound a variant that hangs (a new
# protocol can deadlock; the consumers' waits have no watchdog); AB_CMAKE_ARGS as in
# ab_bench.sh (a family switched off builds faster). Prints one line per tree and step, then the A/B table. Logs under
# ${OUT:-build-gpu/variants}; with $OUT set (the device tool, which brings back at most 8 files) they are packed into
# $OUT/variant_check.tgz at the end, the A/B JSON included.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
trees=(${VARIANT_TREES:?set VARIANT_TREES (names under .ab/)})
family=${FAMILY:?set FAMILY (a sanitize family, e.g. mha_prefill)}
out=${OUT:-$root/build-gpu/variants}
mkdir -p "$out"
py=$(command -v python3)
t0=$(date +%s)
el() { echo "[+$(( $(date +%s) - t0 )) s] $*"; }
# The device tool brings back at most 8 files: on any exit, one archive of everything under $OUT.
pack() {
  [[ -n ${OUT:-} ]] || return 0
  tar czf "/tmp/variant_check.$$.tgz" -C "$out" . && rm -rf "${out:?}"/* && mv "/tmp/variant_check.$$.tgz" \
    "$out/variant_check.tgz"
}
trap pack EXIT
bash tools/setup_deps.sh --offline >"$out/deps.log" 2>&1 || { tail -20 "$out/deps.log"; exit 1; }
paths=(); for t in "${trees[@]}"; do paths+=(".ab/$t"); done
OUT=$out/ab AB_BUILD_ONLY=1 AB_TREES="${paths[*]}" bash tools/ab_bench.sh >"$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
el "built: ${trees[*]}"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
passed=()
for t in "${trees[@]}"; do
  if [[ -n ${SKIP_TESTS:-} || " ${TRUSTED_TREES:-} " == *" $t "* ]]; then passed+=(".ab/$t"); el "$t: tests skipped"; continue; fi
  ok=1
  (cd ".ab/$t" && PYTHONPATH=python:$root/.deps/py timeout "${PYTEST_TIMEOUT:-120}" "$py" -m pytest -q -x -p no:cacheprovider \
      tests/python -k "${PYTEST_K:-$family}" >"$out/pytest_$t.txt" 2>&1) || ok=0
  el "$t pytest: $(tail -1 "$out/pytest_$t.txt")"
  (cd ".ab/$t" && cmake -S . -B build-ab -DOPENMLA_BUILD_TESTS=ON >/dev/null && \
      cmake --build build-ab -j "$(nproc)" --target openmla_sanitize >"$out/san_build_$t.log" 2>&1) || ok=0
  for tool in ${SANITIZE_TOOLS-racecheck synccheck memcheck}; do
    [[ -n $sanitizer ]] || { el "$t $tool: compute-sanitizer not found"; ok=0; continue; }
    (cd ".ab/$t" && timeout "${SANITIZE_TIMEOUT:-90}" "$sanitizer" --tool "$tool" --error-exitcode 86 ./build-ab/openmla_sanitize "$family" \
        >"$out/${tool}_$t.txt" 2>&1) || ok=0
    el "$t $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/${tool}_$t.txt" | tail -1 | sed 's/^=* *//')"
  done
  (( ok )) && passed+=(".ab/$t") || el "$t FAILED its tests: left out of the A/B"
done
(( ${#passed[@]} )) || { echo "no tree passed its tests"; exit 1; }
OUT=$out/ab AB_TREES="${passed[*]}" bash tools/ab_bench.sh 2>&1 | grep -v '^== build'
el "done"
