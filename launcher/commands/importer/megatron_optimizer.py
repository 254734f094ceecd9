"""Megatron-Bridge's `optimizer:` table beyond the update rule (megatron.py reads optimizer, lr, betas, eps, decay): the fields
of Megatron-Core's OptimizerConfig (megatron/core/optimizer/optimizer_config.py, which Megatron-Bridge 067f987 re-exports in
training/config.py) for the optimizers fp8launch does not have (Muon, Lion), fp16's dynamic loss scaling, the hybrid CPU
optimizer, the distributed optimizer's parameter all-gather, and diagnostics; and `rerun_state_machine:`
(megatron/core/rerun_state_machine.py: check the loss for NaN / spikes, re-run a step to tell a fault from the data).
Each family gets one line that says what it does in Megatron and what fp8launch does or the user should set."""

from __future__ import annotations

from .draft import Draft

MUON = ("muon_momentum", "muon_split_qkv", "muon_use_nesterov", "muon_nesterov", "muon_scale_mode", "muon_fp32_matmul_prec",
        "muon_coefficient_type", "muon_num_ns_steps", "muon_tp_mode", "muon_extra_scale_factor", "muon_scalar_optimizer")
LION = ("lion_beta1", "lion_beta2")
LOSS_SCALE = ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")
OFFLOAD = ("optimizer_cpu_offload", "optimizer_offload_fraction", "use_torch_optimizer_for_cpu_offload", "overlap_cpu_optimizer_d2h_h2d",
           "pin_cpu_grads", "pin_cpu_params")
GATHER = ("overlap_param_gather", "overlap_param_gather_with_optimizer_step")
DIAGNOSTICS = ("log_num_zeros_in_grad", "barrier_with_L1_time", "config_logger_dir", "timers")

TORCH_SCALER = "torch.amp.GradScaler's: from 65536, halved at every overflow, doubled after 2000 clean steps, no floor"
DEEPSPEED_SCALER = "DeepSpeed's (fp8launch's deepspeed.json): from 65536, halved after 2 overflows, doubled after 1000 clean steps, floor 1"


def _keys(d: Draft, o: str, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{o}.{k}" for k in names if f"{o}.{k}" in d.leaves and f"{o}.{k}" not in d.taken)


def read(d: Draft, o: str) -> None:
    """The OptimizerConfig fields under `o` (Megatron-Bridge's "optimizer") that megatron._optimizer does not map."""
    name = str(d.get(f"{o}.optimizer", "adam"))
    _rules(d, o, name)
    _loss_scale(d, o)
    _offload(d, o)
    keys = _keys(d, o, GATHER)
    if keys:
        on = any(d.get(k) is True for k in keys)
        d.none(keys, ("Megatron's distributed optimizer all-gathers the updated parameters during the next forward" if on else
                      "off: Megatron's distributed optimizer all-gathers the updated parameters after the step")
               + "; FSDP2 prefetches its own all-gathers during the forward and DeepSpeed overlaps its own (distributed.deepspeed."
                 "overlap_comm): nothing to set")
    if f"{o}.fp8_recipe" in d.leaves and f"{o}.fp8_recipe" not in d.taken:
        d.none(f"{o}.fp8_recipe", "Megatron-Core's copy of the model's FP8 recipe, which its distributed optimizer reads to gather and "
                                  "update FP8 parameters; the recipe itself is read from mixed_precision / model fp8_recipe "
                                  "(precision.te.recipe): nothing to set")
    keys = _keys(d, o, ("store_param_remainders",))
    if keys:
        d.none(keys, "Megatron's distributed optimizer keeps an fp32 master weight as the bf16 parameter plus its 16 low bits (2 bytes, "
                     "not 4): the same values in less memory; fp8launch keeps whole fp32 master weights (plan's memory estimate "
                     "counts them): nothing to set")
    keys = _keys(d, o, ("reuse_grad_buf_for_mxfp8_param_ag",))
    if keys:
        d.none(keys, "Megatron all-gathers MXFP8 parameters through the gradient buffer to save memory; fp8launch's engines use buffers "
                     "of their own: nothing to set")
    keys = _keys(d, o, DIAGNOSTICS)
    if keys:
        d.none(keys, "Megatron's diagnostics (zeros counted in the gradients, timers, a config log): no effect on the training; "
                     "fp8launch logs loss, gradient norm and throughput to train.output_dir (and [log]): nothing to set")


def _rules(d: Draft, o: str, name: str) -> None:
    """The options of update rules: Muon's and Lion's (which fp8launch lacks), SGD's momentum, the decoupled decay, the q/k norms'."""
    for family, names, what in (("muon", MUON, "Muon (Newton-Schulz orthogonalized momentum for the 2-D weights, "
                                                "muon_scalar_optimizer for the rest)"), ("lion", LION, "Lion (sign of a momentum)")):
        keys = _keys(d, o, names)
        if not keys:
            continue
        if name == family:
            d.none(keys, f"{what}: fp8launch trains with train.optimizer (AdamW here, the line of {o}.optimizer) and has no "
                         f"{family.capitalize()}: the run loses its update rule; tune train.lr and train.adam_betas for AdamW "
                         f"({family.capitalize()}'s lr does not carry over)")
        else:
            d.none(keys, f"the options of {what}: Megatron reads them only with optimizer = \"{family}\"; this run's is {name}: no effect, "
                         "nothing to set")
    keys = _keys(d, o, ("sgd_momentum",))
    if keys and name == "sgd" and float(d.get(keys[0])) != 0:
        d.approximated(keys, before=f"SGD with momentum {d.get(keys[0])}", after="plain SGD (fp8launch's sgd has no momentum)",
                       effect="each step follows the last gradient alone: slower, noisier progress; train.optimizer = \"adamw\" "
                              "keeps a moving average")
    elif keys and name == "sgd":
        d.mapped(keys, note="0: plain SGD, as fp8launch's sgd")
    elif keys:
        d.none(keys, f"SGD's momentum: Megatron reads it only with optimizer = \"sgd\"; this run's is {name}: no effect, nothing to set")
    keys = _keys(d, o, ("decoupled_weight_decay",))
    if keys and name not in ("adam", "sgd", "mcore_distributed_optim"):
        d.none(keys, f"Adam's decay style; this run's optimizer is {name}: no effect, nothing to set")
    elif keys and d.get(keys[0]) is False and name == "adam":
        d.mapped(keys, ("train.optimizer", "adam"), note="Adam with the decay added to the gradient (L2), as torch's Adam")
    elif keys:
        d.mapped(keys, note="AdamW's decoupled weight decay (train.optimizer)" if name != "sgd" else "SGD: no effect")
    keys = _keys(d, o, ("apply_wd_to_qk_layernorm",))
    if keys and d.get(keys[0]) is True:
        d.none(keys, "Megatron decays the query / key norms' weights beside the 2-D weights; fp8launch's train.weight_decay_exclude "
                     "decays either every parameter (\"none\") or no norm (\"norms_and_biases\", set): the q / k norms go undecayed")
    elif keys:
        d.mapped(keys, note="off: the query / key norms get no decay, as train.weight_decay_exclude = \"norms_and_biases\" does")


def _loss_scale(d: Draft, o: str) -> None:
    keys = _keys(d, o, LOSS_SCALE)
    if not keys:
        return
    fp16 = "fp16" in (d.value("precision.mode"), d.value("precision.high_precision"))
    if not fp16:
        d.none(keys, "fp16's dynamic loss scaling (Megatron-Core's DynamicGradScaler): Megatron builds it only under fp16; this run "
                     "is not fp16: no effect, nothing to set")
        return
    static = d.get(f"{o}.loss_scale")
    before = (f"a static loss scale of {static}" if static else
              "Megatron's dynamic scale: " + ", ".join(f"{k.rsplit('.', 1)[1]} {d.get(k)}" for k in keys))
    engine = DEEPSPEED_SCALER if d.value("distributed.strategy") == "deepspeed" else TORCH_SCALER
    d.approximated(keys, before=before, after=f"the engine's own dynamic scale, {engine}",
                   effect="another scale from step to step: other steps are skipped on overflow; no spec key sets the scaler")


def _offload(d: Draft, o: str) -> None:
    keys = _keys(d, o, OFFLOAD)
    if not keys:
        return
    on = d.get(f"{o}.optimizer_cpu_offload") is True
    fraction = float(d.get(f"{o}.optimizer_offload_fraction", 1.0) or 0.0)
    if not on or fraction == 0:
        d.none(keys, "Megatron's hybrid CPU optimizer (a fraction of the optimizer states stepped on the CPU) is off: no effect, "
                     "nothing to set")
        return
    before = f"{fraction:.0%} of the optimizer states (and their step) on the CPU"
    strategy = d.value("distributed.strategy")
    if strategy == "deepspeed":
        d.approximated(keys, ("distributed.deepspeed.offload_optimizer", "cpu"), before=before,
                       after="every optimizer state on the CPU, stepped by DeepSpeedCPUAdam",
                       effect="less GPU memory than the source where the fraction is below 1; a slower step")
    elif strategy == "fsdp2":
        d.approximated(keys, ("distributed.fsdp2.cpu_offload", True), before=before,
                       after="FSDP2's CPUOffloadPolicy: the sharded parameters, gradients and optimizer step on the CPU",
                       effect="much less GPU memory, a much slower step")
    else:
        d.none(keys, f"{before}; fp8launch offloads only under DeepSpeed or FSDP2: set distributed.strategy = \"deepspeed\" with "
                     "distributed.deepspeed.offload_optimizer = \"cpu\" (or \"fsdp2\" with distributed.fsdp2.cpu_offload = true)")


def rerun(d: Draft) -> None:
    """`rerun_state_machine:` (Megatron-Bridge's RerunStateMachineConfig). In rerun_mode "disabled" Megatron-Core's
    validate_result raises at a rejected loss (a NaN when check_for_nan_in_loss, a spike when check_for_spiky_loss): the run
    stops, as train.on_nan = "stop"; "validate_results" / "report_determinism_stats" re-run the step to tell a transient
    fault from the data."""
    r = "rerun_state_machine"
    keys = _keys(d, r, ("check_for_nan_in_loss", "rerun_mode"))
    nan, mode = d.get(f"{r}.check_for_nan_in_loss"), str(d.get(f"{r}.rerun_mode", "disabled"))
    if keys and nan is not False:
        if mode == "disabled":
            d.mapped(keys, ("train.on_nan", "stop"), note="Megatron stops at a NaN loss; fp8launch stops every rank before the update "
                                                          "at a non-finite loss or gradient norm")
        else:
            d.approximated(keys, ("train.on_nan", "stop"), before=f"a NaN loss re-runs the step ({mode}) to tell a transient fault "
                           "from the data, then stops or goes on", after="every rank stops before the update at a non-finite loss or "
                           "gradient norm, the newest checkpoint kept", effect="no re-run: a one-off hardware fault stops the run too; "
                           "resume it (train.resume = \"auto\") or set train.on_nan = \"skip\" to step over isolated bad steps")
    elif keys:
        d.approximated(keys, before="the loss not checked for NaN (Megatron's gradient checks aside)",
                       after="every rank stops before the update at a non-finite loss or gradient norm (train.on_nan = \"stop\")",
                       effect="a step that would have gone on with a NaN stops the run; train.on_nan = \"skip\" steps over up to 5 "
                              "such steps in a row")
    keys = _keys(d, r, ("check_for_spiky_loss", "spiky_loss_factor"))
    if keys:
        on = d.get(f"{r}.check_for_spiky_loss") is True
        d.none(keys, ("Megatron stops (or re-runs the step) at a loss over spiky_loss_factor x the largest recent one" if on else
                      "off: Megatron does not check the loss for spikes") + "; fp8launch checks only for non-finite values "
                                                                             "(train.on_nan): watch the loss in its log")
    keys = _keys(d, r, ("error_injection_rate", "error_injection_type"))
    if keys:
        d.none(keys, "Megatron's fault injection, which tests the re-run machinery" + (": rate 0, off" if not d.get(
            f"{r}.error_injection_rate") else "") + "; fp8launch injects no faults: nothing to set")
