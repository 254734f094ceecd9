"""`fp8launch init`: a starter spec for the machine it runs on.

    decision = decide(machine, Choices(backend="te"))   # what to write, and why (pure)
    text = render_spec(decision)                         # the TOML, with short comments (pure)
    planned = write_spec(text, "my-run.toml")            # planned like `fp8launch plan`, then written

`starter_spec(machine, choices)` is the first two steps. Detection: GPUs -> one process per GPU,
FP8 where the GPU has compute capability >= 8.9 and an FP8 backend is installed (torchao first),
else bf16 (fp16 below Ampere); no GPU -> a CPU smoke spec like specs/cpu-smoke.toml. What the
user asks for (flags, prompts) wins over detection, even where this machine cannot run it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Callable

from launcher.commands.doctor import DEFAULT_RECIPE, Machine, assess
from launcher.planning.backends import named
from launcher.planning.hardware import capability_text, requirement, supports
from launcher.planning.install import INSTALL
from launcher.planning.memory import model_params
from launcher.planning.read import settings
from launcher.targets.toml_text import toml_value

frozen = dataclass(frozen=True, kw_only=True, slots=True)

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

GPU_MODELS = ("builtin:llama3-8b", "builtin:llama3-1b", "builtin:llama-small")
"""Builtin models init may pick for GPUs, largest first (their parameter counts come from the size table)."""


@frozen
class Choices:
    """What the user asked for, by flag or prompt; None: detect it."""

    name: str | None = None
    backend: str | None = None
    """torchao | te | msamp (asking for one means fp8)."""
    strategy: str | None = None
    model: str | None = None
    nodes: int | None = None
    procs_per_node: int | None = None
    out: str | None = None
    """The file to write; its name, when a valid spec name, is the default name."""
    preset: str | None = None
    """msamp-o1 | msamp-o2 | msamp-o3: MS-AMP's opt level with torchao and the level keys (launcher/planning/levels.py)."""


@frozen
class Decision:
    """Every value the starter spec writes, resolved from the machine and the choices."""

    name: str
    mode: str
    backend: str | None
    recipe: str | None
    strategy: str
    device: str
    """auto (a GPU spec) | cpu (a smoke spec)."""
    model: str
    nodes: int
    procs_per_node: int
    compile: bool
    float8_all_gather: bool
    hardware: str
    """The detected hardware, for the header comment."""
    why: str
    """Why this precision, for the header comment and the command's output."""
    preset: str | None = None
    """The MS-AMP level written natively (msamp-o1 / o2 / o3), or None."""
    optimizer_states: str = "fp32"
    grad_reduce: str = "auto"
    master_weights: str = "fp32"

    @property
    def smoke(self) -> bool:
        return self.device == "cpu"

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def summary(self) -> str:
        precision = " ".join(x for x in (self.mode, self.backend, self.recipe) if x)
        if self.preset:
            precision += (f" ({self.preset}: {self.optimizer_states} moments, gradients reduced in {self.grad_reduce}, "
                          f"{self.master_weights} master weights)")
        engine = self.strategy + (" + compile" if self.compile else "") + (" + float8 all-gather" if self.float8_all_gather else "")
        return (f"{precision}, {engine}, {self.nodes} node{'s' * (self.nodes != 1)} x {self.procs_per_node} "
                f"proc{'s' * (self.procs_per_node != 1)} on {'CPU' if self.smoke else 'GPU'}, {self.model}")


def preset_keys(preset: str | None) -> dict:
    """The spec keys of `--preset` (launcher/planning/levels.py), checked against nothing else yet."""
    from launcher.planning.msamp_levels import MSAMP_LEVELS, PRESETS

    return dict(MSAMP_LEVELS[PRESETS[preset]]) if preset else {}


def check_preset(choices: Choices) -> None:
    """A preset is MS-AMP's level with torchao: refuse the flags that contradict it (UsageError)."""
    from launcher.errors import UsageError
    from launcher.planning.msamp_levels import PRESETS

    if choices.preset is None:
        return
    keys = preset_keys(choices.preset)
    if choices.backend not in (None, "torchao"):
        raise UsageError(f"--preset {choices.preset} is MS-AMP's {PRESETS[choices.preset]} level natively, with torchao's FP8; "
                         f"--backend {choices.backend} contradicts it: drop --backend (or --preset)")
    wanted = keys.get("distributed.strategy")
    if wanted and choices.strategy not in (None, wanted):
        raise UsageError(f"--preset {choices.preset} is MS-AMP's {PRESETS[choices.preset]} level: ZeRO-style sharding, natively "
                         f"FSDP2; --strategy {choices.strategy} contradicts it: drop --strategy, or use --preset msamp-o2")
    if choices.strategy == "deepspeed":
        raise UsageError(f"--preset {choices.preset} sets precision.optimizer_states / grad_reduce / master_weights, which DeepSpeed "
                         "does not take (rules LEVELS-DEEPSPEED, GRAD-REDUCE-DEEPSPEED): use --strategy fsdp2 or ddp")


def decide(machine: Machine, choices: Choices = Choices()) -> Decision:
    """Resolve every value of the starter spec: the choices first, detection for the rest."""
    check_preset(choices)
    if choices.preset:
        keys = preset_keys(choices.preset)
        # O1 / O2: MS-AMP enters them through msamp.initialize under DDP, so DDP is their default; O3 is FSDP2
        choices = dataclasses.replace(choices, backend="torchao", strategy=choices.strategy or keys.get("distributed.strategy", "ddp"))
    rows = {(s.backend, s.recipe): s for s in assess(machine) if s.fp8}
    backend = choices.backend
    if backend is None:
        backend = next((b for b, r in DEFAULT_RECIPE.items() if rows[b, r].supported), None)
    b = named(backend)
    gpu_target = bool(machine.gpus) or (b is not None and b.cuda_only)  # TE and MS-AMP only run on CUDA
    mode = "fp8" if backend else _high_precision(machine)
    strategy = choices.strategy or ("ddp" if b is not None and b.scaling_tensors else "fsdp2")  # MS-AMP: no FSDP2
    recipe = None if b is None else b.starter_recipe(strategy)
    nodes = choices.nodes or 1
    procs = choices.procs_per_node or (len(machine.gpus) or 8 if gpu_target else 2)  # a GPU node without GPUs here: 8
    model = choices.model or (_fit_model(machine, strategy, nodes * procs) if gpu_target else "builtin:llama-debug")
    compile_ = gpu_target and strategy == "fsdp2"  # compile costs ~20 s of warm-up on CPU
    all_gather = b is not None and "fsdp_float8_all_gather" in settings(b.name) and strategy == "fsdp2" and nodes * procs > 1
    hardware = machine.gpu_text() if machine.gpus else "a GPU machine (this one has no GPU)" if gpu_target else "a CPU-only machine"
    levels = {k.removeprefix("precision."): v for k, v in preset_keys(choices.preset).items()
              if k in ("precision.optimizer_states", "precision.grad_reduce", "precision.master_weights")}
    decision = Decision(
        name="", mode=mode, backend=backend, recipe=recipe, strategy=strategy, device="auto" if gpu_target else "cpu",
        model=model, nodes=nodes, procs_per_node=procs, compile=compile_, float8_all_gather=all_gather,
        hardware=hardware, why=_why(machine, choices, backend, rows), preset=choices.preset, **levels)
    name = choices.name or (choices.out and name_from_path(choices.out)) or default_name(decision)
    return dataclasses.replace(decision, name=name)


def _high_precision(machine: Machine) -> str:
    cc = machine.capability
    return "fp16" if cc is not None and not supports(cc, "bf16") else "bf16"


def _why(machine: Machine, choices: Choices, backend: str | None, rows: dict) -> str:
    if choices.preset:
        from launcher.planning.msamp_levels import PRESETS

        return (f"MS-AMP's {PRESETS[choices.preset]} level natively (--preset {choices.preset}): torchao FP8 GEMMs with the "
                "optimizer states, gradient reduction and master weights that level keeps in 8 / 16 bits")
    if choices.backend:
        return f"fp8 with {backend}, as asked"
    if backend and machine.gpus:
        return f"fp8 with {backend}: installed here, and FP8 runs on {machine.gpu_text()}"
    if backend:
        return f"fp8 with {backend}: installed here; on CPU torch's _scaled_mm kernel runs FP8 for tests and smoke runs, not for speed"
    mode = _high_precision(machine)
    if mode == "fp16":
        return (f"fp16: this GPU has compute capability {capability_text(machine.capability)}; "
                f"bf16 needs {requirement('bf16')}, FP8 {requirement('fp8')}")
    return f"{mode}, not fp8: " + rows["torchao", "tensorwise"].reasons[0].split("; fix: ")[0] + \
        ("" if "FP8-HARDWARE" in rows["torchao", "tensorwise"].rules else f" (install torchao for FP8: {INSTALL['torchao']})")


def _fit_model(machine: Machine, strategy: str, world: int) -> str:
    """The largest builtin model whose model states fit in half of one GPU's memory (the rest for
    activations). AdamW with fp32 master weights keeps ~16 bytes per parameter; FSDP2 and ZeRO
    shard them over the world, DDP replicates them. Without GPUs to measure: llama3-1b."""
    if not machine.gpus:
        return "builtin:llama3-1b"
    shards = world if strategy in ("fsdp2", "deepspeed") else 1
    budget = 0.5 * min(g.memory_gib for g in machine.gpus) * 1024**3
    return next((m for m in GPU_MODELS if 16 * model_params(m) / shards <= budget), "builtin:llama-debug")


def default_name(d: Decision) -> str:
    """e.g. llama3-8b-fp8-torchao-fsdp2, llama-debug-fp8-torchao-cpu: a valid spec name."""
    parts = [p for p in re.split(r"[:/?]", d.model) if p and p != "config.json"]
    word = parts[1] if d.model.startswith("builtin:") else parts[-1]
    short = re.sub(r"[^a-z0-9._-]+", "-", word.lower()).strip("-._")
    parts = [short or "model", d.mode, d.backend, d.preset, "cpu" if d.smoke else d.strategy]
    return "-".join(p for p in parts if p)[:64].rstrip("-._")


def name_from_path(path: str) -> str | None:
    """The spec name a file name suggests (`specs/my-run.toml` -> my-run), when it is a valid name."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return stem if NAME_PATTERN.match(stem) else None


def starter_spec(machine: Machine, choices: Choices = Choices()) -> str:
    """The starter spec's TOML text for `machine` and the user's choices."""
    return render_spec(decide(machine, choices))


def render_spec(d: Decision) -> str:
    """The spec as TOML with short comments; every value a user gave is quoted, never pasted raw."""
    out = [
        f"# Starter spec written by `fp8launch init` for {_comment(d.hardware)}.",
        f"# {_comment(d.why)}.",
        "# Check it with `fp8launch plan FILE`; `fp8launch explain` lists the rules it is checked against.",
        "version = 1",
        f"name = {toml_value(d.name)}",
        "",
        "[precision]",
        f"mode = {toml_value(d.mode)}",
    ]
    if d.mode == "fp8":
        out += [f"backend = {toml_value(d.backend)}", _line('high_precision = "bf16"', "everything not in FP8")]
        out += _level_lines(d)
        out += _backend_section(d)
    out += ["", "[distributed]", f"strategy = {toml_value(d.strategy)}", f"nodes = {d.nodes}",
            _line(f"procs_per_node = {d.procs_per_node}", "processes on one machine, over gloo" if d.smoke else "one process per GPU")]
    if d.strategy == "deepspeed":
        b = named(d.backend)
        zero = f"{d.backend} supports ZeRO 1-{b.max_zero_stage} only" if b is not None and b.max_zero_stage < 3 else ""
        out += ["", "[distributed.deepspeed]", _line("zero_stage = 2", zero)]
    if d.compile:
        out += ["", "[compile]", _line("enabled = true", "fuses the float8 casts" if d.mode == "fp8" else "")]
    if d.strategy == "deepspeed" and not d.smoke:
        # ZeRO-2 keeps the whole bf16 weights on every GPU: beside them, seq-8192 activations exceed an 80 GB GPU (MEMORY-EXCEEDS-GPU)
        out += ["", "[activation_checkpointing]",
                _line('mode = "selective"', "every other block recomputed: ZeRO-2 keeps whole weights per GPU")]
    device_note = "for tests and smoke runs, not for speed" if d.smoke else "CUDA when a GPU is visible"
    out += ["", "[launch]", _line(f"device = {toml_value(d.device)}", device_note)]
    if d.smoke:
        out += [_line('env = { OMP_NUM_THREADS = "1" }', "one thread per process")]
    if d.nodes > 1:
        out += [_line('rdzv_endpoint = "localhost:29500"', "the first node's HOST:PORT (or `fp8launch run --rdzv-endpoint`)")]
    out += ["", "[train]", f"model = {toml_value(d.model)}",
            _line('data = "synthetic"', 'or "text:PATH", "tokens:PATH", "py:module:function"')]
    if d.smoke:
        out += ["seq_len = 128", "micro_batch_size = 4", "steps = 30", "lr = 1e-3", "warmup_steps = 3", "log_every = 5"]
    else:
        seq_len = 8192 if d.model.startswith("builtin:llama3") else 2048
        out += [f"seq_len = {seq_len}", "micro_batch_size = 1", "steps = 1000", "lr = 3e-4", "warmup_steps = 100",
                "log_every = 10", "checkpoint_every = 500"]
    return "\n".join(out) + "\n"


def _level_lines(d: Decision) -> list[str]:
    """The MS-AMP level's keys (--preset), each with what it keeps in how many bits."""
    if not d.preset:
        return []
    lines = [_line(f"grad_reduce = {toml_value(d.grad_reduce)}", "gradient all-reduce / reduce-scatter in FP8, summed in fp32"),
             _line(f"master_weights = {toml_value(d.master_weights)}", "bf16 weights, stochastic rounding, no fp32 copy")]
    if d.optimizer_states != "fp32":
        lines.append(_line(f"optimizer_states = {toml_value(d.optimizer_states)}", "Adam's moments in FP8 (torchao AdamWFp8)"))
    return lines


def _backend_section(d: Decision) -> list[str]:
    """The backend's own table: its recipe with the record's note, float8 all-gather and, in a smoke spec, torchao's
    small layers converted too (keys its table has)."""
    b = named(d.backend)
    if not b.section:
        return []
    lines = ["", f"[precision.{b.section}]", _line(f"{b.recipe_field} = {toml_value(d.recipe)}", b.recipe_notes.get(d.recipe, ""))]
    if d.float8_all_gather:
        lines += [_line("fsdp_float8_all_gather = true", "FSDP2 gathers the weights in float8"), "precompute_scale = true"]
    if d.smoke and "skip_small" in settings(b.name):
        # the debug model's Linears are all below torchao's size rule: none would convert (FP8-NONE-SELECTED)
        lines += [_line("skip_small = false", "convert the debug model's small Linears too: a smoke run is about the pipeline")]
    return lines


def _line(code: str, comment: str = "") -> str:
    return f"{code:<36}# {comment}" if comment else code


def _comment(text: str) -> str:
    """Text safe inside a TOML comment (no control characters, one line)."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text).strip().rstrip(".")


# --- asking and writing -------------------------------------------------------------------------

QUESTIONS = (
    ("backend", "FP8 backend", ("torchao", "te", "msamp")),
    ("strategy", "Distributed strategy", ("ddp", "fsdp2", "deepspeed")),
    ("model", "Model (builtin:NAME, hf:PATH or py:module:function)", None),
    ("nodes", "Nodes", None),
    ("procs_per_node", "Processes per node", None),
    ("name", "Spec name", None),
)
"""What `interview` asks, in order: (Choices field, prompt, allowed values)."""

Ask = Callable[[str, object, "tuple[str, ...] | None"], object]


def interview(machine: Machine, choices: Choices, ask: Ask) -> Choices:
    """Ask for each value the user has not given, offering what detection would pick. Each answer
    changes the next default (an msamp answer makes ddp the default strategy). The backend is asked
    only where FP8 is what detection picks (or was asked for)."""
    for field_name, prompt, options in QUESTIONS:
        if getattr(choices, field_name) is not None:
            continue
        default = getattr(decide(machine, choices), field_name)
        if field_name == "backend" and default is None:
            continue
        choices = dataclasses.replace(choices, **{field_name: ask(prompt, default, options)})
    return choices


def check_target(path: str, force: bool = False) -> None:
    """Raise UsageError when `path` cannot be written: a folder, a missing folder, or (without `force`) anything there,
    a link included (with `force` the link itself is replaced, never what it leads to); EnvironmentProblem when its
    folder does not take a new file (read-only, full)."""
    from launcher.errors import UsageError, with_fix

    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory; give a file name such as {os.path.join(path, 'spec.toml')}")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path} already exists; pass --force to overwrite it")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        parent = os.path.dirname(path) or "."
        if os.path.lexists(folder):
            raise UsageError(with_fix(f"{parent} is not a folder", f"give --out a path in a folder, such as {os.path.basename(path)}"))
        raise UsageError(f"the folder {parent} does not exist; create it first")
    check_writable(folder, path)


def check_writable(folder: str, path: str | None = None) -> None:
    """Raise EnvironmentProblem when `folder` takes no new file (read-only, full): the one sure test of a folder's
    permissions (root, ACLs, read-only mounts) is to make a file there."""
    import tempfile

    from launcher.errors import EnvironmentProblem, with_fix

    try:
        fd, probe = tempfile.mkstemp(prefix=".fp8launch-probe-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise EnvironmentProblem(with_fix(f"cannot write {path or 'the spec'}: {folder} takes no new file ({e.strerror or e})",
                                          "give --out a path in a folder you can write to")) from e


def write_spec(text: str, path: str, force: bool = False):
    """Plan `text` exactly as `fp8launch plan` would, then write it to `path`; return the Planned.

    Raises UsageError when `path` exists and not `force`, SpecError (naming `path`) when the
    spec does not plan; nothing is written then.
    """
    from launcher.commands.plan import plan_one
    from launcher.errors import EnvironmentProblem, SpecError, with_fix

    check_target(path, force)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp.toml")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
        planned = plan_one(tmp, out_dir="generated")
        os.replace(tmp, path)
    except SpecError as e:
        raise SpecError([dataclasses.replace(p, file=path) for p in e.problems]) from None
    except OSError as e:
        raise EnvironmentProblem(with_fix(f"cannot write {path} ({e.strerror or e})",
                                          "give --out a path in a folder you can write to")) from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dataclasses.replace(planned, spec_path=path)
