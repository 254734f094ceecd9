"""A recording stand-in for kubectl (no cluster exists on the test machines): the one test double of
the Kubernetes tests. Installed as `kubectl` on PATH by tests/test_kubernetes.py.

It appends its argv to $FAKE_KUBECTL_DIR/calls.jsonl and answers from files in that folder:
- `apply -f FILE`: copies FILE to applied.yaml, prints what kubectl prints, exits with apply_rc (default 0);
- `get <job resource> ...`: prints the next job object of statuses.json (a list; the last one repeats);
- `get pods ...`: prints pods.json (default: no pods).
"""

import json
import os
import shutil
import sys
from pathlib import Path

here = Path(os.environ["FAKE_KUBECTL_DIR"])
argv = sys.argv[1:]
with open(here / "calls.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps(argv) + "\n")

if argv[:1] == ["apply"]:
    shutil.copyfile(argv[argv.index("-f") + 1], here / "applied.yaml")
    print("configmap/x-plan created\njob created")
    sys.exit(int((here / "apply_rc").read_text()) if (here / "apply_rc").exists() else 0)
if argv[:2] == ["get", "pods"]:
    print((here / "pods.json").read_text() if (here / "pods.json").exists() else '{"items": []}')
    sys.exit(0)
if argv[:1] == ["get"]:
    statuses = json.loads((here / "statuses.json").read_text())
    counter = here / "get_count"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    print(json.dumps(statuses[min(n, len(statuses) - 1)]))
    sys.exit(0)
print(f"fake kubectl: unexpected arguments {argv}", file=sys.stderr)
sys.exit(64)
