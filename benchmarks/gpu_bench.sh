#!/usr/bin/env bash
# FP8 vs bf16 on one GPU, where its step time goes, and fp8launch against a hand-written loop, in parts:
#   timing     `fp8launch bench SPEC --vs BASELINE --profile-last PROFILE_STEPS`: each run's figures (the ones the speed
#              targets read) are medians over its steps WARMUP+1..STEPS, which no profiler touches
#   profile    the same runs' last PROFILE_STEPS steps, after one step of the profiler's own warm-up: where a step's time
#              goes, the FP8 GEMM FLOP share and the ceiling (launcher/train/profiling.py); no run of its own
#   reference  benchmarks/reference_loop.py in bf16 and FP8 on the core's shape, batch, seed and schedule, unprofiled
# then a line on torchtitan (not run: docs/benchmarks.md says why) and the tables: fp8launch against the reference with the
# targets (benchmarks/compare_reference.py) and FP8 vs bf16 per bench (benchmarks/summarize_bench.py). From the repository
# root with torch (CUDA), torchao and fp8launch installed (`gpu_session.sh WHEELS speed OUT` installs them and runs this):
#   bash benchmarks/gpu_bench.sh OUT             # the parts, then the tables
#   bash benchmarks/gpu_bench.sh OUT report      # the tables only, from what OUT holds (after a timeout)
#   bash benchmarks/gpu_bench.sh OUT plan        # each part's command and estimate, what DEADLINE leaves out, and what a
#                                                # failed core leaves the fallback; runs nothing (PLAN_JSON: also as JSON)
# Writes OUT/<bench>/ (bench.json, bench.png, profile.json, profile.png, <runs>/), OUT/reference/{bf16,fp8}.{json,log},
# OUT/torchtitan/result.json, RESULTS/<date>-<device>-speed.{json,md} and RESULTS/<date>-<device>.{json,md}; after a
# fallback, the failed attempt's folder as OUT/<core>-failed/.
#
# A run that fails ends its part at once (bench stops at its first failed run; the reference's FP8 run is not started
# after its bf16 run failed). When the core's timing fails (out of GPU memory, typically: its train.log says "CUDA out of
# memory"), its folder is set aside and the core's parts run again in the same call with FALLBACK_SETS added to SETS,
# where they fit before DEADLINE.
#
# Environment (the defaults fit one call on one H100; docs/benchmarks.md has the budget):
#   BENCHES     the benches, in order; the first is the core (the reference runs on its shape)       [8b-ac]
#               8b-ac 8b-ac-all 1b 1b-all 3b 3b-all (benchmarks/specs/), slice 1b-2026-11-24 (the first session's pair)
#   PARTS       the core's parts, in order [timing reference]; a later bench gets timing (with its profile)
#   SETS        KEY=VALUE overrides, space-separated, for every run of every part, the reference too (planned through
#               reference_args.py), e.g. SETS="train.model=builtin:llama3-8b?layers=12 train.seq_len=4096"
#   FALLBACK_SETS  added to SETS when the core's timing fails; empty: no fallback  [train.model=builtin:llama3-8b?layers=12]
#   STEPS [10]  WARMUP [3]: the timed steps are WARMUP+1..STEPS   REPEATS [1]: runs per variant
#   PROFILE [1] profile the timing runs' last steps;  PROFILE_STEPS [3]: how many (a run trains STEPS + 1 + PROFILE_STEPS)
#   REFERENCE [1]  TORCHTITAN  auto: say whether torchtitan is here and why it is not run; 0: not even that  [auto]
#   DEADLINE    epoch seconds: a part whose estimate does not fit before it is skipped, with the reason; the core's first
#               timing always runs. After the core's timing every later estimate is scaled by its measured / estimated time
#   RESULTS     where the two tables go                                                    [benchmarks/results]
#   PLAN_JSON   plan mode: also write the parts, their seconds, the skipped and the fallback's plan there as JSON
#   GPU_DRY_RUN 1: the same commands on tiny CPU shapes (builtin:llama-debug?layers=1, seq 16, 2 processes, no compile,
#               torchao's size rule off), STEPS 4, WARMUP 2, PROFILE_STEPS 2, FALLBACK_SETS train.seq_len=8 by default
#   GPU_BENCH_FAULT  oom, in a dry run only: the core's first timing run fails as a run out of GPU memory does (its
#               train.log says so; nothing runs), to rehearse the fallback where CUDA's out-of-memory cannot happen
#   PYTHON      the interpreter [python3]
set -uo pipefail
out="${1:?usage: gpu_bench.sh OUT [run|report|plan]}"; mode="${2:-run}"
case "$mode" in run|report|plan) ;; *) echo "gpu_bench: unknown mode '$mode' (run, report or plan)" >&2; exit 2 ;; esac
py="${PYTHON:-python3}"
dry="${GPU_DRY_RUN:-0}"
benches=(${BENCHES:-8b-ac})
parts=(${PARTS:-timing reference})
steps="${STEPS:-$([[ $dry == 1 ]] && echo 4 || echo 10)}"; warmup="${WARMUP:-$([[ $dry == 1 ]] && echo 2 || echo 3)}"
profile_steps="${PROFILE_STEPS:-$([[ $dry == 1 ]] && echo 2 || echo 3)}"
repeats="${REPEATS:-1}"; profile="${PROFILE:-1}"; reference="${REFERENCE:-1}"; torchtitan="${TORCHTITAN:-auto}"
fallback_sets="${FALLBACK_SETS-$([[ $dry == 1 ]] && echo "train.seq_len=8" || echo "train.model=builtin:llama3-8b?layers=12")}"
fault="${GPU_BENCH_FAULT:-}"
results="${RESULTS:-benchmarks/results}"
S=benchmarks/specs

# name -> "FP8 spec, baseline (a twin spec or bf16), then the estimates on one H100: compile seconds on a cold cache,
# seconds per step, billions of parameters" (docs/benchmarks.md); a rank's weight init is the plan's own figure (init_s). A step: the plan's prediction scaled by the 2026-11-24
# slice's measured / predicted 0.67. Parameters: `fp8launch plan --format json`'s memory.params.
declare -A SPEC=(
  [8b-ac]="$S/llama3-8b-ac-fp8.toml $S/llama3-8b-ac-bf16.toml 60 0.8 4.32"
  [8b-ac-all]="$S/llama3-8b-ac-fp8-all.toml $S/llama3-8b-ac-bf16.toml 60 0.75 4.32"
  [1b]="$S/llama3.2-1b-fp8.toml $S/llama3.2-1b-bf16.toml 35 0.22 1.50"
  [1b-all]="$S/llama3.2-1b-fp8-all.toml $S/llama3.2-1b-bf16.toml 35 0.22 1.50"
  [3b]="$S/llama3.2-3b-fp8.toml $S/llama3.2-3b-bf16.toml 45 0.3 3.21"
  [3b-all]="$S/llama3.2-3b-fp8-all.toml $S/llama3.2-3b-bf16.toml 45 0.3 3.21"
  [slice]="$S/llama3-8b-slice-fp8.toml $S/llama3-8b-slice-bf16.toml 30 0.22 1.92"
  [1b-2026-11-24]="$S/llama3-1b-fp8.toml bf16 30 0.21 1.50"
)
START_S=25    # a run's start on the GPU machine: torchrun, imports, the model built on the meta device
PROFILE_S=15  # reading a profiled run's trace (rank 0, after its last step)
PROFILED_PCT=150  # a step under the profiler (record_shapes, CUDA activity), % of an unprofiled one: assumed, not measured
WARM_PCT=26   # a compile on a warm Inductor cache, % of a cold one: 2026-11-24, the slice's first step in its second run
              # took 6.2 s against 23.6 s in the first (FP8), 2.4 against 8.9 (bf16): the repeats after the first
for name in "${benches[@]}"; do
  [[ -n "${SPEC[$name]:-}" ]] || { echo "gpu_bench: unknown bench '$name'; known: ${!SPEC[*]}" >&2; exit 2; }
done
for part in "${parts[@]}"; do
  case $part in
    timing|reference) ;;
    profile) echo "gpu_bench: PARTS: the profile is the timing runs' last steps (PROFILE=1, PROFILE_STEPS), not a part of its own;" \
                  "fix: PARTS=\"timing reference\"" >&2; exit 2 ;;
    *) echo "gpu_bench: unknown part '$part' (timing reference)" >&2; exit 2 ;;
  esac
done
if [[ -n $fault && ( $fault != oom || $dry != 1 ) ]]; then
  echo "gpu_bench: GPU_BENCH_FAULT=$fault: only 'oom', and only in a dry run (GPU_DRY_RUN=1)" >&2; exit 2
fi
core="${benches[0]}"
read -r core_spec _ <<< "${SPEC[$core]}"
run_steps=$(( steps + (profile == 1 ? 1 + profile_steps : 0) ))  # the profiler's warm-up step, then the profiled ones

sets=()
if [[ $dry == 1 ]]; then
  sets=(--set "train.model=builtin:llama-debug?layers=1" --set train.seq_len=16 --set train.micro_batch_size=1
        --set launch.device=cpu --set compile.enabled=false --set distributed.procs_per_node=2
        --set precision.torchao.skip_small=false)
fi
add_sets() {  # add_sets WHAT ITEMS: each KEY=VALUE of ITEMS as a --set (split on spaces, never globbed: "?" is common)
  local item items
  read -r -a items <<< "$2"
  for item in "${items[@]}"; do
    [[ $item == *=* ]] \
      || { echo "gpu_bench: $1 item '$item' is not KEY=VALUE; fix: $1=\"train.model=builtin:llama3-8b?layers=12\"" >&2; exit 2; }
    sets+=(--set "$item")
  done
}
add_sets SETS "${SETS:-}"
base_sets=("${sets[@]}")
add_sets FALLBACK_SETS "$fallback_sets"  # checked now, used after a failure
sets=("${base_sets[@]}")

scale=100    # % applied to the estimates after the core's timing: its measured time over its estimate
clock=0      # plan mode: the seconds the parts planned so far would take
fallen=0     # 1 once the core's timing failed and the fallback's SETS are in
tag=""       # plan mode: "fallback " while the fallback is planned
core_steps=$run_steps  # the steps of the core's timing runs: the reference trains as many, on the same schedule
plan_parts=(); plan_skipped=()  # plan mode: "name<TAB>seconds" and the skipped, for PLAN_JSON
now() { if [[ $mode == plan ]]; then echo $(( plan_t0 + clock )); else date +%s; fi; }
plan_t0=$(date +%s)

fits() {  # fits SECONDS WHAT: true when there is no DEADLINE or SECONDS (scaled) fit before it; else say what is skipped
  local need=$(( $1 * scale / 100 ))
  [[ -z "${DEADLINE:-}" ]] && return 0
  local left=$(( DEADLINE - $(now) ))
  (( need <= left )) && return 0
  echo "gpu_bench: ${tag}skipped $2: it needs ~$need s and $left s are left before DEADLINE (run it in a call of its own: PARTS=... BENCHES=...)"
  plan_skipped+=("$2: needs ~$need s, $left s left")
  return 1
}

est() {  # est KIND NAME: estimated seconds on one H100; KIND timing | profile | reference | failed (a first run out of memory)
  local compile step params
  read -r _ _ compile step params <<< "${SPEC[$2]}"
  awk -v k="$1" -v r="$repeats" -v s="$steps" -v cs="$core_steps" -v p="$profile_steps" -v c="$compile" -v t="$step" \
      -v i="$(init_s "$2")" -v st="$START_S" -v ps="$PROFILE_S" -v pp="$PROFILED_PCT" -v w="$WARM_PCT" 'BEGIN {
    if (k == "timing") x = 2 * (r * (st + i + s * t) + c + (r - 1) * c * w / 100)
    else if (k == "profile") x = 2 * ((1 + p) * t * pp / 100 + ps)
    else if (k == "reference") x = 2 * (st + c + cs * t)
    else x = st + i + c + t
    printf "%d", x }'
}

declare -A init_cache=()
init_s() {  # init_s NAME: a rank's weight init in seconds, the plan's own figure for NAME's FP8 spec with SETS on launch.gpu
            # (`fp8launch plan --format json`'s init; launcher/planning/init_cost.py: drawn on the GPU, whole modules, then
            # sliced; derived, not yet measured on a GPU), at least 1 s; 5 where the planner cannot say
  local key="$1 ${sets[*]}"
  if [[ -z "${init_cache[$key]:-}" ]]; then
    local spec; read -r spec _ <<< "${SPEC[$1]}"
    init_cache[$key]=$(PYTHONWARNINGS=ignore "$py" - "$spec" "${sets[@]}" <<'PY' 2>/dev/null || echo 5
import sys
from launcher.commands.plan import plan_one, plan_record
spec, args = sys.argv[1], sys.argv[2:]
planned = plan_one(spec, "/tmp", [a for a, flag in zip(args[1:], args) if flag == "--set"])
init = plan_record(planned, [])["init"]
print(f"{max(1.0, init['seconds_per_rank'] if init else 5.0):.1f}")
PY
)
  fi
  echo "${init_cache[$key]}"
}

why() {  # why KIND NAME: the estimate's terms, for the log
  local compile step params
  read -r _ _ compile step params <<< "${SPEC[$2]}"
  case $1 in
    timing) local warm=""; (( repeats > 1 )) && warm=" + $(( repeats - 1 )) x warm compile $(( compile * WARM_PCT / 100 ))"
            echo "2 variants x ($repeats x (start $START_S + weight init $(init_s "$2") + $steps steps x $step s) + compile $compile$warm)" ;;
    profile) echo "2 runs x ((1 + $profile_steps) steps x $step s x $PROFILED_PCT% under the profiler + trace $PROFILE_S)" ;;
    reference) echo "a run: start $START_S + compile $compile + $core_steps steps x $step s; weights initialised on the GPU" ;;
  esac
}

say_cmd() {  # say_cmd PART SECONDS WHY WORDS...: the command, and in plan mode its estimate (the clock advances)
  local part="$1" secs="$2" terms="$3"; shift 3
  if [[ $mode == plan ]]; then
    echo "gpu_bench plan: $tag$part: ~$(( secs * scale / 100 )) s ($terms): $*"
    clock=$(( clock + secs * scale / 100 ))
    plan_parts+=("$part"$'\t'"$(( secs * scale / 100 ))")
  else
    echo "gpu_bench: $part: $*"
  fi
}

report() {
  [[ $mode == plan ]] && return 0
  local dirs=() args=()
  for name in "${benches[@]}"; do dirs+=("$out/$name"); args+=(--bench "$out/$name"); done
  "$py" benchmarks/compare_reference.py "${args[@]}" --reference "$out/reference" --torchtitan "$out/torchtitan" \
    --results "$results" --out "$out"
  local found=()
  for d in "${dirs[@]}"; do [[ -f "$d/bench.json" ]] && found+=("$d/bench.json"); done
  (( ${#found[@]} )) && "$py" benchmarks/summarize_bench.py "${found[@]}" --results "$results"
  return 0
}

out_of_memory() {  # out_of_memory DIR: the first line of DIR's runs' logs that says a GPU ran out of memory, if any
  grep -h -m 1 -E "CUDA out of memory|OutOfMemoryError" "$1"/*/train.log "$1.txt" 2>/dev/null | head -n 1
}

bench() {  # bench NAME: fp8launch bench of NAME's FP8 spec against its baseline, its last steps profiled where they fit;
           # returns the bench's exit code
  local name="$1" spec base dir="$out/$1" flags secs profiled=0
  read -r spec base _ <<< "${SPEC[$name]}"
  secs=$(est timing "$name")
  if [[ $profile == 1 ]]; then
    if fits "$(( secs + $(est profile "$name") ))" "profile $name (its timing runs' last $profile_steps steps; timing runs without)"; then
      profiled=1
    fi
  fi
  flags=(--steps "$(( profiled ? run_steps : steps ))" --warmup "$warmup" --repeats "$repeats")
  [[ $name == "$core" ]] && core_steps=${flags[1]}
  (( profiled )) && flags+=(--profile-last "$profile_steps")
  say_cmd "timing $name" "$secs" "$(why timing "$name")" fp8launch bench "$spec" --vs "$base" "${flags[@]}" --out "$dir" "${sets[@]}"
  if (( profiled )); then
    say_cmd "profile $name" "$(est profile "$name")" "$(why profile "$name")" "the timing runs' last $profile_steps steps" \
      "(--profile-last $profile_steps: the steps $(( steps + 2 ))..$run_steps, after the profiler's warm-up step $(( steps + 1 )))"
    secs=$(( secs + $(est profile "$name") ))
  fi
  [[ $mode == plan ]] && return 0
  local t0=$SECONDS rc
  if [[ $fault == oom && $name == "$core" && $fallen == 0 ]]; then
    echo "gpu_bench: GPU_BENCH_FAULT=oom: the run fails as one out of GPU memory does (nothing runs; its train.log says so)"
    mkdir -p "$dir/spec-1"
    echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB (GPU_BENCH_FAULT=oom)" | tee "$dir/spec-1/train.log"
    rc=1
  else
    fp8launch bench "$spec" --vs "$base" "${flags[@]}" --out "$dir" "${sets[@]}" 2>&1 | tee "$dir.txt"
    rc=${PIPESTATUS[0]}
  fi
  local took=$(( SECONDS - t0 ))
  echo "gpu_bench: timing$( (( profiled )) && echo " and profile") $name took $took s (estimated $secs s on one H100)"
  if (( rc != 0 )); then
    echo "gpu_bench: timing $name: fp8launch bench exited $rc; its runs' train.log:"; tail -n 30 "$dir"/*/train.log 2>/dev/null
  elif [[ $name == "$core" ]] && (( secs > 0 )); then
    scale=$(( took * 100 / secs )); (( scale < 50 )) && scale=50; (( scale > 300 )) && scale=300
    echo "gpu_bench: later estimates x $scale% (the core's timing took $took s of an estimated $secs s)"
  fi
  return "$rc"
}

run_reference() {  # the reference loop in bf16 and FP8 on the core spec's shape, batch, seed and schedule; a failed run
                   # ends the part
  local ref
  mapfile -t ref < <("$py" benchmarks/reference_args.py "$core_spec" --set "train.steps=$core_steps" "${sets[@]}")
  (( ${#ref[@]} > 1 )) || { echo "gpu_bench: reference: benchmarks/reference_args.py could not follow $core_spec"; return 0; }
  [[ $mode == plan ]] || mkdir -p "$out/reference"
  local half=$(( $(est reference "$core") / 2 ))
  for precision in bf16 fp8; do
    say_cmd "reference $precision" "$half" "$(why reference "$core")" torchrun --standalone \
      --nproc-per-node "${ref[0]}" benchmarks/reference_loop.py "${ref[@]:1}" --precision "$precision" --warmup "$warmup" \
      --out "$out/reference/$precision.json"
    [[ $mode == plan ]] && continue
    local t0=$SECONDS
    torchrun --standalone --nproc-per-node "${ref[0]}" benchmarks/reference_loop.py "${ref[@]:1}" --precision "$precision" \
      --warmup "$warmup" --out "$out/reference/$precision.json" > "$out/reference/$precision.log" 2>&1
    local rc=$?
    grep -E "^(reference loop|step|wrote)" "$out/reference/$precision.log"
    echo "gpu_bench: reference $precision took $(( SECONDS - t0 )) s (estimated $half s on one H100: $(why reference "$core"))"
    if (( rc != 0 )); then
      local oom; oom=$(grep -h -m 1 -E "CUDA out of memory|OutOfMemoryError" "$out/reference/$precision.log")
      echo "gpu_bench: reference $precision exited $rc${oom:+ (out of GPU memory)}; the reference part ends here:"
      tail -n 30 "$out/reference/$precision.log"
      return 0
    fi
  done
}

run_torchtitan() {  # torchtitan's own trainer on the core shape: not prepared yet; says why (docs/benchmarks.md)
  [[ $mode == plan ]] && return 0
  mkdir -p "$out/torchtitan"
  local why
  if [[ $torchtitan == 0 ]]; then
    why="TORCHTITAN=0"
  elif ! "$py" -c "import torchtitan.train" > "$out/torchtitan/import.log" 2>&1; then
    why="torchtitan is not installed here ($(tail -n 1 "$out/torchtitan/import.log")); benchmarks/torchtitan-wheels.sh downloads it"
    why+=" with its dependencies (156 MiB, mostly compiled wheels, carried in 3 parts)"
  else
    why="torchtitan $("$py" -c 'import importlib.metadata as m; print(m.version("torchtitan"))') is installed, but no job is prepared"
    why+=" for it: 0.3.0 configures jobs in Python (no TOML), has no tensorwise recipe, fuses wq/wk/wv, and trains from a"
    why+=" Hugging Face dataset and tokenizer files this machine does not have"
  fi
  echo "gpu_bench: torchtitan: skipped: $why"
  "$py" -c 'import json, sys; json.dump({"skipped": sys.argv[1]}, open(sys.argv[2], "w"))' "$why" "$out/torchtitan/result.json"
}

part() {  # part KIND NAME: one part where it fits (the core's first timing always runs); 1 when the core's timing failed
  local kind="$1" name="$2"
  case $kind in
    timing) if [[ $name == "$core" && $fallen == 0 ]] || fits "$(est timing "$name")" "timing $name"; then
              bench "$name" || [[ $name != "$core" ]] || return 1
            fi ;;
    reference) [[ $reference == 1 ]] && fits "$(est reference "$name")" "the reference loop on $name's shape" && run_reference ;;
  esac
  return 0
}

attempt() {  # the core's parts, then the other benches; 1 when the core's timing failed
  local kind name
  for kind in "${parts[@]}"; do
    part "$kind" "$core" || return 1
    [[ $kind == timing ]] && report > /dev/null  # the core's tables now: a later timeout leaves them written
  done
  for name in "${benches[@]:1}"; do part timing "$name"; done
  return 0
}

fall_back() {  # after the core's timing failed: its folder set aside, FALLBACK_SETS in, the clock at the failure
  local cause
  fallen=1
  sets=("${base_sets[@]}"); add_sets FALLBACK_SETS "$fallback_sets"
  if [[ $mode == plan ]]; then
    clock=$(est failed "$core"); scale=100; tag="fallback "; plan_parts=(); plan_skipped=()
    echo "gpu_bench plan: fallback: if the core's first run fails at its first step (~$clock s: start, weight init, compile," \
         "a step), its parts run again with --set ${fallback_sets// / --set } (at the core's estimates: an upper bound)"
    return 0
  fi
  cause=$(out_of_memory "$out/$core")
  rm -rf "$out/$core-failed" "$out/$core-failed.txt"
  mv "$out/$core" "$out/$core-failed" 2>/dev/null; mv "$out/$core.txt" "$out/$core-failed.txt" 2>/dev/null
  echo "gpu_bench: timing $core failed (${cause:-see $out/$core-failed/*/train.log}); its runs are in $out/$core-failed;" \
       "the fallback runs its parts now, in this call: --set ${fallback_sets// / --set }"
}

plan_json() {  # plan_json FILE KEY [FAILED_S]: the planned parts and the skipped as {"parts": [...], "skipped": [...]} under
              # KEY (and failed_s: the seconds a failed first run took before them)
  "$py" - "$1" "$2" "${3:-}" "${#plan_parts[@]}" "${plan_parts[@]}" "${plan_skipped[@]}" <<'EOP'
import json, os, sys
path, key, failed, n, rest = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
parts = [{"name": p.split("\t")[0], "seconds": int(p.split("\t")[1])} for p in rest[:n]]
doc = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
doc[key] = {"parts": parts, "skipped": rest[n:], **({"failed_s": int(failed)} if failed else {})}
json.dump(doc, open(path, "w"), indent=2)
EOP
}

[[ $mode == plan ]] || mkdir -p "$out"
if [[ $mode == report ]]; then report; exit 0; fi
[[ $dry == 1 || $mode == plan ]] || fp8launch doctor --spec "$core_spec"
if ! attempt; then
  if [[ -n $fallback_sets ]]; then
    fall_back
    attempt || echo "gpu_bench: the fallback's timing of $core failed too; the tables say what was measured"
  fi
fi
[[ $torchtitan != 0 ]] && run_torchtitan
if [[ $mode == plan ]]; then
  echo "gpu_bench plan: ~$clock s in all at these estimates${DEADLINE:+; DEADLINE leaves $(( DEADLINE - plan_t0 )) s}"
  [[ -n ${PLAN_JSON:-} ]] && plan_json "$PLAN_JSON" call
  if [[ -n $fallback_sets ]]; then  # what a failed core would leave the fallback
    fall_back
    attempt
    echo "gpu_bench plan: fallback: ~$clock s in all${DEADLINE:+; DEADLINE leaves $(( DEADLINE - plan_t0 )) s}"
    [[ -n ${PLAN_JSON:-} ]] && plan_json "$PLAN_JSON" fallback "$(est failed "$core")"
  fi
  exit 0
fi
report
