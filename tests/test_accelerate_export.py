"""accelerate.yaml goes through Accelerate's own config loader and launch pipeline, and every FP8 key we
write reaches the recipe object Accelerate builds (its questionnaire's misnamed keys would not)."""

from __future__ import annotations

import os
import re

import pytest

from launcher.targets.render import render
from test_rules import plan_of

accelerate = pytest.importorskip("accelerate")
from accelerate.commands.config.config_args import load_config_from_file  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402
from accelerate.utils import dataclasses as acc_dc  # noqa: E402
from accelerate.utils.launch import setup_fp8_env  # noqa: E402


def env_names_accelerate_reads() -> set[str]:
    """Every ACCELERATE_FP8_* variable Accelerate's recipe classes read, from its installed source."""
    source = open(acc_dc.__file__, encoding="utf-8").read()
    names = {"ACCELERATE_FP8_" + m for m in re.findall(r'env_prefix \+ "([A-Z0-9_]+)"', source)}
    return names | {"ACCELERATE_FP8_BACKEND"}


def launch_env(tmp_path, data: dict) -> tuple[object, dict, dict]:
    plan = plan_of({**data, "export": {"accelerate": True}})
    path = tmp_path / "accelerate.yaml"
    path.write_text(render(plan, plan_dir=str(tmp_path))["accelerate.yaml"])
    config = load_config_from_file(str(path))
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    return config, vars(args), setup_fp8_env(args, {})


def test_torchao_fsdp2_reaches_accelerates_ao_recipe(tmp_path, monkeypatch):
    config, args, env = launch_env(tmp_path, {"precision": {"mode": "fp8", "torchao": {"fsdp_float8_all_gather": True}},
                                              "distributed": {"nodes": 2, "procs_per_node": 4}, "compile": {"enabled": True}})
    assert config.distributed_type == "FSDP" and config.mixed_precision == "fp8"
    assert (config.num_machines, config.num_processes) == (2, 8)
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.dynamo_config["dynamo_backend"] == "INDUCTOR"
    assert set(env) <= env_names_accelerate_reads()
    assert env["ACCELERATE_FP8_BACKEND"] == "AO"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    recipe = acc_dc.AORecipeKwargs()
    assert recipe.config.enable_fsdp_float8_all_gather is True and recipe.config.pad_inner_dim is False


def test_te_settings_reach_accelerates_te_recipe(tmp_path, monkeypatch):
    te = {"recipe": "delayed", "fp8_format": "E4M3", "margin": 2, "amax_history_len": 16, "amax_compute_algo": "max"}
    config, args, env = launch_env(tmp_path, {"precision": {"mode": "fp8", "backend": "te", "te": te},
                                              "distributed": {"strategy": "deepspeed"}})
    assert config.distributed_type == "DEEPSPEED"
    assert config.deepspeed_config["deepspeed_config_file"] == f"{tmp_path}/deepspeed.json"
    assert set(env) <= env_names_accelerate_reads()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # TE itself cannot be installed here; its recipe class only reads the environment.
    monkeypatch.setattr(acc_dc, "is_transformer_engine_available", lambda: True)
    recipe = acc_dc.TERecipeKwargs()
    assert (recipe.fp8_format, recipe.margin, recipe.amax_history_len, recipe.amax_compute_algo) == ("E4M3", 2, 16, "max")
    assert recipe.use_mxfp8_block_scaling is False


def test_msamp_opt_level_reaches_accelerate(tmp_path, monkeypatch, msamp_stack):
    """Where MS-AMP's own stack is installed (elsewhere the spec is planned as its level's native keys, torchao's)."""
    config, args, env = launch_env(tmp_path, {"precision": {"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": "O1"}},
                                              "distributed": {"strategy": "ddp"}})
    assert config.distributed_type == "MULTI_GPU"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert acc_dc.MSAMPRecipeKwargs().opt_level == "O1"  # Accelerate's default is O2: our key was read


def test_questionnaire_style_keys_would_be_ignored(tmp_path, monkeypatch):
    """Why we write our own: the key names `accelerate config` writes never reach the recipe."""
    path = tmp_path / "q.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: fp8\nnum_processes: 2\n"
                    "fp8_config:\n  backend: MSAMP\n  optimization_level: O1\n")
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = setup_fp8_env(args, {})
    assert "ACCELERATE_FP8_OPTIMIZATION_LEVEL" in env and "ACCELERATE_FP8_OPTIMIZATION_LEVEL" not in env_names_accelerate_reads()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert acc_dc.MSAMPRecipeKwargs().opt_level == "O2"


def test_cpu_plan_and_recipes_accelerate_cannot_express(cli, spec):
    path = spec('version = 1\nname = "a"\n[precision]\nmode = "fp8"\n'
                '[precision.torchao]\nrecipe = "rowwise"\n[export]\naccelerate = true\n')
    r = cli("plan", path)
    assert r.exit_code == 2
    assert "error[ACCELERATE-UNSUPPORTED]: accelerate.yaml cannot express precision.torchao.recipe = 'rowwise';" in r.stderr
    kept = spec('version = 1\nname = "k"\n[precision]\nmode = "fp8"\nkeep_last_blocks = 1\n[export]\naccelerate = true\n', name="k.toml")
    r = cli("plan", kept)
    assert r.exit_code == 2 and "accelerate.yaml cannot express precision.keep_first_blocks / keep_last_blocks;" in r.stderr
    ok = spec('version = 1\nname = "b"\n[launch]\ndevice = "cpu"\n[distributed]\nstrategy = "ddp"\nprocs_per_node = 2\n'
              '[export]\naccelerate = true\n', name="b.toml")
    r = cli("plan", ok, "--out", "out")
    assert r.exit_code == 0
    text = open(os.path.join("out", "b", "accelerate.yaml")).read()
    assert 'distributed_type: "MULTI_CPU"' in text and "use_cpu: true" in text and 'mixed_precision: "bf16"' in text


@pytest.mark.parametrize("precision,strategy", [
    ({"mode": "fp8", "torchao": {"fsdp_float8_all_gather": True}}, "fsdp2"),
    ({"mode": "fp8", "backend": "te", "te": {"recipe": "delayed"}}, "deepspeed"),
    ({"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": "O2"}}, "ddp"),
])
def test_the_header_names_exactly_the_fp8_config_keys_the_file_writes(precision, strategy):
    import yaml

    plan = plan_of({"precision": precision, "distributed": {"strategy": strategy}, "export": {"accelerate": True}})
    text = render(plan, plan_dir="gen")["accelerate.yaml"]
    header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    named = set(re.findall(r"fp8_config: (.*?) \(Accelerate", header)[0].replace('"', "").replace(",", " ").split()) - {"AO", "TE", "MSAMP"}
    assert named == set(yaml.safe_load(text)["fp8_config"])
