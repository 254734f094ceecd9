#!/usr/bin/env bash
# Download torchtitan 0.3.0 and every package it pulls in, except the torch stack the GPU machine already has
# (torch, triton, nvidia-*, cuda-*), as wheels for that machine's Python, split into parts that each fit one carry
# (at most 64 MiB a transfer), with an install script:
#
#   bash benchmarks/torchtitan-wheels.sh 3.12 .tt          # here (a registry is needed); python3 -V on the GPU machine
#   # carry .tt/part-1, .tt/part-2, ... one transfer each (the machine keeps git-ignored folders while warm), then there:
#   bash .tt/install.sh                                    # pip install --no-index from every part
#
# Measured 2026-11-25 for Python 3.12: 77 wheels, 156.3 MiB in 3 parts (60.0 + 60.0 + 36.3 MiB); 134 MiB of it
# compiled (pyarrow 52.5 MiB, wandb 19.4, numpy 15.9, pandas 11.5, grpcio, pillow, tensorboard-data-server, hf-xet,
# tokenizers, pydantic-core, ...), 22 MiB pure Python. Not a pure-Python set, and torchtitan.trainer imports datasets
# (-> pyarrow, pandas) and tensorboard whatever the job. Some of it the GPU machine has already (numpy with its
# torch; tokenizers and huggingface-hub with its transformers): pip keeps those. docs/benchmarks.md says what else
# stands between torchtitan 0.3.0 and a run there.
#
# The resolution runs `pip install --dry-run --report` (metadata only: the torch stack is never downloaded), then
# `pip download --no-deps` fetches exactly the resolved wheels.
set -euo pipefail
pyver="${1:?usage: torchtitan-wheels.sh PYVER [OUT]}"; out="${2:-.tt}"; py="${PYTHON:-python3}"
part_mib="${PART_MIB:-60}"
plat=(--only-binary=:all: --python-version "$pyver" --implementation cp --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64)
mkdir -p "$out/all"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip install -q --dry-run --ignore-installed --report "$tmp/report.json" --target "$tmp/none" "${plat[@]}" torchtitan==0.3.0
"$py" - "$tmp/report.json" > "$tmp/wanted.txt" <<'EOF'
import json, re, sys
skip = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
for item in json.load(open(sys.argv[1]))["install"]:
    name = item["metadata"]["name"].lower().replace("_", "-")
    if not skip.match(name):
        print(f"{name}=={item['metadata']['version']}")
EOF
xargs "$py" -m pip download -q --no-deps -d "$out/all" "${plat[@]}" < "$tmp/wanted.txt"
# Whole wheels into parts of at most part_mib MiB, largest first (a wheel larger than a part gets a part of its own).
"$py" - "$out" "$part_mib" <<'EOF'
import os, shutil, sys
out, limit = sys.argv[1], int(sys.argv[2]) * 2**20
wheels = sorted(((os.path.getsize(os.path.join(out, "all", w)), w) for w in os.listdir(os.path.join(out, "all"))), reverse=True)
parts: list[list] = []
for size, w in wheels:
    part = next((p for p in parts if p[0] + size <= limit), None)
    if part is None:
        part = [0, []]
        parts.append(part)
    part[0] += size
    part[1].append(w)
for i, (size, names) in enumerate(parts, 1):
    folder = os.path.join(out, f"part-{i}")
    os.makedirs(folder, exist_ok=True)
    for w in names:
        shutil.move(os.path.join(out, "all", w), os.path.join(folder, w))
    print(f"part-{i}: {len(names)} wheels, {size / 2**20:.1f} MiB")
print(f"all: {sum(len(n) for _, n in parts)} wheels, {sum(s for s, _ in parts) / 2**20:.1f} MiB")
EOF
rmdir "$out/all"
cat > "$out/install.sh" <<'EOT'
#!/usr/bin/env bash
# On the GPU machine, from anywhere: install torchtitan 0.3.0 from every part-*/ next to this script. pip keeps what
# the machine has where it satisfies a requirement (its torch: spmd_types asks for torch >= 2.11).
set -euo pipefail
cd "$(dirname "$0")"
links=(); for d in part-*/; do links+=(--find-links "$d"); done
python3 -m pip install -q --no-index "${links[@]}" torchtitan==0.3.0
python3 -c "import torchtitan.train; print('torchtitan', __import__('importlib.metadata').metadata.version('torchtitan'), 'imports')"
EOT
chmod +x "$out/install.sh"
du -sh "$out"
