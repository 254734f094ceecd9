"""The start record's `effects` are read from the live objects (launcher/train/effects.py), each following
the spec both ways, and a requested feature that did not take effect stops the run (EFFECT-MISSING, exit
3). One-process gloo groups, real FSDP2, DeepSpeed and torchao; the 2-process runs of every combination
are tests/e2e/test_support_matrix.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launcher.errors import EnvironmentProblem
from launcher.train import effects
from launcher.train.compile_ac import prepare_blocks
from launcher.train.engines import wrap
from launcher.train.precision import apply_precision
from tests.support import skip_without_torch_mx

from ._engine_setup import make_plan, tiny_model, token_batches, world_of_one


def _wrapped(tmp_path, **keys):
    plan, plan_dir = make_plan(tmp_path, **keys)
    model = tiny_model()
    precision = apply_precision(model, plan, torch.device("cpu"))
    blocks = prepare_blocks(model, plan, precision)
    engine = wrap(model, plan, precision, plan_dir, env=(env := effects_env()),
                  layout=plan.distributed.layout(env.world_size), blocks=blocks)
    return plan, engine, precision


def effects_env():
    from ._engine_setup import CPU

    return CPU


def test_blocks_compiled_fullgraph_and_checkpointed_are_read_from_the_wrappers(tmp_path):
    plan, _ = make_plan(tmp_path, compile__enabled=True, compile__fullgraph=True, activation_checkpointing__mode="selective")
    model = tiny_model()
    prepare_blocks(model, plan)
    assert effects.blocks_effects(model) == {"compiled_blocks": 2, "fullgraph": True, "checkpointed_blocks": 1}
    plan, _ = make_plan(tmp_path / "b", compile__enabled=True, activation_checkpointing__mode="full")
    model = tiny_model()
    prepare_blocks(model, plan)
    assert effects.blocks_effects(model) == {"compiled_blocks": 2, "fullgraph": False, "checkpointed_blocks": 2}
    model = tiny_model()
    assert effects.blocks_effects(model) == {"compiled_blocks": 0, "fullgraph": None, "checkpointed_blocks": 0}


def test_fsdp2_all_gather_dtype_and_offload_follow_the_spec(tmp_path):
    fp8 = dict(precision__mode="fp8", precision__torchao__skip_small=False, distributed__strategy="fsdp2")
    with world_of_one():
        _, engine, precision = _wrapped(tmp_path / "ag", precision__torchao__fsdp_float8_all_gather=True, **fp8)
        got = effects.measure(engine, fp8_modules=effects.fp8_module_ids(engine.module, precision))
        assert got["all_gather_dtype"] == "float8_e4m3fn"
        assert got["offload"] == {"parameters": "device", "optimizer_states": "device"} and got["optimizer"] == "AdamW"
        _, engine, precision = _wrapped(tmp_path / "no-ag", distributed__fsdp2__cpu_offload=True, **fp8)
        got = effects.measure(engine, fp8_modules=effects.fp8_module_ids(engine.module, precision))
        assert got["all_gather_dtype"] == "bfloat16"  # FP8 layers, all-gathered in the MixedPrecisionPolicy's dtype
        assert got["offload"] == {"parameters": "cpu", "optimizer_states": "cpu"}
        _, engine, _ = _wrapped(tmp_path / "fp32", precision__mode="fp32", distributed__strategy="fsdp2", train__optimizer="sgd")
        got = effects.measure(engine)
        assert got["all_gather_dtype"] == "float32" and got["optimizer"] == "SGD"


def test_fsdp2_params_are_read_from_torch_2_11s_single_group_state_too(tmp_path, monkeypatch):
    """torch 2.11 (the GPU machine's) keeps one `_fsdp_param_group` per state, not `_fsdp_param_groups`:
    every FSDP2 run on it crashed in measure() until _fsdp_params read both."""
    from torch.distributed.fsdp import FSDPModule

    fp8 = dict(precision__mode="fp8", precision__torchao__skip_small=False, distributed__strategy="fsdp2",
               precision__torchao__fsdp_float8_all_gather=True)
    with world_of_one():
        _, engine, precision = _wrapped(tmp_path, **fp8)
        fp8_ids = effects.fp8_module_ids(engine.module, precision)
        new_style = effects.measure(engine, fp8_modules=fp8_ids)
        n_params = len(effects._fsdp_params(engine.model))
        current = FSDPModule._get_fsdp_state

        class Torch211State:
            def __init__(self, state):
                groups = state._fsdp_param_groups
                assert len(groups) <= 1
                self._fsdp_param_group = groups[0] if groups else None

        if hasattr(current(engine.model), "_fsdp_param_groups"):  # torch >= 2.13; on torch 2.11 the state is already this
            monkeypatch.setattr(FSDPModule, "_get_fsdp_state", lambda self: Torch211State(current(self)))
        assert len(effects._fsdp_params(engine.model)) == n_params > 0
        assert effects.measure(engine, fp8_modules=fp8_ids) == new_style
        assert new_style["all_gather_dtype"] == "float8_e4m3fn"


def test_mxfp8_layers_are_named_as_built_and_fsdp2_all_gathers_their_weights_in_bf16(tmp_path):
    """torchao's MX wrapper all-gathers `_data` in the MixedPrecisionPolicy's dtype and quantizes after it."""
    skip_without_torch_mx()
    mx = dict(precision__mode="fp8", precision__torchao__recipe="mxfp8", precision__torchao__skip_small=False, train__seq_len=32)
    with world_of_one():
        _, engine, precision = _wrapped(tmp_path / "fsdp2", distributed__strategy="fsdp2", **mx)
        got = effects.measure(engine, fp8_modules=effects.fp8_module_ids(engine.module, precision))
        assert got["all_gather_dtype"] == "bfloat16"
        layers = effects.layer_precisions(engine.module, precision)
        assert sum(v == "fp8 mxfp8" for v in layers.values()) == precision.report.fp8_layers == 13
        assert layers["output"] == "bf16"
        # DDP keeps fp32 weights: under CPU autocast the emulated MX linear gets a bf16 input, which the
        # input hook gives the weight's dtype; one step trains and changes every MX weight
        _, engine, precision = _wrapped(tmp_path / "ddp", distributed__strategy="ddp", **mx)
        before = {n: p.detach().clone() for n, p in engine.module.named_parameters() if "feed_forward" in n}
        batch = token_batches(1, batch=1, seq_len=32)[0]
        with engine.micro_batch(last=True):
            logits = engine.forward(batch[:, :-1])
            engine.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()), last=True)
        engine.step()
        assert all(not torch.equal(p.detach(), before[n]) for n, p in engine.module.named_parameters() if n in before)


def test_a_rules_own_dtype_is_its_own_fsdp2_unit_gathered_in_that_dtype(tmp_path):
    """An fp32 rule under FSDP2 (bf16 params elsewhere): each matching Linear is an FSDP unit of its own whose
    MixedPrecisionPolicy all-gathers fp32, so it computes on fp32 weights; the layers map says fp32; it trains."""
    from torch.distributed.fsdp import FSDPModule

    keys = dict(precision__mode="fp8", precision__torchao__skip_small=False, distributed__strategy="fsdp2",
                precision__rules=[{"match": "*.feed_forward.w2", "mode": "fp32"}])
    with world_of_one():
        _, engine, precision = _wrapped(tmp_path, **keys)
        model = engine.module
        w2 = model.get_submodule("layers.1.feed_forward.w2")
        assert isinstance(w2, FSDPModule) and w2._get_fsdp_state()._mp_policy.param_dtype == torch.float32
        assert not isinstance(model.get_submodule("layers.1.feed_forward.w1"), FSDPModule)  # inside its block's unit
        layers = effects.layer_precisions(model, precision)
        assert [f for f, v in layers.items() if v == "fp32"] == ["layers.0.feed_forward.w2", "layers.1.feed_forward.w2"]
        assert effects.measure(engine, fp8_modules=effects.fp8_module_ids(model, precision))["all_gather_dtype"] == "bfloat16"
        seen = {}
        w2.register_forward_hook(lambda m, a, out: seen.update(dtype=(a[0].dtype, out.dtype)) or None)
        batch = token_batches(1)[0]
        with engine.micro_batch(last=True):
            logits = engine.forward(batch[:, :-1])
            engine.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()), last=True)
        engine.step()
        assert seen["dtype"][1] == torch.float32


def test_deepspeed_offload_trains_with_deepspeeds_cpu_adam(tmp_path):
    """The defect: DeepSpeed refused our torch AdamW under ZeRO-Offload (ZeRORuntimeException); the
    optimizer section in deepspeed.json makes it build its DeepSpeedCPUAdam, and the effects say so."""
    with world_of_one():
        plan, engine, _ = _wrapped(tmp_path, distributed__strategy="deepspeed", distributed__deepspeed__zero_stage=2,
                                   distributed__deepspeed__offload_optimizer="cpu", precision__mode="bf16")
        got = effects.measure(engine)
        assert got["optimizer"] == "DeepSpeedCPUAdam" and got["offload"] == {"parameters": "device", "optimizer_states": "cpu"}
        assert got["all_gather_dtype"] is None
        effects.check(plan, got, engine.module, torch.device("cpu"))  # everything asked for took effect
        tokens = token_batches(1, seq_len=16)[0]
        loss = nn.functional.cross_entropy(engine.forward(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())
        before = engine.module.tok_embeddings.weight.detach().clone()
        engine.backward(loss, last=True)
        engine.step()  # DeepSpeedCPUAdam steps the fp32 masters on the host; the bf16 weights follow
        assert (engine.module.tok_embeddings.weight.detach() - before).abs().max() > 1e-4


def test_async_tp_is_measured_where_inductor_looks():
    import torch.distributed as dist
    from torch.distributed._symmetric_memory import is_symm_mem_enabled_for_group

    from launcher.train.parallel.tensor_parallel import async_tp_active, enable_async_tp

    with world_of_one():
        group = dist.new_group([0])
        assert not async_tp_active(group.group_name)
        enable_async_tp(group.group_name)  # the defect: the pass flag alone fused nothing
        # torch <= 2.14 reads the table enable_symm_mem_for_group writes; torch 2.15 asks for a symmetric-memory
        # allocator on an accelerator instead, which a CPU machine has not: the pass fuses nothing there, as said
        assert async_tp_active(group.group_name) == is_symm_mem_enabled_for_group(group.group_name)
        assert async_tp_active(group.group_name) == (tuple(map(int, torch.__version__.split(".")[:2])) < (2, 15)
                                                     or torch.accelerator.current_accelerator(check_available=True) is not None)
        torch._inductor.config._micro_pipeline_tp = False
        assert not async_tp_active(group.group_name)


def _plan(tmp_path, **keys):
    return make_plan(tmp_path, **keys)[0]


def _measured(**over):
    base = {"all_gather_dtype": None, "compiled_blocks": 0, "fullgraph": None, "checkpointed_blocks": 0, "optimizer": "AdamW",
            "offload": {"parameters": "device", "optimizer_states": "device"}, "tensor_parallel": 1, "async_tp": False,
            "expert_parallel": 1, "monitor_hooks": 0}
    return {**base, **over}


def test_what_did_not_take_effect_is_named_by_its_spec_key(tmp_path):
    plan = _plan(tmp_path / "a", compile__enabled=True, activation_checkpointing__mode="full")
    assert effects.missing(plan, _measured(compiled_blocks=2, checkpointed_blocks=2), 2) == ()
    (line,) = effects.missing(plan, _measured(compiled_blocks=2, checkpointed_blocks=1), 2)
    assert line == "activation_checkpointing.mode needs checkpointed_blocks = 2, and this run has 1"
    plan = _plan(tmp_path / "b", distributed__strategy="deepspeed", distributed__deepspeed__zero_stage=2,
                 distributed__deepspeed__offload_optimizer="cpu")
    lines = effects.missing(plan, _measured(), 4)
    assert lines == ("distributed.deepspeed.offload_optimizer needs optimizer = DeepSpeedCPUAdam, and this run has 'AdamW'",
                     "distributed.deepspeed.offload_optimizer needs offload.optimizer_states = cpu, and this run has 'device'")
    plan = _plan(tmp_path / "c", precision__mode="fp8", precision__torchao__skip_small=False, monitor__fp8_stats_every=1)
    assert effects.missing(plan, _measured(monitor_hooks=0), 4) == (
        "monitor.fp8_stats_every needs monitor_hooks = at least 1, and this run has 0",)
    assert effects.missing(plan, _measured(monitor_hooks=27), 4) == ()


def test_a_model_without_blocks_cannot_be_compiled_and_the_run_stops(tmp_path):
    plan = _plan(tmp_path, compile__enabled=True)
    lines = effects.missing(plan, _measured(), 0)
    assert lines[0].startswith("the model has no repeated blocks fp8launch can find")
    try:
        effects.check(plan, _measured(), nn.Sequential(nn.Linear(4, 4)), torch.device("cpu"))
    except EnvironmentProblem as e:
        assert e.rule == "EFFECT-MISSING" and e.exit_code == 3 and "compile.enabled needs compiled_blocks = 1" in str(e)
    else:
        raise AssertionError("no EFFECT-MISSING")


def test_layers_name_the_recipe_each_module_runs(tmp_path):
    plan, _ = make_plan(tmp_path, precision__mode="fp8", precision__torchao__recipe="rowwise", precision__torchao__skip_small=False)
    model = tiny_model()
    precision = apply_precision(model, plan, torch.device("cpu"))
    layers = effects.layer_precisions(model, precision)
    assert layers["layers.0.attention.wq"] == "bf16" and layers["output"] == "bf16"  # keep_first_last
    assert layers["layers.1.feed_forward.w2"] == "fp8 rowwise"
    assert sum(v.startswith("fp8") for v in layers.values()) == precision.report.fp8_layers
    plan, _ = make_plan(tmp_path / "bf", precision__mode="fp32")
    model = tiny_model()
    assert set(effects.layer_precisions(model, apply_precision(model, plan, torch.device("cpu"))).values()) == {"fp32"}


@pytest.mark.parametrize("optimizer, states", [("adamw", "fp32"), ("sgd", "none")])
def test_deepspeed_zero3_reads_its_fp32_partitions_as_the_master_weights(tmp_path, optimizer, states):
    """The defect: ZeRO-3 hands its basic optimizer one fp32 partition at a time inside step() and empties the groups
    again, so master_weights and optimizer_states read 'none' and the CPU matrix's ZeRO-3 rows stopped (EFFECT-MISSING)."""
    with world_of_one():
        plan, engine, _ = _wrapped(tmp_path, distributed__strategy="deepspeed", distributed__deepspeed__zero_stage=3,
                                   precision__mode="bf16", train__optimizer=optimizer)
        assert not [q for g in engine.stepping_optimizer().param_groups for q in g["params"]]  # what DeepSpeed leaves there
        got = effects.measure(engine)
        assert (got["master_weights"], got["optimizer_states"]) == ("fp32", states)
        effects.check(plan, got, engine.module, torch.device("cpu"))
