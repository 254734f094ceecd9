#!/usr/bin/env bash
# FP8 vs bf16 on one GPU, and fp8launch against a hand-written loop, in parts, each measured apart:
#   timing     `fp8launch bench SPEC --vs BASELINE`, unprofiled: the figures the speed targets are read from
#   reference  benchmarks/reference_loop.py in bf16 and FP8 on the core's shape, batch, seed and schedule, unprofiled
#   profile    a short separate `fp8launch bench SPEC --vs BASELINE --profile` of the same spec: where a step's time goes,
#              the FP8 GEMM FLOP share and the ceiling (its own runs are slowed by the profiler: no target reads them)
# then a line on torchtitan (not run: docs/benchmarks.md says why) and the tables: fp8launch against the reference with the
# targets (benchmarks/compare_reference.py) and FP8 vs bf16 per bench (benchmarks/summarize_bench.py). From the repository
# root with torch (CUDA), torchao and fp8launch installed (`gpu_session.sh WHEELS speed OUT` installs them and runs this):
#   bash benchmarks/gpu_bench.sh OUT             # the parts, then the tables
#   bash benchmarks/gpu_bench.sh OUT report      # the tables only, from what OUT holds (after a timeout)
#   bash benchmarks/gpu_bench.sh OUT plan        # each part's command and estimate, and what DEADLINE leaves out; runs nothing
# Writes OUT/<bench>/ (timing: bench.json, bench.png, <runs>/), OUT/<bench>-profile/ (bench.json, profile.json, profile.png,
# <runs>/), OUT/reference/{bf16,fp8}.{json,log}, OUT/torchtitan/result.json, and RESULTS/<date>-<device>-speed.{json,md} and
# RESULTS/<date>-<device>.{json,md}.
#
# Environment (the defaults fit one call on one H100; docs/benchmarks.md has the budget):
#   BENCHES     the benches, in order; the first is the core (the reference runs on its shape)       [8b-ac]
#               8b-ac 8b-ac-all 1b 1b-all 3b 3b-all (benchmarks/specs/), slice 1b-2026-11-24 (the first session's pair)
#   PARTS       the core's parts, in order [timing reference profile]; a later bench gets timing, then profile (PROFILE=1)
#   SETS        KEY=VALUE overrides, space-separated, for every run of every part, the reference too (planned through
#               reference_args.py): to shrink a spec that ran out of memory, e.g.
#               SETS="train.model=builtin:llama3-8b?layers=12 train.seq_len=4096"; in the dry run after its own
#   STEPS [10]  WARMUP [3] (left out of the medians)  REPEATS [1]: the timing runs and the reference
#   PROFILE [1] a profile part;  PROFILE_STEPS [5]: its runs' steps (2 warm-up, the second the profiler's own, then profiled)
#   REFERENCE [1]  TORCHTITAN  auto: say whether torchtitan is here and why it is not run; 0: not even that  [auto]
#   DEADLINE    epoch seconds: a part whose estimate does not fit before it is skipped, with the reason; the core's timing
#               always runs. After the core's timing every later estimate is scaled by its measured / estimated time [none]
#   RESULTS     where the two tables go                                                    [benchmarks/results]
#   GPU_DRY_RUN 1: the same commands on tiny CPU shapes (builtin:llama-debug?layers=1, seq 16, 2 processes, no compile,
#               torchao's size rule off), STEPS 4, WARMUP 2 and PROFILE_STEPS 4 by default: checks every script and option
#   PYTHON      the interpreter [python3]
set -uo pipefail
out="${1:?usage: gpu_bench.sh OUT [run|report|plan]}"; mode="${2:-run}"
case "$mode" in run|report|plan) ;; *) echo "gpu_bench: unknown mode '$mode' (run, report or plan)" >&2; exit 2 ;; esac
py="${PYTHON:-python3}"
dry="${GPU_DRY_RUN:-0}"
benches=(${BENCHES:-8b-ac})
parts=(${PARTS:-timing reference profile})
steps="${STEPS:-$([[ $dry == 1 ]] && echo 4 || echo 10)}"; warmup="${WARMUP:-$([[ $dry == 1 ]] && echo 2 || echo 3)}"
profile_steps="${PROFILE_STEPS:-$([[ $dry == 1 ]] && echo 4 || echo 5)}"
repeats="${REPEATS:-1}"; profile="${PROFILE:-1}"; reference="${REFERENCE:-1}"; torchtitan="${TORCHTITAN:-auto}"
results="${RESULTS:-benchmarks/results}"
S=benchmarks/specs

# name -> "FP8 spec, baseline (a twin spec or bf16), then the estimates on one H100: compile seconds on a cold cache,
# seconds per step, seconds of weight init" (docs/benchmarks.md). A step: the plan's prediction scaled by the 2026-11-24
# slice's measured / predicted 0.67. Weight init: every parameter drawn on a full-size CPU copy of its module on one
# thread, then moved (launcher/train/materialize.py): ~30-55 s for the 15-layer 8B shape's 4.32B parameters; the upper
# end, 12.7 s per billion parameters, for every shape.
declare -A SPEC=(
  [8b-ac]="$S/llama3-8b-ac-fp8.toml $S/llama3-8b-ac-bf16.toml 60 0.8 55"
  [8b-ac-all]="$S/llama3-8b-ac-fp8-all.toml $S/llama3-8b-ac-bf16.toml 60 0.75 55"
  [1b]="$S/llama3.2-1b-fp8.toml $S/llama3.2-1b-bf16.toml 35 0.22 19"
  [1b-all]="$S/llama3.2-1b-fp8-all.toml $S/llama3.2-1b-bf16.toml 35 0.22 19"
  [3b]="$S/llama3.2-3b-fp8.toml $S/llama3.2-3b-bf16.toml 45 0.3 41"
  [3b-all]="$S/llama3.2-3b-fp8-all.toml $S/llama3.2-3b-bf16.toml 45 0.3 41"
  [slice]="$S/llama3-8b-slice-fp8.toml $S/llama3-8b-slice-bf16.toml 30 0.22 24"
  [1b-2026-11-24]="$S/llama3-1b-fp8.toml bf16 30 0.21 19"
)
START_S=25    # a run's start on the GPU machine: torchrun, imports, the model built on the meta device
PROFILE_S=15  # reading a profiled run's trace
WARM_PCT=26   # a compile on a warm Inductor cache, % of a cold one: 2026-11-24, the slice's first step in its second run
              # took 6.2 s against 23.6 s in the first (FP8), 2.4 against 8.9 (bf16)
for name in "${benches[@]}"; do
  [[ -n "${SPEC[$name]:-}" ]] || { echo "gpu_bench: unknown bench '$name'; known: ${!SPEC[*]}" >&2; exit 2; }
done
for part in "${parts[@]}"; do
  [[ $part == timing || $part == reference || $part == profile ]] \
    || { echo "gpu_bench: unknown part '$part' (timing reference profile)" >&2; exit 2; }
done
core="${benches[0]}"
read -r core_spec _ <<< "${SPEC[$core]}"

sets=()
if [[ $dry == 1 ]]; then
  sets=(--set "train.model=builtin:llama-debug?layers=1" --set train.seq_len=16 --set train.micro_batch_size=1
        --set launch.device=cpu --set compile.enabled=false --set distributed.procs_per_node=2
        --set precision.torchao.skip_small=false)
fi
read -r -a items <<< "${SETS:-}"  # split on spaces, never globbed ("?" is common in a builtin model's options)
for item in "${items[@]}"; do
  [[ $item == *=* ]] \
    || { echo "gpu_bench: SETS item '$item' is not KEY=VALUE; fix: SETS=\"train.model=builtin:llama3-8b?layers=12\"" >&2; exit 2; }
  sets+=(--set "$item")
done

scale=100    # % applied to the estimates after the core's timing: its measured time over its estimate
clock=0      # plan mode: the seconds the parts planned so far would take
now() { if [[ $mode == plan ]]; then echo $(( plan_t0 + clock )); else date +%s; fi; }
plan_t0=$(date +%s)

fits() {  # fits SECONDS WHAT: true when there is no DEADLINE or SECONDS (scaled) fit before it; else say what is skipped
  local need=$(( $1 * scale / 100 ))
  [[ -z "${DEADLINE:-}" ]] && return 0
  local left=$(( DEADLINE - $(now) ))
  (( need <= left )) && return 0
  echo "gpu_bench: skipped $2: it needs ~$need s and $left s are left before DEADLINE (run it in a call of its own: PARTS=... BENCHES=...)"
  return 1
}

declare -A timed=()  # the benches whose timing part ran (or is planned) in this call: their graphs are in Inductor's cache
warm() { [[ -n "${timed[$1]:-}" ]] && echo "$WARM_PCT" || echo 100; }  # warm NAME: % of a cold compile the profile's runs take

est() {  # est KIND NAME: estimated seconds on one H100; KIND timing | reference | profile
  local compile step init
  read -r _ _ compile step init <<< "${SPEC[$2]}"
  case $1 in
    timing) awk -v r="$repeats" -v s="$steps" -v c="$compile" -v t="$step" -v i="$init" -v st="$START_S" \
              'BEGIN { printf "%d", r * 2 * (st + i + c + s * t) }' ;;
    reference) awk -v s="$steps" -v c="$compile" -v t="$step" -v st="$START_S" 'BEGIN { printf "%d", 2 * (st + c + s * t) }' ;;
    profile) awk -v s="$profile_steps" -v c="$compile" -v t="$step" -v i="$init" -v st="$START_S" -v p="$PROFILE_S" -v w="$(warm "$2")" \
               'BEGIN { printf "%d", 2 * (st + i + c * w / 100 + s * t + p) }' ;;
  esac
}

why() {  # why KIND NAME: the estimate's terms, for the log
  local compile step init
  read -r _ _ compile step init <<< "${SPEC[$2]}"
  case $1 in
    timing) echo "$repeats x 2 runs x (start $START_S + weight init $init + compile $compile + $steps steps x $step s)" ;;
    reference) echo "a run: start $START_S + compile $compile + $steps steps x $step s; weights initialised on the GPU" ;;
    profile) local what="compile"; [[ -n "${timed[$2]:-}" ]] && what="warm compile"
             echo "2 runs x (start $START_S + weight init $init + $what $(( compile * $(warm "$2") / 100 ))" \
                  "+ $profile_steps steps x $step s + trace $PROFILE_S)" ;;
  esac
}

say_cmd() {  # say_cmd PART SECONDS WHY WORDS...: the command, and in plan mode its estimate (the clock advances)
  local part="$1" secs="$2" terms="$3"; shift 3
  if [[ $mode == plan ]]; then
    echo "gpu_bench plan: $part: ~$(( secs * scale / 100 )) s ($terms): $*"
    clock=$(( clock + secs * scale / 100 ))
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

bench() {  # bench KIND NAME: fp8launch bench of NAME's FP8 spec against its baseline, unprofiled (timing) or profiled
  local kind="$1" name="$2" spec base dir flags
  read -r spec base _ <<< "${SPEC[$name]}"
  if [[ $kind == timing ]]; then
    dir="$out/$name"; flags=(--steps "$steps" --warmup "$warmup" --repeats "$repeats")
  else
    dir="$out/$name-profile"; flags=(--steps "$profile_steps" --warmup 2 --repeats 1 --profile)
  fi
  local secs; secs=$(est "$kind" "$name")
  say_cmd "$kind $name" "$secs" "$(why "$kind" "$name")" fp8launch bench "$spec" --vs "$base" "${flags[@]}" --out "$dir" "${sets[@]}"
  [[ $kind == timing ]] && timed[$name]=1
  [[ $mode == plan ]] && return 0
  local t0=$SECONDS
  fp8launch bench "$spec" --vs "$base" "${flags[@]}" --out "$dir" "${sets[@]}" 2>&1 | tee "$dir.txt"
  local rc=${PIPESTATUS[0]} took=$(( SECONDS - t0 ))
  echo "gpu_bench: $kind $name took $took s (estimated $secs s on one H100: $(why "$kind" "$name"))"
  if (( rc != 0 )); then
    echo "gpu_bench: $kind $name: fp8launch bench exited $rc; its runs' train.log:"; tail -n 30 "$dir"/*/train.log 2>/dev/null
  fi
  if [[ $kind == timing && $name == "$core" ]] && (( secs > 0 )); then
    scale=$(( took * 100 / secs )); (( scale < 50 )) && scale=50; (( scale > 300 )) && scale=300
    echo "gpu_bench: later estimates x $scale% (the core's timing took $took s of an estimated $secs s)"
  fi
  return 0
}

run_reference() {  # the reference loop in bf16 and FP8 on the core spec's shape, batch, seed and schedule
  local ref
  mapfile -t ref < <("$py" benchmarks/reference_args.py "$core_spec" --set "train.steps=$steps" "${sets[@]}")
  (( ${#ref[@]} > 1 )) || { echo "gpu_bench: reference: benchmarks/reference_args.py could not follow $core_spec"; return 0; }
  [[ $mode == plan ]] || mkdir -p "$out/reference"
  local half=$(( $(est reference "$core") / 2 ))
  for precision in bf16 fp8; do
    say_cmd "reference $precision" "$half" "$(why reference "$core")" torchrun --standalone --nproc-per-node "${ref[0]}" \
      benchmarks/reference_loop.py "${ref[@]:1}" --precision "$precision" --warmup "$warmup" --out "$out/reference/$precision.json"
    [[ $mode == plan ]] && continue
    local t0=$SECONDS
    torchrun --standalone --nproc-per-node "${ref[0]}" benchmarks/reference_loop.py "${ref[@]:1}" --precision "$precision" \
      --warmup "$warmup" --out "$out/reference/$precision.json" > "$out/reference/$precision.log" 2>&1
    local rc=$?
    grep -E "^(reference loop|step|wrote)" "$out/reference/$precision.log"
    echo "gpu_bench: reference $precision took $(( SECONDS - t0 )) s (estimated $half s on one H100: $(why reference "$core"))"
    (( rc == 0 )) || { echo "gpu_bench: reference $precision exited $rc:"; tail -n 30 "$out/reference/$precision.log"; }
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

part() {  # part KIND NAME: one part, where it fits (the core's timing always runs)
  local kind="$1" name="$2"
  case $kind in
    timing) if [[ $name == "$core" ]] || fits "$(est timing "$name")" "timing $name"; then bench timing "$name"; fi ;;
    reference) [[ $reference == 1 ]] && fits "$(est reference "$name")" "the reference loop on $name's shape" && run_reference ;;
    profile) [[ $profile == 1 ]] && fits "$(est profile "$name")" "profile $name" && bench profile "$name" ;;
  esac
  return 0
}

[[ $mode == plan ]] || mkdir -p "$out"
if [[ $mode == report ]]; then report; exit 0; fi
[[ $dry == 1 || $mode == plan ]] || fp8launch doctor --spec "$core_spec"
for kind in "${parts[@]}"; do
  part "$kind" "$core"
  [[ $kind == timing ]] && report > /dev/null  # the core's tables now: a later timeout leaves them written
done
for name in "${benches[@]:1}"; do
  part timing "$name"
  part profile "$name"
done
[[ $torchtitan != 0 ]] && run_torchtitan
if [[ $mode == plan ]]; then
  echo "gpu_bench plan: ~$clock s in all at these estimates${DEADLINE:+; DEADLINE leaves $(( DEADLINE - plan_t0 )) s}"
  exit 0
fi
report
