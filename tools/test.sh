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
#   OPENMLA_FAMILY_OFF   0: skip the family-off build (default 1: build <build dir>-famoff with every kernel family
#                        switched off and OPENMLA_TRACE on, the library, its C++ tests and the extension, and run the
#                        C++ tests and the Python tests against it: every entry point answers "not built")
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
cmake_args=(-S . -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py")  # -B below: two build folders
# ccache, when installed, makes the second build of an unchanged tree nearly free.
if command -v ccache >/dev/null 2>&1; then
  cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
               -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  echo "using ccache"
fi
# shellcheck disable=SC2206  # word splitting of the user's extra arguments is intended
extra=(${OPENMLA_CMAKE_ARGS:-})
cmake "${cmake_args[@]}" -B "$build_dir" "${extra[@]}" || finish 1 "FAILED: CMake configure"

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

# Every kernel family off (CMake OPENMLA_ENABLE_*=OFF) and the trace readers on: no kernel unit but the checked-mode
# one, so this costs about a minute and a half on 2 cores without ccache. It proves that such a build links and
# imports (no entry point or trace reader may name an absent family's kernels) and that each entry point answers "not
# built" with its CMake option (tests/cpp/test_build_options.cpp, tests/python/test_build_options.py). The extension
# stays in its own folder (OPENMLA_PYTHON_INPLACE=OFF); the Python tests load it from a package copy beside it
# (OPENMLA_PACKAGE_DIR). The tests see no device (CUDA_VISIBLE_DEVICES=""), so on a GPU machine the GPU tests of the
# absent families skip.
if [[ ${OPENMLA_FAMILY_OFF:-1} != 0 ]]; then
  off_dir="$build_dir-famoff"
  section "family-off build ($off_dir: every kernel family OFF, OPENMLA_TRACE=ON)"
  mkdir -p "$off_dir"
  off_log="$off_dir/family_off.log"
  if cmake "${cmake_args[@]}" -B "$off_dir" "${extra[@]}" -DOPENMLA_ENABLE_KV_CACHE=OFF \
       -DOPENMLA_ENABLE_DENSE_DECODE=OFF -DOPENMLA_ENABLE_SPARSE_PREFILL=OFF -DOPENMLA_ENABLE_MHA_PREFILL=OFF \
       -DOPENMLA_ENABLE_MERGE_STATES=OFF \
       -DOPENMLA_TRACE=ON -DOPENMLA_PYTHON_INPLACE=OFF > "$off_log" 2>&1 &&
     cmake --build "$off_dir" -j "$jobs" >> "$off_log" 2>&1; then
    echo "built [$(elapsed)]"
    if CUDA_VISIBLE_DEVICES="" ctest --test-dir "$off_dir" --output-on-failure -j "$jobs" --timeout 900 \
         > "$off_dir/ctest.log" 2>&1; then
      grep -E "tests passed" "$off_dir/ctest.log"
    else
      tail -n 60 "$off_dir/ctest.log"
      failed+=("family-off C++ tests")
    fi
    package="$(cd "$off_dir" && pwd)/package"
    rm -rf "$package" && mkdir -p "$package/openmla"
    cp python/openmla/*.py "$off_dir"/_openmla*.so "$package/openmla/"
    if CUDA_VISIBLE_DEVICES="" OPENMLA_PACKAGE_DIR="$package" PYTHONPATH=".deps/py${PYTHONPATH:+:$PYTHONPATH}" \
         "$py" -m pytest tests/python -q -p no:cacheprovider > "$off_dir/pytest.log" 2>&1; then
      tail -n 1 "$off_dir/pytest.log"
    else
      tail -n 60 "$off_dir/pytest.log"
      failed+=("family-off Python tests")
    fi
  else
    tail -n 40 "$off_log"
    failed+=("family-off build")
  fi
fi

if (( ${#failed[@]} )); then
  finish 1 "FAILED: $(IFS=,; echo "${failed[*]}")"
fi
finish 0 "all tests passed"
