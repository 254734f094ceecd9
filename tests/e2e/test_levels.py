"""MS-AMP's levels natively, end to end: real `fp8launch run` processes (torchrun, gloo, 2 ranks on this CPU), the
builtin debug Llama in torchao FP8 (tensorwise).

- DDP: FP8 Adam moments + FP8 gradient reduction against fp32 moments + bf16 reduction: metrics.jsonl's measured
  optimizer_state_bytes <= 0.35x and grad_comm_bytes <= 0.6x, the mean loss over the 30 steps within LOSS_GAP; the
  plan's memory estimate within 5% of the measured state bytes and its predicted grad_comm_bytes within 1% of the
  measured ones.
- FSDP2 (MS-AMP O3 natively: FP8 moments, FP8 reduce-scatter, bf16 master weights, float8 all-gather): trains, the
  start record says every level took effect; a run resumed from its step-6 checkpoint logs bit-identical losses and
  ends with bit-identical weights and optimizer states (torchao's FP8 codes and scales, read back through DCP into
  one process: the 2-rank shards resharded to world size 1); `fp8launch export` writes the bf16 weights as trained.

Run it alone: `pytest -m slow tests/e2e/test_levels.py` (~4 min on 2 cores: each run with a low-bit optimizer spends
~25 s compiling torchao's Adam step at step 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launcher.planning.levels import grad_comm_bytes
from launcher.planning.memory import estimate
from launcher.planning.plan import load_plan

from .helpers import FP8, check_run, output_of, records, run, write_spec

pytestmark = pytest.mark.slow

MODEL = "builtin:llama-debug?layers=2"
DDP = dict(distributed__strategy="ddp", train__model=MODEL, train__steps=30, train__lr=3e-3, train__warmup_steps=3,
           train__checkpoint_at_end=False, **FP8)
LOSS_GAP = (-0.15, 0.075)
"""Bounds on (mean loss of the FP8-states run - the fp32-states run's) / the latter, over the 30 steps. FP8 moments
(torchao's AdamWFp8) go down faster in these first steps (over 200 steps they end level: benchmarks/results/
msamp_levels.json), by a seed- and CPU-dependent amount. Measured over seeds 0-4 on an AMX CPU and 0-2 with AVX2
kernels (benchmarks/results/test_bounds.md): -7.2% to +0.3%, mean -3.9%, sd 2.3%; the bounds are 2x the largest
below and the largest + 3 sd above. The final loss, which this test compared before (within 5%), spread from -21% to
+2% on the same runs (-9.4% at seed 0 on the AMX CPU). The FP8 reduction without its per-block scales (small
gradients flushed to zero) measured +14.6% at seed 0, this test's (it fails), and +5.7% at seed 1."""
O3 = dict(distributed__strategy="fsdp2", train__model=MODEL, precision__optimizer_states="fp8", precision__grad_reduce="fp8",
          precision__master_weights="bf16", precision__torchao__fsdp_float8_all_gather=True, **FP8)


def _run(folder: Path, name: str, **keys) -> tuple[Path, object]:
    spec = write_spec(folder, name, **keys)
    r, seconds = run(folder, "run", str(spec), timeout=600)
    assert r.returncode == 0, output_of(r)
    print(f"{name}: {seconds:.1f} s")
    return folder / "runs" / name, r


def test_ddp_fp8_states_and_fp8_reduce_against_fp32_states_and_bf16_reduce(tmp_path):
    """The issue's bar: <= 0.35x the optimizer state, <= 0.6x the gradient bytes, and the loss alike (LOSS_GAP). ~1.5 min."""
    base_out, _ = _run(tmp_path, "fp32-bf16", precision__grad_reduce="bf16", **DDP)
    low_out, r = _run(tmp_path, "fp8-fp8", precision__optimizer_states="fp8", precision__grad_reduce="fp8", **DDP)
    base, low = records(base_out), records(low_out)
    for recs in (base, low):
        check_run(recs, world_size=2, steps=30, strategy="ddp")
    assert (base.start["effects"]["optimizer"], base.start["effects"]["optimizer_states"], base.start["effects"]["grad_reduce"]) == (
        "AdamW", "fp32", "bf16")
    assert (low.start["effects"]["optimizer"], low.start["effects"]["optimizer_states"], low.start["effects"]["grad_reduce"]) == (
        "AdamWFp8", "fp8", "fp8")
    assert "effects: optimizer AdamWFp8 (fp8 moments), gradients reduced in fp8" in r.stdout
    # measured every step, the same every step (the states exist before step 1; the buckets do not change)
    for recs in (base, low):
        assert len({s["optimizer_state_bytes"] for s in recs.steps[1:]}) == 1 and len({s["grad_comm_bytes"] for s in recs.steps}) == 1
    state_ratio = low.steps[-1]["optimizer_state_bytes"] / base.steps[-1]["optimizer_state_bytes"]
    comm_ratio = low.steps[-1]["grad_comm_bytes"] / base.steps[-1]["grad_comm_bytes"]
    mean_loss = [sum(recs.losses) / len(recs.losses) for recs in (base, low)]
    loss_gap = (mean_loss[1] - mean_loss[0]) / mean_loss[0]
    print(f"optimizer_state_bytes {low.steps[-1]['optimizer_state_bytes']:,} / {base.steps[-1]['optimizer_state_bytes']:,} = "
          f"{state_ratio:.3f}; grad_comm_bytes {low.steps[-1]['grad_comm_bytes']:,} / {base.steps[-1]['grad_comm_bytes']:,} = "
          f"{comm_ratio:.3f}; mean loss {mean_loss[1]:.4f} vs {mean_loss[0]:.4f} ({100 * loss_gap:+.2f}%)")
    assert state_ratio <= 0.35 and comm_ratio <= 0.6
    assert LOSS_GAP[0] <= loss_gap <= LOSS_GAP[1], (base.losses, low.losses)
    # planning saw it coming: the estimate's optimizer_states row and the predicted reduction bytes
    params = low.start["parameters"]
    for out, recs in ((base_out, base), (low_out, low)):
        plan = load_plan(str(out / "plan" / "plan.json"))
        (row,) = [row for row in estimate(plan, params).rows if row.name == "optimizer_states"]
        measured = recs.steps[-1]["optimizer_state_bytes"]
        assert abs(row.bytes_per_gpu(params) - measured) <= 0.05 * measured, (row, measured)
        predicted = grad_comm_bytes(plan, params)
        assert abs(predicted - recs.steps[-1]["grad_comm_bytes"]) <= 0.01 * predicted


def _plain_model_and_optimizer():
    """The run's model and optimizer in this process, unsharded: llama-debug with 2 blocks, bf16 master weights,
    torchao's AdamWFp8 with its states created (what DCP loads into)."""
    from launcher.train import optim_lowbit
    from launcher.train.models import build_model
    from launcher.train.precision.master_weights import cast_master_weights
    from tests.train._precision import make_plan

    model = build_model(MODEL, ".")
    cast_master_weights(model)
    train = make_plan(train={"optimizer": "adamw"}).train
    return model, optim_lowbit.build([{"params": list(model.parameters())}], train, states="fp8", master="bf16")


def _load_in_one_process(checkpoint: Path) -> dict:
    """A checkpoint written by 2 FSDP2 ranks, loaded into one unsharded model and optimizer (DCP reshards torchao's
    FP8 states: their slice along the first dimension). Returns {fqn: {state: tensor}} with the codes and scales."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict

    model, optimizer = _plain_model_and_optimizer()
    weights = get_model_state_dict(model)
    dcp.load(weights, checkpoint_id=str(checkpoint / "model"))
    model.load_state_dict(weights)
    state = get_optimizer_state_dict(model, optimizer)
    dcp.load(state, checkpoint_id=str(checkpoint / "optim"))
    set_optimizer_state_dict(model, optimizer, state)
    out = {"weights": {k: v.clone() for k, v in model.state_dict().items()}}
    for name, p in model.named_parameters():
        s = optimizer.state[p]
        out[name] = {"step": s["step"].clone()}
        for key in ("exp_avg", "exp_avg_sq"):
            t = s[key]
            if type(t).__name__ == "OptimStateFp8":
                out[name][key + ".codes"] = t.codes.view(torch.uint8).clone()
                out[name][key + ".scale"] = t.scale.clone()
            else:
                out[name][key] = t.clone()
    return out


def test_msamp_o3_natively_on_fsdp2_trains_resumes_bit_identically_and_exports_as_trained(tmp_path):
    """FSDP2 with FP8 moments, FP8 reduce-scatter, bf16 master weights and float8 all-gather: 12 steps with
    checkpoints at 6 and 12, then a run resumed at 6. ~2.5 min."""
    out, r = _run(tmp_path, "o3", train__steps=12, train__checkpoint_every=6, train__keep_checkpoints=2, **O3)
    ref = records(out)
    check_run(ref, world_size=2, steps=12, strategy="fsdp2")
    e = ref.start["effects"]
    assert (e["optimizer"], e["optimizer_states"], e["grad_reduce"], e["master_weights"], e["all_gather_dtype"]) == (
        "AdamWFp8", "fp8", "fp8", "bf16", "float8_e4m3fn")
    # FSDP2 shards the states over the 2 ranks and reduce-scatters (no all-gather of gradients): a quarter of fp32's
    # reduce-scatter bytes and about an eighth of its states per rank
    params = ref.start["parameters"]
    assert ref.steps[-1]["grad_comm_bytes"] <= 0.3 * (params * 4 / 2)
    assert ref.steps[-1]["optimizer_state_bytes"] <= 0.3 * (params * 8 / 2)

    resumed_dir = tmp_path / "runs" / "o3-resumed"
    spec = tmp_path / "o3.toml"
    r, _ = run(tmp_path, "run", str(spec), "--set", "train.output_dir=runs/o3-resumed", "--set", "train.resume=runs/o3/checkpoints/step-6",
               timeout=600)
    assert r.returncode == 0, output_of(r)
    lines = [json.loads(x) for x in (resumed_dir / "metrics.jsonl").read_text().splitlines()]
    got = {x["step"]: x["loss"] for x in lines if x["event"] == "step"}
    expected = {s["step"]: s["loss"] for s in ref.steps}
    assert sorted(got) == list(range(7, 13)) and got == {s: expected[s] for s in got}  # bit for bit
    a = _load_in_one_process(out / "checkpoints" / "step-12")
    b = _load_in_one_process(resumed_dir / "checkpoints" / "step-12")
    assert a.keys() == b.keys()
    for name in a:
        for key in a[name]:
            assert a[name][key].dtype == b[name][key].dtype and torch.equal(a[name][key], b[name][key]), (name, key)
    assert a["layers.0.attention.wq.weight"]["exp_avg.codes"].dtype == torch.uint8  # the FP8 codes themselves
    assert {t.dtype for t in a["weights"].values()} == {torch.bfloat16}
    assert float(a["layers.0.attention.wq.weight"]["step"]) == 12.0

    # export: the bf16 weights as trained, bit for bit
    r, _ = run(tmp_path, "export", "runs/o3", "--format", "torch", "--dtype", "bf16", timeout=300)
    assert r.returncode == 0, output_of(r)
    exported = torch.load(tmp_path / "runs" / "o3" / "export" / "step-12-torch" / "model.pt", weights_only=True)
    assert exported.keys() == a["weights"].keys()
    assert all(torch.equal(exported[k], a["weights"][k]) for k in exported)


@pytest.mark.parametrize("strategy, states, reduce, master", [("ddp", "int8", "fp32", "bf16"), ("fsdp2", "bf16", "bf16", "fp32")])
def test_every_level_value_trains(tmp_path, strategy, states, reduce, master):
    """The values the two runs above do not train (docs/support-matrix.md points here): 8-bit dynamic-tree and bf16
    moments, fp32 and bf16 payloads, bf16 master weights under DDP. Each trains 4 steps with every level in effect and
    its measured bytes as the plan counts them. ~45 s each (int8: ~70 s, torchao compiles its 8-bit step slowly)."""
    keys = dict(distributed__strategy=strategy, train__model=MODEL, train__steps=4, train__checkpoint_at_end=False,
                precision__optimizer_states=states, precision__grad_reduce=reduce, precision__master_weights=master, **FP8)
    out, _ = _run(tmp_path, f"{strategy}-{states}", **keys)
    recs = records(out)
    check_run(recs, world_size=2, steps=4, strategy=strategy)
    e = recs.start["effects"]
    assert (e["optimizer_states"], e["grad_reduce"], e["master_weights"]) == (states, reduce, master)
    assert e["optimizer"] == {"int8": "AdamW8bit", "bf16": "AdamWBf16States"}[states]
    plan = load_plan(str(out / "plan" / "plan.json"))
    params = recs.start["parameters"]
    (row,) = [row for row in estimate(plan, params).rows if row.name == "optimizer_states"]
    measured = recs.steps[-1]["optimizer_state_bytes"]
    assert abs(row.bytes_per_gpu(params) - measured) <= 0.05 * measured, (row, measured)
    assert abs(grad_comm_bytes(plan, params) - recs.steps[-1]["grad_comm_bytes"]) <= 0.01 * grad_comm_bytes(plan, params)
