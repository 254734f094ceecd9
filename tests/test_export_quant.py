"""`fp8launch export --quant`, without a run: each format's codes, scales and config against the libraries that read
them (compressed-tensors 0.20.1's config model, quantizer and decompressors; transformers 5.23's FineGrainedFP8
dequantizer; torchao's MX cast), and which layers are quantized, on the models the plans build (meta device).

The exports of real runs, loaded by transformers, are in tests/test_export.py (fast) and its slow test.
"""

from __future__ import annotations

import json
import types

import pytest
import torch

from launcher.errors import InputError
from launcher.train.export import QUANTS
from launcher.train.export.layers import export_layers, serving_tps, tp_problem
from launcher.train.export.quant import FORMATS, FP8
from tests.support import plan_from

ct = pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")

W = torch.randn(256, 384, generator=torch.Generator().manual_seed(0)) * 0.02
W[0, :128] = 0.0  # an all-zero block (and 128 zeros of a row): codes 0, no division by zero
W[1, 5] = 3.0  # an outlier: its block's / row's scale follows it


def test_the_three_formats_and_nothing_else():
    assert QUANTS == tuple(FORMATS) == ("fp8-block", "fp8-channel", "mxfp8")


@pytest.mark.parametrize("name", QUANTS)
def test_codes_and_scales_have_the_dtypes_and_shapes_the_loaders_create(name):
    """vLLM 0.32.0 create_weights: fp8.py Fp8LinearMethod (weight float8_e4m3fn [out, in], weight_scale_inv fp32
    [ceil(out/128), ceil(in/128)]), compressed_tensors_w8a8_fp8.py (channel: weight_scale fp32 [out, 1]),
    compressed_tensors_w8a8_mxfp8.py (weight_scale uint8 [out, in // 32])."""
    fmt = FORMATS[name]
    q, s = fmt.quantize(W)
    expected = {"fp8-block": ("weight_scale_inv", torch.float32, (2, 3)), "fp8-channel": ("weight_scale", torch.float32, (256, 1)),
                "mxfp8": ("weight_scale", torch.uint8, (256, 12))}[name]
    assert (fmt.scale_name, s.dtype, tuple(s.shape)) == expected == (fmt.scale_name, fmt.scale_dtype, fmt.scale_shape(256, 384))
    assert q.dtype is FP8 and q.shape == W.shape and torch.isfinite(q.float()).all()
    assert q.float().abs().max().item() <= 448 and (q[0, :128].float() == 0).all()
    err = (fmt.dequantize(q, s) - W).abs()
    # e4m3's 3 mantissa bits: |error| <= 2^-4 of the value's power of two, and never past 1/16 of the block's amax
    assert err.max().item() <= 3.0 / 16 and err[2:].max().item() <= W[2:].abs().max().item() / 16


def test_block_scales_are_the_dequant_multiplier_from_each_128_block():
    q, s = FORMATS["fp8-block"].quantize(W)
    assert s[0, 0].item() == pytest.approx(3.0 / 448, rel=1e-6)  # the outlier's block
    assert s[1, 2].item() == pytest.approx(W[128:, 256:].abs().max().item() / 448, rel=1e-6)
    assert q[1, 5].float().item() == 448.0  # the block's amax lands on e4m3's largest value
    # transformers 5.23's FineGrainedFP8 dequantizer (Fp8Dequantize, what from_pretrained runs on a CPU) computes q * s
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    theirs = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
    assert torch.equal(theirs, FORMATS["fp8-block"].dequantize(q, s))


def test_channel_format_is_compressed_tensors_fp8_dynamic():
    """compressed-tensors' own observer math gives our scale, its quantizer our codes, its decompressor q * s."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    q, s = FORMATS["fp8-channel"].quantize(W)
    rows = slice(1, None)  # row 0 is zeros only: compressed-tensors' scale is 0 there, ours the 1e-12 floor
    scale, _ = calculate_qparams(W.amin(dim=1, keepdim=True), W.amax(dim=1, keepdim=True), scheme.weights)
    assert torch.allclose(scale[rows], s[rows], rtol=1e-6, atol=0)
    assert torch.equal(quantize(W, s, torch.zeros_like(s), scheme.weights, dtype=FP8).view(torch.uint8), q.view(torch.uint8))
    compressor = BaseCompressor.get_value_from_registry("float-quantized")
    out = compressor.decompress({"weight": q, "weight_scale": s}, scheme)["weight"]
    assert torch.equal(out.float(), FORMATS["fp8-channel"].dequantize(q, s))


def test_mxfp8_codes_are_torchaos_rceil_cast_and_compressed_tensors_decompresses_them_to_q_times_s():
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    q, s = FORMATS["mxfp8"].quantize(W)
    scale, data = to_mx(W, FP8, 32, ScaleCalculationMode.RCEIL)  # the cast MXFP8 training (MXFP8_RCEIL) applies
    assert torch.equal(q.view(torch.uint8), data.view(torch.uint8)) and torch.equal(s.flatten(), scale.view(torch.uint8).flatten())
    w = FORMATS["mxfp8"].dequantize(q, s)
    assert torch.equal(torch.exp2(s.float() - 127).flatten(), scale.float().flatten())
    compressor = BaseCompressor.get_value_from_registry("mxfp8-quantized")
    out = compressor.decompress({"weight": q, "weight_scale": s}, preset_name_to_scheme("MXFP8", ["Linear"]))["weight"]
    assert torch.equal(out.float(), w)


@pytest.mark.parametrize("name,preset,fmt", [("fp8-channel", "FP8_DYNAMIC", "float-quantized"), ("mxfp8", "MXFP8", "mxfp8-quantized")])
def test_compressed_tensors_configs_are_what_its_config_model_writes(name, preset, fmt):
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, preset_name_to_scheme

    ours = json.loads(json.dumps(FORMATS[name].config(["lm_head", "model.layers.0.self_attn.q_proj"])))
    theirs = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, format=fmt,
                                quantization_status="compressed", ignore=["lm_head", "model.layers.0.self_attn.q_proj"])
    assert ours == theirs.model_dump(mode="json")
    assert QuantizationConfig.model_validate(ours).config_groups["group_0"] == QuantizationScheme(
        targets=["Linear"], **{k: v for k, v in preset_name_to_scheme(preset, ["Linear"]).model_dump().items() if k != "targets"})
    assert transformers.CompressedTensorsConfig.from_dict(ours).quantization_config.format == fmt


def test_block_config_is_what_vllm_and_transformers_read():
    """vLLM 0.32.0 Fp8Config.from_config reads quant_method ("fp8" in it: serialized), activation_scheme, ignored_layers
    (else modules_to_not_convert) and weight_block_size; transformers' FineGrainedFP8Config modules_to_not_convert."""
    config = FORMATS["fp8-block"].config(["lm_head"])
    assert config == {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128],
                      "ignored_layers": ["lm_head"], "modules_to_not_convert": ["lm_head"]}
    theirs = transformers.FineGrainedFP8Config.from_dict(config)
    assert (theirs.weight_block_size, theirs.modules_to_not_convert, theirs.activation_scheme) == ([128, 128], ["lm_head"], "dynamic")


# -- which layers ----------------------------------------------------------------------------------

def _target(model: str, config=None):
    """The Target fp8launch's hf.py builds for builtin `model` (its LlamaForCausalLM config and names), or for a
    Hugging Face `config`."""
    from launcher.train.export import hf

    if config is None:
        from launcher.train.models.llama import build_llama

        with torch.device("meta"):
            entries = {k: hf.Entry(tuple(v.shape), v.dtype) for k, v in build_llama(model).state_dict().items()}
        return hf.builtin_target(model, entries, torch.bfloat16)
    hf._set_dtype(config, torch.bfloat16)
    names = {k: k for k in hf._expected(hf._meta_model(config))}
    return types.SimpleNamespace(config=config, names=names, architecture="LlamaForCausalLM")


def _plan(model: str, **precision):
    return plan_from({"train": {"model": model}, "precision": {"mode": "fp8", "backend": "torchao", **precision}})


def test_the_runs_own_filter_decides_and_fused_shards_stay_together(tmp_path):
    model = "builtin:llama-debug?layers=3"
    plan = _plan(model, torchao={"recipe": "tensorwise", "skip_small": False}, keep=["layers.2.feed_forward.w3"])
    layers = {x.name: x for x in export_layers(plan, 1, str(tmp_path), _target(model), FORMATS["fp8-block"])}
    kept = {name: x.kept for name, x in layers.items() if x.kept}
    assert kept == {
        "model.layers.0.self_attn.q_proj": "keep_first_last",
        "model.layers.0.self_attn.k_proj": "fused with q_proj into vLLM's qkv_proj, which loads one precision (q_proj: keep_first_last)",
        "model.layers.0.self_attn.v_proj": "fused with q_proj into vLLM's qkv_proj, which loads one precision (q_proj: keep_first_last)",
        "model.layers.2.mlp.up_proj": "keep 'layers.2.feed_forward.w3'",
        "model.layers.2.mlp.gate_proj": ("fused with up_proj into vLLM's gate_up_proj, which loads one precision "
                                         "(up_proj: keep 'layers.2.feed_forward.w3')"),
        "lm_head": "keep_first_last"}
    assert len(layers) == 3 * 7 + 1 and layers["model.layers.1.mlp.down_proj"].recipe == "tensorwise"
    no_first_last = _plan(model, keep_first_last=False, torchao={"recipe": "rowwise", "skip_small": False})
    layers = export_layers(no_first_last, 1, str(tmp_path), _target(model), FORMATS["fp8-channel"])
    assert [(x.name, x.recipe, x.kept) for x in layers if x.kept] == [("lm_head", "rowwise", layers[-1].kept)]
    assert layers[-1].kept.startswith("the output layer")  # trained in FP8, kept: no serving stack quantizes lm_head


def test_skip_small_layers_stay_and_a_run_without_fp8_layers_is_refused(tmp_path):
    model = "builtin:llama-debug?layers=2"
    skipped = _plan(model, torchao={"recipe": "tensorwise", "skip_small": True})  # every debug GEMM is "small" on an H100
    with pytest.raises(InputError) as e:
        export_layers(skipped, 1, str(tmp_path), _target(model), FORMATS["fp8-block"])
    assert str(e.value).startswith("error: --quant: the run trained no layer in FP8 (each Linear stayed in high precision: "
                                   "model.layers.0.self_attn.q_proj: keep_first_last)")
    bf16 = plan_from({"train": {"model": model}, "precision": {"mode": "bf16"}})
    with pytest.raises(InputError) as e:
        export_layers(bf16, 1, str(tmp_path), _target(model), FORMATS["fp8-block"])
    assert str(e.value) == ("error: --quant: the run trained no layer in FP8 (precision.mode = bf16 at step 1); fix: export "
                            "without --quant; to serve in FP8 anyway, let vLLM quantize the bf16 export as it loads "
                            "(vllm serve DIR --quantization fp8)")


def test_a_layer_that_cannot_take_the_block_stays_with_its_reason_and_its_fused_siblings(tmp_path):
    """An hf: Llama whose key/value projections are 64 x 128: outside 128 x 128 blocks; q_proj goes with them (qkv_proj)."""
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96, head_dim=32)
    folder = tmp_path / "tiny-llama"
    config.save_pretrained(folder)
    plan = _plan(f"hf:{folder}", keep_first_last=False, torchao={"recipe": "tensorwise", "skip_small": False})
    target = _target(None, config)
    layers = {x.name: x for x in export_layers(plan, 1, str(tmp_path), target, FORMATS["fp8-block"])}
    assert layers["model.layers.1.self_attn.k_proj"].kept == ("64 x 128 is not a multiple of the 128 x 128 block (transformers' "
                                                              "FineGrainedFP8 and compressed-tensors dequantize whole blocks only)")
    assert layers["model.layers.1.self_attn.q_proj"].kept.startswith("fused with k_proj into vLLM's qkv_proj")
    blocks = ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    assert [n for n, x in layers.items() if x.kept is None] == [f"model.layers.{i}.{m}" for i in (0, 1) for m in blocks]
    channel = export_layers(plan, 1, str(tmp_path), target, FORMATS["fp8-channel"])  # no block: every Linear but lm_head
    assert [x.name for x in channel if x.kept] == ["lm_head"]
    # tensor parallel 2 splits o_proj's 128 inputs into 64 a rank: not a whole block (vLLM's create_weights refuses)
    quantized = list(layers.values())
    assert tp_problem(quantized, FORMATS["fp8-block"], 1, config) is None
    assert tp_problem(quantized, FORMATS["fp8-block"], 2, config) == (
        "model.layers.0.self_attn.o_proj (128 x 128) split over 2 ranks by its inputs leaves 64 columns a rank, not a multiple "
        "of the 128-column block")
    assert serving_tps(quantized, FORMATS["fp8-block"], config) == [1]
    assert serving_tps(channel, FORMATS["fp8-channel"], config) == [1, 2, 4, 8]
    small = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=96)
    small.save_pretrained(tmp_path / "small")
    with pytest.raises(InputError) as e:
        export_layers(_plan(f"hf:{tmp_path / 'small'}", torchao={"recipe": "tensorwise", "skip_small": False}), 1, str(tmp_path),
                      _target(None, small), FORMATS["fp8-block"])
    assert "none of the 6 layers the run trained in FP8 can be written as fp8-block" in str(e.value)
    assert str(e.value).endswith("fix: use --quant fp8-channel (one scale per output row: any shape)")


def test_mxfp8_keeps_layers_whose_inputs_are_not_whole_32_blocks():
    fmt = FORMATS["mxfp8"]
    assert fmt.unfit(100, 64) is None
    assert fmt.unfit(64, 100) == "64 x 100 is not a multiple of the 1 x 32 block (an MX scale covers 32 inputs)"
