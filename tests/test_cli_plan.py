"""`fp8launch plan` as PRODUCT.md says: writes, --check, --diff, --set, --nodes, --format json, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys

from conftest import MINIMAL, REPO, run_module


def test_plan_writes_files_with_modes_and_is_idempotent(cli, spec, tmp_path):
    path = spec(MINIMAL)
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0, r.stderr
    folder = tmp_path / "out" / "t"
    assert sorted(os.listdir(folder)) == [".fp8launch-files.json", "fsdp2.json", "plan.json", "torchrun.sh"]
    assert stat.S_IMODE((folder / "torchrun.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "plan.json").stat().st_mode) == 0o644
    assert "t: out/t/ (4 written, 0 unchanged)" in r.stdout
    # the record: each file fp8launch wrote and the sha256 of its bytes, nothing of this machine
    record = json.loads((folder / ".fp8launch-files.json").read_text())
    assert record["files"] == {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in ("fsdp2.json", "plan.json", "torchrun.sh")}
    assert str(tmp_path) not in (folder / ".fp8launch-files.json").read_text()
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    r = cli("plan", path, "--out", "out")
    assert "t: out/t/ (unchanged)" in r.stdout
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before


def test_check_reports_drift_and_writes_nothing(cli, spec, tmp_path):
    path = spec(MINIMAL)
    r = cli("plan", path, "--out", "out", "--check")
    assert r.exit_code == 1
    assert not (tmp_path / "out").exists()
    assert "would create out/t/plan.json" in r.stderr and "would create out/t/torchrun.sh" in r.stderr
    assert cli("plan", path, "--out", "out").exit_code == 0
    r = cli("plan", path, "--out", "out", "--check")
    assert r.exit_code == 0 and "up to date: 1 spec checked." in r.stderr
    # a file of the user's is noted once, not drift, and stays
    (tmp_path / "out" / "t" / "notes.txt").write_text("mine\n")
    r = cli("plan", path, "--out", "out", "--check")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("notes.txt") == 1
    assert "note: out/t/notes.txt is not a file fp8launch writes; left as it is" in r.stderr
    # a spec change is drift: the file it no longer generates would go, the one it changes would be updated
    r = cli("plan", path, "--out", "out", "--check", "--set", "distributed.strategy=ddp")
    assert r.exit_code == 1
    assert "would update out/t/plan.json" in r.stderr and "would remove out/t/fsdp2.json" in r.stderr
    assert "notes.txt" not in r.stderr.replace("note: out/t/notes.txt is not a file fp8launch writes; left as it is", "")
    # a hand edit is drift where the plan writes the file (plan then needs --force), and the user's where it does not
    (tmp_path / "out" / "t" / "fsdp2.json").write_text("{}\n")
    r = cli("plan", path, "--out", "out", "--check")
    assert r.exit_code == 1
    assert ("would overwrite out/t/fsdp2.json: it changed since fp8launch wrote it (its bytes are not the ones "
            ".fp8launch-files.json records); plan needs --force for that") in r.stderr
    r = cli("plan", path, "--out", "out", "--check", "--set", "distributed.strategy=ddp")
    assert r.exit_code == 1 and "would remove" not in r.stderr
    assert "note: out/t/fsdp2.json changed since fp8launch wrote it" in r.stderr
    assert (tmp_path / "out" / "t" / "fsdp2.json").read_text() == "{}\n"
    assert (tmp_path / "out" / "t" / "notes.txt").read_text() == "mine\n"


def test_switching_strategy_removes_the_stale_generated_file_but_not_user_files(cli, spec, tmp_path):
    path = spec(MINIMAL)
    cli("plan", path, "--out", "out")
    (tmp_path / "out" / "t" / "notes.txt").write_text("mine\n")
    r = cli("plan", path, "--out", "out", "--set", "distributed.strategy=deepspeed")
    assert r.exit_code == 0
    assert sorted(os.listdir(tmp_path / "out" / "t")) == [".fp8launch-files.json", "deepspeed.json", "notes.txt", "plan.json",
                                                           "torchrun.sh"]


def test_diff_prints_unified_diffs_on_stdout(cli, spec, tmp_path):
    path = spec(MINIMAL)
    cli("plan", path, "--out", "out")
    r = cli("plan", path, "--out", "out", "--check", "--diff", "--set", "train.steps=7")
    assert r.exit_code == 1
    assert "--- a/out/t/plan.json\n+++ b/out/t/plan.json\n" in r.stdout
    assert '-    "steps": 100,\n+    "steps": 7,\n' in r.stdout
    assert "would update out/t/plan.json" in r.stderr and "would update" not in r.stdout


def test_diff_alone_writes_nothing(cli, spec, tmp_path):
    path = spec(MINIMAL)
    r = cli("plan", path, "--out", "out", "--diff")
    assert r.exit_code == 0, r.stderr
    assert not (tmp_path / "out").exists()
    assert "+++ b/out/t/plan.json\n" in r.stdout and "would create out/t/plan.json" in r.stderr
    cli("plan", path, "--out", "out")
    before = (tmp_path / "out" / "t" / "plan.json").read_bytes()
    r = cli("plan", path, "--out", "out", "--diff", "--set", "train.steps=7")
    assert r.exit_code == 0 and '+    "steps": 7,\n' in r.stdout
    assert (tmp_path / "out" / "t" / "plan.json").read_bytes() == before


def test_set_and_nodes_override_the_file(cli, spec, tmp_path):
    path = spec(MINIMAL)
    r = cli("plan", path, "--out", "out", "--nodes", "4", "--set", "distributed.procs_per_node=2",
            "--set", 'precision.keep=["lm_head", "*.router"]', "--set", "train.lr=1e-3", "--set", "launch.rdzv_endpoint=h1:29400")
    assert r.exit_code == 0, r.stderr
    plan = json.loads((tmp_path / "out" / "t" / "plan.json").read_text())
    assert plan["distributed"]["nodes"] == 4 and plan["derived"]["world_size"] == 8
    assert plan["precision"]["keep"] == ["lm_head", "*.router"]
    assert plan["train"]["lr"] == 0.001
    assert plan["launch"]["rdzv_endpoint"] == "h1:29400"
    assert plan["overrides"] == ["distributed.procs_per_node=2", 'precision.keep=["lm_head", "*.router"]', "train.lr=1e-3",
                                 "launch.rdzv_endpoint=h1:29400", "distributed.nodes=4"]


def test_format_json_prints_one_object_per_spec(cli, spec, tmp_path):
    a = spec(MINIMAL, name="a.toml")
    b = spec('version = 1\nname = "b"\n[precision]\nmode = "fp8"\n[precision.torchao]\nskip_small = false\n', name="b.toml")
    r = cli("plan", a, b, "--out", "out", "--format", "json")
    assert r.exit_code == 0
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["name"] for x in records] == ["t", "b"]
    assert records[0]["plan"]["derived"]["world_size"] == 8
    assert {f["path"]: f["status"] for f in records[0]["files"]} == {
        "out/t/plan.json": "create", "out/t/torchrun.sh": "create", "out/t/fsdp2.json": "create", "out/t/.fp8launch-files.json": "create"}
    assert records[0]["warnings"] == []
    assert [w["rule"] for w in records[1]["warnings"]] == ["FP8-NO-COMPILE", "FP8-NO-GAIN"]
    assert records[1]["warnings"][1]["fix"].startswith("keep the small Linears in high precision")  # the fix for this plan


def test_toml_and_json_specs_mean_the_same(cli, spec, tmp_path):
    toml = spec('version = 1\nname = "same"\n[precision]\nmode = "fp16"\n[train]\nsteps = 5\n', name="s.toml")
    json_path = spec(json.dumps({"version": 1, "name": "same", "precision": {"mode": "fp16"}, "train": {"steps": 5}}), name="s.json")
    cli("plan", toml, "--out", "a")
    cli("plan", json_path, "--out", "b")
    pa = json.loads((tmp_path / "a/same/plan.json").read_text())
    pb = json.loads((tmp_path / "b/same/plan.json").read_text())
    assert pa.pop("spec_sha256") != pb.pop("spec_sha256")
    assert pa == pb


def test_atomic_writes_leave_no_temporary_files_and_failures_keep_old_files(cli, spec, tmp_path):
    path = spec(MINIMAL)
    cli("plan", path, "--out", "out")
    folder = tmp_path / "out" / "t"
    old = (folder / "plan.json").read_bytes()
    r = cli("plan", path, "--out", "out", "--set", "train.steps=-1")
    assert r.exit_code == 2
    assert (folder / "plan.json").read_bytes() == old
    assert not [n for n in os.listdir(folder) if n.startswith(".tmp")]


def test_set_takes_a_string_key_as_written(cli, spec, tmp_path):
    """launch.env values are strings: `--set launch.env.OMP_NUM_THREADS=1` sets "1" (it failed: "expected a string, got
    integer 1"); a number key still parses as TOML and a bad one is still refused."""
    path = spec(MINIMAL)
    r = cli("plan", path, "--out", "out", "--format", "json", "--set", "launch.env.OMP_NUM_THREADS=1",
            "--set", "launch.env.NCCL_DEBUG=true", "--set", "train.steps=7")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout.splitlines()[0])["plan"]
    assert plan["launch"]["env"] == {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "true"} and plan["train"]["steps"] == 7
    r = cli("plan", path, "--out", "out", "--set", "train.steps=seven")
    assert r.exit_code == 2 and 'expected an integer, got string "seven" (from --set train.steps=seven)' in r.stderr


def test_nothing_is_written_outside_out_name(cli, spec, tmp_path):
    path = spec(MINIMAL.replace("[launch]", '[launch]\nenv = {X = "../../../../tmp/evil"}')
                + '[train]\noutput_dir = "/tmp/elsewhere-{name}"\n')
    before = set(os.listdir(tmp_path))
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0
    assert set(os.listdir(tmp_path)) - before == {"out"}
    assert os.listdir(tmp_path / "out") == ["t"]
    assert not os.path.exists("/tmp/elsewhere-t")


def test_python_m_launcher_is_the_same_cli(tmp_path):
    r = run_module("--help", cwd=tmp_path)
    assert r.returncode == 0 and "plan" in r.stdout and "Exit codes" in r.stdout
    r = run_module("plan", "--help", cwd=tmp_path)
    assert "--check" in r.stdout and "3    this environment cannot run the plan" in r.stdout


def test_every_exit_code_is_in_the_help_epilog_of_every_command(tmp_path):
    from launcher.errors import EXIT_CODES

    assert set(EXIT_CODES) == {0, 1, 2, 3, 4, 75, 130}
    for command in ("plan", "run", "bench", "tune", "doctor", "init", "report"):
        out = " ".join(run_module(command, "--help", cwd=tmp_path).stdout.split())
        for code, meaning in EXIT_CODES.items():
            assert f"{code} {' '.join(meaning.split())}" in out, (command, code)


def test_plan_never_imports_torch(tmp_path):
    """`python -X importtime` lists every module imported while planning every ready-made spec."""
    specs = sorted(str(p) for p in (REPO / "specs").glob("*.toml"))
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "plan", "--out", str(tmp_path), *specs],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "jsonschema" in imported and "jinja2" in imported  # the measurement sees real imports
    assert not imported & {"torch", "torchao", "deepspeed", "transformer_engine", "msamp", "numpy", "transformers"}


def test_default_out_comes_from_pyproject(cli, spec, tmp_path):
    path = spec(MINIMAL)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.fp8launch]\nout = "specs/generated"\n')
    assert cli("plan", path).exit_code == 0
    assert sorted(os.listdir(tmp_path / "specs" / "generated" / "t")) == [".fp8launch-files.json", "fsdp2.json", "plan.json", "torchrun.sh"]
    assert cli("plan", "--check", path).exit_code == 0
    (tmp_path / "pyproject.toml").write_text("[tool.fp8launch]\nout = 3\n")
    r = cli("plan", path)
    assert r.exit_code == 2 and "[tool.fp8launch] out must be a folder name" in r.stderr


def test_default_out_without_pyproject_is_generated(cli, spec, tmp_path):
    assert cli("plan", spec(MINIMAL)).exit_code == 0
    assert (tmp_path / "generated" / "t" / "plan.json").exists()


def test_the_repository_checks_its_committed_configs_without_out():
    r = run_module("plan", "--check", *sorted(str(p.relative_to(REPO)) for p in (REPO / "specs").glob("*.toml")), cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_the_engine_line_names_expert_parallelism_and_its_mesh(cli, spec):
    path = spec('version = 1\nname = "ep"\n[precision]\nmode = "fp8"\n[precision.torchao]\nrecipe = "mxfp8"\n[distributed]\n'
                'procs_per_node = 4\nexpert_parallel = 2\n[launch]\ndevice = "cpu"\n[train]\nmodel = "builtin:moe-debug"\n')
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0, r.stderr
    assert "  engine      fsdp2, 1 node x 4 = world size 4, expert parallel 2 (mesh efsdp 2 x ep 2)\n" in r.stdout


def test_plan_says_which_layers_it_keeps_beyond_every_linear_but_the_output_layer(cli, spec):
    """The field's default (torchtitan's filter_fqns, Megatron's TE layers) runs every Linear but the output layer in
    FP8; the plan counts the layers and says which ones it keeps beyond that, and why."""
    small = spec('version = 1\nname = "d"\n[precision]\nmode = "fp8"\n[precision.torchao]\nskip_small = false\n[launch]\ndevice = "cpu"\n')
    r = cli("plan", small, "--out", "out")
    assert "  fp8 layers  27 of 29, 84% of the layers' GEMM FLOPs\n" in r.stdout
    assert ("kept beyond every Linear but the output layer (torchtitan's, Megatron's default): layers.0.attention.wq "
            "(precision.keep_first_last)\n") in r.stdout
    big = spec('version = 1\nname = "b"\n[precision]\nmode = "fp8"\nkeep_first_last = false\n'
               '[train]\nmodel = "builtin:llama3-8b"\n', name="b.toml")
    r = cli("plan", big, "--out", "out")
    # torchao's size rule keeps the 4096 -> 1024 wk / wv of the 32 blocks; the head runs in FP8 here
    assert "  fp8 layers  161 of 225, " in r.stdout and ": 64 by precision.torchao.skip_small\n" in r.stdout


# -- the record: what fp8launch wrote, and nothing else, is fp8launch's to replace or remove ----------------------------

def _record(folder):
    return json.loads((folder / ".fp8launch-files.json").read_text())["files"]


def test_force_overwrites_the_users_file_which_is_then_fp8launchs(cli, spec, tmp_path):
    path = spec(MINIMAL)
    folder = tmp_path / "out" / "t"
    folder.mkdir(parents=True)
    (folder / "deepspeed.json").write_text("mine\n")
    assert cli("plan", path, "--out", "out").exit_code == 0
    assert "deepspeed.json" not in _record(folder) and (folder / "deepspeed.json").read_text() == "mine\n"
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    r = cli("plan", path, "--out", "out", "--set", "distributed.strategy=deepspeed")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "error: out/t/deepspeed.json was not written by fp8launch (it is not in .fp8launch-files.json)" in r.stderr
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before  # nothing written, plan.json included
    r = cli("plan", path, "--out", "out", "--set", "distributed.strategy=deepspeed", "--force")
    assert r.exit_code == 0, r.stderr
    assert json.loads((folder / "deepspeed.json").read_text())["zero_optimization"]["stage"] == 2
    assert _record(folder)["deepspeed.json"] == hashlib.sha256((folder / "deepspeed.json").read_bytes()).hexdigest()
    assert sorted(os.listdir(folder)) == [".fp8launch-files.json", "deepspeed.json", "plan.json", "torchrun.sh"]
    assert cli("plan", path, "--out", "out").exit_code == 0  # now fp8launch's: removed when the plan stops writing it
    assert sorted(os.listdir(folder)) == [".fp8launch-files.json", "fsdp2.json", "plan.json", "torchrun.sh"]


def test_force_replaces_a_link_never_what_it_leads_to(cli, spec, tmp_path):
    path = spec(MINIMAL)
    (tmp_path / "theirs.json").write_text("theirs\n")
    (tmp_path / "out" / "t").mkdir(parents=True)
    os.symlink("../../theirs.json", tmp_path / "out" / "t" / "plan.json")
    assert cli("plan", path, "--out", "out").exit_code == 2
    assert cli("plan", path, "--out", "out", "--force").exit_code == 0
    assert not (tmp_path / "out" / "t" / "plan.json").is_symlink()
    assert json.loads((tmp_path / "out" / "t" / "plan.json").read_text())["name"] == "t"
    assert (tmp_path / "theirs.json").read_text() == "theirs\n"


def test_a_file_of_fp8launchs_is_replaced_whatever_its_own_mode(cli, spec, tmp_path):
    """The record and the folder decide, as for git: a read-only file fp8launch wrote is replaced (rename)."""
    path = spec(MINIMAL)
    cli("plan", path, "--out", "out")
    plan_json = tmp_path / "out" / "t" / "plan.json"
    plan_json.chmod(0o444)
    assert cli("plan", path, "--out", "out", "--set", "train.steps=7").exit_code == 0
    assert json.loads(plan_json.read_text())["train"]["steps"] == 7 and stat.S_IMODE(plan_json.stat().st_mode) == 0o644


def _as_before_the_record(folder, version="0.0.1"):
    (folder / ".fp8launch-files.json").unlink()
    text = (folder / "plan.json").read_text()
    (folder / "plan.json").write_text(text.replace('"fp8launch_version": "', f'"fp8launch_version": "{version}-'))


def test_a_folder_from_before_the_record_loses_only_what_its_plan_generated(cli, spec, tmp_path):
    """No record: the folder's own plan.json (fp8launch's: spec_sha256, fp8launch_version) names what that plan wrote;
    those files are fp8launch's (updated, or removed when stale), any other file of a generated name is the user's."""
    path = spec(MINIMAL)
    folder = tmp_path / "out" / "t"
    cli("plan", path, "--out", "out", "--set", "distributed.strategy=deepspeed")
    _as_before_the_record(folder)
    (folder / "slurm.sbatch").write_text("mine\n")  # not what a torchrun plan generates: the user's
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0, r.stderr
    assert sorted(os.listdir(folder)) == [".fp8launch-files.json", "fsdp2.json", "plan.json", "slurm.sbatch", "torchrun.sh"]
    files = json.loads(cli("plan", path, "--out", "out", "--check", "--format", "json").stdout)["files"]
    assert {"path": "out/t/slurm.sbatch", "status": "kept",
            "why": "was not written by fp8launch (it is not in .fp8launch-files.json)"} in files
    assert (folder / "slurm.sbatch").read_text() == "mine\n" and "note: out/t/slurm.sbatch was not written by fp8launch" in r.stderr
    assert sorted(_record(folder)) == ["fsdp2.json", "plan.json", "torchrun.sh"]
    # a plan.json of fp8launch's that this version cannot read back vouches for what every plan writes, no more
    cli("plan", path, "--out", "out", "--set", "distributed.strategy=deepspeed")
    _as_before_the_record(folder)
    plan = json.loads((folder / "plan.json").read_text())
    (folder / "plan.json").write_text(json.dumps({"spec_sha256": plan["spec_sha256"], "fp8launch_version": "0.0.1", "x": 1}))
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0, r.stderr
    assert "note: out/t/deepspeed.json was not written by fp8launch" in r.stderr and (folder / "deepspeed.json").is_file()
    assert json.loads((folder / "plan.json").read_text())["name"] == "t"


def test_a_failed_write_leaves_the_folder_as_it_was(cli, spec, tmp_path, monkeypatch):
    """Every file is staged before the first rename: a full disk on the second leaves the old files, and no temporary."""
    import errno
    import tempfile

    from launcher.targets import files

    path = spec(MINIMAL)
    cli("plan", path, "--out", "out")
    folder = tmp_path / "out" / "t"
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    made = []

    def mkstemp(**kwargs):
        if made:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(kwargs["dir"], ".tmp-x"))
        made.append(1)
        return tempfile.mkstemp(**kwargs)

    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp)
    r = cli("plan", path, "--out", "out", "--set", "train.steps=7", "--set", "distributed.strategy=ddp")
    assert r.exit_code == 3
    mount = r.stderr.rsplit(" free on ", 1)[-1].split(")", 1)[0]  # this disk is not full: the mkstemp above said so
    assert re.fullmatch(rf"error: no space left on device writing out/t/ \([\d,]+ bytes free on {re.escape(mount)}\); fix: free space on "
                        rf"{re.escape(mount)}, or point --out at a folder on another filesystem\n", r.stderr), r.stderr
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before


def test_every_name_a_plan_writes_is_a_generated_name(spec, tmp_path):
    from launcher.commands.plan import plan_one
    from launcher.targets.files import GENERATED_NAMES

    written = set()
    for sets in (["distributed.strategy=deepspeed", "launch.launcher=slurm", "export.accelerate=true"],
                 ["launch.launcher=kubernetes", 'launch.kubernetes.image="img:1"', 'launch.kubernetes.volume_claim="c"'],
                 ["distributed.strategy=ddp", "launch.launcher=kubernetes", 'launch.kubernetes.api="pytorchjob"',
                  'launch.kubernetes.image="img:1"', 'launch.kubernetes.volume_claim="c"']):
        written |= set(plan_one(spec(MINIMAL), str(tmp_path / "out"), sets).files)
    assert written == set(GENERATED_NAMES)
