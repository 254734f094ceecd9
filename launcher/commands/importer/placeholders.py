"""Placeholders that never decide: the world size and the model a source leaves to its launcher or its script are
chosen to hold what the source states, so that no degree of the source is lowered to fit a placeholder.

- the world size: the least that holds every degree the source states (tensor x pipeline x context x expert parallel,
  and the data-parallel degree where the source states one), at least the count the importer proposed (8, or
  DeepSpeed's count that keeps train_batch_size whole) and, where the source fixes its global batch, a world that
  keeps it whole where one does;
- the model: the builtin nearest the source's in size and kind (planable.py asks the rules themselves, through
  `model_candidates`, for the nearest one whose heads, layers and experts hold the source's degrees).
"""

from __future__ import annotations

import math

from launcher.planning.memory import model_params
from launcher.planning.models import MOE_SIZES, SIZES, builtin_config, is_moe

from . import probe
from .draft import Draft

WORLD = "distributed.procs_per_node"
MODEL = "train.model"
MAX_WORLD = 4096


def degrees(d: Draft) -> dict[str, int]:
    """The source's parallel degrees as the spec holds them after reading it (before any rule moved them)."""
    return {k: max(1, int(d.value(f"distributed.{k}", 1) or 1))
            for k in ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")}


layout = probe.layout


def size_world(d: Draft) -> None:
    """Where the world size is a placeholder: the least world holding the source's degrees (see the module)."""
    if WORLD not in d.placeholders:
        return
    g = degrees(d)
    model_split = g["tensor_parallel"] * g["pipeline_parallel"] * g["context_parallel"]
    need = math.lcm(model_split * (d.dp_stated or 1), g["expert_parallel"])
    proposed = d.world_procs
    b = d.batch

    def keeps_batch(world: int) -> bool:
        return b.global_ is None or b.global_ % ((b.micro or 1) * (world // model_split)) == 0

    if d.dp_stated:
        world = need
    else:
        first = need * max(1, math.ceil(proposed / need))
        world = next((w for w in range(first, 8 * first + 1, need) if keeps_batch(w)), first)
    stated = " x ".join([f"{k.split('_')[0]} {v}" for k, v in g.items() if v > 1] + ([f"dp {d.dp_stated}"] if d.dp_stated else []))
    held = f": the least that holds the source's degrees ({stated})" if stated and world != proposed else ""
    set_world(d, world, held)


def set_world(d: Draft, world: int, why: str) -> None:
    """The placeholder world size `world`, and its entry's line saying why (`why`, after the count)."""
    nodes, procs = layout(world)
    d.set("distributed.nodes", nodes)
    d.set(WORLD, procs)
    entry = d.world_entry
    entry.sets = ([("distributed.nodes", nodes)] if nodes > 1 else []) + [(WORLD, procs)]
    default = " (fp8launch's default)" if world == 8 and not why else ""
    entry.note = (f"{d.world_why}; {nodes} node{'s' if nodes > 1 else ''} x {procs} processes{default}{why}; "
                  f"{WORLD} = {procs}{' (x ' + str(nodes) + ' nodes)' if nodes > 1 else ''} is a PLACEHOLDER")


def world_candidates(d: Draft) -> list[int]:
    """Larger placeholder worlds, nearest first: the same degrees, more data-parallel ranks (for a model state that does
    not fit); none where the world is the source's or the source states its data-parallel degree."""
    if WORLD not in d.placeholders or d.dp_stated:
        return []
    world = d.value("distributed.nodes", 1) * d.value(WORLD, 8)
    return [world * 2 ** i for i in range(1, 10) if world * 2 ** i <= MAX_WORLD]


DENSE = tuple(f"builtin:{n}" for n in SIZES)
MOE = tuple(f"builtin:{n}" for n in MOE_SIZES)


MODEL_RULES = frozenset({"TP-HEADS", "PP-LAYERS", "EP-DIVIDES-EXPERTS", "EP-DENSE-MODEL"})
"""The rules a builtin model's shape decides against a degree the source states (its heads, blocks, experts): while the
model is a placeholder, these move the model, never the degree."""


def model_candidates(d: Draft) -> list[str]:
    """Placeholder models other than the spec's, nearest its size first, of its kind (dense or MoE); each first with its
    blocks and experts rounded up to hold the source's stages and expert-parallel degree ("?layers=N", "?experts=N": the
    builtin's own options) where they do not, then as it is."""
    if MODEL not in d.placeholders:
        return []
    current = str(d.value(MODEL, ""))
    cfg = builtin_config(current)
    if cfg is None:
        return []
    size = model_params(current) or 1
    pool = MOE if is_moe(cfg) else DENSE
    ordered = sorted(pool, key=lambda m: abs(math.log(model_params(m) / size)))
    g = degrees(d)
    stages = g["pipeline_parallel"] * max(1, int(d.value("distributed.pipeline.stages_per_rank", 0) or 1))
    out = []
    for m in ordered:
        shape = builtin_config(m)
        held = {"layers": _up(shape.n_layers, stages)}
        if is_moe(shape):
            held["experts"] = _up(shape.num_experts, g["expert_parallel"])
        query = "&".join(f"{k}={n}" for k, n in held.items() if n != getattr(shape, "n_layers" if k == "layers" else "num_experts"))
        if query:
            out.append(f"{m}?{query}")
        out.append(m)
    return [m for m in out if m != current]


def _up(n: int, degree: int) -> int:
    """`n` rounded up to a multiple of `degree` (blocks for the pipeline's stages, experts for the expert-parallel ranks)."""
    return degree * math.ceil(n / degree) if degree > 1 else n
