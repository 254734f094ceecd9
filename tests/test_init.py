"""`fp8launch init`: the starter spec for synthetic machines, its validity, the CLI, and the prompts."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
import tomllib

import pytest

from conftest import REPO
from launcher.commands import doctor
from launcher.commands.doctor import gather
from launcher.commands.init import Choices, decide, default_name, interview, render_spec, starter_spec
from launcher.commands.plan import plan_one
from launcher.planning.install import INSTALL
from launcher.planning.read import read_spec, validate
from launcher.targets.toml_text import toml_value
from test_doctor import A100, ALL, CPU_TORCHAO, H100_TE, NO_TORCH, cpu_machine, gpu_machine

H100X8 = gpu_machine("NVIDIA H100 80GB HBM3", (9, 0), torchao="0.18.0", deepspeed="0.19.8")


def planned(tmp_path, text: str, name: str = "spec.toml"):
    """Write `text`, validate it like `fp8launch plan` and plan it: raises SpecError on any error rule."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    validate(read_spec(str(path)))
    return plan_one(str(path), out_dir=str(tmp_path / "generated"))


def test_h100_node_with_torchao(tmp_path):
    text = starter_spec(H100X8)
    data = tomllib.loads(text)
    assert data["name"] == "llama3-8b-fp8-torchao-fsdp2"
    assert data["precision"] == {"mode": "fp8", "backend": "torchao", "high_precision": "bf16",
                                 "torchao": {"recipe": "tensorwise", "fsdp_float8_all_gather": True, "precompute_scale": True}}
    assert data["distributed"] == {"strategy": "fsdp2", "nodes": 1, "procs_per_node": 8}
    assert data["compile"] == {"enabled": True}
    assert data["launch"] == {"device": "auto"}
    assert data["train"]["model"] == "builtin:llama3-8b" and data["train"]["seq_len"] == 8192
    p = planned(tmp_path, text)
    assert p.warnings == [] and p.plan.world_size == 8
    assert text.startswith("# Starter spec written by `fp8launch init` for 8 x NVIDIA H100 80GB HBM3 (compute capability 9.0).\n")


def test_a100_gets_bf16_and_says_why(tmp_path):
    d = decide(A100)
    assert (d.mode, d.backend, d.procs_per_node, d.device) == ("bf16", None, 8, "auto")
    assert d.why == "bf16, not fp8: FP8 needs compute capability >= 8.9; this GPU has 8.0"
    text = render_spec(d)
    data = tomllib.loads(text)
    assert data["precision"] == {"mode": "bf16"} and "torchao" not in text.split("#")[0]
    assert "# bf16, not fp8: FP8 needs compute capability >= 8.9; this GPU has 8.0.\n" in text
    assert planned(tmp_path, text).warnings == []


def test_cpu_smoke_with_torchao(tmp_path):
    text = starter_spec(CPU_TORCHAO)
    data = tomllib.loads(text)
    assert data["name"] == "llama-debug-fp8-torchao-cpu"
    assert data["precision"]["backend"] == "torchao" and data["precision"]["torchao"]["fsdp_float8_all_gather"] is True
    assert data["precision"]["torchao"]["skip_small"] is False  # the debug model's Linears are all below torchao's H100 size rule
    assert data["launch"] == {"device": "cpu", "env": {"OMP_NUM_THREADS": "1"}}
    assert data["distributed"]["procs_per_node"] == 2 and "compile" not in data
    assert {k: data["train"][k] for k in ("model", "seq_len", "steps")} == {"model": "builtin:llama-debug", "seq_len": 128, "steps": 30}
    p = planned(tmp_path, text)
    # no GPU speed advice for a CPU run: `fp8launch plan --strict` passes the spec init wrote (it warned before)
    assert p.warnings == []
    assert p.prediction.n_fp8 == 27  # every Linear but the first and the output layer


def test_cpu_without_torchao_is_a_bf16_smoke(tmp_path):
    d = decide(cpu_machine())
    assert (d.mode, d.device, d.model) == ("bf16", "cpu", "builtin:llama-debug")
    assert f"{INSTALL['torchao']}" in d.why
    planned(tmp_path, render_spec(d))
    assert decide(NO_TORCH).mode == "bf16"


def test_detection_falls_back_to_te_then_fp16():
    assert (decide(H100_TE).backend, decide(H100_TE).recipe) == ("te", "current")
    assert decide(gpu_machine("Tesla V100", (7, 0), count=4, memory=32.0)).mode == "fp16"


@pytest.mark.parametrize("gpus,memory,strategy,model", [
    (8, 79.2, "fsdp2", "builtin:llama3-8b"),
    (8, 79.2, "ddp", "builtin:llama3-1b"),     # DDP replicates the model states
    (1, 79.2, "fsdp2", "builtin:llama3-1b"),
    (1, 22.0, "fsdp2", "builtin:llama-small"),  # one L4
])
def test_the_model_fits_the_gpus(gpus, memory, strategy, model):
    m = gpu_machine("GPU", (8, 9), count=gpus, memory=memory, torchao="0.18.0")
    assert decide(m, Choices(strategy=strategy)).model == model


MACHINES = {"h100x8": H100X8, "a100": A100, "cpu": CPU_TORCHAO, "b200-all": gpu_machine("NVIDIA B200", (10, 0), **ALL)}


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("backend,strategy", [(b, s) for b in (None, "torchao", "te", "msamp")
                                              for s in (None, "ddp", "fsdp2", "deepspeed")])
# msamp with fsdp2: its level natively here (MS-AMP's own stack refuses it: test_cli_refuses_a_known_bad_combination)
def test_every_choice_plans_without_error_rules(tmp_path, machine, backend, strategy):
    text = starter_spec(MACHINES[machine], Choices(backend=backend, strategy=strategy, nodes=2))
    p = planned(tmp_path, text)  # raises on any error rule
    assert p.plan.distributed.nodes == 2
    assert p.plan.distributed.strategy == strategy or strategy is None
    # the CPU smoke model's GEMMs are too small to gain on a GPU; and without compile (DeepSpeed starters) the
    # unfused casts eat the gain, which the prediction says beside FP8-NO-COMPILE
    small = {"FP8-NO-GAIN"} if machine == "cpu" or not p.plan.compile.enabled else set()
    unmaintained = {"MSAMP-UNMAINTAINED"} if backend == "msamp" else set()  # said for every MS-AMP spec
    assert {f.rule.id for f in p.warnings} <= {"FP8-NO-COMPILE"} | small | unmaintained


def test_user_strings_are_quoted_not_pasted():
    for value in ['a"b', "back\\slash", "new\nline", "del\x7f", "ünï", "tab\t"]:
        assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value
    d = decide(CPU_TORCHAO, Choices(model='py:evil:f"\n[launch]\ndevice = "cuda'))
    data = tomllib.loads(render_spec(d))
    assert data["train"]["model"] == 'py:evil:f"\n[launch]\ndevice = "cuda' and data["launch"]["device"] == "cpu"


def test_default_names():
    assert default_name(decide(CPU_TORCHAO, Choices(model="hf:/models/Llama-3.2-1B/config.json"))) == "llama-3.2-1b-fp8-torchao-cpu"
    assert default_name(decide(CPU_TORCHAO, Choices(model="py:my.models:build_model"))) == "build_model-fp8-torchao-cpu"
    assert decide(CPU_TORCHAO, Choices(out="specs/my-run.toml")).name == "my-run"
    assert decide(CPU_TORCHAO, Choices(out="specs/My Run.toml")).name == "llama-debug-fp8-torchao-cpu"


def test_interview_asks_what_was_not_given_with_detected_defaults():
    asked = []

    def ask(prompt, default, options):
        asked.append((prompt, default, options))
        return {"FP8 backend": "msamp"}.get(prompt, default)

    choices = interview(CPU_TORCHAO, Choices(nodes=2), ask)
    assert [a[0] for a in asked] == ["FP8 backend", "Distributed strategy", "Model (builtin:NAME, hf:PATH or py:module:function)",
                                     "Processes per node", "Spec name"]
    assert asked[0] == ("FP8 backend", "torchao", ("torchao", "te", "msamp"))
    assert asked[1][1] == "ddp"  # the msamp answer changed the strategy offered next
    assert asked[3][1] == 8      # and made it a GPU spec: one process per GPU of an 8-GPU node
    assert choices == Choices(backend="msamp", strategy="ddp", model="builtin:llama3-1b", nodes=2, procs_per_node=8,
                              name="llama3-1b-fp8-msamp-ddp")
    # no FP8 here: the backend question is not asked
    asked.clear()
    interview(A100, Choices(), ask)
    assert "FP8 backend" not in [a[0] for a in asked]


# --- the command on this machine ------------------------------------------------------------------


def test_cli_writes_a_cpu_smoke_spec_that_plans(cli, tmp_path):
    result = cli("init")
    assert result.exit_code == 0, result.stderr
    path = tmp_path / "llama-debug-fp8-torchao-cpu.toml"
    assert result.stdout.splitlines()[0] == (f"wrote {path.name}: fp8 torchao tensorwise, fsdp2 + float8 all-gather, "
                                             "1 node x 2 procs on CPU, builtin:llama-debug")
    assert "warning: this machine cannot run it" not in result.stderr
    assert path.read_text() == starter_spec(gather())
    plan = cli("plan", path.name)
    assert plan.exit_code == 0 and "error" not in plan.stderr


def test_cli_refuses_to_overwrite_without_force(cli, tmp_path):
    (tmp_path / "mine.toml").write_text("keep me")
    result = cli("init", "--out", "mine.toml")
    assert result.exit_code == 2
    assert result.stderr == "error: mine.toml already exists; pass --force to overwrite it\n"
    assert (tmp_path / "mine.toml").read_text() == "keep me"
    forced = cli("init", "--out", "mine.toml", "--force", "--procs-per-node", "3")
    assert forced.exit_code == 0
    assert tomllib.loads((tmp_path / "mine.toml").read_text())["distributed"]["procs_per_node"] == 3
    assert tomllib.loads((tmp_path / "mine.toml").read_text())["name"] == "mine"


def test_cli_flags_beyond_this_machine_warn(cli, tmp_path):
    result = cli("init", "--backend", "te", "--nodes", "2", "--out", "te.toml")
    assert result.exit_code == 0
    assert "warning: this machine cannot run it: Transformer Engine and MS-AMP run only on CUDA GPUs" in result.stderr
    assert "warning: this machine cannot run it: the transformer_engine package is not importable here; fix: install it" in result.stderr
    data = tomllib.loads((tmp_path / "te.toml").read_text())
    assert (data["precision"]["te"]["recipe"], data["launch"]["device"], data["distributed"]["procs_per_node"]) == ("current", "auto", 8)
    assert cli("plan", "te.toml").exit_code == 0


def test_cli_refuses_a_known_bad_combination(cli, tmp_path, msamp_stack):
    """Where MS-AMP's own stack is installed, a backend = "msamp" spec is MS-AMP's: it has no FSDP2."""
    result = cli("init", "--backend", "msamp", "--strategy", "fsdp2", "--out", "m.toml")
    assert result.exit_code == 2
    assert result.stderr.startswith("m.toml: error[MSAMP-FSDP2]: MS-AMP supports FSDP1 only")
    assert sorted(os.listdir(tmp_path)) == []  # nothing written, no temporary file left


def test_cli_invalid_name_is_a_located_spec_error(cli, tmp_path):
    result = cli("init", "--name", "Bad Name", "--out", "x.toml")
    assert result.exit_code == 2
    assert result.stderr.startswith("x.toml:5: error: $.name:")
    assert not (tmp_path / "x.toml").exists()


def test_cli_with_gpus_detected(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "gather", lambda: A100)
    result = cli("init", "--out", "a100.toml")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1] == "  bf16, not fp8: FP8 needs compute capability >= 8.9; this GPU has 8.0"
    assert tomllib.loads((tmp_path / "a100.toml").read_text())["distributed"]["procs_per_node"] == 8


def test_interactive_through_a_pty(tmp_path):
    """Drive `fp8launch init` on a real terminal: every value but the name comes by flag, so it asks once."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "init", "--backend", "torchao", "--strategy", "fsdp2", "--model", "builtin:llama-debug",
         "--nodes", "1", "--procs-per-node", "2", "--out", "pty.toml"],
        cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "PYTHONPATH": str(REPO)}, close_fds=True)
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, timeout: float = 60) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {marker!r} within {timeout} s; saw {seen!r}")
            try:
                chunk = os.read(master, 1024)
            except OSError:  # the child closed the terminal
                raise AssertionError(f"exited before {marker!r}; saw {seen!r}") from None
            seen += chunk

    try:
        read_until(b"Spec name [pty]: ")
        os.write(master, b"from-the-prompt\r")
        read_until(b"wrote pty.toml")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        os.close(master)
    data = tomllib.loads((tmp_path / "pty.toml").read_text())
    assert data["name"] == "from-the-prompt" and data["precision"]["backend"] == "torchao"


@pytest.mark.parametrize("model", ["builtin:llama3-8b", "builtin:llama3-1b", "builtin:llama-small"])
def test_the_model_that_fits_comes_from_the_size_table(model):
    from launcher.commands.doctor import Gpu, Machine
    from launcher.commands.init import _fit_model
    from launcher.planning.memory import model_params

    def machine(gib):
        return Machine(python="3.11", torch="2.13", gpus=(Gpu(index=0, name="G", capability=(9, 0), memory_gib=gib),))

    exact = 2 * 16 * model_params(model) / 1024**3  # model states take half of the GPU: exactly the budget
    assert _fit_model(machine(exact), "ddp", 1) == model
    assert _fit_model(machine(exact * 0.999), "ddp", 1) != model


@pytest.mark.parametrize("preset, level, strategy", [("msamp-o1", "O1", "ddp"), ("msamp-o2", "O2", "ddp"), ("msamp-o3", "O3", "fsdp2")])
@pytest.mark.parametrize("machine", [H100X8, CPU_TORCHAO], ids=["h100x8", "cpu"])
def test_msamp_presets_write_the_levels_natively_and_plan(tmp_path, preset, level, strategy, machine):
    """--preset msamp-oN: torchao FP8 with the keys launcher/planning/levels.py gives MS-AMP's level (O1/O2 under DDP,
    where MS-AMP enters them; O3 with FSDP2 and float8 all-gather); the spec plans with no error rule."""
    from launcher.planning.msamp_levels import MSAMP_LEVELS

    d = decide(machine, Choices(preset=preset))
    text = render_spec(d)
    data = tomllib.loads(text)
    p = data["precision"]
    assert (p["mode"], p["backend"], data["distributed"]["strategy"]) == ("fp8", "torchao", strategy)
    for key, value in MSAMP_LEVELS[level].items():
        node = data
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    assert p.get("optimizer_states", "fp32") == ("fp32" if level == "O1" else "fp8")
    assert preset in d.name and f"MS-AMP's {level} level natively" in text
    plan = planned(tmp_path, text).plan
    assert (plan.precision.grad_reduce, plan.precision.master_weights) == ("fp8", "bf16")


def test_a_preset_refuses_the_flags_that_contradict_it(cli, tmp_path):
    r = cli("init", "--preset", "msamp-o3", "--strategy", "ddp", "--out", "x.toml")
    assert r.exit_code == 2 and "--preset msamp-o3 is MS-AMP's O3 level: ZeRO-style sharding, natively FSDP2" in r.stderr
    r = cli("init", "--preset", "msamp-o2", "--backend", "te", "--out", "x.toml")
    assert r.exit_code == 2 and "--backend te contradicts it" in r.stderr
    r = cli("init", "--preset", "msamp-o2", "--strategy", "deepspeed", "--out", "x.toml")
    assert r.exit_code == 2 and "LEVELS-DEEPSPEED" in r.stderr
    assert not (tmp_path / "x.toml").exists()
    r = cli("init", "--preset", "msamp-o2", "--out", "o2.toml")
    assert r.exit_code == 0, r.stderr
    assert 'optimizer_states = "fp8"' in (tmp_path / "o2.toml").read_text()
