"""Tensor parallelism at plan time (torch-free): the 2D mesh in fsdp2.json, the global batch over
data-parallel ranks, the memory estimate's layout, the precision table's TP row, plan's text."""

from __future__ import annotations

import json

from launcher.planning.memory import estimate
from launcher.planning.precision_table import ROWS, precision_table
from launcher.targets.plan_json import plan_json
from launcher.targets.render import render
from test_rules import plan_of

P = 1_000_000_000
TAO = {"mode": "fp8", "backend": "torchao"}
TP4 = {"procs_per_node": 8, "tensor_parallel": 4}


def test_fsdp2_json_has_the_2d_mesh_only_with_tp():
    cfg = json.loads(render(plan_of({"distributed": {"nodes": 2, **TP4}}))["fsdp2.json"])
    assert cfg["mesh"] == {"shape": [4, 4], "dim_names": ["dp_shard", "tp"]}
    one_d = json.loads(render(plan_of({"distributed": {"procs_per_node": 8}}))["fsdp2.json"])
    assert one_d["mesh"] == {"shape": [8], "dim_names": ["dp_shard"]}


def test_global_batch_and_tokens_count_data_parallel_ranks():
    plan = plan_of({"distributed": {"nodes": 2, **TP4}, "train": {"micro_batch_size": 2, "grad_accum_steps": 3, "seq_len": 1024}})
    assert (plan.world_size, plan.distributed.data_parallel) == (16, 4)
    assert plan.distributed.global_batch_size == 2 * 3 * 4
    assert plan.tokens_per_step == 24 * 1024
    assert plan_json(plan)["derived"]["global_batch_size"] == 24


def test_memory_model_states_are_split_over_dp_times_tp():
    est = estimate(plan_of({"distributed": TP4}), P)
    rows = {r.name: r for r in est.rows}
    assert all(r.shards == 8 and r.layout == "dp 2 x tp 4" for r in rows.values())
    assert est.total_bytes == 16 * P / 8
    text = "\n".join(est.lines())
    assert "(4 B/param, / 8 ranks = dp 2 x tp 4)" in text
    # without TP the text is the 1D one
    assert "/ 8 ranks)" in "\n".join(estimate(plan_of({"distributed": {"procs_per_node": 8}}), P).lines())


def test_precision_table_names_the_tp_collectives_dtype():
    tensorwise = precision_table(plan_of({"precision": {**TAO, "torchao": {"recipe": "tensorwise"}}, "distributed": TP4}))
    assert tensorwise["tp_comm"].startswith("all-gathers in fp8 (torchao Float8 TP styles")
    assert "reduce-scatters and the logits all-gather in bf16" in tensorwise["tp_comm"]
    rowwise = precision_table(plan_of({"precision": {**TAO, "torchao": {"recipe": "rowwise"}}, "distributed": TP4}))
    assert rowwise["tp_comm"].startswith("bf16 all-gathers and reduce-scatters (torchao has float8 TP for tensorwise only")
    fp16 = precision_table(plan_of({"precision": {"mode": "fp16"}, "distributed": TP4}))
    assert fp16["tp_comm"] == "fp16 all-gathers and reduce-scatters"
    assert "tp_comm" not in precision_table(plan_of({"distributed": {"procs_per_node": 8}}))
    assert [k for k, _ in ROWS][-1] == "tp_comm"


def test_plan_text_shows_the_mesh_the_batch_and_the_tp_row(cli, spec):
    path = spec('version = 1\nname = "tp"\n[precision]\nmode = "fp8"\n[distributed]\nprocs_per_node = 8\ntensor_parallel = 2\n'
                '[compile]\nenabled = true\n[train]\nmodel = "builtin:llama3-8b"\nseq_len = 4096\n')
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0, r.stderr
    assert "  engine      fsdp2, 1 node x 8 = world size 8, tensor parallel 2 (mesh dp 4 x tp 2), compiled\n" in r.stdout
    assert "  batch       1 micro x 1 accum x 4 data-parallel ranks = 4 sequences = 16,384 tokens/step (seq_len 4096)\n" in r.stdout
    assert "    tp_comm           all-gathers in fp8" in r.stdout
    assert "(4 B/param, / 8 ranks = dp 4 x tp 2)" in r.stdout
