#!/usr/bin/env bash
# CPU seconds of a test run, by process kind and by test (benchmarks/ci_cpu_report.py): every Python process records its
# own (benchmarks/ci_cpu/sitecustomize.py on PYTHONPATH), the C++ compiler is timed call by call (benchmarks/ci_cpu/bin
# first on PATH).
#
#   bash benchmarks/ci_cpu.sh OUT [PYTEST ARGS...]    (default: the slow phase's selection, as `make test-slow` runs it)
#
# OUT gets records/, report.md and report.json. COLD=1 empties a fresh TORCHINDUCTOR_CACHE_DIR under OUT first (what CI
# pays for compiled graphs). Measured this way, 2026-11-27: the slow phase 2680 CPU-s (ranks 1720, agents 226, the C++
# compiler 283, the pytest workers and the rest 452), the matrix 1416.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: ci_cpu.sh OUT [PYTEST ARGS...]}"
shift
(( $# )) || set -- -m slow --ignore tests/e2e/test_support_matrix.py -n 2 --dist loadgroup
mkdir -p "$out/records"
rm -f "$out"/records/*
export CI_CPU_DIR="$out/records" PYTHONPATH="$repo/benchmarks/ci_cpu${PYTHONPATH:+:$PYTHONPATH}" PATH="$repo/benchmarks/ci_cpu/bin:$PATH"
if [[ ${COLD:-0} == 1 ]]; then rm -rf "$out/inductor"; export TORCHINDUCTOR_CACHE_DIR="$out/inductor"; fi
unset PYTHONDONTWRITEBYTECODE
cd "$repo"
.venv/bin/python -m pytest -q "$@"
rc=$?
.venv/bin/python benchmarks/ci_cpu_report.py "$out/records" "$out/report.json" | tee "$out/report.md"
exit $rc
