"""The training loss: mean next-token cross entropy in fp32, compiled with the blocks where the plan compiles. Its own
module because every engine and the loop take it (the pipeline's schedule computes it on the last stage)."""

from __future__ import annotations

import typing
from typing import Callable

import torch
import torch.nn.functional as F

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, computed in fp32 whatever the logits' dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def loss_function(plan: Plan) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss: `cross_entropy`, compiled with the blocks when compile.enabled (torchtitan compiles its
    loss too, compile.components = ["model", "loss"]). Inductor then fuses the fp32 upcast into the log-softmax and
    its backward: the fp32 copy of the logits over the vocabulary (4 bytes x tokens x vocab: 4.2 GB at seq 8192 and
    Llama 3's 128,256) is never written, nor read back."""
    if not plan.compile.enabled:
        return cross_entropy
    return torch.compile(cross_entropy, mode=plan.compile.mode, fullgraph=True)
