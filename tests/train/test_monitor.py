"""The FP8 numerics monitor in one process: the math against torchao's own scaling and casts,
the records of a real torchao FP8 training run against tensors captured from it, the warning
for a layer with tiny values and one huge outlier, and nothing hooked with the monitor off."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch import nn

from launcher.train.monitor import STATS_FILE, FP8Monitor, build_monitor
from launcher.train.monitor.alerts import WARN_EVERY_SAMPLES
from launcher.train.monitor.hooks import te_targets
from launcher.train.monitor.stats import Scaling, cast_stats, saturation_threshold, torchao_scale
from launcher.train.precision.torchao_fp8 import torchao_targets

torchao = pytest.importorskip("torchao")
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.float8.float8_utils import amax_to_scale, to_fp8_saturated  # noqa: E402

from tests.support import skip_without_torch_mx  # noqa: E402

from ._engine_setup import CPU, make_plan, tiny_model, token_batches, world_of_one  # noqa: E402


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_hooks) for m in model.modules())


def _monitor_hooks(model: nn.Module) -> int:
    """Hooks whose function is the monitor's (a partial of a Collector method)."""
    from launcher.train.monitor.hooks import Collector

    hooks = [h for m in model.modules() for d in (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks) for h in d.values()]
    return sum(1 for h in hooks if isinstance(getattr(getattr(h, "func", None), "__self__", None), Collector))


# ----------------------------------------------------------------------------- the math

@pytest.mark.parametrize("fmt,dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
@pytest.mark.parametrize("power_of_2", [False, True])
def test_scale_is_torchaos_amax_to_scale(fmt, dtype, power_of_2):
    amax = torch.tensor([3.7e-3, 1.0, 812.5, 0.0])
    ours = torchao_scale(amax, fmt, power_of_2=power_of_2)
    assert torch.equal(ours, amax_to_scale(amax, dtype, round_scales_to_power_of_2=power_of_2))


def test_underflow_counts_nonzero_values_that_flush_to_zero():
    # tensorwise e4m3: scale 448/1000; 1e-6 * 0.448 is far below e4m3's smallest subnormal (2^-9)
    x = torch.tensor([[1000.0, 1e-6, 0.0, 1.0]])
    amax, smin, smax, nonzero, under, over = cast_stats(x, Scaling(fmt="e4m3")).tolist()
    assert (amax, nonzero, under, over) == (1000.0, 3, 1, 0)
    assert smin == smax == pytest.approx(0.448)


@pytest.mark.parametrize("fmt,dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_flush_and_saturation_agree_with_the_real_fp8_cast_at_the_boundaries(fmt, dtype):
    from launcher.train.monitor.stats import flush_threshold

    tiny, top = flush_threshold(fmt), saturation_threshold(fmt)
    edges = torch.tensor([tiny, top])
    near = torch.cat([edges * f for f in (0.5, 0.999, 1.0, 1.001, 1.5)] + [torch.rand(10000) * 4 * tiny])
    values = torch.cat([near, -near])
    row = cast_stats(values, Scaling(fmt=fmt), scale=torch.tensor(1.0)).tolist()
    cast = values.to(dtype).float()  # the real cast
    assert row[4] == ((cast == 0) & (values != 0)).sum().item() > 0
    # torch >= 2.12 saturates in the cast itself, so the cast cannot show which values saturated:
    # those beyond max + half a step are the 1.001x and 1.5x of the threshold, both signs; at 0.999x
    # the value still rounds to the max in the format's own grid
    assert row[5] == 4
    assert values.to(torch.float64).abs().gt(top).sum().item() == 4 and top > torch.finfo(dtype).max


def test_rowwise_gives_each_row_its_own_scale_and_rescues_the_small_row():
    x = torch.tensor([[1000.0, 2.0], [1e-3, 2e-3]])
    tensorwise = cast_stats(x, Scaling(fmt="e4m3")).tolist()
    rowwise = cast_stats(x, Scaling(fmt="e4m3", rowwise=True)).tolist()
    assert tensorwise[4] == 2  # both small values flush under the one scale of 0.448
    assert rowwise[4] == 0
    assert rowwise[1] == pytest.approx(0.448) and rowwise[2] == pytest.approx(448 / 2e-3)


def test_overflow_with_a_given_scale_counts_values_past_the_saturation_point():
    assert saturation_threshold("e4m3") == 464.0 and saturation_threshold("e5m2") == 61440.0
    x = torch.tensor([1.0, 460.0, 470.0, -900.0])
    row = cast_stats(x, Scaling(fmt="e4m3"), scale=torch.tensor(1.0)).tolist()
    assert row[5] == 2  # 470 and -900 saturate; 460 rounds to 448 like any in-range value


# ----------------------------------------------------------------------------- a real torchao run

@pytest.fixture(scope="module")
def world():
    with world_of_one() as env:
        yield env


def _run(tmp_path, world, *, every: int, steps: int = 4, recipe: str = "tensorwise", capture: str | None = None,
         **keys):
    from launcher.train.compile_ac import prepare_blocks
    from launcher.train.engines import wrap
    from launcher.train.loop import Trainer, TrainState
    from launcher.train.metrics import MetricsLogger, Throughput
    from launcher.train.precision import apply_precision

    plan, plan_dir = make_plan(tmp_path, precision__mode="fp8", precision__backend="torchao",
                               precision__torchao__recipe=recipe, precision__torchao__skip_small=False,
                               precision__high_precision="fp32", train__steps=steps,
                               train__output_dir=str(tmp_path / "out"), monitor__fp8_stats_every=every, **keys)
    model = tiny_model()
    precision = apply_precision(model, plan, CPU.device)
    captured = []
    if capture:
        model.get_submodule(capture).register_forward_pre_hook(lambda m, args: captured.append(args[0].detach().clone()))
    prepare_blocks(model, plan)  # activation checkpointing wrappers, when the plan asks
    engine = wrap(model, plan, precision, plan_dir, env=CPU, layout=plan.distributed.layout(CPU.world_size))
    monitor = build_monitor(plan, precision, model, is_main=True, stream=io.StringIO())
    logger = MetricsLogger(output_dir=str(tmp_path / "out"), enabled=True, total_steps=steps, stream=io.StringIO(), progress=False)
    throughput = Throughput(tokens_per_step=plan.tokens_per_step, world_size=1, flops_per_token=1e6, peak_tflops=None)
    trainer = Trainer(TrainState(engine=engine, data=iter(token_batches(steps))), plan, device=CPU.device, logger=logger,
                      throughput=throughput, callbacks=[monitor] if monitor else [])
    return trainer, monitor, model, precision, captured


def _records(tmp_path) -> list[dict]:
    path = tmp_path / "out" / STATS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("recipe,checkpointing", [("tensorwise", "none"), ("rowwise", "none"), ("tensorwise", "full")])
def test_records_match_a_direct_computation_on_the_captured_input(world, tmp_path, recipe, checkpointing):
    """With activation checkpointing the names stay the model's (no wrapper parts) and the
    recomputation in backward is not counted again."""
    layer = "layers.1.attention.wq"
    trainer, monitor, model, precision, captured = _run(tmp_path, world, every=2, recipe=recipe, capture=layer,
                                                        activation_checkpointing__mode=checkpointing)
    trainer.run()
    trainer.logger.close()
    records = _records(tmp_path)
    fp8_layers = {t.layer for t in monitor.targets}
    assert len(fp8_layers) == precision.report.fp8_layers > 0
    assert {r["step"] for r in records} == {2, 4}
    assert {(r["layer"], r["tensor"]) for r in records if r["step"] == 2} == {
        (name, op) for name in fp8_layers for op in ("input", "weight", "grad_output")}
    assert all(0 <= r["underflow"] <= 1 and 0 <= r["overflow"] <= 1 and r["amax"] > 0 for r in records)

    rec = next(r for r in records if r["step"] == 2 and r["layer"] == layer and r["tensor"] == "input")
    x = captured[2 if checkpointing == "full" else 1]  # the input of step 2 (one micro-batch per step; AC: forward, recompute)
    assert rec["nonzero"] == torch.count_nonzero(x).item()  # counted once
    rows = x.reshape(-1, x.shape[-1])
    amax = rows.abs().amax(dim=-1, keepdim=True) if recipe == "rowwise" else x.abs().max()
    scale = amax_to_scale(amax, torch.float8_e4m3fn, round_scales_to_power_of_2=recipe == "rowwise")
    fp8 = to_fp8_saturated((rows if recipe == "rowwise" else x).float() * scale, torch.float8_e4m3fn)
    nonzero = (rows if recipe == "rowwise" else x) != 0
    assert rec["amax"] == pytest.approx(x.abs().max().item(), rel=1e-6)
    assert rec["scale"] == pytest.approx(scale.min().item(), rel=1e-6)
    assert rec["scale_max"] == pytest.approx(scale.max().item(), rel=1e-6)
    assert rec["underflow"] == pytest.approx(((fp8 == 0) & nonzero).sum().item() / nonzero.sum().item())
    assert rec["format"] == "e4m3" and rec["granularity"] == ("rowwise" if recipe == "rowwise" else "tensorwise")
    grad = next(r for r in records if r["step"] == 2 and r["layer"] == layer and r["tensor"] == "grad_output")
    assert grad["format"] == ("e4m3" if recipe == "rowwise" else "e5m2")  # torchao's rowwise recipe: e4m3 gradients
    weight = next(r for r in records if r["step"] == 2 and r["layer"] == layer and r["tensor"] == "weight")
    assert weight["nonzero"] == model.get_submodule(layer).weight.numel()


def test_monitor_off_hooks_nothing(world, tmp_path):
    trainer, monitor, model, precision, _ = _run(tmp_path, world, every=0, steps=2)
    assert monitor is None
    before = _hooks(model)
    seen = []
    trainer.callbacks.append(lambda state: seen.append((_hooks(model), _monitor_hooks(model))))
    trainer.run()
    trainer.logger.close()
    assert seen == [(before, 0), (before, 0)]  # after every step: not one hook more
    assert not (tmp_path / "out" / STATS_FILE).exists()


def test_hooks_exist_only_on_sampled_steps(world, tmp_path):
    trainer, monitor, model, _, _ = _run(tmp_path, world, every=3, steps=4)
    idle = _hooks(model)
    armed = []
    trainer.callbacks.append(lambda state: armed.append((state.step, _hooks(model) - idle)))
    trainer.callbacks.append(lambda state: armed.append((-state.step, _monitor_hooks(model))))
    trainer.run()
    trainer.logger.close()
    per_step = dict(armed)
    n = len(monitor.targets)
    # armed after step 2 for step 3 (a pre-hook and a forward hook per layer), disarmed after step 3
    assert per_step == {1: 0, 2: 2 * n, 3: 0, 4: 0, -1: 0, -2: 2 * n, -3: 0, -4: 0}
    assert _monitor_hooks(model) == 0
    assert _hooks(model) == idle
    assert {r["step"] for r in _records(tmp_path)} == {3}


# ----------------------------------------------------------------------------- warnings

class Spiky(nn.Module):
    """Two FP8 Linears; the second sees tiny values with one huge outlier per batch."""

    def __init__(self):
        super().__init__()
        self.calm = nn.Linear(64, 64)
        self.spiky = nn.Linear(64, 32)

    def forward(self, x):
        h = self.calm(x) * 1e-4
        outlier = torch.zeros_like(h)
        outlier[..., 0, 0] = 1e4
        return self.spiky(h + outlier)


def test_a_layer_with_tiny_values_and_a_huge_outlier_gets_a_warning_naming_it(tmp_path):
    torch.manual_seed(0)
    model = convert_to_float8_training(Spiky(), config=Float8LinearConfig.from_recipe_name("tensorwise"))
    stream = io.StringIO()
    monitor = FP8Monitor(torchao_targets(model), every=1, total_steps=100, output_dir=str(tmp_path), is_main=True,
                         underflow_warn=0.01, overflow_warn=1e-4, backend="torchao", recipe="tensorwise", stream=stream)
    state = type("S", (), {"step": 0})()
    for _ in range(WARN_EVERY_SAMPLES + 1):
        model(torch.randn(8, 64)).sum().backward()
        state.step += 1
        monitor(state)
    monitor.finish(state)
    warnings = [line for line in stream.getvalue().splitlines() if line.startswith("warning:")]
    # once at the first sample, again only WARN_EVERY_SAMPLES samples later
    assert len(warnings) == 2
    assert all("layer spiky (input, e4m3)" in w and "calm" not in w for w in warnings)
    assert "at step 1;" in warnings[0] and f"at step {WARN_EVERY_SAMPLES + 1};" in warnings[1]
    assert 'precision.keep = ["spiky"]' in warnings[0] and 'precision.torchao.recipe = "rowwise"' in warnings[0]
    summary = stream.getvalue().split("worst layers:")[1].splitlines()
    assert summary[1].strip().startswith("spiky input: underflow")
    spiky = [json.loads(line) for line in (tmp_path / STATS_FILE).read_text().splitlines()
             if '"spiky"' in line and '"input"' in line]
    assert len(spiky) == WARN_EVERY_SAMPLES + 1 and min(r["underflow"] for r in spiky) > 0.9


# ----------------------------------------------------------------------------- Transformer Engine (stand-in)

class FakeTELinear(nn.Linear):
    """Stands in for te.Linear (not installable here): a Linear with TE's fp8_meta holding the
    delayed-scaling scales TE keeps per operand (scaling_fwd[0] input, [1] weight; scaling_bwd[0] grad)."""

    def __init__(self, n):
        super().__init__(n, n)
        meta = type("ScalingMeta", (), {})
        fwd, bwd = meta(), meta()
        fwd.scale, bwd.scale = torch.tensor([1.0, 0.5, 1.0]), torch.tensor([4.0, 1.0])
        self.fp8_meta = {"scaling_fwd": fwd, "scaling_bwd": bwd}


def test_te_delayed_scaling_uses_the_scales_te_keeps_and_sees_its_overflows(tmp_path):
    hybrid = type("F", (), {"name": "HYBRID"})()
    DelayedScaling = type("DelayedScaling", (), {"fp8_format": hybrid, "margin": 0})
    model = nn.Sequential(FakeTELinear(16))
    targets = te_targets(model, (FakeTELinear,), DelayedScaling())
    assert [t.layer for t in targets] == ["0"]
    assert {op: s.fmt for op, s in targets[0].operands.items()} == {"input": "e4m3", "weight": "e4m3", "grad_output": "e5m2"}
    monitor = FP8Monitor(targets, every=1, total_steps=1, output_dir=str(tmp_path), is_main=True, underflow_warn=0.5,
                         overflow_warn=0.01, backend="te", recipe="delayed", stream=io.StringIO())
    x = torch.full((4, 16), 1.0)
    x[0, :8] = 1000.0  # with TE's stale scale 1.0, 1000 saturates e4m3 (max 448): 8 of 64 values
    model(x).sum().backward()
    monitor(type("S", (), {"step": 1})())
    monitor.finish()
    recs = {r["tensor"]: r for r in map(json.loads, (tmp_path / STATS_FILE).read_text().splitlines())}
    assert recs["input"]["scale"] == 1.0 and recs["input"]["overflow"] == pytest.approx(8 / 64)
    assert recs["weight"]["scale"] == 0.5 and recs["grad_output"]["scale"] == 4.0
    assert "precision.te.recipe = \"current\"" in monitor.stream.getvalue()


@pytest.mark.slow
def test_compiled_blocks_are_watched_under_the_models_names(tmp_path):
    """torch.compile'd and checkpointed blocks (OptimizedModule, CheckpointWrapper): the targets are named as the
    model was built. The hooks running eagerly inside compiled blocks, end to end: tests/e2e/test_support_matrix.py
    (its compiled, monitored FP8 runs check fp8_stats.jsonl)."""
    from launcher.train.compile_ac import prepare_blocks
    from launcher.train.precision import apply_precision

    plan, _ = make_plan(tmp_path, precision__mode="fp8", precision__torchao__skip_small=False, compile__enabled=True,
                        activation_checkpointing__mode="full", monitor__fp8_stats_every=3)
    model = tiny_model()
    precision = apply_precision(model, plan, CPU.device)
    prepare_blocks(model, plan, precision)
    assert any("_orig_mod" in name for name, _ in model.named_modules())  # really wrapped
    monitor = build_monitor(plan, precision, model, is_main=True)
    assert len(monitor.targets) == precision.report.fp8_layers
    assert not any("_orig_mod" in t.layer or "_checkpoint_wrapped_module" in t.layer for t in monitor.targets)
    assert {t.layer for t in monitor.targets} <= {name for name, _ in tiny_model().named_modules()}


def test_a_monitor_with_nothing_to_watch_says_so(world, tmp_path):
    from launcher.train.monitor import unwatched_note
    from launcher.train.precision import apply_precision

    plan, _ = make_plan(tmp_path, precision__mode="bf16", monitor__fp8_stats_every=5)
    model = tiny_model()
    precision = apply_precision(model, plan, CPU.device)
    monitor = build_monitor(plan, precision, model, is_main=True)
    assert monitor is not None and monitor.targets == []
    assert unwatched_note(plan, precision, monitor) == (
        "note: monitor.fp8_stats_every = 5 but no layer runs in FP8: no fp8_stats.jsonl is written")


def test_mxfp8_records_match_torchaos_own_mx_cast(world, tmp_path):
    """torchao MXFP8 (emulated on CPU): the monitor watches its layers in 1 x 32 blocks, and the underflow share it
    records for an input is the one torchao's own to_mx cast (RCEIL, the mode fp8launch's mxfp8 uses) produces."""
    skip_without_torch_mx()
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    layer = "layers.1.feed_forward.w2"
    trainer, monitor, model, precision, captured = _run(tmp_path, world, every=2, recipe="mxfp8", capture=layer,
                                                        train__seq_len=32, train__micro_batch_size=2)
    trainer.run()
    trainer.logger.close()
    records = _records(tmp_path)
    assert len({t.layer for t in monitor.targets}) == precision.report.fp8_layers == 13
    rec = next(r for r in records if r["step"] == 2 and r["layer"] == layer and r["tensor"] == "input")
    assert rec["granularity"] == "block1x32" and rec["format"] == "e4m3"
    x = captured[1].float().reshape(-1, captured[1].shape[-1]).contiguous()
    _, data = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    nonzero = x != 0
    assert rec["underflow"] == pytest.approx(((data.float() == 0) & nonzero).sum().item() / nonzero.sum().item())
    assert rec["nonzero"] == nonzero.sum().item() and rec["underflow"] > 0  # SwiGLU outputs: some small values do flush
    weight = next(r for r in records if r["step"] == 2 and r["layer"] == layer and r["tensor"] == "weight")
    w = model.get_submodule(layer).weight
    assert weight["nonzero"] == getattr(w, "to_local", lambda: w)()._data.numel()  # the MX wrapper's high-precision weight
