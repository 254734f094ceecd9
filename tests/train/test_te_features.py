"""Transformer Engine features that used to do nothing, trained in this process with the stand-in TE
(tests/train/test_te_standin.py): FP8 attention (precision.te.fp8_dpa) on a builtin model, FP8 weights with a
master copy (precision.te.fp8_params) under DDP and FSDP2, and the refusals: fp8_mha, FP8 attention of a model
fp8launch does not own, TE with activation checkpointing and compile."""

from __future__ import annotations

import io
import json
from statistics import fmean

import pytest
import torch

from launcher.errors import LauncherError
from launcher.planning.rules import Facts, check
from launcher.train.compile_ac import prepare_blocks
from launcher.train.precision import te as te_backend
from tests.support import plan_from

from ._engine_setup import train_in_process
from .test_te_resume import blackwell_standin, losses, standin, te_cpu_plan  # noqa: F401 - fixtures
from .test_te_standin import META_DO, META_DP, META_O, META_QKV, META_S, NO_BACKEND, DotProductAttention, Float8Tensor, fake_te

CPU = torch.device("cpu")


def train(tmp_path, name, **keys):
    """(metrics.jsonl records, the Trainer) of a TE run in this process."""
    out = tmp_path / name
    plan = te_cpu_plan(tmp_path / f"plan-{name}", **{"train.output_dir": str(out), "train.checkpoint_every": 0,
                                                      "train.checkpoint_at_end": False, **keys})
    trainer = train_in_process(plan, stream=io.StringIO())
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], trainer


# --- precision.te.fp8_dpa -----------------------------------------------------------------------------------------

def test_fp8_dpa_puts_te_attention_in_the_builtin_models_and_runs_it_in_fp8(tmp_path, blackwell_standin):  # noqa: F811 - the fixture imported above
    """On a B200 (llama-debug's head_dim 32 has no FP8 attention backend on an H100: rule TE-FP8-DPA-GPU)."""
    records, trainer = train(tmp_path, "dpa", **{"precision.te.recipe": "delayed", "precision.te.fp8_dpa": True})
    start = records[0]
    assert start["layers"]["layers.0.attention.core"] == "fp8 dpa" and start["layers"]["layers.1.attention.core"] == "fp8 dpa"
    assert start["layers"]["layers.0.attention.wq"] == "fp8 delayed"
    assert "2 attention cores in FP8 (te.DotProductAttention)" in start["precision"]
    cores = [m for m in trainer.state.engine.module.modules() if isinstance(m, DotProductAttention)]
    assert len(cores) == 2
    for core in cores:  # three GEMMs' worth of scaling state, the slots of Q/K/V, O, S, dO and dP filled by the steps
        assert core.selected_backend == "FusedAttention"
        fwd, bwd = core.fp8_meta["scaling_fwd"], core.fp8_meta["scaling_bwd"]
        assert fwd.amax_history.shape[1] == 9 and (fwd.amax_history[:, [META_QKV, META_O, META_S]].abs().sum(0) > 0).all()
        assert (fwd.scale[[META_QKV, META_O, META_S]] != 1).all()  # the scales moved off their initial 1
        assert (bwd.scale[[META_DO, META_DP]] != 1).all()


def test_fp8_dpa_of_head_dim_32_has_no_backend_on_an_h100(tmp_path, standin):  # noqa: F811 - the fixture imported above
    """What rule TE-FP8-DPA-GPU refuses at plan time: the stand-in on an H100 fails at the first step with TE's error."""
    with pytest.raises(ValueError, match=NO_BACKEND.split(" for ")[0]):
        train(tmp_path, "dpa-h100", **{"precision.te.recipe": "delayed", "precision.te.fp8_dpa": True, "train.steps": 1})


def test_without_fp8_dpa_the_attention_stays_ours(tmp_path, standin):  # noqa: F811 - the fixture imported above
    records, trainer = train(tmp_path, "plain", **{"precision.te.recipe": "current", "train.steps": 2})
    assert "layers.0.attention.core" not in records[0]["layers"]
    assert not any(isinstance(m, DotProductAttention) for m in trainer.state.engine.module.modules())


def test_fp8_attention_of_a_model_fp8launch_does_not_own_is_refused(tmp_path):
    for model in ("hf:./model", "py:mod:build"):
        plan = plan_from({"precision": {"mode": "fp8", "backend": "te", "te": {"fp8_dpa": True}}, "train": {"model": model}})
        assert "TE-FP8-ATTENTION-MODEL" in {f.rule.id for f in check(Facts(plan=plan), "plan")}


def test_fp8_mha_is_refused_with_tes_reason():
    plan = plan_from({"precision": {"mode": "fp8", "backend": "te", "te": {"fp8_mha": True}}})
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "TE-FP8-MHA"]
    assert "RoPE is only implemented in F16 currently" in finding.message and "precision.te.fp8_dpa = true" in finding.fix
    te, te_recipe, _ = fake_te()  # a hand-edited plan.json is refused by the run as well
    from ._precision import TinyLlama

    with pytest.raises(LauncherError) as e:
        te_backend.apply_te(TinyLlama(), plan, CPU, te=te, te_recipe=te_recipe)
    assert e.value.rule == "TE-FP8-MHA"


# --- precision.te.fp8_params --------------------------------------------------------------------------------------

FP8_WEIGHTS_RUN = {"train.steps": 12, "train.seq_len": 128, "train.micro_batch_size": 8, "train.lr": 3e-3, "train.warmup_steps": 2}
"""12 steps of 8 x 128 tokens at lr 3e-3 after 2 warm-up steps: the loss falls to ~0.4x its first value, and an FP8-weight
run stays on its high-precision-weight twin's path (the same batches). At lr 1e-2 on 2 x 2048 tokens (this test before)
both paths were chaotic: the mean-loss gap spread over 0.005-0.33 nats across 6 seeds, and its "it learns" failed for 1
seed in 6."""

# The bounds below: 17 runs, seeds 0-5 x {ddp, fsdp2} on an AMX CPU, fsdp2 seeds 0-2 with AVX2 kernels and 0-1 with
# AVX512-BF16 ones (benchmarks/results/test_bounds.md), and the stand-in's FusedAdam broken on purpose
# (benchmarks/test_bounds.py --broken).
LEARNS = 0.6
"""Bound on the FP8-weight run's mean loss over its last 3 steps / its first step's loss. Measured: mean 0.394,
sd 0.014, max 0.411. Never writing the stepped master copy back into the FP8 weights: 0.775-0.786."""

TWIN_GAP = 0.012
"""Bound on |mean loss of the FP8-weight run - its twin's| / the twin's, over the 12 steps: 2x the largest measured.
Measured: mean 0.13%, sd 0.11%, max 0.52% (AVX2; 0.24% on the AMX CPU). Without the master copy (each FP8 weight
stepped from its own FP8 value, losing the updates below FP8's resolution): +2.2% to +4.2% over 6 seeds (+3.7% at
seed 0, this test's: it fails); never written back: +36% to +41%."""


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
@pytest.mark.heavy  # 116-136 s on an AVX2-only CPU (its bf16 GEMMs in ATen's reference loops): handed out early
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_fp8_weights_train_with_an_fp32_master_copy(tmp_path, standin, strategy):  # noqa: F811 - the fixture imported above
    keys = {"precision.te.recipe": "current", "distributed.strategy": strategy, **FP8_WEIGHTS_RUN}
    records, trainer = train(tmp_path, "fp8w", **keys, **{"precision.te.fp8_params": True})
    effects = records[0]["effects"]
    assert effects["fp8_weights"] == {"count": 15, "master": "float32"} and effects["optimizer"] == "FusedAdam"
    assert effects["all_gather_dtype"] == ("float8_e4m3fn" if strategy == "fsdp2" else None)  # FSDP2 gathers 1-byte weights
    engine = trainer.state.engine
    w = engine.module.layers[0].feed_forward.w1.weight
    local = w._local_tensor if strategy == "fsdp2" else w
    assert isinstance(local, Float8Tensor) and local._data.dtype is torch.float8_e4m3fn
    master = engine.optimizer.state[w]["master_param"]
    master = master._local_tensor if strategy == "fsdp2" else master
    # the master copy holds what FP8 cannot: the weight is its FP8 rounding
    assert master.dtype is torch.float32 and not torch.equal(master, local.dequantize())
    torch.testing.assert_close(Float8Tensor.quantize(master).dequantize(), local.dequantize(), rtol=0, atol=0)
    got = list(losses(records).values())
    assert fmean(got[-3:]) < LEARNS * got[0], got  # it learns
    twin, _ = train(tmp_path, "hp-weights", **keys)  # the same run with high-precision weights learns alike
    twin_losses = list(losses(twin).values())
    assert abs(fmean(got) - fmean(twin_losses)) / fmean(twin_losses) < TWIN_GAP, (got, twin_losses)


def test_the_master_copy_starts_from_the_high_precision_initial_weights(standin):  # noqa: F811 - the fixture imported above
    """Not from their FP8 rounding: TE keeps the initial value (preserve_high_precision_init_val) for it."""
    from ._precision import TinyLlama, make_plan

    te, te_recipe = te_backend._te()
    model = TinyLlama()
    initial = model.layers[1].feed_forward.w1.weight.detach().clone()
    plan = make_plan(precision={"mode": "fp8", "backend": "te", "te": {"recipe": "current", "fp8_params": True}},
                     distributed={"strategy": "ddp", "procs_per_node": 1})
    prec = te_backend.apply_te(model, plan, CPU, te=te, te_recipe=te_recipe)
    _, opt = prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
    assert type(opt).__name__ == "FusedAdam" and opt.master_weights and opt.adam_w_mode
    w = model.layers[1].feed_forward.w1.weight
    assert torch.equal(opt.state[w]["master_param"], initial) and not torch.equal(w.dequantize(), initial)
    assert prec.high_precision_init == {}  # handed over, not kept twice


@pytest.mark.parametrize("data,rule", [
    ({"train": {"optimizer": "sgd"}}, "TE-FP8-PARAMS-OPTIMIZER"),
    ({"distributed": {"strategy": "fsdp2"}, "precision": {"te": {"recipe": "mxfp8"}}}, "TE-FP8-PARAMS-FSDP2-BLOCK"),
    ({"distributed": {"strategy": "deepspeed"}, "precision": {"high_precision": "fp32"}}, "TE-FP8-PARAMS-DEEPSPEED-FP32"),
    ({"distributed": {"strategy": "deepspeed"}}, "TE-FP8-PARAMS-DEEPSPEED"),
])
def test_fp8_weights_are_refused_only_where_te_cannot(data, rule):
    precision = {"mode": "fp8", "backend": "te", **data.get("precision", {})}
    precision["te"] = {"fp8_params": True, **precision.get("te", {})}
    plan = plan_from({**data, "precision": precision})
    assert rule in {f.rule.id for f in check(Facts(plan=plan), "plan")}
    for strategy in ("ddp", "fsdp2"):  # the planned cases: nothing refuses them
        ok = plan_from({"precision": {"mode": "fp8", "backend": "te", "te": {"fp8_params": True, "recipe": "current"}},
                        "distributed": {"strategy": strategy}})
        assert not [f for f in check(Facts(plan=ok), "plan") if f.is_error and "FP8-PARAMS" in f.rule.id]


# --- activation checkpointing and compile ---------------------------------------------------------------------------

def test_te_with_activation_checkpointing_and_compile_is_refused_up_front():
    spec = {"precision": {"mode": "fp8", "backend": "te", "te": {"recipe": "current"}}, "compile": {"enabled": True},
            "activation_checkpointing": {"mode": "full"}}
    plan = plan_from(spec)
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "TE-AC-COMPILE"]
    assert "dynamo-disabled" in finding.message and "compiles nothing" in finding.message
    te, te_recipe, _ = fake_te()
    from ._precision import TinyLlama

    model = TinyLlama()
    prec = te_backend.apply_te(model, plan, CPU, te=te, te_recipe=te_recipe)
    with pytest.raises(LauncherError) as e:  # a hand-edited plan.json: refused before any block is wrapped
        prepare_blocks(model, plan, prec)
    assert e.value.rule == "TE-AC-COMPILE"
    assert type(model.layers[0]).__name__ == "Block"


def compiled_ops(fn, *args) -> list[str]:
    """The ops torch.compile really put in graphs when running fn(*args) (a backend that records them)."""
    ops: list[str] = []

    def record(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=record)(*args)
    return ops


def test_tes_checkpoint_is_what_dynamo_cannot_trace():
    """Why: compiled around TE's checkpoint, the checkpointed GEMM never reaches a graph (it runs eagerly)."""
    te, te_recipe, _ = fake_te()
    lin = te.Linear(16, 16, params_dtype=torch.float32)
    x = torch.randn(4, 16, requires_grad=True)
    assert any("linear" in op for op in compiled_ops(lambda x: lin(x) * 2, x))  # without the checkpoint it compiles
    ops = compiled_ops(lambda x: te.distributed.checkpoint(lin, x, use_reentrant=False) * 2, x)
    assert not any("linear" in op or "checkpoint" in op for op in ops), ops


def _bytes(t: torch.Tensor) -> int:
    return t._data.numel() * t._data.element_size() if isinstance(t, Float8Tensor) else t.numel() * t.element_size()


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
@pytest.mark.parametrize("keep_first_last", [False, True])
def test_the_memory_estimate_is_the_bytes_fused_adam_and_the_fp8_weights_take(standin, monkeypatch, keep_first_last):  # noqa: F811 - the fixture imported above
    """precision.te.fp8_params: the estimate's rows against what the stand-in (TE 2.20.2's FusedAdam: initialize_state
    gives every parameter an fp32 master copy) really allocates for a builtin model after a step: FP8 weights at 1 byte,
    the other parameters at 4, a master copy of the FP8 weights only (fp8launch makes none for the fp32 parameters, whose
    step never reads it), two fp32 moments. Exact but for each FP8 weight's 4-byte scale."""
    from launcher.planning.memory import model_states
    from launcher.planning.models import param_count, parse_builtin
    from launcher.train.models.llama import Llama

    from ._precision import make_plan

    model_name = "builtin:llama-debug?layers=2"
    plan = make_plan(precision={"mode": "fp8", "backend": "te", "keep_first_last": keep_first_last,
                                "te": {"recipe": "current", "fp8_params": True}},
                     train={"model": model_name}, distributed={"strategy": "ddp", "procs_per_node": 1})
    cfg = parse_builtin(model_name)
    n = param_count(cfg)

    def allocated():
        te, te_recipe = te_backend._te()
        torch.manual_seed(0)
        model = Llama(cfg)
        prec = te_backend.apply_te(model, plan, CPU, te=te, te_recipe=te_recipe)
        _, opt = prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
        with prec.autocast():
            model(torch.randint(0, cfg.vocab_size, (2, 16))).float().pow(2).mean().backward()
        opt.step()
        params = list(model.parameters())
        out = {"params": sum(_bytes(p) for p in params if isinstance(p, Float8Tensor)),
               "params_kept": sum(_bytes(p) for p in params if not isinstance(p, Float8Tensor))}
        for name in ("master_param", "exp_avg", "exp_avg_sq"):
            out[name] = sum(_bytes(opt.state[p][name]) for p in params if name in opt.state[p])
        return out, sum(isinstance(p, Float8Tensor) for p in params)

    got, fp8_weights = allocated()
    rows = {r.name: r.bytes_per_gpu(n) for r in model_states(plan, n)}
    assert 0 < fp8_weights and got["params_kept"] > 0
    assert rows["params"] == pytest.approx(got["params"], abs=0.5)  # the scales (4 bytes each) are not counted
    assert rows["params_kept"] == pytest.approx(got["params_kept"], abs=0.5)
    assert rows["master_weights"] == pytest.approx(got["master_param"], abs=0.5)
    assert rows["optimizer_states"] == pytest.approx(got["exp_avg"] + got["exp_avg_sq"], abs=0.5)
    # as TE builds it, FusedAdam would give the fp32 parameters a copy too: 4 bytes for each of them
    monkeypatch.setattr(te_backend, "_states_without_master", lambda optimizer, params: None)
    te_made, _ = allocated()
    assert te_made["master_param"] == got["master_param"] + got["params_kept"]
