"""A DeepSpeed config JSON (https://www.deepspeed.ai/docs/config-json/), alone or as the file an Accelerate
config or an Axolotl YAML names. Read as DeepSpeed 0.19.8 reads it (deepspeed/runtime/config.py, constants.py):

- a missing section keeps DeepSpeed's default: no "scheduler" keeps the lr constant (SCHEDULER_TYPE_DEFAULT None:
  engine._configure_lr_scheduler builds none); no "gradient_clipping" clips at 1.0 (GRADIENT_CLIPPING_DEFAULT);
  no "optimizer" steps the training script's own (client) optimizer;
- optimizer type "Adam" steps as AdamW unless adam_w_mode is false (ADAM_W_MODE_DEFAULT, engine.py
  _configure_basic_optimizer); WarmupLR's warmup_type defaults to "log" (lr_schedules.py);
- "auto" values are dropped before validation (DeepSpeedConfigModel.__init__): the Hugging Face Trainer or
  Accelerate fills them from its own arguments first; read alone, the file says nothing there, and each "auto"
  line says the value the spec uses;
- train_batch_size fixes the global batch: DeepSpeed asserts train_batch_size = micro x accum x world size.
"""

from __future__ import annotations

import os

from launcher.planning import bounded

from . import hub
from .draft import Draft
from .kind import Kind, count
from .known import Unknown, unknown
from .known import deepspeed as known
from .report import shown

PREFIX = "[DeepSpeed JSON]"
"""Where a DeepSpeed file named by another config is put in that config's data (a key no config has)."""

FP16_SCALING = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
"""The dynamic loss scaling fp8launch's deepspeed.json writes (templates/deepspeed.json.j2)."""

OTHER = "fp8launch's deepspeed.json leaves it at DeepSpeed's default (templates/deepspeed.json.j2 writes the keys fp8launch sets)"

AUTO = {
    "train_batch_size": "distributed.global_batch_size", "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.grad_accum_steps", "gradient_clipping": "train.max_grad_norm",
    "bf16.enabled": "precision.mode", "fp16.enabled": "precision.mode", "optimizer.params.lr": "train.lr",
    "optimizer.params.betas": "train.adam_betas", "optimizer.params.eps": "train.adam_eps",
    "optimizer.params.weight_decay": "train.weight_decay", "scheduler.params.warmup_num_steps": "train.warmup_steps",
    "scheduler.params.total_num_steps": "train.steps", "scheduler.params.warmup_max_lr": "train.lr",
    "zero_optimization.reduce_bucket_size": "distributed.deepspeed.reduce_bucket_size",
}
"""A key that may be "auto" -> the spec key whose value fp8launch uses in its place."""

HIDDEN = "the Hugging Face Trainer would derive it from the model's hidden size"
DEEPSPEED_DEFAULTS = {
    "zero_optimization.stage3_prefetch_bucket_size": (50_000_000, HIDDEN),
    "zero_optimization.stage3_param_persistence_threshold": (100_000, HIDDEN),
    "zero_optimization.stage3_max_live_parameters": (1_000_000_000, HIDDEN),
    "zero_optimization.stage3_max_reuse_distance": (1_000_000_000, HIDDEN),
    "zero_optimization.allgather_bucket_size": (500_000_000, HIDDEN),
    "scheduler.params.warmup_min_lr": (0, "the Hugging Face Trainer sets 0 too"),
}
"""DeepSpeed 0.19.8's defaults (DeepSpeedZeroConfig, lr_schedules.py) of keys fp8launch's deepspeed.json does not write:
an "auto" there runs with them (tests/test_import.py reads them from the installed DeepSpeed)."""


def attach(draft: Draft, source: str, base: str) -> bool:
    """Load the DeepSpeed JSON that `source` (a key of the draft's config) names into the draft under PREFIX, so its
    settings are read and reported like the config's own; False (reported) when it cannot be read."""
    name = draft.get(source)
    candidates = [name] if os.path.isabs(name) else [os.path.join(base, name), name]
    for path in candidates:
        try:
            data = bounded.loads_json(bounded.read_bytes(path, bounded.CONFIG_BYTES).decode("utf-8"), max_depth=64)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            draft.follow(PREFIX, data)
            draft.ignore(vet(draft, PREFIX + "."))
            draft.mapped(source, ("distributed.strategy", "deepspeed"), note=f"its settings are read below as {PREFIX}.*")
            return True
    draft.none(source, "cannot read this DeepSpeed JSON (looked beside the config and in the current folder): its settings are not "
                       'imported; distributed.strategy = "deepspeed" with fp8launch\'s defaults', ("distributed.strategy", "deepspeed"))
    return False


def vet(d: Draft, p: str = "") -> list[Unknown]:
    """The keys under `p` DeepSpeed 0.19.8 does not read: refused inside the sections it validates strictly, where it
    stops at initialize(); reported at the top level, where it ignores them."""
    keys = [k[len(p):] for k in d.leaves if k.startswith(p)]
    strict = {f"{s}.{k}" for s, names in known.STRICT.items() for k in names}
    out = [Unknown(p + key, None, f"DeepSpeed 0.19 removed {what} and refuses a config that sets it (DeepSpeedConfigError): "
                   "delete it", refused=True, tool="DeepSpeed 0.19")
           for key, what in known.REMOVED.items() if key in keys or any(k.startswith(key + ".") for k in keys)]
    for key, near in unknown(keys, set(known.TOP) | set(known.WORLD) | strict):
        refused = "." in key
        says = ("DeepSpeed stops at initialize(): its pydantic section forbids unknown keys (\"Extra inputs are not permitted\")"
                if refused else "DeepSpeed reads only the keys it knows and ignores it")
        out.append(Unknown(p + key, p + near if near else None, says, refused=refused, tool="DeepSpeed 0.19"))
    return out


def read_config(d: Draft, p: str = "", parent: str = "") -> None:
    """Map the DeepSpeed settings under `p` ("" for a DeepSpeed JSON read alone, PREFIX + "." inside another config).
    `parent` names the config whose own keys fill the "auto" values."""
    def auto(key: str) -> bool:
        if d.get(p + key) != "auto":
            return False
        if key in AUTO:
            d.auto(p + key, AUTO[key], f'"auto": {parent} fills it in' if parent else
                   '"auto": the Hugging Face Trainer or Accelerate fills it in from its own arguments; read alone it says nothing')
        else:
            default, hf = DEEPSPEED_DEFAULTS.get(key, ("value", "the Hugging Face Trainer fills it from its own arguments"))
            d.none(p + key, f'"auto" where fp8launch\'s deepspeed.json writes nothing: DeepSpeed drops "auto" and runs with its '
                            f"default {shown(default)} ({hf})")
        return True

    z = p + "zero_optimization."
    if d.has(z + "stage") and not auto("zero_optimization.stage"):
        d.mapped(z + "stage", ("distributed.deepspeed.zero_stage", int(d.get(z + "stage"))))
    elif not d.has(z + "stage"):
        d.mapped(f"({z}stage)", ("distributed.deepspeed.zero_stage", 0), value=0,
                 note="DeepSpeed's default (DeepSpeedZeroConfig.stage): no ZeRO partitioning")
    for part in ("optimizer", "param"):
        device = d.get(f"{z}offload_{part}.device")
        if device is not None:
            d.mapped(f"{z}offload_{part}.device",
                     (f"distributed.deepspeed.offload_{part}", device if device in ("cpu", "nvme") else "none"))
        if d.has(f"{z}offload_{part}.nvme_path"):
            d.mapped(f"{z}offload_{part}.nvme_path", ("distributed.deepspeed.nvme_path", str(d.get(f"{z}offload_{part}.nvme_path"))))
        pin = d.get(f"{z}offload_{part}.pin_memory")
        if pin is True:
            d.mapped(f"{z}offload_{part}.pin_memory", note="fp8launch's deepspeed.json pins offloaded memory too")
        elif pin is False:
            d.approximated(f"{z}offload_{part}.pin_memory", before="offloaded memory is pageable", after="pinned",
                           effect="fp8launch's deepspeed.json always pins offloaded memory: faster copies, more locked host memory")
    if d.get(z + "cpu_offload") is True:  # ZeRO-Offload's key before offload_optimizer (DeepSpeed < 0.3.15)
        d.mapped(z + "cpu_offload", ("distributed.deepspeed.offload_optimizer", "cpu"))
    for key in ("overlap_comm", "contiguous_gradients"):
        if d.has(z + key) and not auto(f"zero_optimization.{key}"):
            d.mapped(z + key, (f"distributed.deepspeed.{key}", bool(d.get(z + key))))
    if d.has(z + "reduce_bucket_size") and not auto("zero_optimization.reduce_bucket_size"):
        d.mapped(z + "reduce_bucket_size", ("distributed.deepspeed.reduce_bucket_size", int(d.get(z + "reduce_bucket_size"))))
    for key in [k[len(z):] for k in d.untaken(z[:-1]) if d.get(k) == "auto"]:
        auto("zero_optimization." + key)
    d.group(z + "zenflow", "ZenFlow (DeepSpeed's stall-free offload: the top-k gradients applied on the GPU every "
                                             "step, the rest on the CPU every update_interval steps): fp8launch's CPU offload "
                                             "(deepspeed.offload_optimizer) updates every parameter every step")
    d.group(z[:-1], OTHER)

    _precision(d, p, auto, parent)
    _autotp(d, p)
    _sequence_parallel(d, p)
    d.group(p + "data_efficiency", "DeepSpeed's data efficiency (random-LTD: tokens dropped in middle layers; curriculum: "
                                   "sequences lengthened over the run) needs the script's model and data code: fp8launch trains "
                                   "every token through every layer at train.seq_len from the first step")
    _batch(d, p, auto)
    if d.has(p + "gradient_clipping") and not auto("gradient_clipping"):
        d.mapped(p + "gradient_clipping", ("train.max_grad_norm", float(d.get(p + "gradient_clipping"))))
    elif not parent and not d.has(p + "gradient_clipping"):
        d.mapped("(gradient_clipping)", ("train.max_grad_norm", 1.0), value=1.0,
                 note="DeepSpeed 0.19's default (GRADIENT_CLIPPING_DEFAULT)")
    _optimizer(d, p, auto, parent)
    _scheduler(d, p, auto, parent)
    for tracker in ("tensorboard", "wandb"):
        if d.get(f"{p}{tracker}.enabled") is True:
            project = d.get(f"{p}{tracker}.project") if tracker == "wandb" else None
            value = {"project": str(project)} if project else True
            d.mapped((f"{p}{tracker}.enabled", f"{p}{tracker}.project") if project else f"{p}{tracker}.enabled", (f"log.{tracker}", value))
            d.group(f"{p}{tracker}", f"fp8launch's [log] {tracker} chooses its own folder and run name")
    d.group(p + "activation_checkpointing", "DeepSpeed's activation checkpointing is called from the model's code; fp8launch checkpoints "
                                           "whole blocks itself: activation_checkpointing.mode")
    for key in ("steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"):
        if d.has(p + key):
            d.mapped(p + key, note="fp8launch's deepspeed.json sets it itself")


def _precision(d: Draft, p: str, auto, parent: str) -> None:
    if d.get(p + "msamp.enabled") is True:
        level = d.get(p + "msamp.opt_level", "O1")
        d.mapped((p + "msamp.enabled", p + "msamp.opt_level") if d.has(p + "msamp.opt_level") else p + "msamp.enabled",
                 ("precision.mode", "fp8"), ("precision.backend", "msamp"), ("precision.msamp.opt_level", level),
                 note="MS-AMP's DeepSpeed integration" + ("" if d.has(p + "msamp.opt_level") else " (opt_level defaults to O1)"))
        if d.has(p + "msamp.use_te"):
            d.mapped(p + "msamp.use_te", ("precision.msamp.use_te", bool(d.get(p + "msamp.use_te"))))
    fp8 = d.value("precision.mode") == "fp8"
    dtype = None
    for name in ("bf16", "fp16"):
        key = f"{p}{name}.enabled"
        if d.has(key) and not auto(f"{name}.enabled"):
            if d.get(key) is True:
                dtype = name
                d.mapped(key, ("precision.high_precision" if fp8 else "precision.mode", name))
            else:
                d.mapped(key, note=f"{name} off")
    if dtype is None and not parent and not fp8 and not any(d.get(f"{p}{n}.enabled") == "auto" for n in ("bf16", "fp16")):
        d.mapped("(precision)", ("precision.mode", "fp32"), note="neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32")
    for key, value in FP16_SCALING.items():
        if d.has(f"{p}fp16.{key}"):
            if dtype != "fp16":
                d.none(f"{p}fp16.{key}", "fp16 is off: no loss scaling")
            elif _num(d.get(f"{p}fp16.{key}")) == value:
                d.mapped(f"{p}fp16.{key}", note="fp8launch's deepspeed.json writes the same")
            else:
                d.approximated(f"{p}fp16.{key}", before=f"{key} = {shown(d.get(f'{p}fp16.{key}'))}", after=f"{key} = {value}",
                               effect="fp8launch's deepspeed.json writes its own dynamic loss scaling: the scale moves differently")
    levels = (("bf16_master_weights_and_grads", "precision.master_weights"), ("bf16_optimizer_states", "precision.optimizer_states"))
    for key, target in levels:
        if d.get(f"{p}bf16.{key}") is True and dtype == "bf16":
            d.mapped(f"{p}bf16.{key}", (target, "bf16"), note="bf16 " + ("weights without an fp32 copy" if "master" in key else "moments"))
    for name in ("bf16", "fp16"):
        d.group(p + name, "fp8launch keeps fp32 master weights, gradients and optimizer states under DeepSpeed")
    d.group(p + "torch_autocast", "fp8launch runs the model in precision.high_precision itself (no DeepSpeed autocast)")
    d.group(p + "amp", "NVIDIA apex amp: fp8launch uses torch's own mixed precision (precision.mode)")
    d.group(p + "msamp", "MS-AMP's DeepSpeed section: fp8launch writes it from precision.msamp")


def _split_degree(d: Draft, key: str, target: str, before: str, after: str, effect: str) -> None:
    """A DeepSpeed degree that splits each rank's work over `size` ranks (1: off) -> the spec's `target` degree."""
    if not d.has(key):
        return
    size = int(d.get(key))
    if size <= 1:
        d.mapped(key, note="off")
        return
    d.approximated(key, (target, size), before=before.format(size=size), after=after.format(size=size),
                   effect=effect.format(size=size))


def _autotp(d: Draft, p: str) -> None:
    """DeepSpeed's AutoTP (tensor_parallel.autotp_size, DeepSpeed 0.19.8 engine.py: _configure_tensor_parallel at line 595,
    mpu._init_tp_mesh_device at 958): each Linear's weights sharded over autotp_size ranks, the data-parallel world (and so
    train_batch_size's) world / autotp_size. fp8launch's tensor_parallel is the same split of the weights over the same ranks."""
    _split_degree(d, p + "tensor_parallel.autotp_size", "distributed.tensor_parallel",
                  before="DeepSpeed AutoTP: each Linear's weights split over {size} ranks (column / row, its automatic plan), the "
                         "activations between blocks whole on each rank",
                  after="distributed.tensor_parallel = {size}: torch's tensor parallel plan with sequence parallel",
                  effect="the same split of the weights over {size} ranks and the same data-parallel ranks (world / {size}); "
                         "sequence parallel also splits the activations between blocks, less memory")


def _sequence_parallel(d: Draft, p: str) -> None:
    """sequence_parallel_size (DeepSpeed's Ulysses: each sequence split over that many ranks, attention's heads exchanged
    all-to-all; DeepSpeed 0.19.8 runtime/config.py 468 counts world / sequence_parallel_size data-parallel ranks)."""
    _split_degree(d, p + "sequence_parallel_size", "distributed.context_parallel",
                  before="DeepSpeed Ulysses: each sequence split over {size} ranks, the attention heads exchanged all-to-all",
                  after="distributed.context_parallel = {size}: torch's context parallel (ring attention over the same split)",
                  effect="the same split of each sequence over {size} ranks and the same data-parallel ranks (world / {size}); "
                         "another attention communication, the same numerics up to rounding")


def _num(value):
    """A number as DeepSpeed reads it (5e8 in JSON is a float; "auto" and strings stay as they are)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _batch(d: Draft, p: str, auto) -> None:
    for key, attr in (("train_micro_batch_size_per_gpu", "micro"), ("gradient_accumulation_steps", "accum"),
                      ("train_batch_size", "global_")):
        if d.has(p + key) and not auto(key):
            d.note_batch(attr, d.get(p + key), p + key)


def _optimizer(d: Draft, p: str, auto, parent: str) -> None:
    o = p + "optimizer."
    kind = d.get(o + "type")
    if kind is None and not parent:
        d.none("(optimizer)", 'no "optimizer" section: DeepSpeed steps the optimizer the training script passes to deepspeed.initialize; '
                              f"the spec uses fp8launch's {d.used('train.optimizer')} with lr {shown(d.used('train.lr'))}: set "
                              "train.optimizer and train.lr to the script's")
    if kind is not None:
        adam_w = d.get(o + "params.adam_w_mode", True)
        sources = (o + "type", o + "params.adam_w_mode") if d.has(o + "params.adam_w_mode") else o + "type"
        if str(kind).lower() == "adamw" or (str(kind).lower() == "adam" and adam_w):
            d.mapped(sources, ("train.optimizer", "adamw"),
                     note="" if str(kind).lower() == "adamw" else "DeepSpeed steps type Adam as AdamW unless adam_w_mode is false")
        elif str(kind).lower() == "adam":
            d.mapped(sources, ("train.optimizer", "adam"))
        else:
            d.approximated(sources, ("train.optimizer", "adamw"), before=f"DeepSpeed's {kind}", after="torch's AdamW",
                           effect=f"fp8launch has adamw, adam and sgd: AdamW is the nearest to {kind}; its update rule differs")
    for key, target, conv in (("lr", "train.lr", float), ("weight_decay", "train.weight_decay", float),
                              ("eps", "train.adam_eps", float), ("betas", "train.adam_betas", lambda v: [float(x) for x in v])):
        if d.has(o + "params." + key) and not auto("optimizer.params." + key):
            d.mapped(o + "params." + key, (target, conv(d.get(o + "params." + key))))
    if d.has(o + "params.torch_adam"):
        d.mapped(o + "params.torch_adam", note="fp8launch builds torch's optimizer itself (DeepSpeed's CPU Adam with offload)")
    if d.get(o + "params.bias_correction") is False:
        d.approximated(o + "params.bias_correction", before="Adam without bias correction", after="with bias correction (torch's)",
                       effect="the first steps' updates are larger than the source's (uncorrected moments start near 0)")
    d.group(p + "optimizer", "fp8launch's optimizers take lr, betas, eps and weight_decay only")


def _scheduler(d: Draft, p: str, auto, parent: str) -> None:
    s = p + "scheduler."
    kind = d.get(s + "type")
    if kind is None:
        if not parent:
            _no_scheduler(d, p, auto)
        return
    params = s + "params."
    if d.has(params + "warmup_num_steps") and not auto("scheduler.params.warmup_num_steps"):
        d.mapped(params + "warmup_num_steps", ("train.warmup_steps", int(d.get(params + "warmup_num_steps"))))
    if d.has(params + "total_num_steps") and not auto("scheduler.params.total_num_steps"):
        d.mapped(params + "total_num_steps", ("train.steps", int(d.get(params + "total_num_steps"))))
    if d.has(params + "warmup_max_lr") and not auto("scheduler.params.warmup_max_lr") and not d.value("train.lr"):
        d.mapped(params + "warmup_max_lr", ("train.lr", float(d.get(params + "warmup_max_lr"))))
    for key in ("warmup_min_lr", "warmup_min_ratio"):
        if d.has(params + key) and not auto("scheduler.params." + key):
            if float(d.get(params + key)) == 0:
                d.mapped(params + key, note="fp8launch's warm-up starts near 0 as well")
            else:
                d.approximated(params + key, before=f"the warm-up starts at {key} = {shown(d.get(params + key))}",
                               after="at lr / (warmup_steps + 1)", effect="a lower lr in the first warm-up steps")
    warmup = d.get(params + "warmup_type", "log")
    if warmup == "linear":
        d.mapped(params + "warmup_type")
    elif kind in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        default = "" if d.has(params + "warmup_type") else " (its default)"
        d.approximated(params + "warmup_type" if d.has(params + "warmup_type") else f"({params}warmup_type)", value=warmup,
                       before=f"DeepSpeed's {warmup} warm-up{default}", after="a linear warm-up",
                       effect="a log warm-up rises fast and flattens; a linear one gives a lower lr early in the warm-up")
    if kind == "WarmupLR":
        d.mapped(s + "type", ("train.min_lr_ratio", 1.0), note="WarmupLR holds lr after the warm-up")
    elif kind == "WarmupCosineLR":
        ratio = d.get(params + "cos_min_ratio", 0.0001)
        d.mapped((s + "type", params + "cos_min_ratio") if d.has(params + "cos_min_ratio") else s + "type",
                 ("train.min_lr_ratio", float(ratio)),
                 note="cosine decay to cos_min_ratio x lr" + ("" if d.has(params + "cos_min_ratio") else " (DeepSpeed's default 0.0001)"))
    elif kind == "WarmupDecayLR":
        d.approximated(s + "type", ("train.min_lr_ratio", 0.0), before="a linear decay to 0 after the warm-up",
                       after="a cosine decay to 0", effect="the same start and end, a higher lr through the middle of the run")
    else:
        d.none(s + "type", f"fp8launch's schedule is a linear warm-up and a cosine decay (train.warmup_steps, train.min_lr_ratio); "
                           f"{kind} has no equivalent: the spec decays to {shown(d.used('train.min_lr_ratio'))} x lr, set yours")
    for key in [k[len(params):] for k in d.untaken(params[:-1]) if d.get(k) == "auto"]:
        auto("scheduler.params." + key)
    d.group(p + "scheduler", "fp8launch's schedule has warmup_steps, steps and min_lr_ratio only")


def _no_scheduler(d: Draft, p: str, auto) -> None:
    """No "scheduler" section, the JSON read alone. DeepSpeed 0.19.8 steps the lr_scheduler the script passes to
    deepspeed.initialize, and builds one from the JSON only where the script passes none (engine.py _configure_lr_scheduler,
    lines 1883-1895): without a "scheduler" section, none, so the lr stays constant. The HF Trainer always passes its own
    (transformers 5.23 integrations/deepspeed.py deepspeed_optim_sched: with no "scheduler", trainer.create_scheduler,
    lr_scheduler_type "linear" by default). So the lr is DeepSpeed's constant only where the JSON holds the optimizer and its lr
    (the deepspeed launcher running a script that hands DeepSpeed its model alone); else the schedule is the script's."""
    lr = p + "optimizer.params.lr"
    if d.has(lr) and not auto("optimizer.params.lr"):
        d.mapped("(scheduler)", ("train.warmup_steps", 0), ("train.min_lr_ratio", 1.0),
                 note='no "scheduler" section beside an "optimizer" with its lr: DeepSpeed builds no scheduler (engine.py '
                      "_configure_lr_scheduler) and the lr stays constant, so does the spec; a script passing its own lr_scheduler to "
                      "deepspeed.initialize (the HF Trainer does) decides it instead: then set train.warmup_steps and min_lr_ratio")
        return
    warmup, ratio = d.used("train.warmup_steps"), d.used("train.min_lr_ratio")
    instead = ("your script's schedule: train.warmup_steps and train.min_lr_ratio (the HF Trainer's default is linear with no "
               "warm-up to 0: warmup_steps = 0, min_lr_ratio = 0.0)")
    d.placeholders["train.warmup_steps"] = instead
    d.placeholders["train.min_lr_ratio"] = instead
    d.none("(scheduler)", 'no "scheduler" section, and the optimizer and its lr are not in this file: the training script passes '
                          "its own optimizer and lr_scheduler to deepspeed.initialize (the HF Trainer does, with its own "
                          "lr_scheduler_type, linear by default), and DeepSpeed steps that one; "
                          f"train.warmup_steps = {warmup}, train.min_lr_ratio = {shown(ratio)} (fp8launch's defaults) are "
                          "PLACEHOLDERs", ("train.warmup_steps", warmup), ("train.min_lr_ratio", ratio))


def world_from_batch(d: Draft) -> None:
    """A DeepSpeed JSON read alone: its train_batch_size = micro x accum x world says the world size."""
    b = d.batch
    why = "the deepspeed launcher's --num_gpus / --num_nodes set the world size, not this file"
    # AutoTP and Ulysses: train_batch_size counts world / (autotp_size x sequence_parallel_size) ranks
    tp = int(d.value("distributed.tensor_parallel", 1)) * int(d.value("distributed.context_parallel", 1))
    if b.micro and b.accum and b.global_ and b.global_ % (b.micro * b.accum) == 0:
        world = b.global_ // (b.micro * b.accum) * tp
        nodes, procs = (1, world) if world <= 8 else (world // 8, 8) if world % 8 == 0 else (1, world)
        d.mapped("(world size)", ("distributed.nodes", nodes), ("distributed.procs_per_node", procs),
                 note=f"train_batch_size / (train_micro_batch_size_per_gpu x gradient_accumulation_steps) = {world // tp} "
                      + (f"data-parallel ranks x {tp} (autotp_size x sequence_parallel_size) = {world} processes" if tp > 1
                         else "processes"))
    elif b.micro and b.global_ and not b.accum and b.global_ % b.micro == 0:
        # DeepSpeed derives the accumulation: train_batch_size / (micro x world); the placeholder world keeps it whole
        procs = max(n for n in range(1, 9) if (b.global_ // b.micro) % n == 0)
        d.world_unknown(f"{why}; {procs} processes keep train_batch_size {b.global_} whole (micro {b.micro} x accumulation "
                        f"{b.global_ // b.micro // procs} x {procs})", procs=procs)
    else:
        d.world_unknown(why)


def _read(d: Draft) -> None:
    d.mapped("(DeepSpeed JSON)", ("distributed.strategy", "deepspeed"))
    read_config(d)
    world_from_batch(d)
    hub.script(d, "a DeepSpeed config", optimizer=False)


KEYS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps",
        "gradient_clipping", "fp16", "bf16", "optimizer", "scheduler", "steps_per_print", "wall_clock_breakdown",
        "zero_allow_untested_optimizer")

KIND = Kind(
    id="deepspeed", title="DeepSpeed JSON",
    score=lambda data: count(data, KEYS) if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data
    or "train_batch_size" in data else 0,
    read=_read, name=lambda d: None, other=OTHER, unknown=vet)
