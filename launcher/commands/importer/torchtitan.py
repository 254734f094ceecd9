"""A torchtitan job TOML, every generation up to the move to Python configs (pytorch/torchtitan#2386, 2026-02):

- 2024: [training] batch_size, warmup_steps, data_parallel_degree / _shard_degree, tensor_parallel_degree,
  compile, enable_float8_linear; [experimental] pipeline / context parallel, enable_async_tensor_parallel;
  [float8] enable_float8_linear, enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp.
- 2025: model.converters = ["float8"] (or "mx"), [float8] recipe_name / filter_fqns / emulate, [mx];
  [parallelism]; [lr_scheduler]; [compile] enable + components; [training] local_batch_size / global_batch_size.
- 2025-09: [quantize.dense.float8 | mx], [quantize.moe.float8 | mx], converters "quantize.dense.float8", ...
- 2026: [quantize.linear.float8 | mx], [quantize.grouped_mm.float8 | mx] with converters "quantize.linear.float8" (the
  shipped llama3_405b.toml still says "float8").

model.converters is a list; a string is split on commas, as torchtitan's string_list (2025-02, config_manager.py
check_string_list_argument) and its tyro rule (list_str_rule) read "float8" or "float8,mx". A converter name no
generation registered stops torchtitan (KeyError in build_model_converters), and so does a key or [section] its
JobConfig lacks (ConfigManager._dict_to_dataclass: "Invalid field names", since 2025-08-28): the import refuses
both (exit 2, "did you mean"), unless job.custom_config_module / experimental.custom_args_module extends the config.
Mixing float8 and mx converters stops torchtitan too ("Cannot combine model converters with different quantization
types", components/quantization/__init__.py). torchtitan is not installed here: the tests name these commits.

Key names and defaults from torchtitan/config/job_config.py (commit 238fa99, 2026-02-23): optimizer AdamW with
lr 8e-4, beta1 0.9, beta2 0.95, eps 1e-8, weight_decay 0.1 applied to every parameter (one group:
components/optimizer.py build_optimizers); lr_scheduler warmup_steps 200, decay_type "linear", min_lr_factor 0.0
(components/lr_scheduler.py). Float8: every nn.Linear with both dims divisible by 16 is converted unless its name
CONTAINS one of filter_fqns (components/quantization/utils.py module_filter_fn: `filter_fqn in fqn`); the string
"auto_filter_small_kn" asks for torchao's size heuristic instead.
"""

from __future__ import annotations

from launcher.errors import SourceError, with_fix

from . import context, hub
from .draft import Draft
from .kind import Kind, count
from .known import Unknown, unknown
from .known import torchtitan as known
from .report import APPROXIMATED, UNSET, shown

FLAVORS = {("llama3", "8B"): "builtin:llama3-8b", ("llama3", "70B"): "builtin:llama3-70b",
           ("deepseek_v3", "16B"): "builtin:deepseek-v3-16b", ("qwen3", "30B-A3B"): "builtin:qwen3-30b-a3b"}
"""torchtitan (model.name, model.flavor) -> the builtin of the same shape (launcher/planning/models.py)."""

SAME_SHAPE_BUT = {
    "builtin:deepseek-v3-16b": ("DeepSeek's multi-head latent attention (13.8M weights per layer)",
                                "grouped-query attention (16.8M weights per layer; docs/moe.md)",
                                "the experts, ~93% of the parameters, are the same; attention has 3M more weights per layer"),
    "builtin:qwen3-30b-a3b": ("q_norm / k_norm on every attention", "no q / k norms",
                              "2 x 128 fewer weights per layer; the attention logits are not normalized"),
}

AUTO_FILTER = "auto_filter_small_kn"

DEFAULTS = {"optimizer.beta1": 0.9, "optimizer.beta2": 0.95, "optimizer.weight_decay": 0.1, "lr_scheduler.warmup_steps": 200,
            "lr_scheduler.decay_type": "linear", "lr_scheduler.min_lr_factor": 0.0}
"""torchtitan's defaults where they differ from fp8launch's (job_config.py): a file that leaves them out trains with these."""

TRAINING = {"local_batch_size": 8, "seq_len": 2048, "steps": 10000, "max_norm": 1.0}
"""torchtitan's [training] defaults (job_config.py Training): a file that leaves them out trains with these."""

LINEAR_FLOAT8 = ("float8", "quantize.linear.float8", "quantize.dense.float8")
LINEAR_MX = ("mx", "quantize.linear.mx", "quantize.dense.mx")
GROUPED_FLOAT8 = ("quantize.grouped_mm.float8", "quantize.moe.float8")
GROUPED_MX = ("quantize.grouped_mm.mx", "quantize.moe.mx")
CONVERTERS = LINEAR_FLOAT8 + LINEAR_MX + GROUPED_FLOAT8 + GROUPED_MX
"""Every converter name torchtitan registered (register_model_converter), by what it converts: every generation's."""

SECTIONS = {"float8": ("quantize.linear.float8", "quantize.dense.float8", "float8"),
            "mx": ("quantize.linear.mx", "quantize.dense.mx", "mx"),
            "grouped float8": ("quantize.grouped_mm.float8", "quantize.moe.float8"),
            "grouped mx": ("quantize.grouped_mm.mx", "quantize.moe.mx")}
"""The sections each kind of converter reads, newest first: the file's generation has one of them."""

EXPERTS = "*.moe.experts"
"""The grouped experts of fp8launch's MoE models (launcher/train/models/moe.py: GroupedExperts at layers.N.moe.experts)."""


def converters(d: Draft) -> list[str]:
    """model.converters as torchtitan reads it: a list, or a string split on commas."""
    raw = d.get("model.converters") or []
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list) else [raw]
    return [str(c).strip() for c in items if str(c).strip()]


def vet(d: Draft) -> list[Unknown]:
    """Keys and converter names no torchtitan generation has: refused, as torchtitan refuses them; only reported where a custom
    config module extends the job config."""
    custom = d.get("job.custom_config_module") or d.get("experimental.custom_args_module")
    says = ('torchtitan stops: ConfigManager raises "Invalid field names" (since 2025-08-28)' if not custom else
            f"read, if at all, by the custom config module {custom}")
    out = []
    for key, near in unknown(d.leaves, known.KEYS):
        table = any(k.startswith(key + ".") for k in d.leaves)
        out.append(Unknown(key, f"[{near}]" if near and table else near, says, refused=not custom, label=f"[{key}]" if table else "",
                           tool="torchtitan"))
    for name in converters(d):
        if name not in CONVERTERS:
            near = unknown([name], CONVERTERS)[0][1]
            out.append(Unknown("model.converters", f'"{near}"' if near else None, "torchtitan stops: no converter is registered under "
                               "that name (build_model_converters: KeyError)", refused=True, label=f'model.converters "{name}"',
                               tool="torchtitan"))
    return out


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
    d.group("fault_tolerance", "torchft: fp8launch restarts failed workers with torchrun (launch.max_restarts) and resumes from "
                               "checkpoints")
    d.group("experimental", "an experimental torchtitan extension")


def _model(d: Draft) -> None:
    name, flavor = str(d.get("model.name", "llama3")), str(d.get("model.flavor", "debugmodel"))
    builtin = FLAVORS.get((name, flavor))
    sources = tuple(k for k in ("model.name", "model.flavor") if d.has(k))
    if builtin in SAME_SHAPE_BUT:
        before, after, effect = SAME_SHAPE_BUT[builtin]
        d.approximated(sources, ("train.model", builtin), before=f"torchtitan's {name} {flavor}: {before}", after=f"{builtin}: {after}",
                       effect=effect)
    elif builtin:
        d.mapped(sources, ("train.model", builtin), note=f"torchtitan's {name} {flavor} shape")
    else:
        assets = str(d.get("model.hf_assets_path", "")).rstrip("/").rsplit("/", 1)[-1]
        also = (f"hf_assets_path names the Hugging Face model {assets}: its config.json alone is this shape "
                f"(huggingface-cli download OWNER/{assets} config.json --local-dir DIR)" if assets and assets != "tokenizer" else "")
        hub.model(d, sources or "(model.name, model.flavor)", f"torchtitan {name} {flavor}", shape_hint=f"{name} {flavor}", also=also)
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
            d.approximated(replicate, before=f"HSDP: {w['replicate']} replicas, each sharded over its own ranks",
                           after="FSDP2 sharded over every data-parallel rank", effect="less memory per GPU, more traffic between replicas")
        elif replicate:
            d.mapped(replicate, note="no replication")
    tp = _key(d, "parallelism.tensor_parallel_degree", "training.tensor_parallel_degree")
    if tp:
        d.mapped(tp, ("distributed.tensor_parallel", w["tp"]),
                 note="with sequence parallel, torchtitan's Llama plan" if w["tp"] > 1 else "")
    async_tp = _key(d, "parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel")
    if async_tp:
        d.mapped(async_tp, ("distributed.async_tp", bool(d.get(async_tp))))
    if d.has("parallelism.disable_loss_parallel"):
        d.none("parallelism.disable_loss_parallel", "fp8launch's tensor parallel gathers the logits and every TP rank computes the whole "
                                                    "loss")
    _pipeline(d, w["pp"])
    _context(d, w["cp"])
    ep = _key(d, "parallelism.expert_parallel_degree")
    if ep:
        d.mapped(ep, ("distributed.expert_parallel", w["ep"]))
    etp = _key(d, "parallelism.expert_tensor_parallel_degree")
    if etp:
        (d.mapped(etp, note="off") if int(d.get(etp)) == 1 else
         d.none(etp, "fp8launch does not split experts over tensor-parallel ranks (EP-TENSOR-PARALLEL)"))
    reshard = d.get("parallelism.fsdp_reshard_after_forward")
    # torchtitan's "default" (also when unset) reshards except under pipeline parallelism, where every micro-batch would
    # gather the weights again (torchtitan/distributed/parallel_dims + apply_fsdp)
    kept = w["pp"] > 1 and reshard in (None, "default")
    entry = None
    if reshard is not None:
        note = ('"default": ' + ("the weights kept gathered under pipeline parallel" if kept else
                                 "resharded after forward without pipeline parallel, as \"always\" does") if reshard == "default" else "")
        entry = d.mapped("parallelism.fsdp_reshard_after_forward", ("distributed.fsdp2.reshard_after_forward",
                                                                    reshard != "never" and not kept), note=note)
    elif kept:
        entry = d.mapped("(parallelism.fsdp_reshard_after_forward)", ("distributed.fsdp2.reshard_after_forward", False),
                         note='torchtitan\'s "default": the weights kept gathered under pipeline parallel')
    if kept and entry is not None:
        d.finishers.append(lambda d: _reshard_without_pipeline(d, entry))
    d.group("parallelism", "fp8launch has none of torchtitan's pipeline split and schedule tuning (split points, first / last "
                           "stage sizes, schedule CSVs); the rest are their schedules and tuning, or context parallel's options "
                           "without context parallelism")


def _reshard_without_pipeline(d: Draft, entry) -> None:
    """torchtitan's "default" keeps the weights gathered only under pipeline parallel: where a rule took the spec's pipeline
    away, the spec reshards, as torchtitan's "default" does without one, and the line says why (not the pipeline)."""
    if d.value("distributed.pipeline_parallel", 1) > 1 or d.value("distributed.strategy") != "fsdp2":
        return
    entry.sets = [(k, True if k == "distributed.fsdp2.reshard_after_forward" else v) for k, v in entry.sets]
    d.set("distributed.fsdp2.reshard_after_forward", True)
    entry.status = APPROXIMATED
    entry.before = 'the weights kept gathered from forward to backward (torchtitan\'s "default" under its pipeline)'
    entry.after = ('resharded after forward: the spec has no pipeline (see distributed.pipeline_parallel\'s line), and "default" '
                   'reshards without one')
    entry.note = "less memory for the weights, one more all-gather of each block's weights in backward"


def _context(d: Draft, cp: int) -> None:
    """torchtitan's context parallel degree and, where it is above 1, its rotation and load balancer (job_config.py
    Parallelism: "allgather" and "headtail" by default, torch's own defaults, which fp8launch runs)."""
    key = _key(d, "parallelism.context_parallel_degree", "experimental.context_parallel_degree")
    if not key:
        return
    if cp <= 1:
        d.mapped(key, note="off")
        return
    d.mapped(key, ("distributed.context_parallel", cp), note="torch's context_parallel, as torchtitan runs it: the mesh "
             "pp x dp_shard x cp x tp, FSDP2 over dp_shard x cp, each sequence's chunks load-balanced head and tail")
    rotate = _key(d, "parallelism.context_parallel_rotate_method", "experimental.context_parallel_rotate_method")
    if rotate:
        context.rotate_method(d, rotate, str(d.get(rotate)))
    balancer = _key(d, "parallelism.context_parallel_load_balancer")
    if balancer:
        name = str(d.get(balancer))
        if name == "headtail":
            d.mapped(balancer, note="torch's head-tail load balancer for causal SDPA, what fp8launch runs")
        else:
            d.approximated(balancer, before=f'the "{name}" load balancer' + (" (FlexAttention's)" if name == "ptrr" else ""),
                           after="head-tail (torch's default for causal SDPA; fp8launch's attention is SDPA)",
                           effect="the same attention; another split of the sequence over the ranks")


PP_SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble")
"""torchtitan's pipeline_parallel_schedule values that are distributed.pipeline.schedule values (torch's
get_schedule_class reads them case-insensitively)."""
PP_NEAREST = {"loopedbfs": "Interleaved1F1B", "interleavedzerobubble": "Interleaved1F1B", "dualpipev": "ZBVZeroBubble"}
"""torchtitan's other schedules -> the schedule of fp8launch's with the same stages a rank (a loop, or a V)."""


def _pipeline(d: Draft, pp: int) -> None:
    """torchtitan's pipeline degree, schedule and micro-batch size."""
    key = _key(d, "parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree")
    if not key:
        return
    if pp <= 1:
        d.mapped(key, note="off")
        return
    d.mapped(key, ("distributed.pipeline_parallel", pp), note="stages of torch.distributed.pipelining, FSDP2 over each stage's ranks")
    schedule = _key(d, "parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule")
    if schedule:
        name = str(d.get(schedule))
        known = {s.lower(): s for s in PP_SCHEDULES}
        if name.lower() in known:
            d.mapped(schedule, ("distributed.pipeline.schedule", known[name.lower()]))
        elif name.lower() in PP_NEAREST:
            nearest = PP_NEAREST[name.lower()]
            d.approximated(schedule, ("distributed.pipeline.schedule", nearest), before=f"{name} (torch.distributed.pipelining)",
                           after=f"{nearest}, the same stages on each rank", effect="another order of the same micro-batches "
                           "(another bubble and activation memory); the same numerics")
        else:
            d.approximated(schedule, before=f"{name} (torch.distributed.pipelining)", after="1F1B (Schedule1F1B), one stage per rank",
                           effect="a larger pipeline bubble than an interleaved or zero-bubble schedule; the same numerics")
    size_key = _key(d, "parallelism.pipeline_parallel_microbatch_size", "experimental.pipeline_parallel_microbatch_size")
    if size_key:
        size = int(d.get(size_key))
        if size == 1:
            d.mapped(size_key, note="one sequence per pipeline micro-batch, as distributed.pipeline.microbatches = 0")
        else:
            d.approximated(size_key, before=f"pipeline micro-batches of {size} sequences",
                           after="micro-batches of one sequence (distributed.pipeline.microbatches = 0)",
                           effect="more, smaller micro-batches: a smaller bubble, smaller GEMMs")


def _section(d: Draft, kind: str) -> str | None:
    return next((s for s in SECTIONS[kind] if d.has(s)), None)


def _float8(d: Draft) -> bool:
    """precision.* from the converters model.converters names and the sections they read; True when FP8 is on."""
    conv = converters(d)
    old = _key(d, "training.enable_float8_linear", "float8.enable_float8_linear")
    on = {"float8": any(c in LINEAR_FLOAT8 for c in conv) or (bool(old) and d.get(old) is True),
          "mx": any(c in LINEAR_MX for c in conv), "grouped float8": any(c in GROUPED_FLOAT8 for c in conv),
          "grouped mx": any(c in GROUPED_MX for c in conv)}
    if (on["float8"] or on["grouped float8"]) and (on["mx"] or on["grouped mx"]):
        raise SourceError(d.path, with_fix(f"model.converters = {shown(d.get('model.converters'))} mixes float8 and mx converters: "
                                           "torchtitan stops (\"Cannot combine model converters with different quantization types\")",
                                           "keep the float8 ones or the mx ones"))
    if d.has("model.converters"):
        what = [k for k, v in on.items() if v]
        written = d.get("model.converters")
        split = " (a string: torchtitan splits it on commas)" if isinstance(written, str) else ""
        d.mapped("model.converters", note=(f"FP8 on: {', '.join(what)}" if what else
                                           "no float8 / mx converter: FP8 off; the quantize sections below have no effect in the source "
                                           "either") + split)
    if old:
        d.mapped(old, note="FP8 on" if d.get(old) is True else "FP8 off")
    if not any(on.values()):
        for s in ("quantize", "float8", "mx"):
            d.group(s, "FP8 is off in the source (no float8 / mx converter): no effect")
        return False
    d.set("precision.mode", "fp8")
    d.set("precision.backend", "torchao")
    if on["mx"]:
        _mx(d, _section(d, "mx"))
    elif on["float8"]:
        _tensorwise(d, _section(d, "float8"), generation_2024=bool(old))
    _grouped(d, on)
    d.group("quantize", "a section of a converter model.converters does not name: no effect in the source either")
    for s in ("float8", "mx"):
        d.group(s, "a section of a converter model.converters does not name: no effect in the source either")
    return True


def _grouped(d: Draft, on: dict) -> None:
    """The MoE experts' grouped GEMMs: FP8 only with a grouped_mm / moe converter (or 2025's moe_fqns_prototype under float8 /
    mx), in fp8launch a [[precision.rules]] entry for the experts."""
    kind = "grouped mx" if on["grouped mx"] else "grouped float8" if on["grouped float8"] else None
    proto = next((k for k in ("float8.moe_fqns_prototype", "mx.moe_fqns_prototype") if d.has(k)
                  and on["mx" if k.startswith("mx") else "float8"]), None)
    section = _section(d, kind) if kind else None
    fqns_key = f"{section}.fqns" if section and d.has(f"{section}.fqns") else proto
    recipe = "mxfp8" if kind == "grouped mx" or (proto and proto.startswith("mx")) else "rowwise"
    model = str(d.value("train.model", ""))
    if (kind or proto) and model.startswith("builtin:") and not _is_moe(model.split("?")[0]):
        d.mapped(fqns_key or f"({kind})", value=d.get(fqns_key) if fqns_key else UNSET,
                 note=f"no effect: torchtitan's {d.get('model.name', 'llama3')} has no grouped experts to convert, nor does {model}")
        if section:
            d.group(section, "a torchtitan grouped-GEMM option: no effect without experts")
    elif kind or proto:
        fqns = d.get(fqns_key) if fqns_key else []
        fqns = fqns.split(",") if isinstance(fqns, str) else list(fqns or [])
        linear = on["float8"] or on["mx"]
        rules = [{"match": EXPERTS, "recipe": recipe}]
        sets = [("precision.rules", rules)]
        if not linear:
            sets += [("precision.torchao.recipe", recipe), ("precision.keep", ["*"]), ("precision.keep_first_last", False)]
        how = (f"torchtitan's {'MXFP8' if recipe == 'mxfp8' else 'float8 rowwise'} grouped GEMMs for the modules whose name "
               f"contains {', '.join(map(str, fqns)) or 'nothing'}; fp8launch's experts are {EXPERTS}")
        if not linear:
            how += "; no linear converter: every Linear stays bf16 (keep = [\"*\"])"
        d.mapped(fqns_key or f"({kind})", *sets, value=fqns, note=how)
        if section:
            d.group(section, "a torchtitan grouped-GEMM option fp8launch has no equivalent for")
    elif d.value("train.model", "").startswith("builtin:") and _is_moe(d.value("train.model")):
        d.mapped("(grouped experts)", ("precision.rules", [{"match": EXPERTS, "mode": "bf16"}]),
                 note="no grouped_mm converter: torchtitan's Linear converters leave the experts' grouped GEMMs in bf16, so does the spec")
    for s in SECTIONS["grouped float8"] + SECTIONS["grouped mx"]:
        if d.has(s) and s != section:
            d.group(s, "no converter in model.converters reads this section: no effect in the source either")


def _is_moe(model: str) -> bool:
    return model in ("builtin:moe-debug", "builtin:deepseek-v3-16b", "builtin:qwen3-30b-a3b")


def _filters(d: Draft, key: str | None, default: list[str]) -> None:
    """filter_fqns (substrings) -> precision.keep globs, keep_first_last false, skip_small."""
    raw = d.get(key) if key and d.has(key) else default
    fqns = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else [str(f) for f in raw]
    auto = AUTO_FILTER in fqns
    fqns = [f for f in fqns if f and f != AUTO_FILTER]
    source = key if key and d.has(key) else "(filter_fqns)"
    globs = [f"*{f}*" for f in fqns]
    sets = [("precision.keep_first_last", False), ("precision.torchao.skip_small", auto)] + ([("precision.keep", globs)] if globs else [])
    size = ("; auto_filter_small_kn is torchao's size heuristic: skip_small" if auto else
            "; no size heuristic: skip_small = false (dims not divisible by 16 stay high precision in both)")
    if globs:
        d.approximated(source, *sets, value=raw, before=f"every Linear whose name contains {', '.join(fqns)} stays high precision",
                       after=f"every Linear whose whole name matches {', '.join(globs)}",
                       effect="the same layers for fp8launch's module names (a glob *S* matches where S is a substring)" + size)
    else:
        d.mapped(source, *sets, value=raw, note="torchtitan converts every Linear whose name contains none of filter_fqns" + size)


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
                d.approximated(s + key, before=f"{d.get(s + key)} scaling", after="dynamic (tensorwise) scaling",
                               effect="torchao removed delayed scaling: the scale comes from each tensor's own amax, not a history")
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
        d.approximated(s + "recipe_name", *sets, before=f"torchao's {recipe}", after="torchao's mxfp8",
                       effect="fp8launch's torchao block recipes are mxfp8 and nvfp4: 8-bit elements with 32-value block scales")
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
            d.approximated(sources, ("compile.enabled", False), before="only the loss compiled", after="nothing compiled",
                           effect="fp8launch compiles the model's blocks or nothing: the loss runs eagerly, a little slower")
    elif d.has("training.compile"):
        d.mapped("training.compile", ("compile.enabled", bool(d.get("training.compile"))))
    d.group("compile", "the compile backend: fp8launch compiles with inductor")
    mode = d.get("activation_checkpoint.mode")
    if mode is not None:
        option = str(d.get("activation_checkpoint.selective_ac_option", "2"))
        sources = tuple(k for k in ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option") if d.has(k))
        if mode in ("full", "none"):
            d.mapped("activation_checkpoint.mode", ("activation_checkpointing.mode", mode))
            if d.has("activation_checkpoint.selective_ac_option"):
                d.mapped("activation_checkpoint.selective_ac_option", note=f"not read with mode {mode}")
        elif mode == "selective" and option == "2":
            d.mapped(sources, ("activation_checkpointing.mode", "selective"), note="every other block, as fp8launch's selective")
        else:
            d.approximated(sources, ("activation_checkpointing.mode", "selective"),
                           before=f"torchtitan's {'op-level' if option == 'op' else 'every ' + option + ' blocks'} selective checkpointing",
                           after="every other block recomputed",
                           effect="another trade of memory for recompute: the peak memory and the step time differ")
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
    if not micro:
        d.note_batch("micro", TRAINING["local_batch_size"], "(training.local_batch_size)")
    for key, target, conv in (("seq_len", "train.seq_len", int), ("steps", "train.steps", int), ("max_norm", "train.max_grad_norm", float),
                              ("seed", "train.seed", int)):
        if d.has(t + key):
            d.mapped(t + key, (target, conv(d.get(t + key))))
        elif key in TRAINING:
            d.mapped(f"({t}{key})", (target, TRAINING[key]), value=TRAINING[key], note="torchtitan's default")
    if d.has("debug.seed"):
        d.mapped("debug.seed", ("train.seed", int(d.get("debug.seed"))))
    if d.has(t + "enable_cpu_offload"):
        d.mapped(t + "enable_cpu_offload", ("distributed.fsdp2.cpu_offload", bool(d.get(t + "enable_cpu_offload"))))
    if d.has(t + "warmup_steps"):  # 2024: the warm-up lived in [training]
        _warmup(d)
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
        d.approximated(o + "name", ("train.optimizer", "adamw"), before=name, after="torch's AdamW",
                       effect=f"fp8launch has adamw, adam and sgd: another update rule than {name}'s")
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
             note=("" if d.has(o + "weight_decay") else "torchtitan's default; ") + "every parameter decays, norms and biases too, as in "
                                                                                     "torchtitan")
    if d.has(o + "implementation"):
        d.none(o + "implementation", "fp8launch uses torch's default implementation of the optimizer (foreach on CUDA)")
    d.group("optimizer", "a torchtitan optimizer option fp8launch has no equivalent for")


def _old_schedule(d: Draft) -> bool:
    """True where the file is of a generation before torchtitan's lr schedule was redefined (e7c0cae, 2025-06-11): the
    warm-up in [training] (2024), or training.batch_size without local_batch_size (renamed 2025-06-05, 8570415)."""
    return d.has("training.warmup_steps") or (d.has("training.batch_size") and not d.has("training.local_batch_size"))


def _warmup(d: Draft) -> None:
    """The warm-up as the file's torchtitan ran it. Before e7c0cae (2025-06-11; components/lr_scheduler.py at 78b0d60, and
    optimizer.py linear_warmup_linear_decay at b19456a) step s had lr x (s + 1) / (W + 1), with no clamp: fp8launch's
    warm-up (launcher/train/optim.py lr_factor), also where W > steps. Since then (238fa995 lines 114-121) W is clamped to
    the schedule's length (lr_scheduler.total_steps, else training.steps) and step s has lr x (s + 1) / W: the peak one step
    earlier than fp8launch's (s + 1) / (W + 1); the decay after it is the same (progress (s - W) / (steps - W) in both)."""
    s = "lr_scheduler."
    key = next((k for k in (s + "warmup_steps", "training.warmup_steps") if d.has(k)), None)
    warmup = int(d.get(key)) if key else DEFAULTS["lr_scheduler.warmup_steps"]
    source, note = (key, "") if key else ("(lr_scheduler.warmup_steps)", "torchtitan's default")
    steps = int(d.get("training.steps", TRAINING["steps"]))
    total = int(d.get(s + "total_steps")) if d.has(s + "total_steps") else steps
    if warmup == 0:
        d.mapped(source, ("train.warmup_steps", 0), value=0, note="no warm-up")
        return
    if _old_schedule(d):
        d.mapped(source, ("train.warmup_steps", warmup), value=warmup,
                 note=", ".join(x for x in (note, "torchtitan before 2025-06-11 (e7c0cae): lr x (s + 1) / (W + 1) at step s, "
                                                  "not clamped to the run, fp8launch's warm-up") if x))
        return
    if warmup >= total and total == steps:
        clamp = (f"torchtitan clamps warmup_steps {warmup} to the run's {steps} steps (components/lr_scheduler.py, since "
                 f"e7c0cae, 2025-06-11): " if warmup > total else "")
        d.mapped(source, ("train.warmup_steps", max(steps - 1, 0)), value=warmup,
                 note=f"{note + '; ' if note else ''}{clamp}lr x (s + 1) / {steps} at step s, the peak at the last step, no decay; "
                      f"fp8launch's (s + 1) / (warmup_steps + 1) with {max(steps - 1, 0)} gives the same lr at every step")
        return
    clamped = min(warmup, total)
    d.approximated(source, ("train.warmup_steps", clamped), value=warmup,
                   before=(f"{note + ': ' if note else ''}lr x (s + 1) / {clamped} at step s, the peak at step {clamped - 1} "
                           "(torchtitan since 2025-06-11, e7c0cae" + (f"; {warmup} clamped to lr_scheduler.total_steps {total}"
                                                                      if warmup > total else "") + ")"),
                   after=f"lr x (s + 1) / {clamped + 1}, the peak at step {clamped}",
                   effect=f"each warm-up step's lr is {clamped}/{clamped + 1} of torchtitan's ({100 / (clamped + 1):.2g}% lower), "
                          "the peak one step later; the decay after it the same")


def _schedule(d: Draft) -> None:
    s = "lr_scheduler."
    if not d.has("training.warmup_steps"):
        _warmup(d)
    decay = str(d.get(s + "decay_type", "linear"))
    source = s + "decay_type" if d.has(s + "decay_type") else "(lr_scheduler.decay_type)"
    floor = _key(d, s + "min_lr_factor", s + "lr_min")
    ratio = float(d.get(floor)) if floor else DEFAULTS["lr_scheduler.min_lr_factor"]
    if decay == "cosine":
        d.mapped(source, value=decay, note="fp8launch's decay is a cosine")
    else:
        default = "" if d.has(s + "decay_type") else " (torchtitan's default)"
        d.approximated(source, value=decay, before=f"a {decay} decay{default} to {ratio} x lr", after=f"a cosine decay to {ratio} x lr",
                       effect="the same start and end; the lr in between differs (a cosine stays higher through the first half)")
    d.mapped(floor or "(lr_scheduler.min_lr_factor)", ("train.min_lr_ratio", ratio), value=ratio,
             note="" if floor else "torchtitan's default: decays to 0")
    if d.has(s + "decay_ratio"):
        d.approximated(s + "decay_ratio", before=f"warmup-stable-decay: the lr held until the last {d.get(s + 'decay_ratio')} of the steps",
                       after="the decay spans every step after the warm-up", effect="a lower lr through the stable stretch")
    if d.has(s + "total_steps"):
        d.approximated(s + "total_steps", before=f"the schedule ends at {d.get(s + 'total_steps')} steps",
                       after="it ends at train.steps", effect="the decay is stretched or cut to the run's length")
    d.group("lr_scheduler", "a torchtitan lr-schedule option fp8launch has no equivalent for")


def _job(d: Draft) -> None:
    if d.has("job.dump_folder"):
        folder = str(d.get("job.dump_folder")).rstrip("/") or "."
        d.approximated("job.dump_folder", ("train.output_dir", f"{folder}/{{name}}"), before=f"every output in {folder}",
                       after=f"in {folder}/<spec name>", effect="each fp8launch run keeps a folder of its own in it")
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
            d.mapped(tuple(k for k in (c + "interval", c + "interval_type") if d.has(k)),
                     ("train.checkpoint_every", int(d.get(c + "interval"))))
        else:
            d.none((c + "interval", c + "interval_type"), "fp8launch checkpoints every N steps (train.checkpoint_every), not every N "
                                                          "seconds")
    if d.has(c + "keep_latest_k"):
        k = int(d.get(c + "keep_latest_k"))
        if k > 0:
            d.mapped(c + "keep_latest_k", ("train.keep_checkpoints", k))
        else:
            d.approximated(c + "keep_latest_k", ("train.keep_checkpoints", 1000), before="every checkpoint kept", after="the newest 1000",
                           effect="checkpoints older than the 1000th newest are deleted")
    if d.has(c + "folder"):
        d.approximated(c + "folder", before=f"checkpoints in <dump_folder>/{d.get(c + 'folder')}",
                       after="in <train.output_dir>/checkpoints", effect="another folder; the same checkpoints")
    if d.has(c + "initial_load_path"):
        d.mapped(c + "initial_load_path", ("train.resume", str(d.get(c + "initial_load_path"))))
    d.group("checkpoint", "fp8launch checkpoints the whole state with DCP (docs/checkpoints.md); `fp8launch export` writes model-only "
                          "files")


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
            score=lambda data: count(data, KEYS) + 2 * isinstance(data.get("job"), dict)
            if any(isinstance(data.get(k), dict) for k in ("training", "parallelism", "job", "quantize", "float8"))
            or count(data, ("model.converters",)) else 0,
            read=_read, name=lambda d: None, unknown=vet,
            other="a torchtitan setting fp8launch has no equivalent for")
