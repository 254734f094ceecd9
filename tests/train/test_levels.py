"""MS-AMP's levels natively (issue 30), in-process: the FP8 gradient reduction's blocks and collectives (two real
gloo ranks), torchao's low-bit Adam as fp8launch builds it (states created up front, bytes counted from the live
tensors, bf16 weights rounded stochastically), the bf16 cast of converted models, and the effects read back. The
2-process training runs, their bytes and losses, and resume: tests/e2e/test_levels.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.planning.levels import REDUCE_BLOCK
from launcher.train import effects, optim_lowbit
from launcher.train.parallel.grad_reduce import (
    CommMeter,
    dequantize_rows,
    fp8_all_reduce,
    fp8_reduce_scatter,
    quantize_rows,
    reduce_scatter_class,
)
from launcher.train.precision.master_weights import cast_master_weights

from ._engine_setup import gloo_world, make_plan, spawn_ranks, tiny_model, world_of_one

E4M3_STEP = 2.0**-3
"""e4m3's relative spacing (3 mantissa bits): a value rounds to within half of it, relative to its power of two."""


# --- FP8 blocks and collectives --------------------------------------------------------------------------

def test_fp8_blocks_keep_each_value_within_e4m3_rounding_of_its_block_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1000, generator=g) * torch.tensor([[1e-6], [1.0], [1e4]])  # three rows, very different ranges
    x[1, 300:556] = 0.0  # an all-zero block
    codes, scales = quantize_rows(x)
    assert codes.dtype == torch.uint8 and codes.shape == (3, 1024) and scales.shape == (3, 1024 // REDUCE_BLOCK)
    back = dequantize_rows(codes, scales, 1000)
    assert back.shape == x.shape and torch.equal(back[1, 300:556], x[1, 300:556])
    err = (back - x).abs()
    assert bool((err <= x.abs() * E4M3_STEP / 2 + scales.repeat_interleave(REDUCE_BLOCK, 1)[:, :1000] * 2.0**-9).all())
    # each block's largest value maps to e4m3's max, 448, and comes back (to fp32 rounding of amax / 448 x 448)
    blocks = x[:, :768].reshape(3, 3, REDUCE_BLOCK)
    top = blocks.abs().argmax(-1, keepdim=True)
    assert torch.allclose(blocks.gather(-1, top), back[:, :768].reshape(3, 3, REDUCE_BLOCK).gather(-1, top), rtol=1e-6, atol=0)
    nan = x.clone()
    nan[0, 5] = float("nan")
    assert math.isnan(dequantize_rows(*quantize_rows(nan), 1000)[0, 5].item())


def _collectives_worker(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    n = 1000  # not a multiple of the world size times the block: both paddings
    values = torch.randn(world_size, n, generator=torch.Generator().manual_seed(1)) * 3
    with gloo_world(rank, world_size, port):
        group = dist.group.WORLD
        meter = CommMeter()
        mean = fp8_all_reduce(values[rank].clone(), group, meter)
        sent_all_reduce = meter.take()
        chunk = 512
        rs_in = torch.randn(world_size, world_size * chunk, generator=torch.Generator().manual_seed(2))[rank].view(world_size, chunk)
        summed = fp8_reduce_scatter(rs_in, group, meter)
        sent_reduce_scatter = meter.take()
        # FSDP2's interface: the custom reduce-scatter against dist's own reduce-scatter of the same input
        comm = reduce_scatter_class()("fp8", meter)
        flat = torch.randn(world_size * 700, generator=torch.Generator().manual_seed(3 + rank))
        got = comm.allocate((700,), dtype=torch.float32, device=torch.device("cpu"))
        comm(got, flat.clone(), group, dist.ReduceOp.SUM)
        exact = torch.empty(700)
        dist.reduce_scatter_tensor(exact, flat.clone(), op=dist.ReduceOp.SUM, group=group)
        bf16 = reduce_scatter_class()("bf16", meter)
        meter.take()
        got_bf16 = torch.empty(700)
        bf16(got_bf16, flat.clone(), group, dist.ReduceOp.AVG)
        torch.save({"mean": mean, "sent_all_reduce": sent_all_reduce, "summed": summed, "sent_reduce_scatter": sent_reduce_scatter,
                    "got": got, "exact": exact, "got_bf16": got_bf16, "sent_bf16": meter.take()}, f"{out}/rank{rank}.pt")


def test_fp8_all_reduce_gives_every_rank_the_same_mean_and_meters_half_of_bf16s_bytes(tmp_path):
    """Two gloo ranks: the FP8 all-reduce (reduce-scatter, fp32 sum, all-gather) returns bit-identical values on both
    ranks (DDP's replicas stay in sync) within FP8 rounding of the exact mean; its bytes are the ring formula over
    the padded codes and scales; the reduce-scatter alone and FSDP2's custom reduce-scatter match dist's."""
    spawn_ranks(_collectives_worker, 2, str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(r0["mean"], r1["mean"])
    values = torch.randn(2, 1000, generator=torch.Generator().manual_seed(1)) * 3
    exact = values.mean(0)
    assert (r0["mean"] - exact).abs().max() <= 2 * E4M3_STEP / 2 * values.abs().max()  # two roundings, each within a block's amax
    assert (r0["mean"] - exact).abs().mean() < 0.04 * values.abs().mean()  # ~2% of a value per e4m3 rounding, on average
    # 1000 values -> 2 chunks of 500 -> 512 padded (2 blocks): per rank 2 x (512 codes + 2 x 4 scale bytes)
    payload = 2 * (512 + 2 * 4)
    assert r0["sent_all_reduce"] == r1["sent_all_reduce"] == payload // 2 + payload // 2  # reduce-scatter + all-gather
    assert r0["sent_all_reduce"] <= 0.6 * (2 * (1 / 2) * 1000 * 2)  # vs a bf16 ring all-reduce of the same 1000 values
    assert r0["sent_reduce_scatter"] == (2 * (512 + 2 * 4)) // 2
    for r in (r0, r1):
        assert torch.allclose(r["got"], r["exact"], rtol=0.07, atol=0.07 * r["exact"].abs().max().item())
        assert torch.allclose(r["got_bf16"], r["exact"] / 2, rtol=1e-2, atol=1e-2)
        assert r["sent_bf16"] == 1400 * 2 // 2  # half of 1,400 bf16 values leaves each rank


# --- torchao's low-bit Adam as built ----------------------------------------------------------------------

def _train_config(**over):
    from tests.train._precision import make_plan as precision_plan

    return precision_plan(train={"lr": 1e-2, "weight_decay": 0.1, **over}).train


def _weights(seed: int = 0) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(64, 128, generator=g)), nn.Parameter(torch.randn(128, generator=g))]


@pytest.mark.parametrize("states, cls, codes", [("fp8", "AdamWFp8", "OptimStateFp8"), ("int8", "AdamW8bit", "OptimState8bit")])
def test_states_exist_before_the_first_step_and_train_as_torchaos_own_lazy_ones(states, cls, codes):
    import torchao.optim

    ours, theirs = _weights(), _weights()
    opt = optim_lowbit.build([{"params": ours}], _train_config(), states=states, master="fp32")
    assert type(opt).__name__ == cls and optim_lowbit.states_dtype(opt) == states
    assert type(opt.state[ours[0]]["exp_avg"]).__name__ == codes  # 8192 values: quantized
    assert type(opt.state[ours[1]]["exp_avg"]) is torch.Tensor  # 128 values: torchao keeps them in fp32
    lazy = getattr(torchao.optim, cls)([{"params": theirs}], lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in ours]
        for p, q, grad in zip(ours, theirs, grads):
            p.grad, q.grad = grad.clone(), grad.clone()
        opt.step()
        lazy.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))
    a, b = opt.state[ours[0]]["exp_avg"], lazy.state[theirs[0]]["exp_avg"]
    assert torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    assert float(opt.state[ours[0]]["step"]) == 3.0


def test_state_bytes_are_the_codes_and_scales_the_state_holds():
    weight = nn.Parameter(torch.randn(256, 64))
    fp8 = optim_lowbit.build([{"params": [weight]}], _train_config(), states="fp8", master="fp32")
    per_moment = 256 * 64 * 1 + 256 * 64 // 256 * 4  # e4m3 codes + one fp32 scale per 256 values
    assert optim_lowbit.state_bytes(fp8) == 2 * per_moment + 4  # + the fp32 step count
    int8 = optim_lowbit.build([{"params": [weight]}], _train_config(), states="int8", master="fp32")
    assert optim_lowbit.state_bytes(int8) == 2 * (per_moment + 256 * 4) + 4  # + each state's 256-entry code map
    dense = optim_lowbit.build([{"params": [weight]}], _train_config(), states="bf16", master="fp32")
    assert type(dense).__name__ == "AdamWBf16States" and optim_lowbit.state_bytes(dense) == 2 * 256 * 64 * 2 + 4
    torch_adam = torch.optim.AdamW([weight])
    weight.grad = torch.ones_like(weight)
    torch_adam.step()
    assert optim_lowbit.state_bytes(torch_adam) == 2 * 256 * 64 * 4 + 4 and optim_lowbit.states_dtype(torch_adam) == "fp32"


def test_bf16_master_weights_take_updates_smaller_than_bf16s_step():
    """AdamW's step is ~lr per step: 1e-4 is a fortieth of bf16's spacing at 1.0 (2^-7 = 0.0078). Rounded to nearest,
    the weight would never move; rounded stochastically it moves by the sum of the updates on average."""
    weight = nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    opt = optim_lowbit.build([{"params": [weight]}], _train_config(lr=1e-4, weight_decay=0.0), states="fp32", master="bf16")
    assert type(opt).__name__ == "AdamWFp32States" and opt.bf16_stochastic_round
    assert opt.state[weight]["exp_avg"].dtype == torch.float32 and weight.dtype == torch.bfloat16
    torch.manual_seed(0)
    for _ in range(100):
        weight.grad = torch.ones_like(weight)
        opt.step()
    assert weight.dtype == torch.bfloat16
    assert abs(weight.float().mean().item() - (1 - 100 * 1e-4)) < 0.002  # 0.99 on average, not stuck at 1.0
    assert len(weight.unique()) > 1  # each weight rounded on its own draw


def test_cast_master_weights_replaces_torchaos_float8_all_gather_wrappers_and_keeps_ties():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 32), nn.Linear(32, 64, bias=False))
    model[2].weight = model[0].weight  # tied
    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True),
                               module_filter_fn=lambda m, fqn: fqn == "1")
    wrapped = model[1].weight
    assert type(wrapped).__name__ == "WeightWithDynamicFloat8CastTensor" and wrapped._tensor.dtype == torch.float32
    assert cast_master_weights(model) == 3  # embedding/head (tied), the wrapped weight and its bias
    assert type(model[1].weight).__name__ == "WeightWithDynamicFloat8CastTensor" and model[1].weight._tensor.dtype == torch.bfloat16
    assert model[0].weight is model[2].weight and model[0].weight.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


# --- effects ---------------------------------------------------------------------------------------------

def test_the_levels_are_read_back_from_the_live_engine_and_a_missing_one_is_named(tmp_path):
    from launcher.train.engines import wrap
    from launcher.train.precision import apply_precision

    plan, plan_dir = make_plan(tmp_path, precision__mode="bf16", precision__optimizer_states="fp8", precision__grad_reduce="fp8",
                               precision__master_weights="bf16", distributed__strategy="ddp")
    with world_of_one() as env:
        model = tiny_model()
        precision = apply_precision(model, plan, env.device)
        cast_master_weights(model)
        engine = wrap(model, plan, precision, plan_dir, env=env, layout=plan.distributed.layout(env.world_size))
        got = effects.measure(engine)
        assert (got["optimizer"], got["optimizer_states"], got["grad_reduce"], got["master_weights"]) == ("AdamWFp8", "fp8", "fp8", "bf16")
        assert effects.missing(plan, got, 2) == ()
        assert "optimizer AdamWFp8 (fp8 moments), master weights bf16, gradients reduced in fp8" in effects.effects_line(got)
    default, default_dir = make_plan(tmp_path / "d", precision__mode="bf16", distributed__strategy="ddp")
    with world_of_one() as env:
        model = tiny_model()
        engine = wrap(model, default, apply_precision(model, default, env.device), default_dir, env=env,
                      layout=default.distributed.layout(env.world_size))
        got = effects.measure(engine)
        assert (got["optimizer"], got["optimizer_states"], got["grad_reduce"], got["master_weights"]) == ("AdamW", "fp32", "fp32", "fp32")
    assert effects.missing(plan, got, 2) == (  # what the levels' plan would say of a run built without them (EFFECT-MISSING)
        "precision.optimizer_states needs optimizer_states = fp8, and this run has 'fp32'",
        "precision.grad_reduce needs grad_reduce = fp8, and this run has 'fp32'",
        "precision.master_weights needs master_weights = bf16, and this run has 'fp32'")
