"""launcher/train/parallel/tensor_parallel.py: the TP plan of the builtin Llama.

Fast: what `parallelize` refuses (models without a plan, head counts, async TP off CUDA), which
recipes carry float8 over the TP collectives, and the data split of a TP group.
Slow (2 real gloo ranks): a TP model computes the unsharded model's logits and gradients with
n_heads / tp local heads; a rowwise FP8 model runs with the plain (bf16-collective) styles; a
layer kept in high precision gets the plain style while its neighbours keep the float8 ones.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from torch import nn

from launcher.errors import EnvironmentProblem, LauncherError
from launcher.planning.layout import Layout
from launcher.train.parallel.tensor_parallel import _enable_async_tp, float8_tp, parallelize

from ._engine_setup import gloo_world, spawn_ranks, tiny_model
from ._precision import make_plan

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")


def tp_plan(tp: int = 2, precision: dict | None = None, **distributed):
    return make_plan(precision=precision or {"mode": "fp32"},
                     distributed={"strategy": "fsdp2", "procs_per_node": 2 * tp, "tensor_parallel": tp, **distributed},
                     train={"seq_len": 16})


class FakeMesh:
    """The two things parallelize asks of a mesh before it shards anything."""

    def __init__(self, size: int, device_type: str = "cpu"):
        self._size, self.device_type = size, device_type

    def size(self) -> int:
        return self._size


def test_tp_of_one_is_a_no_op():
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert parallelize(model, make_plan(distributed={"strategy": "fsdp2"}), FakeMesh(1)) is model
    assert all(type(v) is torch.Tensor and torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_model_without_a_tp_plan_is_refused_naming_the_key():
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8)])

    with pytest.raises(LauncherError) as e:
        parallelize(Other(), tp_plan(2), FakeMesh(2))
    assert str(e.value).startswith("error: distributed.tensor_parallel = 2 needs a model with a tensor-parallel plan, and Other has none")
    assert "fix: set distributed.tensor_parallel = 1" in str(e.value)


def test_head_counts_tp_does_not_divide_are_refused():
    model = tiny_model()  # 8 attention heads, 4 KV heads
    with pytest.raises(LauncherError, match="does not divide the model's 4 KV heads"):
        parallelize(model, tp_plan(8), FakeMesh(8))
    with pytest.raises(LauncherError, match="the tensor-parallel mesh has 4 ranks but the plan says 2"):
        parallelize(model, tp_plan(2), FakeMesh(4))


def test_compiled_tp_blocks_are_refused_on_cpu_at_run_time():
    """launch.device = "auto" on a machine without a GPU: the plan-time rule could not see it."""
    plan = make_plan(precision={"mode": "bf16"}, compile={"enabled": True}, launch={"device": "auto"},
                     distributed={"strategy": "fsdp2", "procs_per_node": 2, "tensor_parallel": 2}, train={"seq_len": 16})
    with pytest.raises(EnvironmentProblem) as e:
        parallelize(tiny_model(), plan, FakeMesh(2, "cpu"))
    assert e.value.exit_code == 3 and e.value.rule == "TP-COMPILE-CPU"
    assert "fix: set compile.enabled = false" in str(e.value)


def test_async_tp_needs_cuda():
    with pytest.raises(EnvironmentProblem) as e:
        _enable_async_tp(FakeMesh(2, "cpu"))
    assert e.value.exit_code == 3 and e.value.rule == "TP-ASYNC-CPU"
    assert "fix: set distributed.async_tp = false" in str(e.value)


def test_float8_collectives_only_with_torchao_tensorwise():
    tao = {"mode": "fp8", "backend": "torchao"}
    assert float8_tp(tp_plan(precision={**tao, "torchao": {"recipe": "tensorwise"}}))
    assert not float8_tp(tp_plan(precision={**tao, "torchao": {"recipe": "rowwise"}}))
    assert not float8_tp(tp_plan(precision={**tao, "torchao": {"recipe": "rowwise_with_gw_hp"}}))
    assert not float8_tp(tp_plan(precision={"mode": "bf16"}))


def test_a_tp_group_reads_one_data_parallel_rank():
    assert [Layout.of_degrees(8, tp=2).data_rank(r) for r in range(8)] == [(0, 4), (0, 4), (1, 4), (1, 4), (2, 4), (2, 4), (3, 4), (3, 4)]
    assert [Layout.of_degrees(8).data_rank(r)[0] for r in range(8)] == list(range(8))


# -- two real ranks ----------------------------------------------------------------------------

def _loss_and_grads(model, tokens):
    from launcher.train.models import logits_of

    logits = logits_of(model(tokens[:, :-1]))
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731
    return logits.detach(), loss.detach(), {n: full(p.grad).detach() for n, p in model.named_parameters()}


def _fp32_worker(rank: int, world_size: int, port: int, out: str, plan) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    tokens = torch.randint(0, 2048, (2, 17), generator=torch.Generator().manual_seed(0))
    reference = tiny_model(seed=3)
    ref_logits, ref_loss, ref_grads = _loss_and_grads(reference, tokens)
    with gloo_world(rank, world_size, port):
        model = tiny_model(seed=3)
        parallelize(model, plan, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
        attn = model.layers[0].attention
        local = {n: tuple(getattr(attn, n).weight.to_local().shape) for n in ("wq", "wk", "wv", "wo")}
        logits, loss, grads = _loss_and_grads(model, tokens)
        placements = {n: str(p.placements[0]) for n, p in model.named_parameters()}
        if rank == 0:
            torch.save({"local": local, "logits": (logits, ref_logits), "loss": (loss, ref_loss), "grads": (grads, ref_grads),
                        "placements": placements}, os.path.join(out, "result.pt"))


@pytest.mark.slow
def test_tp_computes_the_unsharded_models_logits_and_gradients(tmp_path):
    """fp32, TP 2: every rank holds 4 of 8 query heads and 2 of 4 KV heads; logits, loss and every
    gradient equal the unsharded model's up to float reassociation."""
    spawn_ranks(_fp32_worker, 2, str(tmp_path), tp_plan(2))
    r = torch.load(tmp_path / "result.pt")
    head_dim = 256 // 8
    assert r["local"] == {"wq": (4 * head_dim, 256), "wk": (2 * head_dim, 256), "wv": (2 * head_dim, 256), "wo": (256, 4 * head_dim)}
    assert r["placements"]["layers.0.attention.wq.weight"] == "S(0)"  # column-wise: output features
    assert r["placements"]["layers.0.attention.wo.weight"] == "S(1)"  # row-wise: input features
    assert r["placements"]["tok_embeddings.weight"] == "S(0)"  # vocabulary rows
    assert r["placements"]["layers.0.ffn_norm.weight"] == "R"  # sequence parallel norms
    logits, ref = r["logits"]
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(*r["loss"], rtol=1e-5, atol=1e-6)
    grads, ref_grads = r["grads"]
    assert grads.keys() == ref_grads.keys() and len(grads) == 21
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-3, atol=1e-6, msg=name)


def _fp8_worker(rank: int, world_size: int, port: int, out: str, plan) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from launcher.train.parallel.tensor_parallel import tp_styles_used
    from launcher.train.precision import apply_precision

    torch.set_num_threads(1)
    tokens = torch.randint(0, 2048, (2, 17), generator=torch.Generator().manual_seed(0))
    reference = tiny_model(seed=3)
    apply_precision(reference, plan, torch.device("cpu"))
    _, ref_loss, _ = _loss_and_grads(reference, tokens)
    with gloo_world(rank, world_size, port):
        model = tiny_model(seed=3)
        precision = apply_precision(model, plan, torch.device("cpu"))
        parallelize(model, plan, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
        with precision.autocast():
            _, loss, grads = _loss_and_grads(model, tokens)
        if rank == 0:
            torch.save({"styles": tp_styles_used(model), "loss": (loss, ref_loss), "fp8_layers": precision.report.fp8_layers,
                        "finite": all(bool(torch.isfinite(g).all()) for g in grads.values())}, os.path.join(out, "result.pt"))


FP8_PRECISION = {"mode": "fp8", "backend": "torchao", "high_precision": "bf16"}


@pytest.mark.slow
@needs_torchao
def test_rowwise_fp8_under_tp_uses_the_plain_styles(tmp_path):
    """torchao has float8 TP styles for tensorwise only: rowwise runs its FP8 GEMMs on bf16 collectives."""
    plan = tp_plan(2, precision={**FP8_PRECISION, "torchao": {"recipe": "rowwise", "skip_small": False}})
    spawn_ranks(_fp8_worker, 2, str(tmp_path), plan)
    r = torch.load(tmp_path / "result.pt")
    assert r["fp8_layers"] == 13
    styles = r["styles"]
    assert not any(s.startswith("Float8") or s == "PrepareFloat8ModuleInput" for s in styles.values()), styles
    assert styles["layers.1.feed_forward.w1"] == "ColwiseParallel" and styles["layers.1.attention.wo"] == "RowwiseParallel"
    assert styles["layers.1.attention"] == "PrepareModuleInput" and styles["norm"] == "SequenceParallel"
    assert r["finite"]
    loss, ref = r["loss"]
    assert float(loss) == pytest.approx(float(ref), rel=0.02)


@pytest.mark.slow
@needs_torchao
def test_tensorwise_fp8_uses_float8_styles_except_where_a_layer_is_kept(tmp_path):
    """precision.keep leaves layers.1.feed_forward.w1 in bf16: it and the FFN input get the plain styles
    (a float8 input cast there would feed a bf16 GEMM), w3 and w2 and the other blocks the float8 ones."""
    plan = tp_plan(2, precision={**FP8_PRECISION, "keep": ["layers.1.feed_forward.w1"],
                                 "torchao": {"recipe": "tensorwise", "skip_small": False}})
    spawn_ranks(_fp8_worker, 2, str(tmp_path), plan)
    r = torch.load(tmp_path / "result.pt")
    styles = r["styles"]
    assert r["fp8_layers"] == 12
    assert styles["layers.1.feed_forward"] == "PrepareModuleInput"
    assert styles["layers.1.feed_forward.w1"] == "ColwiseParallel"
    assert styles["layers.1.feed_forward.w3"] == "Float8ColwiseParallel"
    assert styles["layers.1.feed_forward.w2"] == "Float8RowwiseParallel"
    assert styles["layers.1.attention"] == "PrepareFloat8ModuleInput"
    assert styles["layers.0.attention"] == "PrepareModuleInput"  # layers.0.attention.wq is kept (keep_first_last)
    assert styles["layers.0.feed_forward"] == "PrepareFloat8ModuleInput"
    assert styles["output"] == "ColwiseParallel" and styles["tok_embeddings"] == "RowwiseParallel"
    assert r["finite"]
    loss, ref = r["loss"]
    assert float(loss) == pytest.approx(float(ref), rel=0.02)
