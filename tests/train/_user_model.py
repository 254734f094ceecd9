"""The `py:` model factory module the model-building tests write into a spec folder (each under its own module
name): a toy network (embedding, 3 residual Linear blocks, head; vocab_size only as config.vocab_size, as a
Hugging Face model has it) and its factories, good and bad."""

USER_MODEL = """
import torch
from torch import nn

SEEN = {}

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        SEEN["device"] = str(torch.get_default_device())
        self.config = type("Config", (), {"vocab_size": 40})()
        self.emb = nn.Embedding(40, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.head = nn.Linear(16, 40)

    def forward(self, tokens):
        h = self.emb(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)

def build():
    return Tiny()

def load():
    net = Tiny()
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(0.5)
    return net

load.fp8launch_meta_init = False

def needs_args(width):
    return Tiny()

def not_a_model():
    return 42

WIDTH = 3
"""
