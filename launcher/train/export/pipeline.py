"""`fp8launch export`'s steps: find the checkpoint, read its weights, map them, write the folder."""

from __future__ import annotations

import copy
import os
import shutil
import typing
from collections.abc import Callable
from dataclasses import dataclass

from launcher.errors import EnvironmentProblem, InputError

from . import KEY, MARKER
from .fp8_stored import fp8_stored
from .quantized import plan_quantization

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


@dataclass(frozen=True, kw_only=True, slots=True)
class Exported:
    out: str
    step: int
    checkpoint: str
    files: tuple[str, ...]
    tensors: int
    parameters: int
    architecture: str
    """LlamaForCausalLM, ..., or "" for --format torch."""
    seconds: float
    notes: tuple[str, ...] = ()
    quantized: int = 0
    """--quant: the Linear layers written in FP8."""


def find_checkpoint(run_dir: str, step: int | None, echo: Callable[[str], None] = lambda line: None) -> tuple[int, str]:
    """(step, path) of the newest intact checkpoint of the run in `run_dir`, each newer damaged one skipped with a line
    through `echo`; or of step `step`, which must be intact. Only the files the weights are read from are checked."""
    from launcher.targets import checkpoint_record as record
    from launcher.train.checkpoint import CHECKPOINTS, CheckpointManager, Choice

    manager = CheckpointManager(run_dir, keep=1, strategy="ddp", rank=0, world_size=1)
    folder = os.path.join(run_dir, CHECKPOINTS)

    def shown(path: str) -> str:
        return os.path.join(folder, os.path.basename(path))

    if step is None:
        choice = manager.newest_intact(weights_only=True)
        if choice.path is None and choice.skipped:
            raise InputError(KEY, f"no checkpoint in {folder} is intact: "
                             + "; ".join(f"{os.path.basename(p)}: {why}" for p, why in choice.skipped),
                             "restore one from a copy, or export another run")
        if choice.path is None:
            raise InputError(KEY, f"{folder} holds no complete checkpoint (a step-N folder with COMPLETE.json)",
                             "export a run that has written one (train.checkpoint_every, train.checkpoint_at_end)")
        for note in choice.notes(shown):
            echo(f"warning: {note}")
        return record.candidate(choice.path).step, choice.path
    found = {c.step: c for c in record.candidates(manager.dir) if c.marker is not None}
    if step not in found:
        steps = ", ".join(str(s) for s in sorted(found))
        raise InputError("--step", f"{run_dir} has no complete checkpoint of step {step}",
                         f"use one of the complete steps: {steps}" if steps else
                         "export a run that has written one (train.checkpoint_every, train.checkpoint_at_end)")
    why = manager.damage(found[step], weights_only=True)
    if why is not None:
        raise InputError("--step", f"{shown(found[step].path)} is damaged: {why}",
                         "leave out --step to export the newest intact checkpoint, or restore this one from a copy")
    for note in Choice(found[step].path, unchecked=found[step].unchecked).notes(shown):
        echo(f"warning: {note}")
    return step, found[step].path


def export(plan: Plan, plan_dir: str, checkpoint: str, step: int, *, fmt: str, dtype: str, out: str, max_shard_bytes: int,
           echo: Callable[[str], None], quant: str | None = None, serve_tp: int | None = None) -> Exported:
    """Write checkpoint `checkpoint` (step `step`) of the run `plan` describes into folder `out`; with `quant`, the Linear
    layers the run trained in FP8 in that format (launcher/train/export/quant.py), checked for vLLM's tensor parallel
    `serve_tp`."""
    import time

    import torch

    from launcher import __version__

    from . import hf, read, write
    from .tokenizer import run_tokenizer

    start = time.monotonic()
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    spec_dir = os.path.normpath(os.path.join(plan_dir, plan.spec_dir))
    model = plan.train.model
    weights = read.open_weights(checkpoint)
    notes: list[str] = []
    fp8_stored(plan, spec_dir, step, weights, checkpoint, echo)
    target = None
    quantization = None
    if fmt == "hf":
        tokenizer = run_tokenizer(plan, spec_dir)
        notes.extend(tokenizer.notes)
        target = _hf_target(model, spec_dir, weights, torch_dtype, tokenizer.eos)
        target.copies.extend(tokenizer.copies)
        names = list(target.names)
        if quant:
            quantization = plan_quantization(plan, spec_dir, step, target, quant, serve_tp, echo)
    else:
        names = [n for n in weights.entries if not n.endswith(hf.RECOMPUTED)]
        if model.startswith("builtin:"):
            from launcher.train.models import build_model

            with torch.device("meta"):  # the builtin Llama or MoE decoder, as the run built it
                expected = {k: read.Entry(tuple(v.shape), v.dtype) for k, v in build_model(model, ".").state_dict().items()}
            hf.check_names(expected, weights.entries, what=f"the model {model}")
            names = list(expected)
    echo(f"export: {checkpoint} (step {step}, {weights.kind}) -> {out} ({fmt}, {dtype}, {len(names)} tensors)")
    try:
        with write.staged(out) as tmp:
            if target is not None:
                files = _write_hf(tmp, target, weights, torch_dtype, max_shard_bytes, echo, quantization)
            else:
                files = write.write_torch(tmp, weights, names, torch_dtype, max_shard_bytes, echo)
            parameters = sum(weights.entries[n].numel for n in names)
            quant_record = None
            if quantization:
                quant_record = quantization.finish(tmp, weights, dtype, files, echo)
            files.append(MARKER)
            write.write_json(os.path.join(tmp, MARKER), {
                "format": fmt, "dtype": dtype, "step": step, "checkpoint": os.path.abspath(checkpoint), "model": model,
                "architecture": target.architecture if target else "", "strategy": plan.distributed.strategy,
                "checkpoint_format": weights.kind, "tensors": len(names), "parameters": parameters, "files": sorted(files),
                "names": "Hugging Face" if target else "the model's own (train.model)", "fp8launch_version": __version__,
                "dropped": sorted(target.dropped) if target else sorted(set(weights.entries) - set(names)),
                **({"quant": quant_record} if quant_record else {}),
            })
    except OSError as e:
        raise EnvironmentProblem(f"cannot write the export into {out} ({e}); fix: check the free space and permissions there") from e
    return Exported(out=out, step=step, checkpoint=checkpoint, files=tuple(sorted(files)), tensors=len(names),
                    parameters=parameters, architecture=target.architecture if target else "",
                    seconds=time.monotonic() - start, notes=tuple(notes),
                    quantized=len(quantization.weights) if quantization else 0)


def _hf_target(model: str, spec_dir: str, weights, torch_dtype, eos):
    """The Hugging Face class and names a builtin: or hf: model exports to; refused for what transformers cannot repeat."""
    from . import hf

    if model.startswith("builtin:") and hf.builtin_moe(model):
        raise InputError("--format", f"train.model {model} is fp8launch's MoE decoder, whose computation no transformers class "
                         "repeats: experts chosen on scores plus the load-balance bias (expert_bias), a shared expert added "
                         "ungated, grouped-query attention without q/k norms (Mixtral has no bias and no shared expert, "
                         "Qwen2-MoE gates its shared expert, Qwen3-MoE normalises q and k, DeepSeek-V3 uses latent attention)",
                         "export with --format torch (the model's own names, loadable by launcher.train.models.build_model)")
    if model.startswith("builtin:"):
        return hf.builtin_target(model, weights.entries, torch_dtype, eos=eos)
    if model.startswith("hf:"):
        return hf.hf_target(model[3:], spec_dir, weights.entries, torch_dtype)
    raise InputError("--format", f"train.model {model} is a user factory: fp8launch does not know which Hugging Face class "
                     "it corresponds to", "export with --format torch (the model's own names), or train a builtin: or hf: model")


def _write_hf(tmp: str, target, weights, torch_dtype, max_shard_bytes: int, echo, quantization) -> list[str]:
    """The safetensors shards (quantized layers in their format), config.json (with its quantization_config),
    generation_config.json and the tokenizer's files into `tmp`; the names written."""
    from . import write

    files = write.write_safetensors(tmp, weights, target.names, torch_dtype, max_shard_bytes, echo,
                                    quantized=quantization.weights if quantization else None)
    config = target.config
    if quantization:
        config = copy.deepcopy(config)
        config.quantization_config = quantization.config
    config.save_pretrained(tmp)
    files.append("config.json")
    if target.generation_config is not None:
        target.generation_config.save_pretrained(tmp)
        files.append("generation_config.json")
    for source, name in target.copies:
        shutil.copyfile(source, os.path.join(tmp, name))
        files.append(name)
    return files
