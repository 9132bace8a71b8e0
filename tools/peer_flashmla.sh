#!/usr/bin/env bash
# OpenMLA: builds the peer, FlashMLA 9241ae3, on the GPU machine, and prints the environment that makes
# `import flash_mla` work, for eval. The benchmarks then time FlashMLA in the same run (benchmarks/peer.py).
#
#   eval "$(bash tools/peer_flashmla.sh)"        # ~2 min with 16 cores the first time; a warm machine finds the build
#
# Needs .peer/flashmla-9241ae3.tgz and .peer/build_flashmla.sh (copied by hand from where the peer's tarball is kept, outside the project; .peer/ is
# git-ignored, so name it in the device tool's carry list). The build lands outside the synced tree
# (OPENMLA_PEER_BUILD_DIR, default the temp folder's peer/, which a warm machine keeps between calls).
# Only the export line goes to stdout; the messages go to stderr (on a failed build, the last 30 lines of its log,
# which stays in $DEST/flashmla_build.log). Exits non-zero, printing nothing to eval, when the build fails or the
# result does not import.
#
# Environment (optional): OPENMLA_PEER_DIR (default .peer), OPENMLA_PEER_TGZ (default the newest
# $OPENMLA_PEER_DIR/flashmla-*.tgz), OPENMLA_PEER_BUILD_DIR (see above).
set -euo pipefail
cd "$(dirname "$0")/.."
peer_dir=${OPENMLA_PEER_DIR:-.peer}
tgz=${OPENMLA_PEER_TGZ:-$(ls -t "$peer_dir"/flashmla-*.tgz 2>/dev/null | head -1 || true)}
script=$peer_dir/build_flashmla.sh
if [[ -z $tgz || ! -f $tgz || ! -f $script ]]; then
  echo "peer_flashmla: need $peer_dir/flashmla-9241ae3.tgz and $script (copy flashmla-9241ae3.tgz and build_flashmla.sh into $peer_dir on the workstation, and carry $peer_dir)" >&2
  exit 1
fi
dest=${OPENMLA_PEER_BUILD_DIR:-$(dirname "$(mktemp -u)")/peer}

t0=$(date +%s)
# build_flashmla.sh prints the export line last (and, on failure, the tail of its log on stdout).
if ! lines=$(bash "$script" "$tgz" "$dest"); then
  echo "$lines" >&2
  echo "peer_flashmla: the FlashMLA build failed (log: $dest/flashmla_build.log)" >&2
  exit 1
fi
export_line=$(grep -E '^export PYTHONPATH=' <<<"$lines" | tail -1)
if [[ -z $export_line ]]; then
  echo "peer_flashmla: build_flashmla.sh printed no export line:" >&2
  echo "$lines" >&2
  exit 1
fi

# The result must import (it needs torch and the CUDA driver: this runs on the GPU machine).
eval "$export_line"
if ! where=$(python3 -c 'import flash_mla, os; print(os.path.dirname(flash_mla.__file__))' 2>&1); then
  echo "peer_flashmla: built, but 'import flash_mla' fails: $where" >&2
  exit 1
fi
echo "peer_flashmla: FlashMLA ready in $(( $(date +%s) - t0 )) s: $where" >&2
echo "$export_line"
