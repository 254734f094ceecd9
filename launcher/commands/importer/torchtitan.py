"""A torchtitan job TOML, every generation up to the move to Python configs (pytorch/torchtitan#2386, 2026-02):

- 2024: [training] batch_size, warmup_steps, data_parallel_degree / _shard_degree, tensor_parallel_degree,
  compile, enable_float8_linear; [experimental] pipeline / context parallel, enable_async_tensor_parallel;
  [float8] enable_float8_linear, enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp.
- 2025: model.converters = ["float8"] (or "mx"), [float8] recipe_name / filter_fqns / emulate, [mx];
  [parallelism]; [lr_scheduler]; [compile] enable + components; [training] local_batch_size / global_batch_size.
- 2026: [quantize.linear.float8 | mx], [quantize.grouped_mm.float8 | mx] with converters "quantize.linear.float8" (the
  shipped llama3_405b.toml still says "float8").

Key names and defaults from torchtitan/config/job_config.py (commit 238fa99, 2026-02-23): optimizer AdamW with
lr 8e-4, beta1 0.9, beta2 0.95, eps 1e-8, weight_decay 0.1 applied to every parameter (one group:
components/optimizer.py build_optimizers); lr_scheduler warmup_steps 200, decay_type "linear", min_lr_factor 0.0
(components/lr_scheduler.py). Float8: every nn.Linear with both dims divisible by 16 is converted unless its name
CONTAINS one of filter_fqns (components/quantization/utils.py module_filter_fn: `filter_fqn in fqn`); the string
"auto_filter_small_kn" asks for torchao's size heuristic instead.
"""

from __future__ import annotations

from . import hub
from .draft import Draft
from .kind import Kind, count

FLAVORS = {("llama3", "8B"): "builtin:llama3-8b", ("llama3", "70B"): "builtin:llama3-70b",
           ("deepseek_v3", "16B"): "builtin:deepseek-v3-16b", ("qwen3", "30B-A3B"): "builtin:qwen3-30b-a3b"}
"""torchtitan (model.name, model.flavor) -> the builtin of the same shape (launcher/planning/models.py)."""

SAME_SHAPE_BUT = {"builtin:deepseek-v3-16b": "grouped-query attention instead of DeepSeek's multi-head latent attention (docs/moe.md)",
                  "builtin:qwen3-30b-a3b": "q_norm / k_norm are not modelled"}

AUTO_FILTER = "auto_filter_small_kn"

DEFAULTS = {"optimizer.beta1": 0.9, "optimizer.beta2": 0.95, "optimizer.weight_decay": 0.1, "lr_scheduler.warmup_steps": 200,
            "lr_scheduler.decay_type": "linear", "lr_scheduler.min_lr_factor": 0.0}
"""torchtitan's defaults where they differ from fp8launch's (job_config.py): a file that leaves them out trains with these."""


def _read(d: Draft) -> None:
    _model(d)
    _parallelism(d)
    fp8 = _float8(d)
    d.group("model", "a torchtitan model option")
    _mixed_precision(d, fp8)
    _compile_and_ac(d)
    _training(d)
    _optimizer(d)
    _schedule(d)
    _job(d)
    _checkpoint(d)
    _metrics(d)
    d.group("profiling", "fp8launch profiles with `fp8launch run --profile N` / `fp8launch bench --profile`")
    d.group("validation", "fp8launch's held-out loss is [eval] (data, every, steps): its data must be local; set them once train.data is")
    d.group("comm", "torch.distributed's timeouts and flight recorder: fp8launch keeps torch's defaults")
    d.group("memory_estimation", "`fp8launch plan` prints a memory estimate of every spec")
    d.group("fault_tolerance", "torchft: fp8launch restarts failed workers with torchrun (launch.max_restarts) and resumes from checkpoints")
    d.group("experimental", "an experimental torchtitan extension")


def _model(d: Draft) -> None:
    name, flavor = str(d.get("model.name", "llama3")), str(d.get("model.flavor", "debugmodel"))
    builtin = FLAVORS.get((name, flavor))
    sources = tuple(k for k in ("model.name", "model.flavor") if d.has(k))
    if builtin in SAME_SHAPE_BUT:
        d.approximated(sources, ("train.model", builtin), how=f"torchtitan's {name} {flavor} as fp8launch's builtin shape, but {SAME_SHAPE_BUT[builtin]}")
    elif builtin:
        d.mapped(sources, ("train.model", builtin), note=f"torchtitan's {name} {flavor} shape")
    else:
        assets = str(d.get("model.hf_assets_path", "")).rstrip("/").rsplit("/", 1)[-1]
        also = (f"hf_assets_path names the Hugging Face model {assets}: its config.json alone is this shape "
                f"(huggingface-cli download OWNER/{assets} config.json --local-dir DIR)" if assets and assets != "tokenizer" else "")
        hub.model(d, sources, f"torchtitan {name} {flavor}", shape_hint=f"{name} {flavor}", also=also)
    for key in ("model.hf_assets_path", "model.tokenizer_path"):
        if d.has(key):
            d.none(key, "the tokenizer (and Hugging Face checkpoint) folder: once train.data is text, set train.tokenizer to the folder "
                        "holding its tokenizer.json")


def _world(d: Draft) -> dict:
    """torchtitan's degrees, whichever generation wrote them."""
    def first(*keys, default=1):
        return next((d.get(k) for k in keys if d.has(k)), default)

    return {"tp": int(first("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree")),
            "pp": int(first("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree")),
            "cp": int(first("parallelism.context_parallel_degree", "experimental.context_parallel_degree")),
            "ep": int(first("parallelism.expert_parallel_degree")),
            "shard": int(first("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree",
                               "training.data_parallel_degree", default=-1)),
            "replicate": int(first("parallelism.data_parallel_replicate_degree", "training.data_parallel_replicate_degree"))}


def _key(d: Draft, *keys: str) -> str | None:
    return next((k for k in keys if d.has(k)), None)


def _parallelism(d: Draft) -> None:
    w = _world(d)
    d.world_unknown("torchtitan takes the world size from torchrun (NGPU in run_train.sh), not from the job file")
    shard = _key(d, "parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree", "training.data_parallel_degree")
    replicate = _key(d, "parallelism.data_parallel_replicate_degree", "training.data_parallel_replicate_degree")
    if w["shard"] == 1 and w["replicate"] > 1:
        d.mapped(tuple(k for k in (shard, replicate) if k), ("distributed.strategy", "ddp"), note="replicate-only data parallelism is DDP")
    else:
        d.mapped(shard or "(data_parallel_shard_degree)", ("distributed.strategy", "fsdp2"), value=w["shard"],
                 note="FSDP2 over the data-parallel ranks" + ("" if shard else " (torchtitan's default -1: every rank left)"))
        if replicate and w["replicate"] > 1:
            d.approximated(replicate, how="fp8launch's FSDP2 shards over every data-parallel rank (no HSDP replication)")
        elif replicate:
            d.mapped(replicate, note="no replication")
    tp = _key(d, "parallelism.tensor_parallel_degree", "training.tensor_parallel_degree")
    if tp:
        d.mapped(tp, ("distributed.tensor_parallel", w["tp"]), note="with sequence parallel, torchtitan's Llama plan" if w["tp"] > 1 else "")
    async_tp = _key(d, "parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel")
    if async_tp:
        d.mapped(async_tp, ("distributed.async_tp", bool(d.get(async_tp))))
    if d.has("parallelism.disable_loss_parallel"):
        d.none("parallelism.disable_loss_parallel", "fp8launch's tensor parallel gathers the logits and every TP rank computes the whole loss")
    for what, keys in (("pp", ("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree")),
                       ("cp", ("parallelism.context_parallel_degree", "experimental.context_parallel_degree"))):
        key = _key(d, *keys)
        if key and w[what] > 1:
            d.none(key, ("fp8launch has no pipeline parallelism: every rank holds every layer" if what == "pp" else
                         "fp8launch has no context parallelism: every rank holds whole sequences")
                   + "; its ranks become data-parallel ranks (train.grad_accum_steps keeps the global batch)")
            d.batch.ranks_note = "the source's pipeline / context parallel ranks are data-parallel ranks here"
        elif key:
            d.mapped(key, note="off")
    ep = _key(d, "parallelism.expert_parallel_degree")
    if ep:
        d.mapped(ep, ("distributed.expert_parallel", w["ep"]))
    etp = _key(d, "parallelism.expert_tensor_parallel_degree")
    if etp:
        (d.mapped(etp, note="off") if int(d.get(etp)) == 1 else
         d.none(etp, "fp8launch does not split experts over tensor-parallel ranks (EP-TENSOR-PARALLEL)"))
    reshard = d.get("parallelism.fsdp_reshard_after_forward")
    if reshard is not None:
        d.mapped("parallelism.fsdp_reshard_after_forward", ("distributed.fsdp2.reshard_after_forward", reshard != "never"),
                 note='"default" reshards (without pipeline parallel), as "always" does')
    d.group("parallelism", "fp8launch has no pipeline or context parallelism; the rest are their schedules and tuning")


def _converters(d: Draft) -> list[str]:
    return [str(c) for c in (d.get("model.converters") or [])]


def _float8(d: Draft) -> bool:
    """precision.* from whichever float8 / mx section the file's generation has; True when FP8 is on."""
    conv = _converters(d)
    linear8 = any(c in ("float8", "quantize.linear.float8") for c in conv)
    linear_mx = any(c in ("mx", "quantize.linear.mx") for c in conv)
    old = _key(d, "training.enable_float8_linear", "float8.enable_float8_linear")
    if old and d.get(old) is True:
        linear8 = True
    section = next((s for s in ("quantize.linear.float8", "float8") if d.has(s)), None)
    mx_section = next((s for s in ("quantize.linear.mx", "mx") if d.has(s)), None)
    on = linear8 or linear_mx
    if d.has("model.converters"):
        note = "FP8 on" if on else "no float8 / mx converter: FP8 off; the quantize sections below have no effect in the source either"
        d.mapped("model.converters", note=note)
    if old:
        d.mapped(old, note="FP8 on" if d.get(old) is True else "FP8 off")
    if not on:
        for s in (section, mx_section, "quantize"):
            if s:
                d.group(s, "FP8 is off in the source (no float8 / mx converter): no effect")
        return False
    d.set("precision.mode", "fp8")
    d.set("precision.backend", "torchao")
    if linear_mx:
        _mx(d, mx_section)
    else:
        _tensorwise(d, section, generation_2024=bool(old))
    grouped = next((s for s in ("quantize.grouped_mm.float8.fqns", "quantize.grouped_mm.mx.fqns", "float8.moe_fqns_prototype",
                                "mx.moe_fqns_prototype") if d.has(s)), None)
    if grouped:
        grouped_on = any("grouped_mm" in c for c in conv) or grouped.endswith("moe_fqns_prototype")
        if not grouped_on:
            d.none(grouped, "no grouped_mm converter in model.converters: no effect in the source either")
        elif linear_mx:
            d.mapped(grouped, note="the MoE experts' grouped GEMMs run in MXFP8 with the mxfp8 recipe (docs/moe.md)")
        else:
            d.none(grouped, "fp8launch runs the experts' grouped GEMMs in FP8 only with precision.torchao.recipe rowwise or mxfp8 "
                            "(docs/moe.md); with tensorwise they stay bf16 (MOE-EXPERTS-HP)")
    d.group("quantize", "FP8 of the other kind (float8 vs mx) is not in model.converters: no effect")
    return True


def _filters(d: Draft, key: str | None, default: list[str]) -> None:
    """filter_fqns (substrings) -> precision.keep globs, keep_first_last false, skip_small."""
    fqns = [str(f) for f in (d.get(key) if key and d.has(key) else default)]
    auto = AUTO_FILTER in fqns
    fqns = [f for f in fqns if f != AUTO_FILTER]
    source = key if key and d.has(key) else "(filter_fqns)"
    globs = [f"*{f}*" for f in fqns]
    sets = [("precision.keep_first_last", False), ("precision.torchao.skip_small", auto)] + ([("precision.keep", globs)] if globs else [])
    how = ("torchtitan converts every Linear whose name contains none of filter_fqns; fp8launch's keep globs match whole names, so each "
           f"substring S is written *S*" + ("; auto_filter_small_kn is torchao's size heuristic: skip_small" if auto else
                                           "; no size heuristic: skip_small = false (dims not divisible by 16 stay high precision in both)"))
    if globs:
        d.approximated(source, *sets, how=how, value=d.get(key) if key and d.has(key) else default)
    else:
        d.mapped(source, *sets, note=how, value=d.get(key) if key and d.has(key) else [])


def _tensorwise(d: Draft, section: str | None, generation_2024: bool = False) -> None:
    s = f"{section}." if section else "(float8)."
    recipe = d.get(s + "recipe_name")
    if recipe is not None:
        d.mapped(s + "recipe_name", ("precision.torchao.recipe", str(recipe)))
    else:
        d.mapped("(recipe)", ("precision.torchao.recipe", "tensorwise"), note="no recipe_name: torchtitan's tensorwise Float8LinearConfig")
    gather = bool(d.get(s + "enable_fsdp_float8_all_gather", False))
    pre = bool(d.get(s + "precompute_float8_dynamic_scale_for_fsdp", False))
    if d.has(s + "enable_fsdp_float8_all_gather"):
        d.mapped(s + "enable_fsdp_float8_all_gather", ("precision.torchao.fsdp_float8_all_gather", gather))
    d.mapped(s + "precompute_float8_dynamic_scale_for_fsdp" if d.has(s + "precompute_float8_dynamic_scale_for_fsdp") else "(precompute)",
             ("precision.torchao.precompute_scale", gather and pre), value=pre,
             note="" if d.has(s + "precompute_float8_dynamic_scale_for_fsdp") else "torchtitan's default: off")
    if generation_2024 and not d.has(s + "filter_fqns"):  # torchtitan/float8.py then: module_filter_fn=lambda mod, fqn: fqn != "output"
        d.mapped("(filter)", ("precision.keep_first_last", False), ("precision.torchao.skip_small", False), ("precision.keep", ["output"]),
                 note='torchtitan (2024) converted every Linear but the one named "output"')
    else:
        _filters(d, s + "filter_fqns" if section else None, [])
    for key in ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output"):
        if d.has(s + key):
            if d.get(s + key) == "dynamic":
                d.mapped(s + key, note="dynamic scaling: what tensorwise does")
            else:
                d.approximated(s + key, how=f"torchao removed {d.get(s + key)} scaling: dynamic (tensorwise)")
    if d.has(s + "emulate"):
        if d.get(s + "emulate") is True:
            d.none(s + "emulate", "torchao's emulated float8 for GPUs below sm89: fp8launch runs FP8 for real on CPU (launch.device = "
                                  "\"cpu\") and refuses older GPUs (FP8-HARDWARE)")
        else:
            d.mapped(s + "emulate", note="off")
    if d.has(s + "force_recompute_fp8_weight_in_bwd"):
        d.none(s + "force_recompute_fp8_weight_in_bwd", "a torchao option fp8launch leaves at its default")
    if section:
        d.group(section, "a torchtitan float8 option fp8launch has no equivalent for")


def _mx(d: Draft, section: str | None) -> None:
    s = f"{section}." if section else "(mx)."
    recipe = str(d.get(s + "recipe_name", "mxfp8_cublas"))
    sets = (("precision.torchao.recipe", "mxfp8"),)
    if recipe.startswith("mxfp8"):
        d.mapped(s + "recipe_name" if d.has(s + "recipe_name") else "(mx recipe)", *sets, value=recipe,
                 note="torchao's MXFP8 (the cuBLAS kernels on compute capability >= 10.0)")
    else:
        d.approximated(s + "recipe_name", *sets, how=f"fp8launch's torchao block recipes are mxfp8 and nvfp4, not {recipe}")
    _filters(d, s + "filter_fqns" if section else None, ["output"])
    if d.has(s + "mxfp8_dim1_cast_kernel_choice"):
        d.none(s + "mxfp8_dim1_cast_kernel_choice", "torchao's cast kernel choice: fp8launch leaves it at torchao's default")
    if section:
        d.group(section, "a torchtitan MX option fp8launch has no equivalent for")


def _mixed_precision(d: Draft, fp8: bool) -> None:
    param = d.get("training.mixed_precision_param", "bfloat16")
    mode = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(str(param), "bf16")
    key = "training.mixed_precision_param" if d.has("training.mixed_precision_param") else "(mixed_precision_param)"
    d.mapped(key, ("precision.high_precision" if fp8 else "precision.mode", mode), value=param,
             note="" if d.has("training.mixed_precision_param") else "torchtitan's default")
    if d.has("training.mixed_precision_reduce"):
        reduce = {"float32": "fp32", "bfloat16": "bf16"}.get(str(d.get("training.mixed_precision_reduce")), "fp32")
        d.mapped("training.mixed_precision_reduce", ("distributed.fsdp2.reduce_dtype", reduce))
    if d.has("training.dtype"):
        d.mapped("training.dtype", note="fp8launch keeps fp32 weights and computes in precision.high_precision")


def _compile_and_ac(d: Draft) -> None:
    if d.has("compile.enable"):
        parts = [str(c) for c in d.get("compile.components", ["model", "loss"])]
        sources = ("compile.enable", "compile.components") if d.has("compile.components") else "compile.enable"
        if d.get("compile.enable") is not True:
            d.mapped(sources, ("compile.enabled", False))
        elif "model" in parts:
            d.mapped(sources, ("compile.enabled", True), note="fp8launch compiles each transformer block, as torchtitan does"
                     + ("; the loss is not compiled" if "loss" in parts else ""))
        else:
            d.approximated(sources, ("compile.enabled", False), how="only the loss is compiled in the source; fp8launch compiles the "
                                                                    "model's blocks or nothing: nothing")
    elif d.has("training.compile"):
        d.mapped("training.compile", ("compile.enabled", bool(d.get("training.compile"))))
    d.group("compile", "the compile backend: fp8launch compiles with inductor")
    mode = d.get("activation_checkpoint.mode")
    if mode is not None:
        option = str(d.get("activation_checkpoint.selective_ac_option", "2"))
        if mode in ("full", "none"):
            d.mapped("activation_checkpoint.mode", ("activation_checkpointing.mode", mode))
            if d.has("activation_checkpoint.selective_ac_option"):
                d.mapped("activation_checkpoint.selective_ac_option", note=f"not read with mode {mode}")
        elif mode == "selective" and option == "2":
            d.mapped(tuple(k for k in ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option") if d.has(k)),
                     ("activation_checkpointing.mode", "selective"), note="every other block, as fp8launch's selective")
        else:
            d.approximated(tuple(k for k in ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option") if d.has(k)),
                           ("activation_checkpointing.mode", "selective"),
                           how=f"torchtitan's {mode} {'op-level ' if option == 'op' else ''}checkpointing: fp8launch's selective "
                               "recomputes every other block")
    d.group("activation_checkpoint", "a torchtitan activation-checkpointing option fp8launch has no equivalent for")


def _training(d: Draft) -> None:
    t = "training."
    micro = _key(d, t + "local_batch_size", t + "batch_size")
    if micro:
        d.note_batch("micro", d.get(micro), micro)
    if int(d.get(t + "global_batch_size", -1)) > 0:
        d.note_batch("global_", d.get(t + "global_batch_size"), t + "global_batch_size")
    elif d.has(t + "global_batch_size"):
        d.mapped(t + "global_batch_size", note="-1: local_batch_size x data-parallel ranks, fp8launch's rule too")
    for key, target, conv in (("seq_len", "train.seq_len", int), ("steps", "train.steps", int), ("max_norm", "train.max_grad_norm", float),
                              ("seed", "train.seed", int)):
        if d.has(t + key):
            d.mapped(t + key, (target, conv(d.get(t + key))))
    if d.has("debug.seed"):
        d.mapped("debug.seed", ("train.seed", int(d.get("debug.seed"))))
    if d.has(t + "enable_cpu_offload"):
        d.mapped(t + "enable_cpu_offload", ("distributed.fsdp2.cpu_offload", bool(d.get(t + "enable_cpu_offload"))))
    if d.has(t + "warmup_steps"):  # 2024: the warm-up lived in [training]
        d.mapped(t + "warmup_steps", ("train.warmup_steps", int(d.get(t + "warmup_steps"))))
    dataset = d.get(t + "dataset", "c4_test")
    if d.has(t + "dataset_path"):
        d.none(t + "dataset_path", "torchtitan's dataset loader reads it; fp8launch: point train.data at a local parquet / jsonl / arrow "
                                   'file ("hf-dataset:PATH?column=text") and set train.tokenizer')
    hub.dataset(d, t + "dataset" if d.has(t + "dataset") else "(dataset)", str(dataset),
                note="c4_test is the small c4 sample in torchtitan's tests/assets" if dataset == "c4_test" else "")
    d.group("training", "a torchtitan training option fp8launch has no equivalent for (garbage collection, data loader workers)")
    d.group("debug", "a torchtitan debugging option")


def _optimizer(d: Draft) -> None:
    o = "optimizer."
    name = str(d.get(o + "name", "AdamW"))
    if name in ("AdamW", "Adam"):
        d.mapped(o + "name" if d.has(o + "name") else "(optimizer)", ("train.optimizer", name.lower()), value=name)
    else:
        d.approximated(o + "name", ("train.optimizer", "adamw"), how=f"fp8launch has adamw, adam and sgd, not {name}")
    if d.has(o + "lr"):
        d.mapped(o + "lr", ("train.lr", float(d.get(o + "lr"))))
    else:
        d.mapped("(optimizer.lr)", ("train.lr", 8e-4), value=8e-4, note="torchtitan's default")
    betas = [float(d.get(o + "beta1", DEFAULTS["optimizer.beta1"])), float(d.get(o + "beta2", DEFAULTS["optimizer.beta2"]))]
    given = tuple(k for k in (o + "beta1", o + "beta2") if d.has(k))
    d.mapped(given or "(optimizer.beta1, beta2)", ("train.adam_betas", betas), value=betas,
             note="" if len(given) == 2 else "torchtitan's default (0.9, 0.95) where the file has none")
    if d.has(o + "eps"):
        d.mapped(o + "eps", ("train.adam_eps", float(d.get(o + "eps"))))
    wd = float(d.get(o + "weight_decay", DEFAULTS["optimizer.weight_decay"]))
    d.mapped(o + "weight_decay" if d.has(o + "weight_decay") else "(optimizer.weight_decay)", ("train.weight_decay", wd),
             ("train.weight_decay_exclude", "none"), value=wd,
             note=("" if d.has(o + "weight_decay") else "torchtitan's default; ") + "every parameter decays, norms and biases too, as in torchtitan")
    if d.has(o + "implementation"):
        d.none(o + "implementation", "fp8launch uses torch's default implementation of the optimizer (foreach on CUDA)")
    d.group("optimizer", "a torchtitan optimizer option fp8launch has no equivalent for")


def _schedule(d: Draft) -> None:
    s = "lr_scheduler."
    if d.has(s + "warmup_steps"):
        d.mapped(s + "warmup_steps", ("train.warmup_steps", int(d.get(s + "warmup_steps"))))
    elif not d.has("training.warmup_steps"):
        d.mapped("(lr_scheduler.warmup_steps)", ("train.warmup_steps", 200), value=200, note="torchtitan's default")
    decay = str(d.get(s + "decay_type", "linear"))
    source = s + "decay_type" if d.has(s + "decay_type") else "(lr_scheduler.decay_type)"
    if decay == "cosine":
        d.mapped(source, value=decay, note="fp8launch's decay is a cosine")
    else:
        d.approximated(source, value=decay, how=f"a {decay} decay" + ("" if d.has(s + "decay_type") else " (torchtitan's default)")
                       + " becomes fp8launch's cosine decay to the same end")
    floor = _key(d, s + "min_lr_factor", s + "lr_min")
    ratio = float(d.get(floor)) if floor else DEFAULTS["lr_scheduler.min_lr_factor"]
    d.mapped(floor or "(lr_scheduler.min_lr_factor)", ("train.min_lr_ratio", ratio), value=ratio,
             note="" if floor else "torchtitan's default: decays to 0")
    if d.has(s + "decay_ratio"):
        d.approximated(s + "decay_ratio", how="warmup-stable-decay: fp8launch has no stable phase, its decay spans every step after the warm-up")
    if d.has(s + "total_steps"):
        d.approximated(s + "total_steps", how="fp8launch's schedule ends at train.steps")
    d.group("lr_scheduler", "a torchtitan lr-schedule option fp8launch has no equivalent for")


def _job(d: Draft) -> None:
    if d.has("job.dump_folder"):
        folder = str(d.get("job.dump_folder")).rstrip("/") or "."
        d.approximated("job.dump_folder", ("train.output_dir", f"{folder}/{{name}}"), how="each fp8launch run keeps a folder of its own in it")
    if d.has("job.description"):
        d.mapped("job.description", note="kept in this comment")
    d.group("job", "a torchtitan job option (config printing and saving, custom modules)")


def _checkpoint(d: Draft) -> None:
    c = "checkpoint."
    enable = _key(d, c + "enable", c + "enable_checkpoint")
    if enable is None and not d.has("checkpoint"):
        return
    on = bool(d.get(enable)) if enable else False
    if not on:
        d.mapped(enable or "(checkpoint.enable)", ("train.checkpoint_every", 0), ("train.checkpoint_at_end", False), value=False,
                 note="checkpointing off" + ("" if enable else " (torchtitan's default)"))
        d.group("checkpoint", "checkpointing is off in the source")
        return
    d.mapped(enable, ("train.checkpoint_at_end", True))
    if d.has(c + "interval"):
        if str(d.get(c + "interval_type", "steps")) == "steps":
            d.mapped(tuple(k for k in (c + "interval", c + "interval_type") if d.has(k)), ("train.checkpoint_every", int(d.get(c + "interval"))))
        else:
            d.none((c + "interval", c + "interval_type"), "fp8launch checkpoints every N steps (train.checkpoint_every), not every N seconds")
    if d.has(c + "keep_latest_k"):
        k = int(d.get(c + "keep_latest_k"))
        if k > 0:
            d.mapped(c + "keep_latest_k", ("train.keep_checkpoints", k))
        else:
            d.approximated(c + "keep_latest_k", ("train.keep_checkpoints", 1000), how="0 keeps every checkpoint: fp8launch keeps the newest 1000")
    if d.has(c + "folder"):
        d.approximated(c + "folder", how="fp8launch writes checkpoints to <train.output_dir>/checkpoints")
    if d.has(c + "initial_load_path"):
        d.mapped(c + "initial_load_path", ("train.resume", str(d.get(c + "initial_load_path"))))
    d.group("checkpoint", "fp8launch checkpoints the whole state with DCP (docs/checkpoints.md); `fp8launch export` writes model-only files")


def _metrics(d: Draft) -> None:
    m = "metrics."
    if d.has(m + "log_freq"):
        d.mapped(m + "log_freq", ("train.log_every", int(d.get(m + "log_freq"))))
    if d.has(m + "enable_tensorboard"):
        d.mapped(m + "enable_tensorboard", ("log.tensorboard", bool(d.get(m + "enable_tensorboard"))))
    if d.has(m + "enable_wandb"):
        d.mapped(m + "enable_wandb", ("log.wandb", bool(d.get(m + "enable_wandb"))))
    d.group("metrics", "fp8launch writes its metrics to <train.output_dir> (metrics.jsonl, tensorboard/)")


KEYS = ("job.dump_folder", "model.flavor", "model.converters", "training.seq_len", "training.steps", "training.local_batch_size",
        "training.batch_size", "parallelism", "float8", "quantize", "lr_scheduler", "activation_checkpoint", "metrics.log_freq",
        "experimental", "checkpoint.folder", "optimizer.name")

KIND = Kind(id="torchtitan", title="torchtitan job TOML",
            score=lambda data: count(data, KEYS) + 2 * isinstance(data.get("job"), dict) if isinstance(data.get("training"), dict)
            or isinstance(data.get("parallelism"), dict) or isinstance(data.get("job"), dict) else 0,
            read=_read, name=lambda d: None,
            other="a torchtitan setting fp8launch has no equivalent for")
