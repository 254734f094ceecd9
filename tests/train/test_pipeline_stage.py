"""Pipeline stages (distributed.pipeline_parallel) cut from the builtin decoder (launcher/train/parallel/pipeline.py), in
one process: the stages, even and uneven splits (distributed.pipeline.layers_per_stage), run one after another compute
what the whole model computes, bit for bit, forward and backward; every parameter keeps its name and lives on exactly
one stage; each rank finds its stage and its data-parallel batches."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from launcher.errors import LauncherError
from launcher.planning.plan import stage_blocks
from launcher.train.models.llama import Llama, parse_builtin
from launcher.train.parallel.distributed import DistEnv, data_rank
from launcher.train.parallel.pipeline import cut_stage, stage_of


def _model(layers: int = 4) -> Llama:
    torch.manual_seed(0)
    return Llama(parse_builtin(f"builtin:llama-debug?layers={layers}"))


@pytest.mark.parametrize("split", [(2, 2), (1, 3), (1, 1, 2)])
def test_stages_in_sequence_compute_the_whole_models_logits_and_gradients(split):
    whole = _model()
    stages = [cut_stage(copy.deepcopy(whole), i, split) for i in range(len(split))]
    tokens = torch.randint(0, whole.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    F.cross_entropy(whole(inputs).flatten(0, 1), targets.flatten()).backward()
    h = inputs
    for stage in stages:
        h = stage(h)
    F.cross_entropy(h.flatten(0, 1), targets.flatten()).backward()

    grads = {name: p.grad for stage in stages for name, p in stage.named_parameters()}
    assert sorted(grads) == sorted(name for name, _ in whole.named_parameters())  # each name once, on one stage
    for name, p in whole.named_parameters():
        assert torch.equal(grads[name], p.grad), name
    assert list(stages[-1].layers.keys()) == [str(i) for i in stage_blocks(split, len(split) - 1)]
    assert stages[0].output is None and stages[-1].tok_embeddings is None and stages[0].pipeline_stage == (0, len(split))


def test_only_the_builtin_decoder_is_cut():
    with pytest.raises(LauncherError, match="PP-MODEL|builtin decoder"):
        cut_stage(torch.nn.Sequential(torch.nn.Linear(2, 2)), 0, (1, 1))


def _env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), backend="gloo")


def test_the_stages_of_one_pipeline_read_the_same_batches():
    # pp 2 x dp 2 (pp outermost): ranks 0, 1 hold stage 0 and ranks 2, 3 stage 1; ranks 0 and 2 read data-parallel shard 0
    assert [stage_of(r, 4, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [data_rank(_env(r, 4), 1, 2) for r in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [data_rank(_env(r, 2), 1, 2) for r in range(2)] == [(0, 1), (0, 1)]
    assert [data_rank(_env(r, 4), 2, 1) for r in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]  # TP as before
