"""`fp8launch import`: real configs of Accelerate, Axolotl, torchtitan, NeMo / Megatron-Bridge and DeepSpeed
(tests/data/import/, where each comes from is in its README.md) -> the exact spec values, the report entry of each
FP8, parallelism and training setting, a spec that plans; an unknown or unreadable file -> exit 2, one line, nothing
written."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from launcher.commands.importer import import_config
from launcher.commands.importer.report import APPROXIMATED, MAPPED, NONE

DATA = Path(__file__).resolve().parent / "data" / "import"


def imported(relative: str, tmp_path: Path):
    """(spec as a dict, {source: (status, sets, note)}, Imported) of one data file."""
    result = import_config(str(DATA / relative), folder=str(tmp_path))
    entries = {e.source: (e.status, dict(e.sets), e.note) for e in result.report.entries}
    return tomllib.loads(result.text), entries, result


def status(entries: dict, source: str) -> str:
    return entries[source][0]


def test_accelerate_fp8_template_te(tmp_path):
    spec, e, r = imported("accelerate/fp8.yaml", tmp_path)
    assert r.kind.id == "accelerate" and spec["name"] == "fp8"
    assert spec["precision"] == {"mode": "fp8", "backend": "te", "high_precision": "bf16", "keep_first_last": False,
                                 "te": {"recipe": "delayed", "swap": ["linear", "layernorm"], "fp8_format": "E4M3", "margin": 0,
                                        "amax_history_len": 1024, "amax_compute_algo": "most_recent"}}
    assert spec["distributed"] == {"strategy": "ddp", "procs_per_node": 1}
    assert e["mixed_precision, fp8_config.backend"][:2] == (MAPPED, {"precision.mode": "fp8", "precision.backend": "te"})
    assert e["(amax_compute_algo)"][:2] == (MAPPED, {"precision.te.amax_compute_algo": "most_recent"})  # Accelerate's default, not TE's
    assert status(e, "fp8_config.interval") == MAPPED and "TE-REMOVED-KEY" in e["fp8_config.interval"][2]
    assert status(e, "fp8_config.override_linear_precision") == MAPPED
    assert status(e, "fp8_config.use_autocast_during_eval") == APPROXIMATED
    assert status(e, "(model)") == status(e, "(data)") == NONE
    assert "interval" not in spec["precision"]["te"]  # TE-REMOVED-KEY would refuse it


def test_accelerate_multi_gpu_fp8_config_as_accelerate_config_writes_it(tmp_path):
    spec, e, r = imported("accelerate/0_34_0_fp8.yaml", tmp_path)
    assert spec["distributed"] == {"nodes": 1, "procs_per_node": 2, "strategy": "ddp"}
    assert spec["precision"]["te"]["amax_compute_algo"] == "max" and spec["launch"] == {"launcher": "torchrun", "device": "auto"}
    assert e["fp8_config.override_linear_precision"][0] == MAPPED  # the "(false, false, false)" string the questionnaire writes
    assert status(e, "rdzv_backend") == APPROXIMATED
    assert e["num_processes"][:2] == (MAPPED, {"distributed.procs_per_node": 2})
    bundled = next(s for s in e if s.startswith("{debug"))
    assert status(e, bundled) == NONE and "tpu_use_sudo" in bundled


def test_accelerate_deepspeed_reads_the_deepspeed_json_it_names(tmp_path):
    spec, e, r = imported("accelerate/deepspeed.yaml", tmp_path)
    assert spec["distributed"] == {"procs_per_node": 2, "strategy": "deepspeed",
                                   "deepspeed": {"zero_stage": 1, "overlap_comm": True, "contiguous_gradients": True}}
    assert spec["precision"] == {"mode": "fp16"}
    j = "[DeepSpeed JSON]."
    assert e[j + "zero_optimization.stage"][:2] == (MAPPED, {"distributed.deepspeed.zero_stage": 1})
    assert status(e, j + "optimizer.params.lr") == NONE and "prepare()" in e[j + "optimizer.params.lr"][2]  # "auto"
    assert e[j + "scheduler.type"][:2] == (APPROXIMATED, {"train.min_lr_ratio": 0.0})  # WarmupDecayLR: linear to 0
    assert status(e, j + "fp16.loss_scale") == MAPPED


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def test_accelerate_questionnaire_names_accelerate_never_reads_import_its_defaults(tmp_path):
    # the keys `accelerate config` writes (commands/config/cluster.py), which the TE recipe handler does not read
    path = _write(tmp_path, "acc.yaml", """
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        mixed_precision: fp8
        num_processes: 8
        fp8_config:
          backend: TE
          fp8_format: HYBRID
          amax_history_length: 16
          amax_compute_algorithm: max
        fsdp_config:
          fsdp_version: 2
          fsdp_reshard_after_forward: false
          fsdp_activation_checkpointing: true
        """)
    r = import_config(path, folder=str(tmp_path))
    spec = tomllib.loads(r.text)
    e = {x.source: x for x in r.report.entries}
    assert spec["precision"]["te"]["amax_history_len"] == 1024 and spec["precision"]["te"]["amax_compute_algo"] == "most_recent"
    assert e["fp8_config.amax_history_length"].status == APPROXIMATED and "never reads" in e["fp8_config.amax_history_length"].note
    assert spec["distributed"]["strategy"] == "fsdp2" and spec["distributed"]["fsdp2"] == {"reshard_after_forward": False}
    assert spec["activation_checkpointing"] == {"mode": "full"}


def test_accelerate_ao_and_a_rule_refusing_the_literal_translation(tmp_path):
    path = _write(tmp_path, "ao.yaml", """
        distributed_type: MULTI_GPU
        mixed_precision: fp8
        num_processes: 4
        fp8_config:
          backend: AO
        dynamo_config:
          dynamo_backend: INDUCTOR
        """)
    r = import_config(path, folder=str(tmp_path))
    spec = tomllib.loads(r.text)
    e = {x.source: x for x in r.report.entries}
    assert spec["precision"]["torchao"] == {"recipe": "tensorwise", "skip_small": False, "pad_inner_dim": True}
    assert spec["precision"]["keep_first_last"] is True
    # torchao + DDP + compile is refused (FP8-DDP-COMPILE): the nearest spec that plans keeps DDP, without compile
    assert spec["compile"] == {"enabled": False}
    assert e["dynamo_config.dynamo_backend"].status == APPROXIMATED and "FP8-DDP-COMPILE" in e["dynamo_config.dynamo_backend"].note
    # the FSDP2-only all-gather does nothing with DDP: not written
    assert "fsdp_float8_all_gather" not in spec["precision"]["torchao"] and e["(enable_fsdp_float8_all_gather)"].status == MAPPED


def test_axolotl_3b_fp8_fsdp2(tmp_path):
    spec, e, r = imported("axolotl/3b-fp8-fsdp2.yaml", tmp_path)
    assert r.kind.id == "axolotl" and spec["name"] == "3b-fp8-fsdp2"
    assert spec["precision"] == {"mode": "fp8", "backend": "torchao", "keep_first_last": True,
                                 "torchao": {"recipe": "tensorwise", "skip_small": False, "pad_inner_dim": False,
                                             "fsdp_float8_all_gather": True, "precompute_scale": False}}
    assert spec["distributed"] == {"procs_per_node": 8, "strategy": "fsdp2", "fsdp2": {"reshard_after_forward": True, "cpu_offload": False}}
    assert spec["compile"] == {"enabled": True}
    t = spec["train"]
    assert (t["model"], t["data"], t["seq_len"], t["micro_batch_size"], t["grad_accum_steps"], t["steps"]) == \
        ("builtin:llama3-1b", "synthetic", 512, 16, 1, 100)
    assert (t["optimizer"], t["lr"], t["weight_decay"], t["weight_decay_exclude"], t["min_lr_ratio"], t["warmup_steps"]) == \
        ("adamw", 2e-5, 0.0, "norms_and_biases", 1.0, 10)
    assert e["fp8"][0] == MAPPED and e["fp8_enable_fsdp_float8_all_gather"][0] == MAPPED
    assert e["base_model"][0] == NONE and "huggingface-cli download meta-llama/Llama-3.2-3B --local-dir DIR" in e["base_model"][2]
    assert e["datasets"][0] == NONE and "yahma/alpaca-cleaned --repo-type dataset" in e["datasets"][2]
    assert e["num_epochs"][0] == NONE  # steps of an epoch depend on the data: a placeholder
    assert e["(world size)"][0] == NONE
    assert e["(lr_scheduler), cosine_min_lr_ratio"][:2] == (MAPPED, {"train.min_lr_ratio": 1.0})
    assert e["attn_implementation"][0] == NONE
    assert 'model = "builtin:llama3-1b"  # PLACEHOLDER: download meta-llama/Llama-3.2-3B, then "hf:DIR"' in r.text


def test_torchtitan_llama3_405b_as_shipped(tmp_path):
    spec, e, r = imported("torchtitan/llama3_405b.toml", tmp_path)
    assert r.kind.id == "torchtitan" and spec["name"] == "llama3_405b"
    assert spec["precision"] == {"mode": "fp8", "backend": "torchao", "keep_first_last": False, "keep": ["*output*"], "high_precision": "bf16",
                                 "torchao": {"recipe": "tensorwise", "fsdp_float8_all_gather": True, "precompute_scale": True,
                                             "skip_small": False}}
    assert spec["distributed"] == {"procs_per_node": 8, "strategy": "fsdp2", "tensor_parallel": 8, "async_tp": True}
    assert spec["compile"] == {"enabled": True} and spec["activation_checkpointing"] == {"mode": "full"}
    t = spec["train"]
    assert (t["model"], t["seq_len"], t["steps"], t["micro_batch_size"], t["lr"], t["adam_betas"], t["adam_eps"]) == \
        ("builtin:llama3-70b", 8192, 3000, 2, 8e-5, [0.9, 0.95], 1e-8)
    assert (t["weight_decay"], t["weight_decay_exclude"], t["warmup_steps"], t["min_lr_ratio"]) == (0.1, "none", 600, 0.0)
    assert (t["checkpoint_every"], t["checkpoint_at_end"], t["log_every"], t["output_dir"]) == (0, False, 10, "./outputs/{name}")
    assert spec["log"] == {"tensorboard": True}
    filters = e["quantize.linear.float8.filter_fqns"]
    assert filters[0] == APPROXIMATED and "*S*" in filters[2]  # a substring becomes a whole-name glob
    assert e["model.name, model.flavor"][0] == NONE and "Llama-3.1-405B" in e["model.name, model.flavor"][2]
    assert e["parallelism.tensor_parallel_degree"][:2] == (MAPPED, {"distributed.tensor_parallel": 8})
    assert e["(optimizer.beta1, beta2)"][:2] == (MAPPED, {"train.adam_betas": [0.9, 0.95]})  # torchtitan's defaults
    assert e["(lr_scheduler.decay_type)"][0] == APPROXIMATED  # linear -> cosine
    assert e["training.dataset"][0] == NONE and "allenai/c4" in e["training.dataset"][2]
    assert e["model.converters"][0] == MAPPED


def test_torchtitan_deepseek_v3_16b_moe(tmp_path):
    spec, e, r = imported("torchtitan/deepseek_v3_16b.toml", tmp_path)
    assert spec["precision"] == {"mode": "bf16"}  # converters = ["float8"] is commented out in the file
    assert spec["distributed"] == {"procs_per_node": 8, "strategy": "fsdp2", "tensor_parallel": 1, "async_tp": False, "expert_parallel": 8,
                                   "fsdp2": {"reshard_after_forward": True}}
    assert spec["compile"] == {"enabled": False} and spec["activation_checkpointing"] == {"mode": "selective"}
    t = spec["train"]
    assert (t["model"], t["seq_len"], t["micro_batch_size"], t["lr"], t["min_lr_ratio"], t["warmup_steps"]) == \
        ("builtin:deepseek-v3-16b", 4096, 4, 2.2e-4, 0.1, 200)
    assert e["model.name, model.flavor"][0] == APPROXIMATED  # GQA, not multi-head latent attention
    assert e["parallelism.expert_parallel_degree"][:2] == (MAPPED, {"distributed.expert_parallel": 8})
    quantize = next(s for s in e if s.startswith("quantize.linear.float8.{"))
    assert e[quantize][0] == NONE and "FP8 is off" in e[quantize][2]
    assert e["quantize.grouped_mm.float8.fqns"][0] == NONE
    assert e["compile.enable, compile.components"][:2] == (APPROXIMATED, {"compile.enabled": False})
    assert e["activation_checkpoint.mode, activation_checkpoint.selective_ac_option"][0] == APPROXIMATED
    assert e["lr_scheduler.decay_type"][0] == MAPPED and e["lr_scheduler.decay_ratio"][0] == APPROXIMATED


def test_torchtitan_2024_generation(tmp_path):
    spec, e, r = imported("torchtitan/llama3_405b_2024.toml", tmp_path)
    assert spec["precision"]["keep"] == ["output"] and spec["precision"]["torchao"]["fsdp_float8_all_gather"] is True
    assert spec["distributed"]["tensor_parallel"] == 8 and spec["distributed"]["async_tp"] is True
    assert spec["compile"] == {"enabled": True}
    assert (spec["train"]["micro_batch_size"], spec["train"]["warmup_steps"]) == (2, 600)
    assert e["float8.enable_float8_linear"][0] == MAPPED and e["training.compile"][0] == MAPPED
    assert e["experimental.enable_async_tensor_parallel"][:2] == (MAPPED, {"distributed.async_tp": True})


def test_nemo_gpt3_fp8_delayed(tmp_path):
    spec, e, r = imported("nemo/gpt3_mlperf.yaml", tmp_path)
    assert r.kind.id == "megatron" and spec["name"] == "train_gpt3_126m_tp2_pp4"
    assert spec["precision"] == {"mode": "fp8", "backend": "te", "keep_first_last": True, "high_precision": "bf16",
                                 "te": {"fp8_format": "HYBRID", "recipe": "delayed", "margin": 0, "amax_history_len": 1024,
                                        "amax_compute_algo": "max", "reduce_amax": True, "fp8_params": False}}
    assert spec["distributed"] == {"nodes": 1, "procs_per_node": 8, "tensor_parallel": 1, "strategy": "deepspeed",
                                   "deepspeed": {"zero_stage": 1}}
    t = spec["train"]
    assert (t["micro_batch_size"], t["grad_accum_steps"], t["steps"], t["seq_len"], t["seed"], t["max_grad_norm"]) == (1, 1, 100, 2048, 2, 1.0)
    assert (t["lr"], t["weight_decay"], t["adam_betas"], t["weight_decay_exclude"], t["min_lr_ratio"], t["warmup_steps"]) == \
        (2e-5, 0.1, [0.9, 0.95], "none", 0.1, 132)
    assert e["model.fp8, model.fp8_hybrid, model.fp8_e4m3"][0] == MAPPED
    assert e["model.fp8_params"][0] == APPROXIMATED and "TE-FP8-PARAMS-DEEPSPEED" in e["model.fp8_params"][2]
    assert e["model.tensor_model_parallel_size"][0] == APPROXIMATED and "TP-BACKEND" in e["model.tensor_model_parallel_size"][2]
    assert e["model.pipeline_model_parallel_size"][0] == NONE and e["model.virtual_pipeline_model_parallel_size"][0] == NONE
    assert e["model.fp8_interval"][0] == MAPPED  # 1: what TE >= 2.2 always does
    assert e["model.data.data_prefix"][0] == NONE and "${...}" in e["model.data.data_prefix"][2]
    assert e["model.optim.sched.warmup_steps"][0] == APPROXIMATED  # 132.5 steps
    assert e["model.do_layer_norm_weight_decay"][:2] == (MAPPED, {"train.weight_decay_exclude": "none"})
    assert e["model.global_batch_size"][0] == APPROXIMATED  # the pipeline ranks became data-parallel ranks


def test_megatron_bridge_llama3_8b_fp8_current_scaling(tmp_path):
    spec, e, r = imported("megatron_bridge/llama3_8b_fp8cs.yaml", tmp_path)
    assert spec["precision"]["te"]["recipe"] == "current" and spec["precision"]["te"]["fp8_params"] is False
    assert (spec["precision"]["keep_first_blocks"], spec["precision"]["keep_last_blocks"], spec["precision"]["keep_first_last"]) == (1, 1, True)
    assert spec["distributed"] == {"procs_per_node": 8, "tensor_parallel": 1, "strategy": "deepspeed", "deepspeed": {"zero_stage": 1}}
    t = spec["train"]
    assert (t["model"], t["data"], t["seq_len"], t["grad_accum_steps"], t["steps"]) == ("builtin:llama3-8b", "synthetic", 8192, 96, 1168251)
    assert (t["lr"], t["min_lr_ratio"], t["weight_decay"], t["adam_betas"], t["weight_decay_exclude"]) == \
        (6e-4, 0.01, 0.033, [0.9, 0.95], "norms_and_biases")
    assert e["mixed_precision.fp8_recipe"][:2] == (MAPPED, {"precision.te.recipe": "current"})
    assert e["mixed_precision.fp8_param_gather"][0] == APPROXIMATED
    assert e["model.context_parallel_size"][0] == NONE
    assert e["train.global_batch_size"][0] == APPROXIMATED and "context parallel" in e["train.global_batch_size"][2]
    assert e["optimizer.use_distributed_optimizer, ddp.use_distributed_optimizer"][0] == APPROXIMATED


def test_megatron_bridge_named_recipe(tmp_path):
    path = _write(tmp_path, "mb.yaml", """
        mixed_precision: bf16_with_fp8_current_scaling_mixed
        model:
          tensor_model_parallel_size: 1
        train:
          train_iters: 50
          global_batch_size: 16
          micro_batch_size: 2
        """)
    spec = tomllib.loads(import_config(path, folder=str(tmp_path)).text)
    assert spec["precision"]["te"]["recipe"] == "current" and spec["precision"]["keep_first_blocks"] == 1
    assert spec["train"]["grad_accum_steps"] == 1  # 16 = 2 x 1 x 8 ranks


def test_deepspeed_zero3_json(tmp_path):
    spec, e, r = imported("deepspeed/zero3_bf16_baseline.json", tmp_path)
    assert r.kind.id == "deepspeed"
    assert spec["precision"] == {"mode": "bf16"}
    assert spec["distributed"] == {"strategy": "deepspeed", "procs_per_node": 8,
                                   "deepspeed": {"zero_stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 50000000}}
    t = spec["train"]
    assert (t["micro_batch_size"], t["grad_accum_steps"], t["optimizer"], t["lr"], t["weight_decay"], t["adam_eps"], t["adam_betas"]) == \
        (4, 1, "adamw", 1e-4, 0.01, 1e-8, [0.9, 0.999])
    assert e["zero_optimization.stage3_param_persistence_threshold"][0] == NONE
    assert e["(world size)"][0] == NONE


@pytest.mark.parametrize("relative", sorted(str(p.relative_to(DATA)) for p in DATA.glob("*/*") if p.suffix in (".yaml", ".toml", ".json")))
def test_the_written_spec_plans_and_starts_with_the_report(relative, cli, tmp_path):
    r = cli("import", str(DATA / relative), "--out", "imported.toml")
    assert r.exit_code == 0, r.stderr
    text = (tmp_path / "imported.toml").read_text()
    assert text.startswith("# Imported by `fp8launch import` from ")
    for line in r.stdout.splitlines()[:-2]:  # the report, then "wrote ..." and "next: ..."
        assert f"# {line}" in text
    assert cli("plan", "imported.toml").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["generated", "imported.toml"]  # no temporary file left


def test_default_out_is_the_name_here_and_is_not_overwritten(cli, tmp_path):
    r = cli("import", str(DATA / "torchtitan" / "deepseek_v3_16b.toml"))
    assert r.exit_code == 0 and (tmp_path / "deepseek_v3_16b.toml").is_file()
    again = cli("import", str(DATA / "torchtitan" / "deepseek_v3_16b.toml"))
    assert again.exit_code == 2 and "already exists; pass --force" in again.stderr
    assert cli("import", str(DATA / "torchtitan" / "deepseek_v3_16b.toml"), "--force").exit_code == 0


def test_the_kind_comes_from_the_content_not_the_extension(tmp_path):
    shutil.copy(DATA / "torchtitan" / "llama3_405b.toml", tmp_path / "job.cfg")
    shutil.copy(DATA / "accelerate" / "fp8.yaml", tmp_path / "default_config.json")
    assert import_config(str(tmp_path / "job.cfg"), folder=str(tmp_path)).kind.id == "torchtitan"
    assert import_config(str(tmp_path / "default_config.json"), folder=str(tmp_path)).kind.id == "accelerate"


@pytest.mark.parametrize("name,content,message", [
    ("unknown.yaml", "hello: world\nanswer: 42\n", "not a config fp8launch can import"),
    ("list.yaml", "- a\n- b\n", "not a table of settings"),
    ("broken.json", '{"zero_optimization": {', "cannot parse it as JSON, TOML or YAML"),
    ("binary.bin", b"\x00\xff\xfe", "not a text file"),
    ("missing.yaml", None, "cannot read it"),
])
def test_an_unknown_or_unreadable_file_is_one_line_exit_2_and_nothing_written(name, content, message, cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    if content is not None:
        (src / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = cli("import", str(src / name))
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_importing_reaches_no_torch(tmp_path):
    code = ("import sys; from launcher.commands.importer import import_config; "
            f"import_config({str(DATA / 'torchtitan' / 'llama3_405b.toml')!r}, folder={str(tmp_path)!r}); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
