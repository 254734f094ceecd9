"""Rendered files: valid, deterministic, consistent with the plan, and accepted by the engines' own parsers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launcher.commands.plan import plan_one
from launcher.targets.render import files_for, render
from test_rules import plan_of

HERE = os.path.dirname(__file__)

DS_VARIANTS = {
    "zero0-fp32": {"precision": {"mode": "fp32"}, "distributed": {"deepspeed": {"zero_stage": 0}}},
    "zero1-bf16": {"precision": {"mode": "bf16"}, "distributed": {"deepspeed": {"zero_stage": 1}}},
    "zero2-fp16-accum": {"precision": {"mode": "fp16"}, "train": {"micro_batch_size": 2, "grad_accum_steps": 3}},
    "zero2-offload": {"distributed": {"deepspeed": {"offload_optimizer": "cpu"}}},
    "zero3-offload-param": {"distributed": {"deepspeed": {"zero_stage": 3, "offload_param": "cpu", "offload_optimizer": "cpu"}}},
    "te-fp8-fp16": {"precision": {"mode": "fp8", "backend": "te", "high_precision": "fp16"}},
    "zero2-sgd": {"train": {"optimizer": "sgd"}},
    "zero2-comm": {"distributed": {"deepspeed": {"overlap_comm": False, "contiguous_gradients": False, "reduce_bucket_size": 20000000}}},
    "msamp-o3": {"precision": {"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": "O3"}}},
}


def ds_plan(variant: dict):
    data = json.loads(json.dumps(variant))
    dist = data.setdefault("distributed", {})
    dist.update(strategy="deepspeed", nodes=2, procs_per_node=4)
    return plan_of(data)


def parse_with_deepspeed(paths: list[str], world: int) -> list[dict]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(29700 + os.getpid() % 200)}
    r = subprocess.run([sys.executable, os.path.join(HERE, "ds_config_check.py"), str(world), *paths],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
def test_every_deepspeed_json_is_accepted_by_deepspeeds_parser(tmp_path):
    paths, plans = [], {}
    for name, variant in DS_VARIANTS.items():
        plan = ds_plan(variant)
        path = tmp_path / f"{name}.json"
        path.write_text(render(plan)["deepspeed.json"])
        paths.append(str(path))
        plans[str(path)] = plan
    repo_specs = os.path.join(HERE, "..", "specs", "generated")
    committed = sorted(os.path.join(repo_specs, d, "deepspeed.json") for d in os.listdir(repo_specs)
                       if os.path.exists(os.path.join(repo_specs, d, "deepspeed.json")))
    parsed = {p["file"]: p for p in parse_with_deepspeed(paths, world=8)}
    assert len(parsed) == len(paths)
    for path, plan in plans.items():
        got = parsed[path]
        assert got["train_batch_size"] == plan.distributed.global_batch_size == (
            plan.train.micro_batch_size * plan.train.grad_accum_steps * 8)
        assert (got["micro"], got["accum"]) == (plan.train.micro_batch_size, plan.train.grad_accum_steps)
        assert got["zero_stage"] == plan.distributed.deepspeed.zero_stage
        assert got["bf16"] == (plan.precision.compute_dtype == "bf16")
        assert got["fp16"] == (plan.precision.compute_dtype == "fp16")
        assert got["clip"] == plan.train.max_grad_norm
        offload_optimizer = plan.distributed.deepspeed.offload_optimizer
        assert got["offload_optimizer"].endswith(offload_optimizer) or offload_optimizer == "none"
        ds = plan.distributed.deepspeed
        assert (got["overlap_comm"], got["contiguous_gradients"], got["reduce_bucket_size"]) == (
            ds.overlap_comm, ds.contiguous_gradients, ds.reduce_bucket_size)
    assert len(committed) >= 2
    for got in parse_with_deepspeed(committed, world=8):
        assert got["train_batch_size"] % 8 == 0


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
def test_deepspeed_parser_rejects_a_batch_that_does_not_fit_the_world(tmp_path):
    """The parser really checks the batch rule: the same file read for the wrong world size fails."""
    path = tmp_path / "ds.json"
    path.write_text(render(ds_plan({}))["deepspeed.json"])
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(29500 + os.getpid() % 190)}
    r = subprocess.run([sys.executable, os.path.join(HERE, "ds_config_check.py"), "3", str(path)],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode != 0 and "train_batch_size" in r.stderr


def test_fsdp2_json_carries_what_fully_shard_needs():
    plan = plan_of({"precision": {"mode": "fp8", "high_precision": "bf16", "torchao": {"fsdp_float8_all_gather": True}},
                    "distributed": {"nodes": 2, "procs_per_node": 4,
                                    "fsdp2": {"reshard_after_forward": False, "reduce_dtype": "bf16", "cpu_offload": True}}})
    cfg = json.loads(render(plan)["fsdp2.json"])
    assert cfg == {
        "mesh": {"shape": [8], "dim_names": ["dp_shard"]},
        "units": ["embedding", "transformer_block", "output", "root"],
        "reshard_after_forward": False,
        "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"},
        "cpu_offload": True,
        "float8": {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True},
    }
    fp32 = json.loads(render(plan_of({"precision": {"mode": "fp32"}}))["fsdp2.json"])
    assert fp32["mixed_precision"]["param_dtype"] == "float32"
    assert fp32["float8"]["enable_fsdp_float8_all_gather"] is False


def test_files_per_strategy_and_launcher():
    assert files_for(plan_of({"distributed": {"strategy": "ddp"}})) == ["plan.json", "torchrun.sh"]
    assert files_for(plan_of({"distributed": {"strategy": "deepspeed"}})) == ["plan.json", "torchrun.sh", "deepspeed.json"]
    assert files_for(plan_of({"launch": {"launcher": "slurm"}})) == ["plan.json", "torchrun.sh", "fsdp2.json", "slurm.sbatch"]


def test_rendering_is_byte_deterministic_across_processes(tmp_path):
    spec = os.path.join(HERE, "..", "specs", "llama3-8b-torchao-slurm-2node.toml")
    code = ("import json,sys; from launcher.commands.plan import plan_one; p = plan_one(sys.argv[1], 'out');"
            "print(json.dumps(p.files, sort_keys=True))")
    outs = {subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, cwd=tmp_path,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True).stdout for seed in (1, 2)}
    assert len(outs) == 1


def test_json_files_are_canonical_and_machine_independent(tmp_path):
    planned = plan_one(os.path.join(HERE, "..", "specs", "llama3-8b-torchao-slurm-2node.toml"), "out")
    for name, text in planned.files.items():
        assert text.endswith("\n")
        assert str(tmp_path) not in text and os.path.expanduser("~") + "/" not in text and os.getcwd() not in text
        if name.endswith(".json"):
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    plan = json.loads(planned.files["plan.json"])
    assert plan["spec_sha256"] == __import__("hashlib").sha256(open(planned.spec_path, "rb").read()).hexdigest()
    assert plan["fp8launch_version"] == __import__("launcher").__version__
    assert plan["derived"]["world_size"] == 16
    assert plan["distributed"]["global_batch_size"] == 16
    assert plan["train"]["output_dir"] == "runs/llama3-8b-torchao-slurm-2node"


@pytest.mark.parametrize("spec_name", sorted(f for f in os.listdir(os.path.join(HERE, "..", "specs")) if f.endswith(".toml")))
def test_generated_scripts_pass_bash_n(spec_name, tmp_path):
    planned = plan_one(os.path.join(HERE, "..", "specs", spec_name), str(tmp_path))
    for name in ("torchrun.sh", "slurm.sbatch"):
        if name in planned.files:
            script = tmp_path / name
            script.write_text(planned.files[name])
            r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr


def test_slurm_script_fields():
    plan = plan_of({"distributed": {"nodes": 3, "procs_per_node": 4},
                    "launch": {"launcher": "slurm", "rdzv_endpoint": "h:29511", "max_restarts": 2,
                               "slurm": {"partition": "gpu", "account": "proj", "time": "1-00:00:00",
                                         "extra_sbatch": ["--exclusive", "--mem=0"], "cpus_per_task": 32}}})
    text = render(plan, plan_dir="gen/t")["slurm.sbatch"]
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == ["#SBATCH --job-name=t", "#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                      "#SBATCH --cpus-per-task=32", "#SBATCH --time=1-00:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj",
                      "#SBATCH --output=runs/t/slurm-%j.out", "#SBATCH --error=runs/t/slurm-%j.err", "#SBATCH --signal=TERM@120",
                      "#SBATCH --exclusive", "#SBATCH --mem=0"]
    assert '--rdzv-id "$SLURM_JOB_ID"' in text and '--rdzv-endpoint "$head_ip:29511"' in text
    assert "--max-restarts 2" in text and 'default_plan_dir=gen/t' in text
    assert 'if [[ "$SLURM_NNODES" != 3 ]]; then' in text and "exit 3" in text
    assert 'exit_file=runs/t/.exit-code-"$SLURM_JOB_ID"' in text and 'exit "$status"' in text
    cpu = render(plan_of({"launch": {"launcher": "slurm", "device": "cpu"}}))["slurm.sbatch"]
    assert "--gpus-per-node" not in cpu


def test_slurm_gpus_per_node_and_signal_seconds():
    def sbatch(**slurm):
        text = render(plan_of({"distributed": {"procs_per_node": 4}, "launch": {"launcher": "slurm", "slurm": slurm}}))["slurm.sbatch"]
        return [line for line in text.splitlines() if line.startswith("#SBATCH")]

    assert "#SBATCH --gpus-per-node=4" in sbatch() and "#SBATCH --signal=TERM@120" in sbatch()  # 0: procs_per_node; 120 s
    assert "#SBATCH --gpus-per-node=8" in sbatch(gpus_per_node=8)
    assert "#SBATCH --signal=TERM@300" in sbatch(signal_seconds=300)
    assert not [line for line in sbatch(signal_seconds=0) if line.startswith("#SBATCH --signal")]  # 0 disables


def test_restartable_plans_keep_restarted_groups_off_the_old_tcp_store():
    for name in ("torchrun.sh", "slurm.sbatch"):
        restart = render(plan_of({"launch": {"launcher": "slurm", "max_restarts": 2}}))[name]
        once = render(plan_of({"launch": {"launcher": "slurm"}}))[name]
        assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restart.splitlines()
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in once
