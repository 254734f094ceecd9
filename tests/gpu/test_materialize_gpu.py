"""Initial weights drawn on the GPU (launcher/train/materialize.py): the same at every world size on CUDA (each rank
simulated in turn on torch's fake process group, as tests/train/test_materialize.py does on the CPU), the builtin rule's
values from CUDA's generator (not the CPU's numbers), one rank's time and memory for an 8B-shaped model against the
plan's figures (launcher/planning/init_cost.py, memory.py), and the real entrypoint on one GPU drawing there.
Skips without CUDA. Not run yet: no GPU was lent when it was written.

    python -m pytest -q -s tests/gpu/test_materialize_gpu.py     # -s: the measured seconds and bytes are printed
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from launcher.train import materialize as mat
from tests.train._fake_ranks import gathered, sharded, whole

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
RANDOM = ("tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.feed_forward.w2.weight", "output.weight")


def _plan_gpu() -> str:
    """The `launch.gpu` choice of this GPU, for the plan's figures (an unknown GPU: the default, h100)."""
    name = torch.cuda.get_device_name().lower()
    return next((key for key in ("h200", "h100", "b200", "a100", "l40s") if key in name), "h100")


def test_weights_drawn_on_the_gpu_are_the_same_at_every_world_size_and_are_cudas_numbers():
    reference = whole(device="cuda")
    candidates = {"zero3": whole(device="cuda", partition=lambda m, ps: None)}
    candidates |= {f"fsdp2 world {w} tp {tp}": gathered(w, device="cuda", tp=tp) for w, tp in ((1, 1), (2, 1), (3, 1), (4, 2))}
    # FSDP2's CPU offload on a GPU run: the shards on the host, every module drawn on the GPU
    candidates["fsdp2 world 2, cpu offload"] = gathered(2, device="cpu", draw_on="cuda")
    for what, weights in candidates.items():
        assert weights.keys() == reference.keys(), what
        for name, value in reference.items():
            assert torch.equal(weights[name], value), (what, name)
    # the builtin rule, from CUDA's Philox generator: not the CPU's numbers from the same seed (docs: GPU and CPU runs
    # start from different weights), the norms at one on both
    cpu = whole(device="cpu")
    for name in RANDOM:
        assert not torch.equal(cpu[name], reference[name]), name
        assert reference[name].std().item() == pytest.approx(cpu[name].std().item(), rel=0.1), name
    assert torch.equal(reference["norm.weight"], cpu["norm.weight"])


def test_a_rank_draws_an_8b_shaped_model_within_the_plans_time_and_memory():
    """Rank 0 of FSDP2 at world 2, Llama-3-8B cut to 4 blocks (1.92B parameters; the embedding and the head, 128256 x
    4096, are the largest modules): its time within 3x the plan's estimate or a second (the first allocations of its
    blocks, cudaMalloc, are not modelled; drawn on the CPU it would take ~24 s), the GPU memory it allocates within the
    plan's initialisation peak (its fp32 shard and one module's full copy) plus the NaN check's 1-byte mask."""
    from launcher.planning.init_cost import gpu_init_seconds, module_count
    from launcher.planning.memory import estimate
    from tests.support import plan_from

    model = "builtin:llama3-8b?layers=4"
    whole(device="cuda")  # CUDA's context and the kernels loaded: not the figure a run's start already pays
    with sharded(0, 2, model, "cuda") as (module, init):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        mat.materialize(module, "cuda", init, seed=0)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - base
        params = sum(p.numel() for p in module.parameters())
        assert not any(torch.isnan(p.to_local()).any() for p in module.parameters())
    gpu = _plan_gpu()
    planned_s = gpu_init_seconds(params, module_count(4), gpu)
    plan = plan_from({"launch": {"device": "cuda", "gpu": gpu}, "train": {"model": model}, "distributed": {"procs_per_node": 2}})
    planned_peak = estimate(plan, params).init_peak.bytes
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "params": params, "seconds": round(seconds, 4),
                      "planned_seconds": round(planned_s, 4), "s_per_billion": round(seconds / params * 1e9, 4),
                      "peak_bytes": peak, "planned_peak_bytes": int(planned_peak)}))
    assert seconds < max(3 * planned_s, 1.0)
    assert peak <= planned_peak + 128_256 * 4096 + 2**26


def test_the_entrypoint_draws_on_the_gpu_it_trains_on(tmp_path):
    """`python -m launcher.train`'s build (torchrun, NCCL, FSDP2, one process) gives the weights drawn on the GPU."""
    from tests.e2e.test_meta_init import initial_weights

    got = initial_weights(tmp_path, "cuda", 1, **{"distributed.strategy": "fsdp2", "launch.device": "cuda", "compile.enabled": False})
    expected = whole("builtin:llama-debug", device="cuda")
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
