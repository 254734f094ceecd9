"""What recording and checking a checkpoint's files costs (launcher/targets/checkpoint_record.py), on this CPU.

1. Each checksum the standard library offers, through record.digest's own read loop, over one file of --mb MB
   already in the page cache (as a save finds the files it just wrote): GB/s and seconds per GB on one core, and
   what a 70B-parameter checkpoint (~1 TB with AdamW's moments) costs at that rate, on one core and split over
   64 ranks as a resume splits it. "read only" is the same loop without a checksum (the I/O part). xxh3_64
   (the xxhash package, when importable) is not a dependency: shown for scale.
2. A real save and resume of a model of --params parameters (a stack of Linear layers, AdamW state: ~12 bytes a
   parameter on disk) in a world of one: CheckpointManager.save (with the record), record.describe of its files
   alone (what the record adds to a save), choose_resume (the check) and load, each the median of --repeats.

    .venv/bin/python benchmarks/checkpoint_record.py [--mb 512] [--params 25e6] [--repeats 5] [--out PATH]

Prints a table; writes JSON to benchmarks/results/checkpoint_record.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.targets import checkpoint_record as record  # noqa: E402 - after the path

TB = 1e12
RANKS = 64


class _Nothing:
    def update(self, data) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def algorithms() -> dict[str, object]:
    found = dict(record.ALGORITHMS)
    found["read only"] = _Nothing
    try:
        import xxhash

        found["xxh3_64 (not a dependency)"] = xxhash.xxh3_64
    except ImportError:
        pass
    return found


def checksum_speeds(folder: str, mb: int, repeats: int) -> list[dict]:
    path = os.path.join(folder, "blob")
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    size = os.path.getsize(path)
    rows = []
    for name, make in algorithms().items():
        added = name not in record.ALGORITHMS
        record.ALGORITHMS[name] = make  # digest reads the table: the same loop for every one
        try:
            record.digest(path, name)  # warm: the file in the page cache, the code paths loaded
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                record.digest(path, name)
                times.append(time.perf_counter() - t0)
        finally:
            if added:
                del record.ALGORITHMS[name]
        best = min(times)
        gbps = size / best / 1e9
        rows.append({"checksum": name, "bytes": size, "best_s": round(best, 4), "median_s": round(statistics.median(times), 4),
                     "gb_per_s": round(gbps, 3), "s_per_gb": round(1 / gbps, 3),
                     "one_tb_one_core_s": round(TB / 1e9 / gbps), f"one_tb_{RANKS}_ranks_s": round(TB / 1e9 / gbps / RANKS, 1)})
    os.unlink(path)
    return rows


def save_and_resume(folder: str, params: float, repeats: int) -> dict:
    import torch
    from torch import nn

    from launcher.train.checkpoint import CheckpointManager
    from tests.train._engine_setup import gloo_world

    width = 2048
    layers = max(1, round(params / (width * width)))
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    times: dict[str, list[float]] = {"save": [], "describe": [], "check": [], "load": []}
    with gloo_world():
        m = CheckpointManager(os.path.join(folder, "run"), keep=1, strategy="ddp")
        for i in range(repeats):
            t0 = time.perf_counter()
            path = m.save(i + 1, model=model, optimizer=optimizer)
            times["save"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            record.describe(path, record.listing(path))
            times["describe"].append(time.perf_counter() - t0)
            m._checked = None
            t0 = time.perf_counter()
            chosen = m.choose_resume("auto")
            times["check"].append(time.perf_counter() - t0)
            assert chosen.path == path and not chosen.skipped
            t0 = time.perf_counter()
            m.load(path, model=model, optimizer=optimizer)
            times["load"].append(time.perf_counter() - t0)
        files = record.candidate(path).files
    size = sum(f["bytes"] for f in files.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"parameters": layers * width * width, "checkpoint_bytes": size, "files": len(files),
            "median_s": {k: round(v, 4) for k, v in med.items()}, "samples_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
            "record_share_of_save": round(med["describe"] / med["save"], 3),
            "check_share_of_resume": round(med["check"] / (med["check"] + med["load"]), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="size of the file the checksums read")
    parser.add_argument("--params", type=float, default=25e6, help="parameters of the model saved and resumed")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "checkpoint_record.json"))
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="fp8launch-ckpt-bench-")
    try:
        speeds = checksum_speeds(folder, args.mb, args.repeats)
        resume = save_and_resume(folder, args.params, args.repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"{'checksum':<28} {'GB/s':>7} {'s per GB':>9} {'1 TB, 1 core':>13} {f'1 TB, {RANKS} ranks':>15}")
    for r in speeds:
        print(f"{r['checksum']:<28} {r['gb_per_s']:>7.2f} {r['s_per_gb']:>9.3f} {r['one_tb_one_core_s']:>11} s "
              f"{r[f'one_tb_{RANKS}_ranks_s']:>13.1f} s")
    med = resume["median_s"]
    print(f"\nsave and resume, world of one: {resume['parameters'] / 1e6:.0f}M parameters, {resume['checkpoint_bytes'] / 1e6:.0f} MB "
          f"in {resume['files']} files (median of {args.repeats})")
    print(f"  save (record included) {med['save']:.3f} s, of which describing the files {med['describe']:.3f} s "
          f"({resume['record_share_of_save']:.0%})")
    print(f"  resume: check {med['check']:.3f} s + load {med['load']:.3f} s (the check {resume['check_share_of_resume']:.0%})")
    result = {"checksums": speeds, "save_and_resume": resume, "file_mb": args.mb, "repeats": args.repeats,
              "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version()}}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
