"""Held-out evaluation (`[eval]`): the mean next-token loss on batches the run never trains on.

The fair way to compare FP8 with bf16 is the loss on data neither trained on: the training loss of
the last step is one noisy batch, and it is the batch the precision just fitted. Every `eval.every`
steps (0: once, after the last step) the model runs `eval.steps` batches of `eval.data` per
data-parallel rank, forward only, in the precision the step just trained in, and rank 0 writes

    {"event": "eval", "step": N, "eval_loss": ..., "eval_perplexity": ..., "eval_tokens": ..., "eval_time_s": ...}

to metrics.jsonl (and to the trackers of [log]), with a line in the run's output.

The same batches every time: the stream is put back to its start at each evaluation (its saved start
position; a `py:` factory's stream is built again), so the curve
compares one model's steps (and an FP8 run with its bf16 twin) on identical tokens. `eval.data =
"synthetic"` draws from the training stream's pattern but from generators no rank trains on
(SyntheticStream's per-rank seeds, offset by HELD_OUT_STREAM): held out, and learnable. An
evaluation changes nothing a resumed run depends on: no optimizer state, no data position, and the
random state is restored afterwards, so a run with [eval] trains bit-identically to one without.
"""

from __future__ import annotations

import contextlib
import math
import time
import typing

import torch

from launcher.train.parallel.distributed import all_reduce_sum
from launcher.train.rng import rng_state, set_rng_state

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.engines import Engine
    from launcher.train.metrics import MetricsLogger

HELD_OUT_STREAM = 1 << 20
"""SyntheticStream rank offset of evaluation batches: far above any data-parallel rank that trains."""


def eval_stream(plan: Plan, *, vocab_size: int, dp_rank: int, dp_size: int, spec_dir: str):
    """A fresh stream of `eval.data` for this data-parallel rank, at its start."""
    from launcher.train.data import SyntheticStream, build_data

    t, source = plan.train, plan.eval.data
    if source == "synthetic":
        return SyntheticStream(seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, vocab_size=vocab_size,
                               rank=HELD_OUT_STREAM + dp_rank, seed=t.seed)
    return build_data(source, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, vocab_size=vocab_size,
                      rank=dp_rank, world_size=dp_size, seed=t.seed, spec_dir=spec_dir, tokenizer=t.tokenizer,
                      key="eval.data")


def eval_record(step: int, loss: float, *, tokens: int, seconds: float) -> dict[str, typing.Any]:
    """The metrics.jsonl record of one evaluation; perplexity is exp(loss) (null where it overflows)."""
    perplexity = math.exp(loss) if math.isfinite(loss) and loss < 700 else None
    return {"event": "eval", "step": step, "eval_loss": loss, "eval_perplexity": perplexity, "eval_tokens": tokens,
            "eval_time_s": seconds}


def eval_line(record: dict[str, typing.Any], total_steps: int) -> str:
    ppl = "n/a" if record["eval_perplexity"] is None else f"{record['eval_perplexity']:.4g}"
    return (f"eval after step {record['step']}/{total_steps} | eval loss {record['eval_loss']:.4f} | perplexity {ppl} | "
            f"{record['eval_tokens']:,} tokens in {record['eval_time_s']:.2f} s")


class Evaluator:
    """The loop's callback that evaluates after the steps `eval.every` names (and the last one).

    `make_stream()` builds this rank's eval stream at its start (`stream`: one it built already); `monitor`
    (optional) is paused while evaluating, so that the FP8 numerics of training steps are not mixed with
    evaluation batches."""

    def __init__(self, plan: Plan, engine: Engine, logger: MetricsLogger, *, device: torch.device, world_size: int,
                 make_stream: typing.Callable[[], typing.Iterator[torch.Tensor]], stream=None, monitor=None):
        self.plan, self.engine, self.logger = plan, engine, logger
        self.device, self.world_size = device, world_size
        self.make_stream = make_stream
        self.monitor = monitor
        self._stream = stream
        self._start = stream.state_dict() if stream is not None else None
        self.last: dict[str, typing.Any] | None = None
        """The newest evaluation's record (the run's end record repeats its eval_loss)."""

    def __call__(self, state) -> None:
        if self.plan.eval.due(state.step, self.plan.train.steps):
            self.evaluate(state.step)

    def evaluate(self, step: int) -> dict[str, typing.Any]:
        """Run eval.steps batches on every rank; the global mean loss, logged on rank 0."""
        t0 = time.perf_counter()
        model = self.engine.model
        was_training = model.training
        saved_rng = rng_state()
        stream = self._rewound()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        pause = self.monitor.paused() if self.monitor is not None else contextlib.nullcontext()
        try:
            model.eval()
            with pause, torch.no_grad():
                for _ in range(self.plan.eval.steps):
                    loss_sum += self._loss(stream)
        finally:
            model.train(was_training)
            set_rng_state(saved_rng)
        # Every rank's mean over its batches, averaged over all ranks (a tensor-parallel group's ranks hold
        # the same batches and the same loss: the mean is unchanged), as the training loss is; under pipeline
        # parallelism over the last stage's ranks (the others add 0).
        loss = all_reduce_sum(loss_sum / self.plan.eval.steps).item() / self.engine.loss_ranks
        t = self.plan.train
        tokens = self.plan.eval.steps * t.micro_batch_size * self.engine.eval_batches * t.seq_len * self.plan.distributed.data_parallel
        record = eval_record(step, loss, tokens=tokens, seconds=time.perf_counter() - t0)
        self.logger.event(record, eval_line(record, self.plan.train.steps))
        self.last = record
        return record

    def _loss(self, stream) -> torch.Tensor:
        """This rank's loss of one evaluation step, forward only (0 on a pipeline stage that does not hold the loss)."""
        tokens = torch.cat([next(stream) for _ in range(self.engine.eval_batches)]).to(self.device, non_blocking=True)
        return self.engine.eval_loss(tokens)

    def _rewound(self):
        """The eval stream at its start: the one built before, put back (a corpus is read and tokenized once), or a
        fresh one (a user factory's iterator may not rewind)."""
        from launcher.train.data import FactoryStream

        if self._stream is None or isinstance(self._stream, FactoryStream):
            self._stream = self.make_stream()
            self._start = self._stream.state_dict()
        else:
            self._stream.load_state_dict(self._start)
        return self._stream

    def summary(self) -> dict[str, typing.Any]:
        """Fields for the run's end record."""
        if self.last is None:
            return {}
        return {"eval_loss": self.last["eval_loss"], "eval_step": self.last["step"]}
