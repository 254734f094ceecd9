"""`fp8launch doctor`: the pure assessment on synthetic machines, the real `gather()` here, the CLI."""

from __future__ import annotations

import builtins
import dataclasses
import json
from importlib import metadata

import pytest

from conftest import REPO, run_module
from launcher.commands import doctor
from launcher.commands.doctor import ROWS, Gpu, Machine, assess, assess_plan, diagnose, gather, synthetic_plan
from launcher.planning.backends import TE
from launcher.planning.hardware import supports
from launcher.planning.install import INSTALL
from launcher.planning.msamp_levels import native_keys
from launcher.planning.rules import Facts, check

ALL = {"torchao": "0.18.0", "transformer_engine": "2.20.2", "deepspeed": "0.19.8", "msamp": "0.4.0",
       "transformers": "4.57.0", "accelerate": "1.10.0"}


def gpu_machine(name: str, cc: tuple[int, int], count: int = 8, memory: float = 79.2, **packages) -> Machine:
    return Machine(python="3.11.7", platform="Linux x86_64", torch="2.11.0", torch_cuda="13.0", cuda_available=True,
                   gpus=tuple(Gpu(index=i, name=name, capability=cc, memory_gib=memory) for i in range(count)),
                   packages=packages)


def cpu_machine(**packages) -> Machine:
    return Machine(python="3.11.7", platform="Linux x86_64", torch="2.13.0+cpu", packages=packages, cpus=2)


H100_TE = gpu_machine("NVIDIA H100 80GB HBM3", (9, 0), transformer_engine="2.20.2")
A100 = gpu_machine("NVIDIA A100-SXM4-80GB", (8, 0), **ALL)
CPU_TORCHAO = cpu_machine(torchao="0.18.0", deepspeed="0.19.8")
NO_TORCH = Machine(python="3.11.7", platform="Linux x86_64")


def rows(machine: Machine) -> dict[str, doctor.Support]:
    return {s.label: s for s in assess(machine)}


def test_every_row_is_answered_once():
    labels = [s.label for s in assess(CPU_TORCHAO)]
    assert labels == [" ".join(x for x in row if x) for row in ROWS]
    assert len(labels) == 5 + 5 + 3 + 2


def test_h100_with_te():
    r = rows(H100_TE)
    assert r["fp8 te block"].supported and r["fp8 te current"].supported and r["fp8 te delayed"].supported
    assert r["fp8 te block"].note == "on 8 x NVIDIA H100 80GB HBM3 (compute capability 9.0)"
    for recipe in ("mxfp8", "nvfp4"):
        s = r[f"fp8 te {recipe}"]
        assert not s.supported and s.rules == ("TE-RECIPE-HARDWARE",)
        needs = "compute capability >= 10.0" + (" and below 12.0" if recipe == "mxfp8" else "")
        assert s.reasons == (f"TE recipe {recipe!r} needs {needs}; this GPU has 9.0; "
                             'fix: set precision.te.recipe = "current" (or "delayed"), or run on a newer GPU',)
    # torchao is not installed on this machine: the reason says what to install
    assert r["fp8 torchao tensorwise"].reasons == (f"the torchao package is not importable here; fix: install it: {INSTALL['torchao']}",)
    # msamp O3 needs MS-AMP and DeepSpeed
    assert r["fp8 msamp O3"].rules == ("BACKEND-MISSING",)
    assert [x.split(" package")[0] for x in r["fp8 msamp O3"].reasons] == ["the msamp", "the deepspeed"]
    assert r["bf16"].supported and r["fp16"].supported
    assert diagnose(H100_TE).problem is None


def test_a100_runs_no_fp8_even_with_every_package():
    r = rows(A100)
    fp8 = [s for s in r.values() if s.fp8]
    assert len(fp8) == 13 and not any(s.supported for s in fp8)
    assert all(s.rules[0] == "FP8-HARDWARE" for s in fp8)  # the hardware reason comes first
    assert r["fp8 torchao rowwise"].reasons == (
        'FP8 needs compute capability >= 8.9; this GPU has 8.0; fix: set precision.mode = "bf16", '
        'or run on an sm89+ GPU (L4, L40, H100, H200, B200)',)
    assert r["fp8 te block"].rules == ("FP8-HARDWARE", "TE-RECIPE-HARDWARE")
    assert r["bf16"].supported and r["bf16"].device == "cuda"
    # the exit-3 message names only what helps: no package would
    problem = diagnose(A100).problem
    assert problem.splitlines() == [
        "no FP8 backend can run here:",
        '  - FP8 needs compute capability >= 8.9; this GPU has 8.0; fix: set precision.mode = "bf16", '
        'or run on an sm89+ GPU (L4, L40, H100, H200, B200)',
        '  - bf16 runs here: set precision.mode = "bf16"',
    ]


def test_cpu_with_torchao():
    r = rows(CPU_TORCHAO)
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        s = r[f"fp8 torchao {recipe}"]
        assert s.supported and s.device == "cpu"
        assert "_scaled_mm" in s.note and "not for speed" in s.note
    assert not r["fp8 te current"].supported and r["fp8 te current"].rules == ("CPU-BACKEND", "BACKEND-MISSING")
    # MS-AMP is not installed: its O1 / O2 under DDP are planned as their native keys, torchao's FP8, which runs here
    for level in ("O1", "O2"):
        assert r[f"fp8 msamp {level}"].supported and r[f"fp8 msamp {level}"].note.endswith(native_keys(level))
    # O3 uses DeepSpeed (installed here), which the native levels cannot express: only MS-AMP itself and the CPU are missing
    assert r["fp8 msamp O3"].rules == ("CPU-BACKEND", "BACKEND-MISSING") and len(r["fp8 msamp O3"].reasons) == 2
    assert r["bf16"].supported and r["bf16"].note == "on CPU: for tests and smoke runs"
    assert diagnose(CPU_TORCHAO).problem is None


def test_cpu_without_torchao_says_what_to_install():
    problem = diagnose(cpu_machine()).problem
    assert problem.splitlines()[1] == f"  - torchao: the torchao package is not importable here; fix: install it: {INSTALL['torchao']}"
    assert "te: Transformer Engine and MS-AMP run only on CUDA GPUs" in problem
    assert problem.splitlines()[-1] == '  - bf16 runs here: set precision.mode = "bf16"'


def test_no_torch_at_all():
    r = rows(NO_TORCH)
    assert not any(s.supported for s in r.values())
    torch_reason = "the torch package is not importable here; fix: install it: pip install torch"
    assert all(s.reasons[0].startswith(torch_reason) for s in r.values())
    problem = diagnose(NO_TORCH).problem.splitlines()
    assert problem[1].startswith("  - " + torch_reason)  # said once, before what each backend lacks
    assert sum(torch_reason in line for line in problem) == 1
    assert "not installed: pip install torch" in diagnose(NO_TORCH).text()


def test_every_row_runs_on_a_b200_with_everything():
    """The synthetic plans trip no rule of their own: only the machine says no."""
    b200 = gpu_machine("NVIDIA B200", (10, 0), **ALL)
    assert [s.label for s in assess(b200) if not s.supported] == []


def test_l4_runs_fp8_but_not_block_scaling():
    r = rows(gpu_machine("NVIDIA L4", (8, 9), count=1, memory=22.0, **ALL))
    assert r["fp8 torchao tensorwise"].supported and r["fp8 te current"].supported
    assert not r["fp8 te block"].supported and "needs compute capability >= 9.0" in r["fp8 te block"].reasons[0]


def test_v100_has_no_bf16():
    r = rows(gpu_machine("Tesla V100-SXM2-32GB", (7, 0), count=1, memory=32.0))
    assert not r["bf16"].supported
    assert r["bf16"].reasons == ('bf16 needs compute capability >= 8.0 (Ampere); this GPU has 7.0; fix: set precision.mode = "fp16" '
                                 '(or precision.high_precision = "fp16")',)
    assert r["fp16"].supported


@pytest.mark.parametrize("cc", [(7, 0), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)])
def test_hardware_thresholds_agree_with_the_rule_table(cc):
    """launcher.planning.hardware holds the thresholds the rules use; until rules.py imports them, this pins both."""
    for recipe in ("delayed", "current", *TE.capability):
        plan = synthetic_plan("fp8", "te", recipe, 1)
        fired = {f.rule.id for f in check(Facts(plan=plan, device="cuda", capability=cc), "run")}
        assert bool(fired & {"FP8-HARDWARE", "TE-RECIPE-HARDWARE"}) != supports(cc, "fp8", "te", recipe), recipe
    torchao = synthetic_plan("fp8", "torchao", "tensorwise", 1)
    fired = {f.rule.id for f in check(Facts(plan=torchao, device="cuda", capability=cc), "run")}
    assert ("FP8-HARDWARE" in fired) != supports(cc, "fp8", "torchao")


def test_mxfp8_is_refused_on_consumer_blackwell():
    r = rows(gpu_machine("NVIDIA GeForce RTX 5090", (12, 0), count=1, memory=32.0, **ALL))
    assert r["fp8 te nvfp4"].supported and r["fp8 torchao tensorwise"].supported
    assert not r["fp8 te mxfp8"].supported
    assert "needs compute capability >= 10.0 and below 12.0; this GPU has 12.0;" in r["fp8 te mxfp8"].reasons[0]


def test_a_spec_asking_for_cuda_or_too_many_gpus():
    from dataclasses import replace

    plan = synthetic_plan("bf16", None, None, 8)
    cuda_plan = replace(plan, launch=replace(plan.launch, device="cuda"))
    s = assess_plan(CPU_TORCHAO, cuda_plan)
    assert not s.supported and s.device is None
    assert s.reasons[0].startswith('launch.device = "cuda" but torch sees no CUDA GPU here')
    s = assess_plan(gpu_machine("NVIDIA H100", (9, 0), count=2), plan)
    assert s.reasons == ("distributed.procs_per_node = 8 but this machine has 2 GPUs; fix: set distributed.procs_per_node = 2",)


# --- this machine ---------------------------------------------------------------------------------


def test_gather_on_this_machine():
    import torch

    m = gather()
    assert m.torch == torch.__version__
    assert m.torch_cuda == torch.version.cuda
    assert m.gpus == () and m.cuda_available is False  # the CPU machine the tests run on
    assert m.packages["torchao"] == metadata.version("torchao")
    assert m.packages["deepspeed"] == metadata.version("deepspeed")
    assert m.packages["transformer_engine"] is None and m.packages["msamp"] is None
    assert m.device == "cpu" and m.capability is None and m.cpus >= 1


def test_gather_survives_a_broken_torch(monkeypatch):
    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "torch":
            raise RuntimeError("CUDA driver initialization failed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    m = gather()
    assert m.torch is None and m.gpus == ()
    assert m.notes == ("torch is installed but fails to import: RuntimeError: CUDA driver initialization failed",)
    assert m.packages["torchao"] == metadata.version("torchao")


def test_installed_but_not_importable_is_reported(monkeypatch):
    from importlib import util

    monkeypatch.setattr(util, "find_spec", lambda name: None)
    notes: list[str] = []
    assert doctor._installed_version("deepspeed", notes) is None
    assert notes == [f"deepspeed {metadata.version('deepspeed')} is installed but not importable; reinstall it: {INSTALL['deepspeed']}"]


def test_cli_json_here(cli):
    result = cli("doctor", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    import torch

    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["gpus"] == []
    assert data["fp8_usable"] is True and data["problem"] is None and data["spec"] is None
    support = {s["label"]: s for s in data["support"]}
    assert support["fp8 torchao tensorwise"]["supported"] is True and support["fp8 torchao tensorwise"]["device"] == "cpu"
    assert support["fp8 te mxfp8"]["supported"] is False and "CPU-BACKEND" in support["fp8 te mxfp8"]["rules"]


def test_cli_text_here(cli):
    result = cli("doctor")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert f"torchao              {metadata.version('torchao')}" in lines
    assert any(line.startswith("fp8 torchao tensorwise") and " yes " in line for line in lines)
    assert any(line.startswith("fp8 te: every recipe") and " no " in line for line in lines)


def test_cli_text_says_a_reason_shared_by_every_recipe_once(cli, monkeypatch):
    monkeypatch.setattr(doctor, "gather", lambda: CPU_TORCHAO)
    result = cli("doctor")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    te = [line for line in lines if line.startswith("fp8 te")]
    assert te == ["fp8 te: every recipe               no    Transformer Engine and MS-AMP run only on CUDA GPUs; torchao FP8 is the "
                  "backend that runs on CPU; fix: set precision.backend = \"torchao\", or launch.device = \"cuda\""]
    assert sum("the transformer_engine package is not importable here" in line for line in lines) == 1
    # each MS-AMP opt level says its own native equivalent (launcher/planning/levels.py): one row per level; O1 and O2
    # run as it, O3 (MS-AMP's DeepSpeed integration, which they cannot express) names it in its fix
    assert sum("the msamp package is not importable here" in line for line in lines) == 1
    msamp = [line for line in lines if line.startswith("fp8 msamp")]
    assert [line.split()[:4] for line in msamp] == [["fp8", "msamp", "O1", "yes"], ["fp8", "msamp", "O2", "yes"],
                                                    ["fp8", "msamp", "O3", "no"]]
    assert msamp[0].endswith('as its native levels: precision.backend = "torchao", precision.grad_reduce = "fp8", '
                             'precision.master_weights = "bf16"')
    assert msamp[1].endswith('precision.optimizer_states = "fp8"')
    assert 'distributed.strategy = "fsdp2", precision.torchao.fsdp_float8_all_gather = true' in msamp[2]
    assert [line.split()[:3] for line in lines if line.startswith("fp8 torchao") and "natively" not in line] == [
        ["fp8", "torchao", "tensorwise"], ["fp8", "torchao", "rowwise"], ["fp8", "torchao", "rowwise_with_gw_hp"],
        ["fp8", "torchao", "mxfp8"], ["fp8", "torchao", "nvfp4"]]


def test_torchao_block_recipes_run_where_torchao_can_run_them():
    cpu = rows(CPU_TORCHAO)
    assert cpu["fp8 torchao mxfp8"].supported  # emulated kernels: real numerics, not speed
    assert not cpu["fp8 torchao nvfp4"].supported and cpu["fp8 torchao nvfp4"].rules == ("TORCHAO-NVFP4-CPU",)
    h100 = rows(gpu_machine("NVIDIA H100 80GB HBM3", (9, 0), **ALL))
    assert h100["fp8 torchao tensorwise"].supported
    for recipe in ("mxfp8", "nvfp4"):
        assert h100[f"fp8 torchao {recipe}"].rules == ("TORCHAO-BLOCK-HARDWARE",)
        assert h100[f"fp8 torchao {recipe}"].reasons[0].startswith(
            f"torchao recipe '{recipe}' needs compute capability >= 10.0; this GPU has 9.0; fix: ")
    b200 = rows(gpu_machine("NVIDIA B200", (10, 0), **ALL))
    assert b200["fp8 torchao mxfp8"].supported and b200["fp8 torchao nvfp4"].supported


def test_cli_exit_3_without_fp8(cli, monkeypatch):
    monkeypatch.setattr(doctor, "gather", lambda: A100)
    result = cli("doctor", "--format", "json")
    assert result.exit_code == 3
    assert json.loads(result.stdout)["fp8_usable"] is False
    assert result.stderr.startswith("error: no FP8 backend can run here:\n  - FP8 needs compute capability >= 8.9; this GPU has 8.0;")


def test_cli_spec(cli, monkeypatch):
    assert cli("doctor", "--spec", str(REPO / "specs/cpu-smoke.toml")).exit_code == 0
    te = cli("doctor", "--format", "json", "--spec", str(REPO / "specs/te-current-fsdp2-compile.toml"))
    assert te.exit_code == 3
    assert json.loads(te.stdout)["spec"]["rules"] == ["CPU-BACKEND", "BACKEND-MISSING"]
    assert "fp8 te current cannot run here" in te.stderr and f"{INSTALL['transformer_engine']}" in te.stderr
    # a bf16 spec on the A100 node: no FP8 anywhere, yet the spec runs, so exit 0
    monkeypatch.setattr(doctor, "gather", lambda: A100)
    bf16 = cli("doctor", "--spec", str(REPO / "specs/bf16-baseline.toml"))
    assert bf16.exit_code == 0, bf16.stderr
    assert bf16.stdout.splitlines()[-1].endswith("bf16-baseline.toml: bf16: yes, on 8 x NVIDIA A100-SXM4-80GB (compute capability 8.0)")


def test_cli_spec_that_is_invalid_exits_2(cli, spec):
    path = spec('version = 1\nname = "x"\n[precision]\nmode = "fp9"\n')
    result = cli("doctor", "--spec", path)
    assert result.exit_code == 2 and "$.precision.mode" in result.stderr


def test_python_m_launcher_doctor(tmp_path):
    proc = run_module("doctor", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["machine"]["packages"]["torchao"] == metadata.version("torchao")


def test_msamp_levels_natively_are_rows_of_their_own():
    """MS-AMP's opt levels as `init --preset` writes them (torchao FP8 + the level keys): they run where torchao does,
    and name torchao where it is missing (the low-bit Adam is torchao's)."""
    here = doctor.diagnose(CPU_TORCHAO)
    assert [(s.label, s.supported) for s in here.levels] == [
        ("fp8 torchao msamp-o1 natively", True), ("fp8 torchao msamp-o2 natively", True), ("fp8 torchao msamp-o3 natively", True)]
    assert "MS-AMP's levels natively (fp8launch init --preset ...; docs/precision.md):" in here.text()
    assert [s["label"] for s in here.to_json()["levels"]] == [s.label for s in here.levels]
    without = doctor.diagnose(dataclasses.replace(CPU_TORCHAO, packages={**CPU_TORCHAO.packages, "torchao": None}))
    assert all(not s.supported and "BACKEND-MISSING" in s.rules for s in without.levels)
    bf16 = doctor.level_plan("msamp-o2")
    assert "torchao" in doctor.packages_needed(dataclasses.replace(bf16, precision=dataclasses.replace(bf16.precision, mode="bf16")))


def test_a_cpu_without_fast_bf16_matmuls_is_named_and_one_with_them_says_onednn():
    """doctor's row for the CPU's bf16 matmuls: torch 2.13 sends them to oneDNN only with AVX-512, AVX-NE-CONVERT or AMX,
    and runs ATen's reference loops elsewhere (bf16 and FP8 CPU runs tens of times slower there)."""
    slow = diagnose(dataclasses.replace(cpu_machine(), cpu_bf16_gemm=False)).text()
    assert "CPU bf16 matmuls     ATen's reference loops: this CPU has no AVX-512, AVX-NE-CONVERT or AMX" in slow
    assert "CPU bf16 matmuls     oneDNN" in diagnose(dataclasses.replace(cpu_machine(), cpu_bf16_gemm=True)).text()
    assert "CPU bf16 matmuls" not in diagnose(NO_TORCH).text()


def test_gather_asks_torch_whether_bf16_matmuls_use_onednn():
    """torch's own check (measured what it means, 512^3 on one thread: with it 0.57 ms bf16 against 2.8 ms fp32 on an
    AVX-512 EPYC; without it 215 against 5.2 on an AVX2-only one; benchmarks/results/ci_time*.md)."""
    import torch

    m = gather()
    assert m.cpu_bf16_gemm is (torch.ops.mkldnn._is_mkldnn_bf16_supported() and torch.backends.mkldnn.is_available())
    assert "cpu_bf16_gemm" in m.to_json()
