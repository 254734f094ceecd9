"""What this machine can run.

`gather()` looks at the system once and returns a frozen `Machine`; it is the only function here
that imports torch (never at module level: `fp8launch plan` imports nothing heavy). `assess()` is
pure: for every precision, FP8 backend and recipe it says whether it runs on a `Machine`, and when
it does not, what to install or change. It asks the rule table, not a copy of its thresholds:
each row is a small synthetic plan checked with the machine's facts (rules FP8-HARDWARE,
TE-RECIPE-HARDWARE, CPU-BACKEND; BACKEND-MISSING's wording), exactly as `fp8launch run` checks a
real one, so the doctor and the launcher cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache

from launcher.errors import with_fix
from launcher.planning.backends import BACKENDS, BUILT_IN
from launcher.planning.hardware import capability_text, requirement, supports
from launcher.planning.install import INSTALL
from launcher.planning.msamp_levels import native_keys
from launcher.planning.plan import Plan, resolve
from launcher.planning.read import SpecSource, recipes, validate
from launcher.planning.rules import RULES_BY_ID, Facts, check
from launcher.planning.selection import default_recipe
from launcher.planning.stack import MSAMP_STRATEGIES, dist_version, msamp_problem

frozen = dataclass(frozen=True, kw_only=True, slots=True)

PACKAGES = ("torchao", "transformer_engine", "deepspeed", "msamp", "transformers", "accelerate")
"""Optional packages the doctor reports, by import name."""

ROWS: tuple[tuple[str, str | None, str | None], ...] = (
    *(("fp8", backend, r) for backend in BUILT_IN for r in recipes(backend)),
    ("bf16", None, None),
    ("fp16", None, None),
)
"""(mode, backend, recipe) of every row `assess` answers; recipe is the MS-AMP opt_level for msamp. The built-in
backends: a backend registered later (launcher/planning/backends.py `register`) is assessed through a spec that names it."""

FIRST = ("FP8-HARDWARE", "CPU-BACKEND")
"""Rules whose reason comes first: no package or recipe change helps while they hold."""

DEFAULT_RECIPE = {name: BACKENDS[name].default_recipe for name in BUILT_IN}
"""The row that speaks for each backend in the exit-3 message."""


@frozen
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]
    """CUDA compute capability (major, minor)."""
    memory_gib: float


@frozen
class Machine:
    """What `gather()` saw. Tests build synthetic ones (an H100 node, an A100, a CPU, no torch)."""

    python: str
    platform: str = ""
    torch: str | None = None
    """torch.__version__; None when torch is not importable."""
    torch_cuda: str | None = None
    """torch.version.cuda, the CUDA torch was built for; None for a CPU build."""
    cuda_available: bool = False
    gpus: tuple[Gpu, ...] = ()
    packages: dict[str, str | None] = field(default_factory=dict)
    """Import name -> installed version ("unknown" without metadata); None when not importable."""
    cpus: int = 1
    notes: tuple[str, ...] = ()
    """Problems met while looking: a package installed but not importable, a CUDA driver error."""
    msamp_stack: dict[str, str | None] = field(default_factory=dict)
    """strategy (ddp | deepspeed) -> why the installed MS-AMP cannot run here with it (launcher.planning.stack), or None."""
    cpu_bf16_gemm: bool | None = None
    """Whether torch sends this CPU's bf16 matmuls to oneDNN (AVX-512, AVX-NE-CONVERT or AMX: torch's
    mkldnn_bf16_device_check); False: ATen's reference loops, tens of times slower; None without torch."""

    def has(self, package: str) -> bool:
        return self.torch is not None if package == "torch" else self.packages.get(package) is not None

    @property
    def device(self) -> str:
        """Where `launch.device = "auto"` runs: cuda when torch sees a GPU, else cpu."""
        return "cuda" if self.gpus else "cpu"

    @property
    def capability(self) -> tuple[int, int] | None:
        """The lowest compute capability among the GPUs (a run uses all of them); None without GPUs."""
        return min(g.capability for g in self.gpus) if self.gpus else None

    def gpu_text(self) -> str:
        if not self.gpus:
            return "no GPU"
        names = sorted({g.name for g in self.gpus})
        return f"{len(self.gpus)} x {' / '.join(names)} (compute capability {capability_text(self.capability)})"

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["gpus"] = [{**g, "capability": capability_text(g["capability"])} for g in data["gpus"]]
        data["notes"] = list(self.notes)
        return data


@frozen
class Support:
    """Whether one precision (+ backend and recipe) runs on a machine, and why not."""

    mode: str
    backend: str | None = None
    recipe: str | None = None
    supported: bool
    device: str | None = None
    """Where it would run: cuda | cpu; None when the spec asks for CUDA and there is none."""
    reasons: tuple[str, ...] = ()
    """Why it cannot run, each naming what to install or change; empty when supported."""
    rules: tuple[str, ...] = ()
    """The rule ids behind the reasons."""
    note: str = ""
    """When supported: where, and any caveat (CPU runs are for tests and smoke runs)."""

    @property
    def fp8(self) -> bool:
        return self.mode == "fp8"

    @property
    def label(self) -> str:
        return " ".join(x for x in (self.mode, self.backend, self.recipe) if x)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(label=self.label, reasons=list(self.reasons), rules=list(self.rules))
        return data


def gather() -> Machine:
    """Look at this machine: python, torch and its CUDA, the GPUs, the optional packages.

    Imports torch (nothing else heavy) and never raises for a missing or broken package:
    what went wrong is kept in `notes`.
    """
    import os
    import platform

    notes: list[str] = []
    packages = {name: _installed_version(name, notes) for name in PACKAGES}
    torch_version = torch_cuda = bf16_gemm = None
    cuda = False
    gpus: tuple[Gpu, ...] = ()
    try:
        import torch
    except Exception as e:  # a broken torch must not crash the doctor; say what broke
        if _installed_version("torch", []) is not None or dist_version("torch"):
            notes.append(f"torch is installed but fails to import: {type(e).__name__}: {e}")
    else:
        torch_version, torch_cuda = torch.__version__, torch.version.cuda
        bf16_gemm = _cpu_bf16_gemm(torch, notes)
        try:
            cuda = torch.cuda.is_available()
            if cuda:
                gpus = tuple(_gpu(torch, i) for i in range(torch.cuda.device_count()))
        except Exception as e:  # a CUDA driver or NVML error
            notes.append(f"torch cannot query CUDA: {type(e).__name__}: {e}")
    return Machine(python=platform.python_version(), platform=f"{platform.system()} {platform.machine()}".strip(),
                   torch=torch_version, torch_cuda=torch_cuda, cuda_available=cuda, gpus=gpus, packages=packages,
                   cpus=os.cpu_count() or 1, notes=tuple(notes),
                   msamp_stack={s: msamp_problem(s) for s in MSAMP_STRATEGIES}, cpu_bf16_gemm=bf16_gemm)


def _cpu_bf16_gemm(torch, notes: list[str]) -> bool | None:
    """torch's own answer to whether a CPU bf16 matmul goes to oneDNN (at::native::mkldnn_bf16_device_check); torch 2.13
    runs it in ATen's reference loops otherwise (measured on an AVX2-only AMD EPYC: 512^3 on one thread, bf16 215 ms
    against fp32 5.2 ms; with AVX-512, 0.57 ms against 2.8)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and torch.backends.mkldnn.is_available()
    except Exception as e:  # an op a later torch renames: say so, guess nothing
        notes.append(f"torch does not say whether this CPU's bf16 matmuls use oneDNN: {type(e).__name__}: {e}")
        return None


def _gpu(torch, index: int) -> Gpu:
    props = torch.cuda.get_device_properties(index)
    return Gpu(index=index, name=props.name, capability=(props.major, props.minor),
               memory_gib=round(props.total_memory / 1024**3, 1))


def _installed_version(module: str, notes: list[str]) -> str | None:
    """The version of an importable top-level package, without importing it; None when not importable."""
    from importlib import util

    try:
        found = util.find_spec(module) is not None
    except (ImportError, ValueError) as e:
        found = False
        notes.append(f"{module} cannot be located: {type(e).__name__}: {e}")
    version = dist_version(module)
    if not found:
        if version:
            notes.append(f"{module} {version} is installed but not importable; reinstall it: {INSTALL[module]}")
        return None
    return version or "unknown"


# --- the pure part ------------------------------------------------------------------------------


def assess(machine: Machine) -> list[Support]:
    """For every row of ROWS: does it run on `machine`, and if not, what to install or change."""
    procs = max(1, len(machine.gpus))
    return [assess_plan(machine, synthetic_plan(mode, backend, recipe, procs, msamp_runs=msamp_strategies(machine)))
            for mode, backend, recipe in ROWS]


def msamp_strategies(machine: Machine) -> tuple[str, ...]:
    """The strategies MS-AMP's own stack runs on `machine` with: where a backend = "msamp" plan uses the MS-AMP package
    rather than its opt level's native keys (launcher/planning/levels.py)."""
    if not machine.has("msamp"):
        return ()
    return tuple(s for s in MSAMP_STRATEGIES if machine.msamp_stack.get(s) is None)


def fp8_usable(supports: list[Support]) -> bool:
    return any(s.fp8 and s.supported for s in supports)


def assess_plan(machine: Machine, plan: Plan) -> Support:
    """Whether `plan` runs on `machine`: the rules checked with the machine's facts and the device
    resolved (run-stage FP8-HARDWARE, TE-RECIPE-HARDWARE; plan-stage CPU-BACKEND depends on the
    device), bf16 support, enough GPUs for procs_per_node, and the packages the plan imports."""
    p = plan.precision
    backend = p.backend if p.fp8 else None
    recipe = default_recipe(plan) if p.fp8 else None
    reasons: dict[str, str | None] = {}  # reason -> rule id; ordered, without duplicates

    def missing(package: str) -> None:
        facts, rule = Facts(plan=plan, missing_package=package), RULES_BY_ID["BACKEND-MISSING"]
        reasons[with_fix(rule.detail(facts), rule.fix_of(facts))] = "BACKEND-MISSING"

    if not machine.has("torch"):
        missing("torch")
    device = {"auto": machine.device, "cpu": "cpu"}.get(plan.launch.device, "cuda" if machine.gpus else None)
    if device is None:
        reasons[with_fix('launch.device = "cuda" but torch sees no CUDA GPU here', 'run on a machine with a GPU and a CUDA '
                         'build of torch, or set launch.device = "cpu" (or "auto")')] = None
    else:
        here = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, device=device))
        facts = Facts(plan=here, device=device, capability=machine.capability if device == "cuda" else None,
                      msamp_stack=machine.msamp_stack.get(plan.distributed.strategy))
        findings = [f for f in check(facts, "plan") + check(facts, "run") if f.is_error]
        for finding in sorted(findings, key=lambda f: FIRST.index(f.rule.id) if f.rule.id in FIRST else len(FIRST)):
            reasons[finding.text] = finding.rule.id
        if device == "cuda":
            cc = machine.capability
            if p.compute_dtype == "bf16" and not supports(cc, "bf16"):
                reasons[with_fix(f"bf16 needs {requirement('bf16')} (Ampere); this GPU has {capability_text(cc)}",
                                 'set precision.mode = "fp16" (or precision.high_precision = "fp16")')] = None
            if plan.distributed.procs_per_node > len(machine.gpus):
                reasons[with_fix(f"distributed.procs_per_node = {plan.distributed.procs_per_node} but this machine has "
                                 f"{len(machine.gpus)} GPU{'s' * (len(machine.gpus) != 1)}",
                                 f"set distributed.procs_per_node = {len(machine.gpus)}")] = None
    for package in packages_needed(plan):
        if not machine.has(package):
            missing(package)
    ok = not reasons
    note = _note(machine, device, p.fp8 and not BACKENDS[backend].cuda_only) if ok else ""
    if plan.msamp_native:  # a backend = "msamp" spec planned as its opt level's native keys (launcher/planning/levels.py)
        backend, recipe = "msamp", plan.msamp_native
        note = f"{note}; as its native levels: {native_keys(plan.msamp_native)}" if ok else ""
    return Support(mode=p.mode, backend=backend, recipe=recipe, supported=ok, device=device,
                   reasons=tuple(reasons), rules=tuple(dict.fromkeys(r for r in reasons.values() if r)), note=note)


def packages_needed(plan: Plan) -> list[str]:
    """The optional packages a run of `plan` imports (torch itself is checked first)."""
    from launcher.planning.schedule import phases

    p = plan.precision
    out = [BACKENDS[q.plan.precision.backend].package for q in phases(plan) if q.plan.precision.fp8]  # any phase in FP8
    if p.optimizer_states != "fp32" or p.master_weights == "bf16":  # torchao's low-bit Adam (launcher/train/optim_lowbit.py)
        out.append("torchao")
    if p.fp8 and BACKENDS[p.backend].setting(p, "use_te"):
        out.append("transformer_engine")
    if plan.distributed.strategy == "deepspeed":
        out.append("deepspeed")
    if plan.train.model.startswith("hf:"):
        out.append("transformers")
    sources = (plan.train.data, plan.eval.data)
    if any(s.startswith("hf-dataset:") for s in sources):
        out.append("datasets")
    if plan.train.tokenizer or any(s.startswith("hf-dataset:") for s in sources):
        out.append("tokenizers")
    out += list(plan.log.trackers)  # the import names are the tracker names: tensorboard, wandb, mlflow
    return list(dict.fromkeys(out))


def _note(machine: Machine, device: str, torchao_fp8: bool) -> str:
    if device == "cuda":
        return f"on {machine.gpu_text()}"
    if torchao_fp8:
        return "on CPU: torch's CPU _scaled_mm kernel runs FP8 for real; for tests and smoke runs, not for speed"
    return "on CPU: for tests and smoke runs"


def _put(spec: dict, key: str, value) -> None:
    """Set dotted `key` of a spec held as nested tables."""
    *parents, leaf = key.split(".")
    for part in parents:
        spec = spec.setdefault(part, {})
    spec[leaf] = value


@cache
def synthetic_plan(mode: str, backend: str | None = None, recipe: str | None = None, procs: int = 1, *,
                   msamp_runs: tuple[str, ...] | None = None) -> Plan:
    """A plan that uses this precision the way a good spec would (no plan-stage error of its own),
    so that only the machine decides whether it runs. `msamp_runs`: the strategies MS-AMP's stack runs with
    (`msamp_strategies`); None: this machine's."""
    spec: dict = {"version": 1, "name": "doctor", "precision": {"mode": mode},
                  "distributed": {"strategy": "fsdp2", "procs_per_node": procs}}
    if mode == "fp8":
        spec["precision"]["backend"] = backend
        b = BACKENDS[backend]
        keys = {b.recipe_key: recipe} if b.recipe_key else {}
        for key, value in {**keys, **b.sample_spec(recipe)}.items():  # what the record says makes its plan a good one
            _put(spec, key, value)
    source = SpecSource(path="<doctor>", data=spec, sha256="")
    validate(source)
    return resolve(source, msamp_runs=None if msamp_runs is None else msamp_runs.__contains__)


@cache
def level_plan(preset: str, procs: int = 1) -> Plan:
    """MS-AMP's opt level as `fp8launch init --preset` writes it natively (launcher/planning/levels.py): torchao FP8 with
    the level keys, under DDP (O1, O2) or FSDP2 (O3)."""
    from launcher.planning.msamp_levels import MSAMP_LEVELS, PRESETS

    spec: dict = {"version": 1, "name": "doctor", "distributed": {"strategy": "ddp", "procs_per_node": procs},
                  "precision": {"torchao": {"skip_small": False}}}
    for key, value in MSAMP_LEVELS[PRESETS[preset]].items():
        _put(spec, key, value)
    source = SpecSource(path="<doctor>", data=spec, sha256="")
    validate(source)
    return resolve(source)


def assess_levels(machine: Machine) -> list[Support]:
    """Whether each MS-AMP level runs here natively (`fp8launch init --preset msamp-oN`), labelled by its preset."""
    from launcher.planning.msamp_levels import PRESETS

    procs = max(1, len(machine.gpus))
    return [dataclasses.replace(assess_plan(machine, level_plan(preset, procs)), recipe=f"{preset} natively") for preset in PRESETS]


# --- reports ------------------------------------------------------------------------------------


@frozen
class Diagnosis:
    """Everything `fp8launch doctor` says: the machine, each row, and the spec's own answer."""

    machine: Machine
    supports: tuple[Support, ...]
    spec_path: str | None = None
    spec: Support | None = None
    levels: tuple[Support, ...] = ()
    """MS-AMP's opt levels natively (`init --preset msamp-oN`): whether each runs here."""

    @property
    def problem(self) -> str | None:
        """None when the machine can do what was asked (some FP8 backend; or the spec), else what to change."""
        if self.spec is not None:
            if self.spec.supported:
                return None
            return f"{self.spec_path}: {self.spec.label} cannot run here:" + "".join(f"\n  - {r}" for r in self.spec.reasons)
        if fp8_usable(list(self.supports)):
            return None
        rows = {(s.backend, s.recipe): s for s in self.supports if s.fp8}
        if all("FP8-HARDWARE" in s.rules for s in rows.values()):  # no package helps: say only that
            lines = [next(s.reasons[0] for s in rows.values())]
        else:  # what every backend lacks (torch), then what each one lacks on its own
            common = [r for r in next(iter(rows.values())).reasons if all(r in s.reasons for s in rows.values())]
            lines = common + [f"{b}: " + "; ".join(rest) for b, r in DEFAULT_RECIPE.items()
                              if (rest := [x for x in rows[b, r].reasons if x not in common])]
        lines += [f"{s.mode} runs here: set precision.mode = \"{s.mode}\"" for s in self.supports
                  if s.mode in ("bf16", "fp16") and s.supported][:1]
        return "no FP8 backend can run here:" + "".join(f"\n  - {line}" for line in lines)

    def to_json(self) -> dict:
        return {"machine": self.machine.to_json(), "support": [s.to_json() for s in self.supports],
                "fp8_usable": fp8_usable(list(self.supports)),
                "spec": None if self.spec is None else {"path": self.spec_path, **self.spec.to_json()},
                "levels": [s.to_json() for s in self.levels],
                "problem": self.problem}

    def text(self) -> str:
        m = self.machine
        cuda = f"CUDA {m.torch_cuda}" if m.torch_cuda else "CPU build"
        rows = [
            ("python", f"{m.python} ({m.platform}, {m.cpus} CPUs)"),
            ("torch", f"{m.torch} ({cuda}; CUDA available: {'yes' if m.cuda_available else 'no'})" if m.torch
             else f"not installed: {INSTALL['torch']}"),
            ("GPUs", str(len(m.gpus)) if m.gpus else "none"),
        ]
        if m.cpu_bf16_gemm is not None:
            rows.append(("CPU bf16 matmuls", "oneDNN" if m.cpu_bf16_gemm else
                         "ATen's reference loops: this CPU has no AVX-512, AVX-NE-CONVERT or AMX, so bf16 and FP8 runs on it "
                         "(their bf16 GEMMs) take tens of times what they take on one that has (the same numerics)"))
        out = [f"{k:<20} {v}" for k, v in rows]
        out += [f"  cuda:{g.index:<15} {g.name}, compute capability {capability_text(g.capability)}, {g.memory_gib:g} GiB"
                for g in m.gpus]
        out += [f"{name:<20} {m.packages.get(name) or 'not installed'}" for name in PACKAGES]
        out += [f"note: {n}" for n in m.notes]
        out += ["", f"{'precision':<34} {'here':<5} why"]
        for label, s in grouped(self.supports):
            out.append(f"{label:<34} {'yes' if s.supported else 'no':<5} {s.note if s.supported else s.reasons[0]}")
            out += [f"{'':<40} {r}" for r in s.reasons[1:]]
        if self.levels:
            out += ["", "MS-AMP's levels natively (fp8launch init --preset ...; docs/precision.md):"]
            for s in self.levels:
                out.append(f"{s.label:<34} {'yes' if s.supported else 'no':<5} {s.note if s.supported else s.reasons[0]}")
                out += [f"{'':<40} {r}" for r in s.reasons[1:]]
        if self.spec is not None:
            verdict = f"yes, {self.spec.note}" if self.spec.supported else "no"
            out += ["", f"{self.spec_path}: {self.spec.label}: {verdict}"]
            out += [f"  - {r}" for r in self.spec.reasons]
        return "\n".join(out)


def grouped(supports: tuple[Support, ...]) -> list[tuple[str, Support]]:
    """The rows as the text report shows them: a backend whose every recipe fails for the same
    reasons is one row ("fp8 te: every recipe"), not the same reasons once per recipe."""
    out: list[tuple[str, Support]] = []
    by_backend: dict[tuple[str, str | None], list[Support]] = {}
    for s in supports:
        by_backend.setdefault((s.mode, s.backend), []).append(s)
    for (mode, backend), group in by_backend.items():
        same = len(group) > 1 and all(not s.supported and s.reasons == group[0].reasons for s in group)
        if same:
            out.append((f"{mode} {backend}: every recipe", group[0]))
        else:
            out += [(s.label, s) for s in group]
    return out


def diagnose(machine: Machine, spec_path: str | None = None) -> Diagnosis:
    """Assess every row; with `spec_path`, also plan that spec (raising SpecError when it is invalid)
    and assess its own precision, engine and device on this machine."""
    spec = None
    if spec_path is not None:
        from launcher.commands.plan import plan_one

        spec = assess_plan(machine, plan_one(spec_path, out_dir="generated").plan)
    return Diagnosis(machine=machine, supports=tuple(assess(machine)), spec_path=spec_path, spec=spec,
                     levels=tuple(assess_levels(machine)))
