"""Meta-device build and initialisation (launcher/train/materialize.py) for each model source:
builtin, hf: and py:, the py: opt-out, and a resumed run that skips random initialisation."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from launcher.train import materialize as mat
from launcher.train.compile_ac import prepare_blocks
from launcher.train.models import OPT_OUT, build_for_run, build_model
from launcher.train.models.llama import Llama
from launcher.train.precision import apply_precision

from ._precision import make_plan
from ._user_model import USER_MODEL


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {mat.clean_fqn(k): v.detach().clone() for k, v in model.state_dict().items()}


def test_builtin_is_built_on_meta_and_initialised_per_module_whatever_wraps_it():
    model, init = build_for_run("builtin:llama-debug?layers=2", ".")
    assert all(p.is_meta for p in model.parameters()) and init == model.init_module
    mat.materialize(model, "cpu", init, seed=3)
    plain = _state(model)
    # torchao FP8 conversion (on meta, as the entrypoint does it) and checkpoint wrappers change neither names nor values
    wrapped, init2 = build_for_run("builtin:llama-debug?layers=2", ".")
    plan = make_plan(precision={"mode": "fp8", "backend": "torchao", "torchao": {"skip_small": False}},
                     activation_checkpointing={"mode": "full"}, distributed={"strategy": "ddp", "procs_per_node": 1})
    precision = apply_precision(wrapped, plan, torch.device("cpu"))
    assert precision.report.fp8_layers > 0
    prepare_blocks(wrapped, plan, precision)
    mat.materialize(wrapped, "cpu", init2, seed=3)
    assert _state(wrapped).keys() == plain.keys()
    for k, v in _state(wrapped).items():
        assert torch.equal(v, plain[k]), k
    # the seed matters, and the rule is the builtin one: N(0, 0.02), residual projections smaller, norms at one
    other, init3 = build_for_run("builtin:llama-debug?layers=2", ".")
    mat.materialize(other, "cpu", init3, seed=4)
    assert not torch.equal(other.output.weight, model.output.weight)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.layers[0].feed_forward.w2.weight.std().item() == pytest.approx(0.02 / 2, rel=0.05)
    assert torch.equal(model.layers[1].ffn_norm.weight, torch.ones(256))


def test_resume_gets_storage_but_no_random_initialisation():
    model, _ = build_for_run("builtin:llama-debug?layers=1", ".")
    drawn = []
    mat.Pending(None, seed=0)(model, "cpu")
    assert not any(p.is_meta for p in model.parameters())

    def record(name, module):
        drawn.append(name)
        for p in module._parameters.values():
            if p is not None:
                p.zero_()

    mat.Pending(record, seed=0)(model, "cpu")
    assert "layers.0.attention.wq" in drawn and "output" in drawn


def test_a_parameter_nothing_initialises_is_named_instead_of_training_from_garbage():
    import pytest
    from torch import nn

    from launcher.errors import LauncherError

    class Scale(nn.Module):  # a user module with a parameter and no reset_parameters()
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(4))

    with mat.meta_device():
        model = nn.Sequential(nn.Linear(4, 4), Scale())
    with pytest.raises(LauncherError) as e:
        mat.Pending(mat.reset_parameters_initializer, seed=0)(model, "cpu")
    assert "parameter 1.gain" in str(e.value) and "reset_parameters()" in str(e.value) and "fp8launch_meta_init" in str(e.value)


def test_torch_modules_with_a_private_reset_are_initialised():
    from torch import nn

    with mat.meta_device():
        mha = nn.MultiheadAttention(16, 2, bias=False)
    mat.Pending(mat.reset_parameters_initializer, seed=0)(mha, "cpu")
    own = nn.MultiheadAttention(16, 2, bias=False)  # on the CPU: the module's own resets, under each module's seed
    torch.manual_seed(mat.module_seed(0, ""))
    own._reset_parameters()  # xavier_uniform_ of in_proj_weight
    torch.manual_seed(mat.module_seed(0, "out_proj"))
    own.out_proj.reset_parameters()
    assert torch.equal(mha.in_proj_weight, own.in_proj_weight) and torch.equal(mha.out_proj.weight, own.out_proj.weight)
    bound = (6 / (16 + 48)) ** 0.5  # xavier_uniform_ of a (48, 16) weight: U(-bound, bound), std bound / sqrt(3)
    w = mha.in_proj_weight
    assert w.abs().max().item() <= bound and w.std().item() == pytest.approx(bound / 3**0.5, rel=0.1)  # 768 draws: ~2%


def test_the_entrypoint_skips_initialisation_when_it_resumes(tmp_path, monkeypatch):
    from launcher.train.checkpoint import CheckpointManager, Choice
    from launcher.train.main import build_run
    from tests.train._engine_setup import make_plan as write_plan

    _, plan_dir = write_plan(tmp_path, **{"distributed.procs_per_node": 1, "train.model": "builtin:llama-debug?layers=1",
                                          "train.output_dir": str(tmp_path / "out")})

    def no_random_init(self, name, module):
        raise AssertionError("initialised a resumed model")

    from launcher.train.parallel import distributed
    from tests.support import free_port

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)  # a world of one on a free port, restored after the test
    monkeypatch.setattr(Llama, "init_module", no_random_init)
    try:
        with pytest.raises(AssertionError, match="initialised a resumed model"):
            build_run(f"{plan_dir}/plan.json")[1].close()
        monkeypatch.setattr(CheckpointManager, "choose_resume", lambda self, resume: Choice(str(tmp_path / "ckpt")))
        monkeypatch.setattr(CheckpointManager, "restore_train_state", lambda self, state, resume: None)
        trainer, logger = build_run(f"{plan_dir}/plan.json")
        logger.close()
        assert not any(p.is_meta for p in trainer.state.engine.module.parameters())
    finally:
        distributed.destroy()  # build_run joined a process group of one: leave it for the next test


def _tiny_hf(tmp_path, tied: bool = False):
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=96, tie_word_embeddings=tied,
                             initializer_range=0.05).save_pretrained(tmp_path / "tiny")
    return f"hf:{tmp_path / 'tiny'}"


@pytest.mark.parametrize("partitioned", [False, True], ids=["whole", "partitioned"])
def test_hf_tied_embeddings_stay_tied_through_meta_initialisation(tmp_path, partitioned):
    """tie_word_embeddings (Llama-3.2-1B/3B, Gemma, GPT-2): one parameter for the embedding and the head, as an
    eager build has, not a second head trained on its own."""
    model, init = build_for_run(_tiny_hf(tmp_path, tied=True), ".")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    mat.materialize(model, "cpu", init, seed=0, partition=(lambda m, ps: None) if partitioned else None)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    twin = build_model(_tiny_hf(tmp_path, tied=True), ".")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in twin.parameters())
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.05, rel=0.05)


def test_hf_config_is_built_on_meta_and_initialised_by_its_own_init_weights(tmp_path):
    spec = _tiny_hf(tmp_path)
    model, init = build_for_run(spec, ".")
    assert all(p.is_meta for p in model.parameters()) and init is not None
    mat.materialize(model, "cpu", init, seed=0)
    eager = build_model(spec, ".")
    # rotary buffers recomputed by transformers' _init_weights, equal to an eager build's
    for (name, b), (_, e) in zip(model.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(b, e, msg=name)
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert torch.equal(model.model.norm.weight, torch.ones(64))
    logits = model(torch.randint(0, 96, (2, 9))).logits
    assert torch.isfinite(logits).all()


def _saved_hf(tmp_path, *, tied: bool = True, shard: str | None = "20KB"):
    """A tiny HF Llama saved with its weights (sharded safetensors by default) and its state_dict."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96, tie_word_embeddings=tied, initializer_range=0.05)
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_config(config)
    folder = tmp_path / "saved"
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return folder, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("partitioned", [False, True], ids=["whole", "partitioned"])
def test_hf_weights_are_read_module_by_module_into_a_meta_model(tmp_path, partitioned):
    """A folder with (sharded) safetensors: built from its config on meta; each module's tensors read from the files
    when its turn comes: the model equals from_pretrained's, its tied head included, whatever the seed."""
    from launcher.train.models.hf_weights import CheckpointInit

    folder, saved = _saved_hf(tmp_path)
    assert len(list(folder.glob("model-*.safetensors"))) > 3  # really sharded, with an index
    model, init = build_for_run(f"hf:{folder}", ".")
    assert isinstance(init, CheckpointInit) and init.notes == [] and all(p.is_meta for p in model.parameters())
    read = []
    real_get = init.reader.get
    init.reader.get = lambda name: read.append(name) or real_get(name)
    mat.materialize(model, "cpu", init, seed=123, partition=(lambda m, ps: None) if partitioned else None)
    assert sorted(read) == sorted(k for k in saved if k != "lm_head.weight")  # each tensor once; the tied head is the embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    eager = build_model(f"hf:{folder}", ".")  # from_pretrained
    for k, v in eager.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
        if k in saved:
            assert torch.equal(v, saved[k]), k


def test_hf_pytorch_bin_weights_missing_and_unused_tensors(tmp_path):
    """pytorch_model.bin (memory-mapped); a parameter the file lacks starts from the model's own init and is named,
    as is a tensor the model has no place for; a tensor of the wrong shape stops the run naming it."""
    from launcher.errors import InputError

    folder, saved = _saved_hf(tmp_path, tied=False, shard=None)
    (folder / "model.safetensors").unlink()
    partial = {k: v for k, v in saved.items() if k != "lm_head.weight"} | {"extra.weight": torch.ones(3)}
    torch.save(partial, folder / "pytorch_model.bin")
    model, init = build_for_run(f"hf:{folder}", ".")
    assert init.notes == [f"train.model: 1 parameter(s) are not in {folder} and start from the model's own init: lm_head.weight",
                          f"train.model: 1 tensor(s) of {folder} belong to no parameter of the model and are not used: extra.weight"]
    mat.materialize(model, "cpu", init, seed=0)
    assert torch.equal(model.model.embed_tokens.weight, saved["model.embed_tokens.weight"])
    head = model.lm_head.weight
    assert not torch.equal(head, saved["lm_head.weight"]) and head.std().item() == pytest.approx(0.05, rel=0.1)  # _init_weights
    torch.save({**partial, "model.norm.weight": torch.ones(65)}, folder / "pytorch_model.bin")
    model, init = build_for_run(f"hf:{folder}", ".")
    with pytest.raises(InputError, match=r"model.norm.weight in .* has shape \(65,\), the model built from its config.json "
                                         r"expects \(64,\); fix: use the config.json saved with these weights"):
        mat.materialize(model, "cpu", init, seed=0)


def test_py_factory_runs_under_meta_and_modules_reset_their_parameters(tmp_path, isolated_imports):
    (tmp_path / "user_mod_m.py").write_text(USER_MODEL)
    model, init = build_for_run("py:user_mod_m:build", str(tmp_path))
    import user_mod_m

    assert user_mod_m.SEEN["device"] == "meta" and all(p.is_meta for p in model.parameters())
    mat.materialize(model, "cpu", init, seed=0)
    bound = 1 / 16**0.5  # nn.Linear's reset_parameters: kaiming uniform, bound 1/sqrt(fan_in)
    w = model.layers[0].weight
    assert w.abs().max().item() <= bound and w.std().item() > bound / 3
    assert not torch.equal(model.layers[0].weight, model.layers[1].weight)
    assert model.emb.weight.std().item() == pytest.approx(1.0, rel=0.2)  # nn.Embedding: N(0, 1)


def test_py_factory_that_loads_its_weights_opts_out_and_keeps_them(tmp_path, isolated_imports):
    (tmp_path / "user_mod_n.py").write_text(USER_MODEL)
    model, init = build_for_run("py:user_mod_n:load", str(tmp_path))
    import user_mod_n

    assert OPT_OUT == "fp8launch_meta_init" and init is None
    assert user_mod_n.SEEN["device"] == "cpu"
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())


def test_a_model_level_init_weights_is_called_once_after_materialising():
    class WithInit(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.calls = 0

        def init_weights(self):
            self.calls += 1
            nn.init.constant_(self.a.weight, 2.0)
            nn.init.zeros_(self.a.bias)

    from launcher.train.models.materialize_rules import user_initializer

    with torch.device("meta"):
        model = WithInit()
    mat.materialize(model, "cpu", user_initializer(model), seed=0)
    assert model.calls == 1 and torch.equal(model.a.weight, torch.full((4, 4), 2.0))


def test_partitioned_materialisation_gives_each_module_storage_only_when_its_turn_comes():
    """DeepSpeed ZeRO-3's path: module by module, children first, each module's own parameters handed on
    as soon as they hold their weights (while the modules not reached yet have no storage), each exactly
    once, with the same weights as materialising the whole model."""
    whole, init = build_for_run("builtin:llama-debug?layers=2", ".")
    mat.materialize(whole, "cpu", init, seed=5)
    model, init2 = build_for_run("builtin:llama-debug?layers=2", ".")
    order, handed, holding = [], [], []

    def partition(module, params):
        order.append(module)
        handed.extend(params)
        assert all(not p.is_meta and not torch.isnan(p).any() for p in params)  # initialised when handed on
        holding.append(sum(p.numel() for p in model.parameters() if not p.is_meta))
        for p in params:  # what ZeRO-3 does: keep a part, free the rest
            p.data = p.data.flatten()[:1].clone()

    mat.materialize(model, "cpu", init2, seed=5, partition=partition)
    names = {m: n for n, m in model.named_modules()}
    for i, m in enumerate(order):  # a module is handed on after all of its children
        assert all(c in order[:i] for c in m.modules() if c is not m and any(True for _ in c.parameters(recurse=False)))
    assert len(handed) == len({id(p) for p in handed}) == len(list(model.parameters()))
    total = sum(p.numel() for p in whole.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in whole.modules())
    assert max(holding) <= largest + len(handed)  # never more than one module's full tensors (+ the kept 1-element parts)
    assert max(holding) < total / 4
    model2, init3 = build_for_run("builtin:llama-debug?layers=2", ".")
    mat.materialize(model2, "cpu", init3, seed=5, partition=lambda m, ps: None)  # keep everything: compare the weights
    assert _state(model2).keys() == _state(whole).keys()
    for k, v in _state(model2).items():
        assert torch.equal(v, _state(whole)[k]), k
    assert (names[order[0]], names[order[-1]]) == ("output", "tok_embeddings")  # the model's order, reversed


def test_a_tied_weight_stays_one_parameter_initialised_by_its_first_owner_whole_or_partitioned():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.embed.weight

    with torch.device("meta"):
        whole, parted = Tied(), Tied()
    rule = mat.reset_parameters_initializer
    mat.materialize(whole, "cpu", rule, seed=1)
    assert whole.head.weight is whole.embed.weight and len(list(whole.parameters())) == 1  # to_empty alone unties them
    handed = []
    mat.materialize(parted, "cpu", rule, seed=1, partition=lambda m, ps: handed.extend(ps))
    assert parted.head.weight is parted.embed.weight and len(handed) == 1
    # nn.Embedding's rule (N(0, 1)), the first owner in the model's order, as without partitioning
    assert torch.equal(parted.embed.weight, whole.embed.weight)
    assert parted.embed.weight.std().item() > 0.5  # not nn.Linear's kaiming-uniform (std ~0.2 for 8 inputs)


def test_values_drawn_where_the_weights_live_are_the_same_at_every_world_size_sharded_or_partitioned(monkeypatch):
    """The path a GPU run takes, drawn on `draw_on` = the CPU here (tests/gpu/test_materialize_gpu.py: on CUDA): each
    module drawn whole on the draw device under its own seed, then sliced. Whole (DDP, ZeRO-0/1/2: drawn into the
    storage itself, no second copy), ZeRO-3 module by module, and every rank's FSDP2 shards at world 2, 3 (uneven:
    FSDP2 pads) and 4 (tensor parallel 2 x FSDP2 2; each rank simulated in turn on torch's fake process group), put
    back together, are one set of weights, bit for bit; torch's generators are as they were before."""
    from ._fake_ranks import gathered, whole

    drawn_into = []
    real_copy = mat.full_copy
    monkeypatch.setattr(mat, "full_copy", lambda module, device="cpu", into=None: drawn_into.append(len(into or {}))
                        or real_copy(module, device, into))
    state = torch.get_rng_state()
    reference = whole(draw_on="cpu")
    assert torch.equal(torch.get_rng_state(), state)
    assert sum(drawn_into) == len(reference)  # every parameter drawn in place (the norms' and Linears' single weights)
    assert reference["tok_embeddings.weight"].std().item() == pytest.approx(0.02, rel=0.05)  # the builtin rule, not NaN
    assert torch.equal(reference["layers.0.ffn_norm.weight"], torch.ones(256))
    candidates = {"zero3": whole(draw_on="cpu", partition=lambda m, ps: None)}
    drawn_into.clear()
    candidates |= {f"fsdp2 world {w} tp {tp}": gathered(w, tp=tp, draw_on="cpu") for w, tp in ((2, 1), (3, 1), (4, 2))}
    assert sum(drawn_into) == 0  # DTensor shards: drawn whole on a copy, each rank keeping its slice
    for what, weights in candidates.items():
        assert weights.keys() == reference.keys(), what
        for name, value in reference.items():
            assert torch.equal(weights[name], value), (what, name)


def test_the_draw_device_is_the_gpu_where_the_weights_live_on_one_and_the_cpu_otherwise(monkeypatch):
    cuda0, cuda1, cpu = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
    assert mat.draw_device("cpu") == cpu and mat.draw_device("meta") == cpu
    assert mat.draw_device(cuda1) == cuda1  # a GPU run (DDP, FSDP2, ZeRO): drawn on its own GPU
    assert mat.draw_device("cpu", cuda0) == cuda0  # FSDP2's CPU offload on a GPU run: the shards on the host, drawn on the GPU
    assert mat.draw_device(cuda1, "cpu") == cpu
    calls = []
    monkeypatch.setattr(mat, "materialize", lambda *a, **k: calls.append(k["draw_on"]))
    mat.Pending(None, seed=0, draw_on=cuda1)(nn.Linear(2, 2), "cpu")  # the entrypoint passes the run's device
    mat.Pending(None, seed=0)(nn.Linear(2, 2), "cpu")
    assert calls == [cuda1, None]
