"""Megatron-Core's activation recomputation -> activation_checkpointing.mode (none; full: every block's input kept, the block
recomputed in backward; selective: every other block so).

Megatron-Core's TransformerConfig (megatron/core/transformer/transformer_config.py; Megatron-Bridge 067f987 passes the model
table to it; NeMo 1.x's activations_checkpoint_granularity / _method / _num_layers are the same three):
- recompute_granularity "full": whole layers; "selective": in every layer only recompute_modules (default ["core_attn"]:
  the attention's softmax part; also "mlp", "moe_act", "layernorm", "mla_up_proj", ...); null: nothing recomputed.
- recompute_method "uniform": the layers cut into chunks of recompute_num_layers, each chunk's input kept, every layer
  recomputed; "block": only the first recompute_num_layers layers of each pipeline stage recomputed, the rest keep their
  activations; null with "full": every layer.
"""

from __future__ import annotations

from .draft import Draft

NAMES = {"granularity": ("recompute_granularity", "activations_checkpoint_granularity"),
         "method": ("recompute_method", "activations_checkpoint_method"),
         "num_layers": ("recompute_num_layers", "activations_checkpoint_num_layers"),
         "modules": ("recompute_modules",)}


def read(d: Draft, at, layers: int | None, stages: int) -> None:
    """`at(key)` -> where the key is (None when absent); `layers` the model's, `stages` the pipeline degree the source states."""
    where = {role: next((w for w in (at(n) for n in names) if w), None) for role, names in NAMES.items()}
    granularity = d.get(where["granularity"]) if where["granularity"] else None
    if granularity is None:  # null (a setting left unset) is no leaf: nothing recomputed, fp8launch's default
        for key in (w for w in where.values() if w):
            d.none(key, "no effect without recompute_granularity")
        return
    method = d.get(where["method"]) if where["method"] else None
    count = d.get(where["num_layers"]) if where["num_layers"] else None
    sources = tuple(w for w in where.values() if w)
    if granularity == "selective":
        modules = d.get(where["modules"]) if where["modules"] else None
        modules = modules if isinstance(modules, list) and modules else ["core_attn"]
        d.approximated(sources, ("activation_checkpointing.mode", "selective"), value=granularity,
                       before=f"Megatron's selective recomputation: in every layer only {', '.join(map(str, modules))} recomputed "
                              "in backward" + (" (Megatron-Core's default)" if not where["modules"] else ""),
                       after="every other block recomputed whole, the others keep all their activations",
                       effect="another trade of memory for recompute: fp8launch recomputes whole blocks, not sub-modules; the peak "
                              "memory and the step time differ, the numerics do not")
        return
    if granularity != "full":
        d.none(where["granularity"], "Megatron-Core knows full and selective only")
        return
    per_stage = layers // max(stages, 1) if layers else None
    if method == "block" and isinstance(count, int):
        if count == 0:
            d.mapped(sources, value="block, 0 layers", note="no layer recomputed, fp8launch's default (activation_checkpointing.mode "
                                                            "none)")
            return
        if per_stage and count >= per_stage:
            d.mapped(sources, ("activation_checkpointing.mode", "full"), value=f"block, {count} layers",
                     note=f"all {per_stage} layers of each pipeline stage recomputed, as fp8launch's full")
            return
        share = count / per_stage if per_stage else None
        mode = "full" if share is None or share > 0.75 else "selective" if share >= 0.25 else "none"
        after = {"full": "every block recomputed", "selective": "every other block recomputed", "none": "no block recomputed"}[mode]
        d.approximated(sources, ("activation_checkpointing.mode", mode), value=f"block, {count} layers",
                       before=f"the first {count} layers of each pipeline stage" + (f" (of {per_stage})" if per_stage else "")
                              + " recomputed, the rest keep their activations",
                       after=after + ("" if per_stage else " (the file does not give the layers per stage)"),
                       effect="another share of the blocks recomputed: the peak memory and the step time differ, the numerics do "
                              "not")
        return
    if count in (None, 1) or method is None:
        d.mapped(sources, ("activation_checkpointing.mode", "full"), value="full",
                 note="every layer's input kept, the layer recomputed in backward, as fp8launch's full")
        return
    d.approximated(sources, ("activation_checkpointing.mode", "full"), value=f"{method}, {count} layers",
                   before=f"every layer recomputed, the input of each chunk of {count} layers kept",
                   after="every block recomputed, each block's input kept",
                   effect=f"{count} times as many block inputs held (a little more memory), the same recompute and numerics")
