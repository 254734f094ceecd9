"""Bytes per GPU for a plan: the model states (parameters, gradients, master weights, optimizer
states) for its precision and sharding, the activations autograd saves for backward (builtin
models: `activations`), and the peak of initialisation. Torch-free: `fp8launch plan` prints it.

Activations are counted tensor by tensor from the builtin Llama's code (launcher/train/models/llama.py)
as autograd saves them for one micro-batch: per block the two norms' fp32 inputs, normalised
outputs and rstd, the Linear inputs (one cast per Linear when the residual stream is fp32 and
autocast casts it; shared when it is already in the compute dtype; one byte per element where
Transformer Engine saves FP8), q/k/v/output and the log-sum-exp of attention, the SwiGLU
intermediates; outside the blocks the token ids, the final norm, the head's input and what the loss
keeps (the fp32 log-softmax; with compile the compute-dtype logits); under DDP autocast also the
compute-dtype copy of each high-precision Linear weight. Activation checkpointing keeps only each
checkpointed block's input. Tensor parallelism with sequence parallelism divides all of it by
`distributed.tensor_parallel`. The CPU check (tests/test_activation_memory.py) holds it within 15%
of the bytes autograd really saves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher.planning.backends import BACKENDS, backend_of
from launcher.planning.levels import MOMENTS, STATE_BYTES
from launcher.planning.models import builtin_config
from launcher.planning.plan import Plan, block_ranges, stage_blocks

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
STATES_PER_PARAM = MOMENTS  # exp_avg + exp_avg_sq; plain SGD (no momentum) keeps none


@dataclass(frozen=True, slots=True)
class MemoryRow:
    name: str
    dtype: str
    bytes_per_param: float
    """Bytes per model parameter before sharding."""
    shards: int
    """How many ranks split it (1 = replicated)."""
    offloaded: bool = False
    layout: str = ""
    """How the shards are laid out, for the text (e.g. "dp 4 x tp 2"); empty for a 1D split."""

    def bytes_per_gpu(self, params: int) -> float:
        return 0.0 if self.offloaded else params * self.bytes_per_param / self.shards


NOT_COUNTED = "not counted: temporary buffers (all-gathered blocks, FP8 casts, gradient buckets), allocator fragmentation, the CUDA context"


@dataclass(frozen=True, slots=True)
class ActivationRow:
    """Bytes autograd saves for backward in one micro-batch, per GPU (the `activations` row)."""

    bytes: float
    dtype: str
    """What is saved, in words (compute dtype, fp8 where the backend saves FP8)."""
    how: str
    """micro-batch, seq_len, checkpointing, TP split."""
    recompute_bytes: float = 0.0
    """One block's activations, alive while backward recomputes it (checkpointing only)."""
    name: str = "activations"


@dataclass(frozen=True, slots=True)
class InitPeak:
    """The most one rank holds while the model is built and initialised."""

    bytes: float
    where: str
    how: str


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    params: int
    rows: tuple[MemoryRow, ...]
    """The model states."""
    activations: ActivationRow | None = None
    """None where the model's shapes are unknown to planning (hf:, py:)."""
    init_peak: InitPeak | None = None
    stage: str = ""
    """Under pipeline parallelism: the stage this estimate is of (the one with the most bytes), in words; `params` are
    its parameters."""

    @property
    def total_bytes(self) -> float:
        """Model states per GPU."""
        return sum(r.bytes_per_gpu(self.params) for r in self.rows)

    @property
    def peak_bytes(self) -> float:
        """Model states + activations (+ one recomputed block): what must fit in the GPU's memory."""
        a = self.activations
        return self.total_bytes + (a.bytes + a.recompute_bytes if a else 0.0)

    def lines(self) -> list[str]:
        gib = 1024**3
        a = self.activations
        head = "model states and activations" if a else "model states (activations not included: the model is sized when built)"
        where = f" on its fullest pipeline stage ({self.stage})" if self.stage else ""
        out = [f"memory per GPU{where} for {self.params / 1e9:.3g}B parameters, {head}:"]
        for r in self.rows:
            where = "offloaded to CPU" if r.offloaded else (
                f"/ {r.shards} ranks{f' = {r.layout}' if r.layout else ''}" if r.shards > 1 else r.layout or "replicated")
            out.append(f"    {r.name:<17} {r.dtype:<8} {r.bytes_per_gpu(self.params) / gib:8.2f} GiB  "
                       f"({r.bytes_per_param:g} B/param, {where})")
        out.append(f"    {'model states':<17} {'':<8} {self.total_bytes / gib:8.2f} GiB")
        if a:
            out.append(f"    {a.name:<17} {a.dtype:<8} {a.bytes / gib:8.2f} GiB  ({a.how})")
            if a.recompute_bytes:
                out.append(f"    {'recompute':<17} {'':<8} {a.recompute_bytes / gib:8.2f} GiB  "
                           "(one block's activations while backward recomputes it)")
            out.append(f"    {'total':<17} {'':<8} {self.peak_bytes / gib:8.2f} GiB")
        if self.init_peak:
            i = self.init_peak
            out.append(f"  initialisation peak per rank: {i.bytes / gib:.2f} GiB {i.where} ({i.how})")
        out.append(f"  {NOT_COUNTED}")
        return out


def estimate(plan: Plan, params: int, spec_folder: str | None = None) -> MemoryEstimate:
    """Bytes per GPU for `params` parameters trained as `plan` says: the model states, and for a builtin model (or,
    with `spec_folder`, an hf: model whose config.json is read there) the activations; the initialisation peak."""
    cfg = model_config(plan.train.model, spec_folder)
    d = plan.distributed
    if d.pipeline_parallel > 1 and cfg is not None and len(d.stage_split(cfg.n_layers)) == d.pipeline_stages:  # else PP-LAYERS
        return max((stage_estimate(plan, cfg, r) for r in range(d.pipeline_parallel)), key=lambda e: e.peak_bytes)
    rows = model_states(plan, params, spec_folder)
    return MemoryEstimate(params, rows, activations(plan, cfg) if cfg else None, init_peak(plan, params, cfg))


def in_flight(plan: Plan, rank: int) -> int:
    """Forward activations pipeline rank `rank` holds at once at its schedule's peak, each one micro-batch through one of
    its stages (torch.distributed.pipelining's order of actions, counted there as forwards less the backwards that free
    them: tests/test_pipeline_plan.py counts them in torch's own schedules): GPipe every micro-batch; 1F1B's warm-up puts
    pp - rank forwards ahead of the first backward; Interleaved1F1B's puts (stages a rank - 1) x micro-batches a round +
    2 x (pp - 1 - rank) (schedules.py _get_warmup_ops), one more in its steady state. ZBVZeroBubble's order holds at most
    2 x pp, and micro-batches + 1 + rank where there are fewer (`schedule_in_flight`); torch 2.13 holds more: each
    micro-batch's graph, retained by its input-gradient pass for the weight pass, keeps part of what it saved until the
    step ends (measured on pp 2 and 4, bf16: up to micro-batches + 2 micro-batch-stages, 0-12% above that;
    tests/test_activation_memory.py), so the estimate takes the larger."""
    held = schedule_in_flight(plan, rank)
    return max(held, plan.pipeline_microbatches + 2) if plan.distributed.pipeline.schedule == "ZBVZeroBubble" else held


def schedule_in_flight(plan: Plan, rank: int) -> int:
    """`in_flight` as the schedule's order of actions has it (forwards less the backwards that free them), before what
    torch's ZBVZeroBubble keeps beyond it."""
    d = plan.distributed
    n, pp, schedule = plan.pipeline_microbatches, d.pipeline_parallel, d.pipeline.schedule
    if schedule == "GPipe":
        return n
    if schedule == "ZBVZeroBubble":
        return min(2 * pp, n + 1 + rank)
    if schedule == "Interleaved1F1B":
        v = d.pipeline.local_stages
        per_round = n // max(1, n // pp)
        return min((v - 1) * per_round + 2 * (pp - 1 - rank) + 1, n * v)
    return min(n, pp - rank)


def stage_estimate(plan: Plan, cfg, rank: int) -> MemoryEstimate:
    """The estimate for pipeline rank `rank` of the builtin dense decoder: the parameters of its stages (their blocks; the
    embedding with the first stage, the final norm and the output layer with the last) sharded over its world_size / pp
    ranks, and the activations of its stages' blocks for the micro-batches it holds at once, the head's for the last
    stage's (one: its backward follows each forward, but under GPipe) (launcher/train/parallel/pipeline.py)."""
    from launcher.planning.models import linear_params_per_layer

    d, t = plan.distributed, plan.train
    split, stages = d.stage_split(cfg.n_layers), d.layout().rank_stages(rank)
    blocks, first, last = sum(split[s] for s in stages), 0 in stages, len(split) - 1 in stages
    params = blocks * (linear_params_per_layer(cfg) + 2 * cfg.dim) + first * cfg.vocab_size * cfg.dim
    params += last * (cfg.dim + cfg.dim * cfg.vocab_size)
    tp = f" x tp {d.tensor_parallel}" if d.tensor_parallel > 1 else ""
    held_stages = f"stages {', '.join(map(str, stages))} of {len(split)}" if len(stages) > 1 else f"one of {len(split)} stages"
    layout = f"dp {d.data_parallel}{tp}, {held_stages}"
    rows = tuple(dataclasses.replace(r, layout=layout) for r in model_states(plan, params))
    n = plan.pipeline_microbatches
    tokens, held = t.micro_batch_size * t.grad_accum_steps * t.seq_len // n, in_flight(plan, rank)
    act = activations(plan, cfg, layers=max(split[s] for s in stages), tokens=tokens * held, outside=False)
    if last:  # the head's activations: the last stage's micro-batches in flight
        whole = d.pipeline.schedule in ("GPipe", "ZBVZeroBubble")  # every micro-batch's, to the step's end (see in_flight)
        head = activations(plan, cfg, layers=0, tokens=tokens * (n if whole else 1), outside=True)
        act = dataclasses.replace(act, bytes=act.bytes + head.bytes)
    # torch 2.13's PipelineStage runs the first micro-batch once more at step 1 to infer shapes and keeps part of that
    # forward through the step on every stage but the last (tests/test_activation_memory.py measures 0.46-0.73 of one)
    first_step = ("" if last and len(stages) == 1 else
                  "; at step 1 up to one more (torch infers the stages' shapes with a forward of its own)")
    units = f"{held} micro-batch{'es' * (held != 1)}" + (" x stage" if len(stages) > 1 else "")
    act = dataclasses.replace(act, how=f"{units} of {tokens // t.seq_len} x seq {t.seq_len} in flight "
                                       f"({d.pipeline.schedule}), checkpointing {plan.activation_checkpointing.mode}{first_step}")
    held_blocks = [b for s in stages for b in stage_blocks(split, s)]
    parts = [f"blocks {block_ranges(held_blocks)}"] + ["the embedding"] * first + ["the output layer"] * last
    largest = 4.0 * max(cfg.vocab_size * cfg.dim if first or last else 0, cfg.dim * cfg.ffn_dim)
    peak = InitPeak(4.0 * params / rows[0].shards + largest, "host" if d.fsdp2.cpu_offload else "on the GPU",
                    "its stage's fp32 shard; plus one module's full tensors at a time in host memory while initialising")
    where = f"stage {stages[0]} of {len(split)}" if len(stages) == 1 else f"pipeline rank {rank}, {held_stages}"
    return MemoryEstimate(params, rows, act, peak, stage=f"{where}: {', '.join(parts)}")


def model_config(model: str, spec_dir: str | None = None):
    """The shape the estimate reads: a builtin model's config; with `spec_dir`, an hf: model's shapes from its
    config.json (launcher/planning/predict/shapes.py, as the prediction reads them); None otherwise."""
    cfg = builtin_config(model)
    if cfg is not None or spec_dir is None or not model.startswith("hf:"):
        return cfg
    from launcher.planning.predict.shapes import model_shape

    return model_shape(model, spec_dir)[0]


def fp8_weight_share(plan: Plan, spec_dir: str | None = None) -> float:
    """The share of the model's parameters that precision.te.fp8_params stores as FP8 weights: the Linears the run
    converts (launcher/planning/predict's layer selection) over every parameter; 1.0 where planning does not know the
    model's shapes (py:, an hf: model without `spec_dir`)."""
    from launcher.planning.predict import fp8_weight_params
    from launcher.planning.predict.shapes import model_shape

    shape = model_shape(plan.train.model, spec_dir or ".")[0] if plan.train.model.startswith(("builtin:", "hf:")) else None
    return fp8_weight_params(plan, shape) / shape.params if shape is not None and shape.params else 1.0


def model_states(plan: Plan, params: int, spec_dir: str | None = None) -> tuple[MemoryRow, ...]:
    """Model-state bytes per GPU for `params` parameters trained as `plan` says (`spec_dir`: where an hf: model's
    config.json is read, for the share of FP8 weights under precision.te.fp8_params)."""
    p, d = plan.precision, plan.distributed
    n = plan.world_size
    states = STATES_PER_PARAM[plan.train.optimizer]
    hp = p.compute_dtype
    rows: list[MemoryRow]
    # precision.optimizer_states: the moments' bytes (codes + block scales for fp8 / int8; torchao keeps tensors under
    # 4096 values in full precision, a rounding error for a real model); precision.master_weights = "bf16": the
    # parameters and their gradients are bf16 and there is no fp32 copy (launcher/planning/levels.py)
    state_dtype, state_bytes = p.optimizer_states, states * STATE_BYTES[p.optimizer_states]
    weight_dtype = "bf16" if p.master_weights == "bf16" else "fp32"

    b = backend_of(p)
    if b is not None and b.scaling_tensors:
        # MS-AMP keeps FP8 weights and gradients (ScalingTensor); O2+ also FP16 master weights and
        # FP8 first / FP16 second moments. Under ZeRO (O3 via DeepSpeed) optimizer-side states are sharded.
        opt_shards = n if d.strategy == "deepspeed" and d.deepspeed.zero_stage >= 1 else 1
        if p.msamp.opt_level == "O1":
            master, opt = MemoryRow("master_weights", "fp32", 4, opt_shards), MemoryRow("optimizer_states", "fp32", 4 * states, opt_shards)
        else:
            master, opt = MemoryRow("master_weights", "fp16", 2, opt_shards), MemoryRow("optimizer_states", "fp8+fp16", 3, opt_shards)
        rows = [MemoryRow("params", "fp8", 1, 1), MemoryRow("grads", "fp8", 1, 1), master, opt]
    elif d.strategy == "fsdp2":
        # FSDP2 shards the fp32 parameters, their gradients and the optimizer states; the compute-dtype
        # copy exists only for the blocks being all-gathered.
        # With tensor parallelism (2D mesh) TP splits each Linear weight over tp ranks and FSDP2 shards
        # those pieces over dp ranks: dp x tp = world size pieces (the norm weights, replicated over
        # tp, are a negligible exception).
        off = d.fsdp2.cpu_offload
        # With context parallelism FSDP2 shards over dp_shard x cp (a CP group's ranks hold the same parameters).
        ranks = d.layout()
        tp, cp, n = ranks.tp, ranks.cp, ranks.fsdp_ranks
        layout = " x ".join(f"{k} {v}" for k, v in (("dp", ranks.dp), ("cp", cp), ("tp", tp)) if k == "dp" or v > 1)
        layout = layout if tp > 1 or cp > 1 else ""
        rows = [MemoryRow("params", weight_dtype, BYTES[weight_dtype], n, off, layout),
                MemoryRow("grads", weight_dtype, BYTES[weight_dtype], n, off, layout),
                MemoryRow("optimizer_states", state_dtype, state_bytes, n, off, layout)]
    elif d.strategy == "deepspeed":
        z, ds = d.deepspeed.zero_stage, d.deepspeed
        low = hp in ("bf16", "fp16")
        param_dtype = hp if low else "fp32"
        rows = [MemoryRow("params", param_dtype, BYTES[param_dtype], n if z >= 3 else 1, ds.offload_param != "none"),
                MemoryRow("grads", param_dtype, BYTES[param_dtype], n if z >= 2 else 1)]
        if low:
            rows.append(MemoryRow("master_weights", "fp32", 4, n if z >= 1 else 1, ds.offload_optimizer != "none"))
        rows.append(MemoryRow("optimizer_states", "fp32", 4 * states, n if z >= 1 else 1, ds.offload_optimizer != "none"))
    else:  # DDP: everything replicated; autocast computes in the low dtype from fp32 weights (or bf16 master weights)
        rows = [MemoryRow("params", weight_dtype, BYTES[weight_dtype], 1), MemoryRow("grads", weight_dtype, BYTES[weight_dtype], 1),
                MemoryRow("optimizer_states", state_dtype, state_bytes, 1)]

    if b is not None and b.setting(p, "fp8_params"):
        # quantized_model_init stores the converted Linears' weights in FP8 (1 byte); the other parameters (embedding, the
        # Linears kept in high precision, norms) stay as they were (`params_kept`). DDP / FSDP2: TE's FusedAdam
        # (master_weights=True) keeps an fp32 master copy of the FP8 weights, laid out as the optimizer states are
        # (FSDP2: sharded). It would give every other fp32 parameter one too, which its step never reads; fp8launch makes
        # their states without it (launcher/train/precision/te.py, wrap_optimizer). DeepSpeed's bf16/fp16 ZeRO optimizer
        # keeps its own master copy of everything (its row stays).
        share = fp8_weight_share(plan, spec_dir)
        first = rows[0]
        kept = [MemoryRow("params_kept", first.dtype, first.bytes_per_param * (1 - share), first.shards, first.offloaded, first.layout)]
        rows = ([MemoryRow("params", "fp8", share, first.shards, first.offloaded, first.layout)] + kept * (share < 1)
                + [r for r in rows if r.name != "params"])
        if not any(r.name == "master_weights" for r in rows):
            opt = next(r for r in rows if r.name == "optimizer_states")
            rows.insert(len(rows) - 1, MemoryRow("master_weights", "fp32", 4 * share, opt.shards, opt.offloaded, opt.layout))
    return tuple(rows)


def model_params(model: str, spec_dir: str | None = None) -> int | None:
    """Parameter count of a builtin model spec (`builtin:NAME[?layers=N]`), or with `spec_dir` of an hf: model whose
    config.json describes a Llama-style decoder (its Linears, embedding and norms; a tied head counted twice); else
    None (use --params)."""
    cfg = builtin_config(model)
    if cfg is None:
        shape = model_config(model, spec_dir)
        return shape.params if shape is not None else None
    from launcher.planning.models import param_count

    return param_count(cfg)


def _compute_bytes(plan: Plan) -> int:
    return BYTES[plan.precision.compute_dtype]


def _residual_bytes(plan: Plan) -> int:
    """The residual stream's dtype: fp32 where the parameters are fp32 (DDP, fp32 runs: the
    embedding's output is fp32), else the compute dtype (FSDP2's param_dtype, DeepSpeed's cast, bf16 master weights)."""
    if plan.precision.compute_dtype == "fp32" or (plan.distributed.strategy == "ddp" and plan.precision.master_weights != "bf16"):
        return 4
    return _compute_bytes(plan)


def block_activation_bytes_per_token(plan: Plan, cfg) -> float:
    """Bytes one transformer block saves for backward per token, without checkpointing."""
    c, r = _compute_bytes(plan), _residual_bytes(plan)
    p = plan.precision
    d, q, f, h = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.ffn_dim, cfg.n_heads
    moe = 0
    if getattr(cfg, "moe_ffn_dim", 0):  # an MoE block (MoEConfig): the SwiGLU width a token meets (top-k routed +
        f = cfg.moe_ffn_dim * (cfg.top_k + cfg.n_shared_experts)  # shared; the dense first blocks are counted alike)
        # + router fp32 logits and scores (E each), top-k ids and scores, the routed copy of the input and the
        # routed output (top_k rows of dim each); padding groups to 32 rows adds at most E * 31 rows per
        # micro-batch (under a percent at any real batch) and is left out
        moe = 8 * cfg.num_experts + 12 * cfg.top_k + 2 * _compute_bytes(plan) * cfg.top_k * d
    fp8_saved = p.fp8 and BACKENDS[p.backend].saves_fp8_inputs  # TE and MS-AMP; torchao saves the high-precision input
    lin = 1 if fp8_saved else c
    separate = r != c or fp8_saved  # each Linear casts (or quantizes) its own copy of a shared input
    norms = 2 * (4 * d + r * d + 4)  # fp32 input of rms_norm, normalised output in the residual dtype, rstd
    linear_inputs = lin * ((3 if separate else 1) * d + (2 if separate else 1) * d + f) + (q if fp8_saved else 0)
    attention = 4 * c * q + 4 * h  # q, k, v (repeated to n_heads), output; fp32 log-sum-exp per head
    swiglu = 3 * c * f  # w1 x, silu(w1 x), w3 x
    return float(norms + linear_inputs + attention + swiglu + moe)


def loss_bytes_per_token(plan: Plan, cfg) -> float:
    """What the loss keeps for backward per token: eager, the fp32 log-softmax over the vocabulary; compiled
    (launcher/train/loop.py `loss_function`), the logits in the compute dtype and two fp32 statistics (Inductor
    recomputes the softmax)."""
    return float((_compute_bytes(plan) * cfg.vocab_size + 8) if plan.compile.enabled else 4 * cfg.vocab_size)


def outside_activation_bytes_per_token(plan: Plan, cfg) -> float:
    """Bytes saved outside the blocks per token: token ids and targets, final norm, head input, and what the loss
    keeps (loss_bytes_per_token)."""
    c, r = _compute_bytes(plan), _residual_bytes(plan)
    d = cfg.dim
    return float(16 + (4 * d + r * d + 4) + c * d) + loss_bytes_per_token(plan, cfg)


def weight_copy_bytes(plan: Plan, cfg, checkpointed: int = 0) -> float:
    """DDP autocast keeps a compute-dtype copy of every fp32 Linear weight it casts until backward,
    except inside checkpointed blocks (recomputed). FP8 layers save their fp32 weight itself: only
    the head, kept in high precision, is copied then."""
    from launcher.planning.models import linear_params_per_layer

    if plan.distributed.strategy != "ddp" or plan.precision.compute_dtype == "fp32" or plan.precision.master_weights == "bf16":
        return 0.0  # (bf16 master weights are bf16 already: autocast has nothing to copy)
    n = cfg.dim * cfg.vocab_size
    if not plan.precision.fp8:
        n += (cfg.n_layers - checkpointed) * linear_params_per_layer(cfg)
    return float(_compute_bytes(plan) * n)


def activations(plan: Plan, cfg, *, layers: int | None = None, tokens: int | None = None, outside: bool = True) -> ActivationRow:
    """The `activations` row: what autograd saves in one micro-batch of the builtin model `cfg` (a pipeline stage:
    its `layers` blocks for `tokens` tokens, and what is saved outside the blocks only on the `outside` stage)."""
    t = plan.train
    tokens = t.micro_batch_size * t.seq_len if tokens is None else tokens
    mode = plan.activation_checkpointing.mode
    n = cfg.n_layers if layers is None else layers
    checkpointed = n if mode == "full" else (n + 1) // 2 if mode == "selective" else 0
    block = block_activation_bytes_per_token(plan, cfg) * tokens
    kept_input = _residual_bytes(plan) * cfg.dim * tokens
    total = (n - checkpointed) * block + checkpointed * kept_input
    total += (outside_activation_bytes_per_token(plan, cfg) * tokens + weight_copy_bytes(plan, cfg, checkpointed)) * outside
    tp = max(1, int(getattr(plan.distributed, "tensor_parallel", 1) or 1))
    cp = max(1, int(getattr(plan.distributed, "context_parallel", 1) or 1))  # each rank holds seq_len / cp of every sequence
    p = plan.precision
    dtype = p.compute_dtype + ("+fp8" if p.fp8 and BACKENDS[p.backend].saves_fp8_inputs else "")
    how = (f"micro-batch {t.micro_batch_size} x seq {t.seq_len}, checkpointing {mode}"
           + (f", / {tp} tensor-parallel ranks" if tp > 1 else "") + (f", / {cp} context-parallel ranks" if cp > 1 else ""))
    return ActivationRow(total / (tp * cp), dtype, how, recompute_bytes=(block / (tp * cp) if checkpointed else 0.0))


def init_peak(plan: Plan, params: int, cfg=None) -> InitPeak:
    """The most one rank holds while building and initialising: launcher/train/materialize.py
    builds on the meta device; FSDP2 ranks allocate their fp32 shard and initialise one module's
    full tensors at a time (drawn on the GPU; a CPU run: in host memory; with FSDP2's CPU offload
    the shard is on the host and the module's copy on the GPU); DeepSpeed ZeRO-3 gives one module
    at a time its full fp32 tensors, draws into them and partitions it at once (its parameters in
    DeepSpeed's dtype); DDP and DeepSpeed ZeRO-0/1/2 hold the whole fp32 model on the device, drawn
    in place; Transformer Engine and MS-AMP need it whole before they convert it."""
    d, p = plan.distributed, plan.precision
    n = plan.world_size
    full = 4.0 * params
    largest = 4.0 * max(cfg.vocab_size * cfg.dim, cfg.dim * cfg.ffn_dim,
                        3 * cfg.dim * getattr(cfg, "moe_ffn_dim", 0) * getattr(cfg, "num_experts", 0)) if cfg else 0.0
    on_gpu = plan.launch.device != "cpu"
    module_where = "on the GPU" if on_gpu else "in host memory"
    if p.fp8 and BACKENDS[p.backend].replaces_modules:
        return InitPeak(full, "on the GPU", f"whole fp32 model before {p.backend} converts it")
    if d.strategy == "fsdp2":
        if d.fsdp2.cpu_offload and plan.launch.device == "cuda":  # "auto" may run on a CPU machine: counted as one
            return InitPeak(full / n, "host", "its fp32 shard; one module's full tensors at a time are drawn on the GPU")
        where = "host" if d.fsdp2.cpu_offload else "on the GPU"
        how = f"its fp32 shard; plus one module's full tensors at a time {module_where} while initialising"
        return InitPeak(full / n + largest, where, how)
    if d.strategy == "deepspeed" and d.deepspeed.zero_stage == 3:
        dtype = p.compute_dtype if p.compute_dtype in ("bf16", "fp16") else "fp32"
        where = "host" if d.deepspeed.offload_param != "none" else "on the GPU"
        how = f"its {dtype} partition; plus one module's full fp32 tensors at a time while initialising"
        return InitPeak(BYTES[dtype] * params / n + largest, where, how)
    return InitPeak(full, "on the GPU", f"whole fp32 model on every rank ({d.strategy})")
