"""A Mixture-of-Experts decoder after torchtitan's (0.3.0 models/common/moe.py and its 0.1/0.2
predecessors): our Llama attention blocks (llama.Attention, RMSNorm, rotary) whose feed-forward is
an `MoE`:

    MoE.forward(x (B, S, dim))
      router = TokenChoiceTopKRouter: gate nn.Linear(dim, E) in fp32 -> softmax/sigmoid scores
               (+ expert_bias for the choice only) -> top-k experts per token
      reorder: tokens sorted by expert (stable argsort), T*K rows
      self.experts(routed_input (T*K, dim), num_tokens_per_expert (E,)) -> (T*K, dim)
      combine: rows times their routing score, scatter-added back to their token
      + shared_experts(x) (a dense SwiGLU) when configured

`GroupedExperts` holds w1 (E, hidden, dim), w2 (E, dim, hidden), w3 (E, hidden, dim) and runs the
SwiGLU experts with `torch._grouped_mm` over contiguous token groups (torch 2.13 has CPU kernels for
it, fp32 and bf16). The expert-parallel wrapper (launcher/train/parallel/expert_parallel.py) wraps exactly
that module: it replaces the rows and counts by the all-to-all's (E_local groups) and calls the same
forward. Low-precision grouped GEMMs need each group's row count to be a multiple of
`GroupedExperts.align` (16 for FP8 rowwise, 32 for MXFP8: torchao's TOKEN_GROUP_ALIGN_SIZE_M /
torchtitan's pad_multiple); the precision step sets it, and forward pads every group to it with zero
rows and drops those rows again (`pad_token_groups` / `unpad_token_groups`, torch-native: torchao's
`permute_and_pad` is a Triton kernel).

Load balancing: DeepSeek-V3's auxiliary-loss-free bias (arXiv 2408.15664), torchtitan's default
(load_balance_coeff 1e-3). Forward counts the tokens each expert got (`tokens_per_expert`); after
each optimizer step `update_expert_bias(model)` moves `expert_bias` by coeff * sign(mean - count)
(re-centred), then clears the counts. It adds no loss term, so the loss the run reports is the
language-model loss alone and FP8 vs bf16 losses compare directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from launcher.planning.models import MOE_SIZES, MoEConfig, param_count, parse_builtin

from .llama import INIT_STD, Attention, FeedForward, Llama, RMSNorm, residual_std

__all__ = [
    "MOE_SIZES", "MoEConfig", "MoETransformer", "MoE", "GroupedExperts", "GroupedSwiGLU", "TokenChoiceTopKRouter", "MoEBlock",
    "param_count", "build_moe", "pad_token_groups", "unpad_token_groups", "update_expert_bias", "moe_layers",
]


def pad_token_groups(x: torch.Tensor, counts: torch.Tensor, align: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of `x` grouped by expert (group e: counts[e] consecutive rows) -> (padded rows, padded
    counts, destination index). Every group is padded with zero rows to a multiple of `align`; the
    result has the static worst-case length round_up(T + E * (align - 1), align) (no host sync) and
    the rows after the last real group are counted to the last group (zeros: SwiGLU without bias maps
    them to zeros and they add nothing to any gradient). `unpad_token_groups(y, index)` inverts it."""
    t, e = x.shape[0], counts.numel()
    counts = counts.to(torch.int64)
    padded = (counts + align - 1) // align * align
    total = -(-(t + e * (align - 1)) // align) * align
    starts_in = torch.cumsum(counts, 0) - counts
    starts_out = torch.cumsum(padded, 0) - padded
    group = torch.repeat_interleave(torch.arange(e, device=x.device), counts, output_size=t)
    index = torch.arange(t, device=x.device) - starts_in[group] + starts_out[group]
    out = x.new_zeros(total, x.shape[1]).index_copy(0, index, x)
    padded = padded.clone()
    padded[-1] += total - padded.sum()
    return out, padded, index


def unpad_token_groups(y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows `pad_token_groups` placed at `index`, in their original order."""
    return y.index_select(0, index)


def _is_low_precision(w: torch.Tensor) -> bool:
    """torchao's MoE-training weight wrapper (launcher/train/precision/torchao_moe.py converts to it),
    recognised by class name so that the model imports no precision code."""
    w = getattr(w, "_local_tensor", w)
    return any(c.__name__ == "TrainingWeightWrapperBaseTensor" for c in type(w).__mro__)


class GroupedSwiGLU(nn.Module):
    """The experts' three grouped GEMMs: silu(a W1^T) * (a W3^T), then W2^T, each group of rows (ends at
    `offsets`) through its own expert. A module of its own, holding nothing, so that torch.compile can compile
    exactly this (launcher/train/compile_ac.py) while the token exchange around it stays eager."""

    def forward(self, a: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, offsets: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
        a = a.to(dtype)
        h = F.silu(torch._grouped_mm(a, w1.to(dtype).transpose(-2, -1), offs=offsets))
        h = h * torch._grouped_mm(a, w3.to(dtype).transpose(-2, -1), offs=offsets)
        return torch._grouped_mm(h, w2.to(dtype).transpose(-2, -1), offs=offsets)


class GroupedExperts(nn.Module):
    """E SwiGLU experts as three 3D weights; `forward(x (T, dim), num_tokens_per_expert (E_local,)
    int) -> (T, dim)` with x's rows sorted by expert (group e: num_tokens_per_expert[e] rows)."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.swiglu = GroupedSwiGLU()
        self.align = 1
        """Row multiple each token group is padded to (set by the precision step: 16 FP8, 32 MXFP8)."""
        self.top_k = 1
        """Experts each token runs through (set by MoE): the precision report's FLOP share reads it."""

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = self.w1, self.w2, self.w3
        if isinstance(w1, DTensor):  # FSDP2 / EP shards: grouped_mm takes plain tensors. Not hasattr(w1, "to_local"):
            # dynamo answers that False for a DTensor over torchao's weight wrapper, and _grouped_mm then meets a DTensor
            w1, w2, w3 = w1.to_local(), w2.to_local(), w3.to_local()
        in_dtype, index = x.dtype, None
        if self.align > 1:
            x, num_tokens_per_expert, index = pad_token_groups(x, num_tokens_per_expert, self.align)
        offsets = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        dtype = x.dtype
        if _is_low_precision(w1):
            dtype = torch.bfloat16  # torchao's FP8/MXFP8 grouped GEMMs take bf16 operands
        elif torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        if not torch.compiler.is_compiling():
            # The rows vary from step to step under expert parallelism: one graph for every count (torchtitan marks
            # them dynamic too). It also keeps Inductor's C++ loop split off the emulated MXFP8 kernels' static
            # shapes, where it asserts (torch 2.13, CPU).
            torch._dynamo.maybe_mark_dynamic(x, 0)
        out = self.swiglu(x, w1, w2, w3, offsets, dtype)
        if index is not None:
            out = unpad_token_groups(out, index)
        return out.to(in_dtype)


class TokenChoiceTopKRouter(nn.Module):
    """gate: nn.Linear(dim, E), always computed in fp32 -> scores (softmax over experts, or sigmoid)
    -> the top_k experts of each token (chosen on scores + expert_bias; weighted by the scores)."""

    def __init__(self, dim: int, num_experts: int, top_k: int, score_func: str = "softmax", route_norm: bool = False,
                 route_scale: float = 1.0):
        super().__init__()
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func {score_func!r} is not softmax or sigmoid")
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.num_experts, self.top_k = num_experts, top_k
        self.score_func, self.route_norm, self.route_scale = score_func, route_norm, route_scale

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, dim) -> (top_scores (T, K) fp32, selected_experts (T, K) int64, num_tokens_per_expert (E,) int64)."""
        with torch.autocast(x.device.type, enabled=False):
            scores = F.linear(x.float(), self.gate.weight.float())
        scores = torch.sigmoid(scores) if self.score_func == "sigmoid" else F.softmax(scores, dim=-1)
        choice = scores if expert_bias is None else scores + expert_bias
        _, selected = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)
        top_scores = scores.gather(-1, selected)
        if self.route_norm:
            top_scores = top_scores / (top_scores.sum(dim=-1, keepdim=True) + 1e-20)
        top_scores = top_scores * self.route_scale
        flat = selected.reshape(-1)
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        return top_scores, selected, counts


class MoE(nn.Module):
    """Router, token reordering, `experts` (GroupedExperts) and optional `shared_experts`."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.router = TokenChoiceTopKRouter(cfg.dim, cfg.num_experts, cfg.top_k, cfg.score_func, cfg.route_norm, cfg.route_scale)
        self.experts = GroupedExperts(cfg.dim, cfg.moe_ffn_dim, cfg.num_experts)
        self.experts.top_k = cfg.top_k
        self.shared_experts = FeedForward(cfg.dim, cfg.moe_ffn_dim * cfg.n_shared_experts) if cfg.n_shared_experts else None
        self.load_balance_coeff = cfg.load_balance_coeff
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts) if cfg.load_balance_coeff else None, persistent=True)
        # Not in checkpoints: a count that starts at zero in every process, a resumed one too. Built with storage
        # (also under torch.device("meta")) so that materialization keeps its zeros; a resumed run initialises nothing.
        self.register_buffer("tokens_per_expert", torch.zeros(cfg.num_experts, device="cpu"), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, slen, dim = x.shape
        x = x.reshape(-1, dim)
        top_scores, selected, num_tokens_per_expert = self.router(x, self.expert_bias)
        if self.training:
            # Activation checkpointing recomputes this forward and counts twice: harmless, the
            # update only reads sign(mean - count).
            with torch.no_grad():
                self.tokens_per_expert.add_(num_tokens_per_expert.to(self.tokens_per_expert.dtype))
        order = torch.argsort(selected.reshape(-1), stable=True)
        scores_sorted = top_scores.reshape(-1)[order]
        token_of_row = order // self.top_k
        routed_output = self.experts(x[token_of_row], num_tokens_per_expert)
        routed_output = (routed_output.float() * scores_sorted.unsqueeze(-1)).to(routed_output.dtype)
        out = torch.zeros_like(x, dtype=routed_output.dtype).scatter_add(0, token_of_row.unsqueeze(-1).expand(-1, dim), routed_output)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.reshape(bs, slen, dim)


class MoEBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + moe(norm(.)) (or feed_forward for a dense block)."""

    def __init__(self, cfg: MoEConfig, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe_enabled = layer_id >= cfg.n_dense_layers
        if self.moe_enabled:
            self.moe = MoE(cfg)
        else:
            self.feed_forward = FeedForward(cfg.dim, cfg.dense_ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        ffn = self.moe if self.moe_enabled else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class MoETransformer(Llama):
    """Token ids (batch, seq) int64 -> logits (batch, seq, vocab_size); Llama's structure, names and init
    (tok_embeddings, layers.N.attention.wq, ..., norm, output) with MoE blocks: layers.N.moe.{router.gate,
    experts, shared_experts.w1/w2/w3} (layers.N.feed_forward for the dense first blocks)."""

    @staticmethod
    def check_config(cfg: MoEConfig) -> None:
        if cfg.n_heads % cfg.kv_heads or cfg.head_dim % 2 or not 1 <= cfg.top_k <= cfg.num_experts:
            raise ValueError(f"inconsistent MoEConfig: n_heads {cfg.n_heads}, n_kv_heads {cfg.kv_heads}, "
                             f"top_k {cfg.top_k} of {cfg.num_experts}")

    @staticmethod
    def block(cfg: MoEConfig, layer_id: int) -> nn.Module:
        return MoEBlock(cfg, layer_id)

    @torch.no_grad()
    def init_module(self, name: str, module: nn.Module) -> None:
        """Initialise what `module` holds itself: as Llama.init_module, plus the grouped experts
        (w1, w3 N(0, 0.02); w2 residual-scaled), the router gate N(0, 0.02) and the MoE's buffers
        (zeros)."""
        if isinstance(module, GroupedExperts) or name.rsplit(".", 1)[-1] == "experts" and hasattr(module, "w2"):
            nn.init.normal_(module.w1, std=INIT_STD)
            nn.init.normal_(module.w3, std=INIT_STD)
            nn.init.normal_(module.w2, std=residual_std(self.config))
            return
        if isinstance(module, MoE) or hasattr(module, "tokens_per_expert"):
            for buf in module._buffers.values():
                if buf is not None:
                    buf.zero_()
            return
        super().init_module(name, module)  # embeddings, attention, norms, router gate (N(0, 0.02)), shared experts, output


def moe_layers(model: nn.Module) -> list[MoE]:
    """The MoE modules of `model`, in order (none for a dense model)."""
    return [m for m in model.modules() if isinstance(m, MoE)]


@torch.no_grad()
def update_expert_bias(model: nn.Module, group=None) -> None:
    """After an optimizer step (torchtitan: an optimizer step pre-hook): expert_bias +=
    coeff * sign(mean(count) - count), re-centred to mean zero; then the counts restart. With a
    process `group`, the counts are summed over it first so every rank moves the same bias."""
    layers = [m for m in moe_layers(model) if m.expert_bias is not None]
    if not layers:
        return
    counts = torch.vstack([m.tokens_per_expert for m in layers])
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(counts, group=group)
    for m, c in zip(layers, counts):
        delta = m.load_balance_coeff * torch.sign(c.mean() - c)
        m.expert_bias.add_(delta - delta.mean())
        m.tokens_per_expert.zero_()


def build_moe(spec: str) -> MoETransformer:
    """'builtin:NAME[?layers=N&experts=E&top_k=K]' for an MoE shape -> a freshly initialised model."""
    return MoETransformer(parse_builtin(spec))
