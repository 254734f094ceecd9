"""The `activations` row of the memory estimate against the bytes autograd really saves for one
micro-batch of the builtin model on CPU (torch.autograd.graph.saved_tensors_hooks): within 15%."""

from __future__ import annotations

import pytest
import torch

from launcher.planning.memory import estimate, model_params
from launcher.train.compile_ac import prepare_blocks
from launcher.train.loop import loss_function
from launcher.train.models import build_model
from launcher.train.precision import apply_precision
from tests.train._engine_setup import make_plan

FP8 = {"precision.mode": "fp8", "precision.backend": "torchao", "precision.torchao.skip_small": False}


def saved_bytes(plan) -> int:
    """Bytes of the distinct storages autograd saves in one forward (parameters excluded: they
    are model states), as the entrypoint runs it: precision, checkpointed blocks, autocast, fp32 loss."""
    torch.manual_seed(0)
    model = build_model(plan.train.model, ".")
    precision = apply_precision(model, plan, torch.device("cpu"))
    prepare_blocks(model, plan)
    if plan.distributed.strategy != "ddp" and precision.param_dtype is not None:
        model.to(precision.param_dtype)  # FSDP2's MixedPrecisionPolicy computes on param_dtype copies of the weights
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    t = plan.train
    tokens = torch.randint(0, model.vocab_size, (t.micro_batch_size, t.seq_len + 1), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), precision.autocast():
        loss = loss_function(plan)(model(tokens[:, :-1]), tokens[:, 1:])  # compiled with the blocks where compile is on
    loss.backward()  # the saved tensors were usable: this is what backward read
    return sum(seen.values())


@pytest.mark.parametrize("keys", [
    {"precision.mode": "bf16"},
    {"precision.mode": "bf16", "activation_checkpointing.mode": "full"},
    {"precision.mode": "bf16", "activation_checkpointing.mode": "selective"},
    {"precision.mode": "fp32"},
    FP8,
    {**FP8, "activation_checkpointing.mode": "full"},
    {**FP8, "precision.torchao.recipe": "rowwise"},
    {"precision.mode": "bf16", "distributed.strategy": "fsdp2"},
    {**FP8, "distributed.strategy": "fsdp2", "activation_checkpointing.mode": "selective"},
    # compiled: the loss keeps the bf16 logits, not the fp32 log-softmax (checkpointed blocks keep only their inputs)
    pytest.param({"precision.mode": "bf16", "distributed.strategy": "fsdp2", "activation_checkpointing.mode": "full",
                  "compile.enabled": True},
                 marks=pytest.mark.slow),  # ~1 min of Inductor on 2 cores
], ids=["bf16", "bf16-full", "bf16-selective", "fp32", "fp8", "fp8-full", "fp8-rowwise", "fsdp2-bf16", "fsdp2-fp8-selective",
        "fsdp2-bf16-full-compiled"])
@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
def test_activation_estimate_is_within_15_percent_of_what_autograd_saves(tmp_path, keys):
    plan, _ = make_plan(tmp_path, **{"distributed.procs_per_node": 1, "distributed.strategy": "ddp",
                                     "train.model": "builtin:llama-debug", "train.seq_len": 128, "train.micro_batch_size": 2, **keys})
    est = estimate(plan, model_params(plan.train.model)).activations
    real = saved_bytes(plan)
    assert est.bytes == pytest.approx(real, rel=0.15), (est.bytes, real)


def test_checkpointing_keeps_a_small_fraction_for_llama3_8b_at_seq_8192(tmp_path):
    def act(mode: str) -> float:
        plan, _ = make_plan(tmp_path / mode, **{"train.model": "builtin:llama3-8b", "train.seq_len": 8192, "train.micro_batch_size": 1,
                                                "distributed.procs_per_node": 8, "launch.device": "cuda",
                                                "activation_checkpointing.mode": mode})
        return estimate(plan, model_params(plan.train.model)).activations.bytes / 2**30

    none, full, selective = act("none"), act("full"), act("selective")
    assert 30 < none < 90  # tens of GiB per GPU
    assert full < none / 6 and full < selective < none
