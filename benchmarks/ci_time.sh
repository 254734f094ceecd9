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
         TORCH_EXTENSIONS_DIR="$work/cache/extensions"
  .ci/run
) > "$work/ci.log" 2>&1
rc=$?
total=$(( $(date +%s) - t0 ))
echo "ci_time: .ci/run exited $rc after $total s (log $work/ci.log)"
python3 - "$times" "$total" "$rc" "$commit" "$repo/benchmarks/results" <<'EOF'
import json, os, platform, sys
times, total, rc, commit, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
phases = [json.loads(line) for line in open(times) if line.strip()]
flags = []
try:
    flags = next(l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags"))
except (OSError, StopIteration):
    pass
record = {
    "what": ".ci/run on a fresh clone with empty pip, Inductor (TORCHINDUCTOR_CACHE_DIR) and torch-extension "
            "(TORCH_EXTENSIONS_DIR) caches: benchmarks/ci_time.sh",
    "commit": commit, "exit": rc, "total_s": total, "total_min": round(total / 60, 1),
    "phases": phases, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                  "amx": any(f.startswith("amx") for f in flags), "avx512": "avx512f" in flags},
}
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "ci_time.json"), "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
lines = ["# CI time from a cold machine", "",
         f"`bash benchmarks/ci_time.sh` at {commit}: `.ci/run` on a fresh clone, empty pip / Inductor / torch-extension caches,",
         f"{record['machine']['cpus']} CPUs (AMX: {record['machine']['amx']}). Exit {rc}, **{record['total_min']} min** in all "
         "(CI's limit is 90, the budget 35).", "", "| phase | minutes | exit |", "|---|---:|---:|"]
lines += [f"| {p['phase']} | {p['seconds'] / 60:.1f} | {p['exit']} |" for p in phases]
lines += ["", "Phases: setup (venv and packages from nothing), lint (`ruff check`), fast (`make test-fast`), slow (the "
          "multi-process tests but the support matrix, the SLURM cluster's install included), matrix "
          "(tests/e2e/test_support_matrix.py's runs), plan-check and matrix-check (the committed configs and support matrix "
          "are current).", ""]
with open(os.path.join(out, "ci_time.md"), "w") as f:
    f.write("\n".join(lines))
print("\n".join(lines))
EOF
exit $rc
