#!/usr/bin/env bash
# The machine-code guard of a refactor (docs/architecture.md, "Device layer"): dumps the SASS and the resource usage
# of every kernel object of a build, or compares two such dumps.
#
#   bash tools/sass_guard.sh dump BUILD_DIR OUT_DIR     # one .sass and one .res file per kernel object
#   bash tools/sass_guard.sh diff OLD_DIR NEW_DIR       # per object: identical / DIFFERENT (+ a short diff); exit 1
#                                                         if any object differs or is missing on one side
#
# Build the objects first, e.g. `ninja -C build $(ninja -C build -t targets all | grep -o '^[^:]*kernels/[^:]*\.o')`.
# Lines that depend on the source path (the anonymous-namespace hashes in names: cuobjdump's "identifier" lines) are
# dropped, and `diff` reads the hash in the names of kernels in an anonymous namespace (`_GLOBAL__N__<hash>_`, e.g. the
# FP8 dequantisation probe's) as one value, so two checkouts in different folders compare equal when their machine
# code is.
#
# Needs cuobjdump and nvdisasm (the CUDA toolkit's; where the local toolkit lacks them, the PyPI wheels
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry both binaries, e.g. 13.2.51, which read CUDA 13.0 objects).
# tools/sass_loops.py compares the loops of two objects with registers and addresses normalised: where a change
# renames registers only, it says IDENTICAL where this script says DIFFERENT.
set -euo pipefail
mode=${1:?dump or diff}
path_free() { sed 's/_GLOBAL__N__[0-9a-f]*_/_GLOBAL__N__/g' "$1"; }  # the path hash of anonymous namespaces
case $mode in
  dump)
    build=${2:?build dir}; out=${3:?output dir}
    mkdir -p "$out"
    n=0
    while IFS= read -r obj; do
      rel=${obj#"$build"/CMakeFiles/openmla.dir/}
      name=$(echo "$rel" | tr '/' '_')
      cuobjdump -sass "$obj" | grep -v identifier > "$out/$name.sass"
      cuobjdump -res-usage "$obj" | grep -v identifier > "$out/$name.res"
      n=$((n + 1))
    done < <(find "$build/CMakeFiles/openmla.dir/src/kernels" -name '*.cu.o' | sort)
    echo "sass_guard: $n kernel objects dumped to $out"
    ;;
  diff)
    old=${2:?old dir}; new=${3:?new dir}
    bad=0
    for f in "$old"/*.sass; do
      b=$(basename "$f")
      if [[ ! -f $new/$b ]]; then echo "MISSING in $new: $b"; bad=1; continue; fi
      if cmp -s <(path_free "$f") <(path_free "$new/$b") &&
         cmp -s <(path_free "${f%.sass}.res") <(path_free "$new/${b%.sass}.res"); then
        echo "identical  ${b%.sass}"
      else
        echo "DIFFERENT  ${b%.sass} ($(diff <(path_free "$f") <(path_free "$new/$b") | grep -c '^[<>]') SASS lines differ)"
        bad=1
      fi
    done
    for f in "$new"/*.sass; do [[ -f $old/$(basename "$f") ]] || { echo "NEW (no baseline): $(basename "$f")"; }; done
    exit $bad
    ;;
  *) echo "usage: $0 dump BUILD OUT | diff OLD NEW" >&2; exit 2 ;;
esac
