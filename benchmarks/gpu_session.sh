#!/usr/bin/env bash
# One offline GPU session: install fp8launch and its backends from a wheelhouse next to the machine's own
# CUDA torch, then run one stage, writing logs and results under OUT.
#
#   ../shared/tools/gpu-wheelhouse 3.12 .whl          # on a machine with a registry (python3 -V on the GPU machine)
#   bash benchmarks/gpu_session.sh .whl STAGE OUT       # on the GPU machine, from the repository root
#
# STAGE: matrix  the GPU support matrix (tests/gpu/test_support_matrix_gpu.py), the TE/MS-AMP, block-format and MoE tests
#        bench   benchmarks/gpu_bench.sh (FP8 vs bf16, the Llama-3-8B slice and the 1B model)
#        specs   the committed specs cut to one GPU (tests/gpu/test_specs_gpu.py)
set -uo pipefail
wheels="${1:?usage: gpu_session.sh WHEELHOUSE STAGE OUT}"; stage="${2:?stage}"; out="${3:?out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ! python3 -c "import torchao, deepspeed, jsonschema, launcher" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links "$wheels" torchao==0.18.0 deepspeed==0.19.8 jsonschema hjson pydantic \
    || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, torchao, deepspeed; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'torchao', torchao.__version__, 'deepspeed', deepspeed.__version__, 'capability', torch.cuda.get_device_capability())"
} 2>&1 | tee "$out/environment.txt"
case "$stage" in
  matrix)
    fp8launch doctor 2>&1 | tee "$out/doctor.txt"
    FP8LAUNCH_MATRIX_RESULTS="$out/support_matrix_gpu.json" timeout "${BUDGET:-500}" python3 -m pytest -m gpu -q -n "${WORKERS:-6}" \
      -p no:cacheprovider --junitxml "$out/matrix.xml" tests/gpu/test_support_matrix_gpu.py tests/gpu/test_te_gpu.py \
      tests/gpu/test_msamp_gpu.py tests/gpu/test_block_formats_gpu.py tests/gpu/test_moe_gpu.py 2>&1 | tail -60 | tee "$out/matrix.txt" ;;
  bench)
    STEPS="${STEPS:-40}" timeout "${BUDGET:-540}" bash benchmarks/gpu_bench.sh "$out/bench" 2>&1 | tee "$out/bench.txt" \
      || for f in "$out"/bench/*/*/train.log; do echo "== $f"; grep -v '^\s*$' "$f" | tail -30; done
    cp benchmarks/results/*-nvidia-* "$out/" 2>/dev/null ;;
  specs)
    timeout -s INT "${BUDGET:-540}" python3 -m pytest -m gpu -v -n "${WORKERS:-1}" -p no:cacheprovider --junitxml "$out/specs.xml" \
      tests/gpu/test_specs_gpu.py 2>&1 | tail -60 | tee "$out/specs.txt" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
