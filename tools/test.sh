#!/usr/bin/env bash
# OpenMLA: run every test. The README's test command; CI runs it through .ci/run.
#
# On a fresh clone it installs the pinned dependencies (tools/setup_deps.sh -> .deps/), configures
# build/ with Ninja (Release), builds everything with all cores, then runs the C++ tests (ctest) and
# the Python tests (pytest). Tests that need a Hopper GPU skip with their reason on machines without
# one. Exits non-zero if anything failed.
#
# Environment:
#   OPENMLA_BUILD_DIR    build folder (default: build)
#   OPENMLA_CMAKE_ARGS   extra CMake arguments, e.g. "-DOPENMLA_ENABLE_DENSE_DECODE=OFF"
#   OPENMLA_JOBS         parallel build/test jobs (default: all cores)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t_start=$(date +%s)

build_dir=${OPENMLA_BUILD_DIR:-build}
jobs=${OPENMLA_JOBS:-$(nproc)}
py=$(command -v python3)

elapsed() { local s=$(( $(date +%s) - t_start )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
finish() {  # status message
  echo
  echo "tools/test.sh: $2 (wall time $(elapsed))"
  exit "$1"
}
section() { echo; echo "=== $* [$(elapsed)]"; }

section "dependencies (tools/setup_deps.sh)"
bash tools/setup_deps.sh || finish 1 "FAILED: dependency set-up"

section "configure $build_dir"
cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py")
# ccache, when installed, makes the second build of an unchanged tree nearly free.
if command -v ccache >/dev/null 2>&1; then
  cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
               -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  echo "using ccache"
fi
# shellcheck disable=SC2206  # word splitting of the user's extra arguments is intended
extra=(${OPENMLA_CMAKE_ARGS:-})
cmake "${cmake_args[@]}" "${extra[@]}" || finish 1 "FAILED: CMake configure"

section "build ($jobs jobs)"
cmake --build "$build_dir" -j "$jobs" || finish 1 "FAILED: build"

failed=()
cpp_ran=0

section "C++ tests (ctest)"
if [[ -x "$build_dir/openmla_tests" ]]; then
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900
  rc=$?
  cpp_ran=1
  (( rc != 0 )) && failed+=("C++ tests")
  # ctest lists skipped tests by name only; print each distinct GTEST_SKIP reason once, with a count.
  log="$build_dir/Testing/Temporary/LastTest.log"
  if [[ -f "$log" ]] && grep -q ': Skipped$' "$log"; then
    echo "skip reasons (count, reason):"
    awk '/: Skipped$/ { getline reason; n[reason]++ } END { for (r in n) printf "  %5d  %s\n", n[r], r }' "$log"
  fi
else
  echo "no C++ test binary ($build_dir/openmla_tests): GoogleTest missing or no tests/cpp sources"
  failed+=("C++ tests (not built)")
fi

section "Python tests (pytest)"
if [[ -f python/openmla/__init__.py ]]; then
  PYTHONPATH="python:.deps/py${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest tests/python -rs
  rc=$?
  if (( rc == 5 )); then
    # Exit 5: pytest collected nothing. Only a failure if no test of either kind ran.
    echo "pytest: no Python tests were collected"
    (( cpp_ran )) || failed+=("Python tests (none collected, and no C++ tests ran)")
  elif (( rc != 0 )); then
    failed+=("Python tests")
  fi
else
  echo "python/openmla is missing"
  failed+=("Python tests (no package)")
fi

if (( ${#failed[@]} )); then
  finish 1 "FAILED: $(IFS=,; echo "${failed[*]}")"
fi
finish 0 "all tests passed"
