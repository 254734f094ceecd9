"""The shared training entrypoint: `python -m launcher.train --plan DIR/plan.json`.

It reads a plan written by `fp8launch plan` (or `fp8launch run`, which plans into
`<train.output_dir>/plan/` and starts this through torchrun for you), then: joins the
process group -> builds the model on the meta device -> applies the precision backend -> wraps the
blocks for activation checkpointing and torch.compile -> wraps the model in DDP / FSDP2 / DeepSpeed
(FSDP2 with distributed.tensor_parallel: tensor parallel first, then FSDP2 over the data-parallel
dimension), which gives each rank storage for only its part and initialises it (skipped when resuming) ->
resumes from a checkpoint (train.resume) -> measures what took effect on the live objects and stops
(exit 3) where a feature the spec asked for did not (launcher/train/effects.py) -> trains and logs (rank 0 writes
<train.output_dir>/metrics.jsonl) -> checkpoints every train.checkpoint_every steps and after
the last one (docs/checkpoints.md) -> with monitor.fp8_stats_every > 0, samples the FP8 casts
of every FP8 layer into <train.output_dir>/fp8_stats.jsonl (docs/monitor.md).

The job torchrun starts must be the one the plan describes (distributed.nodes x
procs_per_node processes): the generated torchrun.sh and slurm.sbatch start exactly that.

One GPU:
    torchrun --standalone --nproc-per-node 1 -m launcher.train --plan generated/NAME/plan.json
One node, 8 GPUs:
    torchrun --standalone --nproc-per-node 8 -m launcher.train --plan generated/NAME/plan.json
    # or: generated/NAME/torchrun.sh   (or: fp8launch run spec.toml)
Several nodes (on every node, node 0's address as the rendezvous):
    NODE_RANK=$i RDZV_ENDPOINT=node0:29500 generated/NAME/torchrun.sh
    # or: fp8launch run spec.toml --nodes 4 --node-rank $i --rdzv-endpoint node0:29500
    # or, under SLURM: sbatch generated/NAME/slurm.sbatch   (or: fp8launch run spec.toml)

A restarted or preempted run continues where it stopped: torchrun's --max-restarts
(launch.max_restarts) restarts the workers after a failure and they resume from the newest
complete checkpoint; SIGTERM (SLURM's --signal, scancel, an eviction; torchrun passes it on)
makes every rank finish its step, stop after the same one, write a checkpoint and exit 75.

Exit codes: 0 done; 2 the plan names something unusable (train.resume included); 3 this
machine cannot run the plan, or a checkpoint cannot be written; 4 the loss diverged (non-finite
loss or gradient norm; the message names the step, the last complete checkpoint and the likely
causes); 75 preempted: stopped by SIGTERM after a complete checkpoint, run the same command
again to continue. A user-facing error is printed once, as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import typing

from launcher.errors import LauncherError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="plan.json written by `fp8launch plan` or `fp8launch run`")
    args = parser.parse_args(argv)
    from launcher.train import preempt, quiet

    quiet.install()  # known-harmless library messages, dropped by their exact text
    preempt.install()  # before importing torch: a SIGTERM from now on asks for a clean stop
    _forget_exit_code_of_earlier_attempt()
    from launcher.train import distributed

    try:
        return train(args.plan)
    except LauncherError as e:
        _report(e, distributed)
        return e.exit_code
    finally:
        _leave(distributed)


_GLOO = False
"""Whether this process used a gloo process group (see `run_process`)."""


def _leave(distributed) -> None:
    global _GLOO
    import torch.distributed as dist

    _GLOO = _GLOO or (dist.is_initialized() and "gloo" in str(dist.get_backend()))  # also "cpu:gloo,cuda:nccl"
    distributed.destroy()


def run_process(argv: list[str] | None = None) -> typing.NoReturn:
    """`python -m launcher.train`: `main`, then exit with its code; after a gloo run without
    finalizing the interpreter (`distributed.exit_now`: gloo's threads abort it otherwise). Everything
    this process wrote is closed by then (metrics closed, checkpoint files fsynced)."""
    code = main(argv)
    if _GLOO:
        from launcher.train import distributed

        distributed.exit_now(code)
    raise SystemExit(code)


def train(plan_path: str) -> int:
    """Run the whole plan in this process (one rank of the job)."""
    from launcher.train import distributed, preempt

    trainer, logger = build_run(plan_path)
    try:
        trainer.run()
    except preempt.Preempted as e:
        # Every rank has the complete checkpoint; each records the exit code before any of them exits
        # (srun --kill-on-bad-exit stops the other nodes as soon as one task exits non-zero).
        _record_exit_code(e.exit_code)
        try:
            distributed.barrier()
        except RuntimeError:  # a rank already gone (its node stopped): the checkpoint is complete all the same
            pass
        raise
    finally:
        logger.close()
    return 0


def build_run(plan_path: str, *, stream=None):
    """Everything up to the first step: process group, model, precision, blocks, engine, data,
    metrics (start record written). Returns (Trainer, MetricsLogger); close the logger after."""
    import torch

    from launcher.planning.plan import load_plan
    from launcher.train import distributed, effects
    from launcher.train.checkpoint import CheckpointManager
    from launcher.train.compile_ac import prepare_blocks
    from launcher.train.data import build_data
    from launcher.train.engines import wrap
    from launcher.train.flops import flops_per_token
    from launcher.train.loop import Trainer, TrainState
    from launcher.train.metrics import MetricsLogger, start_record, throughput_for
    from launcher.train.materialize import Pending, needs_weights_before_precision
    from launcher.train.models import build_for_run
    from launcher.train.monitor import build_monitor, unwatched_note
    from launcher.errors import with_fix
    from launcher.planning.rules import RULES_BY_ID
    from launcher.planning.schedule import phases, plan_at
    from launcher.train.checkpoint import read_marker
    from launcher.train.precision import apply_precision, select
    from launcher.train.precision.switch import PrecisionSwitch, phase_label
    from launcher.train.tensor_parallel import tp_line, tp_report

    plan_dir = os.path.dirname(os.path.abspath(plan_path))
    plan = _load(plan_path, load_plan)
    spec_dir = os.path.normpath(os.path.join(plan_dir, plan.spec_dir))
    env = distributed.init(plan.launch.device, cpu_tensors=distributed.holds_cpu_tensors(plan))
    distributed.check_world(plan.world_size, env)
    t = plan.train
    checkpoints = CheckpointManager.for_plan(plan, rank=env.rank, world_size=env.world_size)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    # A torchrun restart of this job continues it: checkpoints there now are its own earlier attempt's
    # ("never" refused to start over another run's checkpoints at the first attempt).
    resume = checkpoints.resolve_resume("auto" if restart and t.resume == "never" else t.resume)  # before building anything
    # [[precision.schedule]]: the model is built in the precision of the next step to train
    marker = read_marker(resume) if resume else None  # (an unreadable one is reported when the checkpoint loads)
    phase = plan_at(plan, (int(marker["step"]) if marker else 0) + 1)

    torch.manual_seed(t.seed)  # models that build with their weights (opt-outs) draw the same ones on every rank
    # Built on the meta device: no rank holds the whole model before it is sharded (launcher/train/materialize.py).
    model, initializer = build_for_run(t.model, spec_dir)
    flops = flops_per_token(model, t.seq_len)
    parameters = sum(p.numel() for p in model.parameters())
    pending = None
    if initializer is not None:
        # A resumed run skips random initialisation: the checkpoint sets every tensor.
        pending = Pending(None if resume else initializer, seed=t.seed)
        if needs_weights_before_precision(plan):  # TE / MS-AMP copy weights while converting
            pending(model, env.device)
            pending = None
    # planning warned already where it knows the names (builtin:, hf:); a py: model's are known from here on
    unmatched = select.unmatched_rules(model, plan) if t.model.startswith("py:") else {}  # builtin / hf: plan warned already
    precision = apply_precision(model, phase.plan, env.device)
    if plan.precision.master_weights == "bf16":  # the parameters are the master weights: bf16 before the engine wraps them
        from launcher.train.optim_lowbit import cast_master_weights

        cast_master_weights(model)
    blocks = prepare_blocks(model, plan, precision)
    engine = wrap(model, plan, precision, plan_dir, env=env, blocks=blocks, pending=pending)
    torch.manual_seed(t.seed + env.rank)
    dp_rank, dp_size = distributed.data_rank(env, plan.distributed.tensor_parallel)  # a TP group reads the same batches
    data = build_data(t.data, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, vocab_size=model.vocab_size,
                      rank=dp_rank, world_size=dp_size, seed=t.seed, spec_dir=spec_dir, tokenizer=t.tokenizer)
    eval_data = first_eval = None
    if plan.eval.enabled:
        from launcher.train.evaluate import eval_stream

        eval_data = functools.partial(eval_stream, plan, vocab_size=model.vocab_size, dp_rank=dp_rank, dp_size=dp_size,
                                      spec_dir=spec_dir)
        first_eval = eval_data()  # a bad eval.data stops the run here, before step 1, not at the first evaluation
    state = TrainState(engine=engine, data=data)
    # After the engine and the data exist, before the logger (it starts at the restored step); it sets the RNG last.
    loaded = checkpoints.restore_train_state(state, resume) if resume else None

    throughput = throughput_for(plan, env, flops)
    monitor = build_monitor(plan, precision, model, is_main=env.is_main, start_step=state.step)  # None: monitor off, nothing hooked
    # What took effect, read from the live objects; a requested feature that did not stops here (exit 3).
    measured = effects.measure(engine, fp8_modules=effects.fp8_module_ids(engine.module, precision), monitor=monitor)
    effects.check(phase.plan, measured, engine.module, env.device)
    # [log] trackers, rank 0 only, opened by logger.start: a resumed run continues the tracked runs its checkpoint names
    from launcher.train.trackers import build_trackers

    logger = MetricsLogger(output_dir=t.output_dir, enabled=env.is_main, total_steps=t.steps, start_step=state.step, stream=stream,
                           trackers=build_trackers(plan, enabled=env.is_main), tracker_ids=state.tracker_ids)
    record = start_record(plan, env, precision.report, throughput, parameters=parameters, start_step=state.step)
    record["effects"] = measured
    record["layers"] = effects.layer_precisions(engine.module, precision)
    record["resumed_from"] = loaded.path if loaded else None
    record["restart_count"] = restart
    if plan.precision.schedule:
        record["precision_phase"] = phase.index
        record["precision_schedule"] = [{"phase": p.index, "first_step": p.first_step, "precision": phase_label(p)} for p in phases(plan)]
    line = precision.report.line() + "\n" + effects.effects_line(measured)
    tp = tp_report(engine.module, plan, async_tp=measured["async_tp"])
    record["tensor_parallel"] = tp
    if tp:
        line += "\n" + tp_line(tp)
    from launcher.train.expert_parallel import ep_line, ep_report

    record["expert_parallel"] = ep = ep_report(engine.module, plan.distributed.expert_parallel)
    if ep:
        line += "\n" + ep_line(ep)
    if loaded:
        line += f"\nresumed from {_shown(loaded.path)} at step {loaded.step}"
        if restart:
            line += f" (torchrun restart {restart} of {plan.launch.max_restarts})"
    logger.start(record, line)
    try:  # from here on the trackers are open: a failure before the Trainer exists closes them (the caller closes them after)
        state.tracker_ids = logger.tracker_ids()  # into every checkpoint from here on
        if monitor is not None:
            monitor.sink = logger.track  # each sample's underflow / overflow summary to the trackers
        if loaded and env.is_main:
            for warning in loaded.warnings:
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        if not resume and env.is_main:  # weights files that lack parameters, or hold tensors the model has no place for
            for note in getattr(initializer, "notes", ()):
                print(f"warning: {note}", file=sys.stderr, flush=True)
        for rule_id, globs in unmatched.items() if env.is_main else ():
            rule, key = RULES_BY_ID[rule_id], "precision.rules" if rule_id == "PRECISION-RULE-UNMATCHED" else "precision.keep"
            print(f"warning[{rule.id}]: " + with_fix(f"{key} {', '.join(map(repr, globs))} match no layer of this model", rule.fix),
                  file=sys.stderr, flush=True)
        note = unwatched_note(plan, precision, monitor)
        if note and env.is_main:
            print(note, file=sys.stderr, flush=True)
        callbacks = [checkpoints.callback]
        if eval_data is not None:  # before the monitor's callback, which arms its hooks for the next step (paused while evaluating)
            from launcher.train.evaluate import Evaluator

            callbacks.append(Evaluator(plan, engine, logger, device=env.device, world_size=env.world_size,
                                       make_stream=eval_data, stream=first_eval, monitor=monitor))
        callbacks += [monitor] if monitor is not None else []
        if plan.precision.schedule:  # after the checkpoint: a checkpoint at a phase's last step holds that phase
            callbacks.append(PrecisionSwitch(plan, engine.module, logger, start_step=state.step))
        from launcher.train.profiling import StepProfiler

        profiler = StepProfiler.from_env(plan, engine.module, precision, env.device, is_main=env.is_main, start_step=state.step)
        if profiler is not None:  # `fp8launch run --profile N`: last, so that the steps it records are whole
            callbacks.append(profiler)
        trainer = Trainer(state, plan, device=env.device, logger=logger, throughput=throughput, callbacks=callbacks,
                          checkpoints=checkpoints, resumed_from=loaded.path if loaded else None)
    except BaseException:
        logger.close()
        raise
    return trainer, logger


def _shown(path: str) -> str:
    """A path as the user would type it: relative to the current directory when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _load(plan_path: str, load_plan):
    try:
        return load_plan(plan_path)
    except FileNotFoundError:
        raise LauncherError(f"{plan_path} does not exist; fix: write it with `fp8launch plan SPEC`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise LauncherError(f"{plan_path} is not a plan fp8launch can read ({e}); fix: regenerate it with `fp8launch plan SPEC`") from None


def _record_exit_code(code: int) -> None:
    """Leave the exit code where `fp8launch run` (and slurm.sbatch) look: torchrun itself exits 1
    whatever its workers' codes. The first rank to write wins."""
    from launcher.errors import EXIT_FILE_ENV

    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(f"{code}\n")
        except OSError:
            pass


def _forget_exit_code_of_earlier_attempt() -> None:
    """After torchrun restarted the workers (launch.max_restarts), the code an earlier attempt left
    is not this attempt's: local rank 0 removes it before this attempt could fail in turn."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0") or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    from launcher.errors import EXIT_FILE_ENV

    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def _report(error: LauncherError, distributed) -> None:
    """Print the error once for the whole job, and leave its exit code where `fp8launch run` looks."""
    _record_exit_code(error.exit_code)
    if distributed.first_to_report():
        rank = int(os.environ.get("RANK", 0))
        print(f"{f'[rank {rank}] ' if rank else ''}{error}", file=sys.stderr, flush=True)


if __name__ == "__main__":  # pragma: no cover
    run_process()
