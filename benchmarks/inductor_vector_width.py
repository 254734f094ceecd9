"""Inductor's CPU vector width against compiled FP8 weight gradients, on this CPU: what launcher/train/compile_ac.py's
cpu_vector_width (256 bits) guards against.

    python benchmarks/inductor_vector_width.py [--out benchmarks/results/inductor_vector_width.json]

Two torchao tensorwise FP8 Linears in a row (the second one's FP8 input is stored transposed for its weight gradient),
compiled at Inductor's own choice of width and at 256 bits, against eager FP8. Prints, per width, whether every weight
gradient is finite and its relative gap to eager. torch 2.13's Inductor wrote NaN into that tile with AVX-512 on one AMX
Xeon (2026-11-27); an AMD EPYC with AVX-512 and another AMX Xeon (2026-12-07) computed it finite. Which CPUs show it is
a fact about torch and the CPU, not about fp8launch: it is recorded here, not asserted by a test (a test that asserts a
torch bug fails on the CPUs where the bug does not show). tests/train/test_compile_cpu.py holds the 256-bit guarantee.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from torch import nn


class TwoLinears(nn.Module):
    def __init__(self, dim: int = 256):
        super().__init__()
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.wo(self.wq(x))


def weight_grads(simdlen: int | None, compile_: bool) -> dict[str, torch.Tensor]:
    import torch._inductor.config as inductor
    from torchao.float8 import convert_to_float8_training

    torch._dynamo.reset()
    inductor.cpp.simdlen = simdlen
    torch.manual_seed(0)
    model = TwoLinears().to(torch.bfloat16)
    convert_to_float8_training(model)
    fn = torch.compile(model) if compile_ else model
    x = torch.randn(2, 64, 256, dtype=torch.bfloat16)
    fn(x).float().pow(2).mean().backward()
    return {name: p.grad.float() for name, p in model.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/inductor_vector_width.json")
    args = parser.parse_args()
    import torch._inductor.config as inductor
    from torch._inductor.cpu_vec_isa import pick_vec_isa, x86_isa_checker

    inductor.cpp.simdlen = None
    own = pick_vec_isa().bit_width()
    eager = weight_grads(None, False)
    rows = []
    for label, width in ((f"Inductor's own ({own} bits)", None), ("held at 256 bits", 256)):
        grads = weight_grads(width, True)
        rows.append({"width": label, "bits": own if width is None else width,
                     "finite": all(bool(torch.isfinite(g).all()) for g in grads.values()),
                     "gap_to_eager": {n: float((grads[n] - eager[n]).norm() / eager[n].norm()) for n in grads}})
    print(f"{'width':<28} {'finite':>7} {'wq gap':>10} {'wo gap':>10}")
    for r in rows:
        print(f"{r['width']:<28} {str(r['finite']):>7} {r['gap_to_eager']['wq.weight']:>10.3g} {r['gap_to_eager']['wo.weight']:>10.3g}")
    record = {"benchmark": "inductor_vector_width", "torch": torch.__version__, "python": platform.python_version(),
              "cpu_isa": sorted(x86_isa_checker()), "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
