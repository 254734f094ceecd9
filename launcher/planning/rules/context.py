"""Context parallelism (distributed.context_parallel; launcher/train/parallel/context.py): the layouts torch's
context_parallel cannot run, and what fp8launch does not compose with it yet."""

from __future__ import annotations

from launcher.planning.backends import MSAMP, TE
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8, strategy, tp


def cp(f: Facts) -> int:
    return f.plan.distributed.context_parallel


def pp(f: Facts) -> int:
    return f.plan.distributed.pipeline_parallel


RULES: tuple[Rule, ...] = (
    Rule(id="CP-DIVIDES-WORLD", severity="error", stage="plan",
         when="distributed.context_parallel (times tensor_parallel and pipeline_parallel) does not divide the world size "
              "(nodes x procs_per_node)",
         why="the mesh is pp x dp_shard x cp x tp: each sequence is split over context_parallel ranks, which read the same "
             "batches, and the data-parallel ranks are what is left of the world.",
         fix="set distributed.context_parallel to a divisor of distributed.nodes x procs_per_node",
         condition=lambda f: cp(f) > 1 and not f.plan.distributed.layout().divides,
         detail=lambda f: f"distributed.context_parallel = {cp(f)}" + (f" x tensor_parallel = {tp(f)}" if tp(f) > 1 else "")
                          + (f" x pipeline_parallel = {pp(f)}" if pp(f) > 1 else "")
                          + f" does not divide the world size {f.plan.world_size}."),
    Rule(id="CP-SEQ", severity="error", stage="plan",
         when="train.seq_len is not divisible by 2 x distributed.context_parallel",
         why="torch's context_parallel balances causal attention by dealing each rank a chunk from the head and one from the "
             "tail of every sequence (its head-tail load balancer, which needs 2 x cp equal chunks); without it the last rank "
             "would do most of the work, and an uneven split is not supported.",
         fix="set train.seq_len to a multiple of 2 x distributed.context_parallel",
         condition=lambda f: cp(f) > 1 and f.plan.train.seq_len % (2 * cp(f)) != 0,
         detail=lambda f: f"train.seq_len = {f.plan.train.seq_len} is not a multiple of 2 x context_parallel = {2 * cp(f)}."),
    Rule(id="CP-STRATEGY", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with strategy ddp or deepspeed",
         why="the ranks of a context-parallel group hold different tokens of the same sequences, so their gradients are "
             "averaged with the data-parallel ranks': fp8launch does that with FSDP2 over dp_shard x cp (torchtitan's layout); "
             "DeepSpeed ZeRO has its own sequence parallelism (Ulysses) that fp8launch does not drive, and DDP is not built for it.",
         fix='set distributed.strategy = "fsdp2", or distributed.context_parallel = 1',
         condition=lambda f: cp(f) > 1 and strategy(f) in ("ddp", "deepspeed")),
    Rule(id="CP-MODEL", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with an hf: or py: model",
         why="each rank holds part of every sequence, so rotary embeddings must be taken at the positions that rank holds; "
             "the builtin models' attention takes them (launcher/train/parallel/context.py), another model's computes its "
             "positions from the length it sees, which would be wrong.",
         fix='set train.model = "builtin:..." or distributed.context_parallel = 1',
         condition=lambda f: cp(f) > 1 and not f.plan.train.model.startswith("builtin:")),
    Rule(id="CP-PIPELINE", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with distributed.pipeline_parallel > 1",
         why="not composed yet: the pipeline schedule runs each micro-batch's forward and backward itself, and context "
             "parallel must shard the micro-batch and hold its ring around both.",
         fix="set distributed.pipeline_parallel = 1 or distributed.context_parallel = 1",
         condition=lambda f: cp(f) > 1 and f.plan.distributed.pipeline_parallel > 1),
    Rule(id="CP-TENSOR-PARALLEL", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with distributed.tensor_parallel > 1",
         why="not composed yet: fp8launch has not trained a mesh with both dimensions (torchtitan's cp x tp).",
         fix="set distributed.tensor_parallel = 1 or distributed.context_parallel = 1",
         condition=lambda f: cp(f) > 1 and tp(f) > 1),
    Rule(id="CP-EXPERT-PARALLEL", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with distributed.expert_parallel > 1",
         why="not composed yet: expert parallelism's mesh (ep inside dp x cp, torchtitan) is not built with context parallel; "
             "an MoE model trains under context parallel with every rank holding every expert.",
         fix="set distributed.expert_parallel = 1 or distributed.context_parallel = 1",
         condition=lambda f: cp(f) > 1 and f.plan.distributed.expert_parallel > 1),
    Rule(id="CP-BACKEND", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with precision.backend te or msamp",
         why="Transformer Engine puts its own DotProductAttention in the attention's place (with precision.te.fp8_dpa, in FP8), "
             "which torch's ring does not reach: TE's own context parallel needs its cp_group and CUDA; MS-AMP's stack needs "
             "CUDA and TE too. The FP8 Linears of torchao are position-wise and unchanged under context parallel.",
         fix='set precision.backend = "torchao", or distributed.context_parallel = 1',
         condition=lambda f: cp(f) > 1 and (fp8(f, TE) or fp8(f, MSAMP))),
    Rule(id="CP-COMPILE", severity="error", stage="plan",
         when="distributed.context_parallel > 1 with compile.enabled",
         why="not proven yet: context_parallel replaces scaled_dot_product_attention by a function that turns q, k and v into "
             "DTensors for the ring, and fp8launch has not trained it inside compiled blocks.",
         fix="set compile.enabled = false, or distributed.context_parallel = 1",
         condition=lambda f: cp(f) > 1 and f.plan.compile.enabled),
)
