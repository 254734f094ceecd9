"""train.adam_betas, adam_eps, min_lr_ratio and weight_decay_exclude: the optimizer's parameter groups and
arguments, the lr at given steps, what DeepSpeed and MS-AMP are given, and the ZeRO-0 export's order."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from launcher.planning.read import defaults
from launcher.train.export.read import _zero0_state
from launcher.train.optim import FINAL_LR_FRACTION, build_optimizer, build_scheduler, lr_factor, param_groups
from launcher.train.precision import msamp as msamp_backend

from ._engine_setup import make_plan as plan_in_folder
from ._precision import make_plan


class Block(nn.Module):
    """An embedding, a norm, a Linear with a bias and one without: two 2-D weights, three 1-D parameters."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(8, 4)
        self.norm = nn.LayerNorm(4)  # weight and bias: 1-D
        self.proj = nn.Linear(4, 4)  # weight 2-D, bias 1-D
        self.out = nn.Linear(4, 8, bias=False)


def test_the_defaults_keep_todays_optimizer_and_schedule():
    t = defaults()["train"]
    assert (t["adam_betas"], t["adam_eps"], t["min_lr_ratio"], t["weight_decay_exclude"]) == ([0.9, 0.999], 1e-8, FINAL_LR_FRACTION, "none")
    model = Block()
    opt = build_optimizer(model.parameters(), make_plan(train={"weight_decay": 0.1}).train)
    assert type(opt) is torch.optim.AdamW and len(opt.param_groups) == 1
    (group,) = opt.param_groups
    assert group["params"] == list(model.parameters())  # module order, one group: what the exports rely on
    assert (group["betas"], group["eps"], group["weight_decay"], group["lr"]) == ((0.9, 0.999), 1e-8, 0.1, 3e-4)


@pytest.mark.parametrize("optimizer,cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam)])
def test_adam_betas_and_eps_reach_the_optimizer(optimizer, cls):
    train = make_plan(train={"optimizer": optimizer, "adam_betas": [0.9, 0.95], "adam_eps": 1e-6}).train
    assert train.adam_betas == (0.9, 0.95)
    opt = build_optimizer(Block().parameters(), train)
    assert type(opt) is cls
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["eps"] == 1e-6
    assert all(g["betas"] == (0.9, 0.95) and g["eps"] == 1e-6 for g in opt.param_groups)


def test_norms_and_biases_get_no_weight_decay_in_a_second_group():
    model = Block()
    train = make_plan(train={"weight_decay": 0.1, "weight_decay_exclude": "norms_and_biases"}).train
    opt = build_optimizer(model.parameters(), train)
    decay, no_decay = opt.param_groups
    assert decay["params"] == [model.tok.weight, model.proj.weight, model.out.weight] and decay["weight_decay"] == 0.1
    assert no_decay["params"] == [model.norm.weight, model.norm.bias, model.proj.bias] and no_decay["weight_decay"] == 0.0
    assert decay["betas"] == no_decay["betas"] == (0.9, 0.999)

    # AdamW's decoupled decay with zero gradients: the 2-D weights shrink by lr * wd, the 1-D ones stay as they are
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - 3e-4 * 0.1 if p.ndim == 2 else 1.0
        assert torch.allclose(p.detach(), before[n] * factor, rtol=0, atol=1e-7), n


def test_exclusion_applies_to_sgd_and_drops_an_empty_group_and_frozen_parameters():
    model = Block()
    model.norm.requires_grad_(False)
    train = make_plan(train={"optimizer": "sgd", "weight_decay": 0.01, "weight_decay_exclude": "norms_and_biases"}).train
    opt = build_optimizer(model.parameters(), train)
    assert type(opt) is torch.optim.SGD
    assert [len(g["params"]) for g in opt.param_groups] == [3, 1] and opt.param_groups[1]["weight_decay"] == 0.0
    only_2d = nn.Linear(4, 4, bias=False)
    assert [len(g["params"]) for g in param_groups(only_2d.parameters(), train)] == [1]


def test_lr_decays_to_min_lr_ratio_of_lr():
    assert lr_factor(20, warmup_steps=4, steps=20) == pytest.approx(FINAL_LR_FRACTION)  # the default: today's 10%
    assert lr_factor(20, warmup_steps=4, steps=20, min_lr_ratio=0.0) == pytest.approx(0.0)
    assert lr_factor(12, warmup_steps=4, steps=20, min_lr_ratio=0.0) == pytest.approx(0.5)
    assert lr_factor(12, warmup_steps=4, steps=20, min_lr_ratio=0.2) == pytest.approx(0.2 + 0.8 * 0.5)
    assert [lr_factor(s, warmup_steps=2, steps=10, min_lr_ratio=1.0) for s in (0, 1, 2, 6, 10)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])


@pytest.mark.parametrize("ratio,expected", [
    (None, [1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3 * (0.1 + 0.9 * 0.5), 1e-4]),  # today's schedule: 10% at the end
    (0.0, [1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3 * 0.5, 0.0]),
    (1.0, [1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3, 1e-3]),
])
def test_the_scheduler_sets_these_lrs_on_the_optimizer(ratio, expected):
    train = {"lr": 1e-3, "warmup_steps": 2, "steps": 10, "weight_decay_exclude": "norms_and_biases"}
    plan = make_plan(train=train if ratio is None else {**train, "min_lr_ratio": ratio})
    opt = build_optimizer(Block().parameters(), plan.train)
    sched = build_scheduler(opt, plan.train)
    seen = {}
    for step in range(11):
        seen[step] = [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
    for step, lr in zip((0, 1, 2, 6, 10), expected):
        assert seen[step] == pytest.approx([lr, lr], abs=1e-12), step  # both groups follow the one schedule


def test_the_ddp_engine_builds_the_groups(tmp_path):
    from launcher.train.engines import wrap
    from launcher.train.precision import apply_precision

    from ._engine_setup import CPU, tiny_model, world_of_one

    plan, plan_dir = plan_in_folder(tmp_path, distributed__strategy="ddp", train__weight_decay=0.1,
                                    train__weight_decay_exclude="norms_and_biases", train__adam_betas=[0.8, 0.9], train__adam_eps=1e-7)
    with world_of_one():
        model = tiny_model()
        engine = wrap(model, plan, apply_precision(model, plan, CPU.device), plan_dir, env=CPU,
                      layout=plan.distributed.layout(CPU.world_size))
        decay, no_decay = engine.optimizer.param_groups
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["betas"], decay["eps"]) == (0.1, 0.0, (0.8, 0.9), 1e-7)


def test_deepspeeds_own_adam_gets_the_betas_and_eps(tmp_path):
    plan, plan_dir = plan_in_folder(tmp_path, distributed__strategy="deepspeed", distributed__deepspeed__offload_optimizer="cpu",
                                    train__adam_betas=[0.9, 0.95], train__adam_eps=1e-6)
    params = json.loads((tmp_path / "gen" / "t" / "deepspeed.json").read_text())["optimizer"]["params"]
    assert (params["betas"], params["eps"]) == ([0.9, 0.95], 1e-6)


def test_msamps_optimizer_gets_the_betas_and_eps(msamp_stack):  # MS-AMP's own path, where its stack is installed
    plan = make_plan(precision={"mode": "fp8", "backend": "msamp"}, distributed={"strategy": "ddp", "procs_per_node": 1},
                     train={"adam_betas": [0.9, 0.95], "adam_eps": 1e-6})
    _, kwargs = msamp_backend.msamp_optimizer_args(plan)
    assert (kwargs["betas"], kwargs["eps"]) == ((0.9, 0.95), 1e-6)


def test_the_zero0_export_reads_the_fp32_copies_of_both_groups():
    model = Block()
    module = {n: t.detach().to(torch.bfloat16) for n, t in model.state_dict().items()}
    groups = [[t.float() for t in g["params"]] for g in
              param_groups(model.parameters(), make_plan(train={"weight_decay_exclude": "norms_and_biases"}).train)]
    states = {"module": module, "optimizer": {"fp32_groups": [[t.to(torch.bfloat16).float() for t in g] for g in groups]}}
    weights = _zero0_state(states, "ckpt")
    assert list(weights) == list(module)
    for name, t in weights.items():
        assert t.dtype == torch.float32 and torch.equal(t.to(torch.bfloat16), module[name]), name


def test_adam_runs_torchs_fused_kernel_on_cuda_parameters_only():
    """torchtitan's default optimizer implementation is fused; on a CPU torch's default stays (same numerics as before)."""
    from types import SimpleNamespace

    from launcher.train.optim import adam_implementation

    cuda, cpu = SimpleNamespace(device=torch.device("cuda", 0)), SimpleNamespace(device=torch.device("cpu"))
    assert adam_implementation([cuda, cuda]) == {"fused": True}
    assert adam_implementation([cuda, cpu]) == {} and adam_implementation([]) == {}
    opt = build_optimizer(nn.Linear(4, 4).parameters(), make_plan().train)
    assert opt.defaults["fused"] is None  # CPU parameters: not fused
