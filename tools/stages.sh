# Stage bookkeeping of the GPU-machine scripts (tools/gpu_check.sh, tools/compare_builds.sh), sourced by them:
# `begin NAME` starts a stage, `record RESULT [DETAIL]` ends it, `skip NAME [WHY]` records one that did not run; the
# script's summary reads stages[] with result[], detail[] and seconds[]. The caller sets t_start.
stages=()
declare -A result detail seconds
elapsed() { local s=$(( $(date +%s) - t_start )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
begin() { stage=$1; stage_t0=$(date +%s); echo "=== $stage [$(elapsed)]"; }
record() {  # result detail
  stages+=("$stage"); result[$stage]=$1; detail[$stage]=$2; seconds[$stage]=$(( $(date +%s) - stage_t0 ))
  echo "    $stage: $1${2:+ ($2)}"
}
skip() { stage=$1; stage_t0=$(date +%s); record skipped "$2"; }
