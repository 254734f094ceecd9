"""An Axolotl YAML, read as axolotl-ai-cloud/axolotl 067b021c (2026-07-24) reads it (src/axolotl/utils/schemas/,
utils/trainer.py, core/builders/base.py; examples/llama-3/3b-fp8-fsdp2.yaml). Axolotl is not installed here: the
tests name this commit.

- Validation: pydantic models (known/axolotl.py holds their fields); a key none of them has is dropped.
- FSDP is on with `fsdp_config` alone (prepare_optim_env: `cfg.fsdp or cfg.fsdp_config`; the top-level `fsdp:`
  list is deprecated). The version is `fsdp_version`, else `fsdp_config.fsdp_version` / `fsdp_config.version`
  (moved up by check_fsdp_version_in_fsdp_config), else 1. fsdp_config keys lose an `fsdp_` prefix
  (check_fsdp_config_kwargs_prefix); setup_fsdp_envs passes offload_params, activation_checkpointing and
  reshard_after_forward to Accelerate only when true, so false leaves Accelerate's default (FSDP2 reshards).
- fp8: Accelerate with AORecipeKwargs around torchao's default Float8LinearConfig (tensorwise, no
  pad_inner_dim), enable_fsdp_float8_all_gather from fp8_enable_fsdp_float8_all_gather
  (core/trainers/base.py additional_accelerator_args); Accelerate keeps the first and last Linear and dims not
  divisible by 16 in high precision (accelerate/utils/ao.py), and Axolotl the MoE routers.
- The optimizer and schedule are the Hugging Face Trainer's: AdamW with adam_beta1 / adam_beta2 / adam_epsilon
  (torch's defaults), no weight decay for biases and LayerNorm / RMSNorm weights (Trainer.get_decay_parameter_names);
  adamw_torch_8bit / 4bit are torchao's AdamW8bit / AdamW4bit (transformers trainer_optimizer.py), ao_adamw_fp8 its
  AdamWFp8; lr_scheduler "cosine" by default, decaying to 0, or to cosine_min_lr_ratio x lr
  (core/trainers/mixins/scheduler.py); no warmup_steps or warmup_ratio: min(int(0.03 x steps), 100) warm-up steps,
  and 1 becomes 2 (core/builders/base.py _configure_warmup_and_logging).
- context_parallel_size (sequence_parallel_degree before it) splits each sequence over that many ranks, which read the
  same batches (utils/config/__init__.py: batch_size counts world / cp / tp ranks); ring-flash-attn's ring attention
  (ctx_managers/sequence_parallel.py pads each batch to a multiple of cp).
- The world size comes from `accelerate launch` / torchrun, not the YAML.
"""

from __future__ import annotations

import os

from launcher.errors import SourceError, with_fix

from . import deepspeed, hub
from .draft import Draft
from .kind import Kind, count
from .known import Unknown, unknown
from .known import axolotl as known

ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_anyprecision", "adamw_torch_xla",
         "adamw_torch_npu_fused", "optimi_adamw")
STATES = {"adamw_torch_8bit": "int8", "ao_adamw_8bit": "int8", "ao_adamw_fp8": "fp8"}
"""Low-bit AdamWs that are torchao's, as precision.optimizer_states runs them (AdamW8bit, AdamWFp8; 256-value blocks)."""
NEAR_STATES = {"adamw_torch_4bit": "torchao's AdamW4bit (4-bit moments)", "ao_adamw_4bit": "torchao's AdamW4bit (4-bit moments)",
               "adamw_bnb_8bit": "bitsandbytes' 8-bit AdamW (its own block-wise quantization)",
               "adamw_8bit": "bitsandbytes' 8-bit AdamW (its own block-wise quantization)",
               "paged_adamw_8bit": "bitsandbytes' paged 8-bit AdamW"}
"""Low-bit AdamWs whose nearest is torchao's AdamW8bit (precision.optimizer_states = "int8")."""


def _num(value) -> float:
    return float(value)  # YAML reads 2e-5 (no dot) as a string


def vet(d: Draft) -> list[Unknown]:
    """Keys no Axolotl model has (dropped by its validation): reported. With `plugins`, a third-party plugin may read them."""
    plugins = bool(d.get("plugins"))
    says = "Axolotl's schema has no such key and drops it" + (" (unless one of `plugins` reads it)" if plugins else "")
    top = set(known.TOP) | set(known.PLUGINS)
    keys = [str(k) for k in d.data if k != deepspeed.PREFIX]
    out = [Unknown(k, near, says, tool="Axolotl") for k, near in unknown(keys, top)]
    fsdp = set(known.FSDP)
    for key in [k[len("fsdp_config."):].split(".")[0] for k in d.leaves if k.startswith("fsdp_config.")]:
        bare = key if key == "fsdp_version" else key.removeprefix("fsdp_")
        if bare not in fsdp:
            near = unknown([bare], fsdp)[0][1]
            out.append(Unknown(f"fsdp_config.{key}", f"fsdp_config.{near}" if near else None,
                               "not a field of Axolotl's FSDPConfig: dropped, so Accelerate never sees it", tool="Axolotl"))
    return list({u.key: u for u in out}.values())


def _read(d: Draft) -> None:
    if d.has("deepspeed"):
        deepspeed.attach(d, "deepspeed", os.path.dirname(os.path.abspath(d.path)))
        if deepspeed.PREFIX in d.data:
            deepspeed.read_config(d, deepspeed.PREFIX + ".", parent="Axolotl's Hugging Face Trainer, from the Axolotl keys of the "
                                                                    "same meaning (read below)")
    _model_and_data(d)
    _precision(d)
    _distributed(d)
    _training(d)
    _logging(d)


def _model_and_data(d: Draft) -> None:
    base = d.get("base_model")
    if base is None:
        _required(d, "base_model")
    hub.model(d, "base_model", str(base))
    for key in ("base_model_config", "tokenizer_config", "tokenizer_type", "model_type", "tokenizer_use_fast"):
        if d.has(key):
            d.none(key, "fp8launch reads the model's own config.json and tokenizer.json from the train.model folder")
    if d.get("reinit_weights") is True:
        d.mapped("reinit_weights", note="random initialisation: what fp8launch does unless the hf: folder holds weights")
    key = next((k for k in ("datasets", "pretraining_dataset") if d.get(k)), None)
    if key:
        datasets = d.get(key)
        datasets = datasets if isinstance(datasets, list) else [datasets]
        first = datasets[0] if datasets and isinstance(datasets[0], dict) else {}
        name = str(first.get("path", "")) if first else ""
        fmt = first.get("type") if first else None
        note = (f'"{fmt}" is a prompt format (template and loss masking): fp8launch trains on plain text, so write each row as text '
                f"first (a jsonl with a text column)" if fmt and fmt not in ("pretrain", "completion") else "")
        if len(datasets) > 1:
            note += ("; " if note else "") + f"{len(datasets)} datasets: fp8launch reads one, so join them"
        if name and os.path.exists(name):
            d.approximated(key, ("train.data", f"hf-dataset:{name}?column=text"), before=f"{name} through Axolotl's {fmt or 'default'} "
                           "prompt format", after="its text column as plain text", effect="every token is trained on: "
                           + (note or "no template, no loss masking; set train.tokenizer"))
        else:
            hub.dataset(d, key, name or "the dataset", note=note)
    d.group("test_datasets", "fp8launch's held-out data is [eval] data: a local file")
    if d.has("val_set_size"):
        if not _num(d.get("val_set_size")):
            d.mapped("val_set_size", note="0: no held-out split")
        else:
            d.none("val_set_size", "fp8launch does not split the training data: set [eval] data to a held-out local file")
    if d.has("sequence_len"):
        d.mapped("sequence_len", ("train.seq_len", int(d.get("sequence_len"))))
    if d.has("sample_packing"):
        d.mapped("sample_packing", note="fp8launch always packs: documents are laid end to end in seq_len windows (docs/data.md)")
    if d.has("pad_to_sequence_len"):
        d.mapped("pad_to_sequence_len", note="every fp8launch batch is seq_len long")
    for key in ("special_tokens", "tokens", "chat_template", "train_on_inputs", "dataset_prepared_path", "dataset_processes",
                "min_sample_len", "group_by_length"):
        d.group(key, "dataset preparation (templates, special tokens, loss masking, filters): fp8launch trains on every token of "
                     "the text")


def _precision(d: Draft) -> None:
    half = "bf16" if d.get("bf16") in (True, "auto", "true") else "fp16" if d.get("fp16") is True else None
    if d.get("fp8") is True:
        d.mapped("fp8", ("precision.mode", "fp8"), ("precision.backend", "torchao"), ("precision.torchao.recipe", "tensorwise"),
                 ("precision.torchao.skip_small", False), ("precision.torchao.pad_inner_dim", False), ("precision.keep_first_last", True),
                 note="Axolotl's torchao Float8LinearConfig (tensorwise) through Accelerate, which keeps the first and last Linear")
        if d.has("fp8_enable_fsdp_float8_all_gather"):
            gather = d.get("fp8_enable_fsdp_float8_all_gather") is True
            d.mapped("fp8_enable_fsdp_float8_all_gather", ("precision.torchao.fsdp_float8_all_gather", gather),
                     ("precision.torchao.precompute_scale", False),
                     note="Axolotl does not precompute the float8 scales" + ("; its force_recompute_fp8_weight_in_bwd is torchao's "
                                                                              "default in fp8launch" if gather else ""))
        if half:
            d.mapped("bf16" if half == "bf16" else "fp16", ("precision.high_precision", half))
    else:
        if d.has("fp8"):
            d.mapped("fp8", note="off")
        if d.has("fp8_enable_fsdp_float8_all_gather"):
            d.none("fp8_enable_fsdp_float8_all_gather", "fp8 is off: no effect")
        if half:
            d.mapped("bf16" if half == "bf16" else "fp16", ("precision.mode", half),
                     note='"auto": bf16 where the GPU has it (every GPU fp8launch runs FP8 on)' if d.get("bf16") == "auto" else "")
        elif d.has("bf16") or d.has("fp16"):
            d.mapped(tuple(k for k in ("bf16", "fp16") if d.has(k)), ("precision.mode", "fp32"))
    for key in ("bf16", "fp16"):
        if d.has(key) and key not in d.taken:
            d.mapped(key, note="off" if d.get(key) is False else "")
    if d.has("tf32"):  # Axolotl passes tf32 to TrainingArguments, which sets torch.backends.cuda.matmul.allow_tf32
        if d.get("tf32") in (False, "false"):
            d.mapped("tf32", note="off: fp32 matmuls in full fp32, torch's default (torch.backends.cuda.matmul.allow_tf32 = False), "
                                  "which fp8launch keeps")
        else:
            d.none("tf32", "the HF Trainer turns TF32 matmuls on (torch.backends.cuda.matmul.allow_tf32); fp8launch keeps torch's "
                           "default, off: the matmuls left in fp32 (outside the bf16 / FP8 ones: the loss, optimizer-side math) run "
                           "in full fp32, a little slower and no less precise")
    for key in ("float32", "bfloat16", "float16"):
        if d.has(key):
            d.none(key, "fp8launch sets the dtypes from precision.mode / high_precision")
    for key in ("load_in_8bit", "load_in_4bit", "adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                "lora_target_linear"):
        if d.has(key):
            if d.get(key) is False:
                d.mapped(key, note="off")
            else:
                d.none(key, "fp8launch trains every parameter of the model: no LoRA / QLoRA adapters, no quantized base weights")


def _fsdp_version(d: Draft) -> tuple[int, tuple[str, ...]]:
    """The FSDP version as Axolotl resolves it, and the keys that said it."""
    for key in ("fsdp_version", "fsdp_config.fsdp_version", "fsdp_config.version"):
        if d.has(key):
            return int(d.get(key)), (key,)
    return 1, ()


def _distributed(d: Draft) -> None:
    d.world_unknown("`accelerate launch` / torchrun set Axolotl's world size, not the YAML")
    fsdp = d.get("fsdp_config")
    on = bool(d.get("fsdp")) or bool(fsdp)
    if on:
        version, said = _fsdp_version(d)
        sources = said + tuple(k for k in ("fsdp",) if d.has(k))
        if version == 2:
            d.mapped(sources, ("distributed.strategy", "fsdp2"), note="fsdp_config turns FSDP on" if not d.has("fsdp") else
                     "the deprecated fsdp list turns FSDP on")
        else:
            d.approximated(sources or "(fsdp_version)", ("distributed.strategy", "fsdp2"), value=version,
                           before="FSDP1" + ("" if said else " (Axolotl's default with fsdp_config: fsdp_version 1)"),
                           after="FSDP2 (fully_shard)", effect="parameters, gradients and optimizer states are sharded as before; "
                           "FSDP1's own knobs have no equivalent")
        if isinstance(fsdp, dict):
            _fsdp_config(d)
    elif deepspeed.PREFIX not in d.data and not d.has("deepspeed"):
        d.mapped("(strategy)", ("distributed.strategy", "ddp"), note="no fsdp_config or deepspeed: Axolotl runs DDP")
    if d.has("tensor_parallel_size"):
        d.mapped("tensor_parallel_size", ("distributed.tensor_parallel", int(d.get("tensor_parallel_size"))))
    if d.has("expert_parallel_size"):
        d.mapped("expert_parallel_size", ("distributed.expert_parallel", int(d.get("expert_parallel_size"))))
    _context_parallel(d)
    _data_parallel(d)
    if d.has("torch_compile"):
        on = d.get("torch_compile") in (True, "auto")
        d.mapped("torch_compile", ("compile.enabled", on))
        if on and d.has("torch_compile_mode"):
            d.mapped("torch_compile_mode", ("compile.mode", str(d.get("torch_compile_mode"))))
    for key in ("torch_compile_backend", "torch_compile_options"):
        if d.has(key):
            d.none(key, "fp8launch compiles each block with inductor")
    checkpointing = d.get("gradient_checkpointing")
    if checkpointing is True or checkpointing == "offload":
        d.mapped("gradient_checkpointing", ("activation_checkpointing.mode", "full"),
                 note="" if checkpointing is True else "without the offload: fp8launch recomputes, it does not offload")
    elif d.has("gradient_checkpointing"):
        d.mapped("gradient_checkpointing", note="off")
    if d.has("activation_offloading") and d.get("activation_offloading") is not False:
        d.none("activation_offloading", "fp8launch does not offload activations to the CPU: they stay on the GPU (with "
                                        "activation_checkpointing, only each block's input)")
    d.group("gradient_checkpointing_kwargs", "fp8launch checkpoints each block with torch's non-reentrant checkpoint")
    for key in ("attn_implementation", "flash_attention", "sdp_attention", "flex_attention", "xformers_attention",
                "flex_attn_compile_kwargs", "sage_attention", "eager_attention", "experts_implementation", "tiled_mlp"):
        d.group(key, "kernels: fp8launch's builtin models use torch's scaled_dot_product_attention and grouped GEMMs; hf: models their own")
    for key in ("plugins",):
        d.group(key, "Axolotl plugins (e.g. Liger kernels): fp8launch runs the model's own modules")
    d.bundle(tuple(k for k in d.untaken() if k.startswith("liger_")),
             "Liger kernels: fp8launch runs the model's own modules (FP8 replaces the Linears, compile fuses the rest)")
    _loading(d)


AXOLOTL_AT = "axolotl 067b021c"


def _loading(d: Draft) -> None:
    """How Axolotl loads and patches the model (src/axolotl/utils/schemas/{model,config}.py, loaders/model.py,
    loaders/patch_manager.py, prompt_strategies/chat_template.py at 067b021c), each said with what fp8launch does instead."""
    if d.has("use_kernels"):
        on = "on" if d.get("use_kernels") else "off in the source"
        d.none("use_kernels", f"transformers' Hub kernels ({on}): Axolotl passes use_kernels to from_pretrained, which swaps "
                              "modules for kernels from the Hub, e.g. MegaBlocks MoE (loaders/model.py, "
                              f"{AXOLOTL_AT}); fp8launch runs the model's own modules (builtin MoE: grouped GEMMs; FP8 replaces "
                              "the Linears, compile fuses the rest): nothing to set, the numerics are the model's")
    quant = tuple(k for k in d.untaken() if k == "model_quantization_config" or k.startswith("model_quantization_config_kwargs"))
    d.bundle(quant, "the quantization transformers loads the checkpoint with (Mxfp4Config: gpt-oss's MXFP4 experts, "
                    "dequantize: true unpacks them to the training dtype; FineGrainedFP8Config; loaders/model.py "
                    f"_set_quantization_config, {AXOLOTL_AT}): fp8launch reads an hf: folder's weights as plain tensors of "
                    "the model's shapes, not quantized blocks and scales: save a dequantized copy once (transformers: "
                    "from_pretrained(MODEL, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16)"
                    ".save_pretrained(DIR)) and set train.model = \"hf:DIR\"; fp8launch's own FP8 is precision.mode")
    if d.has("experimental_skip_move_to_device"):
        d.none("experimental_skip_move_to_device",
               "Axolotl leaves the loaded model on the CPU until FSDP / DeepSpeed shards it (default true; false moves it whole "
               f"to the GPU first: loaders/model.py, {AXOLOTL_AT}); fp8launch always builds on the meta device and gives each "
               "rank storage for its shard only, an hf: folder's weights read one module at a time: nothing to set")
    if d.has("eot_tokens"):
        d.none("eot_tokens", "the chat template's end-of-turn tokens whose labels Axolotl trains or masks in each "
                             f"conversation (prompt_strategies/chat_template.py, {AXOLOTL_AT}); fp8launch trains on every "
                             "token of the text it reads, with no chat template or turn masks: render the conversations "
                             "with the template into text once (see datasets), the turn-ending tokens included")
    if d.has("flash_attn_cross_entropy"):
        d.none("flash_attn_cross_entropy", "flash-attn's fused cross-entropy, patched into Llama-derived models "
                                           f"(loaders/patch_manager.py _patch_loss_llama, {AXOLOTL_AT}); fp8launch computes "
                                           "the loss with torch's cross_entropy in fp32 (compiled with the model where "
                                           "compile.enabled): nothing to set, the same loss")
    if d.has("flash_attn_fuse_mlp"):
        d.none("flash_attn_fuse_mlp", "xformers' fused SwiGLU replacing a Llama MLP (loaders/patch_manager.py, "
                                      f"replace_llama_mlp_with_swiglu, {AXOLOTL_AT}); fp8launch runs the model's own MLP (FP8 "
                                      "replaces its Linears, compile fuses the activation): nothing to set, the same function")


def _context_parallel(d: Draft) -> None:
    """context_parallel_size (or its deprecated name sequence_parallel_degree, read only without it: check_context_parallel_size)
    and the ring-flash-attn options that go with it."""
    key = next((k for k in ("context_parallel_size", "sequence_parallel_degree") if d.get(k)), None)
    cp = int(d.get(key)) if key else 1
    if key and cp > 1:
        d.mapped(key, ("distributed.context_parallel", cp),
                 note=("Axolotl's deprecated name for context_parallel_size; " if key == "sequence_parallel_degree" else "")
                 + f"each sequence split over {cp} ranks that read the same batches (world / {cp} data-parallel ranks, as "
                   "Axolotl's batch_size counts them): ring-flash-attn there, torch's ring attention here, the same attention")
    elif key:
        d.mapped(key, note="off")
    for other in ("context_parallel_size", "sequence_parallel_degree"):
        if d.has(other) and other != key:
            d.mapped(other, note="off" if not d.get(other) or int(d.get(other)) <= 1 else
                     "Axolotl reads the deprecated sequence_parallel_degree only without context_parallel_size")
    for option, what in (("ring_attn_func", "ring-flash-attn's attention function"),
                         ("heads_k_stride", "ring-flash-attn's stride over the key heads (memory against speed)")):
        if d.has(option):
            d.none(option, f"{what}: " + ("fp8launch's context parallel is torch's ring attention (causal, load-balanced head and "
                                          "tail), nothing to choose" if cp > 1 else "no context parallelism: no effect"))


def _data_parallel(d: Draft) -> None:
    """dp_shard_size x dp_replicate_size (Axolotl's ParallelismConfig: the data-parallel ranks, HSDP where replicate > 1):
    the placeholder world holds them (placeholders.size_world), times the model-parallel degrees."""
    shard, replicate = d.get("dp_shard_size"), d.get("dp_replicate_size")
    shard = shard if isinstance(shard, int) and not isinstance(shard, bool) and shard > 0 else None
    replicate = replicate if isinstance(replicate, int) and not isinstance(replicate, bool) and replicate > 0 else 1
    experts = d.get("expert_parallel_size")
    experts = experts if isinstance(experts, int) and not isinstance(experts, bool) and experts > 1 else 1
    if shard:  # Axolotl's experts split the ranks further: "world size 4 minimum: expert_parallel_size x dp_shard_size"
        d.dp_stated = shard * replicate * experts  # (examples/expert_parallel/qwen3_30ba3b_ep_fsdp_fft_4gpu.yaml)
        d.mapped("dp_shard_size", value=shard, note=f"FSDP2 shards over the data-parallel ranks ({d.dp_stated}"
                                                    + (f" with expert_parallel_size {experts}" if experts > 1 else "")
                                                    + ": the placeholder world holds them, times tensor / context parallel)")
    elif d.has("dp_shard_size"):
        d.none("dp_shard_size", "not a positive count: Axolotl derives it from the world size; so does fp8launch")
    if d.has("dp_replicate_size") and replicate > 1:
        d.approximated("dp_replicate_size", value=replicate, before=f"HSDP: {replicate} replicas, each sharded over its own ranks",
                       after="FSDP2 sharded over every data-parallel rank", effect="less memory per GPU, more traffic between the "
                       "replicas' nodes")
    elif d.has("dp_replicate_size"):
        d.mapped("dp_replicate_size", note="no replication: plain FSDP")


def _fsdp_config(d: Draft) -> None:
    p = "fsdp_config."

    def key(name: str) -> str | None:
        return next((k for k in (p + name, p + "fsdp_" + name) if d.has(k)), None)

    for name in ("fsdp_version", "version"):
        if d.has(p + name) and p + name not in d.taken:
            d.mapped(p + name, note="fsdp_version says it")
    if (k := key("reshard_after_forward")) is not None and d.get(k) is True:
        d.mapped(k, ("distributed.fsdp2.reshard_after_forward", True))
    else:
        d.mapped(k or "(reshard_after_forward)", ("distributed.fsdp2.reshard_after_forward", True), value=d.get(k) if k else None,
                 note="Axolotl passes reshard_after_forward to Accelerate only when true (setup_fsdp_envs); otherwise Accelerate's "
                      "FSDP2 default, true, is what ran")
    if (k := key("offload_params")) is not None:
        d.mapped(k, ("distributed.fsdp2.cpu_offload", d.get(k) is True))
    if (k := key("activation_checkpointing")) is not None:
        if d.get(k) is True:
            d.mapped(k, ("activation_checkpointing.mode", "full"))
        else:
            d.mapped(k, note="off")
    sources = tuple(k for k in (key("auto_wrap_policy"), key("transformer_layer_cls_to_wrap")) if k)
    if sources:
        d.mapped(sources, note="fp8launch shards each transformer block")
    for name in ("state_dict_type", "cpu_ram_efficient_loading", "sync_module_states", "use_orig_params"):
        if (k := key(name)) is not None:
            d.mapped(k, note="fp8launch builds the model on the meta device, gives each rank its shard and checkpoints sharded (DCP)")
    d.group("fsdp_config", "an FSDP option fp8launch's FSDP2 does not have")
    if d.has("fsdp_final_state_dict_type"):
        d.none("fsdp_final_state_dict_type", "`fp8launch export` writes the final weights from a checkpoint")


def _training(d: Draft) -> None:
    if d.has("micro_batch_size"):
        d.note_batch("micro", d.get("micro_batch_size"), "micro_batch_size")
    if d.has("gradient_accumulation_steps"):
        d.note_batch("accum", d.get("gradient_accumulation_steps"), "gradient_accumulation_steps")
    elif d.has("batch_size") and d.batch.micro:
        d.note_batch("accum", max(1, int(d.get("batch_size")) // d.batch.micro), "batch_size")
    if d.has("max_steps") and int(d.get("max_steps")) > 0:
        d.mapped("max_steps", ("train.steps", int(d.get("max_steps"))))
        if d.has("num_epochs"):
            d.mapped("num_epochs", note="max_steps decides the length, as in the HF Trainer")
    elif d.has("num_epochs"):
        d.placeholder("num_epochs", "train.steps", 100, "fp8launch counts optimizer steps, not epochs: the steps of an epoch depend on "
                      "the dataset's size", "epochs x dataset sequences / global batch")
    _optimizer(d)
    _schedule(d)
    if d.has("max_grad_norm"):
        d.mapped("max_grad_norm", ("train.max_grad_norm", float(d.get("max_grad_norm"))))
    if d.has("seed"):
        d.mapped("seed", ("train.seed", int(d.get("seed"))))
    else:  # Axolotl passes seed to TrainingArguments only when set (core/builders/base.py:649, 067b021c)
        d.mapped("(seed)", ("train.seed", hub.HF_TRAINER_SEED), value=hub.HF_TRAINER_SEED,
                 note="no seed: Axolotl leaves it to the Hugging Face Trainer, whose TrainingArguments.seed defaults to 42")
    if d.has("output_dir"):
        d.mapped("output_dir", ("train.output_dir", str(d.get("output_dir"))))
    if d.has("save_steps"):
        d.mapped("save_steps", ("train.checkpoint_every", int(d.get("save_steps"))))
    if d.has("saves_per_epoch"):
        d.none("saves_per_epoch", "fp8launch checkpoints every N steps (train.checkpoint_every) and at the end")
    if d.has("save_total_limit"):
        d.mapped("save_total_limit", ("train.keep_checkpoints", int(d.get("save_total_limit"))))
    for key in ("save_only_model", "save_safetensors", "hub_model_id", "hub_strategy", "save_first_step"):
        if d.has(key):
            d.none(key, "fp8launch checkpoints the whole training state; `fp8launch export` writes the model as a Hugging Face folder")
    if d.has("resume_from_checkpoint"):
        d.mapped("resume_from_checkpoint", ("train.resume", str(d.get("resume_from_checkpoint"))))
    for key in ("evals_per_epoch", "eval_steps", "eval_strategy", "eval_batch_size", "eval_sample_packing"):
        if d.has(key):
            d.none(key, "fp8launch evaluates every eval.every steps on [eval] data (a local held-out file)")


def _required(d: Draft, key: str) -> None:
    """A key Axolotl's schema requires (no default: src/axolotl/utils/schemas/training.py:116 `learning_rate: str | float`,
    model.py:17 `base_model: str`, 067b021c): Axolotl stops with pydantic's "Field required", and so does the import, naming
    the misspelt key the file holds where there is one."""
    near = next((u.key for u in d.unknowns if u.near == key), None)
    said = f" ({near} is not it: Axolotl drops an unknown key)" if near else ""
    raise SourceError(d.path, with_fix(f"{key}: missing{said}; Axolotl stops: its schema requires it (pydantic: Field required)",
                                       f"set {key}" + (f" (rename {near})" if near else "")))


def _optimizer(d: Draft) -> None:
    name = str(d.get("optimizer", "adamw_torch_fused"))
    source = "optimizer" if d.has("optimizer") else "(optimizer)"
    if name in ADAMW:
        d.mapped(source, ("train.optimizer", "adamw"), value=name, note="" if d.has("optimizer") else "Axolotl's default")
    elif name in STATES:
        d.mapped(source, ("train.optimizer", "adamw"), ("precision.optimizer_states", STATES[name]),
                 note=f"torchao's AdamW{'8bit' if STATES[name] == 'int8' else 'Fp8'}: {STATES[name]} moments, one scale per 256 values")
    elif name in NEAR_STATES:
        d.approximated(source, ("train.optimizer", "adamw"), ("precision.optimizer_states", "int8"), before=NEAR_STATES[name],
                       after="torchao's AdamW8bit (dynamic-tree 8-bit codes, one scale per 256 values)",
                       effect="8-bit moments in both; their quantization and so their rounding differ")
    elif name in ("sgd", "adam"):
        d.mapped(source, ("train.optimizer", name))
    else:
        d.approximated(source, ("train.optimizer", "adamw"), before=name, after="torch's AdamW",
                       effect=f"fp8launch has adamw, adam and sgd: another update rule than {name}'s")
    if d.has("learning_rate"):
        d.mapped("learning_rate", ("train.lr", _num(d.get("learning_rate"))))
    else:
        _required(d, "learning_rate")
    wd = _num(d.get("weight_decay", 0.0))
    d.mapped("weight_decay" if d.has("weight_decay") else "(weight_decay)", ("train.weight_decay", wd),
             ("train.weight_decay_exclude", "norms_and_biases"), value=wd,
             note="the HF Trainer gives biases and LayerNorm / RMSNorm weights no weight decay")
    betas = (d.get("adam_beta1"), d.get("adam_beta2"))
    if any(b is not None for b in betas):
        d.mapped(tuple(k for k in ("adam_beta1", "adam_beta2") if d.has(k)),
                 ("train.adam_betas", [_num(betas[0] if betas[0] is not None else 0.9),
                                       _num(betas[1] if betas[1] is not None else 0.999)]))
    if d.has("adam_epsilon"):
        d.mapped("adam_epsilon", ("train.adam_eps", _num(d.get("adam_epsilon"))))
    d.group("optim_args", f"arguments of {name}: fp8launch's optimizers take lr, betas, eps and weight_decay only")


def _schedule(d: Draft) -> None:
    kind = str(d.get("lr_scheduler", "cosine"))
    source = "lr_scheduler" if d.has("lr_scheduler") else "(lr_scheduler)"
    ratio = d.get("cosine_min_lr_ratio")
    if kind == "cosine":
        sources = (source, "cosine_min_lr_ratio") if ratio is not None else source
        d.mapped(sources, ("train.min_lr_ratio", _num(ratio) if ratio is not None else 0.0),
                 value=[kind, ratio] if ratio is not None else kind,
                 note=("cosine decay to cosine_min_lr_ratio x lr" if ratio is not None else "the HF Trainer's cosine decays to 0")
                 + ("" if d.has("lr_scheduler") else " (Axolotl's default scheduler)"))
    elif kind in ("constant", "constant_with_warmup"):
        d.mapped(source, ("train.min_lr_ratio", 1.0), note="constant after the warm-up")
    else:
        d.approximated(source, ("train.min_lr_ratio", 0.0), before=f"the Hugging Face {kind} schedule", after="a cosine decay to 0",
                       effect="another lr between the warm-up and the end of the run")
    if d.has("cosine_min_lr_ratio") and "cosine_min_lr_ratio" not in d.taken:
        d.none("cosine_min_lr_ratio", f"read only with lr_scheduler cosine, not {kind}")
    constant = d.get("cosine_constant_lr_ratio")
    if constant is not None:
        if not constant:
            d.mapped("cosine_constant_lr_ratio", note="0: off")
        else:
            d.approximated("cosine_constant_lr_ratio", before=f"the lr held for the first {constant} of the decay",
                           after="a cosine from the end of the warm-up", effect="a lower lr in that stretch")
    _warmup(d)
    d.group("lr_scheduler_kwargs", "fp8launch's schedule has warmup_steps, steps and min_lr_ratio only")


def _warmup(d: Draft) -> None:
    steps = d.value("train.steps") if "train.steps" not in d.placeholders else None
    value = d.get("warmup_steps")
    if value is not None and float(value).is_integer():
        n = int(value)
        if n == 1:
            d.mapped("warmup_steps", ("train.warmup_steps", 2), note="Axolotl turns 1 warm-up step into 2")
        else:
            d.mapped("warmup_steps", ("train.warmup_steps", n))
    elif value is not None:
        d.none("warmup_steps", f"Axolotl's schema refuses {value}: warmup_steps is an integer (a fraction of the steps is "
                               f"warmup_ratio); the spec uses {d.used('train.warmup_steps')} warm-up steps: set train.warmup_steps")
    elif d.has("warmup_ratio"):
        if steps:
            d.mapped("warmup_ratio", ("train.warmup_steps", max(int(_num(d.get("warmup_ratio")) * steps), 0)),
                     note=f"int(warmup_ratio x {steps} steps)")
        else:
            d.none("warmup_ratio", "a share of the steps, and the YAML sets no step count; set train.warmup_steps")
    elif steps:
        n = min(int(0.03 * steps), 100)
        d.mapped("(warmup_steps)", ("train.warmup_steps", 2 if n == 1 else n), value=2 if n == 1 else n,
                 note=f"Axolotl's default: min(int(0.03 x {steps} steps), 100)")
    else:
        d.none("(warmup_steps)", "Axolotl warms up for min(int(0.03 x steps), 100) steps, and the YAML sets no step count: set "
                                 f"train.warmup_steps (the spec uses {d.used('train.warmup_steps')})")


def _logging(d: Draft) -> None:
    if d.has("logging_steps"):
        d.mapped("logging_steps", ("train.log_every", int(d.get("logging_steps"))))
    project = d.get("wandb_project")
    if project:
        table = {"project": str(project)} | ({"entity": str(d.get("wandb_entity"))} if d.get("wandb_entity") else {})
        d.mapped(tuple(k for k in ("wandb_project", "wandb_entity") if d.has(k)), ("log.wandb", table))
    for key in ("wandb_name", "wandb_run_id", "wandb_watch", "wandb_log_model", "wandb_mode"):
        if d.has(key):
            d.none(key, "fp8launch names the W&B run after the spec and keeps its id in the checkpoint")
    if d.get("use_tensorboard") is True:
        d.mapped("use_tensorboard", ("log.tensorboard", True))
    if d.has("strict"):
        d.none("strict", "Axolotl's own config check: fp8launch's schema rejects unknown keys always")


def _name(d: Draft) -> str | None:
    name = d.get("wandb_name")
    return str(name) if name else None


KEYS = ("base_model", "datasets", "micro_batch_size", "sequence_len", "num_epochs", "learning_rate", "output_dir", "fp8",
        "fp8_enable_fsdp_float8_all_gather", "sample_packing", "lr_scheduler", "adapter", "load_in_8bit", "load_in_4bit",
        "gradient_checkpointing", "torch_compile", "special_tokens", "val_set_size", "wandb_project", "fsdp_version")

KIND = Kind(id="axolotl", title="Axolotl YAML",
            score=lambda data: count(data, KEYS) + 3 * ("base_model" in data) if "base_model" in data or
            ("datasets" in data and ("micro_batch_size" in data or "sequence_len" in data)) else 0,
            read=_read, name=_name, unknown=vet,
            other="an Axolotl setting fp8launch has no equivalent for")
