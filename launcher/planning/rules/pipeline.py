"""Pipeline parallelism (distributed.pipeline_parallel, distributed.pipeline; launcher/train/parallel/pipeline.py): the
layouts torch.distributed.pipelining cannot run, and what fp8launch does not compose with it yet."""

from __future__ import annotations

from launcher.planning.backends import MSAMP, TE
from launcher.planning.layout import MULTI_STAGE_SCHEDULES, V_SCHEDULES
from launcher.planning.models import builtin_config
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8, strategy, tp


def pp(f: Facts) -> int:
    return f.plan.distributed.pipeline_parallel


def _layers(f: Facts) -> str:
    """What is wrong with the split of a builtin model's blocks over the stages ("" when nothing, or not builtin)."""
    cfg, d = builtin_config(f.plan.train.model), f.plan.distributed
    if pp(f) <= 1 or cfg is None:
        return ""
    split, stages = d.pipeline.layers_per_stage, d.pipeline_stages
    several = f" ({pp(f)} x stages_per_rank {d.pipeline.local_stages})" if stages != pp(f) else ""
    if split:
        if len(split) != stages:
            of = f"the {stages} stages of pipeline_parallel = {pp(f)} x stages_per_rank {d.pipeline.local_stages}" if several else \
                f"pipeline_parallel = {pp(f)}"
            return f"distributed.pipeline.layers_per_stage = {list(split)} names {len(split)} stages, not {of}"
        if sum(split) != cfg.n_layers:
            return (f"distributed.pipeline.layers_per_stage = {list(split)} holds {sum(split)} blocks, not {f.plan.train.model}'s "
                    f"{cfg.n_layers}")
        return ""
    if cfg.n_layers % stages:
        return f"the {stages} pipeline stages{several} do not divide {f.plan.train.model}'s {cfg.n_layers} blocks"
    return ""


def _local_batch(f: Facts) -> int:
    t = f.plan.train
    return t.micro_batch_size * t.grad_accum_steps


def _microbatches(f: Facts) -> str:
    """What is wrong with distributed.pipeline.microbatches ("" when nothing)."""
    t, d = f.plan.train, f.plan.distributed
    if pp(f) <= 1:
        return ""
    n = f.plan.pipeline_microbatches
    what = f"{n} pipeline micro-batches" + ("" if d.pipeline.microbatches else " (one sequence each)")
    if n < pp(f):
        return f"{what} are fewer than the {pp(f)} stages"
    if _local_batch(f) % n:
        return (f"{what} do not divide the step's {_local_batch(f)} sequences a rank reads (train.micro_batch_size "
                f"{t.micro_batch_size} x train.grad_accum_steps {t.grad_accum_steps})")
    rounds = max(1, n // pp(f))
    if d.pipeline.schedule == "Interleaved1F1B" and n % rounds:
        return (f"{what} are not a multiple of Interleaved1F1B's {rounds} rounds (micro-batches // pipeline_parallel: "
                "ScheduleInterleaved1F1B raises)")
    return ""


def _stages_per_rank(f: Facts) -> str:
    """What is wrong with distributed.pipeline.stages_per_rank for the schedule ("" when nothing)."""
    p = f.plan.distributed.pipeline
    if pp(f) <= 1 or not p.stages_per_rank:
        return ""
    if p.schedule not in MULTI_STAGE_SCHEDULES and p.stages_per_rank != 1:
        return f"schedule {p.schedule} runs one stage a rank, not stages_per_rank = {p.stages_per_rank}"
    if p.schedule in V_SCHEDULES and p.stages_per_rank != 2:
        return f"schedule {p.schedule} runs exactly 2 stages a rank (a V), not stages_per_rank = {p.stages_per_rank}"
    if p.schedule in MULTI_STAGE_SCHEDULES and p.stages_per_rank < 2:
        return f"schedule {p.schedule} interleaves several stages a rank; stages_per_rank = 1 is schedule 1F1B"
    return ""


RULES: tuple[Rule, ...] = (
    Rule(id="PP-DIVIDES-WORLD", severity="error", stage="plan",
         when="distributed.pipeline_parallel (times distributed.tensor_parallel) does not divide the world size (nodes x procs_per_node)",
         why="the mesh is pp x dp_shard (x tp): each stage is held by world_size / pipeline_parallel ranks, which shard it (FSDP2), "
             "in tensor-parallel groups of tensor_parallel of them.",
         fix="set distributed.pipeline_parallel (and tensor_parallel) so that their product divides distributed.nodes x procs_per_node",
         condition=lambda f: pp(f) > 1 and f.plan.world_size % (pp(f) * tp(f)) != 0,
         detail=lambda f: f"distributed.pipeline_parallel = {pp(f)}" + (f" x tensor_parallel = {tp(f)}" if tp(f) > 1 else "")
                          + f" does not divide the world size {f.plan.world_size}."),
    Rule(id="PP-LAYERS", severity="error", stage="plan",
         when="the pipeline's stages (distributed.pipeline_parallel x stages_per_rank) do not divide a builtin model's blocks and "
              "distributed.pipeline.layers_per_stage is empty, or layers_per_stage does not hold one count per stage summing to "
              "the model's blocks",
         why="each stage holds whole transformer blocks; an even split needs the stages to divide the blocks, an uneven one must "
             "place every block exactly once (torchtitan asserts the same).",
         fix="set distributed.pipeline.layers_per_stage (one count per stage, summing to the model's blocks, e.g. [3, 5]), or a "
             "distributed.pipeline_parallel (x stages_per_rank) that divides the blocks",
         condition=lambda f: bool(_layers(f)),
         detail=lambda f: _layers(f) + "."),
    Rule(id="PP-MICROBATCHES", severity="error", stage="plan",
         when="distributed.pipeline.microbatches (0: one sequence each) is below distributed.pipeline_parallel, or does not divide "
              "train.micro_batch_size x train.grad_accum_steps, or with Interleaved1F1B is not a multiple of its rounds "
              "(microbatches // pipeline_parallel)",
         why="torch.distributed.pipelining splits each rank's batch of the step into equal micro-batches (torch.tensor_split), and "
             "with fewer micro-batches than stages some stage idles for the whole step (torchtitan warns; 1F1B's warm-up needs "
             "one micro-batch per stage); ScheduleInterleaved1F1B runs them in rounds of equal size.",
         fix="set distributed.pipeline.microbatches to a divisor of train.micro_batch_size x train.grad_accum_steps that is at "
             "least distributed.pipeline_parallel, or raise train.micro_batch_size",
         condition=lambda f: bool(_microbatches(f)),
         detail=lambda f: _microbatches(f) + "."),
    Rule(id="PP-STAGES-PER-RANK", severity="error", stage="plan",
         when="distributed.pipeline.stages_per_rank is not 1 with schedule 1F1B or GPipe, below 2 with Interleaved1F1B, or not 2 "
              "with ZBVZeroBubble",
         why="Schedule1F1B and ScheduleGPipe run one PipelineStage a rank; ScheduleInterleaved1F1B interleaves several (with one "
             "it is 1F1B; torchtitan refuses fewer than 2 for a multi-stage schedule); ScheduleZBVZeroBubble raises unless each "
             "rank holds exactly two, in a V.",
         fix="set distributed.pipeline.stages_per_rank = 0 (the schedule's own), or a schedule that runs that many stages a rank",
         condition=lambda f: bool(_stages_per_rank(f)),
         detail=lambda f: _stages_per_rank(f) + "."),
    Rule(id="PP-ZBV-COMPILE", severity="error", stage="plan",
         when="distributed.pipeline.schedule = \"ZBVZeroBubble\" with compile.enabled",
         why="the zero-bubble schedule computes the input and the weight gradients in separate backward passes, which a compiled "
             "block's one backward graph does not split: ScheduleZBVZeroBubble raises on a stage holding torch.compile'd modules "
             "(torch 2.13, distributed/pipelining/schedules.py _check_torch_compile_compatibility).",
         fix='set compile.enabled = false, or distributed.pipeline.schedule = "Interleaved1F1B"',
         condition=lambda f: pp(f) > 1 and f.plan.distributed.pipeline.schedule in V_SCHEDULES and f.plan.compile.enabled),
    Rule(id="PP-ZBV-RESHARD", severity="error", stage="plan",
         when="distributed.pipeline.schedule = \"ZBVZeroBubble\" with distributed.fsdp2.reshard_after_forward = true",
         why="the zero-bubble schedule computes a micro-batch's weight gradients in a pass of their own, after its input "
             "gradients (torch 2.13 pipelining/_backward.py stage_backward_weight); FSDP2 resharding after each forward swaps "
             "the gathered weights for their shards between the passes, and the weight gradients of some micro-batches are "
             "lost (measured on pp 2: a quarter to half of the blocks' gradient norm; tests/train/test_pipeline_stage.py). "
             "torchtitan keeps the weights gathered under pipeline parallelism by default.",
         fix="set distributed.fsdp2.reshard_after_forward = false, or distributed.pipeline.schedule = \"Interleaved1F1B\"",
         condition=lambda f: pp(f) > 1 and f.plan.distributed.pipeline.schedule in V_SCHEDULES and strategy(f) == "fsdp2"
                             and f.plan.distributed.fsdp2.reshard_after_forward),
    Rule(id="PP-ZBV-EVAL", severity="error", stage="plan",
         when="distributed.pipeline.schedule = \"ZBVZeroBubble\" with [eval]",
         why="evaluation runs the schedule forward only (its eval()), and torch 2.13's ScheduleZBVZeroBubble keeps its "
             "backward actions in that pass and stops (\"can't steal_bwd_input if this stage doesn't have backward\"); "
             "Interleaved1F1B and the single-stage schedules evaluate.",
         fix='remove [eval], or set distributed.pipeline.schedule = "Interleaved1F1B"',
         condition=lambda f: pp(f) > 1 and f.plan.distributed.pipeline.schedule in V_SCHEDULES and f.plan.eval.enabled),
    Rule(id="PP-STRATEGY", severity="error", stage="plan",
         when="distributed.pipeline_parallel > 1 with strategy ddp or deepspeed",
         why="fp8launch composes pipeline parallelism with FSDP2 (each stage sharded over its world_size / pp ranks, gradients "
             "reduced once after the schedule's last backward, as torchtitan does); DeepSpeed ZeRO has its own pipeline engine "
             "(PipelineModule) that fp8launch does not drive, and DDP stages are not built.",
         fix='set distributed.strategy = "fsdp2", or distributed.pipeline_parallel = 1',
         condition=lambda f: pp(f) > 1 and strategy(f) in ("ddp", "deepspeed")),
    Rule(id="PP-MODEL", severity="error", stage="plan",
         when="distributed.pipeline_parallel > 1 with an hf: or py: model",
         why="a stage is cut from the builtin decoder's parts (the embedding on the first stage, whole blocks, the final norm and "
             "output layer on the last, every name kept for checkpoints); another model's forward cannot be cut where fp8launch "
             "does not know its parts.",
         fix='set train.model = "builtin:..." or distributed.pipeline_parallel = 1',
         condition=lambda f: pp(f) > 1 and not f.plan.train.model.startswith("builtin:")),
    Rule(id="PP-EXPERT-PARALLEL", severity="error", stage="plan",
         when="distributed.pipeline_parallel > 1 with distributed.expert_parallel > 1",
         why="not composed yet: expert parallelism needs its own mesh dimensions inside each stage's ranks (torchtitan: ep inside "
             "dp x cp); an MoE model trains under pipeline parallelism with every stage rank holding its blocks' experts.",
         fix="set distributed.expert_parallel = 1 or distributed.pipeline_parallel = 1",
         condition=lambda f: pp(f) > 1 and f.plan.distributed.expert_parallel > 1),
    Rule(id="PP-BACKEND", severity="error", stage="plan",
         when="distributed.pipeline_parallel > 1 with precision.backend te or msamp",
         why="not composed yet: Transformer Engine's delayed-scaling state and MS-AMP's optimizer span the whole model, and a "
             "stage holds part of it.",
         fix='set precision.backend = "torchao", or distributed.pipeline_parallel = 1',
         condition=lambda f: pp(f) > 1 and (fp8(f, TE) or fp8(f, MSAMP))),
    Rule(id="PP-PRECISION-SCHEDULE", severity="error", stage="plan",
         when="distributed.pipeline_parallel > 1 with a [[precision.schedule]]",
         why="not composed yet: a precision switch rebuilds the converted Linears of the whole model, and under pipeline "
             "parallelism the schedule's stages hold them.",
         fix="remove [[precision.schedule]], or set distributed.pipeline_parallel = 1",
         condition=lambda f: pp(f) > 1 and bool(f.plan.precision.schedule)),
    Rule(id="PP-FP16", severity="error", stage="plan",
         when='distributed.pipeline_parallel > 1 with precision.mode = "fp16" (or high_precision "fp16")',
         why="fp16's loss scaler scales the loss before backward, and under pipeline parallelism the schedule runs backward from "
             "the last stage's loss itself (torch.distributed.pipelining has no loss-scaling hook).",
         fix='set precision.mode = "bf16" (or precision.high_precision = "bf16"), or distributed.pipeline_parallel = 1',
         condition=lambda f: pp(f) > 1 and f.plan.precision.compute_dtype == "fp16"),
    Rule(id="PP-GRAD-REDUCE", severity="error", stage="plan",
         when='distributed.pipeline_parallel > 1 with precision.grad_reduce other than "auto"',
         why="fp8launch's own reduce-scatter averages over every rank of the job; under pipeline parallelism a stage's gradients "
             "are reduced over its world_size / pipeline_parallel ranks.",
         fix='set precision.grad_reduce = "auto", or distributed.pipeline_parallel = 1',
         condition=lambda f: pp(f) > 1 and f.plan.precision.grad_reduce != "auto"),
    Rule(id="PP-MONITOR", severity="error", stage="plan",
         when="distributed.pipeline_parallel > 1 with monitor.fp8_stats_every > 0",
         why="not composed yet: the FP8 monitor writes from rank 0, which holds the first stage's layers only.",
         fix="set monitor.fp8_stats_every = 0, or distributed.pipeline_parallel = 1",
         condition=lambda f: pp(f) > 1 and f.plan.monitor.fp8_stats_every > 0),
)
