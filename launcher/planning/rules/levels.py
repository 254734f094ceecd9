"""MS-AMP's levels natively (issue 30): precision.optimizer_states, grad_reduce and master_weights, with each optimizer,
strategy and backend."""

from __future__ import annotations

from launcher.planning.backends import MSAMP, TE
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8, is_deepspeed, strategy


def _levels_asked(f: Facts) -> list[str]:
    """The level keys this plan sets to something other than their default, as 'key = "value"'."""
    p = f.plan.precision
    asked = (("optimizer_states", p.optimizer_states, "fp32"), ("grad_reduce", p.grad_reduce, "auto"),
             ("master_weights", p.master_weights, "fp32"))
    return [f'precision.{k} = "{v}"' for k, v, default in asked if v != default]


def _states_or_master(f: Facts) -> list[str]:
    return [k for k in _levels_asked(f) if not k.startswith("precision.grad_reduce")]


def _levels_backend(f: Facts) -> str:
    p = f.plan.precision
    if fp8(f, MSAMP) and _levels_asked(f):
        return (" and ".join(_levels_asked(f)) + f" with MS-AMP, which sets its optimizer states, gradient reduction and master "
                f"weights from precision.msamp.opt_level = \"{p.msamp.opt_level}\".")
    if fp8(f, TE) and p.master_weights == "bf16":
        return 'precision.master_weights = "bf16" with Transformer Engine, whose swapped-in modules are built in their own dtype.'
    if fp8(f, TE) and p.te.fp8_params and p.optimizer_states != "fp32":
        return (f'precision.optimizer_states = "{p.optimizer_states}" with precision.te.fp8_params, whose FusedAdam keeps the '
                "fp32 master weights and the states.")
    return ""


RULES: tuple[Rule, ...] = (
    Rule(id="OPTIMIZER-STATES-SGD", severity="error", stage="plan",
         when="precision.optimizer_states != fp32 with train.optimizer = sgd",
         why="fp8launch's SGD is plain SGD without momentum: it keeps no optimizer states, so there is nothing to store in "
             "8 or 16 bits; the setting would be a silent no-op.",
         fix='set precision.optimizer_states = "fp32", or train.optimizer = "adamw" (its two moments then take that dtype)',
         condition=lambda f: f.plan.precision.optimizer_states != "fp32" and f.plan.train.optimizer == "sgd",
         detail=lambda f: f'precision.optimizer_states = "{f.plan.precision.optimizer_states}" with train.optimizer = "sgd": '
             "plain SGD (no momentum) keeps no optimizer states."),
    Rule(id="MASTER-WEIGHTS-OPTIMIZER", severity="error", stage="plan",
         when='precision.master_weights = "bf16" with train.optimizer = sgd',
         why="bf16 weights without an fp32 copy need their update rounded stochastically, or every update smaller than half a "
             "bf16 step (2^-8 of the weight) is lost; fp8launch does that in torchao's Adam kernel (bf16_stochastic_round), "
             "which SGD does not go through.",
         fix='set train.optimizer = "adamw" (or "adam"), or precision.master_weights = "fp32"',
         condition=lambda f: f.plan.precision.master_weights == "bf16" and f.plan.train.optimizer == "sgd"),
    Rule(id="MASTER-WEIGHTS-COMPUTE", severity="error", stage="plan",
         when='precision.master_weights = "bf16" with a compute dtype other than bf16 (precision.mode fp32 / fp16, or fp8 '
              "with high_precision fp32 / fp16)",
         why="bf16 master weights are the parameters themselves: the model computes from bf16 weights, which an fp32 run "
             "would have to upcast everywhere (it does not: the GEMMs would fail on mixed dtypes) and an fp16 run would round "
             "again to fp16's narrower range.",
         fix='set precision.mode = "bf16" (or precision.high_precision = "bf16" with fp8), or precision.master_weights = "fp32"',
         condition=lambda f: f.plan.precision.master_weights == "bf16" and f.plan.precision.compute_dtype != "bf16",
         detail=lambda f: f'precision.master_weights = "bf16" in a {f.plan.precision.compute_dtype} run: the model would compute '
             "from bf16 weights in another dtype."),
    Rule(id="LEVELS-DEEPSPEED", severity="error", stage="plan",
         when="precision.optimizer_states != fp32 or precision.master_weights = bf16 with strategy deepspeed",
         why="DeepSpeed's ZeRO optimizer keeps its own fp32 master partitions (bf16 / fp16 runs) and steps the optimizer on flat "
             "partitions whose sizes follow the world size, not torchao's 256-value blocks, so neither 8-bit states nor a "
             "bf16-only master would take effect as asked. FSDP2 is ZeRO-3's sharding with per-parameter shards torchao's "
             "optimizers step.",
         fix='set distributed.strategy = "fsdp2" (ZeRO-3-style sharding) or "ddp"; or precision.optimizer_states = "fp32" and '
             'precision.master_weights = "fp32"',
         condition=lambda f: is_deepspeed(f) and bool(_states_or_master(f)),
         detail=lambda f: " and ".join(_states_or_master(f)) + " with DeepSpeed, whose ZeRO optimizer keeps fp32 master partitions "
             "and steps flat partitions: the setting would not take effect."),
    Rule(id="GRAD-REDUCE-DEEPSPEED", severity="error", stage="plan",
         when="precision.grad_reduce != auto with strategy deepspeed",
         why="DeepSpeed reduces gradients in its own reducer and ZeRO optimizer (bucketed reduce / reduce-scatter), which take "
             "no communication hook; its nearest setting is communication_data_type (fp32, fp16 or bf16 payloads, no FP8), which "
             "follows the model's dtype by default: bf16 in a bf16 run, half of fp32's bytes.",
         fix='set precision.grad_reduce = "auto" (DeepSpeed reduces in the model\'s dtype: bf16 with precision.high_precision = '
             '"bf16"), or distributed.strategy = "ddp" or "fsdp2" for an FP8 reduction',
         condition=lambda f: is_deepspeed(f) and f.plan.precision.grad_reduce != "auto",
         detail=lambda f: f'precision.grad_reduce = "{f.plan.precision.grad_reduce}" with DeepSpeed, whose own reducer takes no '
             "custom reduction (its nearest setting, communication_data_type, has no FP8 and follows the model's dtype)."),
    Rule(id="GRAD-REDUCE-FSDP2-FP32", severity="error", stage="plan",
         when='precision.grad_reduce = "fp32" with strategy fsdp2 and distributed.fsdp2.reduce_dtype = "bf16"',
         why="FSDP2 casts the gradients to its MixedPrecisionPolicy's reduce_dtype before the reduce-scatter: they are already "
             "rounded to bf16 when the payload is chosen, and sending them as fp32 doubles the bytes for nothing.",
         fix='set distributed.fsdp2.reduce_dtype = "fp32" (gradients reduced and summed in fp32), or precision.grad_reduce = "auto"',
         condition=lambda f: strategy(f) == "fsdp2" and f.plan.precision.grad_reduce == "fp32"
             and f.plan.distributed.fsdp2.reduce_dtype == "bf16"),
    Rule(id="LEVELS-BACKEND", severity="error", stage="plan",
         when="precision.optimizer_states, grad_reduce or master_weights set with backend msamp; master_weights = bf16 with "
              "backend te; optimizer_states != fp32 with precision.te.fp8_params",
         why="MS-AMP sets all three itself from precision.msamp.opt_level (its FP8 all-reduce, LBAdamW's fp8 / fp16 moments, "
             "fp16 master weights); Transformer Engine's modules are built in their own dtype when swapped in (a bf16 master "
             "copy would be replaced), and with fp8_params TE's FusedAdam keeps the fp32 master and the states.",
         fix='set precision.msamp.opt_level for MS-AMP (or precision.backend = "torchao" for these keys); with te, leave '
             'precision.master_weights = "fp32" and, with fp8_params, precision.optimizer_states = "fp32"',
         condition=lambda f: bool(_levels_backend(f)),
         detail=lambda f: _levels_backend(f)),
)
