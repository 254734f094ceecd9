"""torch._scaled_mm on this CPU: torch's own routing against fp8launch's (launcher/train/precision/cpu_scaled_mm.py),
same process, alternating, one thread.

    python benchmarks/cpu_scaled_mm.py [--out benchmarks/results/cpu_scaled_mm.json]

torch 2.13 hands same-dtype FP8 GEMMs to oneDNN where the CPU has AMX-INT8 (mixed e5m2 x e4m3 ones where it has
AMX-FP16), and oneDNN runs them in its reference kernel; fp8launch's CPU runs take torch's emulated kernel instead.
Prints the median milliseconds per GEMM of each, their ratio, and whether the results are bit-identical, for the
GEMM shapes of builtin:llama-debug (dim 256, 32 tokens x 2 ranks) and one larger; then one torchao tensorwise
forward + backward of a two-Linear MLP. On a CPU without AMX both rows take the same kernel (ratio ~1).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from launcher.train.precision import cpu_scaled_mm

SHAPES = [(32, 256, 256), (64, 256, 768), (128, 512, 512)]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(f for f in flags if f.startswith(("amx", "avx512_fp16", "avx512_bf16")))


def _timed(fn, repeats: int) -> dict:
    """fn timed with torch's kernel and with fp8launch's, alternating; fn returns a tensor."""
    torch_ms, ours_ms = [], []
    for _ in range(3):
        cpu_scaled_mm.uninstall()
        torch_ms.append(_median_ms(fn, repeats))
        want = fn()
        cpu_scaled_mm.install()
        ours_ms.append(_median_ms(fn, repeats))
        got = fn()
    t, o = statistics.median(torch_ms), statistics.median(ours_ms)
    return {"torch_ms": round(t, 3), "fp8launch_ms": round(o, 3), "speedup": round(t / o, 1), "bit_identical": bool(torch.equal(want, got))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/cpu_scaled_mm.json")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for (m, k, n), (da, db) in [(s, d) for s in SHAPES for d in ((E4M3, E4M3), (E5M2, E4M3))]:
        a, b = torch.randn(m, k).to(da), torch.randn(n, k).to(db).t()
        sa, sb = torch.tensor(0.5), torch.tensor(2.0)
        result = _timed(lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), args.repeats)
        rows.append({"what": f"_scaled_mm {m}x{k}x{n} {str(da)[-6:]} x {str(db)[-6:]} tensorwise", **result})

    from torchao.float8 import convert_to_float8_training

    mlp = torch.nn.Sequential(torch.nn.Linear(256, 768, bias=False), torch.nn.Linear(768, 256, bias=False))
    convert_to_float8_training(mlp)
    x = torch.randn(64, 256)

    def step():
        mlp.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = mlp(x)
        y.float().square().mean().backward()
        return mlp[0].weight.grad.clone()

    rows.append({"what": "torchao tensorwise MLP 64x256 -> 768 -> 256, forward + backward", **_timed(step, args.repeats)})
    cpu_scaled_mm.install()
    record = {"benchmark": "cpu_scaled_mm", "torch": torch.__version__, "python": platform.python_version(),
              "cpu": platform.processor() or platform.machine(), "cpu_flags": _cpu_flags(), "threads": 1,
              "what": "median ms per call over 3 alternating rounds of `repeats` calls: torch's CPU routing vs fp8launch's", "rows": rows}
    print(f"CPU flags: {' '.join(record['cpu_flags']) or '(no AMX / AVX512-FP16)'}")
    print(f"| {'what':<62} | torch ms | fp8launch ms | speedup | bit-identical |")
    print(f"|{'-' * 64}|---------:|-------------:|--------:|:-------------:|")
    for r in rows:
        print(f"| {r['what']:<62} | {r['torch_ms']:>8.2f} | {r['fp8launch_ms']:>12.2f} | {r['speedup']:>6.1f}x "
              f"| {str(r['bit_identical']):^13} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
