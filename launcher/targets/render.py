"""Plan -> {file name: text}: the Jinja environment, the templates, and checks of what was rendered."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from functools import cache
from importlib import resources

import jinja2

from launcher import ENTRYPOINT, __version__
from launcher.errors import LauncherError
from launcher.planning.backends import BACKENDS, backend_of
from launcher.planning.models import builtin_config
from launcher.planning.plan import Plan
from launcher.targets.kubernetes import MANIFEST_FILE, manifest_file, render_manifest
from launcher.targets.plan_json import plan_json

TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class RenderError(LauncherError):
    """A template produced something invalid (a bug in a template, or an overridden one)."""


def shell_quote(value: object) -> str:
    """One shell word, whatever the value holds: `$(...)`, backticks, quotes, `;`, newlines."""
    return shlex.quote(str(value))


def sbatch_word(value: object) -> str:
    """One argument on an `#SBATCH` line, as sbatch splits it (src/sbatch/opt.c `get_argument`): whitespace ends an
    argument and an unquoted `#` the line, quotes (double or single) group, a backslash takes the next character as it
    is, and an unquoted "hetjob" or "packjob" is a separator of heterogeneous jobs (Slurm 17.11 blanked "packjob"
    anywhere on the line). A value holding any of those is double-quoted with `\\` and `"` escaped, so it stays one
    argument: a quote in it cannot close the group and add options. A line break would end the line: refused (the spec
    refuses it first)."""
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        raise RenderError(f"{text!r} cannot go on an #SBATCH line: it contains a line break")
    if not any(c.isspace() or c in "\"'\\#" for c in text) and not any(w in text.lower() for w in ("packjob", "hetjob")):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("launcher.templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shell_quote"] = shell_quote
    env.filters["sbatch_word"] = sbatch_word
    env.policies["json.dumps_kwargs"] = {"sort_keys": True}
    return env


def files_for(plan: Plan) -> list[str]:
    """The names of the files a plan generates, in the order they are written."""
    names = ["plan.json", "torchrun.sh"]
    if plan.distributed.strategy == "deepspeed":
        names.append("deepspeed.json")
    if plan.distributed.strategy == "fsdp2":
        names.append("fsdp2.json")
    if plan.launch.launcher == "slurm":
        names.append("slurm.sbatch")
    if plan.export.accelerate:
        names.append("accelerate.yaml")
    if plan.launch.launcher == "kubernetes":
        names.append(manifest_file(plan))  # last: it holds plan.json and the engine config
    return names


def canonical_json(data: object) -> str:
    """Deterministic JSON text: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render(plan: Plan, plan_dir: str = "generated") -> dict[str, str]:
    """Render every file of `plan`. `plan_dir` is the folder they are written to, relative to the
    project root (`project.relative_to_root`): the SLURM script, submitted from that root, finds
    plan.json there unless told otherwise, and no machine path goes into a committed file."""
    p = plan.precision
    gpus = plan.launch.slurm.gpus_per_node or (0 if plan.launch.device == "cpu" else plan.distributed.procs_per_node)
    context = {
        "plan": plan,
        "entrypoint": ENTRYPOINT,
        "version": __version__,
        "dtype": p.compute_dtype,
        "torch_dtype": TORCH_DTYPE,
        "ds": plan.distributed.deepspeed,
        "backend_section": _deepspeed_section(plan),
        "float8_all_gather": p.fp8 and bool(BACKENDS[p.backend].setting(p, "fsdp_float8_all_gather")),
        "pipeline": pipeline_section(plan),
        "mesh": plan.distributed.layout().mesh,
        "slurm": {"gpus_per_node": gpus, "cpus_per_task": plan.launch.slurm.cpus_per_task},
        "log_dir": plan.train.output_dir,
        "accelerate_type": _accelerate_type(plan),
        "plan_dir": plan_dir.replace(os.sep, "/"),
        "rdzv_host": plan.launch.rdzv_endpoint.rsplit(":", 1)[0],
        "rdzv_port": plan.launch.rdzv_endpoint.rsplit(":", 1)[1],
    }
    out = {}
    for name in files_for(plan):
        if name == "plan.json":
            out[name] = canonical_json(plan_json(plan))
            continue
        if name in MANIFEST_FILE.values():
            out[name] = render_manifest(plan, out, context["plan_dir"])
            continue
        try:
            text = environment().get_template(name + ".j2").render(context)
        except jinja2.TemplateError as e:
            raise RenderError(f"template {name}.j2: {e}") from e
        out[name] = _verify(name, text)
    return out


def pipeline_section(plan: Plan) -> dict | None:
    """fsdp2.json's "pipeline": the stages (and stages_per_rank where above 1), the schedule, the micro-batches of a step
    and the blocks of each stage (the builtin model's even split where the spec leaves it empty; [] for a model planning
    cannot size); None without it."""
    d, t = plan.distributed, plan.train
    if d.pipeline_parallel <= 1:
        return None
    cfg = builtin_config(t.model)
    split = d.stage_split(cfg.n_layers) if cfg is not None else d.pipeline.layers_per_stage
    several = {"stages_per_rank": d.pipeline.local_stages} if d.pipeline.local_stages > 1 else {}
    return {"stages": d.pipeline_stages, **several, "schedule": d.pipeline.schedule,
            "microbatches": plan.pipeline_microbatches, "layers_per_stage": list(split)}


def _deepspeed_section(plan: Plan) -> dict:
    """{name: table} of the backend section deepspeed.json carries for the backend's DeepSpeed integration
    (MS-AMP's "msamp": {"enabled": true, "opt_level", "use_te"}); empty for every other backend."""
    b = backend_of(plan.precision)
    if b is None or not b.deepspeed_section:
        return {}
    return {b.section: {"enabled": True, **dataclasses.asdict(getattr(plan.precision, b.section))}}


def _accelerate_type(plan: Plan) -> str:
    if plan.distributed.strategy == "fsdp2":
        return "FSDP"
    if plan.distributed.strategy == "deepspeed":
        return "DEEPSPEED"
    if plan.world_size == 1:
        return "NO"
    return "MULTI_CPU" if plan.launch.device == "cpu" else "MULTI_GPU"


def _verify(name: str, text: str) -> str:
    """JSON must parse (and is re-serialised canonically); scripts must start with a shebang."""
    if name.endswith(".json"):
        try:
            return canonical_json(json.loads(text))
        except json.JSONDecodeError as e:
            raise RenderError(f"template {name}.j2 rendered invalid JSON: {e.msg} at line {e.lineno}") from e
    if name.endswith(".yaml"):
        return text
    if not text.startswith("#!"):
        raise RenderError(f"template {name}.j2 must start with a #! line")
    return text
