#!/usr/bin/env bash
# One offline GPU session: install fp8launch and its backends from a wheelhouse next to the machine's own
# CUDA torch, then run one stage, writing logs and results under OUT.
#
#   ../shared/tools/gpu-wheelhouse 3.12 .whl          # on a machine with a registry (python3 -V on the GPU machine)
#   bash benchmarks/gpu_session.sh .whl STAGE OUT       # on the GPU machine, from the repository root
#
# STAGE: matrix  the GPU support matrix (tests/gpu/test_support_matrix_gpu.py), the TE/MS-AMP, block-format and MoE tests
#        bench   benchmarks/gpu_bench.sh on the first session's pair (the Llama-3-8B slice and llama3-1b-fp8.toml,
#                2 x 40 steps each, no profile, no reference)
#        speed   benchmarks/gpu_bench.sh's representative benches in ten minutes: the core (the 15-layer Llama-3-8B
#                shape with full AC, FP8 vs bf16, --profile) first, the reference loop in bf16 and FP8 on that shape,
#                the comparison table with the targets, then what BENCHES adds while BUDGET (560 s) lasts
#                (docs/benchmarks.md). GPU_DRY_RUN=1 runs it here on tiny CPU shapes, with no install and no GPU:
#                  GPU_DRY_RUN=1 bash benchmarks/gpu_session.sh NONE speed OUT      (~1.5 minutes on 2 cores)
#        specs   the committed specs cut to one GPU (tests/gpu/test_specs_gpu.py)
#        te      Transformer Engine from its parts (TE_PARTS, default WHEELHOUSE/te: what `gpu-wheelhouse te 3.12 DIR` wrote,
#                brought one part per transfer): benchmarks/te_install.sh reassembles the core wheel (sha256 checked),
#                checks nvcc / CUDA_HOME, installs, builds the torch binding in the background; this stage waits for it
#                (BUDGET seconds, default 540: run it again to keep waiting) and runs tests/gpu's TE cases
set -uo pipefail
wheels="${1:?usage: gpu_session.sh WHEELHOUSE STAGE OUT}"; stage="${2:?stage}"; out="${3:?out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [[ "${GPU_DRY_RUN:-0}" == 1 ]]; then
  [[ $stage == speed ]] || { echo "GPU_DRY_RUN covers the speed stage only" >&2; exit 2; }
  python3 -c "import sys, torch, torchao; print('GPU_DRY_RUN: no GPU, nothing installed; python', sys.version.split()[0], 'torch', torch.__version__, 'torchao', torchao.__version__)" \
    2>/dev/null | tee "$out/environment.txt"
else
  if ! python3 -c "import torchao, deepspeed, jsonschema, launcher" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "$wheels" torchao==0.18.0 deepspeed==0.19.8 jsonschema hjson pydantic \
      || exit 1
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
  fi
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import sys, torch, torchao, deepspeed; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'torchao', torchao.__version__, 'deepspeed', deepspeed.__version__, 'capability', torch.cuda.get_device_capability())"
  } 2>&1 | tee "$out/environment.txt"
fi
case "$stage" in
  matrix)
    fp8launch doctor 2>&1 | tee "$out/doctor.txt"
    FP8LAUNCH_MATRIX_RESULTS="$out/support_matrix_gpu.json" timeout "${BUDGET:-500}" python3 -m pytest -m gpu -q -n "${WORKERS:-6}" \
      -p no:cacheprovider --junitxml "$out/matrix.xml" tests/gpu/test_support_matrix_gpu.py tests/gpu/test_te_gpu.py \
      tests/gpu/test_msamp_gpu.py tests/gpu/test_block_formats_gpu.py tests/gpu/test_moe_gpu.py 2>&1 | tail -60 | tee "$out/matrix.txt" ;;
  bench)
    BENCHES="${BENCHES:-slice 1b-2026-11-24}" STEPS="${STEPS:-40}" WARMUP="${WARMUP:-5}" REPEATS="${REPEATS:-2}" PROFILE="${PROFILE:-0}" \
      REFERENCE="${REFERENCE:-0}" TORCHTITAN=0 timeout "${BUDGET:-540}" bash benchmarks/gpu_bench.sh "$out/bench" 2>&1 | tee "$out/bench.txt" \
      || for f in "$out"/bench/*/*/train.log; do echo "== $f"; grep -v '^\s*$' "$f" | tail -30; done
    cp benchmarks/results/*-nvidia-* "$out/" 2>/dev/null ;;
  speed)
    # The whole stage, install included, within BUDGET; a bench after the core is skipped when its estimate does not
    # fit (gpu_bench.sh DEADLINE), and a timeout still leaves the tables of what finished (the report pass).
    if [[ "${GPU_DRY_RUN:-0}" == 1 ]]; then results="$out"; else results="${RESULTS:-benchmarks/results}"; fi
    left=$(( ${BUDGET:-560} - SECONDS ))
    DEADLINE=$(( $(date +%s) + left - 30 )) RESULTS="$results" timeout "$left" bash benchmarks/gpu_bench.sh "$out/speed" 2>&1 \
      | tee "$out/speed.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || RESULTS="$results" bash benchmarks/gpu_bench.sh "$out/speed" report 2>&1 | tee -a "$out/speed.txt"
    [[ "$results" == "$out" ]] || cp "$results"/"$(date +%F)"-* "$out/" 2>/dev/null
    compgen -G "$out/speed/*-speed.md" > /dev/null || { echo "speed: no comparison table was written" >&2; exit 1; } ;;
  specs)
    timeout -s INT "${BUDGET:-540}" python3 -m pytest -m gpu -v -n "${WORKERS:-1}" -p no:cacheprovider --junitxml "$out/specs.xml" \
      tests/gpu/test_specs_gpu.py 2>&1 | tail -60 | tee "$out/specs.txt" ;;
  te)
    parts="${TE_PARTS:-$wheels/te}"
    deadline=$(( $(date +%s) + ${BUDGET:-540} ))
    if ! python3 -c "import transformer_engine.pytorch" 2>/dev/null; then
      pid=$(cat "$out/te-build.pid" 2>/dev/null)
      if [[ -z "$pid" || ! -d "/proc/$pid" ]] && [[ ! -f "$out/te-build.rc" ]]; then
        bash benchmarks/te_install.sh "$parts" "$out" 2>&1 | tee "$out/te-install.txt"
        rc=${PIPESTATUS[0]}; (( rc == 0 )) || exit "$rc"
      fi
      while [[ ! -f "$out/te-build.rc" ]] && (( $(date +%s) < deadline )); do
        sleep 15; echo "te: building transformer_engine_torch ... $(grep -c 'Compiling\|\.cu\b\|\.cpp\b' "$out/te-build.log" 2>/dev/null) lines of compiler output"
      done
      if [[ ! -f "$out/te-build.rc" ]]; then
        echo "te: the binding is still building (log $out/te-build.log); run the te stage again to keep waiting" >&2; exit 75
      fi
      if [[ "$(cat "$out/te-build.rc")" != 0 ]]; then
        echo "te: building transformer_engine_torch failed (exit $(cat "$out/te-build.rc")):" >&2; tail -30 "$out/te-build.log" >&2; exit 3
      fi
    fi
    python3 -c "import transformer_engine, transformer_engine.pytorch as te; print('transformer_engine', transformer_engine.__version__)" \
      2>&1 | tee -a "$out/environment.txt"
    timeout "$(( deadline > $(date +%s) + 60 ? deadline - $(date +%s) : 60 ))" python3 -m pytest -m gpu -v -p no:cacheprovider \
      --junitxml "$out/te.xml" tests/gpu/test_te_conformance.py tests/gpu/test_te_gpu.py tests/gpu/test_fp8_ran_conformance.py \
      2>&1 | tail -80 | tee "$out/te.txt" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
