#!/usr/bin/env bash
# Installs OpenMLA's pinned dependencies into .deps/ (git-ignored). Idempotent: a second run finds
# everything in place and touches no network. With --offline it installs only from the wheels already
# in .deps/wheels (that folder is what gets carried to the GPU machine).
#
#   .deps/wheels/       the pinned wheels, downloaded once
#   .deps/nanobind/     nanobind (CMake package + sources), from its wheel
#   .deps/py/           pytest, numpy, ml_dtypes for the Python tests (only where Python lacks them)
#   .deps/googletest/   a copy of the system GoogleTest sources (for machines without it, e.g. the GPU box)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
deps=$root/.deps
mkdir -p "$deps/wheels"

NANOBIND_VERSION=3.1.0
PY_TEST_PINS=(pytest==8.3.4 numpy==2.2.6 ml_dtypes==0.5.1)

offline=0
[[ "${1:-}" == "--offline" ]] && offline=1

py=${PYTHON:-python3}

fetch_wheel() {  # name version
  local name=$1 version=$2 norm
  norm=$(echo "$name" | tr '-' '_')
  if ! ls "$deps/wheels/${norm}-${version}-"*.whl >/dev/null 2>&1; then
    if [[ $offline == 1 ]]; then
      echo "setup_deps: missing wheel $name==$version in .deps/wheels (offline mode)" >&2
      exit 1
    fi
    "$py" -m pip download --quiet --no-deps --only-binary=:all: "$name==$version" -d "$deps/wheels"
  fi
  ls "$deps/wheels/${norm}-${version}-"*.whl | head -n1
}

# nanobind: the wheel carries the CMake package and sources; unpack it as a plain folder.
if [[ ! -f "$deps/nanobind/.version" || "$(cat "$deps/nanobind/.version")" != "$NANOBIND_VERSION" ]]; then
  whl=$(fetch_wheel nanobind "$NANOBIND_VERSION")
  rm -rf "$deps/nanobind"
  mkdir -p "$deps/nanobind"
  "$py" -m zipfile -e "$whl" "$deps/nanobind"
  echo "$NANOBIND_VERSION" > "$deps/nanobind/.version"
fi

# Python test tools: only install what this Python lacks, pinned, into .deps/py.
need=()
"$py" -c "import pytest" 2>/dev/null || need+=("${PY_TEST_PINS[0]}")
"$py" -c "import numpy" 2>/dev/null || need+=("${PY_TEST_PINS[1]}")
"$py" -c "import ml_dtypes" 2>/dev/null || need+=("${PY_TEST_PINS[2]}")
if (( ${#need[@]} )); then
  if [[ -d "$deps/py" ]] && PYTHONPATH="$deps/py" "$py" -c "import pytest, numpy, ml_dtypes" 2>/dev/null; then
    :
  elif [[ $offline == 1 ]]; then
    echo "setup_deps: this Python lacks ${need[*]} and --offline forbids fetching them" >&2
    exit 1
  else
    "$py" -m pip install --quiet --target "$deps/py" "${need[@]}"
  fi
fi

# GoogleTest: from the system. Keep a copy of its sources so machines without it can build the tests.
if [[ ! -d "$deps/googletest" && -f /usr/src/googletest/CMakeLists.txt ]]; then
  cp -r /usr/src/googletest "$deps/googletest"
fi

echo "setup_deps: ready in .deps (nanobind $NANOBIND_VERSION)"
