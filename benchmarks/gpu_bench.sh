#!/usr/bin/env bash
# FP8 vs bf16 on one GPU: `fp8launch bench SPEC --vs BF16_TWIN --profile` for the representative specs, the
# hand-written reference loop (benchmarks/reference_loop.py) in bf16 and FP8 on the core spec's shape, a line on
# torchtitan (not run: docs/benchmarks.md says why), then the tables: fp8launch against the reference with the targets
# (benchmarks/compare_reference.py) and FP8 vs bf16 per spec (benchmarks/summarize_bench.py). Run from the repository
# root with torch (CUDA), torchao and fp8launch installed (`gpu_session.sh WHEELS speed OUT` installs them and runs this):
#   bash benchmarks/gpu_bench.sh OUT             # the benches, the reference, the tables
#   bash benchmarks/gpu_bench.sh OUT report      # the tables only, from what OUT holds (after a timeout)
# Writes OUT/<bench>/{bench.json,bench.png,profile.json,profile.png,<runs>/}, OUT/reference/{bf16,fp8}.{json,log},
# OUT/torchtitan/result.json, and RESULTS/<date>-<device>-speed.{json,md} and RESULTS/<date>-<device>.{json,md}.
#
# Environment (the defaults fit the speed stage's ten minutes on one H100; docs/benchmarks.md has the budget):
#   BENCHES     the benches, in order; the first is the core (the reference runs on its shape)       [8b-ac]
#               8b-ac 8b-ac-all 1b 1b-all 3b 3b-all (benchmarks/specs/), slice 1b-2026-11-24 (the first session's pair)
#   STEPS [10]  WARMUP [3] (left out of the medians; --profile needs >= 2)  REPEATS [1]  PROFILE [1]  REFERENCE [1]
#   TORCHTITAN  auto: say whether torchtitan is here and why it is not run (no job is prepared: docs/benchmarks.md);
#               0: not even that                                                                       [auto]
#   DEADLINE    epoch seconds: a later bench whose estimate does not fit before it is skipped, with the
#               reason; the core bench and the reference always run                                   [none]
#   RESULTS     where the two tables go                                                    [benchmarks/results]
#   GPU_DRY_RUN 1: the same commands on tiny CPU shapes (builtin:llama-debug?layers=2, seq 64, 2 processes, no
#               compile, torchao's size rule off), STEPS 4 and WARMUP 2 by default: checks every script and option
#   PYTHON      the interpreter [python3]
set -uo pipefail
out="${1:?usage: gpu_bench.sh OUT [report]}"; mode="${2:-run}"
py="${PYTHON:-python3}"
dry="${GPU_DRY_RUN:-0}"
benches=(${BENCHES:-8b-ac})
steps="${STEPS:-$([[ $dry == 1 ]] && echo 4 || echo 10)}"; warmup="${WARMUP:-$([[ $dry == 1 ]] && echo 2 || echo 3)}"
repeats="${REPEATS:-1}"; profile="${PROFILE:-1}"; reference="${REFERENCE:-1}"; torchtitan="${TORCHTITAN:-auto}"
results="${RESULTS:-benchmarks/results}"
S=benchmarks/specs

# name -> "FP8 spec, baseline (a twin spec or bf16), compile seconds and seconds per step on one H100" (the estimates:
# docs/benchmarks.md; compile on a cold cache, a step from the plan's prediction scaled by the 2026-11-24 slice's
# measured / predicted 0.67)
declare -A SPEC=(
  [8b-ac]="$S/llama3-8b-ac-fp8.toml $S/llama3-8b-ac-bf16.toml 60 0.8"
  [8b-ac-all]="$S/llama3-8b-ac-fp8-all.toml $S/llama3-8b-ac-bf16.toml 60 0.75"
  [1b]="$S/llama3.2-1b-fp8.toml $S/llama3.2-1b-bf16.toml 35 0.22"
  [1b-all]="$S/llama3.2-1b-fp8-all.toml $S/llama3.2-1b-bf16.toml 35 0.22"
  [3b]="$S/llama3.2-3b-fp8.toml $S/llama3.2-3b-bf16.toml 45 0.3"
  [3b-all]="$S/llama3.2-3b-fp8-all.toml $S/llama3.2-3b-bf16.toml 45 0.3"
  [slice]="$S/llama3-8b-slice-fp8.toml $S/llama3-8b-slice-bf16.toml 30 0.22"
  [1b-2026-11-24]="$S/llama3-1b-fp8.toml bf16 30 0.21"
)
START_S=25   # a run's start on the GPU machine: torchrun, imports, the model built and initialised
PROFILE_S=15 # reading a profiled run's trace
for name in "${benches[@]}"; do
  [[ -n "${SPEC[$name]:-}" ]] || { echo "gpu_bench: unknown bench '$name'; known: ${!SPEC[*]}" >&2; exit 2; }
done
core="${benches[0]}"
read -r core_spec _ <<< "${SPEC[$core]}"

sets=()
if [[ $dry == 1 ]]; then
  sets=(--set "train.model=builtin:llama-debug?layers=2" --set train.seq_len=64 --set train.micro_batch_size=1
        --set launch.device=cpu --set compile.enabled=false --set distributed.procs_per_node=2
        --set precision.torchao.skip_small=false)
fi

fits() {  # fits SECONDS WHAT: true when there is no DEADLINE or SECONDS fit before it; else say what is skipped
  [[ -z "${DEADLINE:-}" ]] && return 0
  local left=$(( DEADLINE - $(date +%s) ))
  (( $1 <= left )) && return 0
  echo "gpu_bench: skipped $2: it needs ~$1 s and $left s are left before DEADLINE (run it alone: BENCHES=... or raise BUDGET)"
  return 1
}

report() {
  local dirs=() args=()
  for name in "${benches[@]}"; do dirs+=("$out/$name"); args+=(--bench "$out/$name"); done
  "$py" benchmarks/compare_reference.py "${args[@]}" --reference "$out/reference" --torchtitan "$out/torchtitan" \
    --results "$results" --out "$out"
  local found=()
  for d in "${dirs[@]}"; do [[ -f "$d/bench.json" ]] && found+=("$d/bench.json"); done
  (( ${#found[@]} )) && "$py" benchmarks/summarize_bench.py "${found[@]}" --results "$results"
  return 0
}

bench() {  # bench NAME: fp8launch bench of its FP8 spec against its baseline
  local name="$1" spec base compile step
  read -r spec base compile step <<< "${SPEC[$name]}"
  local flags=(--steps "$steps" --warmup "$warmup" --repeats "$repeats" --out "$out/$name")
  [[ $profile == 1 ]] && flags+=(--profile)
  echo "gpu_bench: $name: fp8launch bench $spec --vs $base ${flags[*]} ${sets[*]}"
  local t0=$SECONDS
  fp8launch bench "$spec" --vs "$base" "${flags[@]}" "${sets[@]}" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "gpu_bench: $name took $(( SECONDS - t0 )) s (estimated $(cost "$name") s on one H100)"
  (( rc == 0 )) || { echo "gpu_bench: $name: fp8launch bench exited $rc; its runs' train.log:"; tail -n 30 "$out/$name"/*/train.log 2>/dev/null; }
  return 0
}

run_reference() {  # the reference loop in bf16 and FP8 on the core spec's shape, batch, seed and schedule
  local ref
  mapfile -t ref < <("$py" benchmarks/reference_args.py "$core_spec" --set "train.steps=$steps" "${sets[@]}")
  (( ${#ref[@]} > 1 )) || { echo "gpu_bench: reference: benchmarks/reference_args.py could not follow $core_spec"; return 0; }
  mkdir -p "$out/reference"
  for precision in bf16 fp8; do
    echo "gpu_bench: reference $precision: torchrun --standalone --nproc-per-node ${ref[0]} benchmarks/reference_loop.py ${ref[*]:1} --precision $precision --warmup $warmup"
    local t0=$SECONDS
    torchrun --standalone --nproc-per-node "${ref[0]}" benchmarks/reference_loop.py "${ref[@]:1}" --precision "$precision" \
      --warmup "$warmup" --out "$out/reference/$precision.json" > "$out/reference/$precision.log" 2>&1
    local rc=$?
    grep -E "^(reference loop|step|wrote)" "$out/reference/$precision.log"
    echo "gpu_bench: reference $precision took $(( SECONDS - t0 )) s"
    (( rc == 0 )) || { echo "gpu_bench: reference $precision exited $rc:"; tail -n 30 "$out/reference/$precision.log"; }
  done
}

run_torchtitan() {  # torchtitan's own trainer on the core shape: not prepared yet; says why (docs/benchmarks.md)
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

cost() {  # cost NAME: estimated seconds of a bench on one H100 (all its runs)
  local compile step
  read -r _ _ compile step <<< "${SPEC[$1]}"
  awk -v r="$repeats" -v s="$steps" -v c="$compile" -v t="$step" -v st="$START_S" -v p="$([[ $profile == 1 ]] && echo "$PROFILE_S" || echo 0)" \
    'BEGIN { printf "%d", r * 2 * (st + c + s * t + p) }'
}

mkdir -p "$out"
if [[ $mode == report ]]; then report; exit 0; fi
[[ $dry == 1 ]] || fp8launch doctor --spec "$core_spec"
bench "$core"
[[ $reference == 1 ]] && run_reference
report > /dev/null  # the core's tables now: a later timeout leaves them written
for name in "${benches[@]:1}"; do
  fits "$(cost "$name")" "bench $name" && bench "$name"
done
[[ $torchtitan != 0 ]] && run_torchtitan
report
