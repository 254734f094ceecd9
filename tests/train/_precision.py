"""Shared by the precision tests: a plan built from the schema's defaults, and a tiny
Llama-shaped model (torchtitan module names) whose Linear shapes the tests choose."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from launcher.planning.plan import Plan
from tests.support import plan_from


def make_plan(**sections) -> Plan:
    """A Plan from the schema defaults plus `sections`, e.g. make_plan(precision={"mode": "fp8"})."""
    return plan_from({"launch": {"device": "cpu"}, **sections})


def fp8_plan(torchao=None, strategy="ddp", **precision) -> Plan:
    p = {"mode": "fp8", "backend": "torchao", **precision}
    if torchao is not None:
        p["torchao"] = torchao
    return make_plan(precision=p, distributed={"strategy": strategy, "procs_per_node": 1})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (w(x).view(b, s, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, n_heads: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    """tok_embeddings, layers.N.{attention.wq/wk/wv/wo, feed_forward.w1/w2/w3}, norm, output."""

    def __init__(self, dim=64, n_layers=2, hidden=192, vocab=256, n_heads=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.vocab_size = vocab
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, hidden, n_heads) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.02)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
