"""Serve `fp8launch export` folders with vLLM and compare the prompt log-probabilities of each FP8 export
(--quant fp8-channel / fp8-block / mxfp8) with those of the bf16 export of the same checkpoint.

    python benchmarks/export_vllm_logprobs.py BF16_DIR QUANT_DIR [QUANT_DIR ...] [--python PY] [--out JSON]

Each folder is loaded by vLLM in a process of its own (`PY -c ...`, default: this Python; vLLM's CPU build lives in a
venv of its own, `--python /tmp/vllmenv/bin/python`, since it pins another transformers): `LLM(model=DIR,
skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16")` scores the same fixed token ids (2 prompts of 64
ids from torch.Generator seed 0, as the export's own README measures) with `SamplingParams(prompt_logprobs=0,
max_tokens=1)`: the log-probability vLLM gives each prompt token after the ones before it. Prints a table and writes
benchmarks/results/export_vllm_logprobs.json: vLLM's version and device, per folder the quantization vLLM resolved
(the `quant_method` it read) or the reason it could not load the folder, the mean and max |log-prob difference| to
the bf16 export, and the mean log-prob of each (their ratio is the quantized export's against the bf16 baseline
measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "export_vllm_logprobs.json")

CHILD = r'''
import json, sys, os
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import torch, vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
folder = sys.argv[1]
config = json.load(open(os.path.join(folder, "config.json")))
rows, cols = 2, min(64, int(config.get("max_position_embeddings") or 64))
ids = torch.randint(0, int(config["vocab_size"]), (rows, cols), generator=torch.Generator().manual_seed(0)).tolist()
llm = LLM(model=folder, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", max_model_len=cols + 8, seed=0,
          gpu_memory_utilization=float(os.environ.get("VLLM_MEMORY_SHARE", "0.2")))  # on a CPU: the share of RAM reserved
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], SamplingParams(prompt_logprobs=0, max_tokens=1,
                    detokenize=False))
logprobs = []
for prompt, out in zip(ids, outs):
    logprobs.append([None] + [lp[tok].logprob for tok, lp in zip(prompt[1:], out.prompt_logprobs[1:])])
quant = (config.get("quantization_config") or {}).get("quant_method")
print("RESULT " + json.dumps({"vllm": vllm.__version__, "device": str(llm.llm_engine.vllm_config.device_config.device),
                              "quant_method": quant, "logprobs": logprobs}))
'''


def score(folder: str, python: str) -> dict:
    """vLLM's prompt log-probs of the fixed ids for the export in `folder`; {"error": vLLM's reason} where it cannot load it."""
    r = subprocess.run([python, "-c", CHILD, folder], capture_output=True, text=True, timeout=1800)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        output = (r.stdout + "\n" + r.stderr).splitlines()  # vLLM's workers log their errors on either
        reasons = [line.split("] ", 1)[-1].strip() for line in output if "Error: " in line and "Engine core" not in line
                   and "initialization failed" not in line]
        return {"error": reasons[-1] if reasons else r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bf16")
    ap.add_argument("quantized", nargs="+")
    ap.add_argument("--python", default=sys.executable, help="the Python of the venv vLLM is installed in")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    base = score(args.bf16, args.python)
    if "error" in base:
        raise SystemExit(f"vLLM cannot load the bf16 export {args.bf16}: {base['error']}")
    flat = [x for row in base["logprobs"] for x in row if x is not None]
    rows = [{"folder": os.path.basename(os.path.normpath(args.bf16)), "quant_method": base["quant_method"], "mean_abs_diff": 0.0,
             "max_abs_diff": 0.0, "mean_logprob": sum(flat) / len(flat), "mean_logprob_ratio": 1.0}]
    for folder in args.quantized:
        got = score(folder, args.python)
        if "error" in got:
            rows.append({"folder": os.path.basename(os.path.normpath(folder)), "error": got["error"]})
            continue
        other = [x for row in got["logprobs"] for x in row if x is not None]
        diffs = [abs(a - b) for a, b in zip(other, flat)]
        mean = sum(other) / len(other)
        rows.append({"folder": os.path.basename(os.path.normpath(folder)), "quant_method": got["quant_method"],
                     "mean_abs_diff": sum(diffs) / len(diffs), "max_abs_diff": max(diffs), "mean_logprob": mean,
                     "mean_logprob_ratio": mean / rows[0]["mean_logprob"]})
    print(f"vLLM {base['vllm']} on {base['device']}: prompt log-probs of {len(flat)} tokens against the bf16 export")
    print(f"{'export':32} {'quant_method':20} {'mean |diff|':>12} {'max |diff|':>12} {'mean logprob':>13} {'ratio':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['folder']:32} not loaded: {r['error'][:200]}")
            continue
        print(f"{r['folder']:32} {str(r['quant_method']):20} {r['mean_abs_diff']:12.4f} {r['max_abs_diff']:12.4f} "
              f"{r['mean_logprob']:13.4f} {r['mean_logprob_ratio']:7.4f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"vllm": base["vllm"], "device": base["device"], "tokens": len(flat), "rows": rows}, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
