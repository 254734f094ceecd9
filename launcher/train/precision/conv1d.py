"""transformers' `Conv1D` (GPT, GPT-2 and the models built on it) is a Linear with a transposed
weight: `y = x @ W + b` with W of shape (in, out). No FP8 backend knows it, so before a backend
is applied each one is replaced by the equivalent `nn.Linear` (weight W.T, the same bias): the
same outputs, and the layer then counts and converts like any other Linear.

Layers that multiply by a 2-D weight but are neither nn.Linear nor Conv1D are named by
`foreign_matmuls`, so that FP8-NOT-APPLIED can say which module types were left alone.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

KNOWN_NON_MATMUL = (nn.Embedding, nn.EmbeddingBag, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._BatchNorm)


def is_conv1d(module: nn.Module) -> bool:
    """A transformers.pytorch_utils.Conv1D (looked up only when transformers is already imported)."""
    pytorch_utils = sys.modules.get("transformers.pytorch_utils")
    return pytorch_utils is not None and isinstance(module, pytorch_utils.Conv1D)


def as_linear(conv: nn.Module) -> nn.Linear:
    """The nn.Linear that computes what `conv` does, on the same device and dtype, sharing nothing."""
    weight = conv.weight
    linear = nn.Linear(conv.nx, conv.nf, bias=conv.bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight.t())
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    linear.weight.requires_grad_(weight.requires_grad)
    if conv.bias is not None:
        linear.bias.requires_grad_(conv.bias.requires_grad)
    linear.train(conv.training)
    return linear


def linearize(model: nn.Module) -> list[str]:
    """Replace every Conv1D in `model` by its nn.Linear, in place; return their FQNs."""
    replaced = []
    for fqn, module in list(model.named_modules()):
        if not is_conv1d(module):
            continue
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, as_linear(module))
        replaced.append(fqn)
    return replaced


def foreign_matmuls(model: nn.Module) -> list[str]:
    """Type names of modules holding their own 2-D `weight` that are not nn.Linear (nor embeddings
    or norms): the layers an FP8 backend leaves in high precision because it does not know them."""
    names = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is None or weight.dim() != 2 or isinstance(module, (nn.Linear, *KNOWN_NON_MATMUL)):
            continue
        names[type(module).__qualname__] = None
    return list(names)
