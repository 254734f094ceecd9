"""The spread of the quantities that tests bound, over seeds: what each bound in tests/ is set from
(benchmarks/results/test_bounds.md, with the commands that gave its figures).

Each case trains what its test trains, with train.seed varied (the seed draws the weights and the
synthetic data, so the data order varies with it), and prints one JSON line per seed with every loss;
`summary` computes each test's statistics from the lines.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/test_bounds.py te-fp8-weights --strategy fsdp2 --seeds 0-5 [--set KEY=JSON]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/test_bounds.py levels-ddp --seeds 0-4
    PYTHONPATH=$PWD .venv/bin/python benchmarks/test_bounds.py summary benchmarks/results/test_bounds.jsonl

Another CPU's kernels, on an AVX-512/AMX machine: ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 (oneDNN's and
ATen's AVX2 code: the bf16 GEMMs round differently) with a TORCHINDUCTOR_CACHE_DIR of their own: Inductor's FX graph
cache does not key on ATEN_CPU_CAPABILITY: the code generated for AVX-512 (16 floats a vector) is reused under AVX2
(8 a vector) and computes wrong values (torchao's compiled FP8 Adam step: 76% of its second moments zero, 5% fresh)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def isa() -> str:
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "native") + "/" + os.environ.get("ATEN_CPU_CAPABILITY", "native")


def overrides(pairs: list[str]) -> dict:
    """--set KEY=JSON pairs as spec keys."""
    return {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in pairs)}


def break_fused_adam(how: str) -> None:
    """The stand-in FusedAdam broken on purpose, to see what the bound catches: "frozen" never writes the stepped
    master copy back into the FP8 weights; "no-master" steps each FP8 weight's own FP8 value (the master copy is
    reset to it before every step: the updates below FP8's resolution are lost, as without fp8_params' master)."""
    import torch

    from tests.train import test_te_standin as standin

    step = standin.FusedAdam.step

    def broken(self, closure=None):
        fp8 = [(p, self._local(p)) for g in self.param_groups for p in g["params"]
               if isinstance(self._local(p), standin.Float8Tensor) and self.state.get(p)]
        saved = [(local, local._data.clone(), local._scale_inv.clone()) for _, local in fp8]
        if how == "no-master":
            for p, local in fp8:
                self._local(self.state[p]["master_param"]).copy_(local.dequantize(dtype=torch.float32))
        step(self, closure)
        if how == "frozen":
            for local, data, scale_inv in saved:
                local._data.copy_(data)
                local._scale_inv.copy_(scale_inv)

    standin.FusedAdam.step = broken


def te_fp8_weights(args) -> None:
    """tests/train/test_te_features.py::test_fp8_weights_train_with_an_fp32_master_copy: the FP8-weight run and its
    high-precision-weight twin, in this process with the stand-in TE."""
    from launcher.train.precision import te as te_backend
    from tests.train.test_te_features import train
    from tests.train.test_te_resume import losses
    from tests.train.test_te_standin import fake_te

    te, te_recipe, _ = fake_te()
    te_backend._te = lambda: (te, te_recipe)
    if args.broken:
        break_fused_adam(args.broken)
    keys = {"precision.te.recipe": "current", "distributed.strategy": args.strategy, "train.steps": 12, "train.lr": 1e-2,
            **overrides(args.set)}
    for seed in seeds(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            got = list(losses(train(Path(tmp), "fp8w", **keys, **{"train.seed": seed, "precision.te.fp8_params": True})[0]).values())
            twin = list(losses(train(Path(tmp), "hp-weights", **keys, **{"train.seed": seed})[0]).values())
        print(json.dumps({"case": "te-fp8-weights", "strategy": args.strategy, "seed": seed, "isa": isa(), "set": overrides(args.set),
                          "broken": args.broken,
                          "seconds": round(time.monotonic() - t0, 1), "fp8_weights": got, "hp_weights": twin}), flush=True)


def e2e_runs() -> dict[str, dict[str, dict]]:
    """The slow tests' runs, per case: {run name: spec keys} (what each test trains; no checkpoints)."""
    from tests.e2e import test_levels, test_moe
    from tests.e2e import test_pipeline as pp
    from tests.e2e import test_tensor_parallel as tp
    from tests.e2e.helpers import FP8

    parity = dict(distributed__strategy="fsdp2", distributed__procs_per_node=1, train__steps=24, train__micro_batch_size=4,
                  train__lr=1e-3, train__warmup_steps=4, train__checkpoint_at_end=False)
    moe = {**test_moe.COMMON, "train__checkpoint_at_end": False}
    tp_common = {**tp.COMMON, "train__steps": tp.STEPS, "train__checkpoint_at_end": False}
    pp_common = {**pp.COMMON, "train__steps": pp.STEPS, "train__checkpoint_at_end": False}
    return {
        "levels-ddp": {"base": {**test_levels.DDP, "precision__grad_reduce": "bf16"},
                       "low": {**test_levels.DDP, "precision__optimizer_states": "fp8", "precision__grad_reduce": "fp8"}},
        "runs-parity": {"bf16": {**parity, "precision__mode": "bf16"},
                        "tensorwise": {**parity, **FP8},
                        "mxfp8": {**parity, **FP8, "precision.torchao.recipe": "mxfp8"}},
        "moe": {"mxfp8": {**moe, **test_moe.MXFP8}, "bf16": {**moe, **test_moe.BF16}},
        "tp": {"tp2-fp8": {**tp_common, **tp.TP2, **FP8}, "tp2-bf16": {**tp_common, **tp.TP2, **tp.BF16},
               "one-bf16": {**tp_common, "distributed__procs_per_node": 1, **tp.BF16},
               "2d-fp8": {**tp_common, **tp.TWO_D, **tp.FP8_2D}, "2d-bf16": {**tp_common, **tp.TWO_D, **tp.BF16}},
        "pp": {"one-bf16": {**pp_common, **pp.ONE, **pp.BF16, "train__steps": 3},
               "pp2-bf16": {**pp_common, **pp.PP2, **pp.BF16, "train__steps": 3},
               "one-fp8": {**pp_common, **pp.ONE, **FP8}, "pp2-fp8": {**pp_common, **pp.PP2, **FP8},
               "dp2-fp8": {**pp_common, **pp.DP2, **FP8}, "pp2dp2-fp8": {**pp_common, **pp.PP2_DP2, **FP8},
               "one-bf16-20": {**pp_common, **pp.ONE, **pp.BF16}, "pp2-bf16-20": {**pp_common, **pp.PP2, **pp.BF16}},
        "pp-tp": {"one-bf16": {**pp_common, **pp.ONE, **pp.BF16, "train__steps": 3},
                  "pp2tp2-bf16": {**pp_common, **pp.PP2_TP2, **pp.BF16, "train__steps": 3}},
        "pp-tp-fp8": {"one-fp8": {**pp_common, **pp.ONE, **FP8, "train__steps": 3},
                      "pp2tp2-fp8": {**pp_common, **pp.PP2_TP2, **FP8, "train__steps": 3}},
        "pp-moe": {"one-moe-bf16": {**pp_common, **pp.ONE, **pp.BF16, **pp.MOE},
                   "pp2-moe-bf16": {**pp_common, **pp.PP2, **pp.BF16, **pp.MOE}},
        "pp-mx": {"one-mxfp8": {**pp_common, **pp.ONE, **pp.MXFP8, "train__steps": 3},
                  "pp2-mxfp8": {**pp_common, **pp.PP2, **pp.MXFP8, "train__steps": 3}},
        "pp-eval": {"one-bf16": {**pp_common, **pp.ONE, **pp.BF16, **pp.EVAL, "train__steps": 3},
                    "pp2-bf16": {**pp_common, **pp.PP2, **pp.BF16, **pp.EVAL, "train__steps": 3}},
        "pp-resume": {"pp2-fp8": {**pp_common, **pp.PP2, **FP8, "train__checkpoint_every": 10},
                      "pp1-from-pp2": {**pp_common, **pp.ONE, **FP8, "train__resume": "runs/pp2-fp8/checkpoints/step-10"}},
        "tp-resume": {"2d-fp8": {**tp_common, **tp.TWO_D, **tp.FP8_2D, "train__checkpoint_every": 10},
                      "2d-to-dp2": {**tp_common, **tp.FP8_2D, "distributed__procs_per_node": 2, "distributed__tensor_parallel": 1,
                                    "train__resume": "runs/2d-fp8/checkpoints/step-10"},
                      "2d-to-tp2": {**tp_common, **tp.TP2, **tp.FP8_2D, "train__resume": "runs/2d-fp8/checkpoints/step-10"}},
    }


def e2e(args) -> None:
    """A slow test's real `fp8launch run`s (torchrun, gloo) per seed: every run's losses, evaluations and bytes."""
    from tests.e2e.helpers import output_of, records, run, write_spec

    extra = {k.replace(".", "__"): v for k, v in overrides(args.set).items()}
    names = e2e_runs()[args.case]
    for seed in seeds(args.seeds):
        out = {"case": args.case, "seed": seed, "isa": isa(), "set": extra}
        with tempfile.TemporaryDirectory() as tmp:
            for name, keys in names.items():
                keys = {k.replace(".", "__"): v for k, v in keys.items()}
                spec = write_spec(Path(tmp), name, **{**keys, "train__seed": seed, **extra})
                r, seconds = run(Path(tmp), "run", str(spec), timeout=1800)
                assert r.returncode == 0, output_of(r)
                folder = Path(tmp) / "runs" / name
                recs = records(folder)
                lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
                out[name] = {"losses": recs.losses, "grad_norms": [x["grad_norm"] for x in recs.steps], "seconds": round(seconds, 1),
                             "optimizer_state_bytes": recs.steps[-1].get("optimizer_state_bytes"),
                             "grad_comm_bytes": recs.steps[-1].get("grad_comm_bytes"),
                             "evals": [[e["step"], e["eval_loss"]] for e in lines if e["event"] == "eval"]}
        print(json.dumps(out), flush=True)


def torchao_step(args) -> None:
    """tests/train/test_precision_torchao.py: one FP8 (tensorwise) forward/backward of TinyLlama against bf16 autocast
    (the loss gap), and 6 FP8 steps on one batch (the drop), with the model and batch seeds varied."""
    import copy

    import torch

    from launcher.train.precision import apply_precision
    from tests.train._fp8_twin import train_losses
    from tests.train._precision import TinyLlama, fp8_plan, lm_loss

    cpu = torch.device("cpu")
    for seed in seeds(args.seeds):
        ref = TinyLlama(seed=seed)
        model = copy.deepcopy(ref)
        prec = apply_precision(model, fp8_plan(torchao={"recipe": "tensorwise", "skip_small": False}), cpu)
        tokens = torch.randint(0, 256, (4, 65), generator=torch.Generator().manual_seed(seed))
        with prec.autocast():
            loss = lm_loss(model, tokens).item()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref_loss = lm_loss(ref, tokens).item()
        model = TinyLlama(seed=seed)
        prec = apply_precision(model, fp8_plan(torchao={"skip_small": False}), cpu)
        tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(seed))
        losses = train_losses(model, prec, tokens, 6)  # the training test's own loop (lr 3e-3)
        print(json.dumps({"case": "torchao-step", "seed": seed, "isa": isa(), "fp8_loss": loss, "bf16_loss": ref_loss,
                          "losses": losses}), flush=True)


def moe_steps(args) -> None:
    """tests/train/test_moe.py::test_four_steps_of_moe_debug_in_bf16_and_mxfp8_end_within_5_percent with the seed varied."""
    from tests.train.test_moe import _losses

    mxfp8 = {"precision.mode": "fp8", "precision.backend": "torchao", "precision.torchao.recipe": "mxfp8"}
    for seed in seeds(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            bf16 = _losses(Path(tmp), "bf16", **{"precision.mode": "bf16", "train.seed": seed})[0]
            mx = _losses(Path(tmp), "mxfp8", **mxfp8, **{"train.seed": seed})[0]
        print(json.dumps({"case": "moe-steps", "seed": seed, "isa": isa(), "bf16": bf16, "mxfp8": mx}), flush=True)


def debug_learns(args) -> None:
    """tests/train/test_models.py::test_debug_learns_synthetic_data_in_30_adamw_steps with the seed varied."""
    from tests.train.test_models import debug_losses

    for seed in seeds(args.seeds):
        losses = debug_losses(seed)
        print(json.dumps({"case": "debug-learns", "seed": seed, "isa": isa(), "losses": losses}), flush=True)


def _rel(a: list[float], b: list[float]) -> float:
    """(mean of a - mean of b) / mean of b."""
    return (sum(a) / len(a) - sum(b) / len(b)) / (sum(b) / len(b))


def statistics_of(r: dict) -> dict[str, float]:
    """The statistics the tests bound, of one JSON line."""
    case = r["case"]
    if case == "te-fp8-weights":
        a, b = r["fp8_weights"], r["hp_weights"]
        return {"twin gap (mean loss)": _rel(a, b), "learns (tail-3 / first)": sum(a[-3:]) / 3 / a[0]}
    if case == "levels-ddp":
        a, b = r["low"]["losses"], r["base"]["losses"]
        return {"gap (mean loss)": _rel(a, b), "gap (final loss)": (a[-1] - b[-1]) / b[-1]}
    if case == "moe":
        a, b = r["mxfp8"]["losses"], r["bf16"]["losses"]
        return {"gap (mean loss)": _rel(a, b), "gap (final loss)": (a[-1] - b[-1]) / b[-1],
                "learns (tail-3 / first)": max(sum(x[-3:]) / 3 / x[0] for x in (a, b))}
    if case == "runs-parity":
        b = r["bf16"]["losses"]
        out = {}
        for k in ("tensorwise", "mxfp8"):
            a = r[k]["losses"]
            out |= {f"{k} gap (tail-3)": _rel(a[-3:], b[-3:]), f"{k} gap (mean loss)": _rel(a, b),
                    f"{k} gap (first loss)": (a[0] - b[0]) / b[0], f"{k} drop (first - tail-3)": a[0] - sum(a[-3:]) / 3}
        return out
    if case == "tp":
        out = {}
        for lay in ("tp2", "2d"):
            a, b = r[f"{lay}-fp8"]["losses"], r[f"{lay}-bf16"]["losses"]
            out |= {f"{lay} fp8 gap (mean loss)": _rel(a, b), f"{lay} fp8 gap (tail-3)": _rel(a[-3:], b[-3:]),
                    f"{lay} learns (tail-3 / first)": max(sum(x[-3:]) / 3 / x[0] for x in (a, b))}
        t, o = r["tp2-bf16"]["losses"], r["one-bf16"]["losses"]
        steps = [abs(x - y) / y for x, y in zip(t, o)]
        return out | {"tp vs one: step 1": steps[0], "tp vs one: steps 1-10 (max)": max(steps[:10]),
                      "tp vs one: steps 11-20 (max)": max(steps[10:]), "tp vs one: mean loss": _rel(t, o),
                      "tp learns (tail-3 / first)": sum(t[-3:]) / 3 / t[0]}
    if case == "pp":
        one, pp = r["one-bf16"], r["pp2-bf16"]
        out = {"pp2 bf16 vs one: loss, steps 1-3 (max)": max(abs(x - y) / y for x, y in zip(pp["losses"], one["losses"])),
               "pp2 bf16 vs one: grad norm, steps 1-3 (max)": max(abs(x - y) / y for x, y in zip(pp["grad_norms"], one["grad_norms"]))}
        for name, twin in (("pp2-fp8", "one-fp8"), ("pp2dp2-fp8", "dp2-fp8"), ("pp2-bf16-20", "one-bf16-20")):
            a, b = r[name]["losses"], r[twin]["losses"]
            out |= {f"{name} vs {twin}: mean loss": _rel(a, b), f"{name} vs {twin}: final loss": (a[-1] - b[-1]) / b[-1],
                    f"{name} learns (tail-3 / first)": sum(a[-3:]) / 3 / a[0]}
        return out
    if case == "pp-tp":
        one, pp = r["one-bf16"]["losses"], r["pp2tp2-bf16"]["losses"]
        return {"pp2 x tp2 bf16 vs one: loss, steps 1-3 (max)": max(abs(x - y) / y for x, y in zip(pp, one))}
    if case == "pp-tp-fp8":
        one, pp = r["one-fp8"], r["pp2tp2-fp8"]
        return {"pp2 x tp2 fp8 vs one: step 1 loss": (pp["losses"][0] - one["losses"][0]) / one["losses"][0],
                "pp2 x tp2 fp8 vs one: step 1 grad norm": (pp["grad_norms"][0] - one["grad_norms"][0]) / one["grad_norms"][0]}
    if case == "pp-moe":
        one, pp = r["one-moe-bf16"]["losses"], r["pp2-moe-bf16"]["losses"]
        return {"pp2 moe bf16 vs one: loss, steps 1-4 (max)": max(abs(x - y) / y for x, y in zip(pp, one))}
    if case == "pp-mx":
        one, pp = r["one-mxfp8"]["losses"], r["pp2-mxfp8"]["losses"]
        return {"pp2 mxfp8 vs one: loss, steps 1-3 (max)": max(abs(x - y) / y for x, y in zip(pp, one))}
    if case == "pp-eval":
        (_, one), (_, pp) = r["one-bf16"]["evals"][0], r["pp2-bf16"]["evals"][0]
        return {"pp2 bf16 vs one: eval loss after step 3": (pp - one) / one}
    if case == "pp-resume":
        ref, one = r["pp2-fp8"]["losses"], r["pp1-from-pp2"]["losses"]
        return {"pp2 -> pp1: step 11": (one[0] - ref[10]) / ref[10],
                "pp2 -> pp1: steps 11-20 mean": _rel(one, ref[10:])}
    if case == "tp-resume":
        ref, dp, tp = r["2d-fp8"]["losses"], r["2d-to-dp2"]["losses"], r["2d-to-tp2"]["losses"]
        return {"2d -> dp2: steps 11-20 (max)": max(abs(x - y) / y for x, y in zip(dp, ref[10:])),
                "2d -> tp2: step 11": (tp[0] - ref[10]) / ref[10],
                "2d -> tp2: |got - ref| / (ref[1] - ref[11])": abs(tp[0] - ref[10]) / (ref[0] - ref[10]),
                "2d -> tp2: got[11] / ref[1]": tp[0] / ref[0]}
    if case == "torchao-step":
        return {"loss gap (abs)": abs(r["fp8_loss"] - r["bf16_loss"]), "drop (6 steps)": r["losses"][0] - r["losses"][-1]}
    if case == "debug-learns":
        return {"first loss": r["losses"][0], "learns (tail-3 / first)": sum(r["losses"][-3:]) / 3 / r["losses"][0]}
    if case == "moe-steps":
        return {"gap (final loss)": r["mxfp8"][-1] / r["bf16"][-1] - 1, "gap (mean loss)": _rel(r["mxfp8"], r["bf16"])}
    raise ValueError(case)


def summary(args) -> None:
    """The table of benchmarks/results/test_bounds.md from JSON lines: per case, spec overrides and break, each statistic's
    runs, mean, sd, min and max (and the largest absolute value)."""
    import statistics
    from collections import defaultdict

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for path in args.files:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            groups[r["case"], json.dumps(r.get("set") or {}, sort_keys=True), r.get("broken") or "", r.get("strategy", "")].append(r)
    print("| case | strategy | spec overrides | broken | statistic | runs (seeds x kernels) | mean | sd | min | max | max abs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (case, sets, broken, strategy), rows in groups.items():
        stats = [statistics_of(r) for r in rows]
        isas = sorted({r["isa"] for r in rows})
        for name in stats[0]:
            xs = [s[name] for s in stats]
            print(f"| {case} | {strategy} | {sets if sets != '{}' else ''} | {broken} | {name} | {len(xs)} ({', '.join(isas)}) | "
                  f"{statistics.fmean(xs):+.4f} | {statistics.pstdev(xs):.4f} | {min(xs):+.4f} | {max(xs):+.4f} | "
                  f"{max(map(abs, xs)):.4f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="case", required=True)
    te = sub.add_parser("te-fp8-weights")
    te.add_argument("--strategy", choices=("ddp", "fsdp2"), required=True)
    te.add_argument("--broken", choices=("frozen", "no-master"), help="break the stand-in FusedAdam on purpose")
    cases = {"te-fp8-weights": te_fp8_weights, "torchao-step": torchao_step, "debug-learns": debug_learns, "moe-steps": moe_steps}
    for name in ("levels-ddp", "runs-parity", "moe", "tp", "tp-resume", "pp", "pp-tp", "pp-tp-fp8", "pp-moe", "pp-mx", "pp-eval",
                 "pp-resume"):
        sub.add_parser(name)
        cases[name] = e2e
    sub.add_parser("torchao-step")
    sub.add_parser("debug-learns")
    sub.add_parser("moe-steps")
    for parser in sub.choices.values():  # before "summary" is added
        parser.add_argument("--seeds", default="0-4")
        parser.add_argument("--set", action="append", default=[], help="KEY=JSON on top of the test's spec, e.g. train.lr=3e-3")
    sm = sub.add_parser("summary", help="the table of test_bounds.md from the JSON lines")
    sm.add_argument("files", nargs="+")
    cases["summary"] = summary
    args = p.parse_args()
    cases[args.case](args)


if __name__ == "__main__":
    main()
