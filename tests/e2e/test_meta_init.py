"""Meta-device initialisation through the real entrypoint build (torchrun, gloo): the initial
weights do not depend on the world size, nor on the engine, nor on FP8 conversion."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.train._engine_setup import make_plan

pytestmark = pytest.mark.slow
PROBE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "init_probe.py")


def initial_weights(tmp_path, name: str, procs: int, **keys) -> dict[str, torch.Tensor]:
    plan, plan_dir = make_plan(tmp_path / name, **{"distributed.procs_per_node": procs, "train.model": "builtin:llama-debug",
                                                   "train.output_dir": str(tmp_path / name / "out"), **keys})
    out = tmp_path / f"{name}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), PROBE,
                        os.path.join(plan_dir, "plan.json"), str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out)


def test_gathered_initial_weights_are_equal_at_world_1_and_2_for_fsdp2_and_ddp(tmp_path):
    one = initial_weights(tmp_path, "w1", 1, **{"distributed.strategy": "fsdp2"})
    two = initial_weights(tmp_path, "w2", 2, **{"distributed.strategy": "fsdp2"})
    ddp = initial_weights(tmp_path, "ddp2", 2, **{"distributed.strategy": "ddp", "precision.mode": "fp8",
                                                  "precision.torchao.skip_small": False})
    fp8_gather = initial_weights(tmp_path, "ag2", 2, **{"distributed.strategy": "fsdp2", "precision.mode": "fp8",
                                                        "precision.torchao.skip_small": False,
                                                        "precision.torchao.fsdp_float8_all_gather": True})
    assert len(one) == 4 * 9 + 3 and set(one) == set(two) == set(ddp) == set(fp8_gather)
    # and they are what this process draws for the model whole, the reference of the in-process world-size checks
    # (tests/train/test_materialize.py; on CUDA, tests/gpu/test_materialize_gpu.py)
    from tests.train._fake_ranks import whole

    in_process = whole("builtin:llama-debug")
    assert set(in_process) == set(one)
    for name in one:
        assert torch.equal(one[name], in_process[name]), name
        assert torch.equal(one[name], two[name]), name
        assert torch.equal(one[name], ddp[name]), name
        assert torch.equal(one[name], fp8_gather[name]), name  # through torchao's float8 all-gather weight wrapper too
    # and they are the builtin init, not zeros or garbage: N(0, 0.02), residual projections smaller, norms at one
    assert one["tok_embeddings.weight"].std().item() == pytest.approx(0.02, rel=0.02)
    assert one["layers.1.attention.wo.weight"].std().item() == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.05)
    assert torch.equal(one["norm.weight"], torch.ones(256))
    assert not torch.equal(one["layers.0.attention.wq.weight"], one["layers.1.attention.wq.weight"])


def test_deepspeed_zero3_at_world_2_starts_from_the_same_weights_in_its_dtype(tmp_path):
    """ZeRO-3 partitions each module as soon as it is initialised (no rank holds the whole model): gathered,
    its bf16 parameters are FSDP2's world-1 fp32 weights rounded to bf16, bit for bit."""
    pytest.importorskip("deepspeed")
    one = initial_weights(tmp_path, "w1", 1, **{"distributed.strategy": "fsdp2"})
    zero3 = initial_weights(tmp_path, "z3", 2, **{"distributed.strategy": "deepspeed", "distributed.deepspeed.zero_stage": 3})
    assert set(zero3) == set(one)
    for name in one:
        assert torch.equal(zero3[name], one[name].to(torch.bfloat16).float()), name
    assert not torch.equal(zero3["layers.0.attention.wq.weight"], one["layers.0.attention.wq.weight"])  # really bf16


def test_hf_weights_at_world_2_are_the_saved_weights(tmp_path):
    """An HF folder with weights: every rank builds on meta and reads each module's tensors as its turn comes, keeping
    its shard (FSDP2) or its partition (ZeRO-3): gathered, the saved weights, bit for bit (ZeRO-3: in bf16)."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96, tie_word_embeddings=True)
    torch.manual_seed(5)
    saved_model = transformers.AutoModelForCausalLM.from_config(config)
    saved_model.save_pretrained(tmp_path / "hf", max_shard_size="50KB")
    saved = {k: v.detach().clone() for k, v in saved_model.state_dict().items()}
    model = {"train.model": f"hf:{tmp_path / 'hf'}"}
    fsdp2 = initial_weights(tmp_path, "hf-fsdp2", 2, **model, **{"distributed.strategy": "fsdp2"})
    zero3 = initial_weights(tmp_path, "hf-z3", 2, **model, **{"distributed.strategy": "deepspeed", "distributed.deepspeed.zero_stage": 3})
    assert set(fsdp2) == set(saved)
    for name, value in saved.items():
        assert torch.equal(fsdp2[name], value), name
        assert torch.equal(zero3[name], value.to(torch.bfloat16).float()), name
