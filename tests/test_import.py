"""`fp8launch import`: real configs of Accelerate, Axolotl, torchtitan, NeMo / Megatron-Bridge and DeepSpeed
(tests/data/import/, where each comes from is in its README.md) -> the spec values and report statuses written by hand
in tests/data/import/expected/; every report line mapped, approximated (before, after, what it does) or no equivalent;
the tools whose parser installs here (DeepSpeed 0.19.8, Accelerate 1.15) read the same files and agree with the spec;
an unknown, unreadable or misspelt file -> exit 2, one line, nothing written.

Where the tool is not installed the reading follows its source: Axolotl axolotl-ai-cloud/axolotl 067b021c8b87a9e5e380b
9173c704cf7340e30f5 (src/axolotl/utils/schemas/validation.py check_fsdp_version_in_fsdp_config, utils/trainer.py
setup_fsdp_envs); torchtitan pytorch/torchtitan 238fa9953e4aec2a62582121564273d7cbb1e9f1 (config/manager.py
_dict_to_dataclass "Invalid field names") and 78b0d60858574bfcecfa16b377d10ed2595b68d3 (config_manager.py string_list);
Megatron-Bridge NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a (training/config.py, gpt_provider.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from launcher.commands.importer import import_config
from launcher.commands.importer.hidden import secret_looking
from launcher.commands.importer.report import APPROXIMATED, MAPPED, NONE, STATUSES
from launcher.errors import SourceError

DATA = Path(__file__).resolve().parent / "data" / "import"
EXPECTED = DATA / "expected"
CORPUS = sorted(str(p.relative_to(EXPECTED)) for p in EXPECTED.rglob("*.toml"))
BAD = ("accelerate/invalid_keys.yaml", "deepspeed/deepspeed_bsz64k_lamb_config_seq128.json")
"""Real files the import must refuse, as their tool does."""
CONFIGS = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".yaml", ".yml", ".toml", ".json")
                 and "expected" not in p.parts and str(p.relative_to(DATA)) not in BAD)


def imported(relative: str, tmp_path: Path):
    """(spec as a dict, {source: (status, sets, note)}, Imported) of one data file."""
    result = import_config(str(DATA / relative), folder=str(tmp_path))
    entries = {e.source: (e.status, dict(e.sets), e.note) for e in result.report.entries}
    return tomllib.loads(result.text), entries, result


DEGREES = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "pipeline.stages_per_rank")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """One import of every corpus config, shared by the corpus-wide tests: {relative: (Imported, its folder, stated)}, where
    `stated` is what placeholders.size_world saw (each degree the source states, and whether the model and world are
    placeholders), recorded by a spy that calls the real size_world."""
    from launcher.commands.importer import placeholders

    root = tmp_path_factory.mktemp("corpus")
    size_world, stated = placeholders.size_world, {}

    def spy(d):
        stated.update({f"distributed.{k}": max(1, int(d.value(f"distributed.{k}", 1) or 1)) for k in DEGREES},
                      model=placeholders.MODEL in d.placeholders, world=placeholders.WORLD in d.placeholders)
        size_world(d)

    results = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placeholders, "size_world", spy)
        for relative in CONFIGS:
            stated.clear()
            out = root / relative.replace("/", "_")
            out.mkdir()
            results[relative] = (import_config(str(DATA / relative), folder=str(out)), out, dict(stated))
    return results


CORPUS_GROUP = pytest.mark.xdist_group("import_corpus")
"""The tests that read `corpus`: one xdist worker (make test-fast's --dist loadgroup), so the module fixture imports it once."""


def dotted(spec: dict, key: str, default=KeyError):
    node = spec
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is KeyError:
                raise KeyError(key)
            return default
        node = node[part]
    return node


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def _edited(tmp_path: Path, relative: str, old: str, new: str, name: str | None = None) -> str:
    """A copy of a corpus file (or of an edited copy: an absolute path) with `old` replaced by `new`, which must occur."""
    text = (DATA / relative).read_text()
    assert old in text, old
    target = tmp_path / "src" / (name or Path(relative).name)
    target.parent.mkdir(exist_ok=True)
    target.write_text(text.replace(old, new))
    return str(target)


# --- the corpus: hand-written expectations ------------------------------------------------------------------------

@pytest.mark.parametrize("expected", CORPUS)
def test_corpus_spec_and_report_match_the_hand_written_expectations(expected, tmp_path):
    want = tomllib.loads((EXPECTED / expected).read_text())
    spec, entries, result = imported(want["source"], tmp_path)
    assert result.kind.id == want["kind"]
    got = {key: dotted(spec, key, None) for key in want["spec"]}
    assert got == want["spec"]
    statuses = {source: entries[source][0] if source in entries else None for source in want.get("report", {})}
    assert statuses == want.get("report", {})
    for key in want.get("absent", {}).get("keys", []):
        assert dotted(spec, key, None) is None, key


def test_corpus_holds_five_real_configs_per_kind_each_with_its_source():
    readme = (DATA / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)`[^|]*\| [^|]+ \| `[^`]+`[^|]* \| ([0-9a-f]{40}) \|$", readme, re.M))
    kinds: dict[str, int] = {}
    for expected in CORPUS:
        want = tomllib.loads((EXPECTED / expected).read_text())
        assert want["source"] in rows, f"{want['source']} has no row (repository, path, commit) in README.md"
        assert (DATA / want["source"]).is_file()
        kinds[want["kind"]] = kinds.get(want["kind"], 0) + 1
    assert set(kinds) == {"accelerate", "axolotl", "torchtitan", "megatron", "deepspeed"}
    folders: dict[str, int] = {}  # Megatron-Bridge and NeMo apart (issue 52 item 6: 5 more each, at least 8 now)
    for expected in CORPUS:
        folder = tomllib.loads((EXPECTED / expected).read_text())["source"].split("/")[0]
        folders[folder] = folders.get(folder, 0) + 1
    sources = ("accelerate", "axolotl", "deepspeed", "torchtitan", "megatron_bridge", "nemo")  # (+ a JSON a config names)
    assert min(folders.get(f, 0) for f in sources) >= 8, folders
    assert all(config in rows for config in CONFIGS + list(BAD)), [c for c in CONFIGS if c not in rows]


# --- the contract of every report line ------------------------------------------------------------------------------

@pytest.mark.parametrize("relative", CONFIGS)
def test_every_report_line_is_mapped_approximated_with_before_and_after_or_no_equivalent(relative, tmp_path):
    result = import_config(str(DATA / relative), folder=str(tmp_path))
    for entry in result.report.entries:
        line = entry.line()
        assert entry.status in STATUSES and line.startswith(entry.status), line
        if entry.status == APPROXIMATED:
            assert entry.before and entry.after and entry.note, line
            assert f"before: {entry.before}; after: {entry.after}; " in line, line
        elif entry.status == NONE:
            assert entry.note, line  # why, and what to do
        if '"auto"' in entry.note:  # the value used in its place: the key it sets, or said
            assert entry.sets or "the spec uses " in entry.note or "runs with its default " in entry.note, line
        assert "FALSE" not in line, line  # YAML's NO read as a type name


GENERIC_LEFT: dict[str, set[str]] = {}
"""Keys of the corpus still on their kind's catch-all line (no what-to-do): none now (Megatron-Bridge's OptimizerConfig and
rerun-state-machine fields, NeMo's interpolated name, Accelerate's MPI / SageMaker keys got their own lines); a new one
anywhere fails the test below."""


@CORPUS_GROUP
def test_no_corpus_line_is_its_kinds_bare_catch_all_text(corpus):
    """Issue 52: every Axolotl key of the corpus gets a line of its own (what the key does in Axolotl, what fp8launch does or
    the user should do), not "an Axolotl setting fp8launch has no equivalent for"; likewise the other kinds' catch-all, but for
    the keys GENERIC_LEFT names."""
    from launcher.commands.importer import KINDS

    catch_all = {k.id: k.other for k in KINDS if "has no equivalent for" in k.other}  # DeepSpeed's says what it becomes
    assert set(catch_all) == {"accelerate", "axolotl", "torchtitan", "megatron"}
    bare, seen = {}, set()
    for relative, (r, _, _) in corpus.items():
        for e in r.report.entries:
            if e.note == catch_all.get(r.kind.id):
                seen.add((r.kind.id, e.source))
                if e.source not in GENERIC_LEFT.get(r.kind.id, set()):
                    bare[f"{relative}: {e.source}"] = e.note
    assert not bare, bare
    assert {s for _, s in seen} == set().union(set(), *GENERIC_LEFT.values())  # the list shrinks as lines get their own text


BRIDGE_SFT = "megatron_bridge/llama3_8b_sft_gb200_fp8_mx_v1.yaml"


def test_megatron_bridge_optimizer_fields_fp8launch_lacks_say_what_the_run_loses_and_what_to_set(tmp_path):
    """Megatron-Core's OptimizerConfig beyond Adam: a Muon run is trained with AdamW (its line says the update rule is lost and
    what to tune), Lion's options are inert under Muon, half the states on the CPU become DeepSpeed's CPU offload (the whole
    of them: approximated), fp16's loss scaling is the engine's own (before: Megatron's window / hysteresis; after: DeepSpeed's)."""
    path = _edited(tmp_path, BRIDGE_SFT, "  optimizer: adam\n", "  optimizer: muon\n")
    path = _edited(tmp_path, path, "optimizer_cpu_offload: false", "optimizer_cpu_offload: true")
    path = _edited(tmp_path, path, "optimizer_offload_fraction: 0.0", "optimizer_offload_fraction: 0.5")
    path = _edited(tmp_path, path, "  bf16: true\n  first_last_layers_bf16: false\n  fp16: false",
                   "  bf16: false\n  first_last_layers_bf16: false\n  fp16: true")
    spec, entries, result = imported(path, tmp_path)
    muon = next(v for k, v in entries.items() if k.startswith("optimizer.muon_momentum"))
    assert muon[0] == NONE and "the run loses its update rule" in muon[2] and "tune train.lr" in muon[2]
    assert spec["train"]["optimizer"] == "adamw"
    assert "only with optimizer = \"lion\"; this run's is muon" in entries["optimizer.lion_beta1, optimizer.lion_beta2"][2]
    offload = next(v for k, v in entries.items() if k.startswith("optimizer.optimizer_cpu_offload"))
    assert offload[0] == APPROXIMATED and spec["distributed"]["deepspeed"]["offload_optimizer"] == "cpu"
    assert spec["precision"]["high_precision"] == "fp16"
    scale = next(e for e in result.report.entries if e.source.startswith("optimizer.initial_loss_scale"))
    assert scale.status == APPROXIMATED and "loss_scale_window 1000" in scale.before and "hysteresis 2" in scale.before
    assert "halved after 2 overflows" in scale.after  # DeepSpeed's (ZeRO-1 for the distributed optimizer)


def test_megatron_adam_with_coupled_decay_is_torch_adam_and_fp16_on_ddp_scales_with_torch_grad_scaler(tmp_path):
    """decoupled_weight_decay false: Megatron's Adam adds the decay to the gradient (L2), as torch's Adam (train.optimizer
    "adam"); fp16 on DDP (no distributed optimizer): the loss scale is torch.amp.GradScaler's, not Megatron's window."""
    relative = "megatron_bridge/llama32_1b_task_configuration.yaml"
    path = _edited(tmp_path, relative, "decoupled_weight_decay: true", "decoupled_weight_decay: false")
    path = _edited(tmp_path, path, "use_distributed_optimizer: true", "use_distributed_optimizer: false")
    path = _edited(tmp_path, path, "  bf16: true\n  first_last_layers_bf16: false\n  fp16: false",
                   "  bf16: false\n  first_last_layers_bf16: false\n  fp16: true")
    spec, entries, result = imported(path, tmp_path)
    assert spec["train"]["optimizer"] == "adam" and entries["optimizer.decoupled_weight_decay"][0] == MAPPED
    assert spec["distributed"]["strategy"] == "ddp" and "fp16" in (spec["precision"].get("mode"), spec["precision"].get("high_precision"))
    scale = next(e for e in result.report.entries if e.source.startswith("optimizer.initial_loss_scale"))
    assert scale.status == APPROXIMATED and "GradScaler's: from 65536" in scale.after


def test_a_megatron_nan_check_in_rerun_mode_disabled_stops_the_run_as_on_nan_stop(tmp_path):
    """Megatron-Core's RerunStateMachine with rerun_mode "disabled" raises at a rejected (NaN) loss: the run stops, as
    train.on_nan = "stop"; without the check fp8launch still stops (approximated, the line says how to skip instead)."""
    spec, entries, _ = imported("megatron_bridge/llama32_1b_task_configuration.yaml", tmp_path)
    status, sets, _ = entries["rerun_state_machine.check_for_nan_in_loss, rerun_state_machine.rerun_mode"]
    assert (status, sets) == (MAPPED, {"train.on_nan": "stop"}) and spec["train"]["on_nan"] == "stop"
    _, entries, _ = imported("megatron_bridge/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml", tmp_path)
    status, sets, note = entries["rerun_state_machine.check_for_nan_in_loss, rerun_state_machine.rerun_mode"]
    assert status == APPROXIMATED and not sets and 'train.on_nan = "skip"' in note


@pytest.mark.parametrize("relative", CONFIGS)
def test_the_written_spec_plans_and_starts_with_the_report(relative, cli, tmp_path):
    r = cli("import", str(DATA / relative), "--out", "imported.toml")
    assert r.exit_code == 0, r.stderr
    text = (tmp_path / "imported.toml").read_text()
    assert text.startswith("# Imported by `fp8launch import` from ")
    for line in r.stdout.splitlines()[:-2]:  # the report, then "wrote ..." and "next: ..."
        assert f"# {line}" in text
    assert cli("plan", "imported.toml").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["generated", "imported.toml"]  # no temporary file left


@pytest.mark.parametrize("relative", CONFIGS)
def test_a_line_with_no_equivalent_names_its_key_and_quotes_no_value(relative, tmp_path):
    """Import quotes only what it maps (issue 49): a mapped or approximated line shows the value it mapped; a line with no
    equivalent, or of a key the tool does not know, names the key (the value is in the user's file) and goes straight on
    to why (":") or the placeholder it sets ("->"). None of the keys the import maps looks secret (hidden.py)."""
    result = import_config(str(DATA / relative), folder=str(tmp_path))
    for entry in result.report.entries:
        line = entry.line()
        if entry.status == NONE:
            assert re.match(rf"{re.escape(NONE)}\s+{re.escape(entry.source)}( ->|:)", line), line
        else:
            assert not secret_looking(entry.source), line


# --- read as the tool reads it: the installed parsers -------------------------------------------------------------

DEEPSPEED_FILES = [c for c in CONFIGS if c.endswith(".json")]


def _placeholder_keys(result) -> set[str]:
    """The spec keys marked PLACEHOLDER in the written spec (their [table] and key)."""
    keys, table = set(), ""
    for line in result.text.splitlines():
        if m := re.match(r"^\[(.+)\]$", line):
            table = m.group(1)
        elif "# PLACEHOLDER:" in line and not line.startswith("#"):
            keys.add(f"{table}.{line.split(' = ', 1)[0]}")
    return keys


def _deepspeed_config(data: dict, ranks: int, monkeypatch):
    """DeepSpeed 0.19.8's own reading of a config dict, for `ranks` data-parallel ranks."""
    config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(config.dist, "get_rank", lambda *a, **k: 0)

    class Mpu:
        def get_data_parallel_world_size(self):
            return ranks

    return config.DeepSpeedConfig(data, mpu=Mpu())


@pytest.mark.parametrize("relative", DEEPSPEED_FILES)
def test_deepspeed_reads_each_json_as_the_spec_says(relative, tmp_path, monkeypatch):
    spec, entries, result = imported(relative, tmp_path)
    data = json.loads((DATA / relative).read_text())
    t, d = spec["train"], spec["distributed"]
    ranks = d.get("nodes", 1) * d["procs_per_node"] // d.get("tensor_parallel", 1) // d.get("context_parallel", 1)
    auto = {k for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps") if data.get(k) == "auto"}
    if auto:  # what the Hugging Face Trainer fills in: the spec's values
        data = {k: v for k, v in data.items() if k not in auto} | {"train_micro_batch_size_per_gpu": t.get("micro_batch_size", 1)}
    cfg = _deepspeed_config(data, ranks, monkeypatch)
    if d["strategy"] == "deepspeed":  # else a rule moved it to fsdp2 (TP-STRATEGY for AutoTP), the stage not written
        assert cfg.zero_optimization_stage == d["deepspeed"]["zero_stage"]
    assert max(1, cfg.tensor_parallel_config.autotp_size) == d.get("tensor_parallel", 1)  # DeepSpeed's default 0: off
    assert (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (t.get("micro_batch_size", 1),
                                                                                      t.get("grad_accum_steps", 1))
    assert cfg.train_batch_size == d.get("global_batch_size") or "global_batch_size" not in d
    assert cfg.train_batch_size == t.get("micro_batch_size", 1) * t.get("grad_accum_steps", 1) * ranks
    mode = "bf16" if cfg.bfloat16_config.enabled else "fp16" if cfg.float16_config.enabled else "fp32"
    if data.get("bf16", {}).get("enabled") != "auto":  # "auto": the HF Trainer fills it in; read alone DeepSpeed says fp32
        assert spec.get("precision", {}).get("mode", "bf16") == mode
    if data.get("gradient_clipping") != "auto":
        assert t.get("max_grad_norm", 1.0) == cfg.gradient_clipping
    if cfg.scheduler_name is None and cfg.optimizer_params and isinstance(cfg.optimizer_params.get("lr"), float):
        assert (t["warmup_steps"], t["min_lr_ratio"]) == (0, 1.0)  # DeepSpeed builds the optimizer and no scheduler: constant lr
    elif cfg.scheduler_name is None:  # the script's optimizer and lr_scheduler (engine.py _configure_lr_scheduler): placeholders
        assert {"train.warmup_steps", "train.min_lr_ratio"} <= _placeholder_keys(result)
    if cfg.optimizer_params and isinstance(cfg.optimizer_params.get("lr"), float):
        assert t["lr"] == cfg.optimizer_params["lr"]
    for part in ("optimizer", "param"):
        offload = getattr(cfg.zero_config, f"offload_{part}")
        assert d.get("deepspeed", {}).get(f"offload_{part}", "none") == (offload.device if offload else "none")


def test_deepspeed_key_lists_are_the_installed_deepspeeds(monkeypatch):
    pytest.importorskip("deepspeed.runtime.config")
    from deepspeed.runtime import constants
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig

    from launcher.commands.importer import deepspeed as importer
    from launcher.commands.importer.known import deepspeed as known

    seen: set[str] = set()

    class Keys:
        def __init__(self, data):
            self.data = data

        def __contains__(self, key):
            seen.add(key)
            return key in self.data

        def __iter__(self):
            return iter(self.data)

    class Tracked(dict):  # every top-level key DeepSpeedConfig looks up
        def get(self, key, default=None):
            seen.add(key)
            return super().get(key, default)

        def __contains__(self, key):
            seen.add(key)
            return super().__contains__(key)

        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

        def keys(self):
            return Keys(dict(self))

    _deepspeed_config(Tracked(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=1), 1, monkeypatch)
    assert set(known.TOP) - {"msamp"} == seen

    def fields(model):
        return {n for n, f in model.model_fields.items()} | {f.alias for f in model.model_fields.values() if f.alias}

    assert known.STRICT["zero_optimization"] == fields(DeepSpeedZeroConfig)
    assert known.STRICT["zero_optimization.offload_param"] == fields(DeepSpeedZeroOffloadParamConfig)
    assert known.STRICT["zero_optimization.offload_optimizer"] == fields(DeepSpeedZeroOffloadOptimizerConfig)
    assert (known.STRICT["bf16"], known.STRICT["fp16"]) == (fields(DeepSpeedBF16Config), fields(DeepSpeedFP16Config))
    assert DeepSpeedZeroConfig.model_config.get("extra") == "forbid"  # why an unknown key there is refused
    zero = {f.alias or n: f.default for n, f in DeepSpeedZeroConfig.model_fields.items()}
    for key, (default, _) in importer.DEEPSPEED_DEFAULTS.items():
        if key.startswith("zero_optimization."):
            assert zero[key.split(".", 1)[1]] == default, key
    assert (constants.GRADIENT_CLIPPING_DEFAULT, constants.SCHEDULER_TYPE_DEFAULT) == (1.0, None)


ACCELERATE_FILES = [c for c in CONFIGS if c.startswith("accelerate/")]


@pytest.mark.parametrize("relative", ACCELERATE_FILES)
def test_accelerate_loads_each_config_as_the_spec_says(relative, tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    cfg = config_args.load_config_from_file(str(DATA / relative))
    spec, entries, result = imported(relative, tmp_path)
    d = spec["distributed"]
    kind = cfg.distributed_type if isinstance(cfg.distributed_type, bool) else str(cfg.distributed_type.value)
    if kind in (False, "NO"):  # YAML's unquoted NO is false: Accelerate matches it against no type, one process
        assert (d["strategy"], d["procs_per_node"]) == ("ddp", 1)
    else:
        assert d["strategy"] == {"MULTI_GPU": "ddp", "MULTI_CPU": "ddp", "FSDP": "fsdp2", "DEEPSPEED": "deepspeed"}[kind]
        if cfg.num_processes in (None, -1):  # not in the file: `accelerate launch` counts the GPUs; the spec's is a placeholder
            assert "distributed.procs_per_node" in _placeholder_keys(result)
        else:
            assert d["procs_per_node"] * d.get("nodes", 1) == cfg.num_processes
    if kind != "DEEPSPEED":  # there the DeepSpeed JSON's fp16 / bf16 decide
        # none in the file: `accelerate launch` runs "no" (commands/launch.py _validate_launch_command, Accelerate 1.15)
        modes = {"no": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8", None: "fp32"}
        assert spec.get("precision", {}).get("mode") == modes[cfg.mixed_precision]
    if cfg.mixed_precision == "fp8":
        assert spec["precision"]["backend"] == {"TE": "te", "AO": "torchao", "MSAMP": "msamp"}[cfg.fp8_config["backend"]]


def test_accelerate_key_lists_are_the_installed_accelerates():
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    from accelerate.commands.launch import launch_command_parser

    from launcher.commands.importer.known import accelerate as known

    assert set(known.CLUSTER) == set(config_args.ClusterConfig.__dataclass_fields__) | {"fp16", "dynamo_backend"}
    assert set(known.SAGEMAKER) == set(config_args.SageMakerConfig.__dataclass_fields__) | {"fp16", "dynamo_backend"}
    assert set(known.LAUNCH) == {a.dest for a in launch_command_parser()._actions}


def test_a_top_level_key_accelerate_refuses_is_refused(cli, tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    with pytest.raises(ValueError, match="had unknown keys"):
        config_args.load_config_from_file(str(DATA / "accelerate/invalid_keys.yaml"))
    r = cli("import", str(DATA / "accelerate/invalid_keys.yaml"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "invalid_key is unknown to Accelerate" in r.stderr
    assert "another_invalid_key" in r.stderr and not list(tmp_path.glob("*.toml"))


# --- the cases, each on a real file ----------------------------------------------------------------------

FSDP2_VARIANTS = {
    "as shipped": ("fsdp_version: 2\nfsdp_config:\n", "fsdp_version: 2\nfsdp_config:\n"),
    "fsdp_version inside fsdp_config": ("fsdp_version: 2\nfsdp_config:\n", "fsdp_config:\n  fsdp_version: 2\n"),
    "its alias version inside fsdp_config": ("fsdp_version: 2\nfsdp_config:\n", "fsdp_config:\n  version: 2\n"),
}


@pytest.mark.parametrize("variant", FSDP2_VARIANTS)
def test_axolotl_3b_fp8_fsdp2_imports_as_fsdp2_with_float8_all_gather_and_compile(variant, tmp_path):
    path = _edited(tmp_path, "axolotl/3b-fp8-fsdp2.yaml", *FSDP2_VARIANTS[variant])
    r = import_config(path, folder=str(tmp_path))
    spec = tomllib.loads(r.text)
    assert spec["distributed"]["strategy"] == "fsdp2"
    assert spec["precision"]["torchao"]["fsdp_float8_all_gather"] is True and spec["compile"]["enabled"] is True
    lines = "\n".join(r.report.lines())
    assert "FSDP1 tuning knob" not in lines and "DDP" not in lines


def test_axolotl_fsdp_config_without_a_version_is_fsdp1_approximated_not_ddp(tmp_path):
    path = _edited(tmp_path, "axolotl/3b-fp8-fsdp2.yaml", "fsdp_version: 2\n", "")
    r = import_config(path, folder=str(tmp_path))
    entry = next(e for e in r.report.entries if ("distributed.strategy", "fsdp2") in e.sets)
    assert tomllib.loads(r.text)["distributed"]["strategy"] == "fsdp2"
    assert entry.status == APPROXIMATED and entry.before.startswith("FSDP1") and "FSDP2" in entry.after


def test_axolotl_reshard_false_is_not_passed_so_fsdp2_reshards(tmp_path):
    path = _edited(tmp_path, "axolotl/3b-fp8-fsdp2.yaml", "reshard_after_forward: true", "reshard_after_forward: false")
    r = import_config(path, folder=str(tmp_path))
    assert tomllib.loads(r.text)["distributed"]["fsdp2"]["reshard_after_forward"] is True
    assert "only when true" in next(e.note for e in r.report.entries if e.source == "fsdp_config.reshard_after_forward")


@pytest.mark.parametrize("name,states,status", [("adamw_torch_8bit", "int8", MAPPED), ("ao_adamw_fp8", "fp8", MAPPED),
                                                ("adamw_bnb_8bit", "int8", APPROXIMATED)])
def test_axolotl_low_bit_optimizers_map_to_optimizer_states(name, states, status, tmp_path):
    path = _edited(tmp_path, "axolotl/adamw-pretrain-fsdp2.yaml", "optimizer: adamw_torch_fused", f"optimizer: {name}")
    r = import_config(path, folder=str(tmp_path))
    assert tomllib.loads(r.text)["precision"]["optimizer_states"] == states
    assert next(e.status for e in r.report.entries if e.source == "optimizer") == status


def test_axolotl_alst_context_parallel_size_8_imports_as_context_parallel_8_with_axolotls_batch(cli, tmp_path):
    # the done-when: Axolotl ALST's context_parallel_size: 8 imports as distributed.context_parallel = 8
    assert cli("import", str(DATA / "axolotl/llama3-8b-fsdp2-alst.yaml"), "--out", "s.toml").exit_code == 0
    spec = tomllib.loads((tmp_path / "s.toml").read_text())
    assert spec["distributed"]["context_parallel"] == 8 and spec["train"]["grad_accum_steps"] == 1
    for world, batch in ((8, 1), (16, 2), (32, 4)):
        # Axolotl's batch_size: micro 1 x accum 1 x world / context_parallel_size 8 (utils/config/__init__.py)
        r = cli("plan", "s.toml", "--set", f"distributed.procs_per_node={world}", "--format", "json")
        assert r.exit_code == 0, r.stderr
        d = json.loads(r.stdout)["plan"]["distributed"]
        assert (d["context_parallel"], d["global_batch_size"]) == (8, batch)


def _alst(tmp_path: Path, old: str = "context_parallel_size: 8\n", new: str = "context_parallel_size: 8\n"):
    """The Axolotl ALST example (FSDP2, micro 1 x accum 1, sequence_len 500_000, context_parallel_size 8), edited."""
    return import_config(_edited(tmp_path, "axolotl/llama3-8b-fsdp2-alst.yaml", old, new), folder=str(tmp_path))


def test_axolotl_deprecated_sequence_parallel_degree_is_context_parallel_unless_context_parallel_size_is_set(tmp_path):
    r = _alst(tmp_path, new="sequence_parallel_degree: 4\n")
    e = {x.source: x for x in r.report.entries}
    assert tomllib.loads(r.text)["distributed"]["context_parallel"] == 4 and e["sequence_parallel_degree"].status == MAPPED
    r = _alst(tmp_path, new="context_parallel_size: 2\nsequence_parallel_degree: 4\n")  # check_context_parallel_size
    e = {x.source: x for x in r.report.entries}
    assert tomllib.loads(r.text)["distributed"]["context_parallel"] == 2
    assert "only without context_parallel_size" in e["sequence_parallel_degree"].note


def test_axolotl_ring_attention_options_have_no_equivalent_and_say_so(tmp_path):
    r = _alst(tmp_path, new="context_parallel_size: 8\nring_attn_func: batch_zigzag\nheads_k_stride: 2\n")
    e = {x.source: x for x in r.report.entries}
    assert e["ring_attn_func"].status == NONE and "torch's ring attention" in e["ring_attn_func"].note
    assert e["heads_k_stride"].status == NONE
    r = _alst(tmp_path, new="context_parallel_size: 1\nring_attn_func: batch_ring\n")
    assert next(x for x in r.report.entries if x.source == "ring_attn_func").note.endswith("no effect")


def test_axolotl_sequence_not_divisible_by_twice_the_context_parallel_is_rounded_up_naming_the_rule(tmp_path):
    r = _alst(tmp_path, "sequence_len: 500_000", "sequence_len: 500_001")  # Axolotl pads each batch for its ring
    entry = next(x for x in r.report.entries if x.source == "sequence_len")
    assert tomllib.loads(r.text)["train"]["seq_len"] == 500_016  # the next multiple of 2 x 8
    assert entry.status == APPROXIMATED and "rule CP-SEQ" in entry.note


def test_axolotl_context_parallel_with_compile_keeps_context_parallel_and_turns_compile_off(tmp_path):
    r = _alst(tmp_path, new="context_parallel_size: 8\ntorch_compile: true\n")
    spec, entry = tomllib.loads(r.text), next(x for x in r.report.entries if x.source == "torch_compile")
    assert spec["distributed"]["context_parallel"] == 8 and spec["compile"]["enabled"] is False
    assert entry.status == APPROXIMATED and "rule CP-COMPILE" in entry.note


def test_axolotl_context_parallel_on_a_local_hf_model_becomes_data_parallel_naming_the_rule(tmp_path):
    folder = tmp_path / "src" / "llama-3.2-3b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((DATA.parent / "llama-3.2-3b.json").read_text())
    r = _alst(tmp_path, "base_model: meta-llama/Llama-3.1-8B", "base_model: llama-3.2-3b")
    spec, e = tomllib.loads(r.text), {x.source: x for x in r.report.entries}
    assert spec["train"]["model"].startswith("hf:") and spec["distributed"]["context_parallel"] == 1
    assert e["context_parallel_size"].status == APPROXIMATED and "rule CP-MODEL" in e["context_parallel_size"].note
    # micro 1 x accum 1 x 8 placeholder ranks / 8 = 1 sequence per step in Axolotl; 8 whole sequences here
    accum = e["gradient_accumulation_steps"]
    assert accum.status == APPROXIMATED and accum.before.startswith("1 sequence per step") and accum.after.startswith("8 sequences")


def test_torchtitan_pipeline_degree_imports_as_pipeline_parallel_with_its_schedule(tmp_path):
    path = _edited(tmp_path, "torchtitan/llama3_405b_2025.toml", "tensor_parallel_degree = 8", "tensor_parallel_degree = 1")
    path = _edited(tmp_path, path, "enable_async_tensor_parallel = true", "enable_async_tensor_parallel = false")
    path = _edited(tmp_path, path, "pipeline_parallel_degree = 1",
                   'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved1F1B"')
    r = import_config(path, folder=str(tmp_path))
    spec, e = tomllib.loads(r.text), {x.source: x for x in r.report.entries}
    assert spec["distributed"]["pipeline_parallel"] == 2 and spec["distributed"]["strategy"] == "fsdp2"
    assert e["parallelism.pipeline_parallel_degree"].status == MAPPED
    assert e["parallelism.pipeline_parallel_schedule"].status == MAPPED
    assert spec["distributed"]["pipeline"]["schedule"] == "Interleaved1F1B"
    # llama3-70b's 80 blocks over 2 ranks x 2 stages (torchtitan's stages a rank for a multi-stage schedule), 20 each;
    # torchtitan's batch_size 2 per rank: 2 micro-batches of one sequence
    assert spec["distributed"]["pipeline"].get("layers_per_stage", []) == [] and "stages_per_rank" not in spec["distributed"]["pipeline"]
    # torchtitan's fsdp_reshard_after_forward "default" (unset here) keeps the weights gathered under pipeline parallel
    assert spec["distributed"]["fsdp2"]["reshard_after_forward"] is False
    assert e["(parallelism.fsdp_reshard_after_forward)"].status == MAPPED


@pytest.mark.parametrize("name,expected,status", [("ZBVZeroBubble", "ZBVZeroBubble", MAPPED), ("gpipe", "GPipe", MAPPED),
                                                  ("InterleavedZeroBubble", "Interleaved1F1B", APPROXIMATED),
                                                  ("DualPipeV", "ZBVZeroBubble", APPROXIMATED)])
def test_torchtitan_pipeline_schedules_import_as_the_schedule_with_their_stages_a_rank(tmp_path, name, expected, status):
    """torch's get_schedule_class reads the name in any case; InterleavedZeroBubble (a loop of stages) and DualPipeV (a V)
    become the schedule of fp8launch's that holds the same stages on each rank. compile = true in the source: ZBV's
    refusal of compiled stages (PP-ZBV-COMPILE) moves it to Interleaved1F1B, naming the rule."""
    path = _edited(tmp_path, "torchtitan/llama3_405b_2025.toml", "tensor_parallel_degree = 8", "tensor_parallel_degree = 1")
    path = _edited(tmp_path, path, "enable_async_tensor_parallel = true", "enable_async_tensor_parallel = false")
    path = _edited(tmp_path, path, "compile = true", "compile = false")
    path = _edited(tmp_path, path, "pipeline_parallel_degree = 1", f'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "{name}"')
    r = import_config(path, folder=str(tmp_path))
    spec, e = tomllib.loads(r.text), {x.source: x for x in r.report.entries}
    assert spec["distributed"]["pipeline"]["schedule"] == expected and e["parallelism.pipeline_parallel_schedule"].status == status


def test_the_placeholder_world_holds_every_degree_the_source_states_none_is_lowered_to_fit_it(tmp_path):
    """Issue 52: tp 8 x pp 2 on fp8launch's 8 placeholder ranks lost the pipeline (PP-DIVIDES-WORLD); the placeholder world now
    holds both (2 nodes x 8), and its line says why."""
    path = _edited(tmp_path, "torchtitan/llama3_405b_2025.toml", "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2")
    r = import_config(path, folder=str(tmp_path))
    spec, e = tomllib.loads(r.text), {x.source: x for x in r.report.entries}
    d = spec["distributed"]
    assert (d["tensor_parallel"], d["pipeline_parallel"]) == (8, 2) and d.get("nodes", 1) * d["procs_per_node"] % 16 == 0
    assert e["parallelism.pipeline_parallel_degree"].status == MAPPED
    assert "holds the source's degrees (tensor 8 x pipeline 2)" in e["(world size)"].note


WORLD_RULES = {"TP-DIVIDES-PROCS", "PP-DIVIDES-WORLD", "CP-DIVIDES-WORLD", "EP-DIVIDES-WORLD", "MEMORY-EXCEEDS-GPU"}
"""The rules a placeholder world size decides against a degree (the model's: placeholders.MODEL_RULES)."""


@CORPUS_GROUP
def test_no_corpus_degree_is_lowered_to_fit_a_placeholder_and_a_lowered_one_names_a_rule_of_the_source(corpus):
    """Issue 52, placeholders never decide: in every corpus config, each degree the source states (tp, pp, cp, ep, virtual
    stages a rank) is kept, or lowered by a rule about the source's own settings (TE beside TP, a pipeline beside EP, one
    sequence a step under a pipeline, ...) which its line names; never by a rule of a placeholder's model (its heads, blocks,
    experts) or world. The torchtitan Llama 4 17Bx128E lost TP 8 -> 4 on the placeholder's KV heads, NeMo's Nemotron 340B
    its 12 virtual stages -> 10 on the placeholder's 80 blocks."""
    from launcher.commands.importer import placeholders

    kept, wrong = 0, {}
    for relative, (r, _, stated) in corpus.items():
        spec = tomllib.loads(r.text)
        placeholder_rules = (placeholders.MODEL_RULES if stated["model"] else set()) | (WORLD_RULES if stated["world"] else set())
        for key in (f"distributed.{k}" for k in DEGREES):
            want, got = stated[key], max(1, dotted(spec, key, 1) or 1)
            if want == 1 or (key.endswith("stages_per_rank") and dotted(spec, "distributed.pipeline_parallel", 1) == 1):
                continue  # no degree stated; virtual stages go with their pipeline (whose line names the rule)
            if got == want:
                kept += 1
                continue
            rules = {rule for e in r.report.entries if e.status == APPROXIMATED and dict(e.sets).get(key) == dotted(spec, key, 1)
                     for rule in re.findall(r"rule ([A-Z0-9-]+) refuses", e.note)}
            if not rules or rules & placeholder_rules:
                wrong[f"{relative}: {key}"] = (want, got, sorted(rules))
    assert not wrong, wrong
    assert kept >= 30, kept  # the corpus states degrees: 32 kept now (e.g. TP 8 of Llama 4 17Bx128E, 12 stages of Nemotron)


def test_an_expert_parallel_degree_the_placeholders_experts_do_not_hold_moves_the_placeholder_not_the_degree(tmp_path):
    """DeepSeek-V3 671B at EP 256 (its 256 experts): the placeholder qwen3-30b-a3b's 128 experts refuse it (EP-DIVIDES-EXPERTS);
    the placeholder takes 256 experts (the builtin's own ?experts=N), and the line says why; EP stays 256 (was: lowered to 128)."""
    path = _edited(tmp_path, "torchtitan/deepseek_v3_671b.toml", "expert_parallel_degree = 1\n", "expert_parallel_degree = 256\n")
    spec, entries, _ = imported(path, tmp_path)
    assert spec["distributed"]["expert_parallel"] == 256 and entries["parallelism.expert_parallel_degree"][0] == MAPPED
    assert spec["train"]["model"] == "builtin:qwen3-30b-a3b?experts=256"
    note = entries["model.name, model.flavor"][2]
    assert "rule EP-DIVIDES-EXPERTS refuses it" in note and "?experts=256: 256 experts, a multiple of its expert_parallel" in note


def _titan_cp(tmp_path: Path, tp: int, more: str = "") -> tuple[dict, dict]:
    """llama3_405b_2025.toml (batch_size 2 per rank, compile, torchao float8) with tensor_parallel_degree `tp` and
    context_parallel_degree 2 (and `more` [parallelism] lines): (spec, {source: entry})."""
    path = _edited(tmp_path, "torchtitan/llama3_405b_2025.toml", "tensor_parallel_degree = 8", f"tensor_parallel_degree = {tp}")
    path = _edited(tmp_path, path, "enable_async_tensor_parallel = true", "enable_async_tensor_parallel = false")
    path = _edited(tmp_path, path, "context_parallel_degree = 1", f"context_parallel_degree = 2\n{more}")
    r = import_config(path, folder=str(tmp_path))
    return tomllib.loads(r.text), {x.source: x for x in r.report.entries}


def test_torchtitan_context_parallel_degree_imports_as_context_parallel_its_options_said(tmp_path):
    spec, e = _titan_cp(tmp_path, 1, 'context_parallel_rotate_method = "alltoall"\ncontext_parallel_load_balancer = "ptrr"')
    d = spec["distributed"]
    assert (d["context_parallel"], d["strategy"]) == (2, "fsdp2") and e["parallelism.context_parallel_degree"].status == MAPPED
    # torchtitan's batch: batch_size 2 x 8 placeholder ranks / cp 2 = 8 sequences, the spec's micro 2 x accum 1 x 4 ranks
    assert (spec["train"]["micro_batch_size"], spec["train"].get("grad_accum_steps", 1)) == (2, 1)
    rotate, balancer = e["parallelism.context_parallel_rotate_method"], e["parallelism.context_parallel_load_balancer"]
    assert rotate.status == APPROXIMATED and "alltoall" in rotate.before and "allgather" in rotate.after
    assert balancer.status == APPROXIMATED and "ptrr" in balancer.before and "head-tail" in balancer.after
    # compile on beside context parallel: compile off (CP-COMPILE), context parallel kept
    compile_entry = next(x for x in e.values() if ("compile.enabled", False) in x.sets)
    assert spec["compile"]["enabled"] is False and "rule CP-COMPILE" in compile_entry.note
    spec, e = _titan_cp(tmp_path, 1, 'context_parallel_rotate_method = "allgather"')  # torch's default, which fp8launch runs
    assert e["parallelism.context_parallel_rotate_method"].status == MAPPED


def test_torchtitan_context_parallel_beside_tensor_parallel_becomes_data_parallel_naming_the_rule(tmp_path):
    spec, e = _titan_cp(tmp_path, 4)  # tp 4 x cp 2 divides the 8 placeholder ranks: only CP-TENSOR-PARALLEL refuses
    entry, batch = e["parallelism.context_parallel_degree"], e["training.batch_size"]
    assert spec["distributed"]["tensor_parallel"] == 4 and spec["distributed"]["context_parallel"] == 1
    assert entry.status == APPROXIMATED and "rule CP-TENSOR-PARALLEL" in entry.note
    # torchtitan: batch_size 2 x world / (tp 4 x cp 2) sequences; the spec: 2 x world / 4, twice as many (the placeholder
    # world grows past 8 where the placeholder model's states need it: MEMORY-EXCEEDS-GPU, degrees kept)
    world = spec["distributed"].get("nodes", 1) * spec["distributed"]["procs_per_node"]
    assert batch.status == APPROXIMATED and batch.before.startswith(f"{2 * world // 8} sequences")
    assert batch.after.startswith(f"{2 * world // 4} sequences")


MEGATRON_CP = """
    mixed_precision: bf16_mixed
    model:
      tensor_model_parallel_size: 1
      context_parallel_size: 4
      seq_length: 8192{comm}
    train:
      train_iters: 50
      global_batch_size: 16
      micro_batch_size: 1
    """


@pytest.mark.parametrize("comm,status", [(None, None), ("all_gather", MAPPED), ("a2a", APPROXIMATED), ("p2p", APPROXIMATED)])
def test_megatron_context_parallel_size_imports_as_context_parallel_keeping_the_global_batch(comm, status, tmp_path):
    text = MEGATRON_CP.replace("{comm}", f"\n      cp_comm_type: {comm}" if comm else "")
    r = import_config(_write(tmp_path, "mb.yaml", text), folder=str(tmp_path))
    spec, e = tomllib.loads(r.text), {x.source: x for x in r.report.entries}
    d = spec["distributed"]
    # 8 placeholder ranks / cp 4 = 2 data-parallel ranks: 16 = micro 1 x accum 8 x 2, as Megatron counts them
    assert (d["context_parallel"], d["global_batch_size"], spec["train"]["grad_accum_steps"]) == (4, 16, 8)
    assert e["model.context_parallel_size"].status == MAPPED
    assert d["strategy"] == "fsdp2" and "rule CP-STRATEGY" in e["(strategy)"].note  # Megatron's DDP: FSDP2 under CP
    if comm:
        assert e["model.cp_comm_type"].status == status


def test_accelerate_cp_size_imports_as_context_parallel(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = _edited(tmp_path, "accelerate/fsdp.yaml", "fsdp_use_orig_params: true\n", "fsdp_use_orig_params: true\nparallelism_config:\n"
                   "  parallelism_config_cp_size: 2\n  parallelism_config_cp_comm_strategy: alltoall\n")
    assert config_args.load_config_from_file(path).parallelism_config["parallelism_config_cp_size"] == 2  # Accelerate reads it
    r = import_config(path, folder=str(tmp_path))
    e = {x.source: x for x in r.report.entries}
    assert tomllib.loads(r.text)["distributed"]["context_parallel"] == 2
    assert e["parallelism_config.parallelism_config_cp_size"].status == MAPPED
    assert e["parallelism_config.parallelism_config_cp_comm_strategy"].status == APPROXIMATED


def test_context_parallel_off_makes_its_ranks_data_parallel_and_a_sequence_rounds_to_twice_its_degree():
    from launcher.commands.importer.draft import Draft
    from launcher.commands.importer.planable import FIXES

    d = Draft({}, path="x", title="test")
    d.set("distributed.context_parallel", 4)
    d.set("train.seq_len", 1000)
    assert FIXES["CP-SEQ"].change(d) == []  # already a multiple of 2 x 4
    d.set("train.seq_len", 1001)
    assert FIXES["CP-SEQ"].change(d) == [("train.seq_len", 1008)]
    assert FIXES["CP-BACKEND"].change(d) == [("distributed.context_parallel", 1)] and d.batch.split == 4
    d.set("distributed.context_parallel", 1)
    assert FIXES["CP-MODEL"].change(d) == [] and d.batch.split == 4  # nothing left to turn off


@pytest.mark.parametrize("rule", ["TP-STRATEGY", "PP-STRATEGY", "EP-STRATEGY", "CP-STRATEGY"])
def test_a_deepspeed_config_moved_to_fsdp2_keeps_its_offload_as_fsdp2s(rule):
    """Moving off DeepSpeed for a parallelism it does not run here carries its CPU / NVMe offload to FSDP2's CPU offload
    (the ALST corpus file shows it end to end); a DeepSpeed config without offload, or a DDP one, moves alone."""
    from launcher.commands.importer.draft import Draft
    from launcher.commands.importer.planable import FIXES

    d = Draft({}, path="x", title="test")
    d.set("distributed.strategy", "deepspeed")
    assert FIXES[rule].change(d) == [("distributed.strategy", "fsdp2")]
    d.set("distributed.deepspeed.offload_optimizer", "nvme")
    (move, (key, value, note)) = FIXES[rule].change(d)
    assert move == ("distributed.strategy", "fsdp2") and (key, value) == ("distributed.fsdp2.cpu_offload", True)
    assert "distributed.deepspeed.offload_optimizer = 'nvme'" in note and "offload_param" not in note
    d.set("distributed.strategy", "ddp")
    assert FIXES[rule].change(d) == [("distributed.strategy", "fsdp2")]
    # FSDP2's CPU offload leaves torchao's precomputed float8 scale without effect (FP8-PRECOMPUTE-OFFLOAD): it goes
    assert FIXES["FP8-PRECOMPUTE-OFFLOAD"].change(d) == [("precision.torchao.precompute_scale", False)]


def test_a_pipeline_whose_stages_do_not_divide_the_blocks_gets_a_split():
    from launcher.commands.importer.draft import Draft
    from launcher.commands.importer.planable import FIXES

    d = Draft({}, path="x", title="test")
    d.set("train.model", "builtin:llama-small")  # 12 blocks
    d.set("distributed.pipeline_parallel", 5)
    assert FIXES["PP-LAYERS"].change(d) == [("distributed.pipeline.layers_per_stage", [3, 3, 2, 2, 2])]
    d.set("distributed.pipeline_parallel", 16)  # more stages than blocks: no pipeline, its ranks data-parallel
    assert FIXES["PP-LAYERS"].change(d) == [("distributed.pipeline_parallel", 1)] and d.batch.split == 16


def test_megatron_pipeline_with_transformer_engine_becomes_data_parallel_naming_the_rule(tmp_path):
    spec, e, _ = imported("nemo/gpt3_mlperf.yaml", tmp_path)
    status, sets, note = e["model.pipeline_model_parallel_size"]
    assert status == APPROXIMATED and sets == {"distributed.pipeline_parallel": 1} and "rule PP-BACKEND" in note
    # its virtual stages (3 a rank: Interleaved1F1B) go with the pipeline; no [distributed.pipeline] is left behind
    status, sets, note = e["model.virtual_pipeline_model_parallel_size"]
    assert status == APPROXIMATED and sets == {} and "rule PP-BACKEND" in note and "not written" in note
    assert "pipeline" not in spec["distributed"] and not any(x.startswith("(rule PP-LAYERS") for x in e)
    assert spec["distributed"]["global_batch_size"] == 8  # the source's global batch, its stages' ranks data-parallel


def test_a_refused_line_says_the_rule_before_what_the_mapping_would_have_done(tmp_path):
    """torchtitan's context_parallel_degree beside tensor parallel: the line reads as what the spec runs (cp 1, rule
    CP-TENSOR-PARALLEL), the note on how CP would have run comes after, marked as the mapping before the rule."""
    path = _write(tmp_path, "cp-tp.toml", """
        [model]
        name = "llama3"
        flavor = "debugmodel"
        [training]
        local_batch_size = 2
        seq_len = 2048
        [parallelism]
        tensor_parallel_degree = 2
        context_parallel_degree = 2
        """)
    r = import_config(path, folder=str(tmp_path))
    entry = next(x for x in r.report.entries if x.source == "parallelism.context_parallel_degree")
    assert entry.status == APPROXIMATED and entry.sets == [("distributed.context_parallel", 1)]
    assert entry.note.startswith("rule CP-TENSOR-PARALLEL refuses distributed.context_parallel = 2")
    assert "; as mapped, before the rule: torch's context_parallel" in entry.note


def test_a_pipeline_with_fewer_sequences_per_step_than_stages_becomes_data_parallel(tmp_path):
    path = _edited(tmp_path, "torchtitan/llama3_405b_2025.toml", "tensor_parallel_degree = 8", "tensor_parallel_degree = 1")
    path = _edited(tmp_path, path, "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4")  # batch_size 2 per rank
    r = import_config(path, folder=str(tmp_path))
    assert tomllib.loads(r.text)["distributed"].get("pipeline_parallel", 1) == 1
    entry = next(x for x in r.report.entries if x.source == "parallelism.pipeline_parallel_degree")
    assert entry.status == APPROXIMATED and "rule PP-MICROBATCHES" in entry.note


def test_axolotl_misspelt_key_is_reported_with_did_you_mean(tmp_path):
    path = _edited(tmp_path, "axolotl/3b-fp8-fsdp2.yaml", "fp8_enable_fsdp_float8_all_gather:", "fp8_enable_fsdp_float8_allgather:")
    r = import_config(path, folder=str(tmp_path))
    entry = next(e for e in r.report.entries if e.source == "fp8_enable_fsdp_float8_allgather")
    assert entry.status == NONE and "did you mean fp8_enable_fsdp_float8_all_gather?" in entry.note
    assert "fsdp_float8_all_gather" not in tomllib.loads(r.text)["precision"]["torchao"]  # Axolotl drops it: no all-gather


def test_torchtitan_string_converters_import_as_fp8_with_their_float8_keys(tmp_path):
    spec, entries, r = imported("torchtitan/llama3_405b_2025.toml", tmp_path)
    assert spec["precision"]["mode"] == "fp8" and spec["precision"]["torchao"]["fsdp_float8_all_gather"] is True
    assert "splits it on commas" in entries["model.converters"][2]
    assert all(entries[f"float8.{k}"][0] != NONE for k in ("enable_fsdp_float8_all_gather",
                                                          "precompute_float8_dynamic_scale_for_fsdp", "filter_fqns"))


@pytest.mark.parametrize("old,new,message", [
    ("[training]", "[trainig]", "[trainig] is unknown to torchtitan (did you mean [training]?)"),
    ("[quantize.linear.float8]", "[quantize.linaer.float8]",
     "[quantize.linaer] is unknown to torchtitan (did you mean [quantize.linear]?)"),
    ("seq_len = 8192", "seq_lenn = 8192", "training.seq_lenn is unknown to torchtitan (did you mean training.seq_len?)"),
    ('converters = ["float8"]', 'converters = ["flaot8"]', 'model.converters "flaot8" is unknown to torchtitan (did you mean "float8"?)'),
    ('converters = ["float8"]', 'converters = "float8,mx"', "mixes float8 and mx converters"),
])
def test_a_misspelt_torchtitan_section_key_or_converter_exits_2_with_did_you_mean(old, new, message, cli, tmp_path):
    path = _edited(tmp_path, "torchtitan/llama3_405b.toml", old, new)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = cli("import", path)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert r.stdout == "" and sorted(p.name for p in tmp_path.rglob("*")) == before


def test_torchtitan_unknown_sections_of_a_custom_config_module_are_reported(tmp_path):
    path = _edited(tmp_path, "torchtitan/llama3_405b.toml", '[job]\n', '[job]\ncustom_config_module = "my.job_config"\n')
    path = _edited(tmp_path, path, "[validation]", "[my_extension]\nx = 1\n\n[validation]")
    entry = next(e for e in import_config(path, folder=str(tmp_path)).report.entries if e.source == "my_extension")
    assert entry.status == NONE and "custom config module my.job_config" in entry.note


def test_torchtitan_experts_only_mxfp8(tmp_path):
    # docs/mxfp8.md: llama4_17bx16e.toml with --model.converters="quantize.grouped_mm.mx" --quantize.grouped_mm.mx.fqns="experts"
    path = _edited(tmp_path, "torchtitan/llama4_17bx16e.toml", 'hf_assets_path = "./assets/hf/Llama-4-Scout-17B-16E"\n',
                   'hf_assets_path = "./assets/hf/Llama-4-Scout-17B-16E"\nconverters = ["quantize.grouped_mm.mx"]\n')
    path = _edited(tmp_path, path, '[quantize.linear.mx]', '[quantize.grouped_mm.mx]\nfqns = ["experts"]\n\n'
                   '[quantize.grouped_mm.float8]\nfqns = ["experts"]\n\n[quantize.linear.mx]')
    r = import_config(path, folder=str(tmp_path))
    p = tomllib.loads(r.text)["precision"]
    assert (p["mode"], p["torchao"]["recipe"], p["keep"]) == ("fp8", "mxfp8", ["*"])
    assert p["rules"] == [{"match": "*.moe.experts", "recipe": "mxfp8"}]
    e = {x.source: x for x in r.report.entries}
    assert e["quantize.grouped_mm.mx.fqns"].status == MAPPED and e["quantize.grouped_mm.float8.fqns"].status == NONE
    assert "no converter in model.converters reads this section" in e["quantize.grouped_mm.float8.fqns"].note


def test_deepspeed_json_without_a_scheduler_trains_at_a_constant_lr(tmp_path):
    from launcher.train.optim import lr_factor

    spec, entries, r = imported("deepspeed/zero3_bf16_baseline.json", tmp_path)
    t = spec["train"]
    factors = [lr_factor(step, warmup_steps=t["warmup_steps"], steps=3, min_lr_ratio=t["min_lr_ratio"]) for step in range(3)]
    assert factors == [1.0, 1.0, 1.0]  # before this fix: cosine to 0.1 (2e-5 -> 6.5e-6 over a 3-step run)
    assert entries["(scheduler)"][0] == MAPPED


@pytest.mark.parametrize("relative,world,accum,global_", [
    ("deepspeed/deepspeed_bsz24_config.json", 4, 2, 24),                     # train_batch_size 24, micro 3
    ("megatron_bridge/llama32_1b_task_configuration.yaml", 2, 256, 512),     # global 512, micro 1
])
def test_a_fixed_global_batch_survives_a_change_of_world_size_or_is_refused(relative, world, accum, global_, cli, tmp_path):
    assert cli("import", str(DATA / relative), "--out", "s.toml").exit_code == 0
    refused = cli("plan", "s.toml", "--set", f"distributed.procs_per_node={world}")
    assert refused.exit_code == 2 and "BATCH-MISMATCH" in refused.stderr and f"global_batch_size = {global_}" in refused.stderr
    kept = cli("plan", "s.toml", "--set", f"distributed.procs_per_node={world}", "--set", f"train.grad_accum_steps={accum}",
               "--format", "json")
    assert kept.exit_code == 0, kept.stderr
    assert json.loads(kept.stdout)["plan"]["distributed"]["global_batch_size"] == global_


def test_a_batch_the_source_does_not_fix_follows_the_world_size(cli, tmp_path):
    assert cli("import", str(DATA / "axolotl/3b-fp8-fsdp2.yaml"), "--out", "s.toml").exit_code == 0
    assert "global_batch_size" not in (tmp_path / "s.toml").read_text()
    r = cli("plan", "s.toml", "--set", "distributed.procs_per_node=2", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["plan"]["distributed"]["global_batch_size"] == 16 * 2  # as Axolotl on 2 GPUs


def test_megatron_bridge_dump_trains_at_the_datasets_length_and_says_the_model_is_untied(tmp_path):
    spec, entries, r = imported("megatron_bridge/llama32_1b_task_configuration.yaml", tmp_path)
    assert spec["train"]["seq_len"] == 1024 and "131072" not in r.text.split("version = 1")[1]
    model = next(e for e in r.report.entries if ("train.model", "builtin:llama3-1b") in e.sets)
    assert model.status == APPROXIMATED and "1.24B parameters" in model.before and "1.50B parameters" in model.after


def test_megatron_fp8_param_gather_false_says_high_precision_weights(tmp_path):
    path = _write(tmp_path, "mb.yaml", """
        mixed_precision:
          fp8: hybrid
          fp8_recipe: tensorwise
          fp8_param_gather: false
        model:
          tensor_model_parallel_size: 1
        train:
          train_iters: 50
          global_batch_size: 16
          micro_batch_size: 2
        """)
    entry = next(e for e in import_config(path, folder=str(tmp_path)).report.entries if e.source == "mixed_precision.fp8_param_gather")
    assert entry.status == MAPPED and "high precision" in entry.note and "kept in FP8" not in entry.note


def test_megatron_bridge_named_recipe(tmp_path):
    path = _write(tmp_path, "mb.yaml", """
        mixed_precision: bf16_with_fp8_current_scaling_mixed
        model:
          tensor_model_parallel_size: 1
        train:
          train_iters: 50
          global_batch_size: 16
          micro_batch_size: 2
        """)
    spec = tomllib.loads(import_config(path, folder=str(tmp_path)).text)
    assert spec["precision"]["te"]["recipe"] == "current" and spec["precision"]["keep_first_blocks"] == 1
    assert (spec["train"]["grad_accum_steps"], spec["distributed"]["global_batch_size"]) == (1, 16)  # 16 = 2 x 1 x 8 ranks


def test_megatron_bridge_llama3_8b_fp8_current_scaling(tmp_path):
    spec, e, r = imported("megatron_bridge/llama3_8b_fp8cs.yaml", tmp_path)
    assert spec["precision"]["te"]["recipe"] == "current" and spec["precision"]["te"]["fp8_params"] is False
    assert (spec["precision"]["keep_first_blocks"], spec["precision"]["keep_last_blocks"]) == (1, 1)
    t = spec["train"]
    assert (t["model"], t["seq_len"], t["grad_accum_steps"], spec["distributed"]["global_batch_size"]) == \
        ("builtin:llama3-8b", 8192, 96, 768)
    assert e["mixed_precision.fp8_param_gather"][0] == APPROXIMATED
    # context parallel beside Transformer Engine: off, its 2 ranks data-parallel; the global batch 768 kept (96 x 8 ranks)
    status, sets, note = e["model.context_parallel_size"]
    assert status == APPROXIMATED and sets == {"distributed.context_parallel": 1} and "rule CP-BACKEND" in note


def test_deepspeed_strict_section_misspelt_is_refused_top_level_reported(cli, tmp_path):
    bad = _edited(tmp_path, "deepspeed/zero3_bf16_baseline.json", '"overlap_comm"', '"overlap_com"')
    r = cli("import", bad)
    assert r.exit_code == 2 and "zero_optimization.overlap_com is unknown to DeepSpeed 0.19" in r.stderr
    assert "did you mean zero_optimization.overlap_comm?" in r.stderr and "Extra inputs are not permitted" in r.stderr
    path = _edited(tmp_path, "deepspeed/zero3_bf16_baseline.json", '"steps_per_print"', '"step_per_print"', name="top.json")
    entry = next(e for e in import_config(path, folder=str(tmp_path)).report.entries if e.source == "step_per_print")
    assert entry.status == NONE and "did you mean steps_per_print?" in entry.note


def test_deepspeed_auto_lines_state_the_value_used(tmp_path):
    spec, entries, r = imported("deepspeed_config_templates/zero_stage1_config.json", tmp_path)
    assert "the spec uses train.lr = 0.0003 (fp8launch's default)" in entries["optimizer.params.lr"][2]
    assert "the spec uses train.max_grad_norm = 1.0" in entries["gradient_clipping"][2]


def test_accelerate_unquoted_no_is_one_process(tmp_path):
    spec, entries, r = imported("accelerate/0_30_0_sagemaker.yaml", tmp_path)
    assert entries["distributed_type"][:2] == (MAPPED, {"distributed.strategy": "ddp", "distributed.procs_per_node": 1})
    assert "YAML reads an unquoted NO as false" in entries["distributed_type"][2]


def test_accelerate_questionnaire_names_accelerate_never_reads_import_its_defaults(tmp_path):
    # the keys `accelerate config` writes (commands/config/cluster.py), which the TE recipe handler does not read
    path = _write(tmp_path, "acc.yaml", """
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        mixed_precision: fp8
        num_processes: 8
        fp8_config:
          backend: TE
          fp8_format: HYBRID
          amax_history_length: 16
          amax_compute_algorithm: max
        fsdp_config:
          fsdp_version: 2
          fsdp_reshard_after_forward: false
          fsdp_activation_checkpointing: true
        """)
    r = import_config(path, folder=str(tmp_path))
    spec = tomllib.loads(r.text)
    e = {x.source: x for x in r.report.entries}
    assert spec["precision"]["te"]["amax_history_len"] == 1024 and spec["precision"]["te"]["amax_compute_algo"] == "most_recent"
    entry = e["fp8_config.amax_history_length"]
    assert entry.status == APPROXIMATED and "read by nothing" in entry.before and entry.after.endswith("1024, what ran")
    assert spec["distributed"]["strategy"] == "fsdp2" and spec["distributed"]["fsdp2"] == {"reshard_after_forward": False}
    assert spec["activation_checkpointing"] == {"mode": "full"}


def test_accelerate_ao_and_a_rule_refusing_the_literal_translation(tmp_path):
    path = _write(tmp_path, "ao.yaml", """
        distributed_type: MULTI_GPU
        mixed_precision: fp8
        num_processes: 4
        fp8_config:
          backend: AO
        dynamo_config:
          dynamo_backend: INDUCTOR
        """)
    r = import_config(path, folder=str(tmp_path))
    spec = tomllib.loads(r.text)
    e = {x.source: x for x in r.report.entries}
    assert spec["precision"]["torchao"] == {"recipe": "tensorwise", "skip_small": False, "pad_inner_dim": True}
    # torchao + DDP + compile is refused (FP8-DDP-COMPILE): the nearest spec that plans keeps DDP, without compile
    assert spec["compile"] == {"enabled": False}
    entry = e["dynamo_config.dynamo_backend"]
    assert entry.status == APPROXIMATED and (entry.before, entry.after) == ("compile.enabled = true", "compile.enabled = false")
    assert "FP8-DDP-COMPILE" in entry.note
    # the FSDP2-only all-gather does nothing with DDP: not written
    assert "fsdp_float8_all_gather" not in spec["precision"]["torchao"] and e["(enable_fsdp_float8_all_gather)"].status == MAPPED


def test_default_out_is_the_name_here_and_is_not_overwritten(cli, tmp_path):
    r = cli("import", str(DATA / "torchtitan" / "deepseek_v3_16b.toml"))
    assert r.exit_code == 0 and (tmp_path / "deepseek_v3_16b.toml").is_file()
    again = cli("import", str(DATA / "torchtitan" / "deepseek_v3_16b.toml"))
    assert again.exit_code == 2 and "already exists; pass --force" in again.stderr
    assert cli("import", str(DATA / "torchtitan" / "deepseek_v3_16b.toml"), "--force").exit_code == 0


def test_the_kind_comes_from_the_content_not_the_extension(tmp_path):
    shutil.copy(DATA / "torchtitan" / "llama3_405b.toml", tmp_path / "job.cfg")
    shutil.copy(DATA / "accelerate" / "fp8.yaml", tmp_path / "default_config.json")
    assert import_config(str(tmp_path / "job.cfg"), folder=str(tmp_path)).kind.id == "torchtitan"
    assert import_config(str(tmp_path / "default_config.json"), folder=str(tmp_path)).kind.id == "accelerate"


@pytest.mark.parametrize("name,content,message", [
    ("empty.yaml", "", "empty: it holds no settings"),
    ("comments.yaml", "# nothing set yet\n\n", "empty: it holds no settings"),
    ("empty.toml", "", "empty: it holds no settings"),
    ("unknown.yaml", "hello: world\nanswer: 42\n", "not a config fp8launch can import"),
    ("pyproject.toml", '[project]\nname = "x"\n[tool.ruff]\nline-length = 140\n', "not a config fp8launch can import"),
    ("workflow.yaml", "on: push\njobs:\n  test:\n    runs-on: ubuntu-latest\n", "not a config fp8launch can import"),
    ("config.json", '{"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16}',
     "not a config fp8launch can import"),
    ("list.yaml", "- a\n- b\n", "not a table of settings"),
    ("broken.json", '{"zero_optimization": {', "cannot parse it as JSON, TOML or YAML"),
    ("binary.bin", b"\x00\xff\xfe", "not a text file"),
    ("missing.yaml", None, "cannot read it"),
])
def test_an_unknown_empty_or_unreadable_file_is_one_line_exit_2_and_nothing_written(name, content, message, cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    if content is not None:
        (src / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = cli("import", str(src / name))
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_import_config_raises_source_error_for_a_refused_file(tmp_path):
    with pytest.raises(SourceError, match="unknown to Accelerate"):
        import_config(str(DATA / "accelerate/invalid_keys.yaml"), folder=str(tmp_path))


def test_importing_reaches_no_torch(tmp_path):
    files = [str(DATA / f) for f in ("torchtitan/llama3_405b.toml", "deepspeed/bf16_full.json", "accelerate/deepspeed.yaml",
                                     "axolotl/llama3-8b-deepspeed-alst.yaml", "nemo/mixtral_8x7b.yaml")]
    code = ("import sys; from launcher.commands.importer import import_config\n"
            f"for f in {files!r}: import_config(f, folder={str(tmp_path)!r})\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_megatron_precision_aware_optimizer_moments_map_to_optimizer_states(tmp_path):
    path = _edited(tmp_path, "megatron_bridge/llama32_1b_task_configuration.yaml",
                   "  use_precision_aware_optimizer: false\n", "  use_precision_aware_optimizer: true\n")
    path = _edited(tmp_path, path, "  exp_avg_dtype:\n    _call_: false\n    _target_: torch.float32\n  exp_avg_sq_dtype:\n"
                   "    _call_: false\n    _target_: torch.float32\n", "  exp_avg_dtype:\n    _call_: false\n    _target_: torch.bfloat16\n"
                   "  exp_avg_sq_dtype:\n    _call_: false\n    _target_: torch.bfloat16\n")
    r = import_config(path, folder=str(tmp_path))
    entry = next(e for e in r.report.entries if e.source.startswith("optimizer.use_precision_aware_optimizer"))
    # bf16 moments; under the distributed optimizer's DeepSpeed ZeRO-1 fp8launch keeps them fp32 (rule LEVELS-DEEPSPEED)
    assert entry.status == APPROXIMATED and "bf16" in entry.before and "fp32" in entry.after and "LEVELS-DEEPSPEED" in entry.note


def test_nemo_without_a_scheduler_keeps_the_lr_constant(tmp_path):
    text = (DATA / "nemo/llama3_8b.yaml").read_text()
    start = text.index("    sched:\n")
    end = text.index("\n  data:", start)  # the sched table ends where model.data starts
    path = tmp_path / "nosched.yaml"
    path.write_text(text[:start] + text[end + 1:])
    spec = tomllib.loads(import_config(str(path), folder=str(tmp_path)).text)
    assert (spec["train"]["warmup_steps"], spec["train"]["min_lr_ratio"]) == (0, 1.0)


def test_torchtitan_moe_debug_flavors_get_the_moe_debug_builtin(tmp_path):
    path = _edited(tmp_path, "torchtitan/deepseek_v3_16b.toml", 'flavor = "16B"', 'flavor = "debugmodel"')
    assert tomllib.loads(import_config(path, folder=str(tmp_path)).text)["train"]["model"] == "builtin:moe-debug"


def test_nemo_without_min_lr_decays_to_zero(tmp_path):
    path = _edited(tmp_path, "nemo/llama3_8b.yaml", "      min_lr: 1e-5\n", "")
    spec = tomllib.loads(import_config(path, folder=str(tmp_path)).text)
    assert spec["train"]["min_lr_ratio"] == 0.0  # CosineAnnealing's min_lr default, not fp8launch's 0.1


# --- issue 52: fixes come from the rules; the import's output plans with --strict -----------------------------------

def _fix_applied(rule: str, spec: dict, tmp_path: Path):
    """(changes, rules firing after them) of the importer's fix for `rule` on `spec`."""
    from launcher.commands.importer import probe
    from launcher.commands.importer.draft import Draft
    from launcher.commands.importer.planable import FIXES

    d = Draft({}, path=str(tmp_path / "x.toml"), title="test")
    d.folder = str(tmp_path)
    for key, value in probe.flatten_spec(spec):
        d.set(key, value)
    changes = FIXES[rule].change(d)
    for key, value, *_ in changes:
        d.set(key, value)
    return changes, probe.firing(d.spec, str(tmp_path)) or {}


@pytest.mark.usefixtures("msamp_stack")
@pytest.mark.parametrize("rule", sorted(__import__("launcher.commands.importer.planable", fromlist=["FIXES"]).FIXES))
def test_each_fix_applied_to_its_rules_firing_example_stops_the_rule_and_none_moves_what_does_not_fire(rule, tmp_path):
    """tests/test_rules.py's PLAN_CASES hold, per rule, a spec that fires it and its fixed twin: the importer's fix moves the
    first so the rule no longer fires (its own condition says so), and on the twin, where the rule does not fire, moves nothing
    (a Nearest asks the rule first) or nothing the rule refused."""
    from launcher.commands.importer import probe
    from launcher.commands.importer.planable import FIXES, First, Nearest
    from tests.test_rules import PLAN_CASES

    bad, good = PLAN_CASES[rule]
    if rule not in (probe.firing(bad, str(tmp_path)) or {}):
        pytest.skip(f"{rule} does not fire on its example here (a machine fact)")
    changes, after = _fix_applied(rule, bad, tmp_path)
    assert changes and rule not in after, (changes, sorted(after))
    if isinstance(FIXES[rule], (Nearest, First)) and rule not in (probe.firing(good, str(tmp_path)) or {}):
        assert _fix_applied(rule, good, tmp_path)[0] == []


def test_two_interacting_rules_meet_at_the_nearest_value_both_accept(tmp_path):
    """MXFP8 (blocks of 32 tokens per rank after tp x cp) with context parallel 2 (seq a multiple of 4) and seq 96: the import
    spun every planning round (TORCHAO-BLOCK-TOKENS rounded to 96 again); now 128, the first length both rules accept."""
    path = _write(tmp_path, "mx-cp.toml", """
        [model]
        name = "llama3"
        flavor = "8B"
        converters = ["mx"]
        [training]
        local_batch_size = 1
        seq_len = 96
        [parallelism]
        context_parallel_degree = 2
        """)
    r = import_config(path, folder=str(tmp_path))
    spec = tomllib.loads(r.text)
    assert (spec["train"]["seq_len"], spec["distributed"]["context_parallel"]) == (128, 2)
    entry = next(e for e in r.report.entries if e.source == "training.seq_len")
    assert entry.status == APPROXIMATED and "rule TORCHAO-BLOCK-TOKENS" in entry.note and "128" in entry.after


SOURCE_WARNINGS = {
    "megatron_bridge/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml": {"FP8-NO-GAIN"},
    "megatron_bridge/llama3_8b_fp8cs.yaml": {"MEMORY-EXCEEDS-GPU"},
    "torchtitan/mxfp8_docs_example.toml": {"FP8-NO-GAIN", "PRECISION-KEEP-UNMATCHED"},
    "nemo/peft_llama_squad.yaml": {"MEMORY-EXCEEDS-GPU"},
    "torchtitan/deepseek_v3_671b.toml": {"MEMORY-EXCEEDS-GPU"},
}
"""Warnings of the source's own settings, not of a placeholder, kept in the spec and printed: DeepSeek-V3's FP8 with its
experts in bf16 under TE (MOE-EXPERTS-HP's approximation) gains nothing; the 8B recipe at seq 8192 on its own 2 GPUs
exceeds an H100 by the estimate; torchtitan's docs example trains its own debug model and filters a router.gate it lacks;
NeMo's LoRA of a 7B at micro 4 x 4096 on DDP holds no gradients or optimizer states for the frozen weights, fp8launch's full
fine-tune of the same batch (no recompute: the source's) exceeds an H100 by the estimate; torchtitan's DeepSeek-V3 671B
runs local batch 4 x 4096 with op-level selective AC, which the spec approximates as every other block recomputed: its
activations alone exceed an H100 by the estimate at any world size."""


PLACEHOLDER_WARNINGS = {"axolotl/fft_optimized.yml": {"MEMORY-EXCEEDS-GPU"}}
"""Warnings of a placeholder the user replaces, not of the source: Axolotl's full fine-tune of Llama 2 7B on DDP gets the
placeholder builtin:llama3-8b (no local model; 8.03B parameters with a 128256 vocabulary): 81.1 GiB per GPU by the estimate
(model states 75.0), over an H100's 74.5; the real shape (a Llama-2-7b config.json as train.model: 6.74B) plans --strict
clean at 66.7 GiB (model states 63.0)."""


@CORPUS_GROUP
def test_every_corpus_spec_with_its_placeholders_filled_plans_strictly(corpus, tmp_path):
    """Every imported corpus config, its PLACEHOLDER lines filled as a user with the placeholder's shape fills them (the model
    and world as written, the data a local token file), plans with `--strict` in-process: no leftover section, no
    warning but those of the source's own settings (SOURCE_WARNINGS)."""
    import numpy as np

    from launcher.commands.plan import plan_one

    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.arange(70000, dtype=np.int32) % 2048)
    failures = {}
    for relative, (r, out, _) in corpus.items():
        text = r.text
        filled = re.sub(r'^data = "[^"]*"  # PLACEHOLDER.*$', f'data = "tokens:{tokens}"', text, flags=re.M)
        (out / "spec.toml").write_text(filled)
        try:
            plan_one(str(out / "spec.toml"), out_dir=str(out / "generated"), strict=True)
        except SourceError as e:
            raise AssertionError(f"{relative}: {e}") from None
        except Exception as e:  # SpecError: the rules that refused it
            rules = {p.rule for p in getattr(e, "problems", [])}
            if not rules <= SOURCE_WARNINGS.get(relative, set()) | PLACEHOLDER_WARNINGS.get(relative, set()) or not rules:
                failures[relative] = sorted(rules) or str(e)
    assert not failures, failures


# --- issue 52 item 1: the source tool's runtime ---------------------------------------------------------------------

def _torchtitan_lr(step: int, warmup: int, total: int) -> float:
    """torchtitan 238fa995 components/lr_scheduler.py (build_lr_schedulers, linear_warmup_stable_decay), transcribed for a
    run with no decay_ratio and a linear decay to 0: the warm-up clamped to the run, (s + 1) / W, a virtual last step."""
    warmup = min(warmup, total)
    decay = total - warmup
    stable = total + 1 - warmup - decay
    if step < warmup:
        return (step + 1) / warmup
    if step < warmup + stable:
        return 1.0
    return 1 - (step + 1 - warmup - stable) / decay


def test_torchtitan_clamps_a_warm_up_longer_than_the_run_and_so_does_the_spec(tmp_path):
    """warmup_steps 600 with steps 20 (issue 52: the spec kept 600 and ended at 10% of the peak lr, "mapped")."""
    from launcher.train.optim import lr_factor

    path = _edited(tmp_path, "torchtitan/llama3_405b.toml", "steps = 3000", "steps = 20")
    spec, entries, _ = imported(path, tmp_path)
    t = spec["train"]
    assert (t["steps"], t["warmup_steps"]) == (20, 19)
    ours = [lr_factor(s, warmup_steps=19, steps=20, min_lr_ratio=t["min_lr_ratio"]) for s in range(20)]
    assert ours == pytest.approx([_torchtitan_lr(s, 600, 20) for s in range(20)])  # the same lr at every step
    assert ours[-1] == 1.0
    status, _, note = entries["lr_scheduler.warmup_steps"]
    assert status == MAPPED and "clamps warmup_steps 600 to the run's 20 steps" in note


def test_torchtitan_warm_up_within_the_run_is_one_step_longer_in_fp8launch_and_says_so(tmp_path):
    spec, entries, _ = imported("torchtitan/llama3_405b.toml", tmp_path)
    e = next(e for e in _entries(tmp_path, "torchtitan/llama3_405b.toml") if e.source == "lr_scheduler.warmup_steps")
    assert e.status == APPROXIMATED and spec["train"]["warmup_steps"] == 600
    assert "the peak at step 599" in e.before and "the peak at step 600" in e.after and "0.17% lower" in e.note


def test_torchtitan_before_the_schedule_was_redefined_warms_up_unclamped_as_fp8launch_does(tmp_path):
    """2024's [training] warmup_steps: lr x (s + 1) / (W + 1), no clamp (optimizer.py at b19456a): the literal value."""
    path = _edited(tmp_path, "torchtitan/llama3_405b_2024.toml", "steps = 3000", "steps = 20")
    spec, entries, _ = imported(path, tmp_path)
    assert spec["train"]["warmup_steps"] == 600 and entries["training.warmup_steps"][0] == MAPPED
    assert "not clamped" in entries["training.warmup_steps"][2]


def _entries(tmp_path: Path, relative: str):
    return import_config(str(DATA / relative), folder=str(tmp_path)).report.entries


def test_a_dropped_pipeline_leaves_no_reshard_reason_citing_it(tmp_path):
    """deepseek_v3_16b with pipeline_parallel_degree 2 beside expert parallel 8: PP-EXPERT-PARALLEL takes the pipeline; torchtitan's
    "default" keeps the weights gathered only under a pipeline, so the spec reshards and its line says why."""
    path = _edited(tmp_path, "torchtitan/deepseek_v3_16b.toml", "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2")
    spec, entries, _ = imported(path, tmp_path)
    assert spec["distributed"]["pipeline_parallel"] == 1
    assert spec["distributed"]["fsdp2"]["reshard_after_forward"] is True
    status, sets, note = entries["parallelism.fsdp_reshard_after_forward"]
    assert status == APPROXIMATED and sets == {"distributed.fsdp2.reshard_after_forward": True}


def test_deepspeed_json_without_scheduler_or_optimizer_leaves_the_schedule_to_the_script_as_placeholders(tmp_path):
    spec, entries, r = imported("axolotl/deepspeed_configs/zero3_bf16_cpuoffload_all.json", tmp_path)
    status, sets, note = entries["(scheduler)"]
    assert status == NONE and "DeepSpeed keeps the lr constant" not in note and "HF Trainer" in note
    assert {"train.warmup_steps", "train.min_lr_ratio", "train.seed"} <= _placeholder_keys(r)


@pytest.mark.parametrize("relative,seed,status", [("axolotl/3b-fp8-fsdp2.yaml", 42, MAPPED),        # no seed: the HF Trainer's
                                                  ("axolotl/llama3-8b-fsdp2-alst.yaml", 42, MAPPED),
                                                  ("accelerate/fsdp.yaml", 42, NONE)])              # the script's: a placeholder
def test_a_seed_left_to_the_hf_trainer_is_its_42_said(relative, seed, status, tmp_path):
    spec, entries, r = imported(relative, tmp_path)
    assert spec["train"]["seed"] == seed
    assert entries["(seed)"][0] == status and "42" in entries["(seed)"][2]  # before: fp8launch's 0, not a word
    assert ("train.seed" in _placeholder_keys(r)) == (status == NONE)


@pytest.mark.parametrize("old,new,message", [
    ("learning_rate: 2e-5", "learnig_rate: 2e-5", "learning_rate: missing (learnig_rate is not it"),
    ("learning_rate: 2e-5", "", "learning_rate: missing; Axolotl stops"),
    ("base_model: meta-llama/Llama-3.2-3B", "", "base_model: missing; Axolotl stops"),
])
def test_a_missing_or_misspelt_required_axolotl_key_is_refused_as_axolotl_refuses_it(old, new, message, cli, tmp_path):
    path = _edited(tmp_path, "axolotl/3b-fp8-fsdp2.yaml", old, new)
    r = cli("import", path, "--out", "x.toml")
    assert r.exit_code == 2 and message in r.stderr and "fix: set " in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.toml").exists()


def test_tf32_true_says_torchs_default_is_off(tmp_path):
    entries = {e.source: e for e in _entries(tmp_path, "axolotl/llama3-8b-fsdp2-alst.yaml")}
    assert "keeps torch's default, off" in entries["tf32"].note and "TF32 matmuls are torch's default" not in entries["tf32"].note
    entries = {e.source: e for e in _entries(tmp_path, "axolotl/adamw-pretrain-fsdp2.yaml")}
    assert entries["tf32"].status == MAPPED  # tf32: false is what torch and fp8launch do


@pytest.mark.parametrize("relative,every", [("nemo/llama3_8b.yaml", 2000), ("nemo/gpt3_mlperf.yaml", 30)])
def test_nemo_checkpoints_at_every_validation(relative, every, tmp_path):
    spec, entries, _ = imported(relative, tmp_path)
    assert spec["train"]["checkpoint_every"] == every
    path = _edited(tmp_path, relative, "create_checkpoint_callback: true", "create_checkpoint_callback: false")
    spec, _, _ = imported(path, tmp_path)
    assert "checkpoint_every" not in spec["train"]


# --- issue 52 item 2: every parallelism kind lands or is approximated in numbers -----------------------------------

def test_deepspeed_autotp_is_tensor_parallel_and_its_world_counts_the_tp_ranks(tmp_path, monkeypatch):
    """tensor_parallel.autotp_size 4 with train_batch_size 16 = micro 4 x 1 x 4 data-parallel ranks: 16 processes, as
    DeepSpeed 0.19.8 reads it (its train_batch_size counts world / autotp_size ranks)."""
    path = _write(tmp_path, "autotp.json", """
        {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
         "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 4}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}
    """)
    spec, entries, _ = imported(path, tmp_path)
    d = spec["distributed"]
    assert d["tensor_parallel"] == 4 and d.get("nodes", 1) * d["procs_per_node"] == 16 and d["global_batch_size"] == 16
    assert entries["tensor_parallel.autotp_size"][0] == APPROXIMATED
    cfg = _deepspeed_config(json.loads(Path(path).read_text()), 16 // 4, monkeypatch)
    assert cfg.tensor_parallel_config.autotp_size == 4 and cfg.train_batch_size == 4 * 1 * (16 // 4)


def _with_parallelism(tmp_path: Path, lines: str) -> str:
    return _edited(tmp_path, "accelerate/fsdp.yaml", "fsdp_use_orig_params: true\n",
                   "fsdp_use_orig_params: true\nparallelism_config:\n" + lines)


def test_accelerate_ulysses_sp_is_context_parallel_approximated(tmp_path):
    parallelism = pytest.importorskip("accelerate.parallelism_config")
    assert parallelism.ParallelismConfig(sp_size=2, sp_backend="deepspeed").sp_size == 2  # Accelerate accepts it
    path = _with_parallelism(tmp_path, "  parallelism_config_sp_size: 2\n  parallelism_config_sp_backend: deepspeed\n")
    spec, entries, _ = imported(path, tmp_path)
    assert spec["distributed"]["context_parallel"] == 2  # was: no equivalent, 2x the data-parallel ranks with whole sequences
    status, _, note = entries["parallelism_config.parallelism_config_sp_size, parallelism_config.parallelism_config_sp_backend"]
    assert status == APPROXIMATED and "world / 2 data-parallel ranks" in note


@pytest.mark.parametrize("lines,kwargs,message", [
    ("  parallelism_config_cp_size: 2\n  parallelism_config_cp_backend: deepspeed\n", {"cp_size": 2, "cp_backend": "deepspeed"},
     "cp_backend must be one of ['torch'], but got deepspeed"),
    ("  parallelism_config_sp_size: 2\n  parallelism_config_sp_backend: ring\n", {"sp_size": 2, "sp_backend": "ring"},
     "sp_backend must be one of ['deepspeed'], but got ring"),
    ("  parallelism_config_cp_size: 2\n  parallelism_config_sp_size: 2\n", {"cp_size": 2, "sp_size": 2},
     "are mutually exclusive"),
])
def test_a_parallelism_accelerate_refuses_is_refused_as_accelerate_refuses_it(lines, kwargs, message, cli, tmp_path):
    parallelism = pytest.importorskip("accelerate.parallelism_config")
    with pytest.raises(ValueError, match=re.escape(message)):
        parallelism.ParallelismConfig(**kwargs)
    r = cli("import", _with_parallelism(tmp_path, lines), "--out", "x.toml")
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.toml").exists()


# --- issue 52 item 5: Megatron / NeMo recompute and dataset kinds ---------------------------------------------------

RECOMPUTE = "  activations_checkpoint_granularity: null\n  activations_checkpoint_method: block\n  activations_checkpoint_num_layers: 0\n"


@pytest.mark.parametrize("granularity,method,layers,mode,status,said", [
    ("full", "uniform", 1, "full", MAPPED, "every layer's input kept"),
    ("full", "uniform", 4, "full", APPROXIMATED, "each chunk of 4 layers"),
    ("full", "block", 20, "full", MAPPED, "all 20 layers of each pipeline stage"),
    ("full", "block", 18, "full", APPROXIMATED, "the first 18 layers of each pipeline stage (of 20)"),
    ("full", "block", 10, "selective", APPROXIMATED, "the first 10 layers of each pipeline stage (of 20)"),
    ("full", "block", 2, "none", APPROXIMATED, "the first 2 layers of each pipeline stage (of 20)"),
    ("full", "block", 0, None, MAPPED, "no layer recomputed"),
    ("selective", "null", "null", "selective", APPROXIMATED, "only core_attn recomputed"),
])
def test_megatron_recompute_maps_to_activation_checkpointing_saying_what_differs(granularity, method, layers, mode, status, said,
                                                                                tmp_path):
    """NeMo's Llama 2 70B: 80 layers on PP 4, 20 a stage. Megatron-Core's uniform method recomputes every layer (chunks of N),
    block the first N of each stage; selective only sub-modules (core attention by default)."""
    text = (f"  activations_checkpoint_granularity: {granularity}\n  activations_checkpoint_method: {method}\n"
            f"  activations_checkpoint_num_layers: {layers}\n")
    spec, _, r = imported(_edited(tmp_path, "nemo/llama2_70b.yaml", RECOMPUTE, text), tmp_path)
    assert dotted(spec, "activation_checkpointing.mode", None) == mode
    entry = next(x for x in r.report.entries if x.source.startswith("model.activations_checkpoint_granularity"))
    assert entry.status == status and said in entry.before + entry.note, entry.line()


def test_megatron_bridge_recompute_modules_are_said_on_the_selective_line(tmp_path):
    _, e, r = imported("megatron_bridge/gpt_oss_120b_pretrain_h100_fp8_mx_v1.yaml", tmp_path)
    entry = next(x for x in r.report.entries if x.source == "model.recompute_granularity, model.recompute_modules")
    assert entry.status == APPROXIMATED and "only layernorm, moe_act recomputed" in entry.before and "every other block" in entry.after


BLEND = "  blend: null\n  blend_per_split: null\n"


@pytest.mark.parametrize("text,data,status,said", [
    ("  blend: [[/lustre/data/c4_text_document], null]\n  blend_per_split: null\n", "megatron:/lustre/data/c4_text_document",
     NONE, "not on this machine"),
    ("  blend: [[/a/x_text_document, /a/y_text_document], [0.3, 0.7]]\n  blend_per_split: null\n", "synthetic", NONE,
     "a blend of 2 Megatron datasets"),
    ("  blend: null\n  blend_per_split: [[[/a/train_doc], null], [[/a/valid_doc], null], null]\n", "megatron:/a/train_doc", NONE,
     "not on this machine"),
    ("  blend: null\n  blend_per_split: null\n  data_path: 0.5 /a/x_doc 0.5 /a/y_doc\n", "synthetic", NONE,
     "a blend of 2 Megatron datasets"),
])
def test_megatron_bridge_indexed_datasets_map_to_megatron_prefixes(text, data, status, said, tmp_path):
    """Megatron-Bridge 067f987 training/config.py GPTDatasetConfig: blend ([prefixes], weights), blend_per_split ([train, valid,
    test]), data_path (split on spaces, weights interleaved: get_blend_from_list); a cluster path stays, marked PLACEHOLDER."""
    path = _edited(tmp_path, "megatron_bridge/llama32_1b_task_configuration.yaml", BLEND, text)
    path = _edited(tmp_path, path, "  mock: true\n", "  mock: false\n")
    spec, e, r = imported(path, tmp_path)
    assert spec["train"]["data"] == data
    entry = next(x for x in r.report.entries if "train.data" in dict(x.sets))
    assert entry.status == status and said in entry.note, entry.line()
    assert ("# PLACEHOLDER" in next(line for line in r.text.splitlines() if line.startswith("data = "))) == (status == NONE)


def test_megatron_indexed_dataset_present_here_is_mapped(tmp_path):
    (tmp_path / "corpus_text_document.bin").write_bytes(b"")
    (tmp_path / "corpus_text_document.idx").write_bytes(b"")
    prefix = str(tmp_path / "corpus_text_document")
    path = _edited(tmp_path, "megatron_bridge/llama32_1b_task_configuration.yaml", BLEND,
                   f"  blend: null\n  blend_per_split: null\n  data_path: {prefix}\n")
    spec, e, _ = imported(path, tmp_path)
    assert spec["train"]["data"] == f"megatron:{prefix}" and e["dataset.data_path"][0] == MAPPED


@pytest.mark.parametrize("relative,source,says", [
    ("megatron_bridge/llama3_8b_sft_gb200_fp8_mx_v1.yaml", "dataset.dataset_name, dataset.packed_sequence_specs, "
     "dataset.process_example_fn", "the Hugging Face dataset squad"),
    ("megatron_bridge/llama32_1b_finetune.yaml", "dataset", "SQuAD"),
    ("nemo/fine_tuning_mixtral_squad.yaml", "model.data.train_ds.file_names, model.answer_only_loss", "JSONL rows"),
])
def test_fine_tuning_datasets_are_placeholders_that_say_what_the_source_trains_on(relative, source, says, tmp_path):
    """SFT rows with a loss on the answer only are no token stream: a placeholder saying so and what to do, never 'mapped'."""
    spec, e, _ = imported(relative, tmp_path)
    status, sets, note = e[source]
    assert status == NONE and sets == {"train.data": "synthetic"} and says in note
    assert "answer" in note and "hf-dataset:FILE?column=text" in note and "PLACEHOLDER" in note


def test_deepspeed_sequence_parallel_size_is_context_parallel_and_its_ranks_count_in_the_world(tmp_path, monkeypatch):
    """DeepSpeedExamples' AutoSP config: sequence_parallel_size 2, train_batch_size 1 = micro 1 x accum 1 x world / 2
    (DeepSpeed 0.19.8 runtime/config.py 468, deepspeed.initialize with no mpu): 2 processes, context_parallel 2 (was: the key
    reported as unknown to DeepSpeed and 1 process). The installed DeepSpeedConfig, on the spec's world, agrees."""
    config = pytest.importorskip("deepspeed.runtime.config")
    spec, e, _ = imported("deepspeed/autosp_config.json", tmp_path)
    d = spec["distributed"]
    assert (d["context_parallel"], d["nodes"] * d["procs_per_node"]) == (2, 2) and e["sequence_parallel_size"][0] == APPROXIMATED
    monkeypatch.setattr(config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(config.dist, "get_world_size", lambda *a, **k: d["nodes"] * d["procs_per_node"])
    cfg = config.DeepSpeedConfig(json.loads((DATA / "deepspeed/autosp_config.json").read_text()))
    assert cfg.world_size == 1 and cfg.train_batch_size == spec["distributed"]["global_batch_size"] == 1


def test_a_deepspeed_block_deepspeed_removed_is_refused_as_deepspeed_refuses_it(cli, tmp_path):
    """DeepSpeedExamples' BERT LAMB config holds `sparse_attention`, which DeepSpeed 0.19.8 refuses (DeepSpeedConfigError,
    runtime/config.py _reject_removed_config_keys): so does the import, one line, exit 2, nothing written (was: each of its
    keys 'left at DeepSpeed's default'). The removed keys are the installed DeepSpeed's."""
    config = pytest.importorskip("deepspeed.runtime.config")
    from launcher.commands.importer.known import deepspeed as known

    assert set(known.REMOVED) == set(config._REMOVED_TOP_LEVEL_CONFIG_KEYS) | {
        f"zero_optimization.{k}" for k in config._REMOVED_ZERO_CONFIG_KEYS}
    r = cli("import", str(DATA / "deepspeed/deepspeed_bsz64k_lamb_config_seq128.json"), "--out", "x.toml")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "sparse_attention" in r.stderr
    assert "removed DeepSpeed Sparse Attention" in r.stderr and not (tmp_path / "x.toml").exists()
    with pytest.raises(config.DeepSpeedConfigError):
        config.DeepSpeedConfig(json.loads((DATA / "deepspeed/deepspeed_bsz64k_lamb_config_seq128.json").read_text()))
