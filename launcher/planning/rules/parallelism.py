"""How the ranks split the work: the global batch, expert parallelism (distributed.expert_parallel;
launcher/train/parallel/expert_parallel.py) and tensor parallelism (distributed.tensor_parallel, distributed.async_tp)."""

from __future__ import annotations

from launcher.planning.backends import MSAMP, TE, TORCHAO
from launcher.planning.hardware import BLOCK_RECIPES
from launcher.planning.models import builtin_config
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import builtin_experts, fp8, strategy, tp


def _derived_batch(f: Facts) -> int:
    t, d = f.plan.train, f.plan.distributed
    return t.micro_batch_size * t.grad_accum_steps * d.data_parallel


def _batch_ranks(f: Facts) -> str:
    d = f.plan.distributed
    degrees = (("tensor_parallel", d.tensor_parallel), ("context_parallel", d.context_parallel), ("pipeline_parallel", d.pipeline_parallel))
    if any(v > 1 for _, v in degrees):
        by = " x ".join(f"{k} {v}" for k, v in degrees if v > 1)
        return f"data-parallel ranks {d.data_parallel} (world size {d.world_size} / {by})"
    return f"world size {d.world_size}"


def _batch_fix(f: Facts) -> str:
    """BATCH-MISMATCH's fix: first the accumulation (or micro-batch) that keeps the global batch, where one does."""
    t, d = f.plan.train, f.plan.distributed
    keep, per_step = [], t.micro_batch_size * d.data_parallel
    if d.global_batch_size % per_step == 0:
        keep.append(f"set train.grad_accum_steps = {d.global_batch_size // per_step} (keeps the global batch)")
    per_micro = d.data_parallel * t.grad_accum_steps
    if d.global_batch_size % per_micro == 0 and d.global_batch_size // per_micro != t.micro_batch_size:
        keep.append(f"set train.micro_batch_size = {d.global_batch_size // per_micro} (keeps the global batch)")
    if not keep:
        keep.append(f"choose a world size whose data-parallel ranks divide distributed.global_batch_size = {d.global_batch_size}")
    return ", or ".join(keep) + ", or set distributed.global_batch_size = 0 (derive it: the global batch changes)"


def _tp_heads(f: Facts) -> str:
    """What tensor_parallel does not divide among a builtin model's head counts ("" when it divides both, or not builtin)."""
    cfg = builtin_config(f.plan.train.model)
    if tp(f) <= 1 or cfg is None:
        return ""
    bad = [f"{n} {what}" for what, n in (("attention heads", cfg.n_heads), ("KV heads", cfg.kv_heads)) if n % tp(f)]
    return " and ".join(bad)


RULES: tuple[Rule, ...] = (
    Rule(id="BATCH-MISMATCH", severity="error", stage="plan",
         when="global_batch_size != micro_batch_size * grad_accum_steps * nodes * procs_per_node / (tensor_parallel * context_parallel "
              "* pipeline_parallel)",
         why="DeepSpeed asserts train_batch_size == micro * accum * world size; checked before launch for every strategy.",
         fix="set distributed.global_batch_size = 0 (derive it), or change train.micro_batch_size / train.grad_accum_steps",
         condition=lambda f: f.plan.distributed.global_batch_size != _derived_batch(f),
         detail=lambda f: f"distributed.global_batch_size = {f.plan.distributed.global_batch_size} but micro_batch_size "
                          f"{f.plan.train.micro_batch_size} * grad_accum_steps {f.plan.train.grad_accum_steps} * {_batch_ranks(f)} = "
                          f"{_derived_batch(f)}.", fix_for=_batch_fix),
    # -- expert parallelism --
    Rule(id="EP-DIVIDES-WORLD", severity="error", stage="plan",
         when="distributed.expert_parallel does not divide the world size (nodes x procs_per_node)",
         why="the EP mesh is (world_size / ep) x ep: every group of ep adjacent ranks shares the experts of each MoE layer.",
         fix="set distributed.expert_parallel to a divisor of distributed.nodes x procs_per_node",
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and f.plan.world_size % f.plan.distributed.expert_parallel != 0,
         detail=lambda f: f"distributed.expert_parallel = {f.plan.distributed.expert_parallel} does not divide the world size "
                          f"{f.plan.world_size}."),
    Rule(id="EP-DIVIDES-EXPERTS", severity="error", stage="plan",
         when="distributed.expert_parallel does not divide a builtin MoE model's number of experts (hf: / py: models: checked at run "
              "time)",
         why="each EP rank holds num_experts / ep whole experts (their weights sharded Shard(0) on the expert dimension).",
         fix="set distributed.expert_parallel to a divisor of the model's number of experts",
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and bool(builtin_experts(f))
                             and builtin_experts(f) % f.plan.distributed.expert_parallel != 0,
         detail=lambda f: (f"distributed.expert_parallel = {f.plan.distributed.expert_parallel} does not divide the "
                           f"{builtin_experts(f)} experts of {f.plan.train.model}.")),
    Rule(id="EP-DENSE-MODEL", severity="error", stage="plan",
         when="distributed.expert_parallel > 1 with a dense builtin model (hf: / py: models: checked at run time)",
         why="expert parallelism shards the experts of MoE layers; a dense model has none, and the ranks would only duplicate work.",
         fix='set distributed.expert_parallel = 1, or train an MoE model (train.model = "builtin:moe-debug")',
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and builtin_experts(f) == 0),
    Rule(id="EP-STRATEGY", severity="error", stage="plan",
         when="distributed.expert_parallel > 1 with strategy ddp or deepspeed",
         why="fp8launch composes expert parallelism with FSDP2 only (experts sharded over the EP dimension, FSDP2 over world / ep for them "
             "and over all ranks for the dense parameters); DDP and DeepSpeed ZeRO do not handle DTensor experts.",
         fix='set distributed.strategy = "fsdp2", or distributed.expert_parallel = 1',
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and strategy(f) in ("ddp", "deepspeed")),
    Rule(id="EP-TENSOR-PARALLEL", severity="error", stage="plan",
         when="distributed.expert_parallel > 1 with distributed.tensor_parallel > 1",
         why="fp8launch does not compose expert and tensor parallelism (a 3D mesh, and a TP plan for the MoE model, which has none).",
         fix="set distributed.tensor_parallel = 1 or distributed.expert_parallel = 1",
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and f.plan.distributed.tensor_parallel > 1),
    # -- tensor parallelism --
    Rule(id="TP-DIVIDES-PROCS", severity="error", stage="plan",
         when="distributed.tensor_parallel does not divide distributed.procs_per_node",
         why="a tensor-parallel group lives inside one node (its collectives run on every Linear layer and need NVLink-class bandwidth); "
             "the 2D mesh is (world_size / tp) x tp.",
         fix="set distributed.tensor_parallel to a divisor of distributed.procs_per_node (e.g. 2, 4 or 8)",
         condition=lambda f: tp(f) > 1 and f.plan.distributed.procs_per_node % tp(f) != 0,
         detail=lambda f: f"distributed.tensor_parallel = {tp(f)} does not divide distributed.procs_per_node = "
                          f"{f.plan.distributed.procs_per_node}."),
    Rule(id="TP-HEADS", severity="error", stage="plan",
         when="distributed.tensor_parallel does not divide a builtin model's attention heads or KV heads",
         why="column-wise wq / wk / wv give each TP rank n_heads / tp query heads and n_kv_heads / tp KV heads: both must be whole.",
         fix="set distributed.tensor_parallel to a divisor of both head counts, or choose another train.model",
         condition=lambda f: bool(_tp_heads(f)),
         detail=lambda f: f"distributed.tensor_parallel = {tp(f)} does not divide {f.plan.train.model}'s {_tp_heads(f)}."),
    Rule(id="TP-SEQ-LEN", severity="error", stage="plan",
         when="distributed.tensor_parallel does not divide train.seq_len",
         why="sequence parallelism splits the sequence dimension of the norms' activations evenly over the TP ranks (torchtitan asserts "
             "the same).",
         fix="set train.seq_len to a multiple of distributed.tensor_parallel",
         condition=lambda f: tp(f) > 1 and f.plan.train.seq_len % tp(f) != 0,
         detail=lambda f: f"train.seq_len = {f.plan.train.seq_len} is not a multiple of distributed.tensor_parallel = {tp(f)}."),
    Rule(id="TP-STRATEGY", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with strategy ddp or deepspeed",
         why="fp8launch composes tensor parallelism with FSDP2 only (2D DeviceMesh: FSDP2 over the data-parallel dimension); DDP and "
             "DeepSpeed ZeRO do not shard DTensor parameters.",
         fix='set distributed.strategy = "fsdp2", or distributed.tensor_parallel = 1',
         condition=lambda f: tp(f) > 1 and strategy(f) in ("ddp", "deepspeed")),
    Rule(id="TP-MODEL", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with an hf: or py: model",
         why="only the builtin Llama has a tensor-parallel plan (which Linear layers are column- or row-wise, where the sequence is "
             "sharded); another model would train with wrong head counts or not at all.",
         fix='set train.model = "builtin:..." or distributed.tensor_parallel = 1',
         condition=lambda f: tp(f) > 1 and not f.plan.train.model.startswith("builtin:")),
    Rule(id="TP-BACKEND", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with precision.backend te or msamp",
         why="Transformer Engine has its own tensor-parallel modules (te.Linear parallel_mode, sequence_parallel) that fp8launch does not "
             "drive, and mixing them with DTensor TP fails (Accelerate #3827); MS-AMP has no tensor-parallel support outside Megatron.",
         fix='set precision.backend = "torchao", or distributed.tensor_parallel = 1',
         condition=lambda f: tp(f) > 1 and (fp8(f, TE) or fp8(f, MSAMP))),
    Rule(id="TP-ROWWISE-BF16-COMM", severity="warning", stage="plan",
         when="distributed.tensor_parallel > 1 with torchao recipe rowwise or rowwise_with_gw_hp",
         why="torchao's float8 TP styles (Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput) support tensorwise "
             "scaling only: with a rowwise recipe the TP all-gathers and reduce-scatters move bf16, twice the bytes of the tensorwise "
             "float8 all-gathers, and the activations are cast to float8 after the all-gather on every rank (torchtitan #1207: rowwise + "
             "TP ran slower than bf16).",
         fix='set precision.torchao.recipe = "tensorwise", or measure with `fp8launch bench`',
         condition=lambda f: tp(f) > 1 and fp8(f, TORCHAO) and f.plan.precision.torchao.recipe not in ("tensorwise", *BLOCK_RECIPES)),
    Rule(id="TP-COMPILE-CPU", severity="error", stage="plan",
         when='distributed.tensor_parallel > 1 with compile.enabled and launch.device = "cpu"',
         why="torch.compile of tensor-parallel blocks on CPU fails in backward (DTensor redistribute receives a plain tensor gradient) or, "
             "under FSDP2, trains with gradients that differ from eager TP's (seen with torch 2.13's CPU build; docs/tensor-parallel.md); "
             "eager TP computes the unsharded model's gradients.",
         fix='set compile.enabled = false for CPU runs with tensor parallelism, or launch.device = "cuda"',
         condition=lambda f: tp(f) > 1 and f.plan.compile.enabled and f.plan.launch.device == "cpu"),
    Rule(id="TP-ASYNC-COMPILE", severity="error", stage="plan",
         when="distributed.async_tp without compile.enabled",
         why="async TP is an inductor pass (micro-pipeline TP) over compiled graphs: without torch.compile it does nothing (torchtitan "
             "refuses it).",
         fix="set compile.enabled = true, or distributed.async_tp = false",
         condition=lambda f: f.plan.distributed.async_tp and not f.plan.compile.enabled),
    Rule(id="TP-ASYNC-CPU", severity="error", stage="plan",
         when='distributed.async_tp with launch.device = "cpu"',
         why="async TP decomposes the TP collectives into CUDA symmetric-memory copies overlapped with the GEMMs; there is no CPU/gloo "
             "implementation.",
         fix='set distributed.async_tp = false, or launch.device = "cuda"',
         condition=lambda f: f.plan.distributed.async_tp and f.plan.launch.device == "cpu"),
    Rule(id="TP-ASYNC-NO-TP", severity="warning", stage="plan",
         when="distributed.async_tp with distributed.tensor_parallel = 1",
         why="async TP overlaps tensor-parallel collectives; without tensor parallelism there are none and the setting is a silent no-op.",
         fix="set distributed.tensor_parallel > 1, or delete distributed.async_tp",
         condition=lambda f: f.plan.distributed.async_tp and tp(f) <= 1),
)
