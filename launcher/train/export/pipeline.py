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
    _fp8_stored(plan, spec_dir, step, weights, checkpoint, echo)
    target = None
    quantization = None
    if fmt == "hf":
        tokenizer = run_tokenizer(plan, spec_dir)
        notes.extend(tokenizer.notes)
        if model.startswith("builtin:") and hf.builtin_moe(model):
            raise InputError("--format", f"train.model {model} is fp8launch's MoE decoder, whose computation no transformers class "
                             "repeats: experts chosen on scores plus the load-balance bias (expert_bias), a shared expert added "
                             "ungated, grouped-query attention without q/k norms (Mixtral has no bias and no shared expert, "
                             "Qwen2-MoE gates its shared expert, Qwen3-MoE normalises q and k, DeepSeek-V3 uses latent attention)",
                             "export with --format torch (the model's own names, loadable by launcher.train.models.build_model)")
        if model.startswith("builtin:"):
            target = hf.builtin_target(model, weights.entries, torch_dtype, eos=tokenizer.eos)
        elif model.startswith("hf:"):
            target = hf.hf_target(model[3:], spec_dir, weights.entries, torch_dtype)
        else:
            raise InputError("--format", f"train.model {model} is a user factory: fp8launch does not know which Hugging Face class "
                             "it corresponds to", "export with --format torch (the model's own names), or train a builtin: or hf: model")
        target.copies.extend(tokenizer.copies)
        names = list(target.names)
        if quant:
            quantization = _quantization(plan, spec_dir, step, target, quant, serve_tp, echo)
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


@dataclass
class Quantization:
    """--quant: the format, every Linear quantized or kept (and why), and what the export writes for it."""

    plan: Plan
    phase: Plan
    step: int
    target: object
    fmt: object
    layers: list
    tps: list[int]

    @property
    def weights(self) -> dict:
        return {f"{layer.name}.weight": self.fmt for layer in self.layers if layer.kept is None}

    @property
    def config(self) -> dict:
        return self.fmt.config([layer.name for layer in self.layers if layer.kept is not None])

    def finish(self, folder: str, weights, dtype: str, files: list[str], echo: Callable[[str], None]) -> dict:
        """Measure the logit gap on what `folder` holds, write README.md there; the marker's "quant" record."""
        from .card import measure_gap, readme
        from .write import write_text

        gap = measure_gap(self.target, weights, self.layers, self.fmt, folder)
        if gap is not None:
            echo(f"export: logits against the bf16 export ({gap.tokens} tokens): max |difference| {gap.max_abs:.4g}, "
                 f"mean {gap.mean_abs:.4g}, top-1 agreement {100 * gap.top1:.1f}%")
        linear = {f"{layer.name}.weight" for layer in self.layers}
        others = [h.removesuffix(".weight") for h in self.target.names.values() if h not in linear and h.endswith(".weight")]
        write_text(os.path.join(folder, "README.md"), readme(
            plan=self.plan, phase=self.phase, step=self.step, architecture=self.target.architecture, fmt=self.fmt,
            layers=self.layers, gap=gap, tps=self.tps, dtype=dtype, other_weights=others))
        files.append("README.md")
        return {"format": self.fmt.name, "quantized": [layer.name for layer in self.layers if layer.kept is None],
                "kept": {layer.name: layer.kept for layer in self.layers if layer.kept is not None},
                "recipes": {layer.name: layer.recipe for layer in self.layers if layer.kept is None},
                "serving_tensor_parallel": self.tps, "logit_gap": gap.as_dict() if gap else None}


def _quantization(plan: Plan, spec_dir: str, step: int, target, quant: str, serve_tp: int | None,
                  echo: Callable[[str], None]) -> Quantization:
    from .layers import export_layers, serving_tps, tp_problem
    from .quant import FORMATS

    fmt = FORMATS[quant]
    layers = export_layers(plan, step, spec_dir, target, fmt)
    if serve_tp is not None:
        problem = tp_problem(layers, fmt, serve_tp, target.config)
        if problem:
            fits = serving_tps(layers, fmt, target.config)
            raise InputError("--serve-tp", f"vLLM cannot load this {quant} export at tensor parallel {serve_tp}: {problem}",
                             (f"serve it at --serve-tp {' or '.join(map(str, fits))}, or " if fits else "")
                             + ("export with --quant fp8-channel (one scale per output row: no block)"
                                if quant != "fp8-channel" else "serve at a tensor parallel size that divides the layers"))
    kept = [layer for layer in layers if layer.kept is not None]
    quantized = len(layers) - len(kept)
    echo(f"export: {quantized} Linear layers in {quant}, {len(kept)} kept in high precision"
         + (": " + "; ".join(f"{layer.name} ({layer.kept})" for layer in kept[:3]) + ("; ..." if len(kept) > 3 else "")
            if kept else ""))
    from launcher.planning.schedule import plan_at

    return Quantization(plan=plan, phase=plan_at(plan, step).plan, step=step, target=target, fmt=fmt, layers=layers,
                        tps=serving_tps(layers, fmt, target.config))


def _fp8_stored(plan: Plan, spec_dir: str, step: int, weights, checkpoint: str, echo: Callable[[str], None]) -> None:
    """Weights the run stored in FP8 are read from their high-precision master copy, or refused naming why.

    Transformer Engine's precision.te.fp8_params: `model/` holds the Float8Tensor weights, TE's FusedAdam the fp32
    master copy of each (`optim/`, state.NAME.master_param; DeepSpeed's partitions are fp32 masters already). MS-AMP's
    ScalingTensor weights (FP8 codes in the checkpoint) have no master copy fp8launch reads."""
    from . import read

    p = plan.precision
    if p.fp8 and p.backend == "te" and p.te.fp8_params and weights.kind == "dcp":
        from .layers import trained_precision

        _, trained = trained_precision(plan, step, spec_dir)
        stored = [f"{name}.weight" for name, (recipe, _) in trained.items() if recipe is not None]
        redirected = set(weights.use_masters())
        missing = [n for n in stored if n in weights.entries and n not in redirected]
        if missing:
            raise InputError(KEY, f"{checkpoint} stores {missing[0]} (and {len(missing) - 1} more) in FP8 "
                             "(precision.te.fp8_params), and its optimizer state holds no fp32 master copy of it "
                             f"(optim/: state.{missing[0]}.{read.MASTER}): its FP8 rounding is all there is",
                             "export a checkpoint written with TE's FusedAdam master_weights (fp8launch's own), or a run with "
                             "precision.te.fp8_params = false")
        echo(f"export: {len(redirected)} weights stored in FP8 (precision.te.fp8_params) read from TE FusedAdam's fp32 master "
             "copy in optim/")
    not_float = sorted(n for n, e in weights.entries.items() if not (e.dtype in read.FLOATS or not e.dtype.is_floating_point))
    if not_float:
        why = ("MS-AMP's FP8 ScalingTensor weights, whose master copy is not in a form fp8launch reads"
               if p.backend == "msamp" else "not high-precision weights, and no master copy of them is saved beside them")
        raise InputError("train.model", f"{checkpoint} stores {len(not_float)} weight(s) in a low-precision format ({not_float[0]}: "
                         f"{weights.entries[not_float[0]].dtype}): {why}",
                         "export a run that keeps high-precision weights (precision.te.fp8_params = false, MS-AMP O1)")
