#!/usr/bin/env bash
# Question: do this tree and an older one give bit-identical outputs on the GPU (tools/compare_outputs.py)?
#
# On the GPU machine, from the repository root, with the older tree extracted beforehand (the tree sent there has no
# .git; `.ab/` is ignored by git, so carry it):
#   here:  mkdir -p .ab/pre && git archive 20f0c84 | tar -x -C .ab/pre
#   there: OPENMLA_GIT_COMMIT=<short sha> bash tools/compare_builds.sh .ab/pre     # carry .deps/wheels .ab/pre
#
# It (1) installs each tree's dependencies offline from the carried .deps/wheels (the older tree runs its own
# tools/setup_deps.sh, e.g. for the CUTLASS headers its CMakeLists requires), (2) builds only the Python extension of
# each tree, both at once with all cores (this tree without the prefill families, which the matrix never calls;
# COMPARE_ALL_FAMILIES=1 builds them too), (3) runs compare_outputs.py under each build in its own process with its
# own PYTHONPATH, the older tree first, (4) compares the two recordings and prints a short table last. Exit status 0
# only when every stage ran and every output is bit-identical. About 2-3 minutes on 16 cores.
#
# This tree's python/openmla/_openmla*.so is put back as it was on exit (the build here replaces it for the run).
#
# Files under $OUT (6): build.log, run_old.log, run_new.log, old.json, new.json, check.txt. Without $OUT they go to
# build-cmp/compare/. The raw output tensors (about 1 GB a build, for the max abs diff of differing cases) stay on the
# machine in build-cmp/tensors_{old,new}/ (COMPARE_SAVE_TENSORS=0: not written).
#
# Environment (optional): COMPARE_FILTER=<regex> (a subset of the cases), COMPARE_OLD_COMMIT (the label of the older
# build, default 20f0c84), COMPARE_ALL_FAMILIES=1, COMPARE_SAVE_TENSORS=0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
t_start=$(date +%s)

old_arg=${1:-}
if [[ -z $old_arg || $old_arg == -h || $old_arg == --help ]]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  [[ -z $old_arg ]] && { echo "compare_builds.sh: argument OLD_TREE is required (e.g. .ab/pre)" >&2; exit 2; }
  exit 0
fi
if [[ ! -f $old_arg/CMakeLists.txt || ! -f $old_arg/python/openmla/__init__.py ]]; then
  echo "compare_builds.sh: argument OLD_TREE '$old_arg' is not an OpenMLA source tree (no CMakeLists.txt or" \
       "python/openmla/__init__.py); extract one with: mkdir -p .ab/pre && git archive <rev> | tar -x -C .ab/pre" >&2
  exit 2
fi
old=$(cd "$old_arg" && pwd)
if [[ $old == "$root" ]]; then
  echo "compare_builds.sh: argument OLD_TREE is this tree itself; give the older tree's folder" >&2
  exit 2
fi

work=$root/build-cmp
out=${OUT:-$work/compare}
mkdir -p "$out" "$work"
py=$(command -v python3)
jobs=$(nproc)
export PYTHONUNBUFFERED=1
# Nothing in the environment may change what a call does: checked mode and the experimental gate off.
unset OPENMLA_CHECK OPENMLA_EXPERIMENTAL_MHA
save_tensors=${COMPARE_SAVE_TENSORS:-1}
old_commit=${COMPARE_OLD_COMMIT:-20f0c84}
new_commit=${OPENMLA_GIT_COMMIT:-unknown}

# shellcheck source=tools/stages.sh
source "$root/tools/stages.sh"
summary() {
  local any_fail=0 s
  echo
  echo "============ compare_builds summary: $(elapsed) total; old $old_commit ($old), new $new_commit ============"
  printf '%-10s %-10s %6s  %s\n' stage result time detail
  for s in "${stages[@]}"; do
    [[ ${result[$s]} != ok ]] && any_fail=1
    printf '%-10s %-10s %5ss  %s\n' "$s" "${result[$s]}" "${seconds[$s]}" "${detail[$s]}"
  done
  if [[ -f $out/check.txt ]]; then
    echo
    # The table (from the first line to the verdict); at most 40 lines of differing cases (all in check.txt).
    head -n 60 "$out/check.txt"
    (( $(wc -l <"$out/check.txt") > 60 )) && echo "... (the whole list: check.txt)"
  fi
  echo "files: $out"
  if (( any_fail )); then echo "compare_builds: FAILED or DIFFERENT"; exit 1; fi
  echo "compare_builds: all outputs bit-identical"
  exit 0
}

# ---- 1. dependencies (offline, from the carried wheels) ----------------------------------------------------------
begin deps
log=$out/build.log
: >"$log"
# Each setup_deps.sh also checks for the Python test tools, which no build needs: the stage is judged by the folders
# the two builds need (below), not by the scripts' exit status.
echo "##### deps: this tree" >>"$log"
bash tools/setup_deps.sh --offline >>"$log" 2>&1
# The older tree gets a .deps of its own with the wheels linked in, so its setup_deps.sh unpacks what its CMakeLists
# expects (e.g. .deps/cutlass) without touching this tree's .deps.
if [[ ! -e $old/.deps ]]; then mkdir -p "$old/.deps"; fi
if [[ ! -e $old/.deps/wheels ]]; then ln -sfn "$root/.deps/wheels" "$old/.deps/wheels"; fi
echo "##### deps: old tree $old" >>"$log"
(cd "$old" && PYTHONPATH="$root/.deps/py${PYTHONPATH:+:$PYTHONPATH}" bash tools/setup_deps.sh --offline) >>"$log" 2>&1
missing=""
[[ -d $root/.deps/nanobind/nanobind/cmake ]] || missing+=" this tree's .deps/nanobind"
[[ -d $old/.deps/nanobind/nanobind/cmake ]] || missing+=" the old tree's .deps/nanobind"
if grep -q 'cutlass/include/cute' "$old/CMakeLists.txt" && [[ ! -d $old/.deps/cutlass/include/cute ]]; then
  missing+=" the old tree's .deps/cutlass"
fi
if [[ -z $missing ]]; then record ok ""; else record FAIL "missing:$missing; see build.log"; summary; fi

# ---- 2. build the two Python extensions, at once ------------------------------------------------------------------
begin build
# Each build copies its extension into its tree's python/openmla/. This tree's copy (e.g. the one tools/gpu_check.sh
# built, with every family) is put back on exit, so a later run on a warm machine does not pick up this build's.
so_backup=$work/extension_backup
rm -rf "$so_backup"
mkdir -p "$so_backup"
cp -p python/openmla/_openmla*.so "$so_backup"/ 2>/dev/null
# shellcheck disable=SC2317  # called by the EXIT trap
restore_extension() {
  rm -f python/openmla/_openmla*.so
  cp -p "$so_backup"/_openmla*.so python/openmla/ 2>/dev/null
  return 0
}
trap restore_extension EXIT
build_one() {  # name source_dir build_dir commit [cmake args...]
  local name=$1 src=$2 bdir=$3 commit=$4
  shift 4
  # A build folder configured from another source path (another machine, a moved tree) is started afresh.
  if [[ -f $bdir/CMakeCache.txt ]] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$bdir/CMakeCache.txt"; then
    rm -rf "$bdir"
  fi
  local launcher=()
  command -v ccache >/dev/null 2>&1 &&
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  local t0
  t0=$(date +%s)
  if OPENMLA_GIT_COMMIT=$commit cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DPython_EXECUTABLE="$py" -DOPENMLA_BUILD_TESTS=OFF "${launcher[@]}" "$@" &&
     cmake --build "$bdir" -j "$jobs" --target _openmla; then
    echo "BUILD_OK $name $(( $(date +%s) - t0 ))s"
  else
    echo "BUILD_FAILED $name"
    return 1
  fi
}
new_args=()
if [[ ${COMPARE_ALL_FAMILIES:-0} != 1 ]] && grep -q OPENMLA_ENABLE_SPARSE_PREFILL CMakeLists.txt; then
  new_args=(-DOPENMLA_ENABLE_SPARSE_PREFILL=OFF -DOPENMLA_ENABLE_MHA_PREFILL=OFF)
fi
build_one old "$old" "$work/build_old" "$old_commit" >"$work/build_old.log" 2>&1 &
pid_old=$!
build_one new "$root" "$work/build_new" "$new_commit" "${new_args[@]}" >"$work/build_new.log" 2>&1 &
pid_new=$!
wait $pid_old; rc_old=$?
wait $pid_new; rc_new=$?
for n in old new; do
  echo "##### build: $n" >>"$log"
  # ptxas's notes on every kernel are not what this log is for.
  grep -v '^ptxas info' "$work/build_$n.log" >>"$log"
done
if (( rc_old == 0 && rc_new == 0 )); then
  record ok "$(grep -ho 'BUILD_OK .*' "$work"/build_{old,new}.log | sed 's/BUILD_OK //' | paste -sd, | sed 's/,/, /g')"
else
  record FAIL "$( (( rc_old )) && echo -n 'old tree ')$( (( rc_new )) && echo -n 'this tree ')failed; see build.log"
  grep -hE "error|Error|FAILED" "$work"/build_{old,new}.log | head -n 20
  summary
fi

# ---- 3. record each build's outputs (the older first), each in its own process ----------------------------------
run_one() {  # name tree
  local name=$1 tree=$2
  begin "run $name"
  local args=(--out "$out/$name.json")
  [[ $save_tensors == 1 ]] && { rm -rf "$work/tensors_$name"; args+=(--save-tensors "$work/tensors_$name"); }
  [[ -n ${COMPARE_FILTER:-} ]] && args+=(--filter "$COMPARE_FILTER")
  rm -f "$out/$name.json"
  # The package must come from that tree: its folder is printed first and recorded in the JSON.
  PYTHONPATH="$tree/python:$root/.deps/py" timeout -k 5 "${COMPARE_RUN_TIMEOUT:-240}" "$py" -c \
      'import openmla, sys; print("openmla from", openmla.__file__, "commit", openmla.build_commit())' \
      >"$out/run_$name.log" 2>&1
  PYTHONPATH="$tree/python:$root/.deps/py" timeout -k 5 "${COMPARE_RUN_TIMEOUT:-240}" "$py" \
      tools/compare_outputs.py "${args[@]}" >>"$out/run_$name.log" 2>&1
  local rc=$?
  local line errors
  line=$(grep -E '^compare_outputs: ' "$out/run_$name.log" | tail -1 | sed 's/ -> .*//; s/^compare_outputs: //')
  errors=$(grep -cE '^\[ *[0-9]+/[0-9]+\] .*: [A-Za-z]*(Error|Exception)' "$out/run_$name.log")
  if (( rc == 0 )) && [[ -f $out/$name.json ]]; then
    if (( errors > 0 )); then record FAIL "$line; see run_$name.log"; else record ok "$line"; fi
  else
    record FAIL "rc $rc${line:+, $line}; see run_$name.log"
    tail -n 15 "$out/run_$name.log"
  fi
}
run_one old "$old"
run_one new "$root"

# ---- 4. compare --------------------------------------------------------------------------------------------------
begin check
if [[ -f $out/old.json && -f $out/new.json ]]; then
  PYTHONPATH="$root/.deps/py" "$py" tools/compare_outputs.py --check "$out/old.json" "$out/new.json" \
      >"$out/check.txt" 2>&1
  rc=$?
  verdict=$(grep -E '^all ' "$out/check.txt" | awk '{print $3 " of " $2 " identical, " $4 " different"}')
  if (( rc == 0 )); then record ok "$verdict"; else record DIFFERENT "${verdict:-see check.txt}"; fi
else
  record FAIL "a recording is missing"
fi
summary
