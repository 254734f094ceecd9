"""The model-state memory estimate: bytes per GPU for each precision and sharding, and its CLI output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.planning.memory import estimate, model_params
from test_rules import plan_of

P = 1_000_000_000


def rows(data: dict, params: int = P) -> dict[str, float]:
    est = estimate(plan_of(data), params)
    return {r.name: r.bytes_per_gpu(params) for r in est.rows} | {"total": est.total_bytes}


def test_ddp_replicates_sixteen_bytes_per_param():
    assert rows({"distributed": {"strategy": "ddp", "procs_per_node": 8}}) == {
        "params": 4 * P, "grads": 4 * P, "optimizer_states": 8 * P, "total": 16 * P}
    assert rows({"distributed": {"strategy": "ddp"}, "train": {"optimizer": "sgd"}})["optimizer_states"] == 0


def test_fsdp2_shards_everything_and_offload_leaves_nothing_on_the_gpu():
    assert rows({"distributed": {"procs_per_node": 8}})["total"] == 16 * P / 8
    assert rows({"distributed": {"procs_per_node": 8, "fsdp2": {"cpu_offload": True}}})["total"] == 0
    # torchao FP8 keeps fp32 weights: the FP8 copies are transient, model states do not shrink
    assert rows({"precision": {"mode": "fp8"}, "distributed": {"procs_per_node": 8}})["total"] == 16 * P / 8


@pytest.mark.parametrize("stage, expected", [
    (0, {"params": 2 * P, "grads": 2 * P, "master_weights": 4 * P, "optimizer_states": 8 * P}),
    (1, {"params": 2 * P, "grads": 2 * P, "master_weights": 4 * P / 4, "optimizer_states": 8 * P / 4}),
    (2, {"params": 2 * P, "grads": 2 * P / 4, "master_weights": 4 * P / 4, "optimizer_states": 8 * P / 4}),
    (3, {"params": 2 * P / 4, "grads": 2 * P / 4, "master_weights": 4 * P / 4, "optimizer_states": 8 * P / 4}),
])
def test_deepspeed_zero_stages_in_bf16(stage, expected):
    got = rows({"distributed": {"strategy": "deepspeed", "procs_per_node": 4, "deepspeed": {"zero_stage": stage}}})
    assert got == expected | {"total": sum(expected.values())}


def test_deepspeed_fp32_has_no_separate_master_and_offload_moves_states():
    got = rows({"precision": {"mode": "fp32"}, "distributed": {"strategy": "deepspeed", "procs_per_node": 2}})
    assert "master_weights" not in got and got["params"] == 4 * P
    off = rows({"distributed": {"strategy": "deepspeed", "procs_per_node": 2, "deepspeed": {"offload_optimizer": "cpu"}}})
    assert off["master_weights"] == 0 and off["optimizer_states"] == 0 and off["params"] == 2 * P


def test_te_fp8_params_and_msamp_levels(msamp_stack):
    from launcher.planning.models import linear_params, param_count, parse_builtin

    te = rows({"precision": {"mode": "fp8", "backend": "te", "keep_first_last": False, "te": {"fp8_params": True}},
               "distributed": {"procs_per_node": 1}})
    # FSDP2: the Linears' weights in FP8 (1 byte), the rest (embedding, norms) in fp32; TE's FusedAdam keeps an fp32
    # master copy of the FP8 weights only (fp8launch makes none for the fp32 parameters: issue 35)
    cfg = parse_builtin("builtin:llama-debug")
    share = linear_params(cfg) / param_count(cfg)  # every Linear converted (keep_first_last off)
    assert 0.5 < share < 1
    assert te["params"] == pytest.approx(share * P) and te["params_kept"] == pytest.approx(4 * (1 - share) * P)
    assert te["master_weights"] == pytest.approx(4 * share * P)
    kept = rows({"precision": {"mode": "fp8", "backend": "te", "te": {"fp8_params": True}}, "distributed": {"procs_per_node": 1}})
    assert kept["params"] < te["params"] and kept["master_weights"] < te["master_weights"]  # first and last Linear kept
    unknown = rows({"precision": {"mode": "fp8", "backend": "te", "te": {"fp8_params": True}}, "train": {"model": "py:m:build"},
                    "distributed": {"procs_per_node": 1}})
    assert unknown["params"] == 1 * P and unknown["master_weights"] == 4 * P and "params_kept" not in unknown
    ds = rows({"precision": {"mode": "fp8", "backend": "te", "keep_first_last": False, "te": {"fp8_params": True}},
               "distributed": {"strategy": "deepspeed", "procs_per_node": 1}})
    assert ds["params"] == pytest.approx(share * P) and ds["master_weights"] == 4 * P  # the ZeRO optimizer's own copy
    o2 = rows({"precision": {"mode": "fp8", "backend": "msamp"}, "distributed": {"strategy": "ddp", "procs_per_node": 1}})
    assert o2 == {"params": P, "grads": P, "master_weights": 2 * P, "optimizer_states": 3 * P, "total": 7 * P}
    o1 = rows({"precision": {"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": "O1"}},
               "distributed": {"strategy": "ddp", "procs_per_node": 1}})
    assert o1["total"] == 14 * P


def test_builtin_models_are_sized_without_torch():
    assert model_params("builtin:llama3-8b") == 8_030_261_248
    assert model_params("builtin:llama-debug") == 4_196_608
    assert model_params("hf:/models/x") is None


def test_plan_prints_the_estimate_and_takes_params(cli, spec):
    path = spec('version = 1\nname = "m"\n[distributed]\nprocs_per_node = 8\n[train]\nmodel = "builtin:llama3-8b"\n')
    r = cli("plan", path)
    assert "memory per GPU for 8.03B parameters, model states and activations:" in r.stdout
    assert "    model states                  14.96 GiB" in r.stdout
    assert "    activations       bf16        14.05 GiB  (micro-batch 1 x seq 2048, checkpointing none)" in r.stdout
    assert "  initialisation peak per rank: 5.70 GiB on the GPU" in r.stdout
    assert "  not counted: temporary buffers" in r.stdout
    hf = spec('version = 1\nname = "h"\n[train]\nmodel = "hf:/models/llama"\n', name="h.toml")
    r = cli("plan", hf)
    assert "pass --params N to estimate them" in r.stdout
    r = cli("plan", hf, "--params", "7e9", "--format", "json")
    mem = json.loads(r.stdout)["memory"]
    assert mem["params"] == 7_000_000_000 and mem["model_states_bytes_per_gpu"] == 16 * 7_000_000_000 // 8
    assert mem["activations_bytes_per_gpu"] is None
    assert mem["peak_bytes_per_gpu"] == mem["total_bytes_per_gpu"] == mem["model_states_bytes_per_gpu"]
    assert mem["init_peak_bytes_per_rank"] == 4 * 7_000_000_000 // 8  # hf: shapes unknown to planning: the fp32 shard alone
    r = cli("plan", path, "--format", "json")  # the 8B: the JSON total is the text table's total, activations included
    mem = json.loads(r.stdout)["memory"]
    assert mem["total_bytes_per_gpu"] == mem["model_states_bytes_per_gpu"] + mem["activations_bytes_per_gpu"]
    assert round(mem["model_states_bytes_per_gpu"] / 2**30, 2) == 14.96 and round(mem["activations_bytes_per_gpu"] / 2**30, 2) == 14.05


@pytest.mark.parametrize("precision,strategy", [
    ({"mode": "bf16"}, "ddp"), ({"mode": "bf16"}, "deepspeed"), ({"mode": "fp32"}, "deepspeed"),
    ({"mode": "fp8", "backend": "te", "te": {"fp8_params": True}}, "deepspeed"),
    ({"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": "O2"}}, "ddp"),
    ({"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": "O1"}}, "ddp"),
])
def test_precision_table_describes_the_dtypes_the_memory_rows_decide(precision, strategy):
    """One fact, one place: the stored / master / optimizer-state dtypes come from memory.model_states."""
    from launcher.planning.memory import model_states
    from launcher.planning.precision_table import precision_table

    plan = plan_of({"precision": precision, "distributed": {"strategy": strategy}})
    rows = {r.name: r for r in model_states(plan, 1)}
    table = precision_table(plan)
    assert table["weights"].startswith(rows["params"].dtype)
    assert table["master_weights"].startswith(rows["master_weights"].dtype if "master_weights" in rows else rows["params"].dtype)
    assert table["optimizer_states"].startswith(rows["optimizer_states"].dtype.split("+")[0])


def test_deepspeed_zero3_initialises_into_its_partition_the_other_stages_hold_the_whole_model():
    """ZeRO-3 partitions each module as soon as it is initialised: a rank's peak is its partition in DeepSpeed's
    dtype plus the largest module in fp32 (Llama-3-8B: the embedding); ZeRO-2 materialises the whole fp32 model."""
    params = model_params("builtin:llama3-8b")
    embedding = 128_256 * 4096  # the largest module of Llama-3-8B (its head is as large)

    def peak(zero_stage, mode="bf16", **ds):
        plan = plan_of({"precision": {"mode": mode}, "train": {"model": "builtin:llama3-8b"},
                        "distributed": {"strategy": "deepspeed", "procs_per_node": 8,
                                        "deepspeed": {"zero_stage": zero_stage, **ds}}})
        return estimate(plan, params).init_peak

    z3 = peak(3)
    assert z3.bytes == 2 * params / 8 + 4 * embedding and z3.where == "on the GPU" and "bf16 partition" in z3.how
    assert peak(3, "fp32").bytes == 4 * params / 8 + 4 * embedding
    assert peak(3, offload_param="cpu").where == "host"
    z2 = peak(2)
    assert z2.bytes == 4 * params and "whole fp32 model" in z2.how
    assert z3.bytes < z2.bytes / 4


def test_an_hf_model_is_estimated_from_its_config_json_as_the_prediction_reads_it(cli, spec, tmp_path):
    """hf: models got no estimate although planning reads their config.json for the prediction: the parameters
    (its Linears, embedding and norms) and activations come from the same shapes as a builtin model's."""
    from launcher.planning.predict.shapes import model_shape

    folder = tmp_path / "llama-3.2-3b"
    folder.mkdir()
    (folder / "config.json").write_text((Path(__file__).parent / "data" / "llama-3.2-3b.json").read_text())
    path = spec('version = 1\nname = "h3"\n[distributed]\nprocs_per_node = 8\n[train]\nmodel = "hf:llama-3.2-3b"\nseq_len = 4096\n',
                name="h3.toml")
    shape, _ = model_shape("hf:llama-3.2-3b", str(tmp_path))
    r = cli("plan", path, "--format", "json")
    assert r.exit_code == 0, r.stderr
    mem = json.loads(r.stdout)["memory"]
    assert mem["params"] == shape.params == model_params("hf:llama-3.2-3b", str(tmp_path))
    assert shape.tied and shape.params == 3_212_749_824  # Llama 3.2 3B: 3.21B, the tied embedding counted once
    assert mem["model_states_bytes_per_gpu"] == 16 * shape.params // 8
    # activations counted as for a builtin Llama of the same width, depth and vocabulary
    from launcher.planning.memory import activations
    from launcher.planning.plan import load_plan  # noqa: F401

    plan_4k = plan_of({"distributed": {"procs_per_node": 8}, "train": {"seq_len": 4096}})
    assert mem["activations_bytes_per_gpu"] == int(activations(plan_4k, shape).bytes)
    assert model_params("hf:llama-3.2-3b") is None  # without the spec's folder the config is not looked for


@pytest.mark.parametrize("states, per_param", [("fp32", 8), ("bf16", 4), ("fp8", 2 * (1 + 4 / 256)), ("int8", 2 * (1 + 4 / 256))])
def test_optimizer_states_and_master_weights_set_the_rows(states, per_param):
    """precision.optimizer_states: two moments of that many bytes (fp8 / int8: codes + one fp32 scale per 256 values);
    precision.master_weights = "bf16": bf16 parameters and gradients, no fp32 copy; sharded by FSDP2 as before."""
    ddp = rows({"precision": {"optimizer_states": states}, "distributed": {"strategy": "ddp", "procs_per_node": 2}})
    assert ddp == {"params": 4 * P, "grads": 4 * P, "optimizer_states": per_param * P, "total": (8 + per_param) * P}
    o3 = rows({"precision": {"mode": "fp8", "optimizer_states": states, "master_weights": "bf16"}, "distributed": {"procs_per_node": 8}})
    assert o3 == pytest.approx({"params": 2 * P / 8, "grads": 2 * P / 8, "optimizer_states": per_param * P / 8,
                                "total": (4 + per_param) * P / 8})


def test_msamp_levels_natively_in_bytes_per_parameter():
    """MS-AMP's chart in bytes per parameter with the native keys (launcher/planning/levels.py): 16 today, 12 for O1
    (bf16 weights and gradients, fp32 moments), ~6 for O2 (+ fp8 moments), the same sharded for O3."""
    from launcher.planning.msamp_levels import MSAMP_LEVELS

    def spec(level):
        data: dict = {"distributed": {"strategy": "ddp", "procs_per_node": 1}}
        for key, value in MSAMP_LEVELS[level].items():
            node = data
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return data

    assert rows(spec("O1"))["total"] == 12 * P
    assert rows(spec("O2"))["total"] == pytest.approx((4 + 2 * (1 + 4 / 256)) * P)
    assert rows(spec("O3"))["total"] == pytest.approx((4 + 2 * (1 + 4 / 256)) * P)  # one rank: FSDP2 shards over 1


# -- pipeline parallel: the fullest stage -------------------------------------------------------------------------------

def _pp_plan(schedule: str = "1F1B", **distributed):
    return plan_of({"precision": {"mode": "bf16"}, "launch": {"device": "cuda", "gpu": "h100"},
                    "distributed": {"strategy": "fsdp2", "procs_per_node": 8, "pipeline_parallel": 4, "pipeline": {"schedule": schedule},
                                    **distributed},
                    "train": {"model": "builtin:llama3-8b", "seq_len": 8192, "micro_batch_size": 4}})


def test_a_pipeline_estimate_is_its_fullest_stages_parameters_and_in_flight_micro_batches():
    from launcher.planning.memory import in_flight, stage_estimate
    from launcher.planning.models import builtin_config, param_count

    plan, cfg = _pp_plan(), builtin_config("builtin:llama3-8b")
    stages = [stage_estimate(plan, cfg, s) for s in range(4)]
    assert sum(e.params for e in stages) == param_count(cfg)  # every parameter on exactly one stage
    assert [in_flight(plan, s) for s in range(4)] == [4, 3, 2, 1]  # 1F1B's warm-up; 4 micro-batches of one sequence
    assert [in_flight(_pp_plan("GPipe"), s) for s in range(4)] == [4, 4, 4, 4]
    e = estimate(plan, param_count(cfg))
    assert e.peak_bytes == max(x.peak_bytes for x in stages) and e.stage.startswith("stage 0 of 4: blocks 0-7, the embedding")
    assert all(r.shards == 2 for r in e.rows)  # each stage sharded over world 8 / pp 4 ranks
    # stage 0's model states: its 8 blocks and the embedding, in fp32 (params, grads, 2 Adam moments) over 2 ranks
    assert e.total_bytes == pytest.approx(16 * stages[0].params / 2)
    # the last stage holds one micro-batch of activations, and the loss's fp32 log-softmax over the vocabulary
    last = stages[3].activations
    assert "1 micro-batch of 1 x seq 8192 in flight" in last.how and last.bytes > 4 * 8192 * cfg.vocab_size


def test_an_uneven_split_moves_the_fullest_stage():
    plan = _pp_plan(pipeline={"layers_per_stage": [2, 10, 10, 10]})
    assert estimate(plan, 1).stage.startswith("stage 1 of 4: blocks 2-11")
