"""The GPU-only faults of issue 10, tested through the parts that are plain functions on CPU:
the process-group backend chosen for a CUDA run with tensors on the CPU, Transformer Engine's own
checkpoint for checkpointed TE blocks, and what te.fp8_params stores."""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from launcher.planning.memory import estimate
from launcher.planning.precision_table import precision_table
from launcher.train.compile_ac import checkpoint_fn, prepare_blocks
from launcher.train.parallel import distributed
from launcher.train.parallel.distributed import holds_cpu_tensors, process_group_backend

from ._precision import TinyLlama, lm_loss, make_plan

# --- FSDP2 cpu_offload on CUDA: a CPU backend beside NCCL -------------------------------------


def test_cuda_with_cpu_tensors_gets_gloo_beside_nccl():
    assert process_group_backend("cuda", cpu_tensors=True) == "cpu:gloo,cuda:nccl"
    assert process_group_backend("cuda", cpu_tensors=False) == "nccl"
    assert process_group_backend("cpu", cpu_tensors=True) == "gloo"


def test_offloading_plans_hold_cpu_tensors():
    assert holds_cpu_tensors(make_plan(distributed={"strategy": "fsdp2", "fsdp2": {"cpu_offload": True}}))
    assert not holds_cpu_tensors(make_plan(distributed={"strategy": "fsdp2"}))
    assert holds_cpu_tensors(make_plan(distributed={"strategy": "deepspeed", "deepspeed": {"offload_optimizer": "cpu"}}))
    assert not holds_cpu_tensors(make_plan(distributed={"strategy": "ddp"}))


def test_the_entrypoint_asks_for_the_cpu_backend_for_an_offloading_plan(tmp_path, monkeypatch):
    from launcher.train.main import build_run
    from tests.train._engine_setup import make_plan as write_plan

    _, plan_dir = write_plan(tmp_path, **{"distributed.procs_per_node": 1, "distributed.fsdp2.cpu_offload": True,
                                          "train.output_dir": str(tmp_path / "out")})
    asked = {}

    class Stop(Exception):
        pass

    def fake_init(device_setting, timeout_s=600.0, *, cpu_tensors=False):
        asked.update(device=device_setting, cpu_tensors=cpu_tensors)
        raise Stop

    monkeypatch.setattr(distributed, "init", fake_init)
    with pytest.raises(Stop):
        build_run(f"{plan_dir}/plan.json")
    assert asked == {"device": "cpu", "cpu_tensors": True}


# --- Transformer Engine blocks recompute through TE's checkpoint ------------------------------

def te_precision(calls: list):
    """A precision object as apply_te returns it, whose `te` namespace has a checkpoint that records
    each call and recomputes with torch's (TE itself cannot be installed here)."""

    def te_checkpoint(function, *args, use_reentrant=True, distribute_saved_activations=False, tp_group=None,
                      get_rng_state_tracker=None, **kwargs):
        calls.append({"function": function, "use_reentrant": use_reentrant, "distribute": distribute_saved_activations})
        return torch_checkpoint(function, *args, use_reentrant=False, **kwargs)

    return types.SimpleNamespace(te=types.SimpleNamespace(distributed=types.SimpleNamespace(checkpoint=te_checkpoint)))


def test_te_blocks_are_checkpointed_by_te_checkpoint_with_the_same_gradients():
    torch.manual_seed(0)
    ref = TinyLlama()
    model = TinyLlama()
    model.load_state_dict(ref.state_dict())
    plan = make_plan(precision={"mode": "fp8", "backend": "te"}, activation_checkpointing={"mode": "full"},
                     distributed={"strategy": "ddp", "procs_per_node": 1})
    calls: list = []
    blocks = prepare_blocks(model, plan, te_precision(calls))
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    lm_loss(model, tokens).backward()
    lm_loss(ref, tokens).backward()
    assert len(calls) == len(blocks) == len(ref.layers)
    assert all(c["use_reentrant"] is False and c["distribute"] is False for c in calls)
    assert [c["function"] for c in calls] == [b._checkpoint_wrapped_module for b in blocks]
    # names are torch's checkpoint_wrapper names (checkpoints and precision.keep globs read them alike)
    assert {n.replace("._checkpoint_wrapped_module", "") for n, _ in model.named_parameters()} == {n for n, _ in ref.named_parameters()}
    grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name.replace("._checkpoint_wrapped_module", "")].grad)


def test_other_backends_keep_torch_checkpoint_and_a_te_without_checkpoint_is_refused():
    assert checkpoint_fn(None) is None
    assert checkpoint_fn(types.SimpleNamespace(report=None)) is None
    from launcher.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="recompute outside te.autocast"):
        checkpoint_fn(types.SimpleNamespace(te=types.SimpleNamespace()))


# --- te.fp8_params: what is stored, and who keeps master weights --------------------------------

def test_fp8_params_tables_say_exactly_what_is_stored():
    fsdp = make_plan(precision={"mode": "fp8", "backend": "te", "te": {"fp8_params": True}}, distributed={"strategy": "fsdp2"})
    table = precision_table(fsdp)
    assert table["weights"] == "fp8 (quantized_model_init)"
    # FSDP2 / DDP: TE's FusedAdam keeps the fp32 master copy of the fp8 weights (issue 29), and FSDP2 gathers them in fp8
    assert table["master_weights"] == "fp32 (TE FusedAdam's master copy of the fp8 weights)"
    assert table["weight_comm"] == "fp8 (TE's FP8 weights all-gathered as FP8)"
    # the FP8 weights, the parameters kept in fp32 (embedding, first and last Linear, norms: issue 35), their gradients
    assert [r.name for r in estimate(fsdp, 10**9).rows] == ["params", "params_kept", "grads", "master_weights", "optimizer_states"]
    ds = make_plan(precision={"mode": "fp8", "backend": "te", "te": {"fp8_params": True}}, distributed={"strategy": "deepspeed"})
    assert precision_table(ds)["master_weights"] == "fp32 (in the ZeRO optimizer)"
    assert {r.name: r.dtype for r in estimate(ds, 10**9).rows}["master_weights"] == "fp32"
