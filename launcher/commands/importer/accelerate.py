"""An Accelerate config (what `accelerate config` writes; huggingface/accelerate
src/accelerate/commands/config/cluster.py and config_args.py). What Accelerate really does with it, read from
its code (accelerate 1.15, installed: tests/test_import.py loads each file through its load_config_from_file):

- The file is read with yaml.safe_load, so `distributed_type: NO` is the boolean false; ClusterConfig keeps it,
  and `accelerate launch` matches it against no distributed type: one process, as "NO".
- A top-level key ClusterConfig lacks stops `accelerate launch` ("had unknown keys"): the import stops too.
- `accelerate launch` turns each fp8_config key K into the environment variable ACCELERATE_FP8_<K> (fp8_ prefixed
  when missing: commands/launch.py, utils/launch.py setup_fp8_env), and the recipe handlers read only
  ACCELERATE_FP8_{BACKEND, FORMAT, MARGIN, INTERVAL, AMAX_HISTORY_LEN, AMAX_COMPUTE_ALGO, OVERRIDE_*,
  USE_AUTOCAST_DURING_EVAL, USE_MXFP8_BLOCK_SCALING, OPT_LEVEL, PAD_INNER_DIM, ENABLE_FSDP_FLOAT8_ALL_GATHER}
  (utils/dataclasses.py TERecipeKwargs, AORecipeKwargs, MSAMPRecipeKwargs). The questionnaire's own key names
  (amax_history_length, amax_compute_algorithm, optimization_level) are therefore read by nothing: the run used
  Accelerate's defaults (1024, "most_recent", O2), which is what is imported, and said.
- TE: DelayedScaling (MXFP8BlockScaling with use_mxfp8_block_scaling) over every nn.Linear and nn.LayerNorm
  swapped for TE's (utils/transformer_engine.py convert_model, apply_fp8_autowrap); fp8 autocast off in eval
  unless use_autocast_during_eval.
- AO: torchao tensorwise Float8LinearConfig with pad_inner_dim and enable_fsdp_float8_all_gather defaulting to
  true; the first and the last Linear stay in high precision, and dims not divisible by 16 (utils/ao.py).
- MS-AMP: msamp.initialize at opt_level (O2 unless set); every Linear converted.
- No backend: the first installed of torchao, Transformer Engine, MS-AMP (accelerator.py).
- FSDP: fsdp_version 1 unless set (FullyShardedDataParallelPlugin reads FSDP_VERSION, default "1").
"""

from __future__ import annotations

import os

from launcher.errors import SourceError, with_fix

from . import context, deepspeed, hub
from .draft import Draft
from .kind import Kind, count
from .known import Unknown, unknown
from .known import accelerate as known

TYPES = {"NO": "ddp", "MULTI_GPU": "ddp", "MULTI_CPU": "ddp", "FSDP": "fsdp2", "DEEPSPEED": "deepspeed"}
BACKENDS = {"TE": "te", "AO": "torchao", "MSAMP": "msamp", "MS-AMP": "msamp"}
IGNORED = {"amax_history_length": ("amax_history_len", "precision.te.amax_history_len", 1024),
           "amax_compute_algorithm": ("amax_compute_algo", "precision.te.amax_compute_algo", "most_recent"),
           "optimization_level": ("opt_level", "precision.msamp.opt_level", "O2")}
"""Keys `accelerate config` writes that Accelerate never reads: (the key it reads, the spec key, Accelerate's default)."""
FP8_READ = ("fp8_backend", "fp8_format", "fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo",
            "fp8_override_linear_precision", "fp8_use_autocast_during_eval", "fp8_use_mxfp8_block_scaling", "fp8_opt_level",
            "fp8_pad_inner_dim", "fp8_enable_fsdp_float8_all_gather")
"""The launch arguments (an fp8_config key K is the argument K, or fp8_K) whose ACCELERATE_FP8_* variable a recipe handler
reads (utils/dataclasses.py)."""
NESTED = {"fsdp_config": "fsdp_", "dynamo_config": "dynamo_", "deepspeed_config": "", "parallelism_config": "parallelism_config_",
          "megatron_lm_config": "megatron_lm_", "mpirun_config": "mpirun_"}
"""The nested tables whose keys become `accelerate launch` arguments, and the prefix that argument's name has."""


def vet(d: Draft) -> list[Unknown]:
    """Top-level keys ClusterConfig (SageMakerConfig) lacks: refused, as load_config_from_file refuses them; nested keys no
    launch argument or recipe handler reads: reported."""
    sagemaker = str(d.get("compute_environment", "LOCAL_MACHINE")) == "AMAZON_SAGEMAKER"
    top = known.SAGEMAKER if sagemaker else known.CLUSTER
    says = 'accelerate launch stops: load_config_from_file raises "The config file ... had unknown keys"'
    keys = [str(k) for k in d.data if k != deepspeed.PREFIX]  # a key set to null too: Accelerate counts every key
    out = [Unknown(k, near, says, refused=True, tool="Accelerate") for k, near in unknown(keys, top)]
    for table, prefix in NESTED.items():
        names = [a for a in known.LAUNCH if a.startswith(prefix)]
        allowed = set(names) | {a[len(prefix):] for a in names}
        for key in [k[len(table) + 1:] for k in d.leaves if k.startswith(table + ".")]:
            name = key.split(".")[0]
            if name not in allowed:
                near = unknown([name], allowed)[0][1]
                out.append(Unknown(f"{table}.{name}", f"{table}.{near}" if near else None,
                                   "accelerate launch sets it as an argument nothing reads", tool="Accelerate"))
    read = set(FP8_READ) | {f"fp8_{k}" for k in IGNORED}
    for key in [k[len("fp8_config."):] for k in d.leaves if k.startswith("fp8_config.")]:
        name = key.split(".")[0]
        arg = name if name.startswith("fp8") else f"fp8_{name}"
        if arg not in read:
            near = unknown([arg], read)[0][1]
            out.append(Unknown(f"fp8_config.{name}", f"fp8_config.{near}" if near else None,
                               f"accelerate launch exports ACCELERATE_{arg.upper()}, which no recipe handler reads",
                               tool="Accelerate"))
    return list({u.key: u for u in out}.values())


def _type(d: Draft) -> str:
    """distributed_type as Accelerate matches it: YAML reads NO as false, which matches no type: one process, as NO."""
    value = d.get("distributed_type", "NO")
    return "NO" if value is False else str(value).upper()


def _read(d: Draft) -> None:
    _launch(d)
    strategy = _strategy(d)
    _precision(d, strategy)
    _fsdp(d)
    _dynamo(d)
    _parallelism(d)
    if deepspeed.PREFIX in d.data:
        deepspeed.read_config(d, deepspeed.PREFIX + ".", parent="Accelerate, at prepare(), from the training script's model, "
                                                                "optimizer, scheduler and dataloader (fp8launch's own train.* apply)")
    hub.script(d, "an Accelerate config")
    d.bundle(("debug", "downcast_bf16", "enable_cpu_affinity", "same_network", "main_training_function", "tpu_env", "tpu_use_cluster",
              "tpu_use_sudo", "tpu_name", "tpu_zone", "commands", "command_file"),
             "`accelerate launch` options with no part in what fp8launch runs (its own entrypoint, one process per GPU, no TPUs)")


def _launch(d: Draft) -> None:
    env = d.get("compute_environment", "LOCAL_MACHINE")
    if d.has("compute_environment"):
        if env == "LOCAL_MACHINE":
            d.mapped("compute_environment", ("launch.launcher", "torchrun"))
        else:
            d.approximated("compute_environment", ("launch.launcher", "torchrun"), before=f"launched on {env}",
                           after="launched by torchrun (or SLURM / Kubernetes: launch.launcher)",
                           effect="where and how the processes start; what each process trains is the same")
    machines = int(d.get("num_machines", 1))
    procs = d.get("num_processes")
    if d.has("num_machines"):
        d.mapped("num_machines", ("distributed.nodes", machines))
    if _type(d) == "NO":
        written = d.get("distributed_type")
        d.mapped("distributed_type" if d.has("distributed_type") else "(distributed_type)", ("distributed.strategy", "ddp"),
                 ("distributed.procs_per_node", 1), value="NO",
                 note="one process" + ("" if d.has("distributed_type") else ", Accelerate's default")
                 + (" (YAML reads an unquoted NO as false, which Accelerate runs as NO)" if written is False else ""))
        if procs is not None:
            d.mapped("num_processes", note="one process (distributed_type NO)")
    elif procs is not None:
        per, rest = divmod(int(procs), max(1, machines))
        if rest:
            d.approximated("num_processes", ("distributed.procs_per_node", max(1, per)), before=f"{procs} processes on {machines} machines",
                           after=f"{max(1, per)} per node x {machines} = {max(1, per) * machines} processes",
                           effect="fp8launch runs the same number on every node: fewer data-parallel ranks, a smaller global batch")
        else:
            d.mapped("num_processes", ("distributed.procs_per_node", per), note=f"{procs} processes over {machines} machine(s)")
    else:
        d.world_unknown("num_processes is not set: `accelerate launch` counts the GPUs")
    if d.has("machine_rank"):
        d.mapped("machine_rank", note="each node's rank is given at launch: fp8launch run --node-rank R (or NODE_RANK)")
    ip, port = d.get("main_process_ip"), d.get("main_process_port")
    if ip or port:
        sources = tuple(k for k in ("main_process_ip", "main_process_port") if d.has(k))
        d.mapped(sources, ("launch.rdzv_endpoint", f"{ip or 'localhost'}:{port or 29500}"))
    if d.has("rdzv_backend"):
        if d.get("rdzv_backend") == "c10d":
            d.mapped("rdzv_backend", ("launch.rdzv_backend", "c10d"))
        else:
            d.approximated("rdzv_backend", before=f"{d.get('rdzv_backend')} rendezvous", after="torchrun's c10d rendezvous "
                           "(launch.rdzv_backend's one value)", effect="the same on one node; across nodes every node must reach "
                           "launch.rdzv_endpoint")
    if d.has("use_cpu"):
        d.mapped("use_cpu", ("launch.device", "cpu" if d.get("use_cpu") is True else "auto"))
    ids = d.get("gpu_ids")
    if ids is not None:
        if str(ids) == "all":
            d.mapped("gpu_ids", note="every GPU: what fp8launch uses")
        else:
            d.mapped("gpu_ids", ("launch.env", {"CUDA_VISIBLE_DEVICES": str(ids)}))
    _cluster(d)


SAGEMAKER_JOB = ("ec2_instance_type", "iam_role_name", "image_uri", "base_job_name", "profile", "region", "pytorch_version",
                 "transformers_version", "py_version", "additional_args", "sagemaker_inputs_file", "sagemaker_metrics_file")
"""SageMakerConfig's fields that describe the SageMaker training job `accelerate launch` creates (utils/launch.py
prepare_sagemager_args_inputs: the Estimator's role, instance_type, image_uri, ...; Accelerate 1.15)."""


def _cluster(d: Draft) -> None:
    """Where `accelerate launch` starts the processes: an mpirun over a hostfile (MULTI_CPU, utils/launch.py
    prepare_simple_launcher_cmd_env), a SageMaker job. fp8launch starts them with torchrun on each node, one SLURM job or a
    Kubernetes manifest (launch.launcher)."""
    if d.has("mpirun_config.mpirun_hostfile"):
        d.none("mpirun_config.mpirun_hostfile", "Accelerate starts the processes with mpirun on the hosts this file lists; fp8launch "
               "starts torchrun on each node (`fp8launch run --node-rank R`, launch.rdzv_endpoint the first node), or one SLURM job "
               '(launch.launcher = "slurm") or Kubeflow job (launch.launcher = "kubernetes") whose scheduler picks the hosts: '
               "distributed.nodes is their number")
    for key in SAGEMAKER_JOB:
        if d.has(key) and key not in d.taken:
            d.none(key, "the SageMaker training job Accelerate creates (its instance type, IAM role, image): fp8launch makes no cloud "
                        "job; run its torchrun command on each instance, or a SLURM / Kubernetes job (launch.launcher) on the "
                        "cluster's GPU instances, with distributed.nodes and procs_per_node their count")


def _strategy(d: Draft) -> str:
    kind = _type(d)
    if kind == "NO":
        return "ddp"
    strategy = TYPES.get(kind)
    if kind == "FSDP":
        version = int(d.get("fsdp_config.fsdp_version", 1))
        sources = ("distributed_type", "fsdp_config.fsdp_version") if d.has("fsdp_config.fsdp_version") else "distributed_type"
        if version == 2:
            d.mapped(sources, ("distributed.strategy", "fsdp2"))
        else:
            d.approximated(sources, ("distributed.strategy", "fsdp2"),
                           before="FSDP1 (Accelerate's default fsdp_version 1): flat parameters", after="FSDP2 (fully_shard)",
                           effect="parameters, gradients and optimizer states are sharded as before; FSDP1's own knobs have no "
                                  "equivalent (below)")
    elif kind == "DEEPSPEED":
        d.mapped("distributed_type", ("distributed.strategy", "deepspeed"))
        _deepspeed(d)
    elif strategy:
        d.mapped("distributed_type", ("distributed.strategy", strategy), *((("launch.device", "cpu"),) if kind == "MULTI_CPU" else ()))
    else:
        strategy = "ddp"
        d.approximated("distributed_type", ("distributed.strategy", "ddp"), before=f"{kind}", after="DDP",
                       effect="fp8launch runs on CUDA GPUs and CPUs: the model is replicated on each GPU")
    return strategy


def _deepspeed(d: Draft) -> None:
    p = "deepspeed_config."
    if d.has(p + "deepspeed_config_file"):
        deepspeed.attach(d, p + "deepspeed_config_file", os.path.dirname(os.path.abspath(d.path)))
    if d.has(p + "zero_stage"):
        d.mapped(p + "zero_stage", ("distributed.deepspeed.zero_stage", int(d.get(p + "zero_stage"))))
    for part in ("optimizer", "param"):
        if d.has(f"{p}offload_{part}_device"):
            device = d.get(f"{p}offload_{part}_device")
            d.mapped(f"{p}offload_{part}_device",
                     (f"distributed.deepspeed.offload_{part}", device if device in ("cpu", "nvme") else "none"))
        path = d.get(f"{p}offload_{part}_nvme_path")
        if path is not None and path != "none":
            d.mapped(f"{p}offload_{part}_nvme_path", ("distributed.deepspeed.nvme_path", str(path)))
        elif path is not None:
            d.mapped(f"{p}offload_{part}_nvme_path", note="none")
    if d.has(p + "gradient_accumulation_steps"):
        d.note_batch("accum", d.get(p + "gradient_accumulation_steps"), p + "gradient_accumulation_steps")
    if d.has(p + "gradient_clipping"):
        d.mapped(p + "gradient_clipping", ("train.max_grad_norm", float(d.get(p + "gradient_clipping"))))
    if d.has(p + "zero3_init_flag"):
        d.mapped(p + "zero3_init_flag", note="fp8launch gives each module storage and partitions it at once under ZeRO-3 "
                                             "(launcher/train/materialize.py)")
    d.group(p[:-1], "an `accelerate launch` DeepSpeed option fp8launch's deepspeed.json does not write")


def _precision(d: Draft, strategy: str) -> None:
    mp = str(d.get("mixed_precision", "no")).lower()
    if mp != "fp8":
        if d.has("mixed_precision"):
            d.mapped("mixed_precision", ("precision.mode", {"no": "fp32"}.get(mp, mp)))
        elif strategy != "deepspeed":  # config_args.py leaves it None; launch.py _validate_launch_command (1.15) sets "no"
            d.mapped("(mixed_precision)", ("precision.mode", "fp32"), value="no",
                     note="Accelerate's default when the config names none: full fp32 (fp8launch's own default would be bf16)")
        d.group("fp8_config", "mixed_precision is not fp8: Accelerate does not read fp8_config")
        return
    f = "fp8_config."
    name = str(d.get(f + "backend", "")).upper()
    backend = BACKENDS.get(name)
    if backend:
        d.mapped(("mixed_precision", f + "backend"), ("precision.mode", "fp8"), ("precision.backend", backend))
    else:
        backend = "torchao"
        d.approximated(("mixed_precision", f + "backend") if d.has(f + "backend") else "mixed_precision",
                       ("precision.mode", "fp8"), ("precision.backend", "torchao"),
                       before="no backend named: the first installed of torchao, Transformer Engine, MS-AMP", after="torchao",
                       effect="the same where torchao is installed; where only TE or MS-AMP is, Accelerate ran their FP8")
    d.mapped("(high precision)", ("precision.high_precision", "bf16"), note="Accelerate runs the rest of an fp8 model in bf16")
    for key, (read, spec_key, default) in IGNORED.items():
        if _misnamed(d, f, key) and spec_key.split(".")[1] == backend:
            d.approximated(f + key, (spec_key, default),
                           before=f"{key} = {d.get(f + key)!r} is read by nothing (Accelerate reads {read}, "
                                  f"ACCELERATE_FP8_{read.upper()}): the run used {default!r}",
                           after=f"{spec_key} = {default!r}, what ran",
                           effect=f"the spec trains as the source did, not as the key asks: set {spec_key} to get what it asks")
        elif d.has(f + key):
            d.none(f + key, f"Accelerate never reads {key} (it reads {read}): no effect in the source either")
    {"te": _te, "torchao": _ao, "msamp": _msamp}[backend](d, f, strategy)
    d.group("fp8_config", f"not a key Accelerate reads for the {backend} backend (utils/dataclasses.py): no effect in the source either")


def _te(d: Draft, f: str, strategy: str) -> None:
    mx = d.get(f + "use_mxfp8_block_scaling") is True
    d.mapped(f + "use_mxfp8_block_scaling" if d.has(f + "use_mxfp8_block_scaling") else "(TE recipe)",
             ("precision.te.recipe", "mxfp8" if mx else "delayed"),
             note="Accelerate builds " + ("MXFP8BlockScaling" if mx else
                                          "DelayedScaling (MXFP8BlockScaling only with use_mxfp8_block_scaling)"))
    d.mapped("(TE modules)", ("precision.keep_first_last", False), ("precision.te.swap", ["linear", "layernorm"]),
             note="Accelerate swaps every nn.Linear and nn.LayerNorm for TE's (not RMSNorm), the first and last Linear included")
    fmt = str(d.get(f + "fp8_format", "HYBRID")).upper()
    if fmt in ("HYBRID", "E4M3"):
        d.mapped(f + "fp8_format" if d.has(f + "fp8_format") else "(fp8_format)", ("precision.te.fp8_format", fmt),
                 value=fmt, note="" if d.has(f + "fp8_format") else "Accelerate's default")
    else:
        d.approximated(f + "fp8_format", ("precision.te.fp8_format", "HYBRID"), before=f"{fmt} for every tensor",
                       after="HYBRID: E4M3 forward, E5M2 gradients",
                       effect="E5M2 alone is not a training format: the forward pass gets E4M3's extra mantissa bit")
    if d.has(f + "margin"):
        d.mapped(f + "margin", ("precision.te.margin", int(d.get(f + "margin"))))
    if not mx and not _misnamed(d, f, "amax_history_length"):  # else the misnamed key's entry set it
        d.mapped(f + "amax_history_len" if d.has(f + "amax_history_len") else "(amax_history_len)",
                 ("precision.te.amax_history_len", int(d.get(f + "amax_history_len", 1024))),
                 value=d.get(f + "amax_history_len", 1024), note="" if d.has(f + "amax_history_len") else "Accelerate's default")
    if not mx and not _misnamed(d, f, "amax_compute_algorithm"):
        algo = d.get(f + "amax_compute_algo", "most_recent")
        d.mapped(f + "amax_compute_algo" if d.has(f + "amax_compute_algo") else "(amax_compute_algo)",
                 ("precision.te.amax_compute_algo", str(algo).lower()), value=algo,
                 note="" if d.has(f + "amax_compute_algo") else "Accelerate's default, not TE's \"max\"")
    interval = d.get(f + "interval")
    if interval is not None:
        if int(interval) == 1:
            d.mapped(f + "interval", note="Transformer Engine >= 2.2 removed it and updates the scale every step, which is interval 1 "
                                          "(precision.te.interval is refused: TE-REMOVED-KEY)")
        else:
            d.none(f + "interval", "Transformer Engine >= 2.2 removed it: the scale is updated every step (rule TE-REMOVED-KEY)")
    override = d.get(f + "override_linear_precision")
    if override is not None:
        values = _bools(override)
        if values is not None and not any(values):
            d.mapped(f + "override_linear_precision",
                     note="every GEMM in FP8, TE's only behaviour since 2.2 removed the key (TE-REMOVED-KEY)")
        else:
            d.none(f + "override_linear_precision", "Transformer Engine >= 2.2 removed it (rule TE-REMOVED-KEY): to keep layers in "
                                                    "high precision use precision.keep or [[precision.rules]]")
    evaluate = d.get(f + "use_autocast_during_eval")
    if evaluate is True:
        d.mapped(f + "use_autocast_during_eval", note="fp8launch evaluates in the precision it trains in")
    elif evaluate is False:
        d.approximated(f + "use_autocast_during_eval", before="evaluation outside FP8 autocast (high precision)",
                       after="evaluation in FP8 ([eval] runs the training precision)",
                       effect="the eval loss includes FP8 rounding; training is the same")


def _misnamed(d: Draft, f: str, key: str) -> bool:
    """The config has the questionnaire's name `key` and not the name Accelerate reads (IGNORED)."""
    return d.has(f + key) and not d.has(f + IGNORED[key][0])


def _bools(value) -> list[bool] | None:
    """override_linear_precision as written: a list, or the questionnaire's "(false, false, false)" string."""
    if isinstance(value, (list, tuple)):
        return [bool(v) for v in value]
    words = str(value).strip("()[] ").replace(",", " ").lower().split()
    return [w == "true" for w in words] if all(w in ("true", "false") for w in words) else None


def _ao(d: Draft, f: str, strategy: str) -> None:
    d.mapped("(torchao recipe)", ("precision.torchao.recipe", "tensorwise"), ("precision.keep_first_last", True),
             ("precision.torchao.skip_small", False),
             note="Accelerate's Float8LinearConfig is tensorwise; it keeps the first and last Linear and dims not divisible by 16 only")
    all_gather = d.get(f + "enable_fsdp_float8_all_gather", True) is not False
    label = f + "enable_fsdp_float8_all_gather" if d.has(f + "enable_fsdp_float8_all_gather") else "(enable_fsdp_float8_all_gather)"
    if strategy == "fsdp2":
        d.mapped(label, ("precision.torchao.fsdp_float8_all_gather", all_gather), ("precision.torchao.precompute_scale", False),
                 value=all_gather, note=("" if d.has(f + "enable_fsdp_float8_all_gather") else "Accelerate's default; ")
                 + "Accelerate does not precompute the float8 scales")
    else:
        d.mapped(label, value=all_gather, note="an FSDP2 feature: no effect with this distributed_type")
    pad = d.get(f + "pad_inner_dim", True) is not False
    d.mapped(f + "pad_inner_dim" if d.has(f + "pad_inner_dim") else "(pad_inner_dim)", ("precision.torchao.pad_inner_dim", pad),
             value=pad, note="" if d.has(f + "pad_inner_dim") else "Accelerate's default")


def _msamp(d: Draft, f: str, strategy: str) -> None:
    if _misnamed(d, f, "optimization_level"):  # the misnamed key's entry set the level
        d.mapped("(MS-AMP)", ("precision.keep_first_last", False), note="msamp.initialize converts every Linear")
        return
    level = str(d.get(f + "opt_level", "O2"))
    d.mapped(f + "opt_level" if d.has(f + "opt_level") else "(opt_level)", ("precision.msamp.opt_level", level),
             ("precision.keep_first_last", False), value=level,
             note=("" if d.has(f + "opt_level") else "accelerate launch's default; ") + "msamp.initialize converts every Linear")


def _fsdp(d: Draft) -> None:
    p = "fsdp_config."
    if not d.has("fsdp_config"):
        return
    if _type(d) != "FSDP":
        d.group("fsdp_config", "distributed_type is not FSDP: Accelerate does not read fsdp_config")
        return
    reshard = d.get(p + "fsdp_reshard_after_forward")
    if isinstance(reshard, bool):
        d.mapped(p + "fsdp_reshard_after_forward", ("distributed.fsdp2.reshard_after_forward", reshard))
    elif reshard is not None or d.has(p + "fsdp_sharding_strategy"):
        key = p + "fsdp_reshard_after_forward" if reshard is not None else p + "fsdp_sharding_strategy"
        strategy = str(d.get(key)).upper()
        if strategy in ("FULL_SHARD", "1"):
            d.mapped(key, ("distributed.fsdp2.reshard_after_forward", True))
        elif strategy in ("SHARD_GRAD_OP", "2"):
            d.mapped(key, ("distributed.fsdp2.reshard_after_forward", False))
        else:
            d.approximated(key, ("distributed.fsdp2.reshard_after_forward", True),
                           before=f"{strategy}: sharded within a node, replicated across nodes (or not sharded)",
                           after="sharded over every data-parallel rank, resharded after forward",
                           effect="less memory per GPU, more traffic between nodes")
    if d.has(p + "fsdp_offload_params"):
        d.mapped(p + "fsdp_offload_params", ("distributed.fsdp2.cpu_offload", bool(d.get(p + "fsdp_offload_params"))))
    if d.has(p + "fsdp_activation_checkpointing"):
        d.mapped(p + "fsdp_activation_checkpointing",
                 ("activation_checkpointing.mode", "full" if d.get(p + "fsdp_activation_checkpointing") is True else "none"))
    policy = d.get(p + "fsdp_auto_wrap_policy")
    if policy is not None:
        sources = tuple(k for k in (p + "fsdp_auto_wrap_policy", p + "fsdp_transformer_layer_cls_to_wrap") if d.has(k))
        if str(policy).upper() == "TRANSFORMER_BASED_WRAP":
            d.mapped(sources, note="fp8launch shards each transformer block")
        else:
            d.approximated(sources, before=f"{policy}: FSDP units chosen by that policy", after="one FSDP unit per transformer block",
                           effect="other unit sizes: the all-gathers' size and the peak memory differ")
    for key in ("fsdp_state_dict_type", "fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading", "fsdp_use_orig_params"):
        if d.has(p + key):
            d.mapped(p + key, note="fp8launch builds the model on the meta device, gives each rank its shard and checkpoints sharded "
                                   "(DCP); nothing to choose")
    d.group("fsdp_config", "an FSDP1 tuning knob FSDP2 (fully_shard) does not have")


def _dynamo(d: Draft) -> None:
    p = "dynamo_config."
    backend = str(d.get(p + "dynamo_backend", d.get("dynamo_backend", "NO"))).upper()
    key = p + "dynamo_backend" if d.has(p + "dynamo_backend") else "dynamo_backend"
    if not d.has(key):
        return
    if backend == "NO":
        d.mapped(key, ("compile.enabled", False))
        d.group("dynamo_config", "compile is off")
        return
    if backend == "INDUCTOR":
        d.mapped(key, ("compile.enabled", True))
    else:
        d.approximated(key, ("compile.enabled", True), before=f"torch.compile with the {backend} backend",
                       after="torch.compile with inductor", effect="other kernels: the speed differs, the numerics are torch's")
    if d.has(p + "dynamo_mode"):
        d.mapped(p + "dynamo_mode", ("compile.mode", str(d.get(p + "dynamo_mode"))))
    if d.has(p + "dynamo_use_fullgraph"):
        d.mapped(p + "dynamo_use_fullgraph", ("compile.fullgraph", bool(d.get(p + "dynamo_use_fullgraph"))))
    if d.has(p + "dynamo_use_regional_compilation"):
        d.mapped(p + "dynamo_use_regional_compilation", note="fp8launch compiles each transformer block (regional compilation)")
    d.group("dynamo_config", "fp8launch compiles with static shapes (every batch has the same shape)")


def _refused_parallelism(d: Draft, p: str) -> None:
    """What Accelerate 1.15's ParallelismConfig refuses (parallelism_config.py __post_init__ / _validate, lines 309-334):
    sizes below 1, a cp_backend other than "torch", an sp_backend other than "deepspeed", CP and SP together. The import
    stops as `accelerate launch` does, with Accelerate's words."""
    for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
        if d.has(p + name) and int(d.get(p + name)) < 1:
            _refuse(d, f"{p}{name}: {name} must be at least 1, but got {d.get(p + name)}", f"set {name} to 1 or more")
    for name, valid in (("cp_backend", "torch"), ("sp_backend", "deepspeed")):
        if d.has(p + name) and str(d.get(p + name)) != valid:
            _refuse(d, f"{p}{name}: {name} must be one of ['{valid}'], but got {d.get(p + name)}",
                    f"write {name}: {valid}" + (" (DeepSpeed's Ulysses is sp_size with sp_backend: deepspeed)"
                                                if name == "cp_backend" else ""))
    if int(d.get(p + "cp_size", 1)) > 1 and int(d.get(p + "sp_size", 1)) > 1:
        _refuse(d, f"{p}cp_size, {p}sp_size: Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive",
                "set either cp_size: 1 or sp_size: 1")


def _refuse(d: Draft, what: str, fix: str) -> None:
    raise SourceError(d.path, with_fix(f"{what}; Accelerate stops (ParallelismConfig raises ValueError)", fix))


def _parallelism(d: Draft) -> None:
    p = "parallelism_config.parallelism_config_"
    _refused_parallelism(d, p)
    if d.has(p + "tp_size"):
        d.mapped(p + "tp_size", ("distributed.tensor_parallel", int(d.get(p + "tp_size"))))
    sp = int(d.get(p + "sp_size", 1))
    if sp > 1:
        sources = tuple(k for k in (p + "sp_size", p + "sp_backend") if d.has(k))
        d.approximated(sources, ("distributed.context_parallel", sp), value=sp,
                       before=f"DeepSpeed Ulysses sequence parallel over {sp} ranks: each sequence split over them, an all-to-all "
                              "swaps the sequence split for a split of the attention heads around attention",
                       after=f"distributed.context_parallel = {sp}: torch's ring attention, the same split of each sequence, the key "
                             "/ value shards all-gathered",
                       effect=f"the same attention, the same {sp} ranks reading the same batches (world / {sp} data-parallel ranks); "
                              "another collective, so the speed and memory differ")
    cp = int(d.get(p + "cp_size", 1))
    if cp > 1:
        d.mapped(p + "cp_size", ("distributed.context_parallel", cp),
                 note="torch's context_parallel, as Accelerate runs it (its cp_backend is torch's): each sequence split over "
                      f"{cp} ranks that read the same batches")
        if d.has(p + "cp_comm_strategy"):
            context.rotate_method(d, p + "cp_comm_strategy", str(d.get(p + "cp_comm_strategy")))
    replicate = int(d.get(p + "dp_replicate_size", 1))
    if replicate > 1:
        d.approximated(p + "dp_replicate_size", before=f"HSDP: {replicate} replicas, each sharded over its own ranks",
                       after="FSDP2 sharded over every data-parallel rank",
                       effect="less memory per GPU, more traffic between the replicas' nodes")
    d.group("parallelism_config", "fp8launch derives the data-parallel size from the world size and tensor_parallel")


def _name(d: Draft) -> str | None:
    return None


KEYS = ("compute_environment", "distributed_type", "mixed_precision", "num_processes", "num_machines", "machine_rank", "fp8_config",
        "fsdp_config", "deepspeed_config", "dynamo_config", "main_training_function", "use_cpu", "downcast_bf16", "rdzv_backend",
        "gpu_ids", "main_process_ip", "main_process_port", "tpu_use_cluster")

KIND = Kind(id="accelerate", title="Accelerate config",
            score=lambda data: count(data, KEYS) + 3 * ("distributed_type" in data or "compute_environment" in data)
            if any(k in data for k in ("distributed_type", "compute_environment", "fp8_config")) else 0,
            read=_read, name=_name, unknown=vet,
            other="an Accelerate setting fp8launch has no equivalent for (fp8launch runs its own training entrypoint)")
