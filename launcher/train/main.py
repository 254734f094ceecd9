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
makes every rank finish its step, stop after the same one, write a checkpoint and exit 75; so does
torchrun's death (kill -9 included: each worker asks Linux for a SIGTERM when its parent dies).
Ctrl-C (SIGINT, which torchrun passes on) stops every rank at once, without a checkpoint: exit 130,
one line naming the step reached and the newest complete checkpoint.

A run owns its folder: global rank 0 holds the lock on train.output_dir for its life (it joins the
one `fp8launch run` holds, or takes it where no launcher here does: sbatch, Kubernetes, torchrun.sh
by hand); another run holding it stops every rank before anything is written (exit 3).

Exit codes: 0 done; 2 the plan names something unusable (train.resume included); 3 this
machine cannot run the plan, or a checkpoint cannot be written; 4 the loss diverged (non-finite
loss or gradient norm; the message names the step, the last complete checkpoint and the likely
causes); 75 preempted: stopped by SIGTERM after a complete checkpoint, run the same command
again to continue; 130 interrupted (Ctrl-C). A user-facing error is printed once, as one line,
without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing

from launcher.errors import LauncherError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="plan.json written by `fp8launch plan` or `fp8launch run`")
    args = parser.parse_args(argv)
    from launcher.train import quiet
    from launcher.train.checkpoint import preempt

    quiet.install()  # known-harmless library messages, dropped by their exact text
    preempt.install()  # before importing torch: a SIGTERM from now on asks for a clean stop
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # a torchrun worker, in a session of its own: torchrun's death stops it too
        preempt.follow_parent()
    _forget_exit_code_of_earlier_attempt()
    from launcher.train.parallel import distributed

    try:
        return train(args.plan)
    except LauncherError as e:
        e = _disk_full(e, args.plan) or e
        _report(e, distributed)
        return e.exit_code
    except BaseException as e:
        # a write nothing above named (a rank's own output on a full disk); a Ctrl-C before the first step, or what it
        # caused on its way through
        full = _disk_full(e, args.plan) if isinstance(e, OSError) else None
        if full is not None:
            _report(full, distributed)
            return full.exit_code
        if not preempt.interrupted():
            raise
        stop = preempt.Interrupted("interrupted: Ctrl-C before the first step of this run; run the same command again to start it")
        _report(stop, distributed)
        return stop.exit_code
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
        from launcher.train.parallel import distributed

        distributed.exit_now(code)
    raise SystemExit(code)


def train(plan_path: str) -> int:
    """Run the whole plan in this process (one rank of the job)."""
    from launcher.train.checkpoint import preempt
    from launcher.train.parallel import distributed

    trainer, logger = build_run(plan_path, own_folder=True)
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
    except BaseException:  # a Ctrl-C (or what it caused in a collective a stopped peer left): one line, no traceback
        if preempt.interrupted():
            raise trainer.interrupted() from None
        raise
    finally:
        logger.close()
    return 0


def build_run(plan_path: str, *, stream=None, own_folder: bool = False):
    """Everything up to the first step: process group, model, precision, blocks, engine, data,
    metrics (start record written). Returns (Trainer, MetricsLogger); close the logger after.
    Each step is in launcher/train/build.py; their order matters (see there). `own_folder`: rank 0
    holds the run's lock on train.output_dir for this process's life (the entrypoint's runs)."""
    from launcher.train import build

    run = build.open_run(plan_path, own_folder=own_folder)  # the plan read, the process group joined, the folder held, the resume chosen
    model = build.build_model(run)
    precision = build.convert_precision(run, model)
    engine = build.build_engine(run, model, precision)
    data = build.build_data(run, model.module.vocab_size)
    state, loaded = build.restore(run, engine, data)
    measures = build.measure(run, model, precision, engine, state)  # exit 3 where a requested feature did not take effect
    logger = build.start_metrics(run, model, precision, engine, state, loaded, measures, stream=stream)
    try:  # from here on the trackers are open: a failure before the Trainer exists closes them (the caller closes them after)
        build.link_trackers(state, logger, measures.monitor)
        build.print_warnings(run, model, precision, measures.monitor, loaded)
        trainer = build.make_trainer(run, engine, precision, state, data, measures, logger, loaded)
    except BaseException:
        logger.close()
        raise
    return trainer, logger


def _record_exit_code(code: int) -> None:
    """Leave the exit code where `fp8launch run` (and slurm.sbatch) look: torchrun itself exits 1
    whatever its workers' codes. The first rank to write wins."""
    from launcher.errors import EXIT_FILE_ENV

    _write_first(os.environ.get(EXIT_FILE_ENV), f"{code}\n")


def _write_first(path: str | None, text: str) -> None:
    """Write `text` to `path` unless a rank has already written it."""
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(text)
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
    """Print the error once for the whole job, and leave its exit code and its line where `fp8launch run` looks
    (the line also where this rank's own output is on a full disk, and the print fails)."""
    from launcher.errors import ERROR_LINE_FILE_ENV

    _record_exit_code(error.exit_code)
    _write_first(os.environ.get(ERROR_LINE_FILE_ENV), f"{error}\n")
    if distributed.first_to_report():
        rank = int(os.environ.get("RANK", 0))
        try:
            print(f"{f'[rank {rank}] ' if rank else ''}{error}", file=sys.stderr, flush=True)
        except OSError:
            pass


def _disk_full(error: BaseException, plan_path: str) -> LauncherError | None:
    """`error` as the one line of a full disk with the newest complete checkpoint of the run, where it is one (an OSError
    ENOSPC or EDQUOT, or a DiskFull raised where the checkpoints were not known); None otherwise."""
    from launcher.targets.disk import DiskFull, no_space

    if isinstance(error, DiskFull) and error.checkpoints:
        return error
    if not isinstance(error, DiskFull) and not (isinstance(error, OSError) and no_space(error)):
        return None
    from launcher.planning.plan import load_plan
    from launcher.train.checkpoint import CheckpointManager

    try:
        output_dir = load_plan(plan_path).train.output_dir
        newest = CheckpointManager(output_dir, keep=1, strategy="ddp", rank=0, world_size=1).latest_complete()
    except (LauncherError, OSError, ValueError):
        return error if isinstance(error, DiskFull) else DiskFull(getattr(error, "filename", None) or ".")
    path = error.path if isinstance(error, DiskFull) else (error.filename or output_dir)
    return DiskFull(os.fspath(path), checkpoints=True, newest=newest)


if __name__ == "__main__":  # pragma: no cover
    run_process()
