"""The parallel layout of a job: how its world of ranks is split, in one place (torch-free).

A world of `world_size` ranks is a mesh pp x dp_shard x cp x tp, torchtitan's order (pp outermost, tp innermost:
torchtitan/distributed/parallel_dims.py ParallelDims builds the same names in the same order). Ranks are laid out
row-major, so a tensor-parallel group's ranks are adjacent, then a context-parallel group's, and a pipeline stage's
ranks form one contiguous block:

    rank = pipeline_rank * world_size / pp + (dp_rank * cp + cp_rank) * tp + tp_rank

Expert parallelism has a mesh of its own, efsdp x ep (world_size / ep ranks hold each expert), beside the dense one.

Everything that needs a degree, the data-parallel size, the mesh, the ranks that hold the loss, a rank's pipeline rank
or stages, or the tokens of one micro-batch on one rank asks a Layout: the plan (DistributedConfig.layout), the rules,
the memory and speed estimates, and the training process, which builds its DeviceMesh from `mesh` (launcher/train/
parallel/distributed.py). The importer builds one from a config's degrees with `Layout.of_degrees`.
"""

from __future__ import annotations

from dataclasses import dataclass

MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "ZBVZeroBubble")
"""The schedules that run several stages on each pipeline rank (torch.distributed.pipelining's PipelineScheduleMulti)."""
V_SCHEDULES = ("ZBVZeroBubble",)
"""The schedules whose stages go to the ranks in a V (rank r holds stages r and 2 x pp - 1 - r), not in a loop."""


def even_split(n_layers: int, stages: int) -> tuple[int, ...]:
    """n_layers blocks over `stages` pipeline stages as evenly as they go, the first stages one more."""
    q, r = divmod(n_layers, stages)
    return tuple(q + (i < r) for i in range(stages))


def stages_a_rank(schedule: str, stages_per_rank: int) -> int:
    """distributed.pipeline.stages_per_rank resolved: as set, or (0) the schedule's own, 2 for a multi-stage one, else 1."""
    return stages_per_rank or (2 if schedule in MULTI_STAGE_SCHEDULES else 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """The degrees of a world of `world_size` ranks and what follows from them. A degree of 1 is off; a degree below 1
    (an unchecked config) counts as 1."""

    world_size: int
    tp: int = 1
    """Tensor-parallel degree (the mesh's "tp")."""
    cp: int = 1
    """Context-parallel degree: ranks each sequence is split over (the mesh's "cp")."""
    pp: int = 1
    """Pipeline-parallel degree: pipeline ranks (the mesh's "pp")."""
    ep: int = 1
    """Expert-parallel degree: its own mesh, efsdp x ep."""
    schedule: str = "1F1B"
    """The pipeline schedule (distributed.pipeline.schedule): which stages a pipeline rank holds."""
    local_stages: int = 1
    """Pipeline stages each pipeline rank holds (distributed.pipeline.stages_per_rank, resolved)."""
    layers_per_stage: tuple[int, ...] = ()
    """Blocks on each pipeline stage as distributed.pipeline.layers_per_stage sets them (empty: an even split)."""

    @classmethod
    def of_degrees(cls, world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1, ep: int = 1, schedule: str = "1F1B",
                   stages_per_rank: int = 0, layers_per_stage: tuple[int, ...] = ()) -> Layout:
        """A layout from bare degrees (an imported config's, say), each below 1 read as 1; `stages_per_rank` 0 is the
        schedule's own."""
        return cls(world_size=world_size, tp=max(1, tp), cp=max(1, cp), pp=max(1, pp), ep=max(1, ep), schedule=schedule,
                   local_stages=stages_a_rank(schedule, stages_per_rank), layers_per_stage=tuple(layers_per_stage))

    # ---- sizes -------------------------------------------------------------------------------------------------
    @property
    def split(self) -> int:
        """Ranks that share one data-parallel rank's batches: tp x cp x pp."""
        return self.tp * self.cp * self.pp

    @property
    def divides(self) -> bool:
        """Whether tp x cp x pp divides the world size (rules TP-DIVIDES-PROCS, CP-DIVIDES-WORLD, PP-DIVIDES-WORLD)."""
        return self.world_size % self.split == 0

    @property
    def dp(self) -> int:
        """Data-parallel ranks (dp_shard): ranks that hold different data, at least 1."""
        return max(1, self.world_size // self.split)

    @property
    def stage_ranks(self) -> int:
        """Ranks that hold one pipeline stage (world_size / pp): dp x cp x tp, over which FSDP2 shards it."""
        return self.world_size // self.pp

    @property
    def loss_ranks(self) -> int:
        """The ranks whose losses a step's all-reduce sums: every rank, or those of the pipeline's last stage (the others
        add 0)."""
        return self.stage_ranks

    @property
    def fsdp_ranks(self) -> int:
        """Ranks FSDP2 shards a parameter over, tp pieces included: dp x cp x tp (a CP group's ranks hold the same
        parameters; TP splits each weight first)."""
        return self.dp * self.cp * self.tp

    @property
    def expert_shards(self) -> int:
        """Ranks that hold the same experts (world_size / ep): the expert mesh's "efsdp"."""
        return self.world_size // self.ep

    # ---- the mesh ------------------------------------------------------------------------------------------------
    @property
    def mesh(self) -> tuple[tuple[str, int], ...]:
        """The device mesh's (dim name, size), outermost first: pp x dp_shard x cp x tp, each of pp, cp and tp only where
        it is above 1."""
        return tuple((name, n) for name, n in (("pp", self.pp), ("dp_shard", self.dp), ("cp", self.cp), ("tp", self.tp))
                     if name == "dp_shard" or n > 1)

    @property
    def mesh_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.mesh)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.mesh)

    @property
    def flattened(self) -> tuple[tuple[tuple[str, str], str], ...]:
        """The mesh dims flattened into one, ((dims), name): dp_shard x tp (a 2D partial value, the gradient norm, reduced
        in one all-reduce), dp_shard x cp (FSDP2 shards over it, torchtitan)."""
        return tuple((dims, name) for dims, name, on in ((("dp_shard", "tp"), "dp_shard_tp", self.tp > 1),
                                                          (("dp_shard", "cp"), "dp_shard_cp", self.cp > 1)) if on)

    @property
    def shard_dim(self) -> str | None:
        """The mesh dim FSDP2 shards over: dp_shard x cp flattened with context parallel, dp_shard with tp or pp, the
        whole (one-dim) mesh otherwise (None)."""
        if self.cp > 1:
            return "dp_shard_cp"
        return "dp_shard" if self.tp > 1 or self.pp > 1 else None

    @property
    def stage_dim(self) -> str:
        """The mesh dim of the ranks that hold one pipeline stage (MoE load balancing sums over them)."""
        return "dp_shard_tp" if self.tp > 1 else "dp_shard"

    # ---- ranks ------------------------------------------------------------------------------------------------
    def pipeline_rank(self, rank: int) -> int:
        """The pipeline rank global rank `rank` is (pp outermost in the mesh)."""
        return rank // self.stage_ranks

    def data_rank(self, rank: int) -> tuple[int, int]:
        """(data-parallel rank, data-parallel size) of global rank `rank`: the ranks of one TP group read the same
        batches, and so do the ranks of one CP group (each keeps its part of every sequence) and the stages of one
        pipeline."""
        return (rank % self.stage_ranks) // (self.tp * self.cp), self.stage_ranks // (self.tp * self.cp)

    # ---- pipeline stages -----------------------------------------------------------------------------------------
    @property
    def pipeline_stages(self) -> int:
        """Pipeline stages in all: pp x the stages each pipeline rank holds."""
        return self.pp * self.local_stages

    def rank_stages(self, pipeline_rank: int) -> tuple[int, ...]:
        """The stages pipeline rank `pipeline_rank` holds, in order: itself, or with several stages a rank, every pp-th
        stage from it (a loop), or for a V schedule stage r and stage 2 x pp - 1 - r (torch.distributed.pipelining's
        generate_stage_to_rank_mapping; tests/test_pipeline_plan.py compares the two)."""
        if self.schedule in V_SCHEDULES:  # two stages a rank (rule PP-STAGES-PER-RANK)
            return (pipeline_rank, 2 * self.pp - 1 - pipeline_rank)
        return tuple(range(pipeline_rank, self.pipeline_stages, self.pp))

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The pipeline stages global rank `rank` holds."""
        return self.rank_stages(self.pipeline_rank(rank))

    def stage_split(self, n_layers: int) -> tuple[int, ...]:
        """Blocks on each pipeline stage, first stage first: layers_per_stage, or an even split (rule PP-LAYERS refuses
        an uneven one at plan time)."""
        return self.layers_per_stage or even_split(n_layers, self.pipeline_stages)

    # ---- tokens ------------------------------------------------------------------------------------------------
    def sequences_per_micro_batch(self, micro_batch_size: int, step_sequences: int, microbatches: int) -> int:
        """Sequences one rank runs through its model at once: train.micro_batch_size, or under pipeline parallelism
        the step's `step_sequences` over the schedule's `microbatches`."""
        return step_sequences // microbatches if self.pp > 1 else micro_batch_size

    def tokens_per_rank(self, sequences: int, seq_len: int) -> int:
        """The tokens of `sequences` sequences on one rank: sequence parallel (tp) and context parallel (cp) split each
        sequence over their ranks."""
        return sequences * seq_len // (self.tp * self.cp)
