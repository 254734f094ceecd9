#!/usr/bin/env bash
# Transformer Engine 2.20.2 on the offline GPU machine, one device call at a time: its core wheel (~276 MB) comes in
# 50 MiB parts, one a call (a call carries at most 64 MiB), the torch binding then builds for 2-6 minutes in a process
# that outlives the call, and each call does the next thing that can be done. docs/benchmarks.md ("Transformer Engine,
# call by call") has the calls; benchmarks/gpu_session.sh's `te` stage runs `next` in each, then tests/gpu's TE cases.
#
#   ../shared/tools/gpu-wheelhouse te 3.12 .te       # on a machine with a registry: part-00.., te-core.sha256, deps/
#   bash benchmarks/te_install.sh complete .te       # there too, where gpu-wheelhouse stopped at the binding's sdist (below)
#   bash benchmarks/te_install.sh prepare .te        # there too: parts.sha256 (each part checked as it arrives) and
#                                                    # the calls, with what each carries (at most 64 MiB with the tree)
#
# `complete` finishes a folder `gpu-wheelhouse te` left half-made: its `pip download` of the binding's sdist builds the
# sdist's metadata, which needs a CUDA torch where the wheelhouse is made, and the tool stops there. Without building
# anything: the core wheel (already downloaded) summed into te-core.sha256 and split into 50 MiB parts; TE's own wheel
# and the needs the GPU image lacks (NEEDS) downloaded as wheels (pip download --only-binary: no metadata is built);
# the sdist fetched as a file from the index's simple API (PEP 691 JSON or PEP 503 HTML; TE_INDEX, default
# $PIP_INDEX_URL or https://pypi.org/simple) and checked against the sha256 the index gives. Its metadata is built on
# the GPU machine, when `next` builds the binding. Each step is skipped where its files are there already.
#   bash benchmarks/te_install.sh next .te STATE     # on the GPU machine, every call (STATE outside OUT: OUT is emptied
#                                                    # before each call; default .te-state, git-ignored, kept while warm)
#
# `next`, in order, each stopping with one line that says what is wrong or what comes next:
#   1. the headers the binding includes: nccl.h, cudnn.h, cublasLt.h, cuda_runtime.h, in $CUDA_HOME/include or the
#      image's nvidia pip packages (nvidia/*/include), and nvcc (TE's build asks it for the CUDA version)     exit 3
#   2. a build already started: wait for it (below)
#   3. deps/ (the binding's sdist among them) and te-core.sha256 are here                                     exit 2
#      each part that arrived matches parts.sha256 (without it: step 4 tells)                                 exit 4
#      parts still missing: say which to carry next                                                           exit 75
#   4. the core wheel reassembled from the parts (in name order) matches te-core.sha256                       exit 4
#   5. pip installs TE's own wheels, the core wheel and, of deps/'s other wheels, only those the machine lacks: the
#      image's onnx, protobuf, ml_dtypes, pyyaml ... stay as they are (its other packages were built against them;
#      STATE/deps.txt says what was installed and what kept) (no index, no dependencies resolved)               exit 5
#   6. the binding builds: NVTE_BUILD_USE_NVIDIA_WHEELS=1 (TE looks for the CUDA headers in the nvidia pip packages,
#      not $CUDA_HOME/include), CPATH = the folders step 1 found them in, NVTE_PYTORCH_FORCE_BUILD=TRUE (else its
#      setup tries to download a prebuilt binding); under setsid nohup, so that it survives the call's end; its pid,
#      log and exit code in STATE (build.pid, build.log, build.rc)
#   then waits up to TE_WAIT seconds (default 60) for the build: built and importable                         exit 0
#      (and each requirement of TE's installed distributions checked against what the machine has: one line for
#      those a kept package does not meet, in STATE/needs.txt; information, not a failure)
#      still building: run the same call again                                                                exit 75
#      failed, or stopped without an exit code (the next call starts it again)                                exit 3
# The header check and the build's environment mirror ../shared/tools/gpu-wheelhouse's te install.sh, which does all
# of it in one go once every part is there.
# PIP (default "python3 -m pip") is the pip to run; CUDA_ROOTS (default "/usr/local/cuda") where else to look for nvcc;
# TE_POLL (default 5) seconds between looks at the build.
set -uo pipefail
say() { echo "te_install: $*" >&2; }
usage="usage: te_install.sh prepare|complete PARTS_DIR | te_install.sh next PARTS_DIR STATE_DIR"
cmd="${1:?$usage}"; parts="${2:?$usage}"
pip_cmd=(${PIP:-python3 -m pip})
TE_VERSION=2.20.2
NEEDS=(pydantic pydantic-core annotated-types typing-inspection nvdlfw-inspect "nvidia-cudnn-frontend>=1.29.0")
# ^ what gpu-wheelhouse te downloads for TE that the GPU image lacks (KINDS.md's package list, 2026-11-17: it holds
#   einops, onnx, onnxscript, onnx-ir, ml-dtypes, protobuf, pyyaml, packaging)

if [[ $cmd == complete ]]; then
  mkdir -p "$parts/deps"
  core_whl=$(ls "$parts"/transformer_engine_cu13-*.whl 2>/dev/null | head -n 1)
  if [[ ! -f "$parts/te-core.sha256" ]]; then
    [[ -n "$core_whl" ]] || { say "$parts has neither te-core.sha256 nor the core wheel; fix: ../shared/tools/gpu-wheelhouse te 3.12 $parts"; exit 2; }
    (cd "$parts" && name=$(basename "$core_whl") && sha256sum "$name" > te-core.sha256 && split -b 50m -d "$name" part- && rm "$name") \
      || { say "could not sum and split $core_whl"; exit 3; }
    say "the core wheel summed into te-core.sha256 and split: $(cd "$parts" && ls part-* | paste -sd' ')"
  fi
  plat=(--only-binary=:all: --python-version "${TE_PYTHON:-3.12}" --implementation cp --platform manylinux2014_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64)
  wanted=()
  compgen -G "$parts/deps/transformer_engine-$TE_VERSION-*.whl" >/dev/null || wanted+=("transformer_engine==$TE_VERSION")
  for need in "${NEEDS[@]}"; do
    stem=$(echo "${need%%[<>=]*}" | tr '-' '_')
    compgen -G "$parts/deps/$stem-*.whl" >/dev/null || wanted+=("$need")
  done
  if (( ${#wanted[@]} )); then
    "${pip_cmd[@]}" download -q --no-deps -d "$parts/deps" "${plat[@]}" "${wanted[@]}" \
      || { say "pip could not download ${wanted[*]} as wheels"; exit 3; }
    say "downloaded as wheels: ${wanted[*]}"
  fi
  if ! compgen -G "$parts/deps/transformer_engine_torch-$TE_VERSION.tar.gz" >/dev/null; then
    python3 - "${TE_INDEX:-${PIP_INDEX_URL:-https://pypi.org/simple}}" "transformer_engine_torch-$TE_VERSION.tar.gz" "$parts/deps" <<'EOP' || exit 3
import hashlib, html, json, os, re, sys, urllib.parse, urllib.request
index, wanted, folder = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
page = f"{index}/transformer-engine-torch/"
request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
with urllib.request.urlopen(request, timeout=60) as r:
    body = r.read().decode()
try:  # PEP 691: {"files": [{"filename", "url", "hashes": {"sha256"}}]}
    files = {f["filename"]: (f["url"], f.get("hashes", {}).get("sha256")) for f in json.loads(body)["files"]}
except ValueError:  # PEP 503: <a href="URL#sha256=HEX">FILENAME</a>
    files = {}
    for href, name in re.findall(r'<a [^>]*href="([^"]+)"[^>]*>([^<]+)</a>', body):
        url, _, frag = html.unescape(href).partition("#")
        files[name.strip()] = (url, frag.removeprefix("sha256=") if frag.startswith("sha256=") else None)
if wanted not in files:
    sys.exit(f"te_install: {page} lists no {wanted}")
url, sha = files[wanted]
if not sha:
    sys.exit(f"te_install: {page} gives no sha256 for {wanted}: it is not fetched unchecked")
data = urllib.request.urlopen(urllib.parse.urljoin(page, url), timeout=300).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"te_install: {wanted} from {page}: sha256 {hashlib.sha256(data).hexdigest()}, the index says {sha}")
tmp = os.path.join(folder, "." + wanted)
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, os.path.join(folder, wanted))
print(f"te_install: fetched {wanted} ({len(data)} bytes, sha256 as {page} gives it); its metadata is built on the GPU machine",
      file=sys.stderr)
EOP
  fi
  say "$parts is complete: $(ls "$parts" | grep -c '^part-') parts, te-core.sha256, deps/ ($(ls "$parts/deps" | wc -l) files);" \
      "next: bash benchmarks/te_install.sh prepare $parts"
  exit 0
fi

if [[ $cmd == prepare ]]; then
  [[ -f "$parts/te-core.sha256" ]] && compgen -G "$parts/part-*" >/dev/null \
    || { say "$parts has no te-core.sha256 or part-*; fix: ../shared/tools/gpu-wheelhouse te 3.12 $parts first"; exit 2; }
  (cd "$parts" && sha256sum $(ls part-* | sort) > parts.sha256)
  top=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
  tree=$(cd "$top" && git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  first=(.whl "$parts/deps" "$parts/te-core.sha256" "$parts/parts.sha256")
  bytes=$(( tree + $(du -sb "${first[@]}" 2>/dev/null | awk '{ s += $1 } END { print s + 0 }') ))
  mapfile -t rest < <(cd "$parts" && ls part-* | sort)
  smallest=$(cd "$parts" && ls -S part-* | tail -n 1)   # the last part, as a rule: it may ride along with the first call
  small=$(stat -c %s "$parts/$smallest")
  if (( bytes + small <= 64 * 1024 * 1024 - 1024 * 1024 )); then
    first+=("$parts/$smallest"); bytes=$(( bytes + small ))
    mapfile -t rest < <(printf '%s\n' "${rest[@]}" | grep -vx "$smallest")
  fi
  echo "te_install: the calls (the working tree that travels is $(( tree / 1048576 )) MiB; a call carries at most 64 MiB):"
  echo "  1. carry [$(printf '"%s", ' "${first[@]}" | sed 's/, $//')] ($(( bytes / 1048576 )) MiB with the tree)"
  n=2
  for p in "${rest[@]}"; do
    echo "  $n. carry [\"$parts/$p\"] ($(( (tree + $(stat -c %s "$parts/$p")) / 1048576 )) MiB with the tree)"
    n=$(( n + 1 ))
  done
  echo "  then no carry until the binding is built and tested (each call: bash benchmarks/gpu_session.sh .whl te \$OUT)"
  exit 0
fi
[[ $cmd == next ]] || { say "$usage"; exit 2; }
state="${3:?$usage}"
mkdir -p "$state"

# 1. the headers and nvcc (mirrors gpu-wheelhouse te's install.sh; also the nvidia package wherever Python finds it)
declare -A where=()
missing=()
for h in nccl.h cudnn.h cublasLt.h cuda_runtime.h; do
  found=$(python3 - "$h" <<'EOP'
import glob, importlib.util, os, site, sys
roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"]
spec = importlib.util.find_spec("nvidia")
bases = [os.path.join(sp, "nvidia") for sp in site.getsitepackages()] + list(spec.submodule_search_locations if spec else [])
for base in dict.fromkeys(bases):
    roots += sorted(glob.glob(os.path.join(base, "*", "include"))) + sorted(glob.glob(os.path.join(base, "*", "*", "include")))
print(next((r for r in roots if os.path.exists(os.path.join(r, sys.argv[1]))), ""))
EOP
)
  if [[ -n "$found" ]]; then where[$h]="$found"; else missing+=("$h"); fi
done
if (( ${#missing[@]} )); then
  say "missing headers: ${missing[*]} (not in ${CUDA_HOME:-/usr/local/cuda}/include nor in an nvidia pip package's include folder):" \
      "transformer_engine_torch cannot build here; fix: install nvidia-nccl-cu13 / nvidia-cudnn-cu13 / nvidia-cublas (whichever" \
      "holds them) or set CUDA_HOME to a toolkit that has them"
  exit 3
fi
for h in nccl.h cudnn.h cublasLt.h cuda_runtime.h; do echo "header $h: ${where[$h]}"; done > "$state/headers.txt"
cpath=$(printf '%s\n' "${where[@]}" | sort -u | paste -sd:)
nvcc=$(command -v nvcc || true)
cuda_home="${CUDA_HOME:-}"
if [[ -n "$cuda_home" && -x "$cuda_home/bin/nvcc" ]]; then nvcc="$cuda_home/bin/nvcc"; fi
for root in ${CUDA_ROOTS:-/usr/local/cuda}; do
  if [[ -z "$nvcc" && -x "$root/bin/nvcc" ]]; then nvcc="$root/bin/nvcc"; fi
done
[[ -z "$cuda_home" && -n "$nvcc" ]] && cuda_home=$(dirname "$(dirname "$nvcc")")
if [[ -z "$nvcc" ]]; then
  say "no nvcc: \`which nvcc\` finds none, CUDA_HOME is ${CUDA_HOME:-unset}, none of ${CUDA_ROOTS:-/usr/local/cuda} has bin/nvcc;" \
      "TE's build asks nvcc for the CUDA version; fix: set CUDA_HOME to the CUDA toolkit (the image has nvcc 13.0)"
  exit 3
fi
echo "nvcc: $nvcc" >> "$state/headers.txt"
say "headers and nvcc found ($(tr '\n' ';' < "$state/headers.txt" | sed 's/;$//'))"

needs() {  # each requirement of TE's installed distributions against what the machine has: STATE/needs.txt, one line if unmet
  python3 - "$state/needs.txt" <<'EOP' || true
import importlib.metadata as md, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    open(sys.argv[1], "w").write("not checked: no packaging module\n"); sys.exit(0)
lines, unmet = [], []
for dist in md.distributions():
    name = dist.metadata["Name"] or ""
    if not name.lower().replace("-", "_").startswith("transformer_engine"):
        continue
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", "pytorch")):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        ok = have is not None and req.specifier.contains(have, prereleases=True)
        lines.append(f"{'ok' if ok else 'UNMET'} {name} needs {req.name}{req.specifier}: {have or 'not installed'}")
        if not ok:
            unmet.append(f"{name} needs {req.name}{req.specifier}, the machine has {have or 'none'}")
open(sys.argv[1], "w").write("".join(line + "\n" for line in lines))
if unmet:
    print("te_install: " + "; ".join(unmet) + " (kept as they are; see needs.txt)", file=sys.stderr)
EOP
}

wait_build() {  # wait up to TE_WAIT seconds for the build started by an earlier step or call; exit with its outcome
  local pid deadline=$(( $(date +%s) + ${TE_WAIT:-60} ))
  pid=$(cat "$state/build.pid" 2>/dev/null)
  while [[ ! -f "$state/build.rc" ]] && [[ -n "$pid" && -d "/proc/$pid" ]] && (( $(date +%s) < deadline )); do
    sleep "${TE_POLL:-5}"
  done
  if [[ -f "$state/build.rc" ]]; then
    local rc; rc=$(cat "$state/build.rc")
    if [[ $rc != 0 ]]; then
      say "building transformer_engine_torch failed (exit $rc); the end of $state/build.log:"; tail -n 30 "$state/build.log" >&2; exit 3
    fi
    if ! python3 -c "import transformer_engine.pytorch" > "$state/import.log" 2>&1; then
      say "transformer_engine_torch built but transformer_engine.pytorch does not import: $(tail -n 1 "$state/import.log")"; exit 3
    fi
    needs
    say "transformer_engine_torch built and imports (log $state/build.log)"; exit 0
  fi
  if [[ -n "$pid" && -d "/proc/$pid" ]]; then
    say "still building transformer_engine_torch (pid $pid, $(wc -l < "$state/build.log") lines of log in $state/build.log);" \
        "run the same call again to keep waiting"
    exit 75
  fi
  rm -f "$state/build.pid"
  say "the build of transformer_engine_torch stopped without an exit code (the machine went back?); the end of its log:"
  tail -n 10 "$state/build.log" >&2 2>/dev/null; say "run the same call again to start it again"; exit 3
}

# 2. a build an earlier call started
if [[ -f "$state/build.rc" || -f "$state/build.pid" ]]; then wait_build; fi

# 3. what has arrived
lacks=()
[[ -f "$parts/te-core.sha256" ]] || lacks+=("te-core.sha256")
compgen -G "$parts/deps/transformer_engine_torch-*.tar.gz" >/dev/null \
  || lacks+=("deps/transformer_engine_torch-*.tar.gz (the binding's sdist)")
if (( ${#lacks[@]} )); then
  say "$parts lacks ${lacks[*]}; fix: carry what the first call carries (bash benchmarks/te_install.sh prepare $parts lists it)"
  exit 2
fi
if [[ -f "$parts/parts.sha256" ]]; then
  want=(); bad=()
  while read -r sum name; do
    if [[ ! -f "$parts/$name" ]]; then want+=("$name")
    elif [[ "$(sha256sum "$parts/$name" | cut -d' ' -f1)" != "$sum" ]]; then bad+=("$name"); fi
  done < "$parts/parts.sha256"
  total=$(wc -l < "$parts/parts.sha256")
  if (( ${#bad[@]} )); then
    say "${bad[*]}: not the part parts.sha256 names (truncated, or from another download); fix: carry it again"; exit 4
  fi
  if (( ${#want[@]} )); then
    say "$(( total - ${#want[@]} )) of $total parts here; next call: carry [\"$parts/${want[0]}\"] (then ${want[*]:1})"
    exit 75
  fi
fi
compgen -G "$parts/part-*" >/dev/null || { say "no part-* in $parts; fix: carry $parts/part-00 and the others, one a call"; exit 75; }

# 4. reassemble and check
core=$(awk '{print $2}' "$parts/te-core.sha256" | sed 's/^\*//')
if [[ -z "$core" || "$core" == */* ]]; then
  say "$parts/te-core.sha256 names no wheel file ('$core'); fix: carry the te-core.sha256 gpu-wheelhouse wrote"
  exit 2
fi
(cd "$parts" && cat $(ls part-* | sort) > "$core")
if ! (cd "$parts" && sha256sum --quiet -c te-core.sha256) >/dev/null 2>&1; then
  got=$(cd "$parts" && sha256sum "$core" | awk '{print $1}')
  want=$(awk '{print $1}' "$parts/te-core.sha256")
  rm -f "$parts/$core"
  say "checksum mismatch: the parts reassemble to sha256 $got, te-core.sha256 says $want ($(ls "$parts" | grep -c '^part-') parts);" \
      "fix: a part is missing, truncated or from another download: carry the parts again"
  exit 4
fi
say "reassembled $core ($(du -h "$parts/$core" | cut -f1)), sha256 ok"

# 5. the Python parts: TE's own wheels, and of its needs only those the machine lacks
mapfile -t wheels < <(python3 - "$state/deps.txt" "$parts"/deps/*.whl <<'EOP'
import importlib.metadata as md, os, sys
said = []
for path in (p for p in sys.argv[2:] if os.path.isfile(p)):
    name, version = os.path.basename(path).split("-")[:2]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is None or name.lower().startswith("transformer_engine"):
        print(path)
        said.append(f"installed {name} {version}")
    else:
        said.append(f"kept {name} {have} (the machine's; the carried {version} not installed)")
with open(sys.argv[1], "w") as f:
    f.write("".join(line + "\n" for line in said))
EOP
)
if ! "${pip_cmd[@]}" install -q --no-index --no-deps "${wheels[@]}" "$parts/$core" >"$state/pip.log" 2>&1; then
  say "pip could not install the wheels (see $state/pip.log): $(tail -1 "$state/pip.log")"
  exit 5
fi
kept=$(grep '^kept' "$state/deps.txt" | cut -d' ' -f2,3 | paste -sd, | sed 's/,/, /g')
say "installed the core wheel and $(grep -c '^installed' "$state/deps.txt") of deps/'s wheels; kept the machine's ${kept:-(none)}"
rm -f "$parts/$core"  # installed: 276 MB less on the disk

# 6. the binding, in a process of its own session: it runs on after this call returns
rm -f "$state/build.rc" "$state/build.pid"
sdist=$(ls "$parts"/deps/transformer_engine_torch-*.tar.gz | head -n 1)
TE_PIP="${pip_cmd[*]}" TE_SDIST="$sdist" TE_STATE="$state" CUDA_HOME="$cuda_home" CPATH="$cpath${CPATH:+:$CPATH}" \
  NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-16}" \
  setsid nohup bash -c 'echo $$ > "$TE_STATE/build.pid.tmp" && mv "$TE_STATE/build.pid.tmp" "$TE_STATE/build.pid"
    $TE_PIP install --no-index --no-deps --no-build-isolation -v "$TE_SDIST"
    echo $? > "$TE_STATE/build.rc.tmp" && mv "$TE_STATE/build.rc.tmp" "$TE_STATE/build.rc"' \
  > "$state/build.log" 2>&1 < /dev/null &
for _ in $(seq 50); do [[ -f "$state/build.pid" ]] && break; sleep 0.1; done
say "building transformer_engine_torch in a session of its own (pid $(cat "$state/build.pid" 2>/dev/null), log $state/build.log," \
    "NVTE_BUILD_USE_NVIDIA_WHEELS=1, CPATH $cpath)"
wait_build
