#!/usr/bin/env bash
# Install Transformer Engine 2.20.2 on the offline GPU machine from the parts `gpu-wheelhouse te` wrote, and build
# its torch binding in the background (benchmarks/gpu_session.sh's `te` stage runs this, then waits for the build).
#
#   ../shared/tools/gpu-wheelhouse te 3.12 .te        # on a machine with a registry: part-00.., te-core.sha256, deps/
#   bash benchmarks/te_install.sh .te LOGDIR           # on the GPU machine, once every part has arrived
#
# Steps, each stopping with one line that says what is wrong:
#   1. the parts folder holds te-core.sha256, part-* and deps/ (the binding's sdist among them)     exit 2
#   2. the core wheel reassembled from the parts (in name order) matches te-core.sha256            exit 4
#   3. nvcc and the CUDA headers are here: transformer_engine_torch compiles C++/CUDA against the
#      machine's torch (`which nvcc`, CUDA_HOME, /usr/local/cuda)                                    exit 3
#   4. pip installs deps/*.whl and the core wheel (no index, no dependencies resolved)              exit 5
#   5. the binding builds in the background: NVTE_PYTORCH_FORCE_BUILD=TRUE (else its setup tries to
#      download a prebuilt one), log LOGDIR/te-build.log, exit code LOGDIR/te-build.rc, pid LOGDIR/te-build.pid
# PIP (default "python3 -m pip") is the pip to run; CUDA_ROOTS (default "/usr/local/cuda") where to look for CUDA.
set -uo pipefail
parts="${1:?usage: te_install.sh PARTS_DIR LOG_DIR}"; logs="${2:?usage: te_install.sh PARTS_DIR LOG_DIR}"
pip_cmd=(${PIP:-python3 -m pip})
mkdir -p "$logs"
say() { echo "te_install: $*" >&2; }

# 1. what arrived
missing=()
[[ -f "$parts/te-core.sha256" ]] || missing+=("te-core.sha256")
compgen -G "$parts/part-*" >/dev/null || missing+=("part-* (the core wheel in 50 MiB parts)")
compgen -G "$parts/deps/transformer_engine_torch-*.tar.gz" >/dev/null || missing+=("deps/transformer_engine_torch-*.tar.gz (the binding's sdist)")
if (( ${#missing[@]} )); then
  say "$parts lacks ${missing[*]}; fix: bring every file \`gpu-wheelhouse te PYVER $parts\` wrote (one part per transfer)"
  exit 2
fi

# 2. reassemble and check
core=$(awk '{print $2}' "$parts/te-core.sha256" | sed 's/^\*//')
if [[ -z "$core" || "$core" == */* ]]; then
  say "$parts/te-core.sha256 names no wheel file ('$core'); fix: bring the te-core.sha256 gpu-wheelhouse wrote"
  exit 2
fi
(cd "$parts" && cat $(ls part-* | sort) > "$core")
if ! (cd "$parts" && sha256sum --quiet -c te-core.sha256) >/dev/null 2>&1; then
  got=$(cd "$parts" && sha256sum "$core" | awk '{print $1}')
  want=$(awk '{print $1}' "$parts/te-core.sha256")
  rm -f "$parts/$core"
  say "checksum mismatch: the parts reassemble to sha256 $got, te-core.sha256 says $want ($(ls "$parts" | grep -c '^part-') parts); fix: a part is missing, truncated or from another download: send the parts again"
  exit 4
fi
say "reassembled $core ($(du -h "$parts/$core" | cut -f1)), sha256 ok"

# 3. the toolchain the binding compiles with
nvcc=$(command -v nvcc || true)
cuda_home="${CUDA_HOME:-}"
if [[ -z "$nvcc" && -n "$cuda_home" && -x "$cuda_home/bin/nvcc" ]]; then nvcc="$cuda_home/bin/nvcc"; fi
for root in ${CUDA_ROOTS:-/usr/local/cuda}; do
  if [[ -z "$nvcc" && -x "$root/bin/nvcc" ]]; then nvcc="$root/bin/nvcc"; cuda_home="$root"; fi
done
[[ -z "$cuda_home" && -n "$nvcc" ]] && cuda_home=$(dirname "$(dirname "$nvcc")")
if [[ -z "$nvcc" ]]; then
  say "no nvcc: \`which nvcc\` finds none, CUDA_HOME is ${CUDA_HOME:-unset}, none of ${CUDA_ROOTS:-/usr/local/cuda} has bin/nvcc;" \
      "transformer_engine_torch (an sdist of C++/CUDA sources) cannot be built here; fix: install the CUDA toolkit" \
      "(nvcc and headers) matching torch's CUDA $(python3 -c 'import torch; print(torch.version.cuda)' 2>/dev/null || echo '?')" \
      "and set CUDA_HOME, or bring a transformer_engine_torch wheel built for this torch"
  exit 3
fi
if [[ ! -f "$cuda_home/include/cuda_runtime.h" ]]; then
  say "nvcc is $nvcc but $cuda_home/include/cuda_runtime.h is missing (CUDA headers); fix: install the CUDA toolkit's headers or set CUDA_HOME to the toolkit"
  exit 3
fi
say "nvcc $nvcc, CUDA_HOME $cuda_home"

# 4. the Python parts
if ! "${pip_cmd[@]}" install -q --no-index --no-deps "$parts"/deps/*.whl "$parts/$core" >"$logs/te-pip.log" 2>&1; then
  say "pip could not install the wheels (see $logs/te-pip.log): $(tail -1 "$logs/te-pip.log")"
  exit 5
fi

# 5. the binding, in the background
rm -f "$logs/te-build.rc"
( export CUDA_HOME="$cuda_home" NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-16}"
  "${pip_cmd[@]}" install --no-index --no-deps --no-build-isolation -v "$parts"/deps/transformer_engine_torch-*.tar.gz \
    >"$logs/te-build.log" 2>&1
  echo $? >"$logs/te-build.rc" ) &
echo $! >"$logs/te-build.pid"
say "building transformer_engine_torch in the background (pid $(cat "$logs/te-build.pid"), log $logs/te-build.log)"
