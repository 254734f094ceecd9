"""Peak host memory (VmHWM) per rank and time to the first step when a >= 600M-parameter model
starts through the training entrypoint on CPU at world 1, 2 and 4: builtin, hf: and py: sources.

Each run is `torchrun --standalone --nproc-per-node N benchmarks/_init_memory_rank.py PLAN` on
a plan with FSDP2 (or DeepSpeed ZeRO-3: --engines deepspeed-zero3), bf16, plain SGD (no optimizer
states, so that world 1 fits a shared 24 GiB machine), seq 32, micro-batch 1, one step,
OMP_NUM_THREADS=1. The rank script builds exactly as `python -m launcher.train` does
(launcher.train.main.build_run), then trains the step.

Reported per rank: VmHWM after the imports (torch alone), after initialisation (model built,
sharded, initialised), after the first step; and the seconds to each from process start. The
reference is one full fp32 copy of the model (4 bytes x parameters). Target: at world 4 every
rank's peak is at most 0.85x that, and the peak falls as the world grows.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/init_memory.py [--worlds 1 2 4] [--sources builtin hf py] \\
        [--engines fsdp2 deepspeed-zero3]
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
    # the hf config saved with random weights in bf16 (as published checkpoints are; save_pretrained, 1 GB safetensors
    # shards) in the run's temporary folder
    "hf-weights": "hf:{tmp}/hf-weights",
    # the baseline beside it: from_pretrained on every rank, then sharded (as before weights were read per module)
    "hf-weights-eager": "hf:{tmp}/hf-weights",
}
SOURCE_ENV = {"hf-weights-eager": {"INIT_BENCH_HF_EAGER": "1"}}


def save_hf_weights(tmp: Path) -> None:
    """The hf source's model with its weights (bf16, sharded safetensors), written by a process of its own. In bf16
    because published checkpoints are, and because an fp32 file is the one case where from_pretrained in fp32 is
    nearly free: its tensors stay views of the memory-mapped file and only the pages each rank's shard copies
    become resident (measured here: the eager baseline then peaks as low as reading per module, 0.60x at world 4)."""
    folder = tmp / "hf-weights"
    if folder.exists():
        return
    code = ("import sys, torch, transformers; torch.manual_seed(0); "
            "c = transformers.AutoConfig.from_pretrained(sys.argv[1]); "
            "transformers.AutoModelForCausalLM.from_config(c).to(torch.bfloat16).save_pretrained(sys.argv[2], max_shard_size='1GB')")
    subprocess.run([sys.executable, "-c", code, str(MODELS), str(folder)], check=True, capture_output=True, text=True)


SPEC = """\
version = 1
name = "init-{source}-w{world}"
[launch]
device = "cpu"
[precision]
mode = "bf16"
[distributed]
{engine}
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
ZERO3 = 'strategy = "deepspeed"\ndeepspeed.zero_stage = 3'
ENGINES = {  # name: (the spec's [distributed] keys, environment of the rank script)
    "fsdp2": ('strategy = "fsdp2"', {}),
    # ZeRO-3 partitions each module as soon as it is initialised; bf16 parameters, fp32 master partitions
    "deepspeed-zero3": (ZERO3, {}),
    # the baseline measured beside it: the whole model materialised before deepspeed.initialize partitions it
    "deepspeed-zero3-whole": (ZERO3, {"INIT_BENCH_ZERO3_WHOLE": "1"}),
    # FSDP2 with the two units plans had before the embedding and the head became units of their own (fsdp2.json edited)
    "fsdp2-two-units": ('strategy = "fsdp2"', {}),
    # DeepSpeed's own gradient bucket at a tenth of the default (5e8 elements: 0.93 GiB in bf16, allocated at initialize)
    "deepspeed-zero3-bucket5e7": (ZERO3 + "\ndeepspeed.reduce_bucket_size = 50000000", {}),
}
GIB = 2**30
SETUP = ("FSDP2 (fp32 shards, bf16 autocast) or DeepSpeed ZeRO-3 (bf16 parameter partitions, fp32 master partitions), "
         "SGD, seq 32, micro-batch 1, 1 step, gloo, OMP_NUM_THREADS=1; VmHWM read after initialisation "
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
with the world here.

DeepSpeed ZeRO-3 (--engines deepspeed-zero3 ...): "before deepspeed.initialize" is the model built
on meta, each module initialised and partitioned at once (bf16 partitions plus one module's full
fp32 tensors at a time, plus DeepSpeed's import); the baseline beside it, deepspeed-zero3-whole, is
the same run with the whole fp32 model materialised before deepspeed.initialize partitions it (as
before partition-as-you-go). "after init" then adds what deepspeed.initialize builds for training
(fp32 master partitions, flat bf16 partition buffers, gradient partitions and its reduce bucket:
model states, not initialisation), which is why it is above the FSDP2 figure; -bucket5e7 shows
the part that is distributed.deepspeed.reduce_bucket_size.

hf-weights: the hf model saved with bf16 weights (sharded safetensors); every rank builds it on meta
and reads each module's tensors when its turn comes (launcher/train/models/hf_weights.py, plain
reads: no mapping of the files). hf-weights-eager, the baseline beside it, is the same folder loaded
by from_pretrained (fp32) on every rank before FSDP2 shards it, as before. With an fp32 file the
baseline is nearly free (its tensors stay views of the mapped file; measured 0.60x at world 4, the
same as per module), which is why the files here are bf16, as published checkpoints are.

fsdp2-two-units: the same FSDP2 run with fsdp2.json's units edited back to ["transformer_block",
"root"] (plans before the embedding and the final norm + head were units of their own): the root
then holds embedding and head, gathered with their full gradients for the whole step; initialisation
is the same, the first step's peak is what differs."""


def run(source: str, world: int, tmp: Path, engine: str = "fsdp2") -> list[dict]:
    folder = tmp / f"{engine}-{source}-w{world}"
    folder.mkdir(parents=True)
    spec = folder / "spec.toml"
    keys, extra = ENGINES[engine]
    if source.startswith("hf-weights"):
        save_hf_weights(tmp)
    model = SOURCES[source].format(tmp=tmp)
    spec.write_text(SPEC.format(source=source, world=world, model=model, out=folder / "out", engine=keys))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{MODELS}", **extra,
           **SOURCE_ENV.get(source, {})}
    subprocess.run([str(Path(sys.executable).parent / "fp8launch"), "plan", "--out", str(folder / "gen"), str(spec)],
                   check=True, capture_output=True, text=True, env=env, cwd=MODELS)
    plan = folder / "gen" / f"init-{source}-w{world}" / "plan.json"
    if engine == "fsdp2-two-units":
        fsdp2 = plan.parent / "fsdp2.json"
        fsdp2.write_text(json.dumps({**json.loads(fsdp2.read_text()), "units": ["transformer_block", "root"]}))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                        str(REPO / "benchmarks" / "_init_memory_rank.py"), str(plan), str(folder / "rank")],
                       capture_output=True, text=True, env=env, cwd=MODELS, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{source} at world {world} failed:\n{r.stderr[-3000:]}")
    return [json.loads((folder / f"rank.rank{i}").read_text()) for i in range(world)]


def table(results: list[dict]) -> str:
    lines = ["| engine | source | world | params | full fp32 copy | rank | VmHWM after imports | before deepspeed.initialize / full copy "
             "| after init | init peak / full copy | after first step | step peak / full copy | s to init | s to first step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        full = 4 * res["params"]
        for r in res["ranks"]:
            lines.append(f"| {res.get('engine', 'fsdp2')} | {res['source']} | {res['world']} | {res['params'] / 1e6:.1f}M | "
                         f"{full / GIB:.2f} GiB | {r['rank']} | "
                         f"{r['vmhwm_after_imports'] / GIB:.2f} GiB | {_ratio(r.get('vmhwm_before_engine_init'), full)} | "
                         f"{r['vmhwm_after_init'] / GIB:.2f} GiB | {r['vmhwm_after_init'] / full:.2f}x | "
                         f"{r['vmhwm_after_first_step'] / GIB:.2f} GiB | {r['vmhwm_after_first_step'] / full:.2f}x | "
                         f"{r['seconds_to_initialised']:.1f} | {r['seconds_to_first_step_done']:.1f} |")
    return "\n".join(lines)


def _ratio(value: int | None, full: int) -> str:
    return "-" if value is None else f"{value / full:.2f}x"


def summary(res: dict) -> dict:
    """The figures the target reads, from one (source, world) run's ranks."""
    full = 4 * res["params"]
    init = max(r["vmhwm_after_init"] for r in res["ranks"])
    step = max(r["vmhwm_after_first_step"] for r in res["ranks"])
    out = {"max_rank_init_peak_bytes": init, "max_rank_init_peak_over_full_copy": round(init / full, 3),
           "max_rank_step_peak_bytes": step, "max_rank_step_peak_over_full_copy": round(step / full, 3)}
    ready = [r.get("vmhwm_before_engine_init") for r in res["ranks"]]
    if all(ready):  # DeepSpeed: the model built and partitioned, before DeepSpeed's optimizer partitions and buckets
        out |= {"max_rank_model_ready_peak_bytes": max(ready), "max_rank_model_ready_peak_over_full_copy": round(max(ready) / full, 3)}
    return out


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
    ap.add_argument("--engines", nargs="+", default=["fsdp2"], choices=list(ENGINES))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "init_memory.json"))
    ap.add_argument("--render", action="store_true",
                    help="re-write the table (and summaries) of --out from its measured rank records; run nothing")
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
        for engine, source, world in ((e, s, w) for e in args.engines for s in args.sources for w in args.worlds):
            ranks = run(source, world, Path(tmp), engine)
            params = ranks[0]["params"]
            model = SOURCES[source].replace(str(REPO) + "/", "").replace("{tmp}", "TMP")
            res = {"engine": engine, "source": source, "model": model, "world": world, "params": params,
                   "full_fp32_bytes": 4 * params, "ranks": ranks}
            res.update(summary(res))
            results.append(res)
            ready = res.get("max_rank_model_ready_peak_over_full_copy")
            print(f"{engine} {source} world {world}: max rank peak {res['max_rank_init_peak_over_full_copy']:.2f}x one full fp32 copy "
                  + (f"(model partitioned, before deepspeed.initialize: {ready:.2f}x) " if ready else "")
                  + f"through initialisation, {res['max_rank_step_peak_over_full_copy']:.2f}x through the first step", flush=True)
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
