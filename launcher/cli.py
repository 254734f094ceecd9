"""The `fp8launch` command line: Click commands only. They parse options, call the library,
print, and exit; errors become messages and exit codes in one place (`_errors`)."""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import math
import os
import sys

import click

from launcher import __version__
from launcher.errors import EXIT_CODES as CODES
from launcher.errors import EXIT_DRIFT, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_INVALID, LauncherError, SpecError, os_error_text, with_fix

EXIT_CODES = ("\b\nExit codes:\n" + "\n".join(f"  {code:<3}  {meaning}" for code, meaning in CODES.items())
              + "\n  other codes come from the training processes")


def _errors(fn):
    """The one place that turns LauncherErrors into messages on stderr and exit codes. An OSError no caller
    named (a full disk, a read-only or vanished folder) is still one line: its path and the system's reason."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LauncherError as e:
            click.echo(str(e), err=True)
            if isinstance(e, SpecError) and len(e.problems) > 1:
                click.echo(f"{len(e.problems)} problems found.", err=True)
            sys.exit(e.exit_code)
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise  # stdout closed by the reader (`| head`): Click leaves quietly
            click.echo(f"error: {os_error_text(e)}", err=True)
            sys.exit(EXIT_ENVIRONMENT)

    return wrapper


class _Main(click.Group):
    """Click's group, with every way a command line can go wrong before or around a command as one line: a usage
    error (Click prints usage, a hint and the error on four lines), Ctrl-C (Click's "Aborted!" and exit 1; fp8launch
    promises 130), and a working directory that no longer exists (every relative path, and torch's import, fail on it)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            os.getcwd()
        except FileNotFoundError:
            click.echo("error: the current folder no longer exists (removed while this shell was in it); "
                       "fix: cd to an existing folder and run the command again", err=True)
            sys.exit(EXIT_INVALID)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.UsageError as e:
            where = " ".join(["fp8launch", *(e.ctx.command_path.split()[1:] if e.ctx else [])])
            click.echo(f"error: {with_fix(' '.join(e.format_message().split()), f'see `{where} --help`')}", err=True)
            sys.exit(EXIT_INVALID)
        except click.exceptions.Abort:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


class _ParameterCount(click.ParamType):
    """A model's parameter count (`--params 8e9`): a finite number from 1 to 10^15."""

    name = "COUNT"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number (e.g. 8e9)", param, ctx)
        if not math.isfinite(number) or not 1 <= number <= 1e15:
            self.fail(f"{value!r} is not a parameter count from 1 to 1e15 (e.g. 8e9)", param, ctx)
        return int(number)


def _not_nan(ctx, param, value):
    """Click's FloatRange lets NaN through (every comparison with it is false)."""
    if value is not None and value != value:
        raise click.BadParameter(f"{value} is not a number", param=param)
    return value


def _overrides(sets: tuple[str, ...], nodes: int | None) -> list[str]:
    return list(sets) + ([f"distributed.nodes={nodes}"] if nodes is not None else [])


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}, epilog=EXIT_CODES)
@click.version_option(__version__, prog_name="fp8launch")
def main() -> None:
    """One precision spec -> validated FP8 training configs, and a launcher that runs them."""


@main.command(epilog=EXIT_CODES)
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("--out", "out_dir", default=None,
              help="Write into OUT/<name>/ [default: [tool.fp8launch] out in ./pyproject.toml, else generated].")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a generated file would be created, changed or removed.")
@click.option("--diff", is_flag=True,
              help="Write nothing; print unified diffs of what writing would change (with --check: also exit 1 on drift).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a spec key by dotted path (repeatable).")
@click.option("--nodes", type=click.IntRange(min=1), help="Same as --set distributed.nodes=N.")
@click.option("--strict", is_flag=True, help="Treat warnings as errors.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON object per spec, one per line (JSON Lines): the plan, the memory estimate, the files, "
                   "the prediction, the warnings.")
@click.option("--params", type=_ParameterCount(),
              help="Parameter count for the memory estimate (e.g. 8e9); builtin models are known.")
@click.option("--force", is_flag=True, help="Overwrite files of the plan's names that fp8launch did not write (or that changed since).")
@_errors
def plan(specs, out_dir, check, diff, sets, nodes, strict, fmt, params, force) -> None:
    """Validate SPECs and render their configs into OUT/<name>/."""
    from launcher.commands.plan import plan_many, plan_record, warning_lines
    from launcher.commands.plan_text import plan_summary
    from launcher.targets.files import DRIFT, compare, prepare, write
    from launcher.targets.project import default_out

    planned = plan_many(list(specs), out_dir or default_out(), _overrides(sets, nodes), strict)
    if not (check or diff):
        for p in planned:  # every folder checked before the first is written
            prepare(p.folder, p.files, force=force)
    drift = False
    for p in planned:
        for line in warning_lines(p):
            click.echo(line, err=True)
        changes = compare(p.folder, p.files) if (check or diff) else write(p.folder, p.files, force=force)
        moved = [c for c in changes if c.status in DRIFT]
        drift |= bool(moved)
        for c in changes:
            if c.status == "extra":
                click.echo(f"note: {c.path} is not a file fp8launch writes; left as it is", err=True)
            elif c.status == "kept":
                click.echo(f"note: {c.path} {c.why}; left as it is", err=True)
        if diff:
            for c in moved:
                if c.diff:
                    click.echo(c.diff, nl=False)
        if check or diff:
            for c in moved:
                what = f"overwrite {c.path}: it {c.why}; plan needs --force for that" if c.status == "conflict" else f"{c.status} {c.path}"
                click.echo(f"would {what}", err=True)
        if fmt == "json":
            click.echo(json.dumps(plan_record(p, changes, params), sort_keys=True))
        elif not (check or diff):
            click.echo(plan_summary(p.plan, p.folder, changes, params, p.prediction))
    if check or diff:
        n = len(planned)
        click.echo(f"{'drift found' if drift else 'up to date'}: {n} spec{'s' * (n != 1)} checked.", err=True)
        if drift and check:
            sys.exit(EXIT_DRIFT)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["json", "markdown"]), default="json", show_default=True,
              help="json: the JSON Schema; markdown: the spec reference generated from it.")
def schema(fmt: str) -> None:
    """Print the JSON Schema of the spec (for editors and other tools)."""
    from launcher.planning.read import schema as load_schema
    from launcher.planning.read import schema_text

    text = schema_text()
    if fmt == "markdown":
        from launcher.commands.plan_text import schema_markdown

        text = schema_markdown(load_schema())
    click.echo(text, nl=False)


@main.command()
@click.argument("rule_id", required=False)
@_errors
def explain(rule_id: str | None) -> None:
    """List the known-bad-combination rules, or explain RULE_ID."""
    from launcher.commands.plan_text import explain_rule, rules_table

    click.echo(rules_table() if rule_id is None else explain_rule(rule_id))


@main.command(epilog=EXIT_CODES)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--spec", "spec_path", metavar="SPEC", help="Also say whether this spec runs here; the exit code then answers for it.")
@_errors
def doctor(fmt: str, spec_path: str | None) -> None:
    """Show what this machine can run: torch, GPUs, packages, and every precision recipe.

    Exits 0 when some FP8 backend runs here (with --spec: when that spec does), 3 otherwise."""
    from launcher.commands.doctor import diagnose, gather
    from launcher.errors import EnvironmentProblem

    result = diagnose(gather(), spec_path)
    click.echo(json.dumps(result.to_json(), sort_keys=True) if fmt == "json" else result.text())
    if result.problem:
        raise EnvironmentProblem(result.problem)


@main.command(epilog=EXIT_CODES)
@click.option("--name", help="Spec name [default: from --out, else from model, precision and engine].")
@click.option("--backend", type=click.Choice(["torchao", "te", "msamp"]),
              help="FP8 backend [default: the first installed one that runs here].")
@click.option("--strategy", type=click.Choice(["ddp", "fsdp2", "deepspeed"]), help="[default: fsdp2; ddp with msamp]")
@click.option("--model", help="builtin:NAME, hf:PATH or py:module:function [default: the largest builtin that fits].")
@click.option("--nodes", type=click.IntRange(min=1), help="[default: 1]")
@click.option("--procs-per-node", type=click.IntRange(min=1), help="[default: one per GPU; 2 on a CPU-only machine]")
@click.option("--preset", type=click.Choice(["msamp-o1", "msamp-o2", "msamp-o3"]),
              help="MS-AMP's opt level natively with torchao: O1 FP8 gradient reduction + bf16 master weights, O2 + FP8 Adam "
                   "moments, O3 + FSDP2 with float8 all-gather (docs/precision.md).")
@click.option("--out", help="The file to write [default: NAME.toml].")
@click.option("--force", is_flag=True, help="Overwrite --out when it exists.")
@_errors
def init(name, backend, strategy, model, nodes, procs_per_node, preset, out, force) -> None:
    """Write a starter spec for this machine's GPUs (or a CPU smoke spec), checked like `plan`.

    On a terminal, asks for each value not given, offering what it detected."""
    import shlex

    from launcher.commands.doctor import assess_plan, gather
    from launcher.commands.init import Choices, check_target, decide, interview, render_spec, write_spec
    from launcher.commands.plan import warning_lines

    if out:
        check_target(out, force)
    machine = gather()
    choices = Choices(name=name, backend=backend, strategy=strategy, model=model, nodes=nodes, procs_per_node=procs_per_node, out=out,
                      preset=preset)
    if preset:  # MS-AMP's level with torchao: nothing to ask about the backend
        from launcher.commands.init import check_preset

        check_preset(choices)
        choices = dataclasses.replace(choices, backend="torchao")
    if sys.stdin.isatty() and sys.stdout.isatty():
        choices = interview(machine, choices, _ask)
    decision = decide(machine, choices)
    planned = write_spec(render_spec(decision), out or f"{decision.name}.toml", force)
    for line in warning_lines(planned):
        click.echo(line, err=True)
    for reason in assess_plan(machine, planned.plan).reasons:
        click.echo(f"warning: this machine cannot run it: {reason}", err=True)
    path = shlex.quote(planned.spec_path)
    click.echo(f"wrote {planned.spec_path}: {decision.summary()}\n  {decision.why}\nnext: fp8launch plan {path}; fp8launch run {path}")


@main.command("import", epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=str))
@click.option("--out", help="The spec to write [default: NAME.toml here, NAME from the source's run name or file name].")
@click.option("--force", is_flag=True, help="Overwrite --out when it exists.")
@_errors
def import_(file, out, force) -> None:
    """Write an fp8launch spec equivalent to FILE: an Accelerate config, an Axolotl YAML, a torchtitan job TOML, a NeMo /
    Megatron-Bridge YAML or a DeepSpeed JSON (the kind is read from the content).

    Every setting of FILE is reported as mapped, approximated (how) or with no equivalent (why, what to do), here and
    as a comment block at the top of the spec, which is checked like `plan` before it is written. See docs/import.md."""
    import os
    import shlex

    from launcher.commands.importer import import_config
    from launcher.commands.init import check_target, check_writable, write_spec
    from launcher.commands.plan import warning_lines

    if out:
        check_target(out, force)
    else:
        check_writable(os.path.abspath("."))
    imported = import_config(file, folder=os.path.dirname(os.path.abspath(out)) if out else ".")
    planned = write_spec(imported.text, out or f"{imported.name}.toml", force)
    for line in imported.report.lines():
        click.echo(line)
    for line in warning_lines(planned):
        click.echo(line, err=True)
    path = shlex.quote(planned.spec_path)
    click.echo(f"wrote {planned.spec_path} from {file} ({imported.kind.title}): {imported.report.summary()}\n"
               f"next: fill in the PLACEHOLDER lines, then fp8launch plan {path}; fp8launch run {path}")


def _ask(prompt: str, default, options: tuple[str, ...] | None):
    kind = click.Choice(options) if options else click.IntRange(min=1) if isinstance(default, int) else str
    return click.prompt(prompt, default=default, type=kind)


@main.command(epilog=EXIT_CODES)
@click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
@click.option("--nodes", type=click.IntRange(min=1), help="Same as --set distributed.nodes=N; this process is one node's agent.")
@click.option("--node-rank", type=click.IntRange(min=0), help="This node's rank, 0..N-1 [default: $NODE_RANK, else 0].")
@click.option("--rdzv-endpoint", metavar="HOST:PORT",
              help="Node 0's rendezvous address [default: $RDZV_ENDPOINT, else launch.rdzv_endpoint].")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a spec key by dotted path (repeatable).")
@click.option("--dry-run", is_flag=True, help="Write the plan, print the exact command(s) that would run, run nothing.")
@click.option("--wait", is_flag=True, help="SLURM / Kubernetes: block until the submitted job ends and exit with its exit code.")
@click.option("--strict", is_flag=True, help="Treat warnings as errors.")
@click.option("--profile", "profile_steps", type=click.IntRange(min=1), metavar="N",
              help="Profile N steps after 2 warm-up steps (torch.profiler, rank 0): where each step's time goes, written to "
                   "<train.output_dir>/profile.json (and profile.png, profile/trace.json.gz).")
@click.option("--force", is_flag=True, help="Overwrite files in <train.output_dir>/plan/ of the plan's names that fp8launch did not write.")
@_errors
def run(spec, nodes, node_rank, rdzv_endpoint, sets, dry_run, wait, strict, profile_steps, force) -> None:
    """Plan SPEC into <train.output_dir>/plan/ and start the training (torchrun, srun/sbatch under SLURM, kubectl on Kubernetes).

    Exits with the training's exit code."""
    from launcher.commands import preflight
    from launcher.commands.plan import warning_lines
    from launcher.commands.run import announce, claim, describe, execute, launch_command, plan_for_run, write_plan

    planned = plan_for_run(spec, _overrides(sets, nodes), strict)
    for line in warning_lines(planned):
        click.echo(line, err=True)
    command = launch_command(planned, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, wait=wait)
    if profile_steps:
        from launcher.commands.run import profiled

        command = profiled(command, planned.plan, profile_steps)
    preflight.check(planned.plan, local=command.kind != "sbatch" and not dry_run, gpu_here=command.kind == "torchrun" and not dry_run,
                    launch_env=command.env if command.kind == "torchrun" and not dry_run else None)
    lock = claim(planned, command)  # exit 3 at once where another run holds train.output_dir; before anything is written there
    click.get_current_context().call_on_close(lock.release)
    if lock.warning:
        click.echo(lock.warning, err=True)
    for c in write_plan(planned, force):
        if c.status == "kept":
            click.echo(f"note: {c.path} {c.why}; left as it is", err=True)
    if dry_run:
        click.echo(describe(command))
        return
    click.echo(f"fp8launch: {planned.plan.name}: planned into {planned.folder}/; starting {command.kind}", err=True)
    code = execute(command, on_job_id=lambda job: click.echo(announce(planned, command, job)),
                   out=lambda line: click.echo(line, nl=False), err=lambda line: click.echo(line, nl=False, err=True), lock=lock)
    if code != 0:
        logs = f"; full logs (torchrun's report, each rank's output): {command.logs}/" if command.logs else ""
        click.echo(f"fp8launch: {planned.plan.name}: {command.kind} exited with code {code}{logs}", err=True)
    elif profile_steps:
        from launcher.commands.profile import summary_lines

        for line in summary_lines(planned.plan.train.output_dir):
            click.echo(line)
    sys.exit(code)


@main.command(epilog=EXIT_CODES)
@click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
@click.option("--vs", default="bf16", show_default=True, metavar="bf16|fp16|fp32|SPEC2",
              help="The baseline: the same spec in this precision, or another spec.")
@click.option("--steps", type=click.IntRange(min=2), help="Steps per run [default: the spec's train.steps].")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Runs per variant, alternating.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Steps left out of each run's medians.")
@click.option("--out", "out_dir", help="Where the runs, bench.json and bench.png go [default: next to train.output_dir].")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a spec key for both variants (repeatable).")
@click.option("--no-plot", is_flag=True, help="Skip bench.png.")
@click.option("--max-loss-gap", type=click.FloatRange(min=0), default=0.02, show_default=True, callback=_not_nan,
              help="With [eval] in the spec: exit 4 when SPEC's held-out eval loss is this much (relative) above the baseline's.")
@click.option("--profile", is_flag=True,
              help="Profile the measured steps of each variant's first run (torch.profiler): where each step's time goes, the FP8 "
                   "FLOP share, the ceiling and what holds the ratio back; writes profile.json and profile.png.")
@click.option("--profile-last", type=click.IntRange(min=0), default=0, metavar="N",
              help="Profile the last N steps of each variant's first run instead, after the measured ones: no figure is read "
                   "from the profiler's steps (nor its warm-up step), so one bench gives unprofiled figures and the profile [0: off].")
@_errors
def bench(spec, vs, steps, repeats, warmup, out_dir, sets, no_plot, max_loss_gap, profile, profile_last) -> None:
    """Train SPEC and a baseline twin alternately; print tokens/s, step time, TFLOP/s, MFU, memory, loss and ratios."""
    import os

    from launcher.commands.bench import plot, run_bench, table
    from launcher.errors import EXIT_DIVERGED

    record = run_bench(spec, vs=vs, steps=steps, repeats=repeats, warmup=warmup, out_dir=out_dir, overrides=list(sets),
                       max_loss_gap=max_loss_gap, profile=profile, profile_last=profile_last, echo=lambda line: click.echo(line, err=True))
    click.echo(table(record))
    click.echo(f"wrote {os.path.join(record['out_dir'], 'bench.json')}")
    if record.get("profile"):
        click.echo(f"wrote {os.path.join(record['out_dir'], 'profile.json')}")
        if not no_plot:
            from launcher.profiling.compare import plot as plot_profile

            click.echo(f"wrote {plot_profile(record['profile'], os.path.join(record['out_dir'], 'profile.png'))}")
    if not no_plot:
        click.echo(f"wrote {plot(record, os.path.join(record['out_dir'], 'bench.png'))}")
    gate = record["loss_gate"]
    if gate["gated"] and not gate["passed"]:
        click.echo(f"bench: the held-out eval loss of {spec} is {gate['gap']:+.2%} from the baseline's, over the "
                   f"{gate['max_loss_gap']:.1%} gate; fix: keep more layers in high precision (precision.rules, keep_last_blocks), "
                   "try another recipe (`fp8launch tune`), or raise --max-loss-gap", err=True)
        sys.exit(EXIT_DIVERGED)


@main.command(epilog=EXIT_CODES)
@click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
@click.option("--steps", type=click.IntRange(min=2), help="Steps per run [default: the spec's train.steps].")
@click.option("--candidates", "candidates", multiple=True, metavar="NAME[,NAME...]",
              help="Only these candidates (e.g. torchao-tensorwise,torchao-rowwise); 'compile' adds each with compile toggled "
                   "[default: every FP8 recipe that runs here].")
@click.option("--out", "out_dir",
              help="Where the runs, tune.json, tune.png and NAME-tuned.toml go [default: NAME-tune next to train.output_dir].")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Runs per candidate, alternating.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Steps left out of each run's medians.")
@click.option("--max-loss-gap", type=click.FloatRange(min=0), default=0.02, show_default=True, callback=_not_nan,
              help="Reject a candidate whose mean loss over the steps is this much (relative) above bf16's.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a spec key for every candidate (repeatable).")
@click.option("--no-plot", is_flag=True, help="Skip tune.png.")
@_errors
def tune(spec, steps, candidates, out_dir, repeats, warmup, max_loss_gap, sets, no_plot) -> None:
    """Train SPEC's bf16 twin and every FP8 recipe that runs here, alternately; rank them; write the winner as a spec."""
    import os

    from launcher.commands.tune import TuneInterrupted, run_tune
    from launcher.commands.tune.plot import plot
    from launcher.commands.tune.record import table

    echo = lambda line: click.echo(line, err=True)  # noqa: E731
    try:
        record = run_tune(spec, steps=steps, candidates=list(candidates), out_dir=out_dir, repeats=repeats, warmup=warmup,
                          max_loss_gap=max_loss_gap, overrides=list(sets), echo=echo)
    except TuneInterrupted as e:
        out = e.out_dir
        with open(os.path.join(out, "tune.json"), encoding="utf-8") as f:
            partial = json.load(f)
        click.echo(table(partial))
        if not no_plot and any(r["tokens_per_s"] for r in partial["candidates"]):
            click.echo(f"wrote {plot(partial, os.path.join(out, 'tune.png'))}")
        raise
    click.echo(table(record))
    click.echo(f"wrote {os.path.join(record['out_dir'], 'tune.json')}")
    if not no_plot:
        click.echo(f"wrote {plot(record, os.path.join(record['out_dir'], 'tune.png'))}")
    if record.get("tuned_spec"):
        path = os.path.join(record["out_dir"], record["tuned_spec"])
        click.echo(f"wrote {path}: the winner, {record['winner']}; next: fp8launch plan {path}")


@main.command(epilog=EXIT_CODES)
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=str),
              help="Write the PNG here [default: RUN_DIR/report.png of the first RUN_DIR].")
@_errors
def report(run_dirs, out_path) -> None:
    """Draw a run (or overlay several): loss, lr, tokens/s, memory and, with the FP8 monitor on,
    an underflow heatmap by layer and step. RUN_DIR is a run's train.output_dir."""
    from launcher.commands.report import report as draw_report

    path, notes = draw_report(list(run_dirs), out_path)
    for note in notes:
        click.echo(note, err=True)
    click.echo(f"wrote {path}")


@main.command(epilog=EXIT_CODES)
@click.argument("run_dir", type=click.Path(path_type=str))
@click.option("--step", type=click.IntRange(min=0), help="Export the complete checkpoint of this step [default: the newest].")
@click.option("--format", "fmt", type=click.Choice(["hf", "torch"]), default="hf", show_default=True,
              help="hf: a Hugging Face folder (config.json, model.safetensors shards + index, generation_config.json, the run's "
                   "tokenizer files) that transformers' AutoModelForCausalLM.from_pretrained loads; builtin models become "
                   "LlamaForCausalLM, hf: models their own class. torch: one model.pt (torch.save of {name: tensor}, the model's "
                   "own names), for any model.")
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True,
              help="dtype of the written weights (the checkpoint's high-precision weights; FP8 runs keep them too).")
@click.option("--out", metavar="DIR",
              help="The folder to write [default: RUN_DIR/export/step-N-FORMAT, -QUANT added with --quant]. It must not exist, "
                   "be empty, or hold an earlier fp8launch export (which is replaced); nothing is left half-written.")
@click.option("--max-shard-size", default="5GB", show_default=True, metavar="SIZE",
              help="Largest safetensors shard (e.g. 500MB, 2GiB); a larger single tensor gets a shard of its own.")
@click.option("--plan", "plan_path", metavar="PLAN_JSON",
              help="The plan.json the run was started with [default: RUN_DIR/plan/plan.json, where fp8launch run writes it].")
@click.option("--quant", type=click.Choice(["fp8-block", "fp8-channel", "mxfp8"]),
              help="Write the Linear layers the run trained in FP8 in an FP8 format vLLM, SGLang and transformers load: "
                   "fp8-block (quant_method fp8, 128 x 128 weight scales), fp8-channel (compressed-tensors FP8_DYNAMIC, a "
                   "scale per output row), mxfp8 (compressed-tensors MXFP8); the rest stays in --dtype, listed with why in "
                   "README.md [default: none, high-precision weights only].")
@click.option("--serve-tp", type=click.IntRange(min=1), metavar="N",
              help="With --quant: refuse unless vLLM at --tensor-parallel-size N gets whole blocks on every rank.")
@_errors
def export(run_dir, step, fmt, dtype, out, max_shard_size, plan_path, quant, serve_tp) -> None:
    """Write the weights of a run's checkpoint (the newest complete one, or --step N) for use outside fp8launch.

    RUN_DIR is the run's train.output_dir. Works for every engine (DDP, FSDP2 with or without tensor
    parallel, DeepSpeed ZeRO 0-3), in this one process, without GPUs. Load the result with
    AutoModelForCausalLM.from_pretrained(OUT). See docs/export.md."""
    from launcher.commands.export import run_export

    done = run_export(run_dir, step=step, fmt=fmt, dtype=dtype, out=out, max_shard_size=max_shard_size, plan_path=plan_path,
                      echo=lambda line: click.echo(line, err=True), quant=quant, serve_tp=serve_tp)
    for note in done.notes:
        click.echo(note, err=True)
    what = f"{done.architecture}, " if done.architecture else ""
    if quant:
        what += f"{done.quantized} Linear layers in {quant}, "
    click.echo(f"wrote {done.out}: step {done.step}, {what}{done.tensors} tensors, {done.parameters:,} parameters, "
               f"{len(done.files)} files in {done.seconds:.1f} s")


if __name__ == "__main__":  # pragma: no cover
    main()
