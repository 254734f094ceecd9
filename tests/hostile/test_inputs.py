"""Hostile inputs (issue 49, items 3 and 4): nothing a user writes reaches a generated file as a command, and every
input is read within bounds. Each case: the command, the exact exit code and the one line it must print, nothing
written; then the measured bounds (an alias bomb, /dev/zero, a FIFO, deep nesting refused in well under a second), and
a property test: any document in any field plans or is refused with exit 2, never a traceback, never a hang."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.errors import LauncherError
from tests.hostile.corpus import Case, check
from tests.hostile.specs import HOSTILE_TEXT, documents, fields

SPEC = 'version = 1\nname = "s"\n'
JSON = '{"version": 1, "name": "s",\n'
ONE_LINE = r"names, paths and commands are one line of printable characters; fix: remove it$"
NAN = r"is not a number a spec can hold \(NaN or infinite\); fix: write a finite number$"


def _spec(extra: str) -> dict[str, str]:
    return {"s.toml": SPEC + extra}


def _fifo(name: str):
    return lambda folder: os.mkfifo(folder / name)


def _sparse(name: str, size: int):
    def make(folder: Path) -> None:
        with open(folder / name, "wb") as f:
            f.truncate(size)
    return make


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "base_model: meta-llama/Llama-3.2-1B\nlearning_rate: 0.0001\n" + "\n".join(lines) + "\n"


DEEP = 5000
CASES = [
    # --- item 3: one line of printable characters, every string and key -----------------------------------------
    Case(id="name-trailing-newline", argv=("plan", "s.toml", "--out", "out"), files={"s.toml": 'version = 1\nname = "abc\\n"\n'},
         code=2, line=r"^s\.toml:2: error: \$\.name: holds a newline \(\\n\); " + ONE_LINE, absent=("out",)),
    Case(id="name-carriage-return", argv=("plan", "s.toml"), files={"s.toml": 'version = 1\nname = "abc\\r"\n'},
         code=2, line=r"^s\.toml:2: error: \$\.name: holds a carriage return \(\\r\); " + ONE_LINE, absent=("generated",)),
    Case(id="output-dir-nul", argv=("plan", "s.toml"), files=_spec('[train]\noutput_dir = "runs/a\\u0000b"\n'),
         code=2, line=r"^s\.toml:4: error: \$\.train\.output_dir: holds a NUL character \(\\0\); " + ONE_LINE),
    Case(id="env-value-newline-command", argv=("plan", "s.toml"),
         files=_spec('[launch.env]\nX = "1\\ntouch PWNED"\n'), absent=("PWNED", "generated"),
         code=2, line=r"^s\.toml:4: error: \$\.launch\.env\.X: holds a newline \(\\n\); " + ONE_LINE),
    Case(id="env-key-newline", argv=("plan", "s.toml"), files=_spec('[launch.env]\n"A\\nB" = "x"\n'),
         code=2, line=r'^s\.toml:4: error: \$\.launch\.env\["A\\nB"\]: the key holds a newline \(\\n\); ' + ONE_LINE),
    Case(id="partition-line-separator", argv=("plan", "s.toml"),
         files=_spec('[launch]\nlauncher = "slurm"\n[launch.slurm]\npartition = "gpu\\u2028x"\n'),
         code=2, line=r"^s\.toml:6: error: \$\.launch\.slurm\.partition: holds a control character \(U\+2028\); " + ONE_LINE),
    Case(id="image-bidi-override", argv=("plan", "s.toml"),
         files=_spec('[launch]\nlauncher = "kubernetes"\n[launch.kubernetes]\nimage = "img\\u202e1:gat"\n'),
         code=2, line=r"^s\.toml:6: error: \$\.launch\.kubernetes\.image: holds a control character \(U\+202E\); " + ONE_LINE),
    Case(id="json-extra-sbatch-escape", argv=("plan", "s.json"),
         files={"s.json": JSON + ' "launch": {"launcher": "slurm",\n  "slurm": {"extra_sbatch": ["--x\\u001b[2J"]}}}'},
         code=2, line=r"^s\.json:3: error: \$\.launch\.slurm\.extra_sbatch\[0\]: holds an escape character \(\\x1b\); " + ONE_LINE),
    Case(id="set-newline", argv=("plan", "s.toml", "--set", "name=abc\n"), files=_spec(""),
         code=2, line=r"^--set: error: 'name=abc\\n' holds a newline \(\\n\); " + ONE_LINE),
    Case(id="set-key-tab", argv=("plan", "s.toml", "--set", "launch.env.A\tB=1"), files=_spec(""),
         code=2, line=r"^--set: error: 'launch\.env\.A\\tB=1' holds a tab \(\\t\); " + ONE_LINE),
    Case(id="rdzv-port-99999-plan", argv=("plan", "s.toml"), files=_spec('[launch]\nrdzv_endpoint = "localhost:99999"\n'),
         code=2, line=r'^s\.toml:4: error: \$\.launch\.rdzv_endpoint: "localhost:99999" has the wrong form: HOST:PORT .* a port '
                      r"number from 1 to 65535\.$"),
    Case(id="rdzv-port-0-run-dry-run", argv=("run", "s.toml", "--dry-run"), files=_spec('[launch]\nrdzv_endpoint = "host:0"\n'),
         code=2, line=r'^s\.toml:4: error: \$\.launch\.rdzv_endpoint: "host:0" has the wrong form', absent=("runs",)),
    Case(id="rdzv-port-99999-run-dry-run", argv=("run", "s.toml", "--dry-run"),
         files=_spec('[launch]\nrdzv_endpoint = "localhost:99999"\n'),
         code=2, line=r'^s\.toml:4: error: \$\.launch\.rdzv_endpoint: "localhost:99999" has the wrong form', absent=("runs",)),
    # --- item 4: only regular files, at most so many bytes, read without blocking -------------------------------------
    Case(id="plan-fifo", argv=("plan", "fifo.toml"), setup=_fifo("fifo.toml"), process=True, timeout=20,
         code=2, line=r"^fifo\.toml: error: is a named pipe \(FIFO\), not a file; give the path of a \.toml or \.json spec file$"),
    Case(id="plan-dev-zero", argv=("plan", "/dev/zero"), process=True, timeout=20,
         code=2, line=r"^/dev/zero: error: is a character device, not a file; give the path of a \.toml or \.json spec file$"),
    Case(id="plan-sparse-2gib", argv=("plan", "big.toml"), setup=_sparse("big.toml", 2 << 30),
         code=2, line=r"^big\.toml: error: is 2147483648 bytes; a spec is at most 1048576 bytes \(is this the right file\?\)$"),
    Case(id="pyproject-sparse-2gib", argv=("plan", "s.toml"), files=_spec(""), setup=_sparse("pyproject.toml", 2 << 30),
         code=2, line=r"^error: .*pyproject\.toml: cannot read \[tool\.fp8launch\]: is 2147483648 bytes; at most 8388608 are read$",
         absent=("generated",)),
    Case(id="import-fifo", argv=("import", "fifo.yaml"), setup=_fifo("fifo.yaml"), process=True, timeout=20,
         code=2, line=r"^error: fifo\.yaml: is a named pipe \(FIFO\), not a file: expected a JSON, TOML or YAML config$"),
    Case(id="import-dev-zero", argv=("import", "/dev/zero"), process=True, timeout=20,
         code=2, line=r"^error: /dev/zero: is a character device, not a file: expected a JSON, TOML or YAML config$"),
    # --- nesting, aliases ---------------------------------------------------------------------------------------------
    Case(id="toml-nested-5000", argv=("plan", "s.toml"), files=_spec(f"x = {'[' * DEEP}{']' * DEEP}\n"),
         code=2, line=r"^s\.toml: error: nests tables or arrays deeper than Python reads; a spec is at most 16 levels deep$"),
    Case(id="json-nested-5000", argv=("plan", "s.json"), files={"s.json": JSON + ' "x": ' + "[" * DEEP + "]" * DEEP + "}"},
         code=2, line=r"^s\.json: error: nests tables or arrays deeper than Python reads; a spec is at most 16 levels deep$"),
    Case(id="toml-nested-17", argv=("plan", "s.toml"), files=_spec(f"x = {'[' * 17}{']' * 17}\n"),
         code=2, line=r"^s\.toml: error: \$\.x(\[0\]){15}: nested more than 16 levels deep; a spec's tables are a few levels deep$"),
    Case(id="set-nested-5000", argv=("plan", "s.toml", "--set", f"train.steps={'[' * DEEP}{']' * DEEP}"), files=_spec(""),
         code=2, line=r"^--set: error: train\.steps: the value is nested more than 16 levels deep or has more than 4300 digits"),
    Case(id="import-billion-laughs", argv=("import", "bomb.yaml"), files={"bomb.yaml": _bomb()}, process=True, timeout=20,
         code=2, line=r"^error: bomb\.yaml: its YAML aliases expand to more than 200000 values \(line 8\): not a config$",
         absent=("meta-llama-llama-3-2-1b.toml", "bomb.toml")),
    Case(id="import-alias-holds-itself", argv=("import", "self.yaml"), files={"self.yaml": "a: &a [1, *a]\n"},
         code=2, line=r"^error: self\.yaml: a YAML alias holds itself \(line 1\): not a config$"),
    Case(id="import-yaml-nested-5000", argv=("import", "deep.yaml"), files={"deep.yaml": f"a: {'[' * DEEP}{']' * DEEP}\n"},
         code=2, line=r"^error: deep\.yaml: nested more than 64 levels deep \(line 1\): not a config$"),
    Case(id="import-yaml-block-nested", argv=("import", "deep.yaml"),
         files={"deep.yaml": "".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v: 1\n"},
         code=2, line=r"^error: deep\.yaml: nested more than 64 levels deep \(line 64\): not a config$"),
    # --- numbers and keys ---------------------------------------------------------------------------------------------
    Case(id="toml-lr-nan", argv=("plan", "s.toml"), files=_spec("[train]\nlr = nan\n"),
         code=2, line=r"^s\.toml:4: error: \$\.train\.lr: nan " + NAN),
    Case(id="toml-lr-inf", argv=("plan", "s.toml"), files=_spec("[train]\nmax_grad_norm = inf\n"),
         code=2, line=r"^s\.toml:4: error: \$\.train\.max_grad_norm: inf " + NAN),
    Case(id="json-lr-NaN", argv=("plan", "s.json"), files={"s.json": '{"version": 1, "name": "s",\n "train": {"lr": NaN}}'},
         code=2, line=r"^s\.json:2: error: \$\.train\.lr: nan " + NAN),
    Case(id="json-lr-1e999", argv=("plan", "s.json"), files={"s.json": '{"version": 1, "name": "s",\n "train": {"lr": -1e999}}'},
         code=2, line=r"^s\.json:2: error: \$\.train\.lr: -inf " + NAN),
    Case(id="set-lr-nan", argv=("plan", "s.toml", "--set", "train.lr=nan"), files=_spec(""),
         code=2, line=r"^s\.toml: error: \$\.train\.lr: nan is not a number a spec can hold \(NaN or infinite\); fix: write a finite "
                      r"number \(from --set train\.lr=nan\)$"),
    Case(id="json-duplicate-key", argv=("plan", "s.json"),
         files={"s.json": '{"version": 1, "name": "s",\n "train": {"steps": 10,\n           "steps": 20}}'},
         code=2, line=r"^s\.json:3: error: \$\.train\.steps: written twice in one object \(the first on line 2\); JSON readers keep "
                      r"only the last, DeepSpeed refuses it; fix: keep one$"),
    Case(id="import-json-duplicate-key", argv=("import", "ds.json"),
         files={"ds.json": '{"train_batch_size": 8,\n "zero_optimization": {"stage": 2,\n  "stage": 3}}'},
         code=2, line=r"^error: ds\.json: zero_optimization\.stage \(line 3\): a key written twice in one object; JSON readers keep "
                      r"only the last, DeepSpeed refuses it; fix: keep one$"),
    Case(id="import-yaml-nan", argv=("import", "ax.yaml"), files={"ax.yaml": "base_model: x\nlearning_rate: .nan\n"},
         code=2, line=r"^error: ax\.yaml: learning_rate: nan is not a number a config can hold \(NaN or infinite\); fix: write a "
                      r"finite number, or remove the key$"),
    Case(id="json-steps-10e30", argv=("plan", "s.json"), files={"s.json": JSON + ' "train": {"steps": 1' + "0" * 30 + "}}"},
         code=2, line=r"^s\.json:2: error: \$\.train\.steps: 1000\.\.\. \(31 digits\) is beyond a 64-bit integer \(at most "
                      r"9223372036854775807\); fix: write a smaller number$"),
    Case(id="json-steps-5000-digits", argv=("plan", "s.json"), files={"s.json": JSON + ' "train": {"steps": ' + "9" * 5000 + "}}"},
         code=2, line=r"^s\.json: error: invalid JSON: a number of more than 4300 digits$"),
    Case(id="steps-1e308", argv=("plan", "s.toml"), files=_spec("[train]\nsteps = 1e308\n"),
         code=2, line=r"^s\.toml:4: error: \$\.train\.steps: (expected an integer, got number 1e\+308|must be <= 9223372036854775807, "
                      r"got 1e\+308)$"),
    Case(id="seq-len-minus-1e308", argv=("plan", "s.json"), files={"s.json": '{"version": 1, "name": "s", "train": {"seq_len": -1e308}}'},
         code=2, line=r"^s\.json:1: error: \$\.train\.seq_len: must be >= 1, got -1e\+308$"),
    Case(id="signal-seconds-70000", argv=("plan", "s.toml"), files=_spec("[launch.slurm]\nsignal_seconds = 70000\n"),
         code=2, line=r"^s\.toml:4: error: \$\.launch\.slurm\.signal_seconds: must be <= 65535, got 70000$"),
    Case(id="params-nan", argv=("plan", "s.toml", "--params", "nan"), files=_spec(""), absent=("generated",),
         code=2, line=r"^error: Invalid value for '--params': 'nan' is not a parameter count from 1 to 1e15 \(e\.g\. 8e9\); fix: see "
                      r"`fp8launch plan --help`$"),
    Case(id="params-inf", argv=("plan", "s.toml", "--params", "inf"), files=_spec(""), absent=("generated",),
         code=2, line=r"^error: Invalid value for '--params': 'inf' is not a parameter count from 1 to 1e15"),
    Case(id="bench-max-loss-gap-nan", argv=("bench", "s.toml", "--max-loss-gap", "nan"), files=_spec(""), absent=("runs",),
         code=2, line=r"^error: Invalid value for '--max-loss-gap': nan is not a number; fix: see `fp8launch bench --help`$"),
    Case(id="tune-max-loss-gap-nan", argv=("tune", "s.toml", "--max-loss-gap", "nan"), files=_spec(""), absent=("runs",),
         code=2, line=r"^error: Invalid value for '--max-loss-gap': nan is not a number; fix: see `fp8launch tune --help`$"),
    # --- sizes the plan depends on -----------------------------------------------------------------------------------
    Case(id="tensor-parallel-1000000", argv=("plan", "s.toml"), files=_spec("[distributed]\ntensor_parallel = 1000000\n"),
         code=2, line=r"^3 problems found\.$", lines=4),  # test_tensor_parallel_past_the_node_is_refused_by_its_rules
    Case(id="context-parallel-2-31", argv=("plan", "s.toml"), files=_spec("[distributed]\ncontext_parallel = 2147483647\n"),
         code=2, line=r"^2 problems found\.$", lines=3),
    Case(id="tensor-parallel-2-31", argv=("plan", "s.toml"), files=_spec("[distributed]\ntensor_parallel = 2147483648\n"),
         code=2, line=r"^s\.toml:4: error: \$\.distributed\.tensor_parallel: must be <= 2147483647, got 2147483648$"),
    Case(id="layers-10e12", argv=("plan", "s.toml"), files=_spec('[train]\nmodel = "builtin:llama-debug?layers=1000000000000"\n'),
         code=2, line=r"^s\.toml:4: error: \$\.train\.model: 'layers=1000000000000' in 'builtin:llama-debug\?layers=1000000000000' is "
                      r"more than 4096; fix: write layers=N with N <= 4096$"),
    Case(id="layers-5000-digits", argv=("plan", "s.toml"), files=_spec(f'[train]\nmodel = "builtin:llama-debug?layers={"7" * 5000}"\n'),
         code=2, line=r"^s\.toml:4: error: \$\.train\.model: 'layers=777777777777777777777777\.\.\. \(5000 characters\)' in "
                      r"'builtin:llama-debug\?layers=7+\.\.\. "
                      r"\(5027 characters\)' is more than 4096; fix: write layers=N with N <= 4096$"),
    Case(id="pipeline-stages-8192", argv=("plan", "s.toml"),
         files=_spec('[distributed]\npipeline_parallel = 4096\n[distributed.pipeline]\nschedule = "Interleaved1F1B"\n'),
         code=2, line=r"^s\.toml:4: error: \$\.distributed\.pipeline_parallel: 4096 x 2 stages a rank is 8192 pipeline stages, more "
                      r"than the 4096 blocks a model may have \(each stage holds at least one\); fix: lower "
                      r"distributed\.pipeline_parallel or distributed\.pipeline\.stages_per_rank$"),
    Case(id="world-2-32-ranks", argv=("plan", "s.toml", "--nodes", "65536"), files=_spec("[distributed]\nprocs_per_node = 65536\n"),
         code=2, line=r"^s\.toml:4: error: \$\.distributed\.procs_per_node: 65536 nodes x 65536 processes is 4294967296 ranks, more "
                      r"than torch\.distributed's 2147483647; fix: lower distributed\.nodes or distributed\.procs_per_node$"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case(case, tmp_path):
    check(case, tmp_path)


# --- measured bounds --------------------------------------------------------------------------------------------------

def _timed(fn, *args) -> tuple[float, BaseException | None]:
    start = time.perf_counter()
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 -- the refusal is the result
        return time.perf_counter() - start, e
    return time.perf_counter() - start, None


def test_tensor_parallel_past_the_node_is_refused_by_its_rules(tmp_path):
    """tensor_parallel = 1000000 divided a GEMM's width to 0 in the prediction (ZeroDivisionError) before the rules ran;
    now the rules say what is wrong."""
    from launcher.commands.plan import plan_one
    from launcher.errors import SpecError

    (tmp_path / "s.toml").write_text(SPEC + "[distributed]\ntensor_parallel = 1000000\n")
    with pytest.raises(SpecError) as e:
        plan_one(str(tmp_path / "s.toml"), str(tmp_path / "out"))
    assert [p.rule for p in e.value.problems] == ["TP-DIVIDES-PROCS", "TP-HEADS", "TP-SEQ-LEN"]


def test_bounded_inputs_are_refused_in_well_under_a_second(tmp_path):
    """In-process, after the imports: what each refusal costs (a billion-laughs file of 9^10 values, a FIFO with no
    writer, 100000 nested brackets as a spec and as an import). /dev/zero is read only by a Case's own process above:
    a regression here would fill this process's memory. A regression that blocks is stopped by the alarm."""
    from launcher.commands.importer import load
    from launcher.errors import SourceError, SpecError
    from launcher.planning.read import read_spec

    (tmp_path / "bomb.yaml").write_text(_bomb())
    os.mkfifo(tmp_path / "fifo.toml")
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "deep.json").write_text('{"version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    runs = [(load, "bomb.yaml", SourceError), (read_spec, "fifo.toml", SpecError), (load, "fifo.yaml", SourceError),
            (read_spec, "deep.json", SpecError), (load, "deep.yaml", SourceError)]
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("a refusal blocked")))
    signal.alarm(20)
    try:
        for fn, name, error in runs:
            seconds, raised = _timed(fn, str(tmp_path / name))
            assert isinstance(raised, error), (name, raised)
            assert seconds < 0.5, (name, seconds)
    finally:
        signal.alarm(0)


def test_an_hf_config_of_a_billion_layers_is_not_sized(tmp_path):
    """A config.json's num_hidden_layers is checked before the prediction's per-layer work: the plan says why it has no
    prediction instead of looping 10^9 times."""
    from launcher.commands.plan import plan_one

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 10**9, "num_attention_heads": 4,
                                                   "intermediate_size": 128, "vocab_size": 256}))
    (tmp_path / "s.toml").write_text(SPEC + '[precision]\nmode = "fp8"\n[train]\nmodel = "hf:model"\n')
    start = time.perf_counter()
    planned = plan_one(str(tmp_path / "s.toml"), str(tmp_path / "out"))
    assert time.perf_counter() - start < 1.0
    assert planned.prediction.fp8_vs_bf16 is None
    assert planned.prediction.reason == (f"model shapes unknown: {model}/config.json is beyond what planning sizes: its "
                                         "num_hidden_layers 1000000000 is more than 4096")


def test_a_followed_deepspeed_config_that_is_a_fifo_does_not_block_the_import(tmp_path):
    """An Accelerate config names a DeepSpeed JSON that is a FIFO with no writer: the import reads past it (reported as
    unreadable) instead of waiting forever."""
    from launcher.commands.importer import import_config

    os.mkfifo(tmp_path / "ds.json")
    (tmp_path / "acc.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\n"
                                       "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("the import blocked on the FIFO")))
    signal.alarm(20)
    try:
        imported = import_config(str(tmp_path / "acc.yaml"), folder=str(tmp_path))
    finally:
        signal.alarm(0)
    assert any("cannot read this DeepSpeed JSON" in line for line in imported.report.lines())


# --- property: anything in any field plans or is refused with exit 2 ----------------------------------------------------

def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, (int, str)):
        return json.dumps(value) if isinstance(value, str) else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(value)


def to_toml(spec: dict) -> str:
    """`spec` as TOML: each top-level key one line, tables inline (TOML has no null: a None is left out)."""
    return "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in spec.items() if v is not None)


OVERRIDE_KEYS = [".".join(str(p) for p in f.path) for f in fields() if not any(isinstance(p, int) for p in f.path)]


def _plan_in_process(path: str, overrides: list[str]) -> int:
    """`fp8launch plan PATH --set ...` through the library as the CLI calls it, its text summary and its --format json
    record included (nothing written): 0, or the exit code of the LauncherError it raised. Any other exception escapes
    (a traceback the user would see)."""
    from launcher.commands.plan import plan_one, plan_record
    from launcher.commands.plan_text import plan_summary

    def hang(*_):
        raise TimeoutError(f"no answer within 10 s for {path} {overrides}")

    signal.signal(signal.SIGALRM, hang)
    signal.alarm(10)
    try:
        planned = plan_one(path, os.path.join(os.path.dirname(path), "out"), overrides)
        plan_summary(planned.plan, planned.folder, [], None, planned.prediction)
        plan_record(planned, [])
        return 0
    except LauncherError as e:
        return e.exit_code
    finally:
        signal.alarm(0)


_FOLDER = tempfile.mkdtemp(prefix="fp8launch-property-")  # hypothesis runs many examples in one test: no tmp_path each
atexit.register(shutil.rmtree, _FOLDER, ignore_errors=True)


@settings(max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=documents(), as_toml=st.booleans(),
       sets=st.lists(st.tuples(st.sampled_from(OVERRIDE_KEYS), st.sampled_from(HOSTILE_TEXT + ["1", "nan", "[[[[1]]]]", "{a=1}"])),
                     max_size=2))
def test_any_document_plans_or_is_refused_with_exit_2(spec, as_toml, sets):
    path = os.path.join(_FOLDER, "s.toml" if as_toml else "s.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_toml(spec) if as_toml else json.dumps(spec, allow_nan=True))
    overrides = [f"{k}={v}" for k, v in sets]
    assert _plan_in_process(path, overrides) in (0, 2)


TOKENS = list('{}[]",:=.\n \\#\'0123456789aeflnrstuxvINF-+_') + ["nan", "inf", "NaN", "Infinity", "version = 1\n",
                                                                "name = \"t\"\n", '"version": 1, ', '"name": "t", ', "true",
                                                                "\u2028", "\0", "[train]\n", "steps = ", "1e999"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(text=st.lists(st.sampled_from(TOKENS), max_size=60).map("".join), suffix=st.sampled_from([".toml", ".json"]))
def test_any_text_plans_or_is_refused_with_exit_2(text, suffix):
    path = os.path.join(_FOLDER, "t" + suffix)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    assert _plan_in_process(path, []) in (0, 2)
