"""Expert parallelism for MoE models, in torchtitan's manner (distributed.expert_parallel).

    mesh, dense = ep_mesh(env, layout)               # ("efsdp", "ep"), EP ranks adjacent; dense: both flattened
    apply_expert_parallel(model, mesh["ep"])          # this module: after the precision backend
    fully_shard(experts, mesh=mesh["efsdp"])          # FSDP2 of the experts over world / ep ranks,
    experts.set_gradient_divide_factor(world_size)    #   their gradients averaged as the dense ones
    fully_shard(block, mesh=dense) ...               # FSDP2 of the dense parameters over all ranks

Every GroupedExperts module (torchtitan's interface: `forward(x (T, dim), num_tokens_per_expert (E,))`,
3D weights w1 / w2 / w3 with the experts on dim 0) is distributed over the EP group with
`torch.distributed.tensor.distribute_module`:
  - its weights become DTensors Shard(0) on "ep": EP rank j holds experts [j * E/ep, (j+1) * E/ep);
  - input_fn (dispatch): the ranks exchange their per-expert token counts (all_to_all_single), then the
    tokens themselves (all_to_all_single with those splits: each rank sends the rows routed to the
    experts another rank holds), and the received rows, which arrive rank-major, are regrouped
    expert-major -- the module then sees (T', dim) and its local counts (E/ep,), as a module of E/ep
    experts would. fp8launch's GroupedExperts pads each group itself (its `align`: 32 rows for MXFP8's
    grouped GEMMs); for another GroupedExperts the groups are padded here with zero rows to ALIGN;
  - output_fn (combine): the padding rows are dropped, the rank-major order is restored and the rows go
    back to the ranks they came from (the reverse all-to-all): every token is where the model put it.

Gradients: the all-to-all's backward is the reverse all-to-all, so each expert's local gradient sums the
contributions of the tokens of every rank in its EP group; FSDP2 then reduces over the world / ep ranks
that hold the same experts. Dividing that sum by the world size (not FSDP2's default, its group size)
gives each expert the gradient of the mean loss over the global batch, as for every dense parameter and
as one process training the same global batch would (torchtitan sets the same divide factor).
"""

from __future__ import annotations

import typing

import torch
from torch import nn

from launcher.errors import EnvironmentProblem, LauncherError

if typing.TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from launcher.planning.layout import Layout
    from launcher.train.parallel.distributed import DistEnv

__all__ = ["ALIGN", "ep_mesh", "experts_modules", "apply_expert_parallel", "expert_parallel_degree", "ep_report",
           "dispatch_tokens", "combine_tokens", "check_divides"]

ALIGN = 32
"""Rows per expert group are padded to a multiple of this: MXFP8 grouped GEMMs scale blocks of 32 rows
(torchao's moe_training pads to 16 for FP8 rowwise, 32 for MXFP8); bf16 does not mind."""


def experts_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every grouped-experts module: a GroupedExperts (fp8launch's builtin MoE, or a
    py: model's class of that name, torchtitan's interface) with 3D weights w1 / w2 / w3."""
    out = []
    for name, m in model.named_modules():
        if any(c.__name__ == "GroupedExperts" for c in type(m).__mro__):  # FSDP2 subclasses it (FSDPGroupedExperts)
            if all(isinstance(getattr(m, w, None), torch.Tensor) and getattr(m, w).dim() == 3 for w in ("w1", "w2", "w3")):
                out.append((name, m))
    return out


def num_experts(module: nn.Module) -> int:
    """The module's total number of experts (global: a DTensor weight's global shape)."""
    return int(module.w1.shape[0])


def check_divides(model: nn.Module, ep: int) -> list[tuple[str, nn.Module]]:
    """The grouped-experts modules, after checking that `ep` experts-parallel ranks can share them."""
    found = experts_modules(model)
    if not found:
        raise LauncherError(
            f"distributed.expert_parallel = {ep} but the model has no grouped experts (a GroupedExperts module with 3D "
            "w1 / w2 / w3); fix: set distributed.expert_parallel = 1 for a dense model, or train an MoE model "
            "(builtin:moe-debug)", rule="EP-DENSE-MODEL")
    for name, m in found:
        if num_experts(m) % ep:
            raise LauncherError(
                f"distributed.expert_parallel = {ep} does not divide the {num_experts(m)} experts of {name}; "
                "fix: set distributed.expert_parallel to a divisor of the number of experts",
                rule="EP-DIVIDES-EXPERTS")
    return found


def ep_mesh(env: DistEnv, layout: Layout) -> tuple[DeviceMesh, DeviceMesh]:
    """(the 2D mesh ("efsdp", "ep") of the job's `layout`, shape (world / ep, ep), its two dimensions flattened: "dp_shard").
    The ranks of one EP group are adjacent (rank = efsdp_rank * ep + ep_rank, inside one node when ep
    divides procs_per_node); "dp_shard" is every rank: the mesh FSDP2 shards the dense parameters over."""
    from torch.distributed.device_mesh import init_device_mesh

    ep = layout.ep
    if env.world_size % ep:
        raise EnvironmentProblem(
            f"distributed.expert_parallel = {ep} does not divide the world size {env.world_size}; "
            "fix: set distributed.expert_parallel to a divisor of distributed.nodes x procs_per_node",
            rule="EP-DIVIDES-WORLD")
    mesh = init_device_mesh(env.device.type, (layout.expert_shards, ep),
                            mesh_dim_names=("efsdp", "ep"))
    return mesh, mesh["efsdp", "ep"]._flatten("dp_shard")


# -- the token exchange ---------------------------------------------------------------------------

class _Routing(typing.NamedTuple):
    input_splits: list[int]
    """rows this rank sends to each EP rank"""
    output_splits: list[int]
    """rows this rank receives from each EP rank"""
    gather: torch.Tensor
    """(T',) for each row the experts see: its row in the received (rank-major) rows, or the zero row"""
    place: torch.Tensor
    """(R,) for each received row: where it sits among the rows the experts see"""


def _group(mesh: DeviceMesh):
    return mesh.get_group()


def _routing(counts: torch.Tensor, ep: int, align: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From received counts (ep, e): per-expert padded counts (e,), gather (T',) and place (R,) indices
    (int64, on the device of `counts`). Received rows are rank-major: (rank 0: expert 0, expert 1, ...),
    (rank 1: ...), ...; the experts see them expert-major: expert j's rows from rank 0, rank 1, ..., then
    its padding (the zero row, index R). Tensor ops only, as torchtitan's generate_permute_indices: a
    Python walk over the rows cost tens of thousands of iterations per layer per step."""
    counts = counts.to(torch.int64).reshape(ep, counts.shape[1])
    flat = counts.reshape(-1)
    sizes = counts.sum(dim=0)
    padded = (sizes + align - 1) // align * align
    if align > 1:
        padded = padded.clamp_min(align)  # an empty group still gets `align` rows (as torchtitan's); align 1 adds none
    # each (rank, expert) block keeps its rows in order and moves as a whole: from its rank-major start to
    # its expert's group start plus the rows lower ranks sent that expert
    src = flat.cumsum(0) - flat
    dst = ((padded.cumsum(0) - padded) + (counts.cumsum(0) - counts)).reshape(-1)
    total = int(flat.sum())
    rows = torch.arange(total, dtype=torch.int64, device=counts.device)
    place = rows + torch.repeat_interleave(dst - src, flat, output_size=total)
    gather = torch.full((int(padded.sum()),), total, dtype=torch.int64, device=counts.device)
    gather.scatter_(0, place, rows)  # on CPU ~3x faster than gather[place] = rows (index_put_)
    return padded, gather, place


def dispatch_tokens(x: torch.Tensor, num_tokens_per_expert: torch.Tensor, mesh: DeviceMesh, align: int = ALIGN
                    ) -> tuple[torch.Tensor, torch.Tensor, _Routing]:
    """Send the rows of `x` (sorted by expert, `num_tokens_per_expert` (E,) of them each) to the EP ranks
    holding their experts. Returns the rows for this rank's E/ep experts, grouped by expert and padded
    (T', dim), their counts (E/ep,) padding included, and what `combine_tokens` needs."""
    from torch.distributed._functional_collectives import all_to_all_single, wait_tensor

    ep = mesh.size()
    group = _group(mesh)
    with torch.no_grad():
        counts = num_tokens_per_expert.to(torch.int64)
        # [r, j]: rank r's rows for my expert j
        received = wait_tensor(all_to_all_single(counts, None, None, group=group)).view(ep, -1).cpu()
        input_splits = counts.view(ep, -1).sum(dim=1).tolist()
        output_splits = received.sum(dim=1).tolist()
        local_counts, gather, place = _routing(received, ep, align)
    rows = all_to_all_single(x.contiguous(), output_splits, input_splits, group=group)
    device = x.device
    gather, place = gather.to(device), place.to(device)
    padded = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])[gather]
    return padded, local_counts.to(num_tokens_per_expert.device, num_tokens_per_expert.dtype), _Routing(
        input_splits, output_splits, gather, place)


def combine_tokens(out: torch.Tensor, routing: _Routing, mesh: DeviceMesh) -> torch.Tensor:
    """The reverse of `dispatch_tokens`: the experts' output rows back in the order and on the ranks the
    input rows came from (padding dropped)."""
    from torch.distributed._functional_collectives import all_to_all_single

    rows = out[routing.place]
    return all_to_all_single(rows.contiguous(), routing.input_splits, routing.output_splits, group=_group(mesh))


class ExpertParallel:
    """torchtitan's ExpertParallel style for one GroupedExperts module: weights Shard(0) on the EP mesh,
    the token all-to-all around its forward. Holds the routing of the forward in flight (activation
    checkpointing reruns forward, which recomputes it the same way)."""

    def __init__(self, align: int = ALIGN):
        self.align = align
        self.routing: _Routing | None = None

    def partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        from torch.distributed.tensor import Shard, distribute_tensor

        for pname, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)]), requires_grad=p.requires_grad))

    def dispatch(self, module: nn.Module, inputs, mesh: DeviceMesh):
        x, counts = inputs[0], inputs[1]
        rows, local, self.routing = dispatch_tokens(x, counts, mesh, self.align)
        return (rows, local, *inputs[2:])

    def combine(self, module: nn.Module, out, mesh: DeviceMesh):
        routing, self.routing = self.routing, None
        return combine_tokens(out, routing, mesh)


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh) -> list[tuple[str, nn.Module]]:
    """Distribute every grouped-experts module of `model` over the 1D EP `mesh`, in place (before
    fully_shard). Returns the (name, module) pairs. The model's experts must read their weights as local
    tensors (`w.to_local()` where they are DTensors), as torchtitan's GroupedExperts does."""
    from torch.distributed.tensor import distribute_module

    ep = mesh.size()
    found = check_divides(model, ep)
    for _, module in found:
        # fp8launch's GroupedExperts pads its groups itself (its `align`, set by the precision step): no padding here
        style = ExpertParallel(1 if hasattr(module, "align") else ALIGN)
        distribute_module(module, mesh, partition_fn=style.partition, input_fn=style.dispatch, output_fn=style.combine)
        module._fp8launch_ep = style
    return found


# -- what took effect -----------------------------------------------------------------------------

def expert_parallel_degree(model: nn.Module) -> int:
    """The EP degree as built, read from the experts' weights: total experts / experts this rank holds
    (the size of the "ep" dimension their DTensor shards the expert dimension over); 1 without."""
    from torch.distributed.tensor import DTensor, Shard

    degrees = set()
    for _, m in experts_modules(model):
        w = m.w1
        if not isinstance(w, DTensor) or "ep" not in (w.device_mesh.mesh_dim_names or ()):
            degrees.add(1)
            continue
        i = w.device_mesh.mesh_dim_names.index("ep")
        local = w.shape[0] // w.device_mesh.size(i) if w.placements[i] == Shard(0) else w.shape[0]
        degrees.add(w.shape[0] // max(local, 1))
    return min(degrees) if degrees else 1


def ep_report(model: nn.Module, ep: int) -> dict | None:
    """For the start record: the degree, the grouped-experts modules and experts per rank; None without EP."""
    if ep <= 1:
        return None
    found = experts_modules(model)
    total = num_experts(found[0][1]) if found else 0
    degree = expert_parallel_degree(model)
    from launcher.train.fqn import clean_fqn

    return {"expert_parallel": degree, "mesh": ["efsdp", "ep"], "experts": total, "local_experts": total // max(degree, 1),
            "expert_groups": [clean_fqn(n) for n, _ in found]}


def ep_line(report: dict) -> str:
    return (f"expert parallel: {report['expert_parallel']} ranks share the {report['experts']} experts of "
            f"{len(report['expert_groups'])} MoE layers ({report['local_experts']} per rank, tokens exchanged by all-to-all)")


def shard_experts(experts: list[tuple[str, nn.Module]], mesh: DeviceMesh, world_size: int, **fully_shard_kwargs) -> None:
    """FSDP2 for the (already expert-parallel) grouped experts over the "efsdp" `mesh` (the world / ep
    ranks holding the same experts), each its own unit, gradients divided by the world size (the module
    docstring says why)."""
    from torch.distributed.fsdp import fully_shard

    for _, module in experts:
        fully_shard(module, mesh=mesh, **fully_shard_kwargs)
        module.set_gradient_divide_factor(float(world_size))
