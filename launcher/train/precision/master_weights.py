"""precision.master_weights = "bf16": the parameters themselves become the bf16 master weights (no fp32 copy), before
the engine wraps the model; launcher/train/optim_lowbit.py's optimizers round each update into them stochastically."""

from __future__ import annotations

import torch

from .module_dtype import dtype_of


def cast_master_weights(model: torch.nn.Module) -> int:
    """precision.master_weights = "bf16": every floating-point parameter becomes bf16, except those of Linears a
    `[[precision.rules]]` mode gives a dtype of their own. A plain Parameter is cast in place (`.data`, the same
    object); a tensor-subclass parameter (torchao's float8 all-gather wrapper keeps its weight in `_tensor`, which a
    `.data` assignment would leave in fp32) is replaced by a bf16 one of its class, in every module that holds it
    (tied weights stay tied). Call it after the precision backend converted the model and before the engine wraps it
    and the optimizer exists (meta parameters too: their storage is then made in bf16). Returns how many were cast."""
    replaced: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        if dtype_of(module) is not None:
            continue
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_floating_point() or (p.dtype == torch.bfloat16 and id(p) not in replaced):
                continue
            if id(p) not in replaced:
                if type(p) is torch.nn.Parameter:
                    p.data = p.data.to(torch.bfloat16)
                    replaced[id(p)] = p
                else:
                    replaced[id(p)] = torch.nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
            module._parameters[name] = replaced[id(p)]
    return len(replaced)
