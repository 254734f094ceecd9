"""The speed stage of benchmarks/gpu_session.sh, prepared on the CPU: the representative specs plan (and 15 layers is
what fits one H100 with 10% left), the hand-written reference loop is independent of fp8launch yet trains on the same
batches with the same lr schedule, the plan fits timing, profile and reference in one call with a minute to spare, and
the whole stage's dry run (GPU_DRY_RUN=1: the same commands on tiny CPU shapes, its core failing as a run out of GPU
memory does, then its fallback) writes every result with values that make sense."""

from __future__ import annotations

import ast
import datetime
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import weakref

import pytest
import torch

from conftest import REPO
from launcher.planning.models import parse_builtin
from launcher.train.data import SyntheticStream
from launcher.train.optim import lr_factor

BENCH = REPO / "benchmarks"
SPECS = BENCH / "specs"
NEW_SPECS = sorted(SPECS.glob("llama3-8b-ac-*.toml")) + sorted(SPECS.glob("llama3.2-*.toml"))
H100_GIB = 79.2
"""What torch sees of an H100 80GB HBM3 (the 2026-11-24 session's doctor.txt)."""


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"benchmarks_{name}"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    return _module("reference_loop")


def test_the_reference_loop_imports_nothing_from_fp8launch():
    tree = ast.parse((BENCH / "reference_loop.py").read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert "torchao.float8" in imported and "torch.distributed.fsdp" in imported  # the walk sees the lazy imports too
    assert [m for m in imported if m.split(".")[0] == "launcher"] == []


@pytest.mark.parametrize("seq_len,batch,vocab,rank,seed", [(64, 2, 2048, 0, 0), (17, 3, 128256, 1, 7), (8, 1, 100, 3, 2**64 + 5)])
def test_the_reference_batches_are_fp8launchs_synthetic_batches(reference, seq_len, batch, vocab, rank, seed):
    ours = reference.SyntheticBatches(seq_len=seq_len, batch=batch, vocab=vocab, rank=rank, seed=seed)
    theirs = SyntheticStream(seq_len=seq_len, micro_batch_size=batch, vocab_size=vocab, rank=rank, seed=seed)
    for _ in range(3):
        a, b = next(ours), next(theirs)
        assert a.dtype == b.dtype == torch.int64 and a.shape == (batch, seq_len + 1)
        assert torch.equal(a, b)
    # a different rank reads different batches (the stream is per rank)
    other = reference.SyntheticBatches(seq_len=seq_len, batch=batch, vocab=vocab, rank=rank + 1, seed=seed)
    assert not torch.equal(next(other), SyntheticStream(seq_len=seq_len, micro_batch_size=batch, vocab_size=vocab, rank=rank,
                                                        seed=seed).__next__())


@pytest.mark.parametrize("warmup,steps,min_ratio", [(10, 40, 0.1), (0, 12, 0.1), (5, 30, 0.0), (10, 4, 0.1), (3, 3, 0.25)])
def test_the_reference_lr_schedule_is_fp8launchs(reference, warmup, steps, min_ratio):
    for step in range(steps + 2):
        assert reference.lr_factor(step, warmup_steps=warmup, steps=steps, min_lr_ratio=min_ratio) == pytest.approx(
            lr_factor(step, warmup_steps=warmup, steps=steps, min_lr_ratio=min_ratio), abs=1e-12)


def test_the_reference_loop_frees_the_logits_before_backward(reference):
    """As fp8launch's Trainer (`_loss_of`): the logits go straight into the loss, so nothing holds them while backward
    runs (at the core's shape, 2 GiB of bf16 logits). A hook on the loss, which backward calls first, reads a weak
    reference to the head's output; the loop's former shape (`logits = model(...)` kept in the frame) is the control."""
    a = reference.parse_args(["--precision", "bf16", "--device", "cpu", "--dim", "64", "--layers", "1", "--heads", "4",
                              "--kv-heads", "2", "--ffn", "128", "--vocab", "512", "--seq-len", "16"])
    torch.manual_seed(0)
    model = reference.Transformer(a)
    model.init_weights()
    seen: dict = {}
    model.output.register_forward_hook(lambda module, args, out: seen.__setitem__("logits", weakref.ref(out)))

    def loss_fn(logits, targets):
        loss = reference.cross_entropy(logits, targets)
        loss.register_hook(lambda grad: seen.__setitem__("alive_in_backward", seen["logits"]() is not None))
        return loss

    tokens = next(reference.SyntheticBatches(seq_len=16, batch=2, vocab=512, rank=0, seed=0))
    loss = reference.forward_backward(model, loss_fn, tokens)
    assert seen["alive_in_backward"] is False and math.isfinite(loss.item())
    assert model.output.weight.grad is not None and model.output.weight.grad.abs().sum() > 0  # backward did run
    logits = model(tokens[:, :-1])  # the control: a name that holds the logits through backward
    loss_fn(logits, tokens[:, 1:]).backward()
    assert seen["alive_in_backward"] is True


def test_reference_args_give_the_loop_the_specs_shape_batch_and_schedule():
    args = _module("reference_args")
    procs, flags = args.reference_flags(str(SPECS / "llama3-8b-ac-fp8.toml"), ["train.steps=12"])
    got = dict(zip(flags[::2], flags[1::2]))  # flag -> the word after it (flags without a value pair up harmlessly)
    cfg = parse_builtin("builtin:llama3-8b?layers=15")
    assert procs == 1
    assert (got["--dim"], got["--layers"], got["--heads"], got["--kv-heads"], got["--ffn"], got["--vocab"]) == \
        ("4096", "15", "32", "8", "14336", "128256") == tuple(str(v) for v in (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.kv_heads,
                                                                              cfg.ffn_dim, cfg.vocab_size))
    i = flags.index
    assert flags[i("--seq-len") + 1] == "8192" and flags[i("--batch") + 1] == "1" and flags[i("--steps") + 1] == "12"
    assert float(flags[i("--lr") + 1]) == 1e-4 and flags[i("--warmup-steps") + 1] == "10" and flags[i("--ac") + 1] == "full"
    assert "--compile" in flags and "--auto-filter" in flags and flags[i("--filter-fqns") + 1] == "output"
    # keep_first_last = false: nothing is left out by name
    _, flags_all = args.reference_flags(str(SPECS / "llama3-8b-ac-fp8-all.toml"), [])
    assert flags_all[flags_all.index("--filter-fqns") + 1] == ""
    with pytest.raises(ValueError, match="hf:llama3.2-3b/config.json"):
        args.reference_flags(str(SPECS / "llama3.2-3b-fp8.toml"), [])


def test_the_representative_specs_plan_and_the_8b_ac_fills_an_h100_to_90_percent(cli, tmp_path):
    assert len(NEW_SPECS) == 9
    r = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), *map(str, NEW_SPECS[3:]))
    assert r.exit_code == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.startswith("{")]) == 6
    r = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), *map(str, NEW_SPECS[:3]))
    assert r.exit_code == 0, r.stderr
    plans = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    peaks = {p["name"]: p["memory"]["peak_bytes_per_gpu"] / 2**30 for p in plans}
    assert set(peaks) == {"llama3-8b-ac-bf16", "llama3-8b-ac-fp8", "llama3-8b-ac-fp8-all"}
    assert all(0.85 * H100_GIB < peak <= 0.90 * H100_GIB for peak in peaks.values()), peaks
    # one layer more would leave less than 10%: 15 is the most that does
    r = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), str(SPECS / "llama3-8b-ac-fp8.toml"),
            "--set", "train.model=builtin:llama3-8b?layers=16")
    assert json.loads(r.stdout.splitlines()[0])["memory"]["peak_bytes_per_gpu"] / 2**30 > 0.90 * H100_GIB


def test_the_targets_are_marked_from_the_measured_values():
    compare = _module("compare_reference")
    core = {"tokens_per_s": {"ratio": 1.2}, "profile": {"of_ceiling": 0.95}}
    ref = {"bf16": {"ratio": 0.99, "mismatch": None}, "fp8": {"ratio": None, "mismatch": "tokens per step 8192 vs 4096"}}
    got = {t["id"]: t for t in compare.verdicts(core, ref, "NVIDIA H100 80GB HBM3", 1)}
    assert [got[k]["verdict"] for k in ("fp8_vs_bf16", "of_ceiling", "vs_reference_bf16")] == ["not met", "met", "met"]
    assert got["vs_reference_fp8"]["verdict"] == "not comparable: tokens per step 8192 vs 4096" and got["vs_reference_fp8"]["met"] is None
    assert all(t["applies"] and not t["note"] for t in got.values())
    on_cpu = {t["id"]: t for t in compare.verdicts(core, ref, "cpu", 2)}
    assert not any(t["applies"] for t in on_cpu.values()) and "not on one H100" in on_cpu["fp8_vs_bf16"]["note"]


def out_rule_breaks(out) -> list[str]:
    """What the GPU machine would not bring back of OUT (device README: at most 8 files, 16 MiB each and 64 MiB
    together, none deeper than OUT/a/b/file, names of letters, digits, '.', '_', '-'), written out here again."""
    files = [p for p in out.rglob("*") if p.is_file()]
    breaks = [f"{len(files)} files"] if len(files) > 8 else []
    breaks += [f"{p}: too deep" for p in files if len(p.relative_to(out).parts) > 3]
    breaks += [f"{p}: name" for p in out.rglob("*") if not re.fullmatch(r"[A-Za-z0-9._-]+", p.name)]
    breaks += [f"{p}: {p.stat().st_size} bytes" for p in files if p.stat().st_size > 16 * 2**20]
    if sum(p.stat().st_size for p in files) > 64 * 2**20:
        breaks.append("over 64 MiB")
    return breaks


def shell_env(**extra) -> dict:
    return {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], **extra}


@pytest.mark.slow
def test_the_speed_stage_dry_run_returns_every_result_within_the_gpu_machines_rules(tmp_path):
    """The dry run, with SETS shrinking the vocabulary and its core's first timing run failing as one out of GPU memory
    does (GPU_BENCH_FAULT=oom): the fallback (FALLBACK_SETS: seq 8 in a dry run) runs every part in the same call; what
    it leaves in OUT is what the GPU machine brings back, and the tarball holds every result."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = shell_env(GPU_DRY_RUN="1", GPU_BENCH_FAULT="oom", WORK=str(work), PACK_EVERY="10",
                    SETS="train.model=builtin:llama-debug?layers=1&vocab=1024")
    r = subprocess.run(["bash", "benchmarks/gpu_session.sh", "NONE", "speed", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-2000:])
    today = datetime.date.today().isoformat()
    assert out_rule_breaks(out) == []
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{today}-cpu-speed.md", f"{today}-cpu.md", "8b-ac-bench.png",
                                                            "8b-ac-profile.png", "results.tgz", "session.log"])
    log = (out / "session.log").read_text()
    assert log == r.stdout and log.rstrip().endswith("gpu_session: speed exited 0 after " + log.rstrip().rsplit(" after ", 1)[1])
    packs = [line for line in log.splitlines() if line.startswith("pack_results: results.tgz: ")]
    assert len(packs) >= 3  # packed again while the parts ran (every 10 s here), and once at the end
    assert "8b-ac-profile.png" in packs[-1] and "the GPU machine would not bring it back" not in log

    with tarfile.open(out / "results.tgz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    back = tmp_path / "back" / "results"
    assert (back / "speed" / "8b-ac" / "bench.png").read_bytes() == (out / "8b-ac-bench.png").read_bytes()
    assert (back / f"{today}-cpu-speed.md").read_text() == (out / f"{today}-cpu-speed.md").read_text()
    environment = (back / "environment.txt").read_text()
    assert "GPU_DRY_RUN" in environment and "api torch._scaled_mm: ok (16x32 @ 32x16 e4m3 -> bfloat16 on cpu)" in environment
    probed = re.search(r"^api probe on cpu: (\d+) of (\d+) present$", environment, re.M)
    assert probed and probed.group(1) == probed.group(2) == str(environment.count("\napi ") - 2)  # each API a line, all here

    # the failed first attempt: set aside whole, its out-of-memory line in the log; the fallback's SETS in every later run
    failed = (back / "speed" / "8b-ac-failed" / "spec-1" / "train.log").read_text()
    assert "CUDA out of memory" in failed and f"gpu_bench: timing 8b-ac failed ({failed.strip()}); " in log
    assert "the fallback runs its parts now, in this call: --set train.seq_len=8" in log

    # one bench: timed on the steps before the profiled ones, its last steps profiled
    bench = json.loads((back / "speed" / "8b-ac" / "bench.json").read_text())
    profile = json.loads((back / "speed" / "8b-ac" / "profile.json").read_text())
    assert bench["profile"] == profile and bench["profile_last"] == 2 and bench["timed_steps"] == [3, 4]
    assert bench["spec"]["overrides"][-1] == bench["baseline"]["overrides"][-1] == "train.seq_len=8"
    for side, run in (("spec", "spec-1"), ("baseline", "baseline-1")):  # both runs' own profile.json: steps 6, 7
        assert json.loads((back / "speed" / "8b-ac" / run / "profile.json").read_text())["run"]["steps"] == 2
        records = [json.loads(line) for line in (back / "speed" / "8b-ac" / run / "metrics.jsonl").read_text().splitlines()]
        tokens = {r["step"]: r["tokens_per_s"] for r in records if r.get("event") == "step"}
        assert sorted(tokens) == list(range(1, 8))  # 2 warm-up, 2 timed, the profiler's warm-up step, 2 profiled
        assert bench[side]["figures"]["tokens_per_s"] == statistics.median([tokens[3], tokens[4]])  # no profiled step in it
    assert bench["baseline"]["fp8_layers"] == 0 and bench["spec"]["fp8_layers"] > 0
    assert profile["baseline"]["parts"]["gemm_fp8"] == 0 and profile["baseline"]["fp8_gemm_flop_share"] == 0
    assert 0 < profile["spec"]["fp8_gemm_flop_share"] <= 1 and profile["spec"]["parts"]["gemm_fp8"] > 0
    assert profile["spec"]["ceiling"] > 1
    assert (back / "speed" / "8b-ac" / "profile.png").read_bytes() == (out / "8b-ac-profile.png").read_bytes()
    start = bench["spec"]["runs"][0]["start"]
    assert [s for s, _ in bench["spec"]["runs"][0]["losses"]] == list(range(1, 8)) and start["world_size"] == 2
    assert start["tokens_per_step"] == 2 * 8  # 2 processes x 1 x seq 8: the fallback's

    refs = {p: json.loads((back / "speed" / "reference" / f"{p}.json").read_text()) for p in ("bf16", "fp8")}
    for p, ref in refs.items():
        assert ref["precision"] == p and ref["steps"] == len(ref["losses"]) == len(ref["step_times_s"]) == 7  # the bench's schedule
        assert all(math.isfinite(v) and 0 < v < 20 for v in ref["losses"])
        # the same job as the bench: tokens per step, processes, parameters, the first batch's loss at the same init scale
        assert (ref["tokens_per_step"], ref["world_size"], ref["parameters"]) == (start["tokens_per_step"], 2, start["parameters"])
        assert ref["losses"][0] == pytest.approx(bench["spec"]["runs"][0]["losses"][0][1], abs=0.1)
        assert ref["shape"]["vocab"] == 1024 and ref["shape"]["layers"] == 1  # SETS reached the reference loop too
        assert ref["seq_len"] == 8  # and the fallback's
    assert refs["bf16"]["fp8_layers"] == 0 and refs["fp8"]["fp8_layers"] == refs["fp8"]["total_linear"] - 1  # all but "output"
    # ... and the bench: its parameters (the reference's, above) are those of a 1024-token vocabulary (the dry run's own: 2048)
    sh = refs["bf16"]["shape"]
    per_layer = 2 * sh["dim"] ** 2 + 2 * sh["dim"] * (sh["dim"] // sh["heads"] * sh["kv_heads"]) + 3 * sh["dim"] * sh["ffn"] + 2 * sh["dim"]
    assert start["parameters"] == 2 * 1024 * sh["dim"] + sh["layers"] * per_layer + sh["dim"]

    speed = json.loads((back / f"{today}-cpu-speed.json").read_text())
    for p in ("bf16", "fp8"):
        side = speed["reference"][p]
        assert side["mismatch"] is None and side["ratio"] > 0
        assert side["ratio"] == pytest.approx(side["fp8launch_tokens_per_s"] / refs[p]["tokens_per_s"])
        assert side["fp8launch_basis"] == "median of 1 run(s), steps 3..4 (unprofiled: the profiled steps came after them)"
    targets = {t["id"]: t for t in speed["targets"]}
    assert set(targets) == {"fp8_vs_bf16", "of_ceiling", "vs_reference_bf16", "vs_reference_fp8"}
    assert all(t["verdict"] in ("met", "not met") and t["applies"] is False for t in targets.values())
    assert targets["fp8_vs_bf16"]["value"] == pytest.approx(bench["ratios"]["tokens_per_s"])
    # of the ceiling: the unprofiled ratio over the profile's ceiling (not the profiled steps' own ratio)
    assert targets["of_ceiling"]["value"] == pytest.approx(bench["ratios"]["tokens_per_s"] / profile["spec"]["ceiling"])
    assert speed["benches"][0]["profile"]["measured_ratio"] == pytest.approx(profile["measured_ratio"])
    assert "skipped" in speed["torchtitan"]
    table = (back / f"{today}-cpu-speed.md").read_text()
    assert "## Targets" in table and "| fp8launch / reference loop tokens/s, FP8 |" in table
    assert "from the timing runs' last 2 steps" in table and " --profile-last 2 " in table  # its command listed
    assert (back / f"{today}-cpu.md").is_file()  # summarize_bench.py's FP8 vs bf16 table


def _plan(env: dict, tmp_path, name: str = "plan-out") -> subprocess.CompletedProcess:
    out = tmp_path / name
    r = subprocess.run(["bash", "benchmarks/gpu_session.sh", ".whl", "speed", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=shell_env(GPU_PLAN="1", **env))
    # the plan runs nothing and writes OUT/plan.json only (nothing where it is refused)
    assert sorted(os.listdir(out)) == ["plan.json"] if r.returncode == 0 else not out.exists()
    return r


def test_one_speed_call_holds_timing_profile_and_reference_with_a_minute_to_spare(tmp_path):
    """SPEC.md's contract for GPU_PLAN=1: OUT/plan.json's parts (names containing timing, profile and reference), call_s
    their sum, within budget_s (BUDGET) with at least 60 s left, nothing skipped; its figures are the printed plan's. A
    core that fails at its first step leaves the fallback its timing and profile in the same call."""
    r = _plan({}, tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan-out" / "plan.json").read_text())
    assert {"parts", "call_s", "budget_s", "skipped"} <= set(plan)
    names = [p["name"] for p in plan["parts"]]
    assert all(any(word in name for name in names) for word in ("timing", "profile", "reference")), names
    assert plan["call_s"] == sum(p["seconds"] for p in plan["parts"]) and plan["budget_s"] == 540
    assert plan["budget_s"] - plan["call_s"] == plan["margin_s"] >= 60 and plan["skipped"] == []
    bench_parts = [p for p in plan["parts"] if f"gpu_bench plan: {p['name']}: " in r.stdout]
    assert [p["name"] for p in bench_parts] == ["timing 8b-ac", "profile 8b-ac", "reference bf16", "reference fp8"]
    assert all(f"gpu_bench plan: {p['name']}: ~{p['seconds']} s " in r.stdout for p in bench_parts)
    assert f"the call ~{plan['call_s']} s of BUDGET 540 s ({plan['margin_s']} s to spare); skipped: none" in r.stdout
    assert plan["session_s"] == plan["machine_start_s"] + plan["budget_s"] + 60 + 30 <= 900
    fallback = plan["fallback"]
    assert [p["name"] for p in fallback["parts"]][1:4] == ["the core's failed first run", "timing 8b-ac", "profile 8b-ac"]
    assert fallback["call_s"] == sum(p["seconds"] for p in fallback["parts"]) <= plan["budget_s"]
    assert "--set train.model=builtin:llama3-8b?layers=12" in r.stdout.split("gpu_bench plan: fallback:", 1)[1]


def test_the_speed_plan_counts_weight_init_and_the_start_and_sets_reach_the_real_runs(tmp_path, cli):
    """GPU_PLAN=1 in the real (not dry) mode: SETS reaches every fp8launch run and, planned through reference_args.py,
    the reference loop; each estimate is the sum of its printed terms, weight init among them (the core's parameters,
    the plan's own figure for the spec with SETS); the session adds the machine's start; BUDGET's default leaves 60 s
    of a 600 s call."""
    r = _plan({"SETS": "train.model=builtin:llama3-8b?layers=12 train.micro_batch_size=1"}, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("gpu_bench plan: fallback:", 1)[0].splitlines()
    runs = [line for line in lines if re.match(r"  gpu_bench plan: \w+ [\w.-]+: ~\d+ s ", line)]
    assert [line.split(":")[1].strip() for line in runs] == ["timing 8b-ac", "profile 8b-ac", "reference bf16", "reference fp8"]
    timing, profile = runs[0], runs[1]
    assert " --set train.model=builtin:llama3-8b?layers=12 --set train.micro_batch_size=1" in timing
    assert " --steps 14 --warmup 3 --repeats 1 --profile-last 3 " in timing  # 3 warm-up, 7 timed, 1 + 3 under the profiler
    assert all("--layers 12 " in line and "--batch 1 " in line and "--device cuda" in line and "--steps 14 " in line
               for line in runs[2:])  # the reference: the bench's schedule
    terms = re.search(r"~(\d+) s \(2 variants x \((\d+) x \(start (\d+) \+ weight init ([\d.]+) \+ (\d+) steps x ([\d.]+) s\) "
                      r"\+ compile (\d+)\)\)", timing)
    est, repeats, start, init, steps, step, compile_s = (float(x) for x in terms.groups())
    assert est == int(2 * (repeats * (start + init + steps * step) + compile_s))
    planned = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), str(SPECS / "llama3-8b-ac-fp8.toml"),
                  "--set", "train.model=builtin:llama3-8b?layers=12", "--set", "train.micro_batch_size=1")
    planner = json.loads(planned.stdout.splitlines()[0])["init"]
    assert planner["where"].startswith("on the GPU") and planner["seconds_per_rank"] < 1  # drawn on the GPU: under a second
    assert init == round(max(1.0, planner["seconds_per_rank"]), 1)  # the plan's own figure (at least 1 s), SETS included
    terms = re.search(r"~(\d+) s \(2 runs x \(\(1 \+ (\d+)\) steps x ([\d.]+) s x (\d+)% under the profiler \+ trace (\d+)\)\)", profile)
    prof, profiled, p_step, pct, trace = (float(x) for x in terms.groups())
    assert prof == int(2 * ((1 + profiled) * p_step * pct / 100 + trace)) and p_step == step and profiled == 3
    ref = [int(re.search(r"~(\d+) s ", line).group(1)) for line in runs[2:]]
    total = int(re.search(r"~(\d+) s in all", r.stdout).group(1))
    assert total == est + prof + sum(ref)
    budget = int(re.search(r"this call's BUDGET (\d+) s", r.stdout).group(1))
    assert budget <= 600 - 60
    session = re.search(r"alone: ~(\d+) s start \+ this call's timeout_s \(BUDGET \+ 60\) \+ ~(\d+) s idle before give_back = "
                        r"(\d+) s of the 900 s", r.stdout)
    start_s, idle, whole = (int(x) for x in session.groups())
    assert start_s == 240 and whole == start_s + budget + 60 + idle <= 900
    # a SETS item that is not KEY=VALUE is refused, saying how to write it
    bad = _plan({"SETS": "layers12"}, tmp_path, "bad-sets")
    assert bad.returncode != 0 and "SETS item 'layers12' is not KEY=VALUE" in bad.stdout + bad.stderr
    bad = _plan({"PARTS": "timing profile"}, tmp_path, "bad-parts")  # the profile is no part of its own any more
    assert bad.returncode != 0 and "the profile is the timing runs' last steps" in bad.stderr


def _doc_calls(heading: str) -> list[dict]:
    """The rows of the first table under `heading` in docs/benchmarks.md, as {column: cell without backticks}."""
    lines = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip().strip("|").split("|")])
    return [dict(zip(rows[0], row)) for row in rows[2:]]


def _ignored(paths: list[str]) -> list[str]:
    """Which of `paths` git ignores (a folder named without its slash is asked for as one)."""
    def ignored(p: str) -> bool:
        return any(subprocess.run(["git", "check-ignore", "--no-index", "-q", q], cwd=REPO).returncode == 0 for q in (p, p + "/"))
    return [p for p in paths if ignored(p)]


COMMAND = re.compile(r'((?:[A-Z_]+=(?:"[^"]*"|\S+) )*)bash benchmarks/gpu_session\.sh (\S+) (\S+) \$OUT')


def _read_vars() -> set[str]:
    scripts = "".join((BENCH / name).read_text() for name in ("gpu_session.sh", "gpu_bench.sh", "te_install.sh"))
    return set(re.findall(r"\$\{([A-Z_]+)[:}]", scripts))


def test_the_documented_speed_calls_fit_the_scripts_and_the_machine(tmp_path):
    """Each row of docs/benchmarks.md's speed calls: the script's usage (WHEELHOUSE STAGE $OUT), variables the scripts
    read, the wheelhouse carried, only git-ignored paths carried (at most 8), BUDGET at least 60 s inside timeout_s
    (at most 600), a command the tool takes (2,000 characters), and its plan runs."""
    calls = _doc_calls("### The calls")
    assert [c["call"] for c in calls] == ["speed", "a later session"]
    known = _read_vars()
    for call in calls:
        m = COMMAND.fullmatch(call["command"])
        assert m, call["command"]
        assignments = dict(re.findall(r'([A-Z_]+)=("[^"]*"|\S+) ', m.group(1)))
        wheels, stage = m.group(2), m.group(3)
        assert stage == "speed" and set(assignments) <= known, (assignments, known)
        carry = json.loads(call["carry"])
        timeout_s = int(call["timeout_s"])
        assert wheels in carry and len(carry) <= 8 and timeout_s <= 600 and len(call["command"]) <= 2000
        assert _ignored(carry) == carry  # nothing that travels anyway; the git-ignored folder is asked for by name
        assert int(assignments["BUDGET"]) <= timeout_s - 60
        env = {k: v.strip('"') for k, v in assignments.items()}
        r = _plan(env, tmp_path, call["call"].replace(" ", "-"))
        assert r.returncode == 0, r.stderr
        assert f"this call's BUDGET {env['BUDGET']} s" in r.stdout
        if "SETS" in env:
            assert all(f"--set {item}" in r.stdout for item in env["SETS"].split())
        # every part the row asks for (PARTS, or the default; timing with its profile) is planned or said to be skipped, in
        # that order
        said = [m.group(1) or m.group(2)
                for m in re.finditer(r"gpu_bench plan: (\w+) [\w.-]+: ~|gpu_bench: skipped (?:the )?(\w+)", r.stdout)]
        asked = [p for part in env.get("PARTS", "timing reference").split()
                 for p in (("timing", "profile") if part == "timing" else (part,))]
        assert list(dict.fromkeys(said)) == asked, said


def test_the_packer_keeps_out_within_the_rules_and_says_what_it_left_out(tmp_path):
    """pack_results.py: everything under WORK in results.tgz below the cap, the largest left out first and named;
    --single copies only what fits the 8 files (one place kept for the tarball's dotted twin); --check names breaks."""
    packer = _module("pack_results")
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "a" / "b" / "c").mkdir(parents=True)
    (work / "a" / "b" / "c" / "deep.json").write_text('{"x": 1}\n')  # deeper than OUT may hold: fine inside the tarball
    (work / "big.json.gz").write_bytes(os.urandom(200_000))  # incompressible; each fits alone, not both
    (work / "mid.bin").write_bytes(os.urandom(150_000))
    (work / "huge.bin").write_bytes(os.urandom(300_000))
    for i in range(9):
        (work / f"t{i}.md").write_text(f"table {i}\n")
    out.mkdir()
    (out / "session.log").write_text("log\n")
    count, size, left = packer.pack(str(work), str(out), cap=250_000)
    assert [rel for rel, _, _ in left] == ["huge.bin", "big.json.gz"] and size <= 250_000 and count == 11
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
        assert "results/a/b/c/deep.json" in names and "results/mid.bin" in names and "results/big.json.gz" not in names
        left_out = tar.extractfile("results/RESULTS-LEFT-OUT.txt").read().decode()
    assert left_out == "huge.bin\t300000 bytes\tover 0.238 MiB alone\nbig.json.gz\t200000 bytes\tthe tarball would pass 0.238 MiB\n"
    assert sorted(p.name for p in out.iterdir()) == ["results.tgz", "session.log"]  # no half-written twin left
    copied = packer.copy_singles(str(work), str(out), ["*.md"])
    assert copied == [f"t{i}.md" for i in range(5)]  # 2 + 5 = 7 files: the 8th place is the tarball's twin's
    assert out_rule_breaks(out) == [] and packer.problems(str(out)) == []
    (out / "x" / "y").mkdir(parents=True)
    (out / "x" / "y" / "z.txt").write_text("too deep\n")
    (out / "bad name.txt").write_text("\n")
    found = packer.problems(str(out))
    assert "x/y/z.txt: 2 folders down" not in " ".join(found)  # OUT/x/y/z.txt is two folders down: it comes back
    assert any("bad name.txt: the name" in f for f in found) and any(f.startswith("9 files") for f in found)
    (out / "x" / "y" / "w").mkdir()
    (out / "x" / "y" / "w" / "deeper.txt").write_text("\n")
    assert any("x/y/w/deeper.txt: 3 folders down" in f for f in packer.problems(str(out)))
