"""The engines, activation checkpointing / compile wrapping, and device resolution, in one
process (a gloo world of one). The multi-process runs are in tests/e2e."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from launcher.errors import EXIT_ENVIRONMENT, EnvironmentProblem, LauncherError
from launcher.train.compile_ac import prepare_blocks
from launcher.train.engines import read_config, wrap
from launcher.train.loss import cross_entropy
from launcher.train.models import transformer_blocks
from launcher.train.parallel import distributed
from launcher.train.precision import apply_precision

from ._engine_setup import CPU, make_plan, tiny_model, token_batches, world_of_one


@pytest.fixture(scope="module")
def world():
    with world_of_one() as env:
        yield env


def _one_step(engine, batch):
    with engine.micro_batch(last=True):
        loss = cross_entropy(engine.forward(batch[:, :-1]), batch[:, 1:])
        engine.backward(loss, last=True)
    norm = engine.clip_grad_norm(1.0)
    engine.step()
    engine.zero_grad()
    return loss.item(), norm


def _wrapped(tmp_path, **keys):
    plan, plan_dir = make_plan(tmp_path, **keys)
    model = tiny_model()
    precision = apply_precision(model, plan, CPU.device)
    blocks = prepare_blocks(model, plan)
    return plan, model, wrap(model, plan, precision, plan_dir, env=CPU, layout=plan.distributed.layout(CPU.world_size), blocks=blocks)


def test_ddp_trains_and_follows_the_schedule(world, tmp_path):
    plan, model, engine = _wrapped(tmp_path, distributed__strategy="ddp", precision__mode="bf16", train__warmup_steps=2)
    assert isinstance(engine.model, nn.parallel.DistributedDataParallel) and engine.module is model
    assert engine.lr() == pytest.approx(plan.train.lr / 3)
    before = model.output.weight.detach().clone()
    loss, norm = _one_step(engine, token_batches(1)[0])
    assert 7 < loss < 8.5 and norm.item() > 0  # ~ln(2048) at init
    assert not torch.equal(model.output.weight, before)
    assert engine.lr() == pytest.approx(2 * plan.train.lr / 3)
    assert model.output.weight.dtype == torch.float32  # bf16 by autocast; the weights stay fp32


@pytest.mark.parametrize("max_grad_norm", [1e-3, 0.0])
def test_max_grad_norm_clips_the_gradients_and_zero_leaves_them(world, tmp_path, max_grad_norm):
    plan, model, engine = _wrapped(tmp_path, distributed__strategy="ddp", precision__mode="fp32",
                                   train__max_grad_norm=max_grad_norm)
    batch = token_batches(1)[0]
    with engine.micro_batch(last=True):
        engine.backward(cross_entropy(engine.forward(batch[:, :-1]), batch[:, 1:]), last=True)
    before = engine.clip_grad_norm(plan.train.max_grad_norm)  # as the loop calls it
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    assert before > 1e-2
    assert after.item() == pytest.approx(max_grad_norm or before.item(), rel=1e-4)
    engine.zero_grad()


def test_fsdp2_shards_blocks_then_root_as_fsdp2_json_says(world, tmp_path):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    plan, model, engine = _wrapped(tmp_path, distributed__strategy="fsdp2", precision__mode="bf16",
                                   distributed__fsdp2__reshard_after_forward=False)
    blocks = transformer_blocks(model)
    assert all(isinstance(b, FSDPModule) for b in blocks) and isinstance(engine.model, FSDPModule)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    # the embedding a unit of its own, the final norm and the head one more, kept gathered after forward
    units = {name: m._get_fsdp_state() for name, m in model.named_modules() if isinstance(m, FSDPModule)}
    assert set(units) == {"", "tok_embeddings", "norm", "output", "layers.0", "layers.1"}
    assert units["norm"] is units["output"] and len({id(u) for u in units.values()}) == 5
    groups = {name: u._fsdp_param_group for name, u in units.items()}
    assert groups[""] is None  # the root holds no parameter of its own any more
    assert groups["output"].post_forward_mesh_info is None and groups["tok_embeddings"].post_forward_mesh_info is None
    policy = blocks[0]._get_fsdp_state()._fsdp_param_group.fsdp_params[0].mp_policy  # per parameter (torch 2.15: only there)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    loss, norm = _one_step(engine, token_batches(1)[0])
    assert 7 < loss < 8.5 and isinstance(norm, torch.Tensor) and not isinstance(norm, DTensor)


def test_fsdp2_follows_the_units_fsdp2_json_lists(world, tmp_path):
    """A plan written before the embedding and the head were units of their own keeps its two; a model whose
    embedding is tied to its head keeps both in the root (one parameter lives in one unit)."""
    from torch.distributed.fsdp import FSDPModule

    from launcher.train.models import edge_units

    plan, plan_dir = make_plan(tmp_path, distributed__strategy="fsdp2", precision__mode="bf16")
    config = json.loads((Path(plan_dir) / "fsdp2.json").read_text())
    assert config["units"] == ["embedding", "transformer_block", "output", "root"]
    config["units"] = ["transformer_block", "root"]
    (Path(plan_dir) / "fsdp2.json").write_text(json.dumps(config))
    model = tiny_model()
    engine = wrap(model, plan, apply_precision(model, plan, CPU.device), plan_dir, env=CPU,
                  layout=plan.distributed.layout(CPU.world_size), blocks=prepare_blocks(model, plan))
    assert not isinstance(model.tok_embeddings, FSDPModule) and not isinstance(model.output, FSDPModule)
    assert engine.model._get_fsdp_state()._fsdp_param_group is not None  # embedding, norm and head in the root
    tied = tiny_model()
    tied.output.weight = tied.tok_embeddings.weight
    assert edge_units(tied) == (None, [])
    assert edge_units(tiny_model())[1][1].out_features == 2048


def test_fsdp2_initialises_a_meta_model_unit_by_unit_as_materialising_it_whole_does(world, tmp_path):
    """The entrypoint's path (build on meta, fully_shard, then storage and weights) with the embedding and the head
    as FSDP2 units of their own (their classes cannot be copied the usual way): the weights of a whole materialisation."""
    from launcher.train.materialize import Pending
    from launcher.train.models import build_for_run

    plan, plan_dir = make_plan(tmp_path, distributed__strategy="fsdp2", precision__mode="bf16")
    whole, init = build_for_run("builtin:llama-debug?layers=2", ".")
    Pending(init, seed=plan.train.seed)(whole, "cpu")
    model, init = build_for_run("builtin:llama-debug?layers=2", ".")
    precision = apply_precision(model, plan, CPU.device)
    engine = wrap(model, plan, precision, plan_dir, env=CPU,
                  layout=plan.distributed.layout(CPU.world_size), blocks=prepare_blocks(model, plan, precision),
                  pending=Pending(init, seed=plan.train.seed))
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(model.tok_embeddings, FSDPModule) and isinstance(model.output, FSDPModule)
    for name, p in whole.state_dict().items():
        assert torch.equal(model.state_dict()[name].full_tensor(), p), name
    loss, _ = _one_step(engine, token_batches(1, vocab=model.vocab_size)[0])
    assert 6 < loss < 10


def test_fsdp2_cpu_offload_runs_on_a_cpu_machine(world, tmp_path):
    from torch.distributed.fsdp import CPUOffloadPolicy

    plan, model, engine = _wrapped(tmp_path, distributed__strategy="fsdp2", precision__mode="bf16", distributed__fsdp2__cpu_offload=True)
    policy = engine.module.tok_embeddings._get_fsdp_state()._fsdp_param_group.offload_policy
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False  # pinning needs an accelerator
    loss, _ = _one_step(engine, token_batches(1)[0])
    assert 7 < loss < 8.5


def test_fsdp2_refuses_a_config_that_disagrees_with_the_job(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="fsdp2", precision__mode="bf16")
    config = read_config(plan_dir, "fsdp2.json")
    config["mesh"]["shape"] = [4]
    (tmp_path / "gen" / "t" / "fsdp2.json").write_text(json.dumps(config))
    model = tiny_model()
    with pytest.raises(LauncherError, match="mesh of \\[4\\] but this job has world size 1"):
        wrap(model, plan, apply_precision(model, plan, CPU.device), plan_dir, env=CPU, layout=plan.distributed.layout(CPU.world_size))
    config["mesh"]["shape"], config["mixed_precision"]["param_dtype"] = [1], "float16"
    (tmp_path / "gen" / "t" / "fsdp2.json").write_text(json.dumps(config))
    with pytest.raises(LauncherError, match="param_dtype float16 but the precision"):
        wrap(model, plan, apply_precision(model, plan, CPU.device), plan_dir, env=CPU, layout=plan.distributed.layout(CPU.world_size))


def test_a_missing_engine_config_says_how_to_get_it(tmp_path):
    with pytest.raises(LauncherError, match="deepspeed.json is missing; fix: regenerate the plan"):
        read_config(str(tmp_path), "deepspeed.json")


def test_deepspeed_zero2_accumulates_and_steps_at_the_boundary(world, tmp_path):
    plan, model, engine = _wrapped(tmp_path, distributed__strategy="deepspeed", precision__mode="fp32",
                                   distributed__deepspeed__zero_stage=2, train__grad_accum_steps=2)
    assert engine.clips_in_step and engine.clip_grad_norm(1.0) is None
    lr0 = engine.lr()
    weight = lambda: engine.module.output.weight.detach().clone()  # noqa: E731
    before = weight()
    batches = token_batches(2)
    for i, batch in enumerate(batches):
        last = i == 1
        loss = cross_entropy(engine.forward(batch[:, :-1]), batch[:, 1:])
        engine.backward(loss, last)
        if not last:
            assert torch.equal(weight(), before)  # no optimizer step before the boundary
    engine.step()
    assert not torch.equal(weight(), before) and engine.model.global_steps == 1
    assert engine.lr() < lr0


def test_deepspeed_zero2_trains_with_sgd(world, tmp_path):
    """deepspeed.json allows torch.optim.SGD under ZeRO (DeepSpeed calls it "untested" and refuses it otherwise)."""
    plan, model, engine = _wrapped(tmp_path, distributed__strategy="deepspeed", precision__mode="fp32", train__optimizer="sgd")
    assert type(engine.optimizer.optimizer).__name__ == "SGD"
    from deepspeed.comm import comm

    assert comm.cdb.shm_comm_op is None  # DeepSpeed's CPU backend without its inference-only shared-memory op
    before = engine.module.output.weight.detach().clone()
    batch = token_batches(1)[0]
    engine.backward(cross_entropy(engine.forward(batch[:, :-1]), batch[:, 1:]), True)
    engine.step()
    assert not torch.equal(engine.module.output.weight, before)


def test_deepspeed_zero3_gets_a_meta_model_partitioned_module_by_module_before_initialize(world, tmp_path, monkeypatch):
    """ZeRO-3 with a meta-built model: every parameter is already a ZeRO-3 parameter in the config's dtype
    when deepspeed.initialize sees the model (nothing was materialised whole), holding the model's own
    initial weights; it trains. World 2 (weights equal to FSDP2's at world 1): tests/e2e/test_meta_init.py."""
    import deepspeed

    from launcher.train.materialize import Pending
    from launcher.train.models import build_for_run

    plan, plan_dir = make_plan(tmp_path, distributed__strategy="deepspeed", distributed__deepspeed__zero_stage=3,
                               precision__mode="bf16")
    reference, init = build_for_run("builtin:llama-debug?layers=1", ".")
    Pending(init, seed=plan.train.seed)(reference, "cpu")
    model, init = build_for_run("builtin:llama-debug?layers=1", ".")
    seen = []
    real = deepspeed.initialize

    def initialize(**kw):
        seen.append({(hasattr(q, "ds_id"), q.dtype) for q in kw["model"].parameters()})
        return real(**kw)

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    precision = apply_precision(model, plan, CPU.device)
    engine = wrap(model, plan, precision, plan_dir, env=CPU,
                  layout=plan.distributed.layout(CPU.world_size), blocks=prepare_blocks(model, plan),
                  pending=Pending(init, seed=plan.train.seed))
    assert seen == [{(True, torch.bfloat16)}]
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        got = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert got.keys() == reference.state_dict().keys()
    for k, v in reference.state_dict().items():
        assert torch.equal(got[k], v.to(torch.bfloat16)), k
    batch = token_batches(1, vocab=model.vocab_size)[0]
    before = got["output.weight"]
    loss, _ = _one_step(engine, batch)
    assert 6 < loss < 10  # ~ln(vocab) at init: the builtin init, not garbage
    with deepspeed.zero.GatheredParameters([model.output.weight]):
        assert not torch.equal(model.output.weight.detach(), before)


@pytest.mark.parametrize("mode, wrapped", [("none", []), ("full", [0, 1, 2, 3]), ("selective", [0, 2])])
def test_activation_checkpointing_wraps_the_right_blocks(tmp_path, mode, wrapped):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    plan, _ = make_plan(tmp_path, activation_checkpointing__mode=mode)
    torch.manual_seed(0)
    from launcher.train.models import build_model

    model = build_model("builtin:llama-debug", ".")
    blocks = prepare_blocks(model, plan)
    assert [i for i, b in enumerate(blocks) if isinstance(b, CheckpointWrapper)] == wrapped
    assert [b is m for b, m in zip(blocks, model.layers)] == [True] * 4
    assert all(k.startswith(("tok_embeddings", "layers", "norm", "output")) and "_checkpoint_wrapped_module" not in k
               for k in model.state_dict())  # checkpoints keep the plain parameter names


def test_checkpointed_blocks_give_the_same_gradients(tmp_path):
    plan, _ = make_plan(tmp_path, activation_checkpointing__mode="full")
    batch = token_batches(1)[0]
    grads = []
    for checkpoint in (False, True):
        model = tiny_model()
        if checkpoint:
            prepare_blocks(model, plan)
        cross_entropy(model(batch[:, :-1]), batch[:, 1:]).backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    names = {k.replace("._checkpoint_wrapped_module", "") for k in grads[1]}
    assert names == set(grads[0])
    for k, g in grads[1].items():
        torch.testing.assert_close(g, grads[0][k.replace("._checkpoint_wrapped_module", "")])


def test_compile_wraps_each_block_with_the_plan_mode(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: calls.append(kw) or nn.Sequential(m))
    plan, _ = make_plan(tmp_path, compile__enabled=True, compile__mode="max-autotune-no-cudagraphs", compile__fullgraph=True,
                        activation_checkpointing__mode="selective")
    model = tiny_model()
    blocks = prepare_blocks(model, plan)
    assert calls == [{"mode": "max-autotune-no-cudagraphs", "fullgraph": True}] * 2
    assert all(isinstance(b, nn.Sequential) for b in blocks) and list(model.layers) == blocks


def test_device_resolution():
    assert distributed.resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert distributed.resolve_device("auto") == torch.device("cpu")
        with pytest.raises(EnvironmentProblem) as e:
            distributed.resolve_device("cuda")
        assert e.value.exit_code == EXIT_ENVIRONMENT
        assert str(e.value).startswith('error: launch.device = "cuda" but torch sees no CUDA GPU here')
        assert 'set launch.device = "cpu"' in str(e.value)


def test_a_job_of_another_size_than_the_plan_is_refused():
    with pytest.raises(EnvironmentProblem, match="the plan is for world size 4 .* but 1 processes were started"):
        distributed.check_world(4, CPU)


def test_deepspeed_imports_without_mlflow_and_mlflow_still_imports_after(tmp_path):
    """A fresh process: import_deepspeed leaves mlflow unimported (DeepSpeed's autotuner, the only user, goes without
    it), and `import mlflow` afterwards, as a run logging to MLflow does, gives the real module."""
    import subprocess
    import sys

    if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("mlflow") is None:
        pytest.skip("needs deepspeed and mlflow")
    code = ("import sys, torch\n"
            "from launcher.train.engines.deepspeed_engine import import_deepspeed\n"
            "ds = import_deepspeed(torch.device('cpu'))\n"
            "import deepspeed.autotuning.autotuner as tuner\n"
            "print(ds.__name__, 'mlflow' in sys.modules, tuner.has_mlflow)\n"
            "import mlflow\n"
            "print(mlflow.__name__, callable(mlflow.log_metric))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["deepspeed", "False", "False", "mlflow", "True"], done.stdout


def test_mlflow_imported_before_deepspeed_stays(monkeypatch):
    """Where the process already imported mlflow, DeepSpeed sees it as it would have (nothing is hidden or removed)."""
    import sys

    from launcher.train.engines.deepspeed_engine import without_mlflow

    sentinel = object()
    monkeypatch.setitem(sys.modules, "mlflow", sentinel)
    with without_mlflow():
        assert sys.modules["mlflow"] is sentinel
    assert sys.modules["mlflow"] is sentinel
    monkeypatch.delitem(sys.modules, "mlflow")
    with without_mlflow():
        with pytest.raises(ImportError):
            import mlflow  # noqa: F401
    assert "mlflow" not in sys.modules
