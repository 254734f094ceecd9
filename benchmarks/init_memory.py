"""Peak host memory (VmHWM) per rank and time to the first step when a >= 600M-parameter model
starts through the training entrypoint on CPU at world 1, 2 and 4: builtin, hf: and py: sources.

Each run is `torchrun --standalone --nproc-per-node N benchmarks/_init_memory_rank.py PLAN` on
a plan with FSDP2, bf16, plain SGD (no optimizer states, so that world 1 fits a shared 24 GiB
machine), seq 32, micro-batch 1, one step, OMP_NUM_THREADS=1. The rank script builds exactly
as `python -m launcher.train` does (launcher.train.main.build_run), then trains the step.

Reported per rank: VmHWM after the imports (torch alone), after initialisation (model built,
sharded, initialised), after the first step; and the seconds to each from process start. The
reference is one full fp32 copy of the model (4 bytes x parameters). Target: at world 4 every
rank's peak is at most 0.85x that, and the peak falls as the world grows.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/init_memory.py [--worlds 1 2 4] [--sources builtin hf py]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "benchmarks" / "init_models"
SOURCES = {
    "builtin": "builtin:llama3-1b?layers=8&vocab=32000",  # 617.6M parameters
    "hf": f"hf:{MODELS}",  # LlamaForCausalLM from config.json alone: the same shapes, 617.6M
    "py": "py:user_model:build",  # benchmarks/init_models/user_model.py: 634.5M, reset_parameters() init
}
SPEC = """\
version = 1
name = "init-{source}-w{world}"
[launch]
device = "cpu"
[precision]
mode = "bf16"
[distributed]
strategy = "fsdp2"
procs_per_node = {world}
[train]
model = "{model}"
optimizer = "sgd"
seq_len = 32
micro_batch_size = 1
steps = 1
log_every = 1
output_dir = "{out}"
"""
GIB = 2**30
SETUP = ("FSDP2, bf16 autocast, SGD, seq 32, micro-batch 1, 1 step, gloo, OMP_NUM_THREADS=1; VmHWM read after initialisation "
         "and again after the first step")
TARGET = ("world 4: every rank's peak through initialisation (the model built, sharded and initialised) <= 0.85x one full "
          "fp32 copy; the peak falls as the world grows")
NOTES = """Reading it: "after init" is the peak while the model is built on the meta device, sharded and
initialised (each rank: its fp32 shard, plus one module's full tensors at a time while initialising,
plus ~0.2 GiB of torch itself). "after first step" adds what training one step holds: the gradient
shards and FSDP2's transient unsharded parameters and gradients (the root unit, embedding and head
with vocab 32000, is all-gathered whole), so it is not an initialisation figure. Seconds are on a
shared 2-core machine with N processes at one thread each: every rank draws every parameter's random
numbers (the price of weights that do not depend on the world size), so init time does not fall
with the world here."""


def run(source: str, world: int, tmp: Path) -> list[dict]:
    folder = tmp / f"{source}-w{world}"
    folder.mkdir(parents=True)
    spec = folder / "spec.toml"
    spec.write_text(SPEC.format(source=source, world=world, model=SOURCES[source], out=folder / "out"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{MODELS}"}
    subprocess.run([str(Path(sys.executable).parent / "fp8launch"), "plan", "--out", str(folder / "gen"), str(spec)],
                   check=True, capture_output=True, text=True, env=env, cwd=MODELS)
    plan = folder / "gen" / f"init-{source}-w{world}" / "plan.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                        str(REPO / "benchmarks" / "_init_memory_rank.py"), str(plan), str(folder / "rank")],
                       capture_output=True, text=True, env=env, cwd=MODELS, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{source} at world {world} failed:\n{r.stderr[-3000:]}")
    return [json.loads((folder / f"rank.rank{i}").read_text()) for i in range(world)]


def table(results: list[dict]) -> str:
    lines = ["| source | world | params | full fp32 copy | rank | VmHWM after imports | after init | init peak / full copy "
             "| after first step | step peak / full copy | s to init | s to first step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        full = 4 * res["params"]
        for r in res["ranks"]:
            lines.append(f"| {res['source']} | {res['world']} | {res['params'] / 1e6:.1f}M | {full / GIB:.2f} GiB | {r['rank']} | "
                         f"{r['vmhwm_after_imports'] / GIB:.2f} GiB | {r['vmhwm_after_init'] / GIB:.2f} GiB | {r['vmhwm_after_init'] / full:.2f}x | "
                         f"{r['vmhwm_after_first_step'] / GIB:.2f} GiB | {r['vmhwm_after_first_step'] / full:.2f}x | "
                         f"{r['seconds_to_initialised']:.1f} | {r['seconds_to_first_step_done']:.1f} |")
    return "\n".join(lines)


def summary(res: dict) -> dict:
    """The figures the target reads, from one (source, world) run's ranks."""
    full = 4 * res["params"]
    init = max(r["vmhwm_after_init"] for r in res["ranks"])
    step = max(r["vmhwm_after_first_step"] for r in res["ranks"])
    return {"max_rank_init_peak_bytes": init, "max_rank_init_peak_over_full_copy": round(init / full, 3),
            "max_rank_step_peak_bytes": step, "max_rank_step_peak_over_full_copy": round(step / full, 3)}


def write(record: dict, out: str) -> None:
    text = table(record["results"])
    print(text)
    Path(out).write_text(json.dumps(record, indent=2) + "\n")
    Path(out).with_suffix(".md").write_text(
        f"# init memory\n\n`{record['command']}`\n\n{record['setup']}\n\n{record['target']}\n\n{text}\n\n{NOTES}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--sources", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "init_memory.json"))
    ap.add_argument("--render", action="store_true", help="re-write the table (and summaries) of --out from its measured rank records; run nothing")
    args = ap.parse_args()
    if args.render:
        record = json.loads(Path(args.out).read_text())
        for res in record["results"]:
            for k in [k for k in res if k.startswith("max_rank_")]:
                del res[k]
            res.update(summary(res))
        record["target"], record["setup"] = TARGET, SETUP
        write(record, args.out)
        return
    import torch

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for source in args.sources:
            for world in args.worlds:
                ranks = run(source, world, Path(tmp))
                params = ranks[0]["params"]
                res = {"source": source, "model": SOURCES[source].replace(str(REPO) + "/", ""), "world": world, "params": params,
                       "full_fp32_bytes": 4 * params, "ranks": ranks}
                res.update(summary(res))
                results.append(res)
                print(f"{source} world {world}: max rank peak {res['max_rank_init_peak_over_full_copy']:.2f}x one full fp32 copy "
                      f"through initialisation, {res['max_rank_step_peak_over_full_copy']:.2f}x through the first step", flush=True)
    record = {
        "what": "per-rank peak host memory (VmHWM) and seconds to the first step, model built by the training entrypoint on CPU",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/init_memory.py " + " ".join(sys.argv[1:]),
        "setup": SETUP,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "target": TARGET,
        "results": results,
    }
    write(record, args.out)


if __name__ == "__main__":
    main()
