"""A rank's initialisation time as `fp8launch plan` states it (launcher/planning/init_cost.py), and the initialisation
peak of a GPU run, whose modules are drawn on the GPU (launcher/planning/memory.py)."""

from __future__ import annotations

import json

import pytest

from launcher.planning.gpus import PLAN_GPUS
from launcher.planning.init_cost import CPU_S_PER_BILLION, MODULE_S, cpu_init_seconds, gpu_init_seconds, init_time, module_count
from launcher.planning.memory import estimate, model_params
from launcher.planning.models import builtin_config
from tests.support import plan_from

CORE = "builtin:llama3-8b?layers=15"
"""The GPU session's core bench (benchmarks/specs/llama3-8b-ac-fp8.toml): 4.32B parameters."""


def plan_of(model: str = CORE, **sections):
    return plan_from({"train": {"model": model}, **sections})


def test_a_gpu_run_draws_in_under_a_second_what_one_cpu_thread_draws_in_55_s():
    """The CPU figure is the measured one: 55 s for the core shape's 4.32B parameters on the GPU machine's host. On the
    GPU the time is memory traffic at the GPU's bandwidth plus a host cost per module, and like the CPU's it does not
    shrink with the world size: every rank draws every module whole."""
    params = model_params(CORE)
    cpu = init_time(plan_of(launch={"device": "cpu"}), params, builtin_config(CORE))
    assert cpu.where == "on the CPU" and cpu.seconds == pytest.approx(55, abs=0.5)
    gpu = init_time(plan_of(launch={"device": "cuda"}), params, builtin_config(CORE))
    assert gpu.where == "on the GPU" and 0.05 < gpu.seconds < 1.0
    assert module_count(15) == 9 * 15 + 3 and "138 modules" in gpu.how and "H100" in gpu.how
    eight = init_time(plan_of(launch={"device": "cuda"}, distributed={"procs_per_node": 8}), params, builtin_config(CORE))
    assert eight.seconds == gpu.seconds  # the whole model, not the rank's shard
    h200 = init_time(plan_of(launch={"device": "cuda", "gpu": "h200"}), params, builtin_config(CORE))
    traffic = gpu.seconds - module_count(15) * MODULE_S
    assert h200.seconds - module_count(15) * MODULE_S == pytest.approx(traffic * PLAN_GPUS["h100"].bandwidth_tbps
                                                                   / PLAN_GPUS["h200"].bandwidth_tbps)
    # the whole 8B: about twice the 15-layer shape, still under a second
    full = gpu_init_seconds(model_params("builtin:llama3-8b"), module_count(32))
    assert gpu.seconds < full < 1.0 and cpu_init_seconds(10**9) == CPU_S_PER_BILLION


def test_plan_prints_the_initialisation_time_and_puts_it_in_its_json(cli, spec):
    path = spec('version = 1\nname = "m"\n[launch]\ndevice = "cuda"\n[train]\nmodel = "builtin:llama3-8b?layers=15"\n')
    r = cli("plan", path)
    expected = init_time(plan_of(launch={"device": "cuda"}), model_params(CORE), builtin_config(CORE))
    assert f"  initialisation time per rank: ~{expected.seconds:.2g} s on the GPU (4.32B parameters, 138 modules, each drawn " \
           "whole on one H100 and sliced; drawn on a CPU: ~54.9 s)" in r.stdout.splitlines()
    record = json.loads(cli("plan", path, "--format", "json").stdout)
    assert record["init"] == {"seconds_per_rank": round(expected.seconds, 3), "where": "on the GPU", "how": expected.how}
    hf = spec('version = 1\nname = "h"\n[launch]\ndevice = "cpu"\n[train]\nmodel = "hf:/models/llama"\n', name="h.toml")
    record = json.loads(cli("plan", hf, "--params", "7e9", "--format", "json").stdout)
    assert record["init"]["seconds_per_rank"] == pytest.approx(7 * CPU_S_PER_BILLION) and "read instead" in record["init"]["how"]
    assert json.loads(cli("plan", hf, "--format", "json").stdout)["init"] is None  # unsized: no estimate


def test_the_initialisation_peak_puts_the_modules_copy_where_it_is_drawn():
    """FSDP2: the shard plus the largest module's full copy (Llama-3-8B: its 128256 x 4096 embedding), on the GPU for a
    GPU run, in host memory for a CPU run; with FSDP2's CPU offload on a GPU run the host holds the shard alone."""
    params = model_params("builtin:llama3-8b")
    embedding = 4 * 128_256 * 4096

    def peak(**sections):
        return estimate(plan_of("builtin:llama3-8b", distributed={"procs_per_node": 8, **sections.pop("distributed", {})},
                                **sections), params).init_peak

    gpu, cpu = peak(launch={"device": "cuda"}), peak(launch={"device": "cpu"})
    assert gpu.bytes == cpu.bytes == 4 * params / 8 + embedding
    assert gpu.where == "on the GPU" and "on the GPU while" in gpu.how and "in host memory while" in cpu.how
    offload = peak(launch={"device": "cuda"}, distributed={"fsdp2": {"cpu_offload": True}})
    assert offload.bytes == 4 * params / 8 and offload.where == "host" and "drawn on the GPU" in offload.how
    for device in ("cpu", "auto"):  # the module's copy in host memory too ("auto": a machine without a GPU)
        assert peak(launch={"device": device}, distributed={"fsdp2": {"cpu_offload": True}}).bytes == 4 * params / 8 + embedding
