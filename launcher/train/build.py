"""The steps of `launcher.train.main.build_run`, in the order it calls them: everything a rank does
before its first training step.

    open_run -> build_model -> convert_precision -> build_engine -> build_data -> restore -> measure
    -> start_metrics -> (trackers open) link_trackers -> print_warnings -> make_trainer

Each step takes what earlier steps returned and nothing else; the order matters (the model is
materialised before the precision backend converts it where the backend copies weights while
converting, the precision is applied before the engine wraps the model, the per-rank seed is set
after the engine initialised the weights, the checkpoint restores the random state last).

Like main.py this module imports torch and the training modules only inside the steps: importing it is cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import typing

from launcher.errors import LauncherError

if typing.TYPE_CHECKING:
    from torch import nn

    from launcher.planning.layout import Layout
    from launcher.planning.plan import Plan
    from launcher.planning.schedule import Phase
    from launcher.train.checkpoint import CheckpointManager, LoadedState
    from launcher.train.engines import Engine
    from launcher.train.loop import Trainer, TrainState
    from launcher.train.materialize import Pending
    from launcher.train.metrics import MetricsLogger, Throughput
    from launcher.train.monitor import FP8Monitor
    from launcher.train.parallel.distributed import DistEnv
    from launcher.train.precision import Precision


@dataclasses.dataclass(frozen=True)
class Run:
    """What the plan and the process group decide before anything is built."""

    plan: Plan
    plan_dir: str
    spec_dir: str
    env: DistEnv
    layout: Layout
    """The job's parallel layout: the plan's degrees over this world (launcher/planning/layout.py), built once here and
    handed to every step that needs a degree, a mesh or a rank's place."""
    checkpoints: CheckpointManager
    restart: int
    """torchrun's restart count of this job (TORCHELASTIC_RESTART_COUNT); 0 at the first attempt."""
    resume: str | None
    """The checkpoint this run resumes from, None when it starts fresh."""
    phase: Phase
    """The [[precision.schedule]] phase of the next step to train (the whole run's precision without a schedule)."""


@dataclasses.dataclass(frozen=True)
class Model:
    """The model as built (on the meta device unless materialised already), before the precision backend converts it."""

    module: nn.Module
    initializer: typing.Any
    """What sets its initial weights (None where the model built with them); its `notes` are warnings to print."""
    pending: Pending | None
    """The initialisation the engine still owes the model (None: nothing, or done already)."""
    flops: float
    parameters: int
    unmatched: dict[str, list[str]]
    """precision.rules / precision.keep globs that match no layer of a py: model, by rule id."""


@dataclasses.dataclass(frozen=True)
class Data:
    """The training batches, and the evaluation streams where eval.enabled."""

    train: typing.Any
    eval_stream: typing.Callable[[], typing.Any] | None
    """Makes a fresh evaluation stream (None: evaluation off)."""
    first_eval: typing.Any
    """The first evaluation stream, opened before step 1 so that a bad eval.data stops the run there."""


@dataclasses.dataclass(frozen=True)
class Measures:
    """What the run measures: its throughput, the FP8 monitor, the features that took effect."""

    throughput: Throughput
    monitor: FP8Monitor | None
    """None: monitor off, nothing hooked."""
    effects: dict[str, typing.Any]


def open_run(plan_path: str, *, own_folder: bool = False) -> Run:
    """Read the plan, join the process group, hold train.output_dir (`own_folder`: rank 0 takes or joins the
    run's lock; where another run holds it, every rank stops with exit 3) and decide where the run resumes
    from (before building anything). Returns the Run."""
    from launcher.planning.plan import load_plan
    from launcher.planning.schedule import plan_at
    from launcher.train.checkpoint import CheckpointManager, read_marker
    from launcher.train.parallel import distributed

    plan_dir = os.path.dirname(os.path.abspath(plan_path))
    plan = _load(plan_path, load_plan)
    spec_dir = os.path.normpath(os.path.join(plan_dir, plan.spec_dir))
    env = distributed.init(plan.launch.device, cpu_tensors=distributed.holds_cpu_tensors(plan))
    distributed.check_world(plan.world_size, env)
    if own_folder:
        _own_folder(plan.train.output_dir, env)
    t = plan.train
    checkpoints = CheckpointManager.for_plan(plan, rank=env.rank, world_size=env.world_size)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    # A torchrun restart of this job continues it: checkpoints there now are its own earlier attempt's
    # ("never" refused to start over another run's checkpoints at the first attempt).
    choice = checkpoints.choose_resume("auto" if restart and t.resume == "never" else t.resume)  # before building anything
    for note in choice.notes(_shown) if env.is_main else ():  # each damaged checkpoint skipped, one line each
        print(f"warning: {note}", file=sys.stderr, flush=True)
    resume = choice.path
    # [[precision.schedule]]: the model is built in the precision of the next step to train
    marker = read_marker(resume) if resume else None  # (an unreadable one is reported when the checkpoint loads)
    phase = plan_at(plan, (int(marker["step"]) if marker else 0) + 1)
    return Run(plan=plan, plan_dir=plan_dir, spec_dir=spec_dir, env=env, layout=plan.distributed.layout(env.world_size),
               checkpoints=checkpoints, restart=restart, resume=resume, phase=phase)


def build_model(run: Run) -> Model:
    """Build train.model on the meta device (seeded alike on every rank), materialised here already where
    the precision backend needs the weights to convert it. Returns the Model."""
    import torch

    from launcher.train.flops import flops_per_token
    from launcher.train.materialize import Pending, needs_weights_before_precision
    from launcher.train.models import build_for_run
    from launcher.train.precision import select

    plan, t, env = run.plan, run.plan.train, run.env
    torch.manual_seed(t.seed)  # models that build with their weights (opt-outs) draw the same ones on every rank
    # Built on the meta device: no rank holds the whole model before it is sharded (launcher/train/materialize.py).
    model, initializer = build_for_run(t.model, run.spec_dir)
    flops = flops_per_token(model, t.seq_len)
    parameters = sum(p.numel() for p in model.parameters())
    pending = None
    if initializer is not None:
        # A resumed run skips random initialisation: the checkpoint sets every tensor.
        pending = Pending(None if run.resume else initializer, seed=t.seed, draw_on=env.device)  # a GPU run draws on its GPU
        if needs_weights_before_precision(plan):  # TE / MS-AMP copy weights while converting
            pending(model, env.device)
            pending = None
    # planning warned already where it knows the names (builtin:, hf:); a py: model's are known from here on
    unmatched = select.unmatched_rules(model, plan) if t.model.startswith("py:") else {}  # builtin / hf: plan warned already
    return Model(module=model, initializer=initializer, pending=pending, flops=flops, parameters=parameters, unmatched=unmatched)


def convert_precision(run: Run, model: Model) -> Precision:
    """Convert the model to the precision of the run's phase (and its parameters to bf16 where they are the
    master weights), before any engine wraps it. Returns the Precision."""
    from launcher.train.precision import apply_precision

    precision = apply_precision(model.module, run.phase.plan, run.env.device)
    if run.plan.precision.master_weights == "bf16":  # the parameters are the master weights: bf16 before the engine wraps them
        from launcher.train.precision.master_weights import cast_master_weights

        cast_master_weights(model.module)
    return precision


def build_engine(run: Run, model: Model, precision: Precision) -> Engine:
    """Cut this rank's pipeline stage out of the model (distributed.pipeline_parallel), wrap the blocks for activation
    checkpointing and torch.compile, then the model in the plan's engine (which gives it storage and its initial weights
    where still pending). Returns the Engine."""
    from launcher.train.compile_ac import prepare_blocks
    from launcher.train.engines import wrap

    layout, cut = run.layout, None
    if layout.pp > 1:  # this rank's pipeline stages, cut from the whole model once its precision chose every layer's recipe
        from launcher.train.models import transformer_blocks
        from launcher.train.parallel.pipeline import cut_stage, split_for

        cut = cut_stage(model.module, layout.stages_of(run.env.rank), split_for(layout, len(transformer_blocks(model.module))))
    blocks = prepare_blocks(model.module, run.plan, precision, run.env.device)
    return wrap(model.module, run.plan, precision, run.plan_dir, env=run.env, layout=layout, blocks=blocks, pending=model.pending,
                cut=cut)


def build_data(run: Run, vocab_size: int) -> Data:
    """Seed this rank's random generator (from here on the ranks draw differently), then open this rank's
    training batches and, where eval.enabled, its first evaluation stream. Returns the Data."""
    import torch

    from launcher.train.data import build_data as open_stream

    plan, t, env = run.plan, run.plan.train, run.env
    torch.manual_seed(t.seed + env.rank)
    dp_rank, dp_size = run.layout.data_rank(env.rank)  # TP, CP groups, a pipeline's stages: same batches
    data = open_stream(t.data, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, vocab_size=vocab_size,
                       rank=dp_rank, world_size=dp_size, seed=t.seed, spec_dir=run.spec_dir, tokenizer=t.tokenizer)
    eval_data = first_eval = None
    if plan.eval.enabled:
        from launcher.train.evaluate import eval_stream

        eval_data = functools.partial(eval_stream, plan, vocab_size=vocab_size, dp_rank=dp_rank, dp_size=dp_size,
                                      spec_dir=run.spec_dir)
        first_eval = eval_data()  # a bad eval.data stops the run here, before step 1, not at the first evaluation
    return Data(train=data, eval_stream=eval_data, first_eval=first_eval)


def restore(run: Run, engine: Engine, data: Data) -> tuple[TrainState, LoadedState | None]:
    """Make the loop's TrainState and, when resuming, load the checkpoint into it (the random state last).
    Returns (TrainState, what was loaded or None)."""
    from launcher.train.loop import TrainState

    state = TrainState(engine=engine, data=data.train)
    # After the engine and the data exist, before the logger (it starts at the restored step); it sets the RNG last.
    loaded = run.checkpoints.restore_train_state(state, run.resume) if run.resume else None
    return state, loaded


def measure(run: Run, model: Model, precision: Precision, engine: Engine, state: TrainState) -> Measures:
    """Set up the throughput and the FP8 monitor, read what took effect from the live objects, and stop
    (exit 3) where a feature the spec asked for did not. Returns the Measures."""
    from launcher.train import effects
    from launcher.train.metrics import throughput_for
    from launcher.train.monitor import build_monitor

    plan, env = run.plan, run.env
    throughput = throughput_for(plan, env, model.flops)
    monitor = build_monitor(plan, precision, model.module, is_main=env.is_main, start_step=state.step)  # None: monitor off, nothing hooked
    # What took effect, read from the live objects; a requested feature that did not stops here (exit 3).
    measured = effects.measure(engine, fp8_modules=effects.fp8_module_ids(engine.module, precision), monitor=monitor)
    effects.check(run.phase.plan, measured, engine.module, env.device)
    return Measures(throughput=throughput, monitor=monitor, effects=measured)


def start_metrics(run: Run, model: Model, precision: Precision, engine: Engine, state: TrainState,
                  loaded: LoadedState | None, measures: Measures, *, stream=None) -> MetricsLogger:
    """Open the metrics logger and its trackers (rank 0) and write the start record and the lines that
    describe the run. Returns the MetricsLogger, open: the caller closes it."""
    from launcher.planning.schedule import phases
    from launcher.train import effects
    from launcher.train.metrics import MetricsLogger, start_record
    from launcher.train.parallel.tensor_parallel import tp_line, tp_report
    from launcher.train.precision.switch import phase_label

    plan, t, env, measured = run.plan, run.plan.train, run.env, measures.effects
    # [log] trackers, rank 0 only, opened by logger.start: a resumed run continues the tracked runs its checkpoint names
    from launcher.train.metrics.trackers import build_trackers

    logger = MetricsLogger(output_dir=t.output_dir, enabled=env.is_main, total_steps=t.steps, start_step=state.step, stream=stream,
                           trackers=build_trackers(plan, enabled=env.is_main), tracker_ids=state.tracker_ids)
    record = start_record(plan, env, precision.report, measures.throughput, parameters=model.parameters, start_step=state.step)
    record["effects"] = measured
    record["layers"] = effects.layer_precisions(engine.module, precision)
    record["resumed_from"] = loaded.path if loaded else None
    record["restart_count"] = run.restart
    if plan.precision.schedule:
        record["precision_phase"] = run.phase.index
        record["precision_schedule"] = [{"phase": p.index, "first_step": p.first_step, "precision": phase_label(p)} for p in phases(plan)]
    line = precision.report.line() + "\n" + effects.effects_line(measured)
    tp = tp_report(engine.module, plan, async_tp=measured["async_tp"])
    record["tensor_parallel"] = tp
    if tp:
        line += "\n" + tp_line(tp)
    from launcher.train.parallel.expert_parallel import ep_line, ep_report

    record["expert_parallel"] = ep = ep_report(engine.module, plan.distributed.expert_parallel)
    if ep:
        line += "\n" + ep_line(ep)
    if loaded:
        line += f"\nresumed from {_shown(loaded.path)} at step {loaded.step}"
        if run.restart:
            line += f" (torchrun restart {run.restart} of {plan.launch.max_restarts})"
    logger.start(record, line)
    return logger


def link_trackers(state: TrainState, logger: MetricsLogger, monitor: FP8Monitor | None) -> None:
    """Point what reports to the open trackers at them: their run ids go into every checkpoint from here on,
    the monitor's underflow / overflow summary of each sample goes to them."""
    state.tracker_ids = logger.tracker_ids()  # into every checkpoint from here on
    if monitor is not None:
        monitor.sink = logger.track  # each sample's underflow / overflow summary to the trackers


def print_warnings(run: Run, model: Model, precision: Precision, monitor: FP8Monitor | None,
                   loaded: LoadedState | None) -> None:
    """Print (rank 0, to stderr) what the user should know before step 1: the checkpoint's warnings, the
    weights files' notes, precision rules that match no layer, layers the FP8 monitor does not watch."""
    from launcher.errors import with_fix
    from launcher.planning.rules import RULES_BY_ID
    from launcher.train.monitor import unwatched_note

    plan, env = run.plan, run.env
    if loaded and env.is_main:
        for warning in loaded.warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    if not run.resume and env.is_main:  # weights files that lack parameters, or hold tensors the model has no place for
        for note in getattr(model.initializer, "notes", ()):
            print(f"warning: {note}", file=sys.stderr, flush=True)
    for rule_id, globs in model.unmatched.items() if env.is_main else ():
        rule, key = RULES_BY_ID[rule_id], "precision.rules" if rule_id == "PRECISION-RULE-UNMATCHED" else "precision.keep"
        print(f"warning[{rule.id}]: " + with_fix(f"{key} {', '.join(map(repr, globs))} match no layer of this model", rule.fix),
              file=sys.stderr, flush=True)
    note = unwatched_note(plan, precision, monitor)
    if note and env.is_main:
        print(note, file=sys.stderr, flush=True)


def make_trainer(run: Run, engine: Engine, precision: Precision, state: TrainState, data: Data, measures: Measures,
                 logger: MetricsLogger, loaded: LoadedState | None) -> Trainer:
    """Assemble the step callbacks (checkpoints, evaluation, the FP8 monitor, the precision schedule's switch,
    the profiler, in that order) and the Trainer. Returns the Trainer, ready for its first step."""
    from launcher.train.loop import Trainer
    from launcher.train.precision.switch import PrecisionSwitch

    plan, env, monitor = run.plan, run.env, measures.monitor
    callbacks = [run.checkpoints.callback]
    if data.eval_stream is not None:  # before the monitor's callback, which arms its hooks for the next step (paused while evaluating)
        from launcher.train.evaluate import Evaluator

        callbacks.append(Evaluator(plan, engine, logger, device=env.device, world_size=env.world_size,
                                   make_stream=data.eval_stream, stream=data.first_eval, monitor=monitor))
    callbacks += [monitor] if monitor is not None else []
    if plan.precision.schedule:  # after the checkpoint: a checkpoint at a phase's last step holds that phase
        callbacks.append(PrecisionSwitch(plan, engine.module, logger, start_step=state.step))
    from launcher.train.profiling import StepProfiler

    profiler = StepProfiler.from_env(plan, engine.module, precision, env.device, is_main=env.is_main, start_step=state.step)
    if profiler is not None:  # `fp8launch run --profile N`: last, so that the steps it records are whole
        callbacks.append(profiler)
    return Trainer(state, plan, device=env.device, logger=logger, throughput=measures.throughput, callbacks=callbacks,
                   checkpoints=run.checkpoints, resumed_from=loaded.path if loaded else None)


def _shown(path: str) -> str:
    """A path as the user would type it: relative to the current directory when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _own_folder(output_dir: str, env: DistEnv) -> None:
    """Rank 0 holds the folder's lock for this process's life (launcher/targets/runlock.py); its refusal stops every rank."""
    import torch

    from launcher.errors import EnvironmentProblem
    from launcher.targets import runlock
    from launcher.train.parallel.distributed import all_reduce_sum

    refused = None
    if env.rank == 0:
        try:
            held = runlock.for_worker(output_dir)
        except EnvironmentProblem as e:
            refused = e
        else:
            if held is not None and held.warning:
                print(held.warning, file=sys.stderr, flush=True)
    flag = all_reduce_sum(torch.tensor([1.0 if refused else 0.0], device=env.device))
    if refused is not None:
        raise refused
    if flag.item() > 0:
        raise EnvironmentProblem(f"train.output_dir {output_dir} is in use by another run (rank 0 says which)")


def _load(plan_path: str, load_plan):
    try:
        return load_plan(plan_path)
    except FileNotFoundError:
        raise LauncherError(f"{plan_path} does not exist; fix: write it with `fp8launch plan SPEC`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise LauncherError(f"{plan_path} is not a plan fp8launch can read ({e}); fix: regenerate it with `fp8launch plan SPEC`") from None
