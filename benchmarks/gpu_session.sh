#!/usr/bin/env bash
# One call on the offline GPU machine: install fp8launch and its backends from a wheelhouse next to the machine's own
# CUDA torch, then run one stage. docs/benchmarks.md gives each stage's device call (command, carry, timeout_s).
#
#   ../shared/tools/gpu-wheelhouse 3.12 .whl --slim    # on a machine with a registry (python3 -V on the GPU machine)
#   bash benchmarks/gpu_session.sh .whl STAGE OUT       # on the GPU machine, from the repository root (OUT: the call's $OUT)
#
# Every result goes to a work folder outside OUT (WORK, default a new /tmp/fp8launch-STAGE.XXXXXX). OUT gets only what
# the GPU machine brings back (at most 8 files, 16 MiB each, 64 MiB together, no deeper than OUT/a/b/file, names of
# letters, digits, '.', '_', '-'):
#   OUT/session.log    this call's whole log, as it runs
#   OUT/results.tgz    every file under WORK (benchmarks/pack_results.py), packed again every PACK_EVERY seconds (45) and
#                      at the end, so a call cut off at its time limit still brings the last one back
#   the stage's key files, copied out of WORK: speed: the comparison table (<date>-<device>-speed.md), the FP8 vs bf16
#   table (<date>-<device>.md), the core bench's picture (<core>-bench.png) and its profile's (<core>-profile.png)
# Every stage's environment.txt: the versions and benchmarks/api_probe.py's line for each version-dependent API it uses.
#
# STAGE: speed   benchmarks/gpu_bench.sh's parts in one call of at most BUDGET (540) seconds, install included: the core
#                (the 15-layer Llama-3-8B shape with full AC), FP8 vs bf16, timed on unprofiled steps and profiled in
#                the same runs' last steps; the reference loop in bf16 and FP8 on that shape; the tables with the targets
#                (docs/benchmarks.md). A core that fails (out of GPU memory) is run again smaller in the same call
#                (gpu_bench.sh FALLBACK_SETS). GPU_DRY_RUN=1 runs it here on tiny CPU shapes, with no install and no GPU:
#                  GPU_DRY_RUN=1 bash benchmarks/gpu_session.sh NONE speed OUT
#                GPU_PLAN=1 prints the parts, their commands and estimates, the machine's start and the session's device
#                time, writes them to OUT/plan.json ({"parts": [{"name", "seconds"}], "call_s", "budget_s", "margin_s",
#                "skipped", "fallback", ...}), and runs nothing
#        bench   benchmarks/gpu_bench.sh on the first session's pair (the Llama-3-8B slice and llama3-1b-fp8.toml,
#                2 x 40 steps each, no profile, no reference)
#        matrix  the GPU support matrix (tests/gpu/test_support_matrix_gpu.py), the TE/MS-AMP, block-format and MoE tests
#        specs   the committed specs cut to one GPU (tests/gpu/test_specs_gpu.py)
#        te      Transformer Engine, one call at a time (docs/benchmarks.md, "Transformer Engine, call by call"):
#                benchmarks/te_install.sh next TE_PARTS (.te) TE_STATE (.te-state, outside OUT) does the next thing (headers
#                checked, parts arrived and checked, reassembled, installed, the binding built in a process that outlives
#                the call, waited for); once it imports, fp8launch is installed and tests/gpu's TE cases run
# BUDGET: the stage's seconds, install included (speed 540: 60 s inside a 600 s call). SETS, BENCHES, PARTS, STEPS, ...
# reach benchmarks/gpu_bench.sh (its header lists them).
set -uo pipefail
wheels="${1:?usage: gpu_session.sh WHEELHOUSE STAGE OUT}"; stage="${2:?usage: gpu_session.sh WHEELHOUSE STAGE OUT}"
out="${3:?usage: gpu_session.sh WHEELHOUSE STAGE OUT}"
MACHINE_START_S=240  # the machine's start (~4 min), before the call's own time limit begins; it counts in the session's 900 s
INSTALL_S=35         # pip from the wheelhouse, the environment (benchmarks/api_probe.py), doctor
TABLES_S=10          # the report pass and the last pack
case "$stage" in
  speed) budget="${BUDGET:-$([[ ${GPU_DRY_RUN:-0} == 1 ]] && echo 1500 || echo 540)}" ;;
  bench|te) budget="${BUDGET:-540}" ;;
  matrix) budget="${BUDGET:-500}" ;;
  specs) budget="${BUDGET:-540}" ;;
  *) echo "gpu_session: unknown stage '$stage' (speed, bench, matrix, specs, te)" >&2; exit 2 ;;
esac
if [[ ${GPU_DRY_RUN:-0} == 1 && $stage != speed ]]; then echo "gpu_session: GPU_DRY_RUN covers the speed stage only" >&2; exit 2; fi
export PYTHONUNBUFFERED=1
core=$(set -- ${BENCHES:-8b-ac}; echo "$1")

if [[ ${GPU_PLAN:-0} == 1 ]]; then
  [[ $stage == speed ]] || { echo "gpu_session: GPU_PLAN covers the speed stage only" >&2; exit 2; }
  echo "gpu_session plan: the machine's start ~$MACHINE_START_S s (before this call's timeout_s; in the session's device time)"
  echo "gpu_session plan: install, environment (the API probe), doctor ~$INSTALL_S s; this call's BUDGET $budget s"
  bench_plan=$(mktemp "${TMPDIR:-/tmp}/gpu-plan.XXXXXX")
  PLAN_JSON="$bench_plan" DEADLINE=$(( $(date +%s) + budget - INSTALL_S - 20 )) bash benchmarks/gpu_bench.sh OUT/speed plan \
    | sed "s/^/  /"
  (( PIPESTATUS[0] == 0 )) || { rm -f "$bench_plan"; exit 2; }
  mkdir -p "$out"
  python3 - "$bench_plan" "$out/plan.json" "$INSTALL_S" "$TABLES_S" "$budget" "$MACHINE_START_S" <<'EOP'
import json, os, sys
bench, path = json.load(open(sys.argv[1])), sys.argv[2]
install, tables, budget, start = (int(x) for x in sys.argv[3:])
def call(plan, before):
    parts = before + plan["parts"] + [{"name": "tables and the last pack", "seconds": tables}]
    return {"parts": parts, "call_s": sum(p["seconds"] for p in parts), "skipped": plan["skipped"]}
doc = {**call(bench["call"], [{"name": "install, environment (the API probe), doctor", "seconds": install}]), "budget_s": budget}
doc["margin_s"] = budget - doc["call_s"]
doc["machine_start_s"], doc["session_s"], doc["session_budget_s"] = start, start + budget + 60 + 30, 900
if "fallback" in bench:  # after the core's first run failed at its first step: the parts run again, smaller
    failed = bench["fallback"].pop("failed_s", None)
    doc["fallback"] = call(bench["fallback"], [{"name": "install, environment (the API probe), doctor", "seconds": install}]
                           + ([{"name": "the core's failed first run", "seconds": failed}] if failed is not None else []))
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print(f"gpu_session plan: {path}: the call ~{doc['call_s']} s of BUDGET {budget} s ({doc['margin_s']} s to spare); skipped: "
      + ("; ".join(doc["skipped"]) or "none"))
EOP
  rc=$?; rm -f "$bench_plan"; (( rc == 0 )) || exit 2
  echo "gpu_session plan: a session of this call alone: ~$MACHINE_START_S s start + this call's timeout_s (BUDGET + 60) + ~30 s" \
       "idle before give_back = $(( MACHINE_START_S + budget + 60 + 30 )) s of the 900 s"
  exit 0
fi

mkdir -p "$out"
work="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/fp8launch-$stage.XXXXXX")}"
mkdir -p "$work"
case "$stage" in
  speed) singles=("*.md" "speed/$core/bench.png=$core-bench.png" "speed/$core/profile.png=$core-profile.png") ;;
  bench) singles=("*.md") ;;
  matrix) singles=(matrix.txt support_matrix_gpu.json) ;;
  specs) singles=(specs.txt) ;;
  te) singles=(te.txt te-state/headers.txt) ;;
esac
pack() { python3 benchmarks/pack_results.py "$work" "$out" "${singles[@]/#/--single=}"; }

install() {  # fp8launch, torchao, DeepSpeed from the wheelhouse, unless they import already (an earlier call installed them);
             # then the environment: the GPU, the versions, each version-dependent API the stages use (benchmarks/api_probe.py)
  local rc=0
  if ! python3 -c "import torchao, deepspeed, jsonschema, launcher" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "$wheels" torchao==0.18.0 deepspeed==0.19.8 jsonschema hjson pydantic \
      && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || rc=1
  fi
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 benchmarks/api_probe.py
  } 2>&1 | tee "$work/environment.txt"
  return "$rc"  # what the environment says is information: a probe that fails stops nothing
}

stage_speed() {
  # The parts, the report pass after a timeout and the last pack within BUDGET: a part that does not fit is skipped
  # (gpu_bench.sh DEADLINE), and a timeout still leaves the tables of what finished.
  if [[ ${GPU_DRY_RUN:-0} == 1 ]]; then
    { echo "GPU_DRY_RUN: no GPU, nothing installed"; python3 benchmarks/api_probe.py 2>/dev/null; } | tee "$work/environment.txt"
  else
    install || return 1
  fi
  local left=$(( budget - SECONDS - 10 ))  # 10 s for the report pass and the last pack; parts end 10 s before the timeout
  DEADLINE=$(( $(date +%s) + left - 10 )) RESULTS="$work" timeout "$left" bash benchmarks/gpu_bench.sh "$work/speed" 2>&1 \
    | tee "$work/speed.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || RESULTS="$work" bash benchmarks/gpu_bench.sh "$work/speed" report 2>&1 | tee -a "$work/speed.txt"
  compgen -G "$work/*-speed.md" > /dev/null || { echo "speed: no comparison table was written" >&2; return 1; }
}

stage_bench() {
  install || return 1
  BENCHES="${BENCHES:-slice 1b-2026-11-24}" STEPS="${STEPS:-40}" WARMUP="${WARMUP:-5}" REPEATS="${REPEATS:-2}" PROFILE="${PROFILE:-0}" \
    PARTS="${PARTS:-timing}" REFERENCE="${REFERENCE:-0}" TORCHTITAN=0 RESULTS="$work" timeout "$(( budget - SECONDS - 15 ))" \
    bash benchmarks/gpu_bench.sh "$work/bench" 2>&1 | tee "$work/bench.txt"
}

stage_matrix() {
  install || return 1
  fp8launch doctor 2>&1 | tee "$work/doctor.txt"
  FP8LAUNCH_MATRIX_RESULTS="$work/support_matrix_gpu.json" timeout "$(( budget - SECONDS - 15 ))" python3 -m pytest -m gpu -q \
    -n "${WORKERS:-6}" -p no:cacheprovider --junitxml "$work/matrix.xml" tests/gpu/test_support_matrix_gpu.py tests/gpu/test_te_gpu.py \
    tests/gpu/test_msamp_gpu.py tests/gpu/test_block_formats_gpu.py tests/gpu/test_moe_gpu.py 2>&1 | tail -60 | tee "$work/matrix.txt"
}

stage_specs() {
  install || return 1
  timeout -s INT "$(( budget - SECONDS - 15 ))" python3 -m pytest -m gpu -v -n "${WORKERS:-1}" -p no:cacheprovider \
    --junitxml "$work/specs.xml" tests/gpu/test_specs_gpu.py 2>&1 | tail -60 | tee "$work/specs.txt"
}

stage_te() {
  local state="${TE_STATE:-.te-state}" rc
  # wait for the build while BUDGET leaves 150 s for fp8launch's install and the TE tests
  TE_WAIT="${TE_WAIT:-$(( budget - SECONDS - 150 ))}" bash benchmarks/te_install.sh next "${TE_PARTS:-.te}" "$state"
  rc=$?
  mkdir -p "$work/te-state" && cp "$state"/*.txt "$state"/*.log "$state"/build.* "$work/te-state/" 2>/dev/null
  (( rc == 0 )) || return "$rc"
  install || return 1
  python3 -c "import transformer_engine, transformer_engine.pytorch as te; print('transformer_engine', transformer_engine.__version__)" \
    2>&1 | tee -a "$work/environment.txt"
  timeout "$(( budget - SECONDS - 15 ))" python3 -m pytest -m gpu -v -p no:cacheprovider --junitxml "$work/te.xml" \
    tests/gpu/test_te_conformance.py tests/gpu/test_te_gpu.py tests/gpu/test_fp8_ran_conformance.py 2>&1 | tail -80 | tee "$work/te.txt"
  return "${PIPESTATUS[0]}"
}

{
  echo "gpu_session: $stage, results in $work, BUDGET $budget s; OUT gets session.log, results.tgz and ${singles[*]}"
  # the pack loop: on TERM it ends its sleep too (nothing of it may hold the log's pipe open after the stage)
  ( trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do sleep "${PACK_EVERY:-45}" & nap=$!; wait "$nap"; pack || true; done ) &
  packer=$!
  "stage_$stage"
  rc=$?
  kill "$packer" 2>/dev/null; wait "$packer" 2>/dev/null
  pack
  python3 benchmarks/pack_results.py --check "$out"
  echo "gpu_session: $stage exited $rc after $SECONDS s"
  exit "$rc"
} 2>&1 | tee -a "$out/session.log"
exit "${PIPESTATUS[0]}"
