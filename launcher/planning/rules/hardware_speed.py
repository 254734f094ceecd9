"""What the GPU can run, hold and gain: FP8 and launch.gpu's compute capability, the memory estimate against
launch.gpu, and the speed prediction (compile, activation checkpointing's recompute, GEMMs too small to gain)."""

from __future__ import annotations

from launcher.planning.backends import BACKENDS, TORCHAO
from launcher.planning.hardware import BLOCK_RECIPES, FP8_MIN_CAPABILITY, capability_text, precision_key, requirement, supports
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8, strategy


def _speed_matters(f: Facts) -> bool:
    """A GPU run: on launch.device = "cpu" FP8 runs torch's reference kernels for numerics and the pipeline, and
    advice about GPU speed is noise (a CPU smoke spec would fail `plan --strict` for nothing)."""
    return f.plan.launch.device != "cpu"


def _ac_slow(f: Facts) -> str | None:
    """Why activation checkpointing costs FP8 its gain here (the prediction with it below 1.0, without it at or above),
    or None: not FSDP2 + compile + checkpointing, no prediction, a CPU run, or FP8 gains (or loses) either way."""
    p = f.plan
    pr = f.prediction
    if not (fp8(f) and strategy(f) == "fsdp2" and p.compile.enabled and p.activation_checkpointing.mode != "none"
            and _speed_matters(f) and pr is not None and pr.fp8_vs_bf16 is not None and pr.fp8_vs_bf16 < 1.0):
        return None
    import dataclasses

    from launcher.planning.predict import predict

    without = predict(dataclasses.replace(p, activation_checkpointing=dataclasses.replace(p.activation_checkpointing, mode="none")),
                      f.spec_folder or p.spec_dir)
    if without.fp8_vs_bf16 is None or without.fp8_vs_bf16 < 1.0:
        return None
    return (f"predicted FP8 tokens/s on {pr.gpus} x {pr.gpu} is {pr.fp8_vs_bf16:.2f}x bf16's with activation_checkpointing.mode = "
            f"\"{p.activation_checkpointing.mode}\" and {without.fp8_vs_bf16:.2f}x without: the recompute of each checkpointed block's "
            "forward, with its casts, costs more than its FP8 GEMMs save.")


def _memory_excess(f: Facts) -> str | None:
    """'the estimate ... exceeds ...' when a GPU plan's estimated peak does not fit launch.gpu, else None."""
    plan = f.plan
    if plan.launch.device == "cpu":
        return None
    from launcher.planning.gpus import plan_gpu
    from launcher.planning.memory import estimate, model_params

    params = model_params(plan.train.model)
    if not params:
        return None
    est = estimate(plan, params)
    gpu = plan_gpu(plan.launch.gpu)
    peak = est.peak_bytes / 2**30
    if peak <= gpu.memory_gib:
        return None
    a = est.activations
    acts = f", activations {a.bytes / 2**30:.1f} GiB" if a else ""
    if a and a.recompute_bytes:
        acts += f", one block recomputed in backward {a.recompute_bytes / 2**30:.1f} GiB"
    return (f"the estimate is {peak:.1f} GiB per GPU (model states {est.total_bytes / 2**30:.1f} GiB{acts}) "
            f"but a {gpu.name} has {gpu.memory_gib:g} GiB.")


def _memory_fix(f: Facts) -> str:
    """MEMORY-EXCEEDS-GPU's fix: only the changes this plan has not made already."""
    p = f.plan
    d, mode = p.distributed, p.activation_checkpointing.mode
    out = []
    if mode == "none":
        out.append('set activation_checkpointing.mode = "full" (or "selective")')
    elif mode == "selective":
        out.append('set activation_checkpointing.mode = "full"')
    out.append("add GPUs (distributed.procs_per_node / distributed.nodes)")
    if d.strategy == "ddp":
        out.append('shard the model states (distributed.strategy = "fsdp2")')
    elif d.strategy == "fsdp2" and not d.fsdp2.cpu_offload:
        out.append("offload (distributed.fsdp2.cpu_offload = true)")
    elif d.strategy == "deepspeed":
        ds = d.deepspeed
        if ds.offload_optimizer == "none":
            out.append('offload the optimizer states (distributed.deepspeed.offload_optimizer = "cpu")')
        if ds.zero_stage == 3 and ds.offload_param == "none":
            out.append('offload the parameters (distributed.deepspeed.offload_param = "cpu")')
        if ds.zero_stage < 3:
            out.append("shard the parameters too (distributed.deepspeed.zero_stage = 3)")
    lower = (["train.micro_batch_size"] if p.train.micro_batch_size > 1 else []) + ["train.seq_len"]
    out.append("lower " + " / ".join(lower))
    return ", ".join(out)


def _host_excess(f: Facts) -> str | None:
    """'... GiB per rank x N ranks ... but this machine has ... available' when a CPU run's ranks, all on this machine, need
    more than its available memory by the plan's own estimate (the larger of its peak and its initialisation peak); else
    None. Builtin models only (the others are sized when built)."""
    if f.host_memory is None or f.plan.launch.device == "cuda":
        return None
    from launcher.planning.memory import estimate, model_params

    plan = f.plan
    params = model_params(plan.train.model)
    if not params:
        return None
    est = estimate(plan, params)
    per_rank = max(est.peak_bytes, est.init_peak.bytes if est.init_peak else 0.0)
    ranks = plan.distributed.procs_per_node
    if ranks * per_rank <= f.host_memory:
        return None
    gib = 2**30
    return (f"{ranks} rank{'s' * (ranks > 1)} x {per_rank / gib:.1f} GiB (the plan's memory estimate per rank: model states, "
            f"activations, initialisation) = {ranks * per_rank / gib:.1f} GiB, but this machine has {f.host_memory / gib:.1f} GiB "
            "available (MemAvailable); the kernel would kill a rank part-way.")


def _host_fix(f: Facts) -> str:
    """MEMORY-EXCEEDS-HOST's fix: the changes this plan has not made already."""
    p = f.plan
    out = ["use fewer ranks (distributed.procs_per_node)"] if p.distributed.procs_per_node > 1 else []
    if p.distributed.strategy == "ddp" and p.distributed.procs_per_node > 1:
        out.append('shard the model states over the ranks (distributed.strategy = "fsdp2")')
    if p.activation_checkpointing.mode != "full":
        out.append('set activation_checkpointing.mode = "full"')
    lower = (["train.micro_batch_size"] if p.train.micro_batch_size > 1 else []) + ["train.seq_len"]
    out += ["lower " + " / ".join(lower), "choose a smaller train.model", "or run on a machine with more memory"]
    return ", ".join(out)


def _gpu_cannot_run(f: Facts) -> str:
    """What an explicitly chosen launch.gpu lacks for the plan's precision ("" when it runs it, or for "auto"/AMD)."""
    from launcher.planning.gpus import PLAN_GPUS

    p, choice = f.plan.precision, f.plan.launch.gpu
    if choice == "auto" or f.plan.launch.device == "cpu" or PLAN_GPUS[choice].capability is None:
        return ""
    mode, backend, recipe = precision_key(p)
    cc = PLAN_GPUS[choice].capability
    if supports(cc, mode, backend, recipe):
        return ""
    what = f"{mode} {backend} {recipe}" if recipe else f"{mode} {backend}" if backend else mode
    return f"{what} needs {requirement(mode, backend, recipe)}; the {PLAN_GPUS[choice].name} has {capability_text(cc)}"


def _no_gain(f: Facts) -> bool:
    pr = f.prediction
    return (fp8(f) and _speed_matters(f) and pr is not None and pr.fp8_vs_bf16 is not None and pr.fp8_vs_bf16 < 1.0
            and pr.n_fp8 > 0  # no FP8 layer at all: FP8-NONE-SELECTED says so
            and _ac_slow(f) is None)  # the recompute is what loses: FP8-AC-COMPILE-SLOW says so


PART_WORDS = {"fp8_casts": "the float8 casts", "recompute": "activation checkpointing's recompute", "optimizer": "the optimizer step "
              "(precompute_scale)", "exposed_comm": "exposed communication", "linear_gemms": "the Linear GEMMs"}


def _no_gain_detail(f: Facts) -> str:
    pr = f.prediction
    head = f"predicted FP8 tokens/s on {pr.gpus} x {pr.gpu} is {pr.fp8_vs_bf16:.2f}x bf16's: "
    if pr.n_losing:
        worst = min((r for r in pr.layers if r.speedup is not None), key=lambda r: r.speedup, default=None)
        example = f"; e.g. {worst.layer}: M, K, N = {worst.m}, {worst.k}, {worst.n} at {worst.speedup:.2f}x" if worst else ""
        return (head + f"{pr.n_losing} of {pr.n_fp8} FP8 layers are too small to gain (the casts cost more than the FP8 GEMMs save"
                f"{example}); `fp8launch plan --format json` shows every layer.")
    plan, bf16 = pr.breakdown["plan"], pr.breakdown["bf16"]
    part = max(plan, key=lambda k: plan[k] - bf16.get(k, 0.0))
    return (head + f"each of the {pr.n_fp8} FP8 layers gains on its own, but {PART_WORDS.get(part, part)} adds "
            f"{(plan[part] - bf16.get(part, 0.0)) * 1e3:.2f} ms a step, more than they save; `fp8launch plan --format json` shows the "
            "breakdown.")


def _no_gain_fix(f: Facts) -> str:
    """Only the changes that would change something for this plan."""
    p, pr = f.plan.precision, f.prediction
    fixes = []
    if pr.n_losing:
        b = BACKENDS[p.backend]
        skip = b.shape_rules and not b.setting(p, "skip_small") and b.recipe(p) not in BLOCK_RECIPES
        skip_small = ", or precision.torchao.skip_small = true" if skip else ""
        fixes.append(f"keep the small Linears in high precision (precision.keep globs{skip_small})")
    if not f.plan.compile.enabled:
        fixes.append("set compile.enabled = true")
    if f.plan.activation_checkpointing.mode != "none":
        fixes.append('set activation_checkpointing.mode = "none" where memory allows')
    fixes += ["use a larger train.micro_batch_size or train.seq_len", 'or set precision.mode = "bf16"; `fp8launch tune` measures it']
    return ", ".join(fixes)


RULES: tuple[Rule, ...] = (
    Rule(id="FP8-NO-COMPILE", severity="warning", stage="plan",
         when='fp8 + torchao without compile (on a GPU: not for launch.device = "cpu")',
         why="without torch.compile, float8 casts are not fused: usually slower and more memory than bf16 (Axolotl docs, ao#2262).",
         fix="set compile.enabled = true",
         condition=lambda f: fp8(f, TORCHAO) and not f.plan.compile.enabled and _speed_matters(f)),
    Rule(id="FP8-AC-COMPILE-SLOW", severity="warning", stage="plan",
         when="fp8 + fsdp2 + compile + activation_checkpointing != none, where the prediction says the recompute turns FP8's gain "
              "into a loss (it gains without checkpointing); a GPU run",
         why="FP8 with FSDP2, compile and activation checkpointing tends to be slower than bf16 (Axolotl docs): the recompute "
             "repeats each checkpointed block's forward with its casts. Said where the prediction supports it, not as blanket "
             "advice (torchtitan's and Axolotl's own recommended setups gain).",
         fix='measure with `fp8launch bench --profile`; or set activation_checkpointing.mode = "selective" (or "none" where memory allows)',
         condition=lambda f: _ac_slow(f) is not None, detail=lambda f: _ac_slow(f)),
    Rule(id="FP8-HARDWARE", severity="error", stage="run",
         when="fp8 on a CUDA GPU below compute capability 8.9",
         why="FP8 GEMMs need Ada, Hopper or Blackwell (sm89+); fp8launch never falls back silently to bf16/fp16 (Accelerate does).",
         fix='set precision.mode = "bf16", or run on an sm89+ GPU (L4, L40, H100, H200, B200)',
         condition=lambda f: fp8(f) and f.device == "cuda" and f.capability is not None and f.capability < FP8_MIN_CAPABILITY,
         detail=lambda f: f"FP8 needs {requirement('fp8')}; this GPU has {capability_text(f.capability)}."),
    Rule(id="MEMORY-EXCEEDS-GPU", severity="warning", stage="plan",
         when="the memory estimate (model states + activations) of a GPU plan exceeds the memory of launch.gpu",
         why="the run would stop with CUDA out-of-memory at the first step; the estimate leaves out temporary buffers and fragmentation, "
             "so it is a lower bound.",
         fix='set activation_checkpointing.mode = "full" (or "selective"), add GPUs (distributed.procs_per_node / distributed.nodes), '
             "offload (distributed.fsdp2.cpu_offload = true, or distributed.deepspeed.offload_optimizer), or lower "
             "train.micro_batch_size / train.seq_len",
         condition=lambda f: _memory_excess(f) is not None,
         detail=lambda f: _memory_excess(f), fix_for=_memory_fix),
    Rule(id="MEMORY-EXCEEDS-HOST", severity="error", stage="run",
         when='a CPU run (launch.device = "cpu", or "auto" on a machine without a GPU) whose ranks all run on this machine, '
              "where distributed.procs_per_node x the plan's memory estimate per rank exceeds the memory it has available",
         why="the kernel's out-of-memory killer would stop a rank with SIGKILL part-way through, or the machine would swap to a "
             "crawl. The estimate leaves out torch itself (~0.2 GiB a process), temporary buffers and the allocator: it was "
             "0.18-0.74x of the peak resident memory of real CPU runs (benchmarks/results/cpu_memory_estimate.json), so a run "
             "it refuses could not fit.",
         fix="use fewer ranks (distributed.procs_per_node), shard the model states (distributed.strategy = \"fsdp2\"), set "
             "activation_checkpointing.mode = \"full\", lower train.micro_batch_size / train.seq_len, a smaller train.model, "
             "or a machine with more memory",
         condition=lambda f: _host_excess(f) is not None, detail=lambda f: _host_excess(f), fix_for=_host_fix),
    Rule(id="FP8-NO-GAIN", severity="warning", stage="plan",
         when='the predicted fp8_vs_bf16 for this model, batch and launch.gpu is below 1.0 (a GPU run: not for launch.device = "cpu")',
         why="small GEMMs lose to the cast overhead (torchao microbenchmarks: 1024^3 at 0.42-0.8x of bf16); "
             "say so before a user pays for it (docs/prediction.md).",
         fix='keep the small Linears in high precision (precision.keep globs; torchao: precision.torchao.skip_small = true), '
             'compile.enabled = true, a larger train.micro_batch_size or train.seq_len, or precision.mode = "bf16"; `fp8launch tune` '
             'measures it',
         condition=_no_gain, detail=_no_gain_detail, fix_for=_no_gain_fix),
    Rule(id="LAUNCH-GPU-PRECISION", severity="error", stage="plan",
         when="launch.gpu names a GPU whose compute capability cannot run the spec's precision (e.g. h100 with mxfp8)",
         why="the plan (memory, prediction) would be for a machine the run is refused on (FP8-HARDWARE, TE-RECIPE-HARDWARE, "
             "TORCHAO-BLOCK-HARDWARE); \"auto\" picks an h100, or a b200 for a precision that needs Blackwell.",
         fix='set launch.gpu to a GPU that runs it (b200 for mxfp8 / nvfp4), "auto", or another precision.torchao.recipe / '
             'precision.te.recipe',
         condition=lambda f: bool(_gpu_cannot_run(f)),
         detail=lambda f: f"launch.gpu = {f.plan.launch.gpu!r} cannot run this spec's precision: {_gpu_cannot_run(f)}."),
)
