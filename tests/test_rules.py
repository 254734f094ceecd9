"""Every rule of the table, tested both ways: it fires on the bad combination and not on its fixed twin."""

from __future__ import annotations

import json
import re

import pytest

from launcher.planning.rules import RULES, RULES_BY_ID, Facts, check
from launcher.targets.render import render
from tests.support import plan_from

pytestmark = pytest.mark.usefixtures("msamp_stack")
"""The MS-AMP rules are about plans for the MS-AMP package: planned where its own stack is installed (elsewhere a
backend = "msamp" spec is planned as its native levels: tests/train/test_msamp_native.py)."""


plan_of = plan_from


def fired(data: dict, **facts) -> set[str]:
    plan = plan_of(data)
    stage = "run" if facts else "plan"
    return {f.rule.id for f in check(Facts(plan=plan, rendered=render(plan), **facts), stage=stage)}


def detail(data: dict, rule_id: str) -> str:
    """What the rule says of this plan (its message, detail included)."""
    plan = plan_of(data)
    return " ".join(str(f) for f in check(Facts(plan=plan, rendered=render(plan))) if f.rule.id == rule_id)


TAO = {"mode": "fp8", "backend": "torchao"}
TE = {"mode": "fp8", "backend": "te"}
MSAMP = {"mode": "fp8", "backend": "msamp"}
COMPILED = {"compile": {"enabled": True}}

# rule id -> (spec that fires it, the same spec fixed as the rule's fix says)
PLAN_CASES = {
    "FP8-DDP-COMPILE": ({"precision": TAO, "distributed": {"strategy": "ddp"}, **COMPILED},
                        {"precision": TAO, "distributed": {"strategy": "fsdp2"}, **COMPILED}),
    "FP8-ALLGATHER-STRATEGY": ({"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True}}, "distributed": {"strategy": "ddp"}},
                               {"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True}}, "distributed": {"strategy": "fsdp2"}}),
    "FP8-ALLGATHER-RECIPE": ({"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True, "recipe": "rowwise"}}},
                             {"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": False, "recipe": "rowwise"}}}),
    "FP8-NO-COMPILE": ({"precision": TAO}, {"precision": TAO, **COMPILED}),
    "TE-DELAYED-COMPILE": ({"precision": {**TE, "te": {"recipe": "delayed"}}, **COMPILED},
                           {"precision": {**TE, "te": {"recipe": "current"}}, **COMPILED}),
    "TE-BLOCK-FP8-ATTENTION": ({"precision": {**TE, "te": {"recipe": "block", "fp8_dpa": True}}},
                               {"precision": {**TE, "te": {"recipe": "block", "fp8_dpa": False}}}),
    "TE-REMOVED-KEY": ({"precision": {**TE, "te": {"interval": 1}}}, {"precision": TE}),
    "MSAMP-FSDP2": ({"precision": MSAMP, "distributed": {"strategy": "fsdp2"}},
                    {"precision": MSAMP, "distributed": {"strategy": "ddp"}}),
    "MSAMP-ZERO3": ({"precision": MSAMP, "distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}},
                    {"precision": MSAMP, "distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}}),
    "MSAMP-O3-STRATEGY": ({"precision": {**MSAMP, "msamp": {"opt_level": "O3"}}, "distributed": {"strategy": "ddp"}},
                          {"precision": {**MSAMP, "msamp": {"opt_level": "O3"}}, "distributed": {"strategy": "deepspeed"}}),
    "MSAMP-OPTIMIZER": ({"precision": MSAMP, "distributed": {"strategy": "ddp"}, "train": {"optimizer": "sgd"}},
                        {"precision": MSAMP, "distributed": {"strategy": "ddp"}, "train": {"optimizer": "adamw"}}),
    "BATCH-MISMATCH": ({"distributed": {"procs_per_node": 4, "global_batch_size": 6}, "train": {"micro_batch_size": 1}},
                       {"distributed": {"procs_per_node": 4, "global_batch_size": 8}, "train": {"micro_batch_size": 2}}),
    "SECTION-UNUSED": ({"precision": {"mode": "bf16", "torchao": {"recipe": "rowwise"}}},
                       {"precision": {**TAO, "torchao": {"recipe": "rowwise"}}}),
    "EVAL-NOT-HELD-OUT": ({"train": {"data": "tokens:a.npy"}, "eval": {"data": "tokens:a.npy"}},
                          {"train": {"data": "tokens:a.npy"}, "eval": {"data": "tokens:held-out.npy"}}),
    "DS-OFFLOAD-PARAM-STAGE": ({"distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2, "offload_param": "cpu"}}},
                               {"distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3, "offload_param": "cpu"}}}),
    "ACCELERATE-UNSUPPORTED": ({"precision": {**TE, "te": {"recipe": "current"}}, "export": {"accelerate": True}},
                               {"precision": {**TE, "te": {"recipe": "mxfp8"}}, "export": {"accelerate": True}}),
    "DS-ON-NAN-SKIP": ({"distributed": {"strategy": "deepspeed"}, "train": {"on_nan": "skip"}},
                       {"distributed": {"strategy": "fsdp2"}, "train": {"on_nan": "skip"}}),
    "CPU-BACKEND": ({"precision": {**TE, "te": {"recipe": "current"}}, "launch": {"device": "cpu"}},
                    {"precision": {**TE, "te": {"recipe": "current"}}, "launch": {"device": "cuda"}}),
}

# --- issue 10: memory and GPU-only faults ---
_8B_SEQ_8192 = {"train": {"model": "builtin:llama3-8b", "seq_len": 8192, "micro_batch_size": 2}, "distributed": {"procs_per_node": 8}}
PLAN_CASES.update({
    "MEMORY-EXCEEDS-GPU": ({**_8B_SEQ_8192, "launch": {"device": "cuda", "gpu": "h100"}},
                           {**_8B_SEQ_8192, "launch": {"device": "cuda", "gpu": "h100"}, "activation_checkpointing": {"mode": "full"}}),
})

# --- issue 19: options that crashed or silently did nothing ---
DS = {"strategy": "deepspeed"}
MONITORED = {"monitor": {"fp8_stats_every": 5}}
PLAN_CASES.update({
    "DS-NVME-PATH": ({"distributed": {**DS, "deepspeed": {"zero_stage": 3, "offload_param": "nvme"}}},
                     {"distributed": {**DS, "deepspeed": {"zero_stage": 3, "offload_param": "nvme", "nvme_path": "/nvme/ds"}}}),
    "DS-NVME-STAGE": ({"distributed": {**DS, "deepspeed": {"zero_stage": 2, "offload_optimizer": "nvme", "nvme_path": "/nvme"}}},
                      {"distributed": {**DS, "deepspeed": {"zero_stage": 3, "offload_optimizer": "nvme", "nvme_path": "/nvme"}}}),
    "DS-OFFLOAD-STAGE0": ({"distributed": {**DS, "deepspeed": {"zero_stage": 0, "offload_optimizer": "cpu"}}},
                          {"distributed": {**DS, "deepspeed": {"zero_stage": 1, "offload_optimizer": "cpu"}}}),
    "DS-FP16-CPU": ({"precision": {"mode": "fp16"}, "distributed": DS, "launch": {"device": "cpu"}},
                    {"precision": {"mode": "bf16"}, "distributed": DS, "launch": {"device": "cpu"}}),
    "DS-ZERO3-COMPILE": ({"distributed": {**DS, "deepspeed": {"zero_stage": 3}}, "compile": {"enabled": True, "fullgraph": True}},
                         {"distributed": {**DS, "deepspeed": {"zero_stage": 3}}, "compile": {"enabled": True, "fullgraph": False}}),
    "FULLGRAPH-TE": ({"precision": {**TE, "te": {"recipe": "current"}}, "compile": {"enabled": True, "fullgraph": True}},
                     {"precision": {**TE, "te": {"recipe": "current"}}, "compile": {"enabled": True, "fullgraph": False}}),
    "FULLGRAPH-MONITOR": ({"precision": TAO, "compile": {"enabled": True, "fullgraph": True}, **MONITORED},
                         {"precision": TAO, "compile": {"enabled": True, "fullgraph": False}, **MONITORED}),
    "TE-TOKENS-DIV8": ({"precision": TE, "train": {"seq_len": 2047, "micro_batch_size": 1}},
                       {"precision": TE, "train": {"seq_len": 2048, "micro_batch_size": 1}}),
    "TE-FP8-PARAMS-DEEPSPEED": ({"precision": {**TE, "te": {"fp8_params": True}}, "distributed": DS},
                                {"precision": {**TE, "te": {"fp8_params": False}}, "distributed": DS}),
    "FP8-PRECOMPUTE-OFFLOAD": ({"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True}},
                                "distributed": {"fsdp2": {"cpu_offload": True}}},
                               {"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True, "precompute_scale": False}},
                                "distributed": {"fsdp2": {"cpu_offload": True}}}),
    "MONITOR-NO-FP8": ({"precision": {"mode": "bf16"}, **MONITORED}, {"precision": TAO, **MONITORED}),
    "MSAMP-UNMAINTAINED": ({"precision": MSAMP, "distributed": {"strategy": "ddp"}}, {"precision": TAO}),
})

# --- issue 31: a first run that works; selection warns like the rules do ---
PLAN_CASES.update({
    # llama-debug's Linears are all below torchao's size rule: nothing would convert
    "FP8-NONE-SELECTED": ({"precision": {**TAO, "torchao": {"skip_small": True}}},
                          {"precision": {**TAO, "torchao": {"skip_small": False}}}),
    "PRECISION-KEEP-UNMATCHED": ({"precision": {**TAO, "keep": ["attention.wk"]}},  # torchtitan's substring, written as a glob
                                 {"precision": {**TAO, "keep": ["*attention.wk*"]}}),
})


def test_none_selected_names_each_key_that_keeps_layers_and_fixes_only_those():
    plan = plan_of({"precision": {**TAO, "keep": ["layers.1.*"]}, "train": {"model": "builtin:llama-debug?layers=2"}})
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "FP8-NONE-SELECTED"]
    # 2 blocks x 7 Linears + output = 15: the second block by keep, the first wq and output by keep_first_last, the rest by skip_small
    assert "all 15 stay in bf16 (7 by precision.keep 'layers.1.*', 6 by precision.torchao.skip_small, 2 by precision.keep_first_last)" \
        in finding.message, finding.message
    assert finding.fix == ("remove 'layers.1.*' from precision.keep; or set precision.torchao.skip_small = false "
                           "(torchao's H100 size rule; off for a CPU smoke run); or set precision.keep_first_last = false; "
                           "or set precision.mode = \"bf16\"")
    assert finding.text.endswith("fix: " + finding.fix)


def test_a_keep_glob_or_rule_naming_only_grouped_experts_is_matched():
    moe = {"train": {"model": "builtin:moe-debug"}}
    assert "PRECISION-RULE-UNMATCHED" not in fired({"precision": {**TAO, "torchao": {"recipe": "mxfp8"},
                                                                  "rules": [{"match": "*.moe.experts", "recipe": "mxfp8"}]}, **moe})
    assert "PRECISION-KEEP-UNMATCHED" not in fired({"precision": {**TAO, "torchao": {"recipe": "mxfp8"},
                                                                  "keep": ["layers.0.moe.experts"]}, **moe})
    assert "PRECISION-KEEP-UNMATCHED" in fired({"precision": {**TAO, "keep": ["*.moe.expert"]}, **moe})


def test_moe_rowwise_cpu_fix_names_the_rule_that_asked_for_rowwise():
    rule = {"match": "*.moe.experts", "recipe": "rowwise"}
    plan = plan_of({"precision": {**TAO, "torchao": {"recipe": "mxfp8"}, "rules": [rule]}, "train": {"model": "builtin:moe-debug"},
                    "launch": {"device": "cpu"}})
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "MOE-ROWWISE-CPU"]
    assert finding.fix.startswith("set the recipe of the precision.rules entry '*.moe.experts' to \"mxfp8\"")
    plan = plan_of({"precision": {**TAO, "torchao": {"recipe": "rowwise"}}, "train": {"model": "builtin:moe-debug"},
                    "launch": {"device": "cpu"}})
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "MOE-ROWWISE-CPU"]
    assert finding.fix.startswith('set precision.torchao.recipe = "mxfp8"')


def test_gpu_speed_advice_is_not_given_for_cpu_runs():
    bad, _ = PLAN_CASES["FP8-NO-COMPILE"]
    assert "FP8-NO-COMPILE" in fired(bad)
    assert "FP8-NO-COMPILE" not in fired({**bad, "launch": {"device": "cpu"}})
    bad, _ = PREDICTION_CASES["FP8-AC-COMPILE-SLOW"]
    assert "FP8-AC-COMPILE-SLOW" in fired_with_prediction(bad)
    assert "FP8-AC-COMPILE-SLOW" not in fired_with_prediction({**bad, "launch": {"device": "cpu"}})


def test_te_tokens_rule_names_the_numbers():
    plan = plan_of({"precision": TE, "train": {"seq_len": 2047, "micro_batch_size": 1}})
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "TE-TOKENS-DIV8"]
    assert finding.message.startswith("micro_batch_size 1 x seq_len 2047 = 2047 tokens per micro-batch, not a multiple of 8")


def test_nvme_path_rule_names_the_offload_keys():
    plan = plan_of({"distributed": {**DS, "deepspeed": {"zero_stage": 3, "offload_param": "nvme", "offload_optimizer": "nvme"}}})
    (finding,) = [f for f in check(Facts(plan=plan), "plan") if f.rule.id == "DS-NVME-PATH"]
    assert finding.message.startswith("distributed.deepspeed.offload_optimizer and distributed.deepspeed.offload_param = \"nvme\"")


RUN_CASES = {
    "FP8-HARDWARE": ({"precision": TAO}, {"device": "cuda", "capability": (8, 0)}, {"device": "cuda", "capability": (8, 9)}),
    "TE-RECIPE-HARDWARE": ({"precision": {**TE, "te": {"recipe": "mxfp8"}}}, {"device": "cuda", "capability": (9, 0)},
                           {"device": "cuda", "capability": (10, 0)}),
    "FP8-NOT-APPLIED": ({"precision": TAO}, {"device": "cpu", "fp8_layers": 0}, {"device": "cpu", "fp8_layers": 3}),
    "BACKEND-MISSING": ({"precision": TAO}, {"device": "cpu", "missing_package": "torchao"}, {"device": "cpu"}),
}


RUN_CASES.update({
    "DS-NVME-AIO": ({"distributed": {**DS, "deepspeed": {"zero_stage": 3, "offload_param": "nvme", "nvme_path": "/nvme"}}},
                    {"libaio": False}, {"libaio": True}),
    "MSAMP-STACK": ({"precision": MSAMP, "distributed": {"strategy": "ddp"}},
                    {"msamp_stack": "MS-AMP 0.4.0 is installed but cannot run here: ..."}, {"msamp_stack": None}),
    "EFFECT-MISSING": ({"compile": {"enabled": True}},
                       {"missing_effects": ("compile.enabled needs compiled_blocks = 4, and this run has 0",)},
                       {"missing_effects": ()}),
})


# -- torchao block-scaled recipes (issue 22) ----------
MX = {**TAO, "torchao": {"recipe": "mxfp8"}}
NVFP4 = {**TAO, "torchao": {"recipe": "nvfp4"}}
PLAN_CASES.update({
    "TORCHAO-BLOCK-TOKENS": ({"precision": MX, "train": {"seq_len": 100, "micro_batch_size": 1}},
                             {"precision": MX, "train": {"seq_len": 96, "micro_batch_size": 1}}),
    "TORCHAO-BLOCK-PAD": ({"precision": {**TAO, "torchao": {"recipe": "mxfp8", "pad_inner_dim": True}}}, {"precision": MX}),
    "TORCHAO-BLOCK-DEEPSPEED": ({"precision": MX, "distributed": DS}, {"precision": MX, "distributed": {"strategy": "fsdp2"}}),
    "TORCHAO-BLOCK-TP": ({"precision": MX, "distributed": {"strategy": "fsdp2", "procs_per_node": 4, "tensor_parallel": 2}},
                         {"precision": MX, "distributed": {"strategy": "fsdp2", "procs_per_node": 4, "tensor_parallel": 1}}),
})
RUN_CASES.update({
    "TORCHAO-BLOCK-HARDWARE": ({"precision": NVFP4}, {"device": "cuda", "capability": (9, 0)}, {"device": "cuda", "capability": (10, 0)}),
    "TORCHAO-NVFP4-CPU": ({"precision": NVFP4}, {"device": "cpu"}, {"device": "cuda", "capability": (10, 0)}),
    "TORCHAO-MX-TORCH": ({"precision": MX}, {"device": "cpu", "torchao_mx_supported": False},
                         {"device": "cpu", "torchao_mx_supported": True}),
})


def test_block_tokens_count_per_rank_and_nvfp4_blocks_are_16():
    nv = {"precision": NVFP4, "launch": {"device": "cuda"}}
    assert "TORCHAO-BLOCK-TOKENS" not in fired({**nv, "train": {"seq_len": 48, "micro_batch_size": 1}})  # 48 = 3 x 16
    assert "TORCHAO-BLOCK-TOKENS" in fired({"precision": MX, "train": {"seq_len": 48, "micro_batch_size": 1}})
    assert "TORCHAO-BLOCK-TOKENS" not in fired({"precision": MX, "train": {"seq_len": 48, "micro_batch_size": 2}})  # 96
    # context parallel splits each sequence over its ranks: 2 x 32 tokens are 32 on each of cp 2 (trains), 1 x 32 are 16
    cp = {"strategy": "fsdp2", "procs_per_node": 2, "context_parallel": 2}
    assert "TORCHAO-BLOCK-TOKENS" not in fired({"precision": MX, "distributed": cp, "train": {"seq_len": 32, "micro_batch_size": 2}})
    one = {"precision": MX, "distributed": cp, "train": {"seq_len": 32, "micro_batch_size": 1}}
    assert "micro_batch_size 1 x seq_len 32 (context_parallel 2) gives 16 tokens" in detail(one, "TORCHAO-BLOCK-TOKENS")
    # a pipeline's micro-batches of one sequence: 4 x 16 tokens a step are 16 a GEMM; 2 micro-batches of 2, 32
    pp = {"strategy": "fsdp2", "procs_per_node": 2, "pipeline_parallel": 2}
    assert "TORCHAO-BLOCK-TOKENS" in fired({"precision": MX, "distributed": pp, "train": {"seq_len": 16, "micro_batch_size": 4}})
    assert "TORCHAO-BLOCK-TOKENS" not in fired({"precision": MX, "distributed": {**pp, "pipeline": {"microbatches": 2}},
                                                "train": {"seq_len": 16, "micro_batch_size": 4}})


PLAN_CASES["LAUNCH-GPU-PRECISION"] = ({"precision": MX, "launch": {"device": "cuda", "gpu": "h100"}},
                                      {"precision": MX, "launch": {"device": "cuda", "gpu": "b200"}})


def test_launch_gpu_precision_names_what_the_gpu_lacks_and_auto_never_fires():
    from launcher.planning.rules import RULES_BY_ID, Facts

    plan = plan_of({"precision": {**TE, "te": {"recipe": "nvfp4"}}, "launch": {"device": "cuda", "gpu": "a100"}})
    (finding,) = [f for f in check(Facts(plan=plan, rendered=render(plan)), "plan") if f.rule.id == "LAUNCH-GPU-PRECISION"]
    assert finding.message == ("launch.gpu = 'a100' cannot run this spec's precision: fp8 te nvfp4 needs compute capability >= 10.0; "
                               "the A100 has 8.0.")
    assert RULES_BY_ID["LAUNCH-GPU-PRECISION"].severity == "error"
    assert "LAUNCH-GPU-PRECISION" not in fired({"precision": MX, "launch": {"device": "cuda", "gpu": "auto"}})
    assert "LAUNCH-GPU-PRECISION" not in fired({"precision": MX, "launch": {"device": "cuda", "gpu": "mi300x"}})


PLAN_CASES.update({
    "PRECISION-RULE-RECIPE": ({"precision": {**TE, "rules": [{"match": "*.w2", "recipe": "current"}]}},
                              {"precision": {**TAO, "rules": [{"match": "*.w2", "recipe": "rowwise"}]}}),
    "PRECISION-RULE-MODE": ({"precision": {**TAO, "rules": [{"match": "*.w2", "mode": "fp32"}]}, "distributed": DS},
                            {"precision": {**TAO, "rules": [{"match": "*.w2", "mode": "fp32"}]}, "distributed": {"strategy": "fsdp2"}}),
    "PRECISION-RULE-UNMATCHED": ({"precision": {**TAO, "rules": [{"match": "layers.*.mlp.w2", "mode": "bf16"}]}},
                                 {"precision": {**TAO, "rules": [{"match": "layers.*.feed_forward.w2", "mode": "bf16"}]}}),
})


def test_a_rule_mode_of_fp16_needs_an_fp16_run():
    assert "PRECISION-RULE-MODE" in fired({"precision": {**TAO, "rules": [{"match": "*.w2", "mode": "fp16"}]}})
    assert "PRECISION-RULE-MODE" not in fired({"precision": {"mode": "fp16", "rules": [{"match": "*.w2", "mode": "fp16"}]}})


def test_a_rule_recipe_must_be_one_of_torchaos():
    bad = {"precision": {**TAO, "rules": [{"match": "*", "recipe": "delayed"}]}}
    assert "PRECISION-RULE-RECIPE" in fired(bad)


BF16_TAIL = [{"at_step": 8, "mode": "bf16"}]
PLAN_CASES.update({
    "SCHEDULE-STEPS": ({"precision": {**TAO, "schedule": [{"at_step": 500, "mode": "bf16"}]}, "train": {"steps": 100}},
                       {"precision": {**TAO, "schedule": [{"at_step": 90, "mode": "bf16"}]}, "train": {"steps": 100}}),
    "SCHEDULE-DIRECTION": ({"precision": {**TAO, "schedule": [{"at_step": 8, "mode": "fp32"}]}},
                           {"precision": {**TAO, "schedule": BF16_TAIL}}),
    "SCHEDULE-SUPPORT": ({"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True}, "schedule": BF16_TAIL}},
                         {"precision": {**TAO, "schedule": BF16_TAIL}}),
})


def test_schedule_moves_layers_between_fp8_recipes_and_high_precision_but_not_the_high_precision_itself():
    def fired_for(schedule, **precision):
        return "SCHEDULE-DIRECTION" in fired({"precision": {**TAO, **precision, "schedule": schedule}})

    assert not fired_for([{"at_step": 4, "keep_last_blocks": 1}, {"at_step": 8, "mode": "bf16"}])
    assert not fired_for([{"at_step": 4, "keep_last_blocks": 1}, {"at_step": 8, "keep_last_blocks": 0}])  # back into FP8
    assert not fired_for([{"at_step": 4, "recipe": "rowwise"}])  # a recipe change
    assert not fired_for([{"at_step": 4, "rules": []}], rules=[{"match": "*.w2", "mode": "bf16"}])  # w2 back into FP8
    assert fired_for([{"at_step": 4, "mode": "fp32"}])  # not this run's high precision
    assert fired_for([{"at_step": 4, "rules": []}], rules=[{"match": "*.w2", "mode": "fp32"}])  # a layer's own dtype
    bf16_to_fp8 = {"precision": {"mode": "bf16", "schedule": [{"at_step": 4, "mode": "fp8"}]}}
    assert not fired(bf16_to_fp8) & {"SCHEDULE-DIRECTION", "SCHEDULE-SUPPORT"}


def test_a_later_phase_is_held_to_the_error_rules_of_its_own_precision():
    """bf16 first, then FP8 with a block recipe on a run the switch cannot convert: refused for that phase."""
    found = fired({"precision": {"mode": "bf16", "torchao": {"recipe": "mxfp8"}, "schedule": [{"at_step": 4, "mode": "fp8"}]}})
    assert "SCHEDULE-SUPPORT" in found
    spec = {"precision": {"mode": "bf16", "schedule": [{"at_step": 4, "mode": "fp8"}]}, "distributed": {"strategy": "ddp"}, **COMPILED}
    assert "FP8-DDP-COMPILE" in fired(spec)  # the rule of the FP8 phase, though phase 0 is bf16
    plan = plan_from({"version": 1, "name": "t", **spec})
    texts = [str(f) for f in check(Facts(plan=plan, rendered=render(plan)))]
    assert any(s.startswith("error[FP8-DDP-COMPILE]: in the precision phase from step 4: ") for s in texts)


PLAN_CASES["MONITOR-BLOCK"] = ({"precision": NVFP4, "monitor": {"fp8_stats_every": 10}},
                               {"precision": MX, "monitor": {"fp8_stats_every": 10}})

# -- expert parallel (issue 21): each rule on its bad combination and on its fixed twin ----------
EP2 = {"strategy": "fsdp2", "procs_per_node": 2, "expert_parallel": 2}
MOE = {"model": "builtin:moe-debug"}  # 8 experts
PLAN_CASES.update({
    "EP-DIVIDES-WORLD": ({"distributed": {**EP2, "procs_per_node": 3}, "train": MOE},
                         {"distributed": {**EP2, "procs_per_node": 4}, "train": MOE}),
    "EP-DIVIDES-EXPERTS": ({"distributed": {**EP2, "procs_per_node": 3, "expert_parallel": 3}, "train": MOE},
                           {"distributed": {**EP2, "procs_per_node": 4, "expert_parallel": 4}, "train": MOE}),
    "EP-DENSE-MODEL": ({"distributed": EP2, "train": {"model": "builtin:llama-debug"}}, {"distributed": EP2, "train": MOE}),
    "EP-STRATEGY": ({"distributed": {**EP2, "strategy": "ddp"}, "train": MOE}, {"distributed": EP2, "train": MOE}),
    "EP-TENSOR-PARALLEL": ({"distributed": {**EP2, "tensor_parallel": 2}, "train": MOE}, {"distributed": EP2, "train": MOE}),
})

# -- MoE (issue 21): each rule on its bad combination and on its fixed twin ----------------------
MOE_MX = {**TAO, "torchao": {"recipe": "mxfp8"}}
MOE_ROW = {**TAO, "torchao": {"recipe": "rowwise"}}
PLAN_CASES.update({
    "MOE-ROUTER-FP8": ({"precision": {**MOE_MX, "rules": [{"match": "layers.*.moe.*", "recipe": "mxfp8"}]}, "train": MOE},
                       {"precision": {**MOE_MX, "rules": [{"match": "layers.*.moe.experts", "recipe": "mxfp8"}]}, "train": MOE}),
    "MOE-ROWWISE-CPU": ({"precision": MOE_ROW, "train": MOE, "launch": {"device": "cpu"}},
                        {"precision": MOE_MX, "train": MOE, "launch": {"device": "cpu"}}),
    "MOE-EXPERTS-HP": ({"precision": TAO, "train": MOE}, {"precision": MOE_MX, "train": MOE}),
    "MOE-ALLGATHER-EXPERTS": ({"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True}},
                               "distributed": {"strategy": "fsdp2"}, "train": MOE},
                              {"precision": TAO, "distributed": {"strategy": "fsdp2"}, "train": MOE}),
})
RUN_CASES["MOE-ROWWISE-HARDWARE"] = ({"precision": MOE_ROW, "train": MOE, "launch": {"device": "cuda"}},
                                     {"device": "cuda", "capability": (8, 9)}, {"device": "cuda", "capability": (9, 0)})


def test_moe_router_rule_reads_hf_router_globs_and_leaves_dense_models_alone():
    hf = {"precision": {**MOE_MX, "rules": [{"match": "*.mlp.gate", "recipe": "mxfp8"}]}, "train": {"model": "hf:some/qwen3-moe"}}
    assert "MOE-ROUTER-FP8" in fired(hf)
    dense = {"precision": {**MOE_MX, "rules": [{"match": "*", "recipe": "mxfp8"}]}, "train": {"model": "builtin:llama-debug"}}
    assert "MOE-ROUTER-FP8" not in fired(dense) and "MOE-EXPERTS-HP" not in fired(dense)


# -- tensor parallel (issue 15): each rule on its bad combination and on its fixed twin ----------
TP2 = {"strategy": "fsdp2", "procs_per_node": 4, "tensor_parallel": 2}
PLAN_CASES.update({
    "TP-DIVIDES-PROCS": ({"distributed": {"procs_per_node": 6, "tensor_parallel": 4}},
                         {"distributed": {"procs_per_node": 8, "tensor_parallel": 4}}),
    # builtin:llama-debug has 8 attention heads and 4 KV heads; llama3-8b has 32 and 8
    "TP-HEADS": ({"distributed": {"procs_per_node": 8, "tensor_parallel": 8}, "train": {"model": "builtin:llama-debug"}},
                 {"distributed": {"procs_per_node": 8, "tensor_parallel": 8}, "train": {"model": "builtin:llama3-8b"}}),
    "TP-SEQ-LEN": ({"distributed": TP2, "train": {"seq_len": 255}}, {"distributed": TP2, "train": {"seq_len": 256}}),
    "TP-STRATEGY": ({"distributed": {**TP2, "strategy": "ddp"}}, {"distributed": TP2}),
    "TP-MODEL": ({"distributed": TP2, "train": {"model": "hf:./llama"}}, {"distributed": TP2, "train": {"model": "builtin:llama-small"}}),
    "TP-BACKEND": ({"precision": {**MSAMP}, "distributed": TP2}, {"precision": TAO, "distributed": TP2}),
    "TP-ROWWISE-BF16-COMM": ({"precision": {**TAO, "torchao": {"recipe": "rowwise"}}, "distributed": TP2},
                             {"precision": {**TAO, "torchao": {"recipe": "tensorwise"}}, "distributed": TP2}),
    "TP-COMPILE-CPU": ({"distributed": TP2, "launch": {"device": "cpu"}, **COMPILED}, {"distributed": TP2, "launch": {"device": "cpu"}}),
    "TP-ASYNC-COMPILE": ({"distributed": {**TP2, "async_tp": True}, "launch": {"device": "cuda"}},
                         {"distributed": {**TP2, "async_tp": True}, "launch": {"device": "cuda"}, **COMPILED}),
    "TP-ASYNC-CPU": ({"distributed": {**TP2, "async_tp": True}, "launch": {"device": "cpu"}, **COMPILED},
                     {"distributed": {**TP2, "async_tp": True}, "launch": {"device": "cuda"}, **COMPILED}),
    "TP-ASYNC-NO-TP": ({"distributed": {"async_tp": True}, **COMPILED}, {"distributed": {**TP2, "async_tp": True}, **COMPILED}),
})

# -- pipeline parallel (issue 38): each rule on its bad combination and on its fixed twin ---------------
PP2 = {"strategy": "fsdp2", "procs_per_node": 2, "pipeline_parallel": 2}
KEPT = {"fsdp2": {"reshard_after_forward": False}}  # the weights gathered through the step: what ZBV needs (PP-ZBV-RESHARD)
PP_TRAIN = {"model": "builtin:llama-debug", "micro_batch_size": 2}  # 4 blocks; 2 pipeline micro-batches of one sequence
PP_MOE = {**PP_TRAIN, "model": "builtin:moe-debug"}  # 2 MoE blocks, 8 experts
PLAN_CASES.update({
    "PP-DIVIDES-WORLD": ({"distributed": {**PP2, "procs_per_node": 2, "tensor_parallel": 2}, "train": PP_TRAIN},
                         {"distributed": {**PP2, "procs_per_node": 4, "tensor_parallel": 2}, "train": PP_TRAIN}),
    "PP-LAYERS": ({"distributed": PP2, "train": {**PP_TRAIN, "model": "builtin:llama-debug?layers=3"}},
                  {"distributed": {**PP2, "pipeline": {"layers_per_stage": [1, 2]}},
                   "train": {**PP_TRAIN, "model": "builtin:llama-debug?layers=3"}}),
    "PP-MICROBATCHES": ({"distributed": PP2, "train": {**PP_TRAIN, "micro_batch_size": 1}},
                        {"distributed": PP2, "train": {**PP_TRAIN, "micro_batch_size": 1, "grad_accum_steps": 2}}),
    "PP-STRATEGY": ({"distributed": {**PP2, "strategy": "ddp"}, "train": PP_TRAIN}, {"distributed": PP2, "train": PP_TRAIN}),
    "PP-MODEL": ({"distributed": PP2, "train": {**PP_TRAIN, "model": "hf:./llama"}}, {"distributed": PP2, "train": PP_TRAIN}),
    "PP-EXPERT-PARALLEL": ({"distributed": {**PP2, "procs_per_node": 4, "expert_parallel": 2}, "train": PP_MOE},
                           {"distributed": {**PP2, "procs_per_node": 4}, "train": PP_MOE}),
    "PP-BACKEND": ({"precision": {**TE, "te": {"recipe": "current"}}, "distributed": PP2, "train": PP_TRAIN},
                   {"precision": TAO, "distributed": PP2, "train": PP_TRAIN}),
    "PP-PRECISION-SCHEDULE": ({"precision": {**TAO, "schedule": BF16_TAIL}, "distributed": PP2, "train": PP_TRAIN},
                              {"precision": TAO, "distributed": PP2, "train": PP_TRAIN}),
    "PP-FP16": ({"precision": {"mode": "fp16"}, "distributed": PP2, "train": PP_TRAIN},
                {"precision": {"mode": "bf16"}, "distributed": PP2, "train": PP_TRAIN}),
    "PP-GRAD-REDUCE": ({"precision": {**TAO, "grad_reduce": "bf16"}, "distributed": PP2, "train": PP_TRAIN},
                       {"precision": TAO, "distributed": PP2, "train": PP_TRAIN}),
    "PP-MONITOR": ({"precision": TAO, "distributed": PP2, "train": PP_TRAIN, **MONITORED},
                   {"precision": TAO, "distributed": PP2, "train": PP_TRAIN}),
    "PP-STAGES-PER-RANK": ({"distributed": {**PP2, "pipeline": {"schedule": "ZBVZeroBubble", "stages_per_rank": 3}, **KEPT},
                            "train": {**PP_TRAIN, "model": "builtin:llama-debug?layers=6"}},
                           {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B", "stages_per_rank": 3}},
                            "train": {**PP_TRAIN, "model": "builtin:llama-debug?layers=6"}}),
    "PP-ZBV-COMPILE": ({"distributed": {**PP2, "pipeline": {"schedule": "ZBVZeroBubble"}, **KEPT}, "train": PP_TRAIN, **COMPILED},
                       {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B"}}, "train": PP_TRAIN, **COMPILED}),
    "PP-ZBV-EVAL": ({"distributed": {**PP2, "pipeline": {"schedule": "ZBVZeroBubble"}, **KEPT}, "train": PP_TRAIN,
                     "eval": {"data": "synthetic"}},
                    {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B"}}, "train": PP_TRAIN,
                     "eval": {"data": "synthetic"}}),
    "PP-ZBV-RESHARD": ({"distributed": {**PP2, "pipeline": {"schedule": "ZBVZeroBubble"}}, "train": PP_TRAIN},
                       {"distributed": {**PP2, "pipeline": {"schedule": "ZBVZeroBubble"}, **KEPT}, "train": PP_TRAIN}),
})


# -- context parallel (issue 38): each rule on its bad combination and on its fixed twin ---------------
CP2 = {"strategy": "fsdp2", "procs_per_node": 2, "context_parallel": 2}
CP_TRAIN = {"model": "builtin:llama-debug", "seq_len": 32}
CP_MOE = {**CP_TRAIN, "model": "builtin:moe-debug"}
PLAN_CASES.update({
    "CP-DIVIDES-WORLD": ({"distributed": {**CP2, "procs_per_node": 3}, "train": CP_TRAIN}, {"distributed": CP2, "train": CP_TRAIN}),
    "CP-SEQ": ({"distributed": CP2, "train": {**CP_TRAIN, "seq_len": 30}}, {"distributed": CP2, "train": {**CP_TRAIN, "seq_len": 28}}),
    "CP-STRATEGY": ({"distributed": {**CP2, "strategy": "deepspeed"}, "train": CP_TRAIN}, {"distributed": CP2, "train": CP_TRAIN}),
    "CP-MODEL": ({"distributed": CP2, "train": {**CP_TRAIN, "model": "hf:./llama"}}, {"distributed": CP2, "train": CP_TRAIN}),
    "CP-PIPELINE": ({"distributed": {**CP2, "procs_per_node": 4, "pipeline_parallel": 2}, "train": {**CP_TRAIN, "micro_batch_size": 2}},
                    {"distributed": {**CP2, "procs_per_node": 4}, "train": {**CP_TRAIN, "micro_batch_size": 2}}),
    "CP-TENSOR-PARALLEL": ({"distributed": {**CP2, "procs_per_node": 4, "tensor_parallel": 2}, "train": CP_TRAIN},
                           {"distributed": {**CP2, "procs_per_node": 4}, "train": CP_TRAIN}),
    "CP-EXPERT-PARALLEL": ({"distributed": {**CP2, "procs_per_node": 4, "expert_parallel": 2}, "train": CP_MOE},
                           {"distributed": {**CP2, "procs_per_node": 4}, "train": CP_MOE}),
    "CP-BACKEND": ({"precision": {**TE, "te": {"recipe": "current"}}, "distributed": CP2, "train": CP_TRAIN},
                   {"precision": TAO, "distributed": CP2, "train": CP_TRAIN}),
    "CP-COMPILE": ({"distributed": CP2, "train": CP_TRAIN, **COMPILED}, {"distributed": CP2, "train": CP_TRAIN}),
})


def test_pipeline_rules_name_what_is_wrong_with_the_split_and_the_micro_batches():
    uneven = {"distributed": {**PP2, "pipeline": {"layers_per_stage": [1, 2]}}, "train": PP_TRAIN}
    assert "distributed.pipeline.layers_per_stage = [1, 2] holds 3 blocks, not builtin:llama-debug's 4" in detail(uneven, "PP-LAYERS")
    three = {"distributed": {**PP2, "pipeline": {"layers_per_stage": [1, 1, 2]}}, "train": PP_TRAIN}
    assert "names 3 stages, not pipeline_parallel = 2" in detail(three, "PP-LAYERS")
    odd = {"distributed": {**PP2, "pipeline": {"microbatches": 3}}, "train": {**PP_TRAIN, "micro_batch_size": 4}}
    assert "3 pipeline micro-batches do not divide the step's 4 sequences" in detail(odd, "PP-MICROBATCHES")
    two = {"distributed": {**PP2, "pipeline": {"microbatches": 2}}, "train": {**PP_TRAIN, "micro_batch_size": 4}}
    assert "PP-MICROBATCHES" not in fired(two)


def test_several_stages_a_rank_cut_the_model_into_pp_times_as_many_stages():
    """Interleaved1F1B holds 2 stages a rank unless told: 4 stages of builtin:llama-debug's 4 blocks under pp 2; 3 stages a
    rank do not divide them; ScheduleInterleaved1F1B's rounds (micro-batches // pp) must divide the micro-batches; a
    single-stage schedule with several stages a rank, and ZBV with other than 2, are refused by name."""
    looped = {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B"}}, "train": PP_TRAIN}
    assert not {"PP-LAYERS", "PP-STAGES-PER-RANK", "PP-MICROBATCHES"} & set(fired(looped))
    three = {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B", "stages_per_rank": 3}}, "train": PP_TRAIN}
    assert "the 6 pipeline stages (2 x stages_per_rank 3) do not divide builtin:llama-debug's 4 blocks" in detail(three, "PP-LAYERS")
    listed = {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B", "layers_per_stage": [2, 2]}}, "train": PP_TRAIN}
    assert "names 2 stages, not the 4 stages of pipeline_parallel = 2 x stages_per_rank 2" in detail(listed, "PP-LAYERS")
    rounds = {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B", "microbatches": 5}},
              "train": {**PP_TRAIN, "micro_batch_size": 5}}
    assert "5 pipeline micro-batches are not a multiple of Interleaved1F1B's 2 rounds" in detail(rounds, "PP-MICROBATCHES")
    assert "PP-MICROBATCHES" not in fired({**rounds, "distributed": {**PP2, "pipeline": {"microbatches": 5}}})  # 1F1B has none
    single = {"distributed": {**PP2, "pipeline": {"stages_per_rank": 2}}, "train": PP_TRAIN}
    assert "schedule 1F1B runs one stage a rank, not stages_per_rank = 2" in detail(single, "PP-STAGES-PER-RANK")
    one = {"distributed": {**PP2, "pipeline": {"schedule": "Interleaved1F1B", "stages_per_rank": 1}}, "train": PP_TRAIN}
    assert "stages_per_rank = 1 is schedule 1F1B" in detail(one, "PP-STAGES-PER-RANK")


def test_context_parallel_names_every_factor_that_must_divide_the_world():
    """The split a world must divide is tp x cp x pp: the detail names each factor above 1 (CP-PIPELINE refuses pp with cp
    as well, for another reason)."""
    both = {"distributed": {**CP2, "procs_per_node": 6, "pipeline_parallel": 2, "tensor_parallel": 2}, "train": CP_TRAIN}
    assert ("distributed.context_parallel = 2 x tensor_parallel = 2 x pipeline_parallel = 2 does not divide the world size 6"
            in detail(both, "CP-DIVIDES-WORLD"))
    assert "pipeline_parallel" not in detail({"distributed": {**CP2, "procs_per_node": 3}, "train": CP_TRAIN}, "CP-DIVIDES-WORLD")


@pytest.mark.parametrize("rule_id", sorted(PLAN_CASES))
def test_plan_rule_fires_and_its_fix_silences_it(rule_id):
    bad, fixed = PLAN_CASES[rule_id]
    assert rule_id in fired(bad)
    assert rule_id not in fired(fixed)


@pytest.mark.parametrize("rule_id", sorted(RUN_CASES))
def test_run_rule_fires_only_on_its_facts(rule_id):
    data, bad, good = RUN_CASES[rule_id]
    assert rule_id in fired(data, **bad)
    assert rule_id not in fired(data, **good)


def test_a_precision_rules_entry_in_mxfp8_needs_torchaos_mx_torch_too():
    """torchao asserts its MX training's torch APIs for a rules entry's MXFP8 layers as for the plan's recipe."""
    entry = {"precision": {**TAO, "rules": [{"match": "layers.1.*", "recipe": "mxfp8"}]}}
    assert "TORCHAO-MX-TORCH" in fired(entry, device="cpu", torchao_mx_supported=False)
    assert "TORCHAO-MX-TORCH" not in fired(entry, device="cpu", torchao_mx_supported=True)
    rowwise = {"precision": {**TAO, "rules": [{"match": "layers.1.*", "recipe": "rowwise"}]}}
    assert "TORCHAO-MX-TORCH" not in fired(rowwise, device="cpu", torchao_mx_supported=False)


def test_mxfp8_is_refused_on_sm120():
    mx = {"precision": {**TE, "te": {"recipe": "mxfp8"}}}
    assert "TE-RECIPE-HARDWARE" in fired(mx, device="cuda", capability=(12, 0))


def test_block_recipe_needs_hopper():
    te_block = {"precision": {**TE, "te": {"recipe": "block"}}}
    assert "TE-RECIPE-HARDWARE" in fired(te_block, device="cuda", capability=(8, 9))
    assert "TE-RECIPE-HARDWARE" not in fired(te_block, device="cuda", capability=(9, 0))


def test_fp16_and_bf16_both_enabled_in_a_rendered_deepspeed_config():
    rule = RULES_BY_ID["FP16-BF16-BOTH"]
    plan = plan_of({"distributed": {"strategy": "deepspeed"}})
    rendered = render(plan)
    assert not rule.condition(Facts(plan=plan, rendered=rendered))
    both = json.loads(rendered["deepspeed.json"])
    both["fp16"]["enabled"] = True  # what a hand-edited template could do
    assert rule.condition(Facts(plan=plan, rendered={"deepspeed.json": json.dumps(both)}))


def test_every_rule_in_the_table_is_tested_here():
    tested = set(PLAN_CASES) | set(RUN_CASES) | {"FP16-BF16-BOTH"} | set(PREDICTION_CASES)
    assert {r.id for r in RULES} == tested


def test_spec_contract_ids_are_all_present():
    contract = {"FP8-DDP-COMPILE", "FP8-ALLGATHER-STRATEGY", "FP8-ALLGATHER-RECIPE", "FP8-NO-COMPILE", "FP8-AC-COMPILE-SLOW",
                "TE-DELAYED-COMPILE", "TE-REMOVED-KEY", "TE-RECIPE-HARDWARE", "MSAMP-FSDP2", "MSAMP-ZERO3", "MSAMP-O3-STRATEGY",
                "MSAMP-OPTIMIZER", "FP16-BF16-BOTH", "BATCH-MISMATCH", "SECTION-UNUSED", "FP8-HARDWARE", "FP8-NOT-APPLIED",
                "BACKEND-MISSING"}
    assert contract <= set(RULES_BY_ID)


def test_every_fix_names_a_spec_key_or_an_action():
    keys = ("precision.", "distributed.", "compile.", "activation_checkpointing.", "train.", "launch.", "eval.", "log.", "templates/",
            "install", "delete", "measure")
    for r in RULES:
        assert any(k in r.fix for k in keys), r.id


def test_error_rule_stops_plan_with_id_and_fix(cli, spec, tmp_path):
    path = spec(
        """
        version = 1
        name = "x"
        [precision]
        mode = "fp8"
        [distributed]
        strategy = "ddp"
        [compile]
        enabled = true
        """
    )
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{path}: error[FP8-DDP-COMPILE]: ")
    assert 'fix: set distributed.strategy = "fsdp2", or compile.enabled = false' in r.stderr
    assert not (tmp_path / "out").exists()


def test_warning_prints_and_strict_makes_it_an_error(cli, spec, tmp_path):
    path = spec('version = 1\nname = "w"\n[precision]\nmode = "fp8"\n[precision.torchao]\nskip_small = false\n')
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0
    assert f"{path}: warning[FP8-NO-COMPILE]:" in r.stderr
    r = cli("plan", path, "--out", "strict-out", "--strict")
    assert r.exit_code == 2
    assert f"{path}: error[FP8-NO-COMPILE]:" in r.stderr
    assert not (tmp_path / "strict-out").exists()


def test_removed_te_key_is_named(cli, spec):
    path = spec('version = 1\nname = "te"\n[precision]\nmode = "fp8"\nbackend = "te"\n'
                '[precision.te]\noverride_linear_precision = [false, false, true]\n')
    r = cli("plan", path)
    assert r.exit_code == 2
    assert "error[TE-REMOVED-KEY]: precision.te.override_linear_precision was removed in Transformer Engine 2.2" in r.stderr


def test_explain_lists_and_explains(cli):
    r = cli("explain")
    assert r.exit_code == 0
    assert all(rule.id in r.stdout for rule in RULES)
    r = cli("explain", "msamp-zero3")
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0] == "MSAMP-ZERO3 (error, checked when planning (fp8launch plan and run))"
    assert "fix:  set distributed.deepspeed.zero_stage = 2" in r.stdout
    r = cli("explain", "FP8-DDP-COMPLIE")
    assert r.exit_code == 2 and "did you mean FP8-DDP-COMPILE?" in r.stderr


def test_tp_rules_cover_each_case_of_their_condition():
    # TE is refused like MS-AMP; a KV-head count alone is enough to refuse (llama-debug: 8 heads, 4 KV heads)
    assert "TP-BACKEND" in fired({"precision": {**TE, "te": {"recipe": "current"}}, "distributed": TP2})
    assert "TP-STRATEGY" in fired({"distributed": {**TP2, "strategy": "deepspeed"}})
    assert "TP-MODEL" in fired({"distributed": TP2, "train": {"model": "py:my_model:build"}})
    assert "TP-HEADS" not in fired({"distributed": {"procs_per_node": 8, "tensor_parallel": 4}})
    tp8 = plan_of({"distributed": {"procs_per_node": 8, "tensor_parallel": 8}})
    msg = next(f.message for f in check(Facts(plan=tp8)) if f.rule.id == "TP-HEADS")
    assert msg == "distributed.tensor_parallel = 8 does not divide builtin:llama-debug's 4 KV heads."
    msg = next(f.message for f in check(Facts(plan=plan_of({"distributed": {"procs_per_node": 16, "tensor_parallel": 16},
                                                              "train": {"model": "builtin:llama-debug"}}))) if f.rule.id == "TP-HEADS")
    assert msg == "distributed.tensor_parallel = 16 does not divide builtin:llama-debug's 8 attention heads and 4 KV heads."
    # no tensor parallelism: none of the TP rules but the async one looks at the plan
    assert not {r for r in fired({"train": {"seq_len": 255}, "distributed": {"strategy": "ddp"}}) if r.startswith("TP-")}


def test_tp_global_batch_counts_data_parallel_ranks_only():
    plan = plan_of({"distributed": {"procs_per_node": 8, "tensor_parallel": 4}, "train": {"micro_batch_size": 3, "grad_accum_steps": 2}})
    assert plan.distributed.data_parallel == 2
    assert plan.distributed.global_batch_size == 3 * 2 * 2
    assert "BATCH-MISMATCH" not in fired({"distributed": {"procs_per_node": 8, "tensor_parallel": 4, "global_batch_size": 12},
                                          "train": {"micro_batch_size": 3, "grad_accum_steps": 2}})
    mismatched = plan_of({"distributed": {"procs_per_node": 8, "tensor_parallel": 4, "global_batch_size": 48},
                          "train": {"micro_batch_size": 3, "grad_accum_steps": 2}})
    msg = next(f.message for f in check(Facts(plan=mismatched)) if f.rule.id == "BATCH-MISMATCH")
    assert "data-parallel ranks 2 (world size 8 / tensor_parallel 4) = 12" in msg


def test_batch_mismatch_names_first_the_accumulation_that_keeps_the_global_batch():
    """An imported global batch of 8 planned for 8 ranks, then run on 2 (the import's PLACEHOLDER): the fix keeps 8."""
    [f] = [f for f in check(Facts(plan=plan_of({"distributed": {"procs_per_node": 2, "global_batch_size": 8},
                                                  "train": {"micro_batch_size": 1}}))) if f.rule.id == "BATCH-MISMATCH"]
    assert f.fix.startswith("set train.grad_accum_steps = 4 (keeps the global batch), or set train.micro_batch_size = 4")
    assert f.fix.endswith("or set distributed.global_batch_size = 0 (derive it: the global batch changes)")
    assert "BATCH-MISMATCH" not in fired({"distributed": {"procs_per_node": 2, "global_batch_size": 8},
                                          "train": {"micro_batch_size": 1, "grad_accum_steps": 4}})  # the fix, applied
    [g] = [f for f in check(Facts(plan=plan_of({"distributed": {"procs_per_node": 4, "global_batch_size": 6},
                                                 "train": {"micro_batch_size": 1}}))) if f.rule.id == "BATCH-MISMATCH"]
    assert g.fix.startswith("choose a world size whose data-parallel ranks divide distributed.global_batch_size = 6")


def test_tp_error_stops_plan_with_exit_2_and_nothing_written(cli, spec, tmp_path):
    path = spec('version = 1\nname = "tp"\n[distributed]\nprocs_per_node = 2\ntensor_parallel = 2\nstrategy = "ddp"\n')
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 2
    assert 'error[TP-STRATEGY]:' in r.stderr and 'fix: set distributed.strategy = "fsdp2", or distributed.tensor_parallel = 1' in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


# --- FP8-NO-GAIN (issue 12): fires on the speed prediction planning makes -----------------------------

def fired_with_prediction(data: dict) -> set[str]:
    from launcher.planning.predict import predict

    plan = plan_of(data)
    return {f.rule.id for f in check(Facts(plan=plan, rendered=render(plan), prediction=predict(plan)), stage="plan")}


DEBUG_SEQ128 = {"precision": {**TAO, "torchao": {"skip_small": False}}, "train": {"model": "builtin:llama-debug", "seq_len": 128}}
PREDICTION_CASES = {
    # the debug model at seq 128: every GEMM too small to pay for its casts; the fix keeps them in bf16
    # (keeping every losing layer would leave none in FP8: FP8-NONE-SELECTED); the fix's larger batch and compile pay for the casts
    "FP8-NO-GAIN": (DEBUG_SEQ128, {**DEBUG_SEQ128, **COMPILED, "train": {**DEBUG_SEQ128["train"], "seq_len": 2048, "micro_batch_size": 8}}),
    # the debug model at 16k tokens a step gains in FP8, and full checkpointing's recompute turns it into a loss
    "FP8-AC-COMPILE-SLOW": ({**DEBUG_SEQ128, **COMPILED, "train": {**DEBUG_SEQ128["train"], "seq_len": 2048, "micro_batch_size": 8},
                             "activation_checkpointing": {"mode": "full"}},
                            {**DEBUG_SEQ128, **COMPILED, "train": {**DEBUG_SEQ128["train"], "seq_len": 2048, "micro_batch_size": 8},
                             "activation_checkpointing": {"mode": "none"}}),
}


def test_ac_compile_slow_is_said_only_where_the_prediction_says_the_recompute_loses():
    """torchtitan's and Axolotl's recommended setups (Llama-3-8B at seq 8192, full checkpointing, compile, FSDP2) gain:
    no warning there, where it fired for every such spec; where it fires, FP8-NO-GAIN leaves it the word."""
    titan = {"precision": TAO, **COMPILED, "activation_checkpointing": {"mode": "full"},
             "train": {"model": "builtin:llama3-8b", "seq_len": 8192}}
    assert not fired_with_prediction(titan) & {"FP8-AC-COMPILE-SLOW", "FP8-NO-GAIN"}
    bad, _ = PREDICTION_CASES["FP8-AC-COMPILE-SLOW"]
    from launcher.planning.predict import predict

    plan = plan_of(bad)
    findings = {f.rule.id: f for f in check(Facts(plan=plan, prediction=predict(plan)))}
    assert "FP8-NO-GAIN" not in findings
    assert findings["FP8-AC-COMPILE-SLOW"].message.startswith("predicted FP8 tokens/s on 8 x h100 is 0.")
    assert "with activation_checkpointing.mode = \"full\" and 1." in findings["FP8-AC-COMPILE-SLOW"].message


@pytest.mark.parametrize("rule_id", sorted(PREDICTION_CASES))
def test_prediction_rule_fires_and_its_fix_silences_it(rule_id):
    bad, fixed = PREDICTION_CASES[rule_id]
    assert rule_id in fired_with_prediction(bad)
    assert rule_id not in fired_with_prediction(fixed)


def test_no_gain_is_silent_where_fp8_pays_and_for_bf16():
    big = {"precision": {**TAO, "torchao": {"fsdp_float8_all_gather": True}}, **COMPILED,
           "train": {"model": "builtin:llama3-8b", "seq_len": 8192}}
    assert "FP8-NO-GAIN" not in fired_with_prediction(big)
    assert "FP8-NO-GAIN" not in fired_with_prediction({"precision": {"mode": "bf16"}, "train": DEBUG_SEQ128["train"]})
    assert "FP8-NO-GAIN" not in fired(DEBUG_SEQ128)  # no prediction made (e.g. a py: model): the rule says nothing


def test_no_gain_message_names_the_ratio_and_a_losing_layer():
    from launcher.planning.predict import predict

    plan = plan_of(DEBUG_SEQ128)
    prediction = predict(plan)
    (finding,) = [f for f in check(Facts(plan=plan, prediction=prediction)) if f.rule.id == "FP8-NO-GAIN"]
    assert f"{prediction.fp8_vs_bf16:.2f}x" in finding.message and "M, K, N = " in finding.message
    # the fix names what would change something here: not skip_small (off), compile (off: named)
    assert "skip_small = true" in finding.fix and "set compile.enabled = true" in finding.fix
    plan = plan_of({**DEBUG_SEQ128, "precision": {**TAO, "torchao": {"recipe": "rowwise", "skip_small": False}}, **COMPILED})
    (finding,) = [f for f in check(Facts(plan=plan, prediction=predict(plan))) if f.rule.id == "FP8-NO-GAIN"]
    assert "compile.enabled" not in finding.fix and "skip_small = true" in finding.fix
    assert "0 of 0" not in finding.message


def test_no_gain_is_silent_for_cpu_runs_and_where_nothing_converts():
    assert "FP8-NO-GAIN" not in fired_with_prediction({**DEBUG_SEQ128, "launch": {"device": "cpu"}})
    nothing = {**DEBUG_SEQ128, "precision": {**TAO, "torchao": {"skip_small": True}}}
    assert fired_with_prediction(nothing) & {"FP8-NO-GAIN", "FP8-NONE-SELECTED"} == {"FP8-NONE-SELECTED"}


# --- Kubernetes rules (launch.launcher = "kubernetes"), each both ways -------------------------
K8S = {"launcher": "kubernetes", "kubernetes": {"image": "ghcr.io/acme/fp8:1", "volume_claim": "ckpt"}}


def k8s(**kubernetes) -> dict:
    return {**K8S, "kubernetes": {**K8S["kubernetes"], **kubernetes}}


K8S_CASES = {
    "K8S-IMAGE-MISSING": ({"launch": k8s(image="")}, {"launch": k8s(image="ghcr.io/acme/fp8:1")}),
    "K8S-NO-SHARED-OUTPUT": ({"launch": k8s(volume_claim=""), "train": {"checkpoint_every": 100}},
                             {"launch": k8s(volume_claim="ckpt"), "train": {"checkpoint_every": 100}}),
    "K8S-RESERVED-ENV": ({"launch": {**k8s(), "env": {"PET_NNODES": "2", "NCCL_DEBUG": "INFO"}}},
                         {"launch": {**k8s(), "env": {"NCCL_DEBUG": "INFO"}}}),
    "K8S-GPUS-FEWER": ({"distributed": {"procs_per_node": 8}, "launch": {**k8s(gpus_per_node=4), "device": "cuda"}},
                       {"distributed": {"procs_per_node": 8}, "launch": {**k8s(gpus_per_node=0), "device": "cuda"}}),
}
PLAN_CASES.update(K8S_CASES)  # the table-coverage test above reads PLAN_CASES when it runs


# --- Transformer Engine, true to the library (issue 29) ---
TE_CURRENT = {**TE, "te": {"recipe": "current"}}
TE_PARAMS = {**TE, "te": {"recipe": "current", "fp8_params": True}}
TE_CASES = {
    "TE-AC-COMPILE": ({"precision": TE_CURRENT, **COMPILED, "activation_checkpointing": {"mode": "selective"}},
                      {"precision": TE_CURRENT, **COMPILED, "activation_checkpointing": {"mode": "none"}}),
    "TE-FP8-ATTENTION-MODEL": ({"precision": {**TE, "te": {"fp8_dpa": True}}, "train": {"model": "py:mod:build"}},
                               {"precision": {**TE, "te": {"fp8_dpa": True}}, "train": {"model": "builtin:llama-debug"}}),
    "TE-FP8-MHA": ({"precision": {**TE, "te": {"fp8_mha": True}}}, {"precision": {**TE, "te": {"fp8_dpa": True}}}),
    "TE-FP8-PARAMS-OPTIMIZER": ({"precision": TE_PARAMS, "train": {"optimizer": "sgd"}},
                                {"precision": TE_PARAMS, "train": {"optimizer": "adamw"}}),
    "TE-FP8-PARAMS-FSDP2-BLOCK": ({"precision": {**TE, "te": {"recipe": "block", "fp8_params": True}},
                                   "distributed": {"strategy": "fsdp2"}},
                                  {"precision": {**TE, "te": {"recipe": "current", "fp8_params": True}},
                                   "distributed": {"strategy": "fsdp2"}}),
    "TE-FP8-PARAMS-DEEPSPEED-FP32": ({"precision": {**TE_PARAMS, "high_precision": "fp32"}, "distributed": DS},
                                     {"precision": {**TE_PARAMS, "high_precision": "fp32"}, "distributed": {"strategy": "ddp"}}),
}
DPA_H100 = {"precision": {**TE, "te": {"recipe": "delayed", "fp8_dpa": True}}, "launch": {"device": "cuda", "gpu": "h100"}}
TE_CASES["TE-FP8-DPA-GPU"] = ({**DPA_H100, "train": {"model": "builtin:llama-debug"}},  # head_dim 32
                              {**DPA_H100, "train": {"model": "builtin:llama3-8b"}})  # head_dim 128
PLAN_CASES.update(TE_CASES)
RUN_CASES["TE-FP8-DPA-BACKEND"] = ({"precision": {**TE, "te": {"recipe": "current", "fp8_dpa": True}}},
                                   {"device": "cuda", "capability": (9, 0)}, {"device": "cuda", "capability": (10, 0)})


@pytest.mark.parametrize("rule_id", sorted(TE_CASES))
def test_te_rule_fires_and_its_fix_silences_it(rule_id):
    bad, fixed = TE_CASES[rule_id]
    assert rule_id in fired(bad)
    assert rule_id not in fired(fixed)


def test_fp8_weights_plan_under_ddp_and_fsdp2_and_fp8_dpa_with_delayed_on_hopper_at_head_dim_128():
    for strategy in ("ddp", "fsdp2"):
        errors = {f.rule.id for f in check(Facts(plan=plan_of({"precision": TE_PARAMS, "distributed": {"strategy": strategy}})))
                  if f.is_error}
        assert not errors, errors
    dpa = {"precision": {**TE, "te": {"recipe": "delayed", "fp8_dpa": True}}}
    assert "TE-FP8-DPA-BACKEND" not in fired({**dpa, "train": {"model": "builtin:llama3-8b"}}, device="cuda", capability=(9, 0))
    assert "TE-FP8-DPA-BACKEND" in fired({**dpa, "train": {"model": "builtin:llama-debug"}}, device="cuda", capability=(9, 0))
    assert "TE-FP8-DPA-BACKEND" in fired({**dpa, "train": {"model": "builtin:llama3-8b"}}, device="cuda", capability=(12, 0))


def _dpa_finding(data: dict, rule_id: str, **facts):
    plan = plan_of(data)
    (finding,) = [f for f in check(Facts(plan=plan, **facts), "run" if facts else "plan") if f.rule.id == rule_id]
    return finding


@pytest.mark.parametrize("model,head_dim", [("llama-debug", 32), ("llama-small", 64), ("llama3-1b", 64)])
def test_fp8_dpa_on_an_h100_is_refused_at_plan_time_naming_the_head_dim(model, head_dim):
    finding = _dpa_finding({**DPA_H100, "train": {"model": f"builtin:{model}"}}, "TE-FP8-DPA-GPU")
    assert f"builtin:{model} (head_dim {head_dim})" in finding.message
    assert f"trains only head_dim 128 (qk and v), not head_dim {head_dim}" in finding.message
    assert "No dot product attention backend is available" in finding.message
    # the fix names what would give it a backend: no FP8 attention, a head_dim-128 model, or a B200; not another recipe
    assert finding.fix == ("set precision.te.fp8_dpa = false, or a train.model whose head_dim has one (builtin:llama3-8b, "
                           "builtin:llama3-70b: head_dim 128), or launch.gpu = 'b200'")
    assert "TE-FP8-DPA-GPU" not in fired({**DPA_H100, "train": {"model": f"builtin:{model}"}, "launch": {"device": "cuda", "gpu": "b200"}})


def test_current_scaling_attention_on_hopper_names_the_recipe_and_the_gpu_that_have_a_backend():
    data = {"precision": {**TE, "te": {"recipe": "current", "fp8_dpa": True}}, "train": {"model": "builtin:llama3-8b"},
            "launch": {"device": "cuda", "gpu": "h200"}}
    finding = _dpa_finding(data, "TE-FP8-DPA-GPU")
    assert "FusedAttention is disabled for Float8CurrentScaling below sm100" in finding.message
    assert finding.fix == "set precision.te.fp8_dpa = false, or precision.te.recipe = \"delayed\", or launch.gpu = 'b200'"
    run = _dpa_finding({**data, "launch": {"device": "cuda"}}, "TE-FP8-DPA-BACKEND", device="cuda", capability=(9, 0))
    assert run.fix == "set precision.te.fp8_dpa = false, or precision.te.recipe = \"delayed\", or run on a GPU that has one (b200)"


def test_auto_is_refused_at_plan_time_only_where_no_gpu_has_a_backend():
    auto = {"launch": {"device": "cuda", "gpu": "auto"}, "train": {"model": "builtin:llama-debug"}}
    delayed = {**auto, "precision": {**TE, "te": {"recipe": "delayed", "fp8_dpa": True}}}
    assert "TE-FP8-DPA-GPU" not in fired(delayed)  # a B200 has one; the run checks the GPU it finds
    assert "TE-FP8-DPA-BACKEND" in fired(delayed, device="cuda", capability=(9, 0))
    nvfp4 = {**auto, "precision": {**TE, "te": {"recipe": "nvfp4", "fp8_dpa": True}}}
    finding = _dpa_finding(nvfp4, "TE-FP8-DPA-GPU")
    assert "FusedAttention is disabled for NVFP4BlockScaling on every GPU" in finding.message
    assert finding.fix == 'set precision.te.fp8_dpa = false, or precision.te.recipe = "delayed" (or "current", "mxfp8")'
    assert "TE-FP8-DPA-GPU" not in fired({**delayed, "launch": {"device": "cpu"}})  # no GPU: rule CPU-BACKEND speaks


@pytest.mark.parametrize("rule_id", sorted(K8S_CASES))
def test_kubernetes_rule_fires_and_its_fix_silences_it(rule_id):
    bad, fixed = K8S_CASES[rule_id]
    assert rule_id in fired(bad)
    assert rule_id not in fired(fixed)


def test_no_volume_claim_is_fine_when_nothing_is_checkpointed():
    nothing_kept = {"launch": k8s(volume_claim=""), "train": {"checkpoint_every": 0, "checkpoint_at_end": False}}
    assert "K8S-NO-SHARED-OUTPUT" not in fired(nothing_kept)
    assert "K8S-NO-SHARED-OUTPUT" in fired({"launch": k8s(volume_claim="")})  # checkpoint_at_end defaults to true


def test_reserved_env_names_the_keys():
    plan = plan_of({"launch": {**k8s(), "env": {"RANK": "0", "PET_MASTER_ADDR": "x", "OK": "1"}}})
    [finding] = [f for f in check(Facts(plan=plan, rendered=render(plan))) if f.rule.id == "K8S-RESERVED-ENV"]
    assert finding.message == "launch.env sets PET_MASTER_ADDR, RANK, which the operator sets itself."


def test_gpus_fewer_does_not_apply_on_cpu():
    assert "K8S-GPUS-FEWER" not in fired({"launch": {**k8s(gpus_per_node=1), "device": "cpu"}})


def test_kubernetes_section_with_another_launcher_is_unused():
    assert "SECTION-UNUSED" in fired({"launch": {"launcher": "torchrun", "kubernetes": {"image": "x"}}})
    assert "SECTION-UNUSED" not in fired({"launch": k8s()})
    plan = plan_of({"launch": {"launcher": "slurm", "kubernetes": {"image": "x"}}})
    [finding] = [f for f in check(Facts(plan=plan, rendered=render(plan))) if f.rule.id == "SECTION-UNUSED"]
    assert finding.message == "[launch.kubernetes] is ignored with this plan."


# --- issue 10: memory and GPU-only faults ---
def test_memory_exceeds_gpu_names_the_figures_and_only_fires_for_gpu_plans():
    from launcher.planning.rules import Facts, check

    plan = plan_of({**_8B_SEQ_8192, "launch": {"device": "auto", "gpu": "h100"}})
    [finding] = [f for f in check(Facts(plan=plan)) if f.rule.id == "MEMORY-EXCEEDS-GPU"]
    assert finding.message.startswith("the estimate is ") and "but a H100 has 74.5 GiB" in finding.message
    assert 'activation_checkpointing.mode = "full"' in finding.rule.fix
    assert "procs_per_node" in finding.rule.fix and "offload" in finding.rule.fix
    assert "MEMORY-EXCEEDS-GPU" not in fired({**_8B_SEQ_8192, "launch": {"device": "cpu"}})
    # a bigger GPU holds it
    assert "MEMORY-EXCEEDS-GPU" not in fired({**_8B_SEQ_8192, "launch": {"device": "cuda", "gpu": "b200"}})


def test_memory_exceeds_gpus_fix_names_only_what_is_not_set_and_its_figures_count_the_recompute():
    from launcher.planning.rules import Facts, check

    def finding(spec):
        [f] = [f for f in check(Facts(plan=plan_of(spec))) if f.rule.id == "MEMORY-EXCEEDS-GPU"]
        return f

    gpu = {"launch": {"device": "cuda", "gpu": "h100"}}
    bare = finding({**_8B_SEQ_8192, **gpu, "distributed": {"strategy": "fsdp2", "procs_per_node": 1}})
    assert 'activation_checkpointing.mode = "full"' in bare.fix and "cpu_offload = true" in bare.fix
    assert "micro_batch_size" in bare.fix and "recomputed" not in bare.message  # nothing checkpointed: no recompute
    # full checkpointing and offload already set (seq 128k on one GPU still does not fit): the fix names neither
    done = finding({"train": {"model": "builtin:llama3-8b", "seq_len": 131072, "micro_batch_size": 1}, **gpu,
                    "distributed": {"strategy": "fsdp2", "procs_per_node": 1, "fsdp2": {"cpu_offload": True}},
                    "activation_checkpointing": {"mode": "full"}})
    assert "activation_checkpointing" not in done.fix and "offload" not in done.fix and "micro_batch_size" not in done.fix
    assert "procs_per_node" in done.fix and "train.seq_len" in done.fix
    # the breakdown counts the block backward recomputes, and the parts add up to the estimate
    m = re.search(r"estimate is ([\d.]+) GiB per GPU \(model states ([\d.]+) GiB, activations ([\d.]+) GiB, "
                  r"one block recomputed in backward ([\d.]+) GiB\)", done.message)
    assert m, done.message
    total, *parts = map(float, m.groups())
    assert float(parts[2]) > 0 and sum(parts) == pytest.approx(total, abs=0.15)  # each part rounded to 0.1 GiB


# -- MS-AMP's levels natively (issue 30) ----------
DDP_BF16 = {"mode": "bf16"}
PLAN_CASES.update({
    "OPTIMIZER-STATES-SGD": ({"precision": {**DDP_BF16, "optimizer_states": "fp8"}, "train": {"optimizer": "sgd"}},
                             {"precision": {**DDP_BF16, "optimizer_states": "fp8"}, "train": {"optimizer": "adamw"}}),
    "MASTER-WEIGHTS-OPTIMIZER": ({"precision": {**DDP_BF16, "master_weights": "bf16"}, "train": {"optimizer": "sgd"}},
                                 {"precision": {**DDP_BF16, "master_weights": "bf16"}, "train": {"optimizer": "adam"}}),
    "MASTER-WEIGHTS-COMPUTE": ({"precision": {**TAO, "high_precision": "fp32", "master_weights": "bf16"}},
                               {"precision": {**TAO, "high_precision": "bf16", "master_weights": "bf16"}}),
    "LEVELS-DEEPSPEED": ({"precision": {**DDP_BF16, "optimizer_states": "int8"}, "distributed": DS},
                         {"precision": {**DDP_BF16, "optimizer_states": "int8"}, "distributed": {"strategy": "fsdp2"}}),
    "GRAD-REDUCE-DEEPSPEED": ({"precision": {**DDP_BF16, "grad_reduce": "fp8"}, "distributed": DS},
                              {"precision": {**DDP_BF16, "grad_reduce": "auto"}, "distributed": DS}),
    "GRAD-REDUCE-FSDP2-FP32": ({"precision": {**DDP_BF16, "grad_reduce": "fp32"},
                                "distributed": {"strategy": "fsdp2", "fsdp2": {"reduce_dtype": "bf16"}}},
                               {"precision": {**DDP_BF16, "grad_reduce": "fp32"},
                                "distributed": {"strategy": "fsdp2", "fsdp2": {"reduce_dtype": "fp32"}}}),
    "LEVELS-BACKEND": ({"precision": {**MSAMP, "optimizer_states": "fp8"}, "distributed": {"strategy": "ddp"}},
                       {"precision": {**TAO, "optimizer_states": "fp8"}, "distributed": {"strategy": "ddp"}}),
})


def test_the_level_keys_default_to_todays_training():
    from launcher.planning.read import defaults

    p = defaults()["precision"]
    assert (p["optimizer_states"], p["grad_reduce"], p["master_weights"]) == ("fp32", "auto", "fp32")
    plan = plan_of({})
    assert (plan.precision.optimizer_states, plan.precision.grad_reduce, plan.precision.master_weights) == ("fp32", "auto", "fp32")


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_an_msamp_spec_that_cannot_run_here_names_its_native_keys(level):
    """MSAMP-STACK, CPU-BACKEND and a missing MS-AMP name the keys that give the spec's opt level natively, and those keys
    plan without an error (the O3 ones with FSDP2 on 2 ranks, where float8 all-gather applies)."""
    from launcher.planning.msamp_levels import MSAMP_LEVELS, native_keys

    strategy = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}} if level == "O3" else {"strategy": "ddp"}
    spec = {"precision": {**MSAMP, "msamp": {"opt_level": level}}, "distributed": strategy}
    plan = plan_of(spec)
    stack = [f for f in check(Facts(plan=plan, msamp_stack="MS-AMP 0.4.0 ... DeepSpeed 0.19.8."), "run") if f.rule.id == "MSAMP-STACK"]
    missing = [f for f in check(Facts(plan=plan, missing_package="msamp"), "run") if f.rule.id == "BACKEND-MISSING"]
    on_cpu = [f for f in check(Facts(plan=plan_of({**spec, "launch": {"device": "cpu"}})), "plan") if f.rule.id == "CPU-BACKEND"]
    for finding in stack + missing + on_cpu:
        assert native_keys(level) in finding.text and f"--preset msamp-{level.lower()}" in finding.text, finding.text
    assert len(stack) == len(missing) == len(on_cpu) == 1
    native: dict = {"distributed": {"procs_per_node": 2}}
    for key, value in MSAMP_LEVELS[level].items():
        node = native
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    native.setdefault("distributed", {}).setdefault("strategy", "ddp")
    native["precision"]["torchao"] = {**native["precision"].get("torchao", {}), "skip_small": False}
    assert not [f.rule.id for f in check(Facts(plan=plan_of(native)), "plan") if f.is_error]


# -- a CPU run's ranks against this machine's memory (issue 49) ----------
SMALL_CPU = {"launch": {"device": "cpu"}, "train": {"model": "builtin:llama-small", "seq_len": 64},
             "distributed": {"strategy": "ddp", "procs_per_node": 2}}
RUN_CASES["MEMORY-EXCEEDS-HOST"] = (SMALL_CPU, {"host_memory": 3 << 30}, {"host_memory": 64 << 30})  # one rank would fit


def test_host_memory_names_ranks_estimate_and_what_is_available_and_fixes_what_is_left():
    """2 ranks of llama-small under DDP: 2.1 GiB a rank by the plan's estimate against 3 GiB available; not looked (None:
    a GPU run, several nodes) never fires; the fix leaves out what the plan already does."""
    plan = plan_of(SMALL_CPU)
    (finding,) = [f for f in check(Facts(plan=plan, host_memory=3 << 30), "run") if f.rule.id == "MEMORY-EXCEEDS-HOST"]
    assert re.match(r"2 ranks x 2\.\d GiB \(the plan's memory estimate per rank: .*\) = 4\.\d GiB, but this machine has 3\.0 GiB "
                    r"available \(MemAvailable\)", finding.message), finding.message
    assert "distributed.strategy = \"fsdp2\"" in finding.fix and "distributed.procs_per_node" in finding.fix
    assert "MEMORY-EXCEEDS-HOST" not in fired(SMALL_CPU, host_memory=None)
    one = plan_of({**SMALL_CPU, "distributed": {"strategy": "fsdp2", "procs_per_node": 1}, "activation_checkpointing": {"mode": "full"},
                   "train": {"model": "builtin:llama-small", "seq_len": 64, "micro_batch_size": 1}})
    (finding,) = [f for f in check(Facts(plan=one, host_memory=1 << 20), "run") if f.rule.id == "MEMORY-EXCEEDS-HOST"]
    assert finding.fix == "lower train.seq_len, choose a smaller train.model, or run on a machine with more memory"
