"""The in-place precision switch: Float8Linear layers back to nn.Linear at a phase's first step, with the same
Parameter objects (the optimizer's state carries over), a `precision` event, and nothing else touched."""

from __future__ import annotations

import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from launcher.train.loop import TrainState
from launcher.train.precision import apply_precision
from launcher.train.precision.switch import PrecisionSwitch

from ._precision import TinyLlama, fp8_plan, lm_loss


class Events:
    def __init__(self):
        self.records, self.lines = [], []

    def event(self, record, line):
        self.records.append(record)
        self.lines.append(line)


def test_the_switch_takes_fp8_layers_back_keeping_parameters_and_optimizer_state():
    plan = fp8_plan(torchao={"skip_small": False}, schedule=[{"at_step": 3, "keep_last_blocks": 1}, {"at_step": 5, "mode": "bf16"}])
    model = TinyLlama()
    precision = apply_precision(model, plan, torch.device("cpu"))
    params = {n: p for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with precision.autocast():
        lm_loss(model, torch.randint(0, 256, (2, 33))).backward()
    opt.step()
    moments = {n: opt.state[p]["exp_avg"].clone() for n, p in params.items()}
    events, state = Events(), TrainState(engine=None, data=iter(()))
    switch = PrecisionSwitch(plan, model, events, start_step=0)
    fp8 = lambda: sorted(f for f, m in model.named_modules() if isinstance(m, Float8Linear))  # noqa: E731
    assert len(fp8()) == 13
    state.step = 1
    switch(state)  # step 2 is still phase 0
    assert events.records == [] and len(fp8()) == 13
    state.step = 2
    switch(state)  # step 3 starts phase 1: the last block (layers.1) back to bf16
    assert fp8() == [f for f in fp8() if f.startswith("layers.0.")] and len(fp8()) == 6
    assert events.records[0]["to_high_precision"] == [f"layers.1.{n}" for n in (
        "attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")]
    assert (events.records[0]["step"], events.records[0]["phase"], events.records[0]["fp8_layers"], state.precision_phase) == (3, 1, 6, 1)
    state.step = 4
    switch(state)
    assert fp8() == [] and events.records[1]["precision"] == "bf16" and events.lines[1].startswith("precision: from step 5: bf16")
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    assert {n: p for n, p in model.named_parameters()} == params  # the same Parameter objects
    assert all(torch.equal(opt.state[p]["exp_avg"], moments[n]) for n, p in params.items())
    with precision.autocast():
        lm_loss(model, torch.randint(0, 256, (2, 33))).backward()  # trains on in bf16
    opt.step()


def _grads(model, tokens, precision):
    model.zero_grad()
    with precision.autocast():
        loss = lm_loss(model, tokens)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_into_fp8_and_between_recipes_in_place_computes_what_a_fresh_conversion_computes():
    """bf16 -> tensorwise (all but the last block) -> rowwise everywhere: after each switch, the same Parameters give
    the loss and gradients (bit for bit) of a model converted by apply_torchao with that phase's plan: the run that
    resumes in a phase is built that way."""
    import copy

    schedule = [{"at_step": 3, "mode": "fp8", "keep_last_blocks": 1}, {"at_step": 5, "recipe": "rowwise", "keep_last_blocks": 0}]
    plan = fp8_plan(mode="bf16", torchao={"skip_small": False}, schedule=schedule)
    model = TinyLlama()
    precision = apply_precision(model, plan, torch.device("cpu"))
    pristine = copy.deepcopy(model)
    params = dict(model.named_parameters())
    events, state = Events(), TrainState(engine=None, data=iter(()))
    switch = PrecisionSwitch(plan, model, events, start_step=0)
    tokens = torch.randint(0, 256, (2, 33))
    from launcher.planning.schedule import phases

    for step, phase in ((2, phases(plan)[1]), (4, phases(plan)[2])):
        state.step = step
        switch(state)
        fresh = copy.deepcopy(pristine)
        fresh_precision = apply_precision(fresh, phase.plan, torch.device("cpu"))
        assert {n: type(m).__name__ for n, m in model.named_modules()} == {n: type(m).__name__ for n, m in fresh.named_modules()}
        loss, grads = _grads(model, tokens, precision)
        fresh_loss, fresh_grads = _grads(fresh, tokens, fresh_precision)
        assert torch.equal(loss, fresh_loss) and all(torch.equal(grads[n], fresh_grads[n]) for n in grads)
    recipes = {n: m.config.cast_config_weight.scaling_granularity.name for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert len(recipes) == 13 and set(recipes.values()) == {"AXISWISE"}  # rowwise: per-row (axiswise) scales
    assert dict(model.named_parameters()) == params  # the same Parameter objects throughout
    first, second = events.records
    assert (first["precision"], first["fp8_layers"], first["to_high_precision"]) == ("fp8 torchao tensorwise", 6, [])
    assert second["fp8_layers"] == 13 and set(second["changed"].values()) == {"fp8 rowwise"} and len(second["changed"]) == 13
