#!/usr/bin/env bash
# CI's time from a cold machine, simulated here: `.ci/run` on a fresh clone of HEAD with empty pip, Inductor and
# torch-extension caches, every phase timed (.ci/phase), then benchmarks/results/ci_time.{json,md} written.
#
#   bash benchmarks/ci_time.sh [WORKDIR]        (WORKDIR default: a new folder under /tmp; ~20-40 min on 2 cores)
#
# The machine should be otherwise idle: the figures are wall times. CI's own machine may be slower (its recorded
# run times were about twice this machine's for the same commit, 2026-11): the budget is 35 of CI's 90 minutes.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/ci-time.XXXXXX)}"
mkdir -p "$work"
clone="$work/clone"
rm -rf "$clone" "$work/cache"
git clone -q "$repo" "$clone" || exit 1
commit=$(git -C "$clone" rev-parse --short HEAD)
mkdir -p "$work/cache"/{pip,inductor,extensions,tmp}
times="$work/phases.jsonl"
: > "$times"
t0=$(date +%s)
(
  cd "$clone"
  export CI_TIMES="$times" PIP_CACHE_DIR="$work/cache/pip" TORCHINDUCTOR_CACHE_DIR="$work/cache/inductor" \
         TORCH_EXTENSIONS_DIR="$work/cache/extensions" CI_TIMELINE_DIR="$work/timeline"
  .ci/run
) > "$work/ci.log" 2>&1
rc=$?
total=$(( $(date +%s) - t0 ))
echo "ci_time: .ci/run exited $rc after $total s (log $work/ci.log)"
python3 "$repo/benchmarks/ci_time_record.py" "$times" "$work/ci.log" "$total" "$rc" "$commit" "$repo/benchmarks/results" \
  "$work/timeline" "$clone/.venv/bin/python"
exit $rc
