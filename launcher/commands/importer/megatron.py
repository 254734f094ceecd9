"""A NeMo 1.x (Hydra, e.g. NeMo-Framework-Launcher conf/training/*.yaml, NeMo's megatron_gpt_config.yaml) or
Megatron-Bridge (ConfigContainer.to_yaml / override YAML: train, model, optimizer, scheduler, dataset,
checkpoint, rng, ddp, mixed_precision) config. Both run Megatron-Core with Transformer Engine's FP8:

- FP8 keys, wherever they sit (top level, model:, trainer:, mixed_precision:): fp8 (a bool, or the format
  "hybrid" / "e4m3"), fp8_e4m3 / fp8_hybrid (NeMo 1.x), fp8_recipe ("delayed", "tensorwise" = TE's
  Float8CurrentScaling, "mxfp8", "blockwise"; NeMo 1.x has none: delayed), fp8_margin, fp8_interval,
  fp8_amax_history_len, fp8_amax_compute_algo, reduce_amax, fp8_params / fp8_param / fp8_param_gather,
  first_last_layers_bf16 with num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 (Megatron-Bridge
  src/megatron/bridge/training/mixed_precision.py, whose named recipes are expanded by PRESETS).
- Megatron-Core runs only the transformer layers under FP8 autocast: the output layer stays bf16.
- Megatron's Adam is decoupled (AdamW); its distributed optimizer shards the optimizer states over the
  data-parallel ranks, as ZeRO-1 does; it skips weight decay for 1-D parameters and biases
  (megatron/core/optimizer/__init__.py), as NeMo 1.x does unless do_layer_norm_weight_decay.
"""

from __future__ import annotations

import re

from launcher.planning.backends import named
from launcher.planning.memory import model_params
from launcher.planning.models import parse_builtin

from . import hub, megatron_data, megatron_optimizer, megatron_recompute
from .draft import Draft
from .kind import Kind, count
from .known import Unknown, unknown
from .report import MAPPED, Entry

PRESETS = {
    "bf16_mixed": {"bf16": True},
    "fp16_mixed": {"fp16": True},
    "bf16_with_fp8_delayed_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_margin": 0,
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max", "fp8_param_gather": True},
    "bf16_with_fp8_current_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
                                            "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "bf16_with_mxfp8_mixed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False},
}
"""Megatron-Bridge's named mixed-precision recipes (mixed_precision.py, 2026-08) -> the MixedPrecisionConfig fields they set."""

RECIPES = {"delayed": "delayed", "tensorwise": "current", "mxfp8": "mxfp8", "blockwise": "block"}
"""Megatron's fp8_recipe -> precision.te.recipe."""

ARCHITECTURE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size",
                "max_position_embeddings", "normalization", "activation", "activation_func", "gated_linear_unit", "position_embedding_type",
                "rotary_base", "rotary_percentage", "share_embeddings_and_output_weights", "add_bias_linear", "bias", "layernorm_epsilon",
                "init_method_std", "hidden_dropout", "attention_dropout", "ffn_dropout", "make_vocab_size_divisible_by", "num_moe_experts",
                "moe_router_topk", "seq_len_interpolation_factor", "apply_query_key_layer_scaling", "use_scaled_init_method",
                "transformer_block_type", "headscale", "openai_gelu", "normalize_attention_scores", "attention_type",
                "untie_embeddings_and_output_weights")

SHAPES = {
    "builtin:llama3-8b": dict(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8),
    "builtin:llama3-70b": dict(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_query_groups=8),
    "builtin:llama3-1b": dict(num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32, num_query_groups=8),
}
"""Builtin Llama shapes in Megatron's words (launcher/planning/models.py)."""


def _at(d: Draft, key: str) -> str | None:
    """Where `key` is: mixed_precision. (Megatron-Bridge copies it onto the model at run time), top level, model., trainer."""
    return next((p for p in (f"mixed_precision.{key}", key, f"model.{key}", f"trainer.{key}") if d.has(p)), None)


def _get(d: Draft, key: str, default=None):
    where = _at(d, key)
    return d.get(where) if where else default


def _read(d: Draft) -> None:
    targets = [k for k in d.leaves if k.rsplit(".", 1)[-1] in ("_target_", "_call_", "_partial_")]
    if targets:  # ConfigContainer.to_yaml names the class of each table: not settings
        d.taken.update(targets)
        d.report.add(Entry(source="*._target_", status=MAPPED, value=f"{len(targets)} entries",
                           note="the Python classes Megatron-Bridge's YAML names for its tables: nothing to set"))
    name = _name(d)
    if name:
        chosen = next(k for k in NAMES if d.get(k) == name)
        d.mapped(chosen, note="the spec's name")
        for other in NAMES:
            if other != chosen and d.has(other):
                d.mapped(other, note=f"the spec is named after {chosen}")
    for key in NAMES:  # a name Hydra interpolates at launch (NeMo: `name: run-${peft.peft_scheme}`): no string the import can use
        if "${" in str(d.get(key, "")) and key not in d.taken:
            d.none(key, "a run name written as a Hydra interpolation (${...}), which only NeMo's launch resolves: the spec is named "
                        "after the file; change the spec's name (its first lines) to rename it")
    _override(d)
    preset = _preset(d)
    fp8 = _fp8(d, preset)
    _half(d, fp8, preset)
    _world(d)
    _strategy(d)
    _batch_and_steps(d)
    _optimizer(d)
    megatron_optimizer.rerun(d)
    _schedule(d)
    _model(d)
    _experts(d, fp8)
    _data(d)
    _recompute(d)
    _checkpoint_and_logs(d)


def _experts(d: Draft, fp8: bool) -> None:
    """An MoE's experts under FP8: Megatron-Core runs them as Transformer Engine GroupedLinear (TEGroupedMLP) inside its fp8
    autocast, so in FP8; fp8launch's TE backend converts nn.Linear only (rule MOE-EXPERTS-HP): the spec says bf16 for them."""
    experts = int(_get(d, "num_moe_experts") or 0)
    backend = named(d.value("precision.backend"))
    if not fp8 or experts <= 1 or backend is None or backend.grouped_experts:
        return
    d.approximated("(grouped experts)", ("precision.rules", [{"match": "*.moe.experts", "mode": "bf16"}]),
                   before=f"the {experts} experts' GEMMs in FP8 (Transformer Engine GroupedLinear in Megatron-Core's TEGroupedMLP)",
                   after=f"the experts in bf16, every other Linear in FP8 (fp8launch's {backend.name} backend converts nn.Linear only)",
                   effect="most of an MoE's FLOPs run in bf16: slower than the source, the experts' numerics are bf16's; "
                          'precision.backend = "torchao" with recipe "mxfp8" or "rowwise" runs grouped FP8 experts')


def _override(d: Draft) -> None:
    """A Megatron-Bridge override file (no `_target_`, Bridge's tables): what it leaves out is the recipe's, which is Python."""
    if not any(k.endswith("_target_") for k in d.leaves) and any(d.has(k) for k in ("train", "scheduler", "dataset", "optimizer")) \
            and not d.has("trainer"):
        d.none("(recipe)", "a Megatron-Bridge override file: every setting it leaves out (the model, the parallelism, the distributed "
                           "optimizer, ...) comes from the recipe's Python, which the import cannot read; the spec takes fp8launch's "
                           "defaults there: compare them with the recipe's")


def _preset(d: Draft) -> dict:
    """A named mixed_precision recipe (Megatron-Bridge) as its fields; {} when the config writes the fields itself."""
    name = d.get("mixed_precision")
    if not isinstance(name, str):
        return {}
    fields = PRESETS.get(name.replace("-", "_"))
    if fields is None:
        d.none("mixed_precision", "a Megatron-Bridge recipe fp8launch does not know: write its fields (fp8, fp8_recipe, ...) instead")
        return {}
    return fields


def _value(d: Draft, preset: dict, key: str, default=None):
    where = _at(d, key)
    return d.get(where) if where else preset.get(key, default)


def _src(d: Draft, preset: dict, *keys: str) -> str | tuple[str, ...]:
    """The source keys of the given settings (the preset's name where the recipe set them)."""
    found = tuple(w for w in (_at(d, k) for k in keys) if w)
    if not found and preset and any(k in preset for k in keys):
        return "mixed_precision"
    return found if len(found) != 1 else found[0]


FP8_KEYS = ("fp8", "fp8_e4m3", "fp8_hybrid", "fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo", "reduce_amax",
            "fp8_recipe", "fp8_params", "fp8_param", "fp8_param_gather", "fp8_wgrad", "fp8_dot_product_attention",
            "fp8_multi_head_attention", "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")


def _fp8(d: Draft, preset: dict) -> bool:
    fp8 = _value(d, preset, "fp8")
    if fp8 in (None, False, "false", "False"):
        if _at(d, "fp8"):
            d.mapped(_at(d, "fp8"), note="off")
        for key in FP8_KEYS[1:]:
            if _at(d, key):
                d.none(_at(d, key), "fp8 is off: no effect")
        return False
    if fp8 is True:
        fmt = "E4M3" if _value(d, preset, "fp8_e4m3") is True and _value(d, preset, "fp8_hybrid") is not True else "HYBRID"
        source = tuple(k for k in (_at(d, "fp8"), _at(d, "fp8_hybrid"), _at(d, "fp8_e4m3")) if k)
    else:
        fmt = "E4M3" if str(fp8).lower() == "e4m3" else "HYBRID"
        source = _src(d, preset, "fp8")
    d.mapped(source, ("precision.mode", "fp8"), ("precision.backend", "te"), ("precision.te.fp8_format", fmt),
             note="Transformer Engine" + (f" ({d.get('mixed_precision')})" if preset and source == "mixed_precision" else ""))
    for key in ("transformer_engine", "transformer_impl"):
        if _at(d, key):
            d.mapped(_at(d, key), note="Transformer Engine layers (precision.te.swap)")
    recipe = str(_value(d, preset, "fp8_recipe", "delayed"))
    if recipe in RECIPES:
        d.mapped(_src(d, preset, "fp8_recipe") or "(fp8_recipe)", ("precision.te.recipe", RECIPES[recipe]), value=recipe,
                 note="" if _at(d, "fp8_recipe") or preset else "NeMo 1.x: DelayedScaling")
    else:
        d.approximated(_src(d, preset, "fp8_recipe"), ("precision.te.recipe", "current"), before=f"Megatron's {recipe} FP8 recipe",
                       after="Transformer Engine's current scaling (per-tensor)", effect=f"fp8launch has no {recipe}: other scales, "
                       "so other rounding")
    for key, target in (("fp8_margin", "precision.te.margin"), ("fp8_amax_history_len", "precision.te.amax_history_len"),
                        ("fp8_amax_compute_algo", "precision.te.amax_compute_algo"), ("reduce_amax", "precision.te.reduce_amax")):
        value = _value(d, preset, key)
        if value is not None:
            conv = int if key in ("fp8_margin", "fp8_amax_history_len") else bool if key == "reduce_amax" else str
            d.mapped(_src(d, preset, key), (target, conv(value)), value=value)
    interval = _at(d, "fp8_interval")
    if interval:
        if int(d.get(interval)) == 1:
            d.mapped(interval, note="Transformer Engine >= 2.2 removed it and updates the scale every step, which is interval 1 "
                                    "(TE-REMOVED-KEY)")
        else:
            d.none(interval, "Transformer Engine >= 2.2 removed it: the scale is updated every step (rule TE-REMOVED-KEY)")
    params = next((k for k in ("fp8_params", "fp8_param", "fp8_param_gather") if _value(d, preset, k) is not None), None)
    if params:
        sources = _src(d, preset, "fp8_params", "fp8_param", "fp8_param_gather")
        on = bool(_value(d, preset, params))
        d.mapped(sources, ("precision.te.fp8_params", on), value=_value(d, preset, params),
                 note="weights kept in FP8 and all-gathered in FP8" if on else "weights kept in high precision, cast to FP8 per GEMM")
    for key, target in (("fp8_dot_product_attention", "precision.te.fp8_dpa"), ("fp8_multi_head_attention", "precision.te.fp8_mha")):
        if _at(d, key):
            d.mapped(_at(d, key), (target, bool(d.get(_at(d, key)))))
    if _at(d, "fp8_wgrad"):
        (d.mapped(_at(d, "fp8_wgrad"), note="TE's default") if d.get(_at(d, "fp8_wgrad")) is not False else
         d.none(_at(d, "fp8_wgrad"), "fp8launch runs the weight-gradient GEMM in FP8 too"))
    for key in FP8_KEYS:  # a key written in two places (Megatron-Bridge: mixed_precision and model): the first one counts
        chosen = _at(d, key)
        for other in (key, f"model.{key}", f"trainer.{key}"):
            if chosen and other != chosen and d.has(other) and other not in d.taken:
                d.mapped(other, note=f"{chosen} sets it")
    first_last = _value(d, preset, "first_last_layers_bf16") is True
    start, end = (int(_value(d, preset, k, 0) or 0) if first_last else 0
                  for k in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"))
    sets = [("precision.keep_first_blocks", start), ("precision.keep_last_blocks", end)] if first_last else []
    head = "Megatron-Core runs only the transformer layers in FP8, the output layer in bf16: keep_first_last keeps it"
    if first_last and start >= 1:
        d.mapped(_src(d, preset, "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"),
                 *sets, ("precision.keep_first_last", True), note=head + " (its first Linear is in block 0 anyway)")
    else:
        if first_last:
            d.mapped(_src(d, preset, "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"), *sets)
        elif _at(d, "first_last_layers_bf16"):  # false: Megatron reads no num_layers_at_*_in_bf16 (mixed_precision.py)
            keys = tuple(w for w in (_at(d, k) for k in ("first_last_layers_bf16", "num_layers_at_start_in_bf16",
                                                          "num_layers_at_end_in_bf16")) if w)
            d.mapped(keys, note="off: every transformer block in FP8 (the num_layers_at_*_in_bf16 are not read)")
        d.approximated("(output layer)", ("precision.keep_first_last", True), before="the output layer in bf16, every block in FP8",
                       after="the output layer and the first Linear (block 0's first projection) in bf16",
                       effect="one more Linear in bf16 than Megatron: a little slower, a little closer to bf16")
    return True


def _half(d: Draft, fp8: bool, preset: dict) -> None:
    target = "precision.high_precision" if fp8 else "precision.mode"
    precision = d.get("trainer.precision")
    if precision is not None:
        text = str(precision)
        mode = "bf16" if "bf16" in text else "fp16" if text.startswith("16") or "fp16" in text else "fp32"
        d.mapped("trainer.precision", (target, mode))
    elif _value(d, preset, "bf16") is True or _value(d, preset, "fp16") is True:
        mode = "bf16" if _value(d, preset, "bf16") is True else "fp16"
        d.mapped(_src(d, preset, mode), (target, mode))
    elif isinstance(d.get("mixed_precision"), str) and not fp8:
        d.mapped("mixed_precision", note="fp8launch's default precision")
    _moments(d)
    for key in ("optimizer.bf16", "optimizer.fp16", "optimizer.params_dtype", "optimizer.main_grads_dtype", "optimizer.main_params_dtype",
                "optimizer.exp_avg_dtype", "optimizer.exp_avg_sq_dtype", "optimizer.use_precision_aware_optimizer"):
        if d.has(key) and key not in d.taken:
            d.mapped(key, note="fp8launch keeps fp32 master weights, gradients and optimizer states")
    for key in ("bf16", "fp16", "fp32", "params_dtype", "pipeline_dtype", "autocast_enabled", "autocast_dtype", "grad_reduce_in_fp32",
                "megatron_amp_O2", "native_amp_init_scale", "native_amp_growth_interval", "hysteresis", "loss_scale", "initial_loss_scale",
                "min_loss_scale", "loss_scale_window", "fp32_residual_connection", "fp16_lm_cross_entropy"):
        where = _at(d, key)
        if where and where not in d.taken:
            d.mapped(where, note="fp8launch keeps fp32 master weights and reduces gradients in fp32 (fsdp2.reduce_dtype)")
    if isinstance(d.get("mixed_precision"), str):
        d.take("mixed_precision")
    d.group("mixed_precision", "a Megatron mixed-precision option fp8launch has no equivalent for")


def _dtype(value) -> str:
    """A dtype as Megatron-Bridge's YAML writes it ({_target_: torch.bfloat16} or a string) -> fp32 / bf16 / fp16 / uint8."""
    text = str(value.get("_target_", "") if isinstance(value, dict) else value).lower()
    return next((name for word, name in (("bfloat16", "bf16"), ("float16", "fp16"), ("half", "fp16"), ("uint8", "uint8"),
                                         ("float32", "fp32")) if word in text), "fp32")


def _moments(d: Draft) -> None:
    """Megatron-Core's precision-aware optimizer keeps the Adam moments in exp_avg_dtype / exp_avg_sq_dtype (TE's FusedAdam)."""
    keys = ("optimizer.use_precision_aware_optimizer", "optimizer.exp_avg_dtype", "optimizer.exp_avg_sq_dtype")
    if d.get(keys[0]) is not True:
        return
    dtypes = {_dtype(d.get(k, "float32")) for k in keys[1:]}
    sources = tuple(k for k in keys if d.has(k))
    if dtypes == {"fp32"}:
        d.mapped(sources, ("precision.optimizer_states", "fp32"))
    elif dtypes == {"bf16"}:
        d.mapped(sources, ("precision.optimizer_states", "bf16"), note="both moments in bf16")
    else:
        states = "fp8" if "uint8" in dtypes else "bf16"
        d.approximated(sources, ("precision.optimizer_states", states),
                       before=f"Transformer Engine FusedAdam's moments in {' / '.join(sorted(dtypes))}",
                       after="torchao's AdamWFp8 (e4m3 codes, one scale per 256 values)" if states == "fp8" else "both moments in bf16",
                       effect="low-precision moments in both; their rounding differs")


def _world(d: Draft) -> None:
    if d.has("trainer.num_nodes"):
        d.mapped("trainer.num_nodes", ("distributed.nodes", int(d.get("trainer.num_nodes"))))
    if d.has("trainer.devices") and str(d.get("trainer.devices")).isdigit():
        d.mapped("trainer.devices", ("distributed.procs_per_node", int(d.get("trainer.devices"))))
    else:
        d.world_unknown("the launcher (torchrun --nproc_per_node, SLURM) sets the world size, not this config")
    tp = _at(d, "tensor_model_parallel_size")
    if tp:
        d.mapped(tp, ("distributed.tensor_parallel", int(d.get(tp))))
    sp = _at(d, "sequence_parallel")
    if sp:
        on, tp_n = d.get(sp) is True, int(d.get(tp) or 1) if tp else 1
        if tp_n == 1:
            d.mapped(sp, note="no tensor parallel: nothing to do")
        elif on:
            d.mapped(sp, note="fp8launch's tensor parallel is torchtitan's plan, with sequence parallel")
        else:
            d.approximated(sp, before="tensor parallel without sequence parallel: the norms' activations replicated",
                           after="sequence parallel: the norms' activations sharded over the sequence",
                           effect="less activation memory; the same numerics")
    pp = _at(d, "pipeline_model_parallel_size")
    if pp and int(d.get(pp)) > 1:
        d.mapped(pp, ("distributed.pipeline_parallel", int(d.get(pp))),
                 note="stages of torch.distributed.pipelining (1F1B, or interleaved with virtual stages), FSDP2 over each stage's ranks")
    elif pp:
        d.mapped(pp, note="off")
    where = _at(d, "virtual_pipeline_model_parallel_size")
    if where and int(d.get(where)) > 1 and pp and int(d.get(pp)) > 1:
        d.mapped(where, ("distributed.pipeline.schedule", "Interleaved1F1B"), ("distributed.pipeline.stages_per_rank", int(d.get(where))),
                 note="Megatron's interleaved 1F1B over virtual stages: torch's ScheduleInterleaved1F1B, as many stages a rank")
    elif where and int(d.get(where)) > 1:
        d.mapped(where, note="no pipeline parallel: no virtual stages either")
    elif where:
        d.mapped(where, note="off")
    _context(d)
    ep = _at(d, "expert_model_parallel_size")
    if ep:
        d.mapped(ep, ("distributed.expert_parallel", int(d.get(ep))))


CP_COMM = {"p2p": "sent point to point around the ring", "all_gather": "all-gathered", "a2a": "exchanged all-to-all (Ulysses)",
           "a2a+p2p": "exchanged all-to-all, then point to point (hierarchical)"}
"""Megatron's cp_comm_type -> how Transformer Engine's attention exchanges the key / value shards (p2p by default)."""


def _context(d: Draft) -> None:
    """context_parallel_size: the data-parallel ranks are world / (tp x cp x pp), each sequence split in 2 x cp chunks dealt
    head and tail (get_batch_on_this_cp_rank), as torch's load balancer deals them; and the exchange cp_comm_type names."""
    where = _at(d, "context_parallel_size")
    if not where or int(d.get(where)) <= 1:
        if where:
            d.mapped(where, note="off")
        return
    comm = _at(d, "cp_comm_type")
    d.mapped(where, ("distributed.context_parallel", int(d.get(where))),
             note="each sequence split over the ranks in 2 x cp chunks dealt head and tail, as Megatron deals them; torch's ring "
                  "attention all-gathers the key / value shards" + ("" if comm else " (Megatron's default, p2p, sends them around "
                                                                                    "the ring: the same attention)"))
    kind = d.get(comm) if comm else None
    if kind == "all_gather":
        d.mapped(comm, note="torch's ring attention all-gathers them too")
    elif comm:
        d.approximated(comm, before=f"key / value shards {CP_COMM.get(str(kind), f'exchanged by {kind}')}",
                       after="all-gathered (torch's ring attention's default rotation; no spec key chooses it)",
                       effect="the same attention; another collective, so the speed and memory differ")


def _strategy(d: Draft) -> None:
    name = str(d.get("model.optim.name", ""))
    keys = tuple(k for k in ("model.optim.name", "optimizer.use_distributed_optimizer", "ddp.use_distributed_optimizer") if d.has(k))
    distributed = ("distributed" in name or d.get("optimizer.use_distributed_optimizer") is True
                   or d.get("ddp.use_distributed_optimizer") is True)
    if d.get("model.fsdp") is True:
        d.approximated("model.fsdp", ("distributed.strategy", "fsdp2"), before="NeMo's torch FSDP (FSDP1)", after="FSDP2 (fully_shard)",
                       effect="parameters, gradients and optimizer states are sharded as before")
    elif distributed:
        d.approximated(keys, ("distributed.strategy", "deepspeed"), ("distributed.deepspeed.zero_stage", 1),
                       before="Megatron's distributed optimizer: the optimizer states sharded over the data-parallel ranks",
                       after="DeepSpeed ZeRO-1: the same sharding, DeepSpeed's engine",
                       effect="the same memory for the optimizer states; another engine's communication schedule")
    else:
        d.mapped(keys or "(strategy)", ("distributed.strategy", "ddp"), note="Megatron's DDP")
    for key in ("model.fsdp_sharding_strategy", "model.fsdp_grad_reduce_dtype", "model.fsdp_sharded_checkpoint"):
        if d.has(key):
            d.none(key, "NeMo's FSDP option" + ("" if d.get("model.fsdp") is True else ": FSDP is off"))
    d.group("ddp", "Megatron's DDP tuning (buckets, overlap): fp8launch's engines tune their own")


def _batch_and_steps(d: Draft) -> None:
    for key, attr in (("micro_batch_size", "micro"), ("global_batch_size", "global_")):
        where = next((w for w in (f"model.{key}", f"train.{key}", key) if d.has(w)), None)
        if where:
            d.note_batch(attr, d.get(where), where)
    if d.has("trainer.accumulate_grad_batches"):
        d.mapped("trainer.accumulate_grad_batches", note="NeMo derives the accumulation from global_batch_size")
    steps = next((k for k in ("trainer.max_steps", "train.train_iters") if d.has(k)), None)
    if steps:
        d.mapped(steps, ("train.steps", int(d.get(steps))))
    # the batches are the dataset's sequence length; Megatron-Bridge's model.seq_length is the model's context (a dump of
    # a recipe can say 131072 and train at 1024: ConfigContainer.validate compares the two only for its own dataset classes)
    data = next((k for k in ("dataset.seq_length", "dataset.sequence_length", "model.data.seq_length") if isinstance(d.get(k), int)), None)
    seq = data or next((k for k in ("model.encoder_seq_length", "model.seq_length") if isinstance(d.get(k), int)), None)
    sft = "model.data.train_ds.max_seq_length"
    if not seq and isinstance(d.get(sft), int):  # NeMo fine-tuning: rows up to this long, padded to the batch's longest
        n = int(d.get(sft))
        d.approximated(sft, ("train.seq_len", n), value=n, before=f"each row as long as it is, up to {n} tokens (cut beyond), "
                       "padded to the longest row of its batch", after=f"every sequence {n} tokens of the joined rows",
                       effect="more tokens a step where rows are shorter: another step time and loss average; no row is cut")
    elif seq:
        n = int(d.get(seq))
        d.mapped(seq, ("train.seq_len", n), note="the dataset's sequence length: every batch is this long" if data else "")
        for other in ("model.encoder_seq_length", "model.seq_length", "dataset.seq_length", "dataset.sequence_length",
                      "model.data.seq_length", "model.max_position_embeddings"):
            if d.has(other) and other not in d.taken:
                value = d.get(other)
                d.mapped(other, note="the same sequence length" if value == n else
                         f"the model's context, not the batches' length ({n}): RoPE needs no table in fp8launch")
    clip = next((k for k in ("trainer.gradient_clip_val", "optimizer.clip_grad") if d.has(k)), None)
    if clip:
        d.mapped(clip, ("train.max_grad_norm", float(d.get(clip))))
    seed = next((k for k in ("model.seed", "rng.seed") if d.has(k)), None)
    if seed:
        d.mapped(seed, ("train.seed", int(d.get(seed))))


def _optimizer(d: Draft) -> None:
    o = next((p for p in ("model.optim", "optimizer") if isinstance(d.get(p), dict)), None)
    if o is None:
        return
    name = str(d.get(f"{o}.name", d.get(f"{o}.optimizer", "adam")))
    key = f"{o}.name" if d.has(f"{o}.name") else f"{o}.optimizer" if d.has(f"{o}.optimizer") else "(optimizer)"
    if name == "sgd":
        d.mapped(key, ("train.optimizer", "sgd"))
    elif "adam" in name or name == "mcore_distributed_optim":  # NeMo's Megatron-Core optimizer: Adam unless optim.optimizer says otherwise
        d.mapped(key, ("train.optimizer", "adamw"), value=name, note="Megatron's and NeMo's Adam decay the weights decoupled: AdamW")
    else:
        d.approximated(key, ("train.optimizer", "adamw"), before=name, after="torch's AdamW",
                       effect=f"fp8launch has adamw, adam and sgd: another update rule than {name}'s")
    if d.has(f"{o}.lr"):
        d.mapped(f"{o}.lr", ("train.lr", float(d.get(f"{o}.lr"))))
    if d.has(f"{o}.weight_decay"):
        d.mapped(f"{o}.weight_decay", ("train.weight_decay", float(d.get(f"{o}.weight_decay"))))
    betas = d.get(f"{o}.betas")
    if betas is not None:
        d.mapped(f"{o}.betas", ("train.adam_betas", [float(x) for x in betas]))
    elif d.has(f"{o}.adam_beta1") or d.has(f"{o}.adam_beta2"):
        d.mapped(tuple(k for k in (f"{o}.adam_beta1", f"{o}.adam_beta2") if d.has(k)),
                 ("train.adam_betas", [float(d.get(f"{o}.adam_beta1", 0.9)), float(d.get(f"{o}.adam_beta2", 0.999))]))
    eps = next((k for k in (f"{o}.eps", f"{o}.adam_eps") if d.has(k)), None)
    if eps:
        d.mapped(eps, ("train.adam_eps", float(d.get(eps))))
    wd_all = _get(d, "do_layer_norm_weight_decay") is True
    source = _at(d, "do_layer_norm_weight_decay") or "(weight decay of norms and biases)"
    d.mapped(source, ("train.weight_decay_exclude", "none" if wd_all else "norms_and_biases"),
             note="every parameter decays" if wd_all else "Megatron skips weight decay for 1-D parameters and biases")
    if d.has(f"{o}.min_lr") and d.has(f"{o}.lr"):
        d.mapped(f"{o}.min_lr", ("train.min_lr_ratio", round(float(d.get(f"{o}.min_lr")) / float(d.get(f"{o}.lr")), 6)), note="min_lr / lr")
    elif d.has(f"{o}.min_lr") and o == "optimizer":  # an override file: the lr is its recipe's, min_lr an absolute lr
        d.placeholder(f"{o}.min_lr", "train.min_lr_ratio", 0.1, f"min_lr is an absolute lr ({d.get(f'{o}.min_lr')}) and this file "
                      "sets no optimizer.lr (the recipe's Python does): set train.lr to the recipe's and train.min_lr_ratio = "
                      "min_lr / lr", "min_lr / the recipe's lr")
    if d.has(f"{o}.finetune_lr"):
        d.none(f"{o}.finetune_lr", "no field of Megatron-Bridge's OptimizerConfig (a recipe function's argument, e.g. "
                                   "recipes/qwen2_audio): set train.lr to the lr the run should use")
    if o == "optimizer":  # Megatron-Bridge's OptimizerConfig; NeMo 1.x's model.optim keeps its own line (_checkpoint_and_logs)
        megatron_optimizer.read(d, o)


def _schedule(d: Draft) -> None:
    s = next((p for p in ("model.optim.sched", "scheduler") if isinstance(d.get(p), dict)), None)
    if s is None:
        if isinstance(d.get("model.optim"), dict):  # NeMo 1.x builds no scheduler without optim.sched
            d.mapped("(model.optim.sched)", ("train.warmup_steps", 0), ("train.min_lr_ratio", 1.0),
                     note="no sched: NeMo keeps the lr constant, so does the spec")
        return
    style = d.get(f"{s}.name", d.get(f"{s}.lr_decay_style"))
    key = f"{s}.name" if d.has(f"{s}.name") else f"{s}.lr_decay_style"
    if style is not None:
        if str(style) in ("CosineAnnealing", "cosine"):
            d.mapped(key, note="cosine decay")
        elif str(style) in ("constant", "Constant"):
            d.mapped(key, ("train.min_lr_ratio", 1.0), note="constant after the warm-up")
        else:
            d.approximated(key, before=f"a {style} decay", after="a cosine decay to the same end",
                           effect="the same start and end; the lr in between differs")
    warmup = next((k for k in (f"{s}.warmup_steps", f"{s}.lr_warmup_iters") if d.has(k)), None)
    if warmup:
        value = d.get(warmup)
        if float(value).is_integer():
            d.mapped(warmup, ("train.warmup_steps", int(value)))
        else:
            d.approximated(warmup, ("train.warmup_steps", round(float(value))), before=f"{value} warm-up steps",
                           after=f"{round(float(value))}", effect="fp8launch counts whole steps")
    if d.has(f"{s}.min_lr") and d.has("model.optim.lr"):
        d.mapped(f"{s}.min_lr", ("train.min_lr_ratio", round(float(d.get(f"{s}.min_lr")) / float(d.get("model.optim.lr")), 6)),
                 note="min_lr / lr")
    for key in (f"{s}.constant_steps", f"{s}.lr_warmup_init"):
        if d.has(key):
            if float(d.get(key)) == 0:
                d.mapped(key, note="0")
            else:
                d.approximated(key, before=f"{key.rsplit('.', 1)[1]} = {d.get(key)}", after="none",
                               effect="fp8launch's schedule has no constant phase and starts its warm-up near 0")
    for key in (f"{s}.max_steps_for_lr_sched", f"{s}.lr_decay_iters", f"{s}.lr_wsd_decay_iters"):
        if d.has(key):
            d.approximated(key, before=f"the decay ends at {d.get(key)} steps", after="at train.steps",
                           effect="the decay is stretched or cut to the run's length")
    start, end = d.get(f"{s}.start_weight_decay"), d.get(f"{s}.end_weight_decay")
    if start is not None and end is not None:
        style = str(d.get(f"{s}.weight_decay_incr_style", "constant"))
        sources = tuple(k for k in (f"{s}.start_weight_decay", f"{s}.end_weight_decay", f"{s}.weight_decay_incr_style") if d.has(k))
        for e in d.report.setting("train.weight_decay"):  # optimizer.weight_decay: the scheduler's value replaces it
            e.sets = [(k, v) for k, v in e.sets if k != "train.weight_decay"]
            e.note = "replaced by the scheduler's start_weight_decay / end_weight_decay"
        if style == "constant" or float(start) == float(end):
            d.mapped(sources, ("train.weight_decay", float(end)),
                     note="Megatron's scheduler sets the weight decay every step (constant: end_weight_decay), over optimizer.weight_decay")
        else:
            d.approximated(sources, ("train.weight_decay", float(end)), before=f"a {style} weight-decay ramp from {start} to {end}",
                           after=f"a constant {end}", effect="more weight decay early in the run" if float(end) > float(start)
                           else "less weight decay early in the run")
    if d.value("train.min_lr_ratio") is None:  # NeMo's CosineAnnealing(min_lr=0.0), Megatron's --min-lr 0.0
        d.mapped("(min_lr)", ("train.min_lr_ratio", 0.0), value=0.0, note="NeMo's and Megatron's default: the decay ends at 0")
    d.group(s, "a Megatron schedule option fp8launch has no equivalent for")


def _model(d: Draft) -> None:
    found = {k: _resolved(d, _at(d, k)) for k in ARCHITECTURE if _at(d, k) and not _at(d, k).startswith("trainer.")}
    sources = tuple(_at(d, k) for k in found)
    experts = int(found.get("num_moe_experts") or 0)
    for builtin, shape in SHAPES.items():
        if experts <= 1 and all(found.get(k) == v for k, v in shape.items()):
            _same_shape(d, sources, builtin, found)
            return
    tokenizer = _get(d, "tokenizer_model") or d.get("tokenizer.tokenizer_model") or d.get("model.tokenizer.type")
    name = d.get("run.name") or d.get("name") or ""
    if isinstance(tokenizer, str) and hub.is_hub_id(tokenizer):
        hub.model(d, sources or "(model)", tokenizer, shape_hint=f"{tokenizer} {'moe' if experts > 1 else ''}")
    elif _at(d, "restore_from_path") and not (found.get("num_layers") and found.get("hidden_size")):
        trained = d.get("run.model_train_name")  # NeMo-Framework-Launcher's name of the model the .nemo holds
        d.placeholder((_at(d, "restore_from_path"),) + sources, "train.model",
                      hub.nearest_builtin(trained) if isinstance(trained, str) else hub.DEBUG,
                      "the model is the NeMo checkpoint (.nemo) restore_from_path names: convert it to Hugging Face (NeMo's "
                      'scripts/checkpoint_converters) and set train.model = "hf:DIR" (its config.json and weights)',
                      'the converted checkpoint as "hf:DIR"')
    elif found.get("num_layers") or found.get("hidden_size"):
        hint = f"{found.get('num_layers', '?')} layers x {found.get('hidden_size', '?')}" + (f", {experts} experts" if experts > 1 else "")
        size = None
        if found.get("num_layers") and found.get("hidden_size") and experts <= 1:
            size = hub.shape_billions(int(found["num_layers"]), int(found["hidden_size"]), found.get("ffn_hidden_size") and
                                      int(found["ffn_hidden_size"]), found.get("vocab_size") and int(found["vocab_size"]),
                                      gated=str(found.get("activation", found.get("activation_func", "swiglu"))).endswith("glu"))
        builtin = (hub.nearest_builtin(f"{name} moe") if experts > 1 else hub.nearest(hub.DENSE, size) if size else hub.DEBUG)
        until = ("; until then the MoE builtin nearest its name" if experts > 1 else
                 f"; until then the dense builtin nearest its {size:.3g}B parameters" if size else "")
        d.placeholder(sources, "train.model", builtin, f"a Megatron model shape ({hint}) that is no fp8launch builtin: write it as a "
                      'Hugging Face config.json and set train.model = "hf:DIR"' + until, 'your model as "hf:DIR"')
    else:
        d.placeholder(sources or "(model)", "train.model", hub.DEBUG, "the config names no model shape (the recipe's Python builds it)",
                      'your model as "hf:DIR" or "builtin:NAME"')


MULTIPLY = re.compile(r"^\$\{multiply:\s*([^,]+?)\s*,\s*(.+?)\s*\}$")


def _resolved(d: Draft, path: str):
    """The value at `path`, NeMo-Framework-Launcher's `${multiply:A, B}` computed (launcher_scripts/main.py registers it: x * y;
    `${.key}` a key of the same table, `${training.model.key}` of this file, whose top is the `training` group) so that
    `ffn_hidden_size: ${multiply:4, ${.hidden_size}}` is 4 x hidden_size; another interpolation is no number: None."""
    value = d.get(path)
    if not isinstance(value, str) or "${" not in value:
        return value
    m = MULTIPLY.match(value)
    if not m:
        return None
    parts = []
    for arg in m.groups():
        if ref := re.fullmatch(r"\$\{(\.?)([\w.]+)\}", arg):
            target = (path.rsplit(".", 1)[0] + "." if "." in path else "") + ref[2] if ref[1] else ref[2].split(".", 1)[-1]
            arg = d.get(target)
        try:
            parts.append(float(arg))
        except (TypeError, ValueError):
            return None
    product = parts[0] * parts[1]
    return int(product) if product.is_integer() else product


def _same_shape(d: Draft, sources: tuple[str, ...], builtin: str, found: dict) -> None:
    """A builtin of the model's shape; tied embeddings (share_embeddings_and_output_weights, NeMo's and Megatron-Core's
    default where unset) are not: every builtin has an output head of its own."""
    tied = found.get("share_embeddings_and_output_weights")
    untie = found.get("untie_embeddings_and_output_weights")
    tied = (not untie) if untie is not None else True if tied is None else bool(tied)
    cfg = parse_builtin(builtin)
    vocab = found.get("vocab_size")
    if not tied and vocab == cfg.vocab_size:
        d.mapped(sources, ("train.model", builtin), value=f"{len(found)} settings", note=f"the {builtin} shape, untied as the source")
        return
    if not tied:  # the vocabulary is the tokenizer's (Megatron pads it to make_vocab_size_divisible_by); the builtin has its own
        before = f"the {builtin} shape with " + (f"a vocabulary of {vocab}" if isinstance(vocab, int) else
                                                 "its tokenizer's vocabulary (the tokenizer sets it, not this file)")
        extra = (f"; {abs(cfg.vocab_size - vocab) * cfg.dim * 2 / 1e9:.2f}B parameters "
                 f"{'more' if cfg.vocab_size > vocab else 'fewer'} in the embedding and output head") if isinstance(vocab, int) else ""
        d.approximated(sources, ("train.model", builtin), value=f"{len(found)} settings", before=before,
                       after=f"{builtin}'s vocabulary of {cfg.vocab_size} tokens",
                       effect="the embedding and the output head have that many rows: train.tokenizer must have as many ids or "
                              "fewer (another tokenizer, e.g. Llama 2's 32000, leaves rows unused)" + extra)
        return
    total = model_params(builtin)
    own = total - cfg.vocab_size * cfg.dim
    default = "" if _at(d, "share_embeddings_and_output_weights") else " (Megatron-Bridge's and NeMo's default)"
    d.approximated(sources, ("train.model", builtin), value=f"{len(found)} settings",
                   before=f"the {builtin} shape with the output layer tied to the embedding{default}: {own / 1e9:.2f}B parameters",
                   after=f"{builtin}, untied: {total / 1e9:.2f}B parameters",
                   effect=f"{(total - own) / 1e9:.2f}B more parameters (the output head) to hold, train and checkpoint; the head "
                          "learns apart from the embedding")


def _data(d: Draft) -> None:
    megatron_data.read(d)
    d.group("model.data", "Megatron's dataset building (splits, index cache, workers): fp8launch reads the indexed dataset as is")
    d.group("dataset", "Megatron's dataset building (splits, index cache, workers): fp8launch reads the indexed dataset as is")
    d.group("model.tokenizer", "the tokenizer: fp8launch's train.tokenizer is a tokenizer.json")
    d.group("tokenizer", "the tokenizer: fp8launch's train.tokenizer is a tokenizer.json")


def _recompute(d: Draft) -> None:
    layers = _get(d, "num_layers")
    pp = _get(d, "pipeline_model_parallel_size")
    megatron_recompute.read(d, lambda key: _at(d, key), layers if isinstance(layers, int) else None, pp if isinstance(pp, int) else 1)


def _nemo_checkpoints(d: Draft) -> None:
    """NeMo 1.x: exp_manager's checkpoint callback (create_checkpoint_callback, true by default: nemo/utils/exp_manager.py
    ExpManagerConfig) is Lightning's ModelCheckpoint with NeMo's CallbackParams (every_n_epochs 1, every_n_train_steps None).
    ModelCheckpoint.on_validation_end (lightning 2.x, pytorch/callbacks/model_checkpoint.py) saves its top-k when every_n_epochs
    >= 1, and the "last" checkpoint when save_last, at the end of every validation: every trainer.val_check_interval steps
    (an int: steps)."""
    c = "exp_manager.checkpoint_callback_params."
    on = d.get("exp_manager.create_checkpoint_callback", True) in (True, "true", "True")
    interval = d.get("trainer.val_check_interval")
    if not d.has("exp_manager") or not on or not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        return
    if d.has(c + "every_n_train_steps") and d.get(c + "every_n_train_steps"):
        return  # a step cadence of its own: read as exp_manager's other keys
    top = int(d.get(c + "every_n_epochs", 1)) >= 1
    last = bool(d.get(c + "save_last", True))
    if not top and not last:
        return
    sources = tuple(k for k in ("exp_manager.create_checkpoint_callback", "trainer.val_check_interval", c + "every_n_epochs",
                                c + "save_last") if d.has(k))
    what = "its best by val_loss and the last" if top and last else "its best by val_loss" if top else "the last"
    d.mapped(sources, ("train.checkpoint_every", interval), value=interval,
             note=f"NeMo's checkpoint callback saves {what} at the end of every validation (Lightning ModelCheckpoint."
                  f"on_validation_end), every val_check_interval = {interval} steps; the validation itself: fp8launch evaluates on "
                  "[eval] data every eval.every steps (set it once the data is local)")


def _checkpoint_and_logs(d: Draft) -> None:
    if d.has("checkpoint.save_interval"):
        d.mapped("checkpoint.save_interval", ("train.checkpoint_every", int(d.get("checkpoint.save_interval"))))
    else:
        _nemo_checkpoints(d)
    if d.has("checkpoint.save"):
        d.mapped("checkpoint.save", note="fp8launch writes checkpoints to <train.output_dir>/checkpoints")
    top_k = d.get("exp_manager.checkpoint_callback_params.save_top_k")
    if top_k is not None:
        d.approximated("exp_manager.checkpoint_callback_params.save_top_k", ("train.keep_checkpoints", max(1, int(top_k))),
                       before=f"the {top_k} best checkpoints by validation loss", after=f"the newest {max(1, int(top_k))}",
                       effect="another set of checkpoints is kept; training is the same")
    if d.has("trainer.log_every_n_steps"):
        d.mapped("trainer.log_every_n_steps", ("train.log_every", int(d.get("trainer.log_every_n_steps"))))
    if d.has("logger.log_interval"):
        d.mapped("logger.log_interval", ("train.log_every", int(d.get("logger.log_interval"))))
    if d.get("exp_manager.create_wandb_logger") is True or d.get("logger.wandb_project"):
        key = "exp_manager.create_wandb_logger" if d.has("exp_manager.create_wandb_logger") else "logger.wandb_project"
        d.mapped(key, ("log.wandb", True))
    if d.get("exp_manager.create_tensorboard_logger") is True or d.get("logger.tensorboard_dir"):
        key = "exp_manager.create_tensorboard_logger" if d.has("exp_manager.create_tensorboard_logger") else "logger.tensorboard_dir"
        d.mapped(key, ("log.tensorboard", True))
    for key in ("trainer.val_check_interval", "trainer.limit_val_batches", "validation.eval_interval", "validation.eval_iters",
                "train.eval_interval", "train.eval_iters"):
        if d.has(key):
            d.none(key, "fp8launch evaluates on [eval] data every eval.every steps (set it once the data is local)")
    d.group("exp_manager", "NeMo's experiment manager (log folders, checkpoint callback, resume): fp8launch keeps everything in "
                           "train.output_dir and resumes from its newest checkpoint (train.resume)")
    d.group("trainer", "a PyTorch Lightning trainer option fp8launch has no equivalent for")
    d.group("checkpoint", "fp8launch checkpoints with DCP into <train.output_dir>/checkpoints (docs/checkpoints.md)")
    d.group("logger", "fp8launch logs to <train.output_dir> and the trackers of [log]")
    for key in ("run", "hydra", "defaults", "profiling", "rng", "dist", "comm_overlap", "validation", "train", "s3_checkpointing"):
        d.group(key, "a launcher / runtime option of the source project fp8launch has no equivalent for")
    if d.get("model.fsdp") is False:
        d.mapped("model.fsdp", note="off")
    d.group("model.ub_tp_comm_overlap_cfg", "Transformer Engine's userbuffers overlap of tensor-parallel communication: fp8launch's "
                                            "async TP (distributed.async_tp) overlaps them for torchao")
    d.group("model.nsys_profile", "fp8launch profiles with `fp8launch run --profile N`")
    for key in ("peft", "model.peft"):
        d.group(key, "parameter-efficient fine-tuning (LoRA, adapters): fp8launch trains every weight of the model: a full "
                     "fine-tune, which holds gradients and optimizer states for all of them (plan's memory estimate says how much)")
    for key in ("model.teacher", "model.kd_config"):
        d.group(key, "knowledge distillation from a teacher model: fp8launch trains the model on its data's next tokens alone, "
                     "no teacher logits")
    d.group("model.optim", "Megatron's distributed-optimizer tuning (buckets, overlap, dtypes): fp8launch's engines tune their own")
    d.group("model", "a Megatron model option (fusions, kernels, initialization, offloading) fp8launch has no equivalent for")


NAMES = ("run.name", "logger.wandb_exp_name", "name")


def _name(d: Draft) -> str | None:
    return next((d.get(k) for k in NAMES if isinstance(d.get(k), str) and "${" not in d.get(k)), None)


KEYS = ("trainer.devices", "trainer.num_nodes", "trainer.precision", "model.tensor_model_parallel_size",
        "model.pipeline_model_parallel_size", "model.micro_batch_size", "model.global_batch_size", "model.encoder_seq_length",
        "model.fp8", "model.optim", "exp_manager",
        "train.train_iters", "train.global_batch_size", "optimizer.adam_beta1", "optimizer.min_lr", "scheduler.lr_warmup_iters",
        "mixed_precision", "model.seq_length", "dataset.seq_length", "rng.seed", "ddp.use_distributed_optimizer", "fp8", "fp8_hybrid")

TOP = ("env_vars", "rng", "rerun_state_machine", "train", "model", "optimizer", "optimizer_config_override_provider", "ddp",
       "validation", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler", "nvrx_straggler",
       "profiling", "peft", "comm_overlap", "mixed_precision", "tensor_inspect", "inprocess_restart", "_target_",
       "defaults", "hydra", "name", "restore_from_path", "run", "trainer", "exp_manager", "init_from_nemo_model",
       "init_from_pretrained_model", "init_from_ptl_ckpt") + FP8_KEYS
"""The top-level keys: Megatron-Bridge's ConfigContainer fields (NVIDIA-NeMo/Megatron-Bridge 067f987, training/config.py),
NeMo 1.x's Hydra tables (NeMo-Framework-Launcher conf/training) and the FP8 keys a file may hold at its top."""


def vet(d: Draft) -> list[Unknown]:
    """Top-level keys neither Megatron-Bridge nor NeMo has: reported (the nested model / trainer tables are open-ended)."""
    return [Unknown(k, near, "neither Megatron-Bridge's ConfigContainer nor NeMo's Hydra config has it", tool="Megatron-Bridge / NeMo")
            for k, near in unknown([k.split(".")[0] for k in d.leaves], TOP)]


KIND = Kind(id="megatron", title="NeMo / Megatron-Bridge YAML",
            score=lambda data: count(data, KEYS) if any(k in data for k in ("trainer", "model", "mixed_precision", "scheduler", "fp8"))
            else 0,
            read=_read, name=_name, unknown=vet,
            other="a NeMo / Megatron setting fp8launch has no equivalent for")
