#!/usr/bin/env bash
# Builds source trees of kernel variants under .ab/ (here, where git is; then carry .ab to the GPU machine and run
# tools/variant_check.sh there). One argument per tree: NAME=REV[:PATCH...] — the tree is REV with the patches applied
# in order (git am), written by git archive (no .git). Switch overrides: NAME=REV[:PATCH...]@MACRO=VALUE,... sets
# `#define MACRO VALUE` lines in the tree's sources (for the patch series whose switches are compile definitions).
#
#   bash tools/variant_trees.sh base=9e3b392 st3=9e3b392:docs/history/variants/mha/0013-*.patch
#   bash tools/variant_trees.sh "q2=62e8fe0:docs/history/variants/mha/000[1-3]-*.patch"
#
# Patches are read from this checkout (so they may name files of HEAD even when REV is older).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p .ab
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}
  overrides=""; [[ $rest == *@* ]] && { overrides=${rest#*@}; rest=${rest%%@*}; }
  rev=${rest%%:*}; patches=(); [[ $rest == *:* ]] && IFS=: read -r -a patches <<< "${rest#*:}"
  [[ -n $name && -n $rev ]] || { echo "bad tree spec '$spec' (NAME=REV[:PATCH...][@MACRO=VALUE,...])" >&2; exit 2; }
  wt=$(mktemp -d /tmp/variant_tree.XXXXXX)
  git worktree add -q --detach "$wt" "$rev"
  for pt in "${patches[@]}"; do
    for f in $pt; do (cd "$wt" && git -c user.name=variant -c user.email=variant@localhost am -q "$root/$f") || {
      echo "patch $f does not apply to $rev" >&2; git worktree remove --force "$wt"; exit 1; }; done
  done
  rm -rf ".ab/$name" && mkdir -p ".ab/$name" && git -C "$wt" archive HEAD | tar -x -C ".ab/$name"
  git worktree remove --force "$wt"
  if [[ -n $overrides ]]; then
    IFS=, read -r -a kv <<< "$overrides"
    for o in "${kv[@]}"; do
      m=${o%%=*}; v=${o#*=}
      files=$(grep -rl "^#define $m " ".ab/$name/src" || true)
      [[ -n $files ]] || { echo "tree $name: no '#define $m' in src/" >&2; exit 1; }
      sed -i "s/^#define $m .*/#define $m $v/" $files
    done
  fi
  echo "tree .ab/$name: $rev + ${#patches[@]} patch pattern(s)${overrides:+, $overrides}"
done
