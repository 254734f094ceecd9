"""No spec value can execute in a generated script. The scripts run for real, with torchrun,
srun, scontrol and hostname replaced by recorders on PATH that write down exactly what they got.
Every string field of the schema is tried (walked by tests/hostile/specs.py, so a key added later is
covered): a control character is refused naming the key, and whatever else a field takes reaches the
rendered files as data: each parses (bash -n, JSON, YAML), each script runs only the template's commands,
each #SBATCH line is one sbatch argument."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess

import pytest
import yaml

from launcher.commands.plan import plan_one
from launcher.errors import SpecError
from launcher.planning.read import SpecSource, Validator, schema, validate
from tests.hostile.specs import MAP_KEY, base, put, string_fields

NASTY = [
    "$(touch PWNED-subst)",
    "`touch PWNED-backtick`",
    "a; touch PWNED-semicolon",
    "it's \"quoted\" \\ back",
    "${HOME} $PATH * ?",
    "| touch PWNED-pipe &",
]

RECORDER = """#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
if name == "srun" and "hostname" in sys.argv:
    print("127.0.0.1"); sys.exit(0)
if name == "scontrol":
    print("node1\\nnode2"); sys.exit(0)
with open(os.environ["RECORD"], "a") as f:
    env = {k: os.environ.get(k) for k in os.environ.get("WATCH", "").split(",") if k}
    f.write(json.dumps({"cmd": name, "argv": sys.argv[1:], "env": env}) + "\\n")
"""


@pytest.fixture
def recorders(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "srun", "scontrol", "python", "python3"):
        path = bin_dir / name
        path.write_text(RECORDER.replace("#!/usr/bin/env python3", f"#!{os.path.realpath(__import__('sys').executable)}"))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _spec(tmp_path, launcher: str) -> str:
    env = {f"V{i}": v for i, v in enumerate(NASTY)}
    text = "\n".join([
        "version = 1",
        'name = "inj"',
        "[launch]",
        f'launcher = "{launcher}"',
        "env = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}",
        "[launch.slurm]",
        f"extra_sbatch = {json.dumps(['--comment=$(touch PWNED-sbatch)', '--begin=now;touch PWNED-x'])}",
        "[train]",
        f"output_dir = {json.dumps('runs/$(touch PWNED-outdir) `x` ; y')}",
        f"data = {json.dumps('text:/tmp/$(touch PWNED-data).txt')}",
    ])
    if launcher == "torchrun":
        text = text.replace("[launch.slurm]\n", "").replace(text.splitlines()[6] + "\n", "")
    path = tmp_path / "spec.toml"
    path.write_text(text + "\n")
    return str(path)


def _run(script, tmp_path, recorders, extra_env=None):
    record = tmp_path / "record.jsonl"
    env = {"PATH": f"{recorders}:/usr/bin:/bin", "RECORD": str(record), "WATCH": ",".join(f"V{i}" for i in range(len(NASTY))),
           "HOME": str(tmp_path), **(extra_env or {})}
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def _no_pwned(tmp_path):
    found = [p for p in os.listdir(tmp_path) if p.startswith("PWNED")]
    assert found == []


def test_torchrun_script_passes_values_through_verbatim(tmp_path, recorders):
    planned = plan_one(_spec(tmp_path, "torchrun"), str(tmp_path / "gen"))
    folder = tmp_path / "gen" / "inj"
    folder.mkdir(parents=True)
    (folder / "torchrun.sh").write_text(planned.files["torchrun.sh"])
    calls = _run(folder / "torchrun.sh", tmp_path, recorders)
    _no_pwned(tmp_path)
    assert len(calls) == 1 and calls[0]["cmd"] == "torchrun"
    assert calls[0]["env"] == {f"V{i}": v for i, v in enumerate(NASTY)}
    assert calls[0]["argv"] == ["--nnodes", "1", "--nproc-per-node", "8", "--standalone", "--max-restarts", "0",
                                "--no-python", "fp8launch-train", "--plan", f"{folder}/plan.json"]


def test_torchrun_script_takes_node_rank_and_endpoint_from_env_as_data(tmp_path, recorders):
    planned = plan_one(_spec(tmp_path, "torchrun"), str(tmp_path / "gen"))
    folder = tmp_path / "gen" / "inj"
    folder.mkdir(parents=True)
    (folder / "torchrun.sh").write_text(planned.files["torchrun.sh"])
    calls = _run(folder / "torchrun.sh", tmp_path, recorders, {"NODE_RANK": "1; touch PWNED-rank", "RDZV_ENDPOINT": "$(touch PWNED-ep):1"})
    _no_pwned(tmp_path)
    argv = calls[0]["argv"]
    assert argv[argv.index("--node-rank") + 1] == "1; touch PWNED-rank"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "$(touch PWNED-ep):1"


def test_slurm_script_passes_values_through_verbatim(tmp_path, recorders):
    plan_dir = "gen dir/$(touch PWNED-plandir)"
    planned = plan_one(_spec(tmp_path, "slurm"), plan_dir)
    script = tmp_path / "job.sbatch"
    script.write_text(planned.files["slurm.sbatch"])
    calls = _run(script, tmp_path, recorders, {"SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "77"})
    _no_pwned(tmp_path)
    assert [c["cmd"] for c in calls] == ["srun"]
    assert calls[0]["env"] == {f"V{i}": v for i, v in enumerate(NASTY)}
    argv = calls[0]["argv"]
    assert argv[:4] == ["--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:29500"
    assert argv[argv.index("--rdzv-id") + 1] == "77"
    assert argv[-1] == f"{plan_dir}/inj/plan.json"
    sbatch_lines = [line for line in planned.files["slurm.sbatch"].splitlines() if line.startswith("#SBATCH")]
    assert '#SBATCH --output="runs/$(touch PWNED-outdir) `x` ; y/slurm-%j.out"' in sbatch_lines


def test_slurm_script_refuses_a_job_of_another_node_count_before_starting_anything(tmp_path, recorders):
    # plan.json fixes the world size: `sbatch --nodes=2` of a 1-node plan would fail later in every rank.
    script = tmp_path / "job.sbatch"
    script.write_text(plan_one(_spec(tmp_path, "slurm"), "gen").files["slurm.sbatch"])
    env = {"PATH": f"{recorders}:/usr/bin:/bin", "RECORD": str(tmp_path / "record.jsonl"), "SLURM_NNODES": "2; touch PWNED-nnodes",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "77"}
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 3
    assert r.stderr == ("error: this plan is for 1 node(s) but the job has 2; touch PWNED-nnodes; "
                        "fix: plan for 2; touch PWNED-nnodes nodes: fp8launch run SPEC --nodes 2; touch PWNED-nnodes\n")
    assert not (tmp_path / "record.jsonl").exists()
    _no_pwned(tmp_path)


FAILING_SRUN = """#!/usr/bin/env bash
if [[ " $* " == *" hostname "* ]]; then echo 127.0.0.1; exit 0; fi
echo "$FP8LAUNCH_EXIT_FILE" > "$RECORD"
echo 2 > "$FP8LAUNCH_EXIT_FILE"          # what the entrypoint of a failing rank writes
exit 143                                   # srun: the other node's task was stopped with SIGTERM
"""


def test_slurm_job_exits_with_the_code_the_training_reported(tmp_path, recorders):
    (recorders / "srun").write_text(FAILING_SRUN)
    script = tmp_path / "job.sbatch"
    script.write_text(plan_one(_spec(tmp_path, "slurm"), "gen").files["slurm.sbatch"])
    (tmp_path / "runs" / "$(touch PWNED-outdir) `x` ; y").mkdir(parents=True)  # the log folder sbatch writes into
    env = {"PATH": f"{recorders}:/usr/bin:/bin", "RECORD": str(tmp_path / "record.txt"), "SLURM_NNODES": "1",
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "77"}
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    exit_file = (tmp_path / "record.txt").read_text().strip()
    assert exit_file == f"{tmp_path}/runs/$(touch PWNED-outdir) `x` ; y/.exit-code-77"
    assert not os.path.exists(exit_file)  # read, then removed
    _no_pwned(tmp_path)


def test_line_breaks_cannot_add_sbatch_options(cli, spec):
    path = spec('version = 1\nname = "s"\n[launch]\nlauncher = "slurm"\n[launch.slurm]\n'
                'extra_sbatch = ["--x\\n#SBATCH --uid=0"]\npartition = "a\\nb"\n')
    r = cli("plan", path)
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        f"{path}:6: error: $.launch.slurm.extra_sbatch[0]: holds a newline (\\n); {ONE_LINE}",
        f"{path}:7: error: $.launch.slurm.partition: holds a newline (\\n); {ONE_LINE}",
        "2 problems found."]


ONE_LINE = "names, paths and commands are one line of printable characters; fix: remove it"


@pytest.mark.parametrize("name", ["../x", "a/b", "A", "x y", ".hidden", "$(id)", "a" * 65])
def test_names_that_could_escape_the_folder_are_refused(cli, spec, tmp_path, name):
    r = cli("plan", spec(f"version = 1\nname = {json.dumps(name)}\n"), "--out", "out")
    assert r.exit_code == 2 and "$.name" in r.stderr
    assert not (tmp_path / "out").exists()


# --- every string field of the schema --------------------------------------------------------------------------------

CONTROL = {"\n": "a newline (\\n)", "\r": "a carriage return (\\r)", "\0": "a NUL character (\\0)", "\t": "a tab (\\t)",
           "\x1b": "an escape character (\\x1b)", "\x85": "a control character (U+0085)",
           "\u2028": "a control character (U+2028)", "\u202e": "a control character (U+202E)"}


def _source(data: dict) -> SpecSource:
    return SpecSource(path="s.json", data=data, sha256="")


@pytest.mark.parametrize("char", list(CONTROL), ids=[hex(ord(c)) for c in CONTROL])
def test_every_string_field_refuses_control_characters_naming_the_key(char):
    data = base()
    fields = string_fields()
    for f in fields:
        put(data, f.path, f"a{char}b")
    data["launch"]["env"][f"K{char}"] = "ok"  # a map's key too
    with pytest.raises(SpecError) as e:
        validate(_source(data))
    got = {p.path: p.message for p in e.value.problems}
    env_key = "$.launch.env" + f"[{json.dumps('K' + char)}]"
    expected = {f.dotted: f"holds {CONTROL[char]}; {ONE_LINE}" for f in fields}
    expected[env_key] = f"the key holds {CONTROL[char]}; {ONE_LINE}"
    assert got == expected
    assert all("\n" not in str(p) and "\r" not in str(p) for p in e.value.problems)  # each on one line


def test_every_pattern_is_matched_against_the_whole_string():
    """Python's `$` matches before a final newline (re.search("^[a-z]+$", "abc\\n") matches): the validator matches every
    pattern against the whole string, as the schema's own dialect (ECMAScript's) does, whether or not a control character
    check runs before it."""
    patterned = [f for f in string_fields() if "pattern" in f.node]
    assert {f.dotted for f in patterned} >= {"$.name", "$.launch.rdzv_endpoint", "$.launch.slurm.time", "$.train.model"}
    validator = Validator(schema())
    for f in patterned:
        assert f.node["pattern"].startswith("^") and f.node["pattern"].endswith("$"), f.dotted
        good = _valid_sample(f)
        assert list(validator.iter_errors(put(base(), f.path, good))) == [], f.dotted
        errors = list(validator.iter_errors(put(base(), f.path, good + "\n")))
        assert [(e.validator, tuple(e.absolute_path)) for e in errors] == [("pattern", f.path)], f.dotted
    names = list(validator.iter_errors({"version": 1, "name": "a", "launch": {"env": {"A\n": "x"}}}))
    assert [e.validator for e in names] == ["pattern"]  # propertyNames' pattern too


SAMPLES = {"$.name": "inj", "$.launch.slurm.extra_sbatch[0]": "--exclusive"}


def _valid_sample(f) -> str:
    value = SAMPLES.get(f.dotted, f.node.get("default"))
    assert isinstance(value, str), f"{f.dotted}: add a valid value to SAMPLES"
    return value


# Printable values a hostile spec writes: shell syntax, quotes and backslashes, and what would split an #SBATCH line.
PAYLOADS = {
    "all": "x\" --uid=0 \"\\\" hetjob $(touch PWNED-subst)`touch PWNED-tick`;touch PWNED-semi|touch PWNED-pipe&${HOME}*? $$ "
           "it's 'one' #rest",
    "quotes": "'\"'\\",
}
PREFIXES = ("", "--x=", "/", "text:", "hf:")
"""Tried in front of a payload so that a field with a form (train.data, extra_sbatch, workdir) takes it."""

VARIANTS = {
    "torchrun": {"distributed": {"strategy": "deepspeed"}, "export": {"accelerate": True}},
    "slurm": {"launch": {"launcher": "slurm"}},
    "trainjob": {"launch": {"launcher": "kubernetes", "kubernetes": {"image": "img:1", "volume_claim": "pvc"}}},
    "pytorchjob": {"launch": {"launcher": "kubernetes", "kubernetes": {"image": "img:1", "volume_claim": "pvc", "api": "pytorchjob"}}},
}


def _variant(name: str) -> dict:
    return base(**json.loads(json.dumps(VARIANTS[name])))


def _plan(tmp_path, data: dict, n: list[int]):
    """plan_one of `data` written as JSON: the Planned, or None when it is refused (exit 2, a SpecError)."""
    n[0] += 1
    path = tmp_path / f"spec{n[0]}.json"
    path.write_text(json.dumps(data))
    try:
        return plan_one(str(path), str(tmp_path / "gen"))
    except SpecError:
        return None


def _home(path: tuple) -> str:
    return {"slurm": "slurm", "kubernetes": "trainjob"}.get(path[1], "torchrun") if path[0] == "launch" else "torchrun"


def sbatch_arguments(line: str) -> list[str]:
    """The arguments sbatch takes from the text after `#SBATCH` (Slurm's src/sbatch/opt.c get_argument): whitespace
    separates, quotes group, a backslash escapes the next character, an unquoted # ends the line, a bare hetjob or
    packjob is a separator (blanked)."""
    out, i, n = [], 0, len(line)
    while True:
        while i < n and line[i].isspace():
            i += 1
        for word in ("packjob", "hetjob"):
            if line[i:i + len(word)].lower() == word and (i + len(word) == n or line[i + len(word)].isspace()):
                i += len(word)
                break
        else:
            arg, quote, escape = [], None, False
            while i < n and (quote or not line[i].isspace()):
                c = line[i]
                if escape:
                    escape = False
                elif c == "\\":
                    escape, i = True, i + 1
                    continue
                elif quote:
                    if c == quote:
                        quote, i = None, i + 1
                        continue
                elif c in "\"'":
                    quote, i = c, i + 1
                    continue
                elif c == "#":
                    return out + (["".join(arg)] if arg else [])
                arg.append(c)
                i += 1
            assert quote is None, f"unmatched quote in #SBATCH{line}"
            if not arg:
                return out
            out.append("".join(arg))
            continue
        if i >= n:
            return out


def test_sbatch_arguments_reads_lines_as_sbatch_does():
    assert sbatch_arguments(' --a=1 "--b=x y" --c=\\"q\\" # --d') == ["--a=1", "--b=x y", '--c="q"']
    assert sbatch_arguments(' "--x=a\\" --uid=0 \\"" hetjob --y') == ['--x=a" --uid=0 "', "--y"]


def test_no_string_field_reaches_a_generated_file_as_a_command(tmp_path, recorders):
    """Each string field of the schema with each payload (in front of it the first prefix its form takes), planned alone
    in its launcher's spec: refused (exit 2), or planned. Then per payload every field that planned, together, in a
    torchrun + DeepSpeed + accelerate.yaml spec, a SLURM one and both Kubernetes ones: each rendered file parses, the
    scripts run (recorders on PATH) only what their templates run, with the values as data."""
    n = [0]
    fields = string_fields()
    for label, payload in PAYLOADS.items():
        taken: list[tuple[tuple, str]] = []
        for f in fields:
            for prefix in PREFIXES:
                value = prefix + payload
                planned = _plan(tmp_path, put(_variant(_home(f.path)), f.path, value), n)
                if planned is not None:
                    taken.append((f.path, value))
                    break
        paths = {p for p, _ in taken}
        # fields without a form of their own take any printable text: each must have reached a plan
        assert {("launch", "env", MAP_KEY), ("train", "output_dir"), ("train", "data"), ("launch", "kubernetes", "image"),
                ("launch", "kubernetes", "workdir"), ("launch", "slurm", "extra_sbatch", 0)} <= paths, (label, paths)
        for variant in VARIANTS:
            data = _variant(variant)
            for path, value in taken:
                if path[:2] in (("launch", "slurm"), ("launch", "kubernetes")) and _home(path) != variant.replace("pytorchjob",
                                                                                                                  "trainjob"):
                    continue
                put(data, path, value)
            planned = _plan(tmp_path, data, n)
            assert planned is not None, (label, variant, data)
            _check_files(tmp_path, planned, data, recorders)
        _no_pwned(tmp_path)


def _check_files(tmp_path, planned, data: dict, recorders) -> None:
    folder = tmp_path / "gen" / "inj"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in planned.files.items():
        (folder / name).write_text(text)
        if name.endswith(".json"):
            json.loads(text)
        elif name.endswith(".yaml"):
            documents = list(yaml.safe_load_all(text))
            assert documents, name
            _check_kubernetes(documents, data)
        else:
            r = subprocess.run(["bash", "-n", str(folder / name)], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, (name, r.stderr)
    env = data.get("launch", {}).get("env", {})
    watch = {"WATCH": ",".join(env)}
    (tmp_path / "record.jsonl").unlink(missing_ok=True)
    if "torchrun.sh" in planned.files and "kubernetes" not in data["launch"].get("launcher", ""):  # its bash -n above
        calls = _run(folder / "torchrun.sh", tmp_path, recorders, watch)
        assert [c["cmd"] for c in calls] == ["torchrun"]
        assert calls[0]["env"] == env
        assert calls[0]["argv"][-2:] == ["--plan", f"{folder}/plan.json"]
    if "slurm.sbatch" in planned.files:
        (tmp_path / "record.jsonl").unlink(missing_ok=True)
        text = planned.files["slurm.sbatch"]
        calls = _run(folder / "slurm.sbatch", tmp_path, recorders,
                     {**watch, "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7"})
        assert [c["cmd"] for c in calls] == ["srun"] and calls[0]["env"] == env
        args = [sbatch_arguments(line[len("#SBATCH"):]) for line in text.splitlines() if line.startswith("#SBATCH")]
        assert all(len(a) == 1 for a in args), args
        flat = [a[0] for a in args]
        extra = data["launch"].get("slurm", {}).get("extra_sbatch", [])
        assert flat[len(flat) - len(extra):] == extra  # the last #SBATCH lines, each one option as written
        output_dir = data.get("train", {}).get("output_dir", "runs/{name}").replace("{name}", "inj")
        assert f"--output={output_dir}/slurm-%j.out" in flat


def _check_kubernetes(documents: list, data: dict) -> None:
    """Every string kubelet expands (a container's command, args, env values) holds no `$(` it would expand, and the
    env values arrive as the spec wrote them."""
    env = data.get("launch", {}).get("env", {})

    def containers(node):
        if isinstance(node, dict):
            if "command" in node or "env" in node:
                yield node
            for v in node.values():
                yield from containers(v)
        elif isinstance(node, list):
            for v in node:
                yield from containers(v)

    seen = {}
    for c in (c for d in documents for c in containers(d)):
        for word in c.get("command", []) + c.get("args", []) + [e.get("value", "") for e in c.get("env", [])]:
            assert not re.search(r"(?<!\$)(\$\$)*\$\(", word), word
        seen.update({e["name"]: e["value"].replace("$$", "$") for e in c.get("env", []) if e.get("name") in env})
    if any(c for d in documents for c in containers(d)):
        assert seen == env
