#!/usr/bin/env bash
# OpenMLA: the main job. The README's first command.
#
# Installs the pinned dependencies, builds build/ (Release, all cores), then:
#   - on a machine with a Hopper GPU and PyTorch: runs the benchmarks (benchmarks/run.py; default
#     suites: dense decode, sparse decode and the KV-cache codec), printing a table against the measured
#     ceilings and FlashMLA's figures (docs/targets.md); arguments are passed on (e.g. --suite kv_cache --filter v32 --json out.json);
#   - anywhere else: says so plainly and runs small dense- and sparse-decode cases on the CPU reference.
#
# Environment: OPENMLA_BUILD_DIR (default build), OPENMLA_CMAKE_ARGS, OPENMLA_JOBS, as tools/test.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
build_dir=${OPENMLA_BUILD_DIR:-build}
jobs=${OPENMLA_JOBS:-$(nproc)}
py=$(command -v python3)

fail() { echo "tools/bench.sh: FAILED: $*" >&2; exit 1; }

bash tools/setup_deps.sh || fail "dependency set-up"
cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py")
if command -v ccache >/dev/null 2>&1; then
  cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
               -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2206
extra=(${OPENMLA_CMAKE_ARGS:-})
cmake "${cmake_args[@]}" "${extra[@]}" >/dev/null || fail "CMake configure (run it by hand to see why)"
# The benchmarks and the CPU reference need the Python extension only (tools/test.sh builds the rest).
cmake --build "$build_dir" -j "$jobs" --target _openmla || fail "build"

export PYTHONPATH="python:.deps/py${PYTHONPATH:+:$PYTHONPATH}"
gpu=$("$py" - <<'PY' 2>/dev/null
try:
    import torch
except Exception:
    print("PyTorch is not installed")
else:
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device")
    elif torch.cuda.get_device_capability() != (9, 0):
        print("the GPU is not a Hopper (sm_90) GPU: " + torch.cuda.get_device_name())
    else:
        print("ok")
PY
)
echo
if [[ $gpu == ok ]]; then
  "$py" benchmarks/run.py "$@"
  rc=$?
else
  echo "no GPU on this machine: running the CPU reference on small dense and sparse cases instead (${gpu:-python3 failed})"
  "$py" benchmarks/run.py --cpu-reference
  rc=$?
fi
echo "tools/bench.sh: done in $(( $(date +%s) - t_start )) s"
exit $rc
