"""Models and datasets a source names by Hugging Face Hub id (or by a project's own model name): fp8launch
reads only local files, so each becomes "download it first" and the spec gets a placeholder.

The placeholder model is the builtin shape nearest what the name says (a Llama 3 of about that size, the
MoE shapes by name), else builtin:llama-debug; the placeholder data is "synthetic".
"""

from __future__ import annotations

import math
import os
import re

from launcher.planning.memory import model_params

from .draft import Draft

LLAMA3 = ("builtin:llama3-1b", "builtin:llama3-8b", "builtin:llama3-70b")
"""The builtin Llama 3 shapes, smallest first (parameter counts from launcher/planning/models.py)."""

DENSE = ("builtin:llama-small",) + LLAMA3
"""The builtin dense shapes of a real model's size, for a dense model of any family the name gives a size of (Qwen3-32B,
GPT-3 175B, Falcon-E-3B): the placeholder is the shape nearest in parameters, not the debug model."""

MOE = ("builtin:deepseek-v3-16b", "builtin:qwen3-30b-a3b")
"""The builtin MoE shapes of a real model's size."""

BY_NAME = (
    (re.compile(r"qwen-?3.*30b.*a3b", re.I), "builtin:qwen3-30b-a3b"),
    (re.compile(r"deepseek.*(moe.*16b|v3.*16b|16b)", re.I), "builtin:deepseek-v3-16b"),
)
"""Names of MoE models with a builtin shape (qwen3 30B-A3B, deepseek-moe-16b = torchtitan's DeepSeek-V3 16B)."""

MOE_NAME = re.compile(r"moe|mixtral|\d+x\d+(\.\d+)?b|-a\d+(\.\d+)?b|gpt[-_]?oss|deepseek[-_ ]?v[23]|llama[-_ ]?4|"
                      r"experts?\b", re.I)
"""A model name that says Mixture-of-Experts."""

HF_TRAINER_SEED = 42
"""transformers' TrainingArguments.seed default (training_args.py, 5.23): what a run on the Hugging Face Trainer seeds with
where its config says no seed (Axolotl passes `seed` only when set: core/builders/base.py, axolotl 067b021c)."""

DEBUG = "builtin:llama-debug"
SCRIPT_MODEL = "builtin:llama3-1b"
"""The placeholder where the source holds no model at all (its training script builds it)."""
MOE_DEBUG = "builtin:moe-debug"


def size_in_billions(name: str) -> float | None:
    """'Llama-3.2-3B' -> 3.0, '405B' -> 405.0, 'llama3_8b' -> 8.0, 'Mixtral-8x7B' -> 56.0 (experts x size); None when the
    name says no size."""
    text = name.lower().replace("_", "-")
    experts = re.findall(r"(?<![a-z0-9.])(\d+)x(\d+(?:\.\d+)?)\s*b(?![a-z])", text)
    if experts:
        n, size = experts[-1]
        return int(n) * float(size)
    m = re.findall(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*b(?![a-z])", text)
    return float(m[0]) if m and MOE_NAME.search(name) else float(m[-1]) if m else None


def nearest(choices: tuple[str, ...], billions: float) -> str:
    """The builtin of `choices` nearest `billions` parameters (in log parameters)."""
    return min(choices, key=lambda m: abs(math.log(model_params(m) / (billions * 1e9))))


def nearest_builtin(name: str) -> str:
    """The builtin shape nearest what `name` says: the MoE shapes by name, then an MoE name the MoE builtin nearest its
    size (the largest without one; builtin:moe-debug for a debug model), a Llama 3 by size (nearest in log parameters),
    else builtin:llama-debug."""
    for pattern, builtin in BY_NAME:
        if pattern.search(name):
            return builtin
    size = size_in_billions(name)
    if MOE_NAME.search(name):
        if "debug" in name.lower():
            return MOE_DEBUG
        return nearest(MOE, size) if size else MOE[-1]
    if re.search(r"llama[-_ ]?3", name, re.I) and size:
        return nearest(LLAMA3, size)
    if size:
        return nearest(DENSE, size)
    return DEBUG


def shape_billions(layers: int, hidden: int, ffn: int | None, vocab: int | None, gated: bool = True) -> float:
    """A decoder's parameters in billions from its shape (attention 4 h^2 a layer, the MLP 3 or 2 h x ffn, embedding and
    head): what picks the placeholder builtin nearest a Megatron model shape."""
    ffn = ffn or 4 * hidden
    per_layer = 4 * hidden * hidden + (3 if gated else 2) * hidden * ffn
    return (layers * per_layer + 2 * (vocab or 50257) * hidden) / 1e9


def is_hub_id(name: str) -> bool:
    """'owner/name' (a Hub id) rather than a local folder."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name)) and not os.path.exists(name)


def local_model(name: str, base: str) -> str | None:
    """The local folder (or config.json) `name` names, as given or beside the source file; None when there is none."""
    for candidate in (name, os.path.join(base, name)):
        if os.path.isfile(os.path.join(candidate, "config.json")) or (candidate.endswith("config.json") and os.path.isfile(candidate)):
            return candidate
    return None


def model(draft: Draft, source: str | tuple[str, ...], name: str, *, shape_hint: str = "", also: str = "") -> None:
    """train.model for a model the source names: a local Hugging Face folder maps; a Hub id or a project's model
    name becomes a placeholder (the nearest builtin shape) and the download to do."""
    local = local_model(name, os.path.dirname(os.path.abspath(draft.path)))
    if local:
        draft.mapped(source, ("train.model", f"hf:{local}"),
                     note="a local Hugging Face model folder (its config.json; weights read when present)")
        return
    builtin = nearest_builtin(shape_hint or name)
    like = f"the builtin shape nearest {shape_hint or name}" if builtin not in (DEBUG, MOE_DEBUG) else \
        f"a tiny builtin {'MoE ' if builtin == MOE_DEBUG else ''}model"
    if is_hub_id(name):
        why = (f"fp8launch reads only local models: download it (huggingface-cli download {name} --local-dir DIR) and set "
               f'train.model = "hf:DIR" (its config.json, and its weights when the run should start from them)')
        instead = f'download {name}, then "hf:DIR"'
    else:
        why = (f"{name} names a model of the source project's own code: write its shape as a Hugging Face config.json "
               f'(or download the matching Hub model) and set train.model = "hf:DIR", or "py:module:function" for your own model')
        instead = 'your model as "hf:DIR" or "py:module:function"'
    draft.placeholder(source, "train.model", builtin, f"{why}{'; ' + also if also else ''}; until then {like}", instead)


HF_DATASETS = {"c4": "allenai/c4", "c4_test": "allenai/c4", "c4_validation": "allenai/c4"}
"""torchtitan's dataset names and the Hub datasets they read."""


def dataset(draft: Draft, source: str | tuple[str, ...], name: str, *, column: str = "text", note: str = "") -> None:
    """train.data for a dataset the source names by Hub id or by a project's name: a placeholder ("synthetic")
    and the download to do."""
    hub = HF_DATASETS.get(name, name)
    extra = f"; {note}" if note else ""
    if is_hub_id(hub):
        why = (f"fp8launch reads only local data: download it (huggingface-cli download {hub} --repo-type dataset --local-dir DIR), "
               f'then set train.data = "hf-dataset:DIR/FILE?column={column}" (a parquet / jsonl / arrow file) and train.tokenizer '
               f"(the model's tokenizer.json), or tokenize it once into tokens: / megatron:{extra}")
    else:
        why = (f"{name} is read by the source project's own code: point train.data at local files "
               f'("text:PATH", "tokens:PATH", "megatron:PREFIX", "hf-dataset:PATH"){extra}')
    draft.placeholder(source, "train.data", "synthetic", why, f"the local data of {hub}")


def script(draft: Draft, what: str, optimizer: bool = True) -> None:
    """Placeholders for a source that holds no model, no data and no step count (its training script has them), and
    the optimizer and schedule fp8launch fills in where the source holds none either."""
    draft.placeholder("(model)", "train.model", SCRIPT_MODEL, f"{what} holds no model: the training script builds it; until then "
                      f"{SCRIPT_MODEL}, a small real shape (a debug model's GEMMs are too small for FP8 to gain: FP8-NO-GAIN)",
                      'your model: "hf:DIR" (a downloaded Hub model), "builtin:NAME" or "py:module:function"')
    draft.placeholder("(data)", "train.data", "synthetic", f"{what} holds no data: the training script loads it",
                      'your data: "text:PATH", "tokens:PATH", "megatron:PREFIX", "hf-dataset:PATH" or "py:module:function"')
    if draft.value("train.steps") is None:
        draft.placeholder("(steps)", "train.steps", draft.used("train.steps"), f"{what} holds no step count: the training script "
                          "decides it", "your run's optimizer steps")
    if draft.value("train.seed") is None:
        # transformers 5.23 training_args.py:1293: TrainingArguments.seed = 42, set at the start of training
        draft.placeholder("(seed)", "train.seed", HF_TRAINER_SEED, f"{what} holds no seed: the training script seeds (a script on "
                          f"the Hugging Face Trainer with TrainingArguments' default, {HF_TRAINER_SEED})", "your script's seed")
    if optimizer and draft.value("train.optimizer") is None and draft.value("train.lr") is None:
        used = {k: draft.used(f"train.{k}") for k in ("optimizer", "lr", "adam_betas", "weight_decay", "warmup_steps", "min_lr_ratio")}
        draft.none("(optimizer, schedule)", f"{what} holds neither: the training script builds them; the spec uses fp8launch's "
                                            f"{used['optimizer']} with lr {used['lr']}, betas {tuple(used['adam_betas'])}, weight_decay "
                                            f"{used['weight_decay']}, {used['warmup_steps']} warm-up steps and a cosine decay to "
                                            f"{used['min_lr_ratio']} x lr: set train.optimizer, lr, warmup_steps and min_lr_ratio to "
                                            "the script's")
