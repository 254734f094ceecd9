"""Will FP8 pay off for this plan? A torch-free prediction of one training step's time on `launch.gpu`,
in the plan's precision and in its bf16 twin (same model, batch, engine, compile and checkpointing).

    predict(plan, spec_dir) -> Prediction   (fp8_vs_bf16: predicted tokens/s ratio, > 1 = FP8 faster)

The model is a roofline per GEMM (launcher/planning/predict/cost.py) over the Linear layers of the model's
shapes (launcher/planning/predict/shapes.py), plus the casts the recipe adds, plus the time FP8 does not touch:
attention, norms and elementwise ops, the loss, the optimizer and the communication FSDP2/DDP/ZeRO
cannot hide. docs/prediction.md states its assumptions and its error on every published point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.planning.backends import BACKENDS
from launcher.planning.gpus import plan_gpu, plan_gpu_name
from launcher.planning.hardware import BLOCK_RECIPES, precision_key, supports
from launcher.planning.levels import REDUCE_BYTES, grad_comm_bytes, reduce_payload
from launcher.planning.predict.cost import Device, cast_s, gemm_s, stream_s
from launcher.planning.predict.shapes import LinearShape, ModelShape, model_shape
from launcher.planning.selection import GROUPED_ALIGN, ROUTER, choose, choose_experts, default_recipe, is_router, shape_reason

from . import cost

ELEMENTWISE = {True: (1.0, 12), False: (2.5, 40)}
"""compiled -> (bytes multiplier, kernels per block): compile fuses norms, SwiGLU, RoPE and residual adds
into a few kernels; eager runs each op as its own kernel with bf16/fp32 intermediates in memory."""

RECOMPUTE = {"none": 0.0, "selective": 0.5, "full": 1.0}
"""Share of the blocks whose forward runs again in backward (this project's selective AC: every other block)."""


@dataclass(frozen=True, slots=True)
class LayerRow:
    """One Linear of the model (all its copies, one per block), per rank, per micro-batch."""

    layer: str
    copies: int
    fp8_copies: int
    kept: str | None
    m: int
    k: int
    n: int
    bf16_s: float
    """Its three GEMMs in bf16 (one copy)."""
    fp8_s: float | None
    """Its three GEMMs in the recipe, with the casts (one copy); None where it stays in bf16."""
    cast_s: float | None

    @property
    def speedup(self) -> float | None:
        return None if self.fp8_s is None else self.bf16_s / self.fp8_s

    def why(self) -> str:
        us = lambda s: f"{s * 1e6:,.1f} us"  # noqa: E731
        if self.fp8_s is None:
            return f"stays in bf16: {self.kept}"
        saved = self.bf16_s - (self.fp8_s - self.cast_s)
        if self.fp8_s >= self.bf16_s:
            return f"loses: casts cost {us(self.cast_s)}, FP8 GEMMs save {us(saved)} (M, K, N = {self.m}, {self.k}, {self.n} too small)"
        return f"gains: FP8 GEMMs save {us(saved)}, casts cost {us(self.cast_s)}"

    def to_json(self) -> dict:
        r = lambda x: None if x is None else round(x * 1e6, 3)  # noqa: E731
        return {"layer": self.layer, "copies": self.copies, "fp8_copies": self.fp8_copies, "kept": self.kept,
                "m": self.m, "k": self.k, "n": self.n, "bf16_us": r(self.bf16_s), "fp8_us": r(self.fp8_s), "cast_us": r(self.cast_s),
                "speedup": None if self.speedup is None else round(self.speedup, 3), "why": self.why()}


@dataclass(frozen=True, slots=True)
class Prediction:
    gpu: str
    gpus: int
    precision: str
    fp8_vs_bf16: float | None
    """Predicted tokens/s of this plan over its bf16 twin; None when it cannot be predicted (see `reason`)."""
    reason: str = ""
    step_s: dict[str, float] = field(default_factory=dict)
    """{"bf16": s, "plan": s}: one optimizer step per GPU."""
    breakdown: dict[str, dict[str, float]] = field(default_factory=dict)
    layers: tuple[LayerRow, ...] = ()
    n_linear: int = 0
    n_fp8: int = 0
    n_losing: int = 0
    tokens_per_step: int = 0
    grad_comm_bytes: float | None = None
    """Bytes one rank sends per optimizer step for the gradient reduction, in the plan's payload (precision.grad_reduce;
    launcher/planning/levels.py): what each step record's grad_comm_bytes measures."""

    @property
    def gemm_share(self) -> float | None:
        b = self.breakdown.get("bf16")
        return None if not b else b["linear_gemms"] / sum(b.values())

    def to_json(self) -> dict:
        out = {"gpu": self.gpu, "gpus": self.gpus, "precision": self.precision,
               "fp8_vs_bf16": None if self.fp8_vs_bf16 is None else round(self.fp8_vs_bf16, 4), "reason": self.reason or None}
        if self.grad_comm_bytes is not None:
            out["grad_comm_bytes"] = round(self.grad_comm_bytes)
        if self.step_s:
            out.update({
                "step_s": {k: round(v, 6) for k, v in self.step_s.items()},
                "tokens_per_s_per_gpu": {k: round(self.tokens_per_step / self.gpus / v, 1) for k, v in self.step_s.items()},
                "breakdown_s": {k: {n: round(x, 6) for n, x in b.items()} for k, b in self.breakdown.items()},
                "linear_gemm_share_bf16": round(self.gemm_share, 4),
                "linear_layers": self.n_linear, "fp8_layers": self.n_fp8, "fp8_layers_losing": self.n_losing,
                "layers": [row.to_json() for row in self.layers],
                "model": "roofline; see docs/prediction.md",
            })
        return out

    def line(self) -> str:
        where = f"{self.gpus} x {self.gpu}"
        if self.fp8_vs_bf16 is None:
            return f"predicted FP8 speed-up on {where}: unknown ({self.reason})"
        share = f"Linear GEMMs {self.gemm_share:.0%} of the bf16 step"
        if self.precision == "bf16" or not self.n_fp8:
            what = "no Linear runs in FP8" if self.precision != "bf16" else "the plan is not FP8"
            return f"predicted FP8 speed-up on {where}: {self.fp8_vs_bf16:.2f}x ({what}; {share})"
        losing = (f"{self.n_losing} of {self.n_linear} layers too small to gain" if self.n_losing
                  else f"{self.n_fp8} of {self.n_linear} layers in FP8, all gain")
        return f"predicted FP8 speed-up on {where}: {self.fp8_vs_bf16:.2f}x ({share}; {losing})"


def _precision_label(plan) -> str:
    p = plan.precision
    if not p.fp8:
        return p.mode
    return f"fp8 {p.backend} {BACKENDS[p.backend].recipe(p)}"


def predict(plan, spec_dir: str = ".") -> Prediction:
    """The prediction for `plan` on its `launch.gpu` (auto: h100, or b200 for a precision that needs Blackwell);
    spec_dir resolves a relative hf: path."""
    gpu = plan_gpu_name(plan.launch.gpu, *precision_key(plan.precision))
    spec = plan_gpu(gpu)
    label = _precision_label(plan)
    base = dict(gpu=gpu, gpus=plan.world_size, precision=label, tokens_per_step=plan.tokens_per_step)
    shape, why = model_shape(plan.train.model, spec_dir)
    if shape is None:
        return Prediction(fp8_vs_bf16=None, reason=f"model shapes unknown: {why}", **base)
    d = plan.distributed
    if plan.world_size % (d.tensor_parallel * d.context_parallel * d.pipeline_parallel):  # refused by a *-DIVIDES-* rule
        return Prediction(fp8_vs_bf16=None, reason="the parallel degrees do not divide the world size", **base)
    base["grad_comm_bytes"] = grad_comm_bytes(plan, shape.params)
    p = plan.precision
    if p.fp8:
        unsupported = _unsupported(p, spec.capability)
        if unsupported:
            return Prediction(fp8_vs_bf16=None, reason=unsupported, **base)
    dev = device(gpu)
    bf16, _ = _step(plan, shape, dev, fp8=False)
    if not p.fp8:
        return Prediction(fp8_vs_bf16=1.0, step_s={"bf16": sum(bf16.values()), "plan": sum(bf16.values())},
                          breakdown={"bf16": bf16, "plan": bf16}, n_linear=shape.n_linears, **base)
    mine, rows = _step(plan, shape, dev, fp8=True)
    t_b, t_p = sum(bf16.values()), sum(mine.values())
    n_fp8 = sum(r.fp8_copies for r in rows)
    losing = sum(r.fp8_copies for r in rows if r.fp8_s is not None and r.fp8_s >= r.bf16_s)
    return Prediction(fp8_vs_bf16=t_b / t_p, step_s={"bf16": t_b, "plan": t_p}, breakdown={"bf16": bf16, "plan": mine},
                      layers=tuple(rows), n_linear=shape.n_linears, n_fp8=n_fp8, n_losing=losing, **base)


def _peaks(spec) -> dict[str, float]:
    from launcher.planning.gpus import PEAK_TFLOPS

    return dict(PEAK_TFLOPS[spec.name])


def _unsupported(p, capability) -> str:
    _, _, recipe = precision_key(p)
    if capability is None:  # AMD: torchao's FP8 runs (MI300X e4m3fnuz); TE/MS-AMP are CUDA builds
        if BACKENDS[p.backend].cuda_only:
            return f"{p.backend} on AMD GPUs is not modelled"
        return f"{p.backend} {recipe} on AMD GPUs is not modelled" if recipe in BLOCK_RECIPES else ""
    if not supports(capability, "fp8", p.backend, recipe):
        return f"this GPU (compute capability {capability[0]}.{capability[1]}) does not run fp8 {p.backend}{' ' + recipe if recipe else ''}"
    return ""


def _fp8_copies(plan, s: LinearShape, first_last: set[str]) -> tuple[dict[str, int], str | None]:
    """({recipe: copies of this Linear that run it}, the reason the others are kept), by
    launcher/planning/selection.py's rule (`[[precision.rules]]` included), as the run decides it on the built model."""
    p = plan.precision
    if is_router(s.name.format(i=0)):  # an MoE router gate: always kept
        return {}, ROUTER
    if not (p.keep or p.keep_first_blocks or p.keep_last_blocks or p.rules):  # the common case: only the first and last kept by name
        whole = shape_reason(s.in_features, s.out_features, plan)
        ends = {s.name.format(i=0), s.name.format(i=s.count - 1)} & first_last
        n = 0 if whole else s.count - len(ends)
        return ({default_recipe(plan): n} if n else {}), ("keep_first_last" if ends else whole)
    in_blocks = "{i}" in s.name  # one copy per transformer block: copy i is in block i
    counts: dict[str, int] = {}
    first = None
    for i in range(s.count):
        recipe, why = choose(s.name.format(i=i), s.in_features, s.out_features, plan, first_last, i if in_blocks else None, s.count)
        if recipe is not None:
            counts[recipe] = counts.get(recipe, 0) + 1
        first = first or why
    return counts, first


def _choices(plan, shape: ModelShape):
    """(name, in x out per token, runs in FP8, why kept or None, is the output layer) for every copy of every Linear and
    expert group of `shape`, by launcher/planning/selection.py's rule as the run applies it."""
    ends = shape.linears[0].name.format(i=0), shape.linears[-1].name.format(i=shape.linears[-1].count - 1)
    first_last = set(ends) if plan.precision.keep_first_last and shape.linears else set()
    for s in shape.linears:
        in_blocks = "{i}" in s.name
        for i in range(s.count):
            name = s.name.format(i=i)
            recipe, why = choose(name, s.in_features, s.out_features, plan, first_last, i if in_blocks else None,
                                 shape.n_layers if in_blocks else 0)
            yield name, s.in_features * s.out_features, recipe is not None, why, name == ends[1]
    e = shape.experts
    for i in range(e.first_block, e.first_block + e.count) if e else ():
        recipe, why = choose_experts(e.name.format(i=i), e.dim, e.hidden, plan, i, shape.n_layers)
        yield e.name.format(i=i), 3 * e.dim * e.hidden * e.top_k, recipe is not None, why, False


def layer_selection(plan, shape: ModelShape) -> tuple[int, dict[str, int]]:
    """(layers that run in FP8, {reason: layers kept for it}) over every copy of every Linear and expert group of
    `shape`, by launcher/planning/selection.py's rule as the run applies it."""
    fp8, kept = 0, {}
    for _, _, is_fp8, why, _ in _choices(plan, shape):
        fp8 += is_fp8
        if why:
            kept[why] = kept.get(why, 0) + 1
    return fp8, kept


def fp8_weight_params(plan, shape: ModelShape) -> int:
    """Weights of the Linears `plan` runs in FP8 (every copy; grouped experts not counted), by the same rule."""
    linears = sum(s.count for s in shape.linears)
    return sum(weights for k, (_, weights, on, _, _) in enumerate(_choices(plan, shape)) if k < linears and on)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which layers a plan runs in FP8, against the field's default (every Linear but the output layer: torchtitan's
    filter_fqns, Megatron's TE layers)."""

    fp8: int
    total: int
    flop_share: float
    """FP8 share of the layers' GEMM FLOPs (in x out per token; experts by the rows a token sends them)."""
    beyond: tuple[tuple[str, str], ...]
    """(layer, why) for each layer kept that the field's default would run in FP8 (the output layer left out)."""
    head_kept: str | None
    """Why the output layer is kept (the field keeps it too), or None when it runs in FP8."""


def selection(plan, shape: ModelShape) -> Selection:
    rows = list(_choices(plan, shape))
    total_flops = sum(f for _, f, _, _, _ in rows)
    fp8_flops = sum(f for _, f, on, _, _ in rows if on)
    return Selection(fp8=sum(1 for r in rows if r[2]), total=len(rows), flop_share=fp8_flops / total_flops if total_flops else 0.0,
                     beyond=tuple((name, why) for name, _, on, why, head in rows if not on and not head),
                     head_kept=next((why for _, _, on, why, head in rows if head and not on), None))


def _three_gemms(m: int, k: int, n: int) -> tuple[tuple[int, int, int], ...]:
    """(M, K, N) of a Linear's forward, input-gradient and weight-gradient GEMMs for M tokens through K -> N."""
    return (m, k, n), (m, n, k), (k, m, n)


def _step(plan, shape: ModelShape, dev: Device, *, fp8: bool) -> tuple[dict[str, float], list[LayerRow]]:
    """Seconds of one optimizer step per GPU, by part; with fp8, the per-layer rows too."""
    p, d, t = plan.precision, plan.distributed, plan.train
    layout = d.layout()
    tp, dp, cp, pp = layout.tp, layout.dp, layout.cp, layout.pp
    compiled = plan.compile.enabled
    recompute = RECOMPUTE[plan.activation_checkpointing.mode]
    m = t.micro_batch_size * t.seq_len // cp  # context parallel: each rank holds seq_len / cp of every sequence
    backend = p.backend
    fp8_all_gather = fp8 and BACKENDS[backend].float8_all_gather(p, d.strategy)

    def costs_of(recipe: str):
        """(casts, which GEMMs run low, scaled-GEMM efficiency, the low dtype, all-gathered in float8) of one recipe."""
        cost_recipe = BACKENDS[backend].costed_as or recipe
        low = "fp4" if (cost_recipe == "nvfp4" and "fp4" in dev.peak_tflops) else "fp8"
        return (cost.casts(backend, cost_recipe, compiled), cost.fp8_gemms(backend, cost_recipe),
                cost.scaled_gemm_eff(backend, cost_recipe), low, fp8_all_gather and recipe == "tensorwise")

    ends = shape.linears[0].name.format(i=0), shape.linears[-1].name.format(i=shape.linears[-1].count - 1)
    first_last = set(ends) if p.keep_first_last and shape.linears else set()
    rows, gemms, casts, recomputed, fp8_weight_params = [], 0.0, 0.0, 0.0, 0
    head = {"linear_gemms": 0.0, "fp8_casts": 0.0, "recompute": 0.0}  # the Linears outside the blocks (the output layer)
    for s in shape.linears:
        before = gemms, casts, recomputed
        k, n = (s.in_features // tp, s.out_features) if s.parallel == "row" else (s.in_features, s.out_features // tp)
        shapes3 = _three_gemms(m, k, n)
        bf16_one = sum(gemm_s(dev, *g, "bf16") for g in shapes3)
        fwd_bf16 = gemm_s(dev, m, k, n, "bf16")
        by_recipe, kept = _fp8_copies(plan, s, first_last) if fp8 else ({}, None)
        n_fp8 = sum(by_recipe.values())
        fp8_one = cast_one = None
        for recipe, copies in sorted(by_recipe.items(), key=lambda kv: kv[1]):  # the row shows the most used recipe
            cast_of, in_fp8, seff, low, gathered = costs_of(recipe)
            g = sum(gemm_s(dev, *sh, low, seff) if on else gemm_s(dev, *sh, "bf16") for sh, on in zip(shapes3, in_fp8))
            w_elems = k * n / (dp if gathered else 1)
            cast_one = (cast_s(dev, cast_of["input"], m * k) + cast_s(dev, cast_of["weight"], w_elems)
                        + cast_s(dev, cast_of["grad_output"], m * n))
            fp8_one = g + cast_one
            fwd_fp8 = gemm_s(dev, m, k, n, low, seff) + cast_s(dev, cast_of["input"], m * k) + cast_s(dev, cast_of["weight"], w_elems)
            if gathered:
                fp8_weight_params += copies * s.in_features * s.out_features
            gemms += copies * g
            casts += copies * cast_one
            recomputed += recompute * copies * fwd_fp8
        n_bf16 = s.count - n_fp8
        gemms += n_bf16 * bf16_one
        recomputed += recompute * n_bf16 * fwd_bf16
        if "{i}" not in s.name:
            for key, was, now in zip(head, before, (gemms, casts, recomputed)):
                head[key] += now - was
        if fp8:
            rows.append(LayerRow(s.name.replace("{i}", "*"), s.count, n_fp8, kept if n_fp8 < s.count else None,
                                 m, k, n, bf16_one, fp8_one, cast_one))

    if shape.experts is not None:
        e_gemms, e_casts, e_recomputed, row = _experts(plan, shape, dev, m, fp8, costs_of, recompute)
        gemms, casts, recomputed = gemms + e_gemms, casts + e_casts, recomputed + e_recomputed
        rows += [row] if fp8 else []

    attention, elementwise, loss = _untouched(plan, shape, dev, m, tp, cp)
    accum = t.grad_accum_steps
    parts = {"linear_gemms": gemms, "fp8_casts": casts, "recompute": recomputed, "attention": attention,
             "elementwise": elementwise, "loss": loss}
    head["loss"] = loss
    parts = {k: accum * v for k, v in _busiest_stage(plan, shape, parts, head).items()}
    compute = sum(parts.values())
    optimizer = _optimizer_s(plan, shape, dev, fp8_weight_params if fp8_all_gather and p.torchao.precompute_scale else None)
    comm = _exposed_comm(plan, shape, dev, compute, m, fp8_weight_params if fp8_all_gather else 0)
    parts.update(optimizer=optimizer, exposed_comm=comm)
    if cp > 1:
        parts["ring_exchange"] = accum * shape.n_layers * ring_exposed_s(plan, shape, dev, attention / shape.n_layers)
    if pp > 1:  # the schedule's fill and drain: pp - 1 micro-batches' time on each stage with nothing to do, a stage's
        # micro-batch 1 / stages_per_rank of the rank's with several stages a rank (Megatron's interleaved bubble; counted
        # so for ZBVZeroBubble too, whose weight-gradient passes fill it only where forward, input- and weight-gradient
        # passes take equal time)
        parts["pipeline_bubble"] = (pp - 1) / (plan.pipeline_microbatches * d.pipeline.local_stages) * compute
    return parts, rows


def _optimizer_s(plan, shape: ModelShape, dev: Device, precomputed: int | None) -> float:
    """Seconds of one optimizer step over this rank's parameters (a stage's, TP's piece, FSDP2's or ZeRO's shard), and the
    amax pass over the `precomputed` float8 all-gathered weights' local shards (torchao's precompute_scale; None: none)."""
    d, layout = plan.distributed, plan.distributed.layout()
    shards = layout.dp * layout.cp  # FSDP2 shards over dp x cp
    sharded = d.strategy == "fsdp2" or (d.strategy == "deepspeed" and d.deepspeed.zero_stage >= 1)
    local = shape.params / layout.pp / layout.tp / (shards if sharded else 1)
    per_param = cost.OPTIMIZER_BYTES.get(plan.train.optimizer, cost.OPTIMIZER_BYTES_OTHER)
    optimizer = stream_s(dev, per_param * local, cost.OPTIMIZER_KERNELS)
    if precomputed is not None:
        optimizer += stream_s(dev, 4 * precomputed / layout.pp / layout.tp / shards, 2)
    return optimizer


def _untouched(plan, shape: ModelShape, dev: Device, m: int, tp: int, cp: int) -> tuple[float, float, float]:
    """Seconds of what FP8 does not touch, per micro-batch: (attention, elementwise kernels, loss)."""
    t, recompute = plan.train, RECOMPUTE[plan.activation_checkpointing.mode]
    # attention (bf16 in every recipe): causal flash attention, forward 2*s^2*d FLOPs per sequence and block
    d_attn = shape.n_heads * shape.head_dim // tp
    attn_fwd = 2.0 * t.seq_len ** 2 * d_attn * t.micro_batch_size / cp  # under CP each rank's queries, balanced (head-tail)
    attention = shape.n_layers * ((1 + cost.ATTN_BACKWARD + recompute) * attn_fwd / (dev.peak("bf16") * cost.ATTN_EFF)
                                  + 4 * cost.KERNEL_FIXED_S)
    # norms, residual adds, RoPE, SwiGLU: elements per token and block, forward + backward
    mult, kernels = ELEMENTWISE[plan.compile.enabled]
    q_kv = (shape.n_heads + 2 * shape.kv_heads) * shape.head_dim // tp
    per_token = cost.ELEMENTWISE_PER_DIM * shape.dim + cost.ELEMENTWISE_PER_QKV * q_kv + cost.ELEMENTWISE_PER_FFN * shape.ffn_dim // tp
    elementwise = shape.n_layers * (1 + cost.ELEMENTWISE_RECOMPUTED * recompute) * stream_s(dev, 2 * mult * per_token * m, kernels)
    loss = stream_s(dev, m * (cost.LOSS_BYTES_PER_VOCAB * shape.vocab_size // tp + cost.LOSS_BYTES_PER_DIM * shape.dim),
                    cost.LOSS_KERNELS)
    return attention, elementwise, loss


def _busiest_stage(plan, shape: ModelShape, parts: dict[str, float], head: dict[str, float]) -> dict[str, float]:
    """Under pipeline parallelism, what the busiest stage computes of each part (of which `head` is outside the blocks:
    the output layer and the loss, on the last stage): its blocks' share of the rest, and the head if it is the last.
    The parts as they are without."""
    d = plan.distributed
    if d.pipeline_parallel <= 1:
        return parts
    split = d.stage_split(shape.n_layers)
    if len(split) != d.pipeline_stages:  # rule PP-LAYERS refuses the plan
        return parts
    last = len(split) - 1
    blocks = {k: v - head.get(k, 0.0) for k, v in parts.items()}

    def share(stages: tuple[int, ...]) -> dict[str, float]:  # a pipeline rank's stages
        held = sum(split[s] for s in stages)
        return {k: held / shape.n_layers * blocks[k] + (last in stages) * head.get(k, 0.0) for k in parts}

    layout = d.layout()
    return max((share(layout.rank_stages(r)) for r in range(layout.pp)), key=lambda p: sum(p.values()))


def ring_exposed_s(plan, shape: ModelShape, dev: Device, attention_block_s: float) -> float:
    """Seconds of one block's context-parallel ring (torch's: cp - 1 rotations of the local K and V in forward; K, V
    and their gradients in backward) that its attention does not hide: each rotation is sent while the chunk in hand is
    computed (torch's _templated_ring_attention), so only what exceeds the attention's time shows."""
    d, t = plan.distributed, plan.train
    cp = max(1, d.context_parallel)
    kv_shard = 2 * t.micro_batch_size * (t.seq_len // cp) * shape.kv_heads * shape.head_dim * 2  # K and V in bf16
    ring = 3 * (cp - 1) * kv_shard / link_bytes_per_s(plan, dev, cp)  # a CP group's ranks are adjacent
    return max(0.0, ring - attention_block_s)


def link_bytes_per_s(plan, dev: Device, group: int) -> float:
    """Bytes a second per GPU of a collective among `group` adjacent ranks (the mesh puts a TP, CP or EP group's ranks
    next to each other): the GPU's own link (NVLink, Infinity Fabric) while the group fits in a node, the network once it
    spans nodes; at the collectives' bus efficiency."""
    d = plan.distributed
    gbps = cost.INTER_NODE_GBPS if d.nodes > 1 and group > d.procs_per_node else dev.link_gbps
    return gbps * cost.LINK_EFF * 1e9


def _experts(plan, shape: ModelShape, dev: Device, m: int, fp8: bool, costs_of, recompute: float):
    """Seconds of the routed experts' grouped GEMMs per micro-batch and rank (gemms, casts, recomputed) and their
    row. Routing is taken as balanced: each of the E experts gets m * top_k / E rows; expert parallelism gives a rank
    E / ep experts with ep times the rows (the same work). A grouped GEMM is one kernel over all of a rank's experts:
    costed as one GEMM of all their rows (M) against one expert's K x N, and its casts as one kernel over all rows and
    all local experts' weights; in a low-precision recipe each group is first padded to the grouped GEMM's alignment
    (GROUPED_ALIGN)."""
    e, ep = shape.experts, max(1, plan.distributed.expert_parallel)
    local = e.num_experts // ep
    rows = max(1, round(m * e.top_k / e.num_experts)) * ep
    weights = [(e.dim, e.hidden), (e.dim, e.hidden), (e.hidden, e.dim)]  # w1, w3, w2 (K, N)

    bf16 = sum(gemm_s(dev, *sh, "bf16") for k, n in weights for sh in _three_gemms(local * rows, k, n))
    fwd_bf16 = sum(gemm_s(dev, local * rows, k, n, "bf16") for k, n in weights)
    recipe, kept = choose_experts(e.name.format(i=e.first_block), e.dim, e.hidden, plan) if fp8 else (None, None)
    one, cast_one, fwd = bf16, None, fwd_bf16
    if recipe is not None:
        cast_of, in_fp8, seff, low, _ = costs_of(recipe)
        mm = local * (-(-rows // GROUPED_ALIGN[recipe]) * GROUPED_ALIGN[recipe])
        gemm = sum(gemm_s(dev, *sh, low, seff) if on else gemm_s(dev, *sh, "bf16")
                   for k, n in weights for sh, on in zip(_three_gemms(mm, k, n), in_fp8))
        cast_one = sum(cast_s(dev, cast_of["input"], mm * k) + cast_s(dev, cast_of["weight"], local * k * n)
                       + cast_s(dev, cast_of["grad_output"], mm * n) for k, n in weights)
        one = gemm + cast_one
        fwd = sum(gemm_s(dev, mm, k, n, low, seff) + cast_s(dev, cast_of["input"], mm * k) + cast_s(dev, cast_of["weight"], local * k * n)
                  for k, n in weights)
    row = LayerRow(e.name.replace("{i}", "*") + f" (grouped: {local} experts x {rows} rows)", e.count,
                   e.count if recipe else 0, kept, local * rows, e.dim, 3 * e.hidden, bf16, one if recipe else None, cast_one)
    return e.count * (one - (cast_one or 0.0)), e.count * (cast_one or 0.0), recompute * e.count * fwd, row


def all_to_all_s(plan, shape: ModelShape, dev: Device, m: int) -> float:
    """Expert parallelism's token exchange per micro-batch and rank: per MoE block a dispatch and a combine of
    m * top_k rows of dim bf16 values (torchao's MX paths communicate in bf16 too), (ep - 1) / ep of them leaving
    the rank, in forward and again in backward; not overlapped (the experts wait for their tokens)."""
    e, ep = shape.experts, max(1, plan.distributed.expert_parallel)
    if e is None or ep == 1:
        return 0.0
    volume = e.count * 4 * (ep - 1) / ep * m * e.top_k * shape.dim * 2
    return volume / link_bytes_per_s(plan, dev, ep) + e.count * 4 * cost.KERNEL_FIXED_S


def _exposed_comm(plan, shape: ModelShape, dev: Device, compute: float, m: int, fp8_params: int) -> float:
    """Communication the engine cannot overlap with compute: what exceeds the compute, plus the first
    all-gather and the last reduce-scatter (one block's worth), plus tensor-parallel collectives."""
    d, t = plan.distributed, plan.train
    layout = d.layout()
    tp, dp, pp = layout.tp, layout.dp, layout.pp
    params = shape.params / tp / pp  # a stage's
    if d.strategy == "fsdp2":
        dp *= layout.cp  # FSDP2 shards over dp x cp
    share = (dp - 1) / dp
    accum = t.grad_accum_steps
    if dp == 1:
        volume = 0.0
    elif d.strategy == "fsdp2":
        gathers = 2 if d.fsdp2.reshard_after_forward else 1
        reduce_bytes = REDUCE_BYTES[reduce_payload(plan)]  # precision.grad_reduce, else distributed.fsdp2.reduce_dtype
        # expert parallelism: each rank keeps its experts (E / ep of them), FSDP2 shards them over dp / ep ranks only
        ep = max(1, d.expert_parallel) if shape.experts else 1
        experts = shape.experts.params / ep if shape.experts and ep > 1 else 0.0
        dense = params - (shape.experts.params if experts else 0.0)
        weights = 2 * dense - fp8_params / tp / pp  # bf16, or 1 byte for the FP8 all-gathered weights
        volume = accum * share * (gathers * weights + reduce_bytes * dense)
        efsdp = dp // ep
        if experts and efsdp > 1:
            volume += accum * (efsdp - 1) / efsdp * (gathers * 2 + reduce_bytes) * experts
    elif d.strategy == "ddp":
        volume = 2 * share * REDUCE_BYTES[reduce_payload(plan)] * params  # the gradients' dtype, or precision.grad_reduce
    else:
        z = d.deepspeed.zero_stage
        volume = 2 * share * 2 * params if z < 3 else accum * share * (2 * 2 * params + 2 * params)
    data = volume / link_bytes_per_s(plan, dev, plan.world_size)  # the data-parallel ranks span the job
    exposed = max(0.0, data - compute) + data / max(1, shape.n_layers)
    if tp > 1:  # per block: all-gather + reduce-scatter of the activations in forward and in backward
        act = accum * shape.n_layers * 4 * 2 * (tp - 1) / tp * m * shape.dim * 2 / link_bytes_per_s(plan, dev, tp)
        exposed += act * (0.3 if d.async_tp else 1.0)
    return exposed + accum * all_to_all_s(plan, shape, dev, m)


def device(gpu: str) -> Device:
    """The cost model's view of a `launch.gpu` choice."""
    spec = plan_gpu(gpu)
    name = "h100" if gpu == "auto" else gpu
    return Device(name, _peaks(spec), spec.bandwidth_tbps, spec.sms, spec.link_gbps)


def linear_speedup(gpu: str, m: int, k: int, n: int, backend: str = "torchao", recipe: str = "tensorwise", compiled: bool = True) -> float:
    """One Linear's forward + backward (three GEMMs) in bf16 over the same in FP8 with its casts: what
    torchao's Float8Linear microbenchmarks measure."""
    dev = device(gpu)
    shapes3 = ((m, k, n), (m, n, k), (k, m, n))
    bf16 = sum(gemm_s(dev, *g, "bf16") for g in shapes3)
    seff = cost.scaled_gemm_eff(backend, recipe)
    c = cost.casts(backend, recipe, compiled)
    fp8 = sum(gemm_s(dev, *g, "fp8", seff) if on else gemm_s(dev, *g, "bf16") for g, on in zip(shapes3, cost.fp8_gemms(backend, recipe)))
    fp8 += cast_s(dev, c["input"], m * k) + cast_s(dev, c["weight"], k * n) + cast_s(dev, c["grad_output"], m * n)
    return bf16 / fp8
