"""The hand-written baseline fp8launch is measured against: what an expert writes with plain torch + torchao, no launcher.

A Llama-3 decoder (RMSNorm, rotate-half rotary embeddings, grouped-query attention through
F.scaled_dot_product_attention, SwiGLU, an untied output layer named `output`; torchtitan's module names), built on
the meta device, then as torchtitan builds its trainer: torchao's `convert_to_float8_training` with torchtitan's
Float8 filter (the lm_head "output" excluded, `auto_filter_small_kn` = torchao's `_auto_filter_for_recipe`) ->
activation checkpointing per block -> `torch.compile` per block -> FSDP2 (`fully_shard` on the embedding, each block,
[norm, output] and the root; bf16 parameters, fp32 gradient reduction) -> weights initialised on each rank's shards ->
AdamW (fused on CUDA, torchtitan's default implementation) with linear warm-up then cosine decay to min-lr-ratio x lr.
Each step: fp32 cross entropy on the logits (compiled with the blocks, as torchtitan compiles its loss), gradient
clipping, the optimizer step. The data is fp8launch's `synthetic` stream (a seeded cyclic pattern of 256 token ids
plus 10% noise), re-implemented here.

It imports nothing from fp8launch (tests/test_gpu_session.py checks that, and that its batches and lr schedule equal
fp8launch's). benchmarks/reference_args.py turns a spec into the flags that give the same shape, batch, seed and
schedule.

One GPU (the 15-layer Llama-3-8B shape of benchmarks/specs/llama3-8b-ac-*.toml):
    torchrun --standalone --nproc-per-node 1 benchmarks/reference_loop.py --precision fp8 --dim 4096 --layers 15 \\
        --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --seq-len 8192 --batch 1 --ac full --steps 10 --out ref.json
    # or: python benchmarks/reference_loop.py ...   (one process)
One node, 8 GPUs: torchrun --standalone --nproc-per-node 8 benchmarks/reference_loop.py ...
On the CPU (gloo, no compile unless --compile):
    torchrun --standalone --nproc-per-node 2 benchmarks/reference_loop.py --device cpu --precision fp8 --dim 256 \\
        --layers 2 --heads 8 --kv-heads 4 --ffn 768 --vocab 2048 --seq-len 64 --no-auto-filter --steps 4 --out ref.json

Writes (rank 0) --out: tokens/s (global; median over the steps after --warmup), step times, losses, lrs, gradient
norms, peak memory, the FP8 layers, torch/torchao versions, the device and the command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02


# -- the model ----------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


def rope(seq_len: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of the rotary angles, (seq_len, head_dim) fp32, both halves alike (rotate-half form)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a: argparse.Namespace):
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a.dim, a.heads, a.kv_heads)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a.dim, a.ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a: argparse.Namespace):
        super().__init__()
        self.head_dim, self.rope_theta, self.n_layers = a.dim // a.heads, a.rope_theta, a.layers
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(TransformerBlock(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        cos, sin = rope(tokens.shape[1], self.head_dim, self.rope_theta, tokens.device)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, 0.02); the residual projections wo and w2 0.02 / sqrt(2 * layers); norms at one (fp8launch's builtin
        Llama draws the same distributions)."""
        for name, module in self.named_modules():
            last = name.rsplit(".", 1)[-1]
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = INIT_STD / math.sqrt(2 * self.n_layers) if last in ("wo", "w2") else INIT_STD
                nn.init.normal_(module.weight, std=std)


# -- data and schedule (fp8launch's `synthetic` stream and lr schedule, written out again) --------------------------


class SyntheticBatches:
    """A fixed cycle of min(vocab, 256) distinct token ids (drawn with `seed`, the same on every rank); each row starts
    at a random point of it and each token is replaced by a uniformly random id with probability 0.1. Batch i of rank
    r comes from a generator seeded with (seed, r, i). Yields int64 (batch, seq_len + 1)."""

    PATTERN_LEN = 256
    NOISE = 0.1

    def __init__(self, *, seq_len: int, batch: int, vocab: int, rank: int, seed: int):
        self.shape, self.vocab, self.rank, self.seed = (batch, seq_len + 1), vocab, rank, seed % (1 << 64)
        self.pattern = np.random.default_rng([self.seed, 0x5EED]).permutation(vocab)[: min(vocab, self.PATTERN_LEN)]
        self.index = 0

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, self.rank, self.index])
        starts = rng.integers(0, len(self.pattern), size=(self.shape[0], 1))
        tokens = self.pattern[(starts + np.arange(self.shape[1])) % len(self.pattern)]
        noisy = rng.random(self.shape) < self.NOISE
        tokens = np.where(noisy, rng.integers(0, self.vocab, size=self.shape), tokens)
        self.index += 1
        return torch.from_numpy(tokens.astype(np.int64))


def lr_factor(step: int, *, warmup_steps: int, steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): (step + 1) / (warmup + 1) while warming up, then
    cosine from 1 to min_lr_ratio at `steps`."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min((step - warmup_steps) / max(steps - warmup_steps, 1), 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# -- building -----------------------------------------------------------------------------------------------------


def fp8_filter(a: argparse.Namespace):
    """torchtitan's Float8 module filter: FQNs containing any of --filter-fqns are left alone; with auto_filter_small_kn
    (--auto-filter) torchao's size heuristic for the recipe, else only "every dim a multiple of 16"."""
    fqns = [f for f in a.filter_fqns.split(",") if f]
    if a.auto_filter:
        from torchao.float8 import _auto_filter_for_recipe

        return _auto_filter_for_recipe(a.recipe, filter_fqns=fqns)

    def multiples_of_16(module: nn.Module, fqn: str) -> bool:
        return (isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0
                and not any(f in fqn for f in fqns))

    return multiples_of_16


def build(a: argparse.Namespace, device: torch.device, mesh) -> tuple[nn.Module, list[str]]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model = Transformer(a)
    fp8_names: list[str] = []
    if a.precision == "fp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear

        if a.recipe == "rowwise":  # torchtitan sets it for rowwise (pytorch/pytorch#150859)
            import torch._inductor.config as inductor_config

            inductor_config.emulate_precision_casts = True
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(a.recipe), module_filter_fn=fp8_filter(a))
        fp8_names = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
        if not fp8_names:
            raise SystemExit("reference_loop: --precision fp8 converted no Linear layer (the filter kept them all); "
                             "fix: --no-auto-filter for small shapes, or check --filter-fqns")
    for i, block in enumerate(list(model.layers)):
        if a.ac == "full":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            block = checkpoint_wrapper(block, preserve_rng_state=False)
        if a.compile:
            block.compile(fullgraph=True)
        model.layers[i] = block
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp)
    for i, block in enumerate(model.layers):
        # the last block is all-gathered again at once by backward: keep it (torchtitan)
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
    fully_shard([model.norm, model.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    torch.manual_seed(a.seed)
    model.init_weights()
    return model, fp8_names


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in fp32, whatever the logits' dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def forward_backward(model: nn.Module, loss_fn, tokens: torch.Tensor) -> torch.Tensor:
    """The step's forward, loss and backward; returns the loss. The logits go straight into the loss: no name holds
    them through backward, so the head's output over the vocabulary (bf16 at seq 8192 and Llama 3's 128,256: 2 GiB)
    is freed once the loss has read it, as fp8launch's Trainer does (launcher/train/loop.py, `_loss_of`)."""
    loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torchtitan's: the total norm over every rank's shards, then the gradients scaled to at most max_norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, error_if_nonfinite=False, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


# -- the run ------------------------------------------------------------------------------------------------------


def init_distributed(device_type: str) -> tuple[int, int]:
    """Join torchrun's process group, or make a one-process one (FSDP2 needs a group)."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def command_line(world: int) -> str:
    script = " ".join(shlex.quote(x) for x in [os.path.relpath(sys.argv[0])] + sys.argv[1:])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return f"torchrun --standalone --nproc-per-node {world} {script}"
    return f"python {script}"


def versions() -> dict:
    import torchao

    return {"torch": torch.__version__, "torchao": torchao.__version__, "python": platform.python_version(),
            "cuda": torch.version.cuda}


def run(a: argparse.Namespace) -> dict | None:
    device = torch.device(a.device)
    if device.type == "cuda":  # before the process group: NCCL binds each rank to its device
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if device.type == "cpu":
        # The CPU dry run only: torch hands same-dtype FP8 GEMMs to oneDNN's reference kernel on AMX CPUs (~1,000x
        # slower, docs/precision.md); with oneDNN off its own emulated kernel runs them, as fp8launch's CPU runs do.
        torch.backends.mkldnn.enabled = False
    rank, world = init_distributed(device.type)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world,))
    model, fp8_names = build(a, device, mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=a.lr, betas=tuple(a.betas), eps=a.eps, weight_decay=a.weight_decay,
                                  fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps=a.warmup_steps, steps=a.steps, min_lr_ratio=a.min_lr_ratio))
    # torchtitan compiles the loss with the model (compile.components = ["model", "loss"]): the fp32 upcast is fused
    # into the log-softmax, so fp32 logits over the vocabulary are never written
    loss_fn = torch.compile(cross_entropy, fullgraph=True) if a.compile else cross_entropy
    data = SyntheticBatches(seq_len=a.seq_len, batch=a.batch, vocab=a.vocab, rank=rank, seed=a.seed)
    tokens_per_step = a.batch * a.seq_len * world
    total_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    if rank == 0:
        print(f"reference loop: {a.precision} ({len(fp8_names)} of {total_linear} Linear layers in FP8), {world} x "
              f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, compile {a.compile}, AC {a.ac}, "
              f"{tokens_per_step} tokens/step", flush=True)
    times, losses, lrs, norms = [], [], [], []
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        lr = scheduler.get_last_lr()[0]
        tokens = next(data).to(device, non_blocking=True)
        loss = forward_backward(model, loss_fn, tokens)
        norm = clip_grad_norm(params, a.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        stats = torch.stack([loss.detach().float(), norm.detach().float()])
        dist.all_reduce(stats)  # the loss every rank logs: the mean over ranks (the norm is the same on every rank)
        loss_value, norm_value = stats[0].item() / world, stats[1].item() / world
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(loss_value)
        lrs.append(lr)
        norms.append(norm_value)
        if rank == 0:
            print(f"step {step}/{a.steps} | loss {loss_value:.4f} | lr {lr:.2e} | {tokens_per_step / dt:,.0f} tok/s | "
                  f"{dt:.3f} s/step | mem {peak_memory_gib(device):.2f} GiB", flush=True)
    steady = times[a.warmup:] if len(times) > a.warmup else times[-1:]
    median_step = statistics.median(steady)
    if rank != 0:
        return None
    return {
        "tool": "benchmarks/reference_loop.py",
        "precision": a.precision,
        "recipe": a.recipe if a.precision == "fp8" else None,
        "shape": {"dim": a.dim, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads, "ffn": a.ffn, "vocab": a.vocab,
                  "norm_eps": a.norm_eps, "rope_theta": a.rope_theta},
        "seq_len": a.seq_len, "micro_batch_size": a.batch, "world_size": world, "tokens_per_step": tokens_per_step,
        "steps": a.steps, "warmup_steps_excluded": a.warmup,
        "tokens_per_s": tokens_per_step / median_step, "step_time_s": median_step,
        "step_times_s": times, "losses": losses, "lrs": lrs, "grad_norms": norms,
        "peak_mem_gib": peak_memory_gib(device),
        "parameters": sum(p.numel() for p in model.parameters()),  # DTensor.numel(): the whole parameter's
        "fp8_layers": len(fp8_names), "total_linear": total_linear, "fp8_layer_names": fp8_names,
        "filter": {"filter_fqns": [f for f in a.filter_fqns.split(",") if f], "auto_filter_small_kn": a.auto_filter},
        "compile": "blocks and loss" if a.compile else False, "activation_checkpointing": a.ac,
        "optimizer": f"AdamW ({'fused' if device.type == 'cuda' else 'foreach'}), lr {a.lr:g}, betas {tuple(a.betas)}, "
                     f"eps {a.eps:g}, weight_decay {a.weight_decay:g}; warmup {a.warmup_steps}, cosine to {a.min_lr_ratio:g} x lr "
                     f"at step {a.steps}; clip {a.max_grad_norm:g}",
        "seed": a.seed,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": versions(),
        "command": command_line(world),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", choices=("bf16", "fp8"), required=True)
    p.add_argument("--recipe", choices=("tensorwise", "rowwise"), default="tensorwise", help="torchao Float8 recipe (fp8)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    shape = p.add_argument_group("model shape (Llama-3 8B's by default)")
    shape.add_argument("--dim", type=int, default=4096)
    shape.add_argument("--layers", type=int, default=32)
    shape.add_argument("--heads", type=int, default=32)
    shape.add_argument("--kv-heads", type=int, default=8)
    shape.add_argument("--ffn", type=int, default=14336)
    shape.add_argument("--vocab", type=int, default=128256)
    shape.add_argument("--norm-eps", type=float, default=1e-5)
    shape.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the tokens/s median (compile, allocator)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=0, help="lr warm-up steps")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ac", choices=("none", "full"), default="none", help="activation checkpointing of every block")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each block (default: on CUDA yes, on the CPU no)")
    p.add_argument("--filter-fqns", default="output", help="comma-separated FQN parts never converted to FP8 (torchtitan: output)")
    p.add_argument("--auto-filter", action=argparse.BooleanOptionalAction, default=True,
                   help="torchtitan's auto_filter_small_kn: torchao's size heuristic for the recipe")
    p.add_argument("--out", help="write the result JSON here (rank 0)")
    a = p.parse_args(argv)
    if a.compile is None:
        a.compile = a.device == "cuda"
    if a.dim % a.heads or a.heads % a.kv_heads or (a.dim // a.heads) % 2:
        p.error(f"--dim {a.dim}, --heads {a.heads}, --kv-heads {a.kv_heads}: dim must split into heads of even width, "
                "and heads into kv-heads groups")
    if a.steps < 1:
        p.error("--steps must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    result = run(a)
    if result is not None and a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"wrote {a.out}: {result['tokens_per_s']:,.0f} tokens/s (median of steps {a.warmup + 1}..{a.steps}), "
              f"peak {result['peak_mem_gib']:.2f} GiB", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
