"""What Transformer Engine 2.20.2 accepts, read from its Python source (the `transformer_engine` wheel,
`pip download --no-deps transformer-engine==2.20.2`): the keyword names fp8launch's calls are checked
against where TE cannot be installed (the stand-in, tests/train/test_te_standin.py, refuses any other);
tests/gpu/test_te_conformance.py checks the installed TE's."""

from __future__ import annotations

TE_MODULE_ARGS: dict[str, frozenset[str]] = {
    # transformer_engine/pytorch/module/linear.py, Linear.__init__ (TE 2.20.2)
    "Linear": frozenset({
        "in_features", "out_features", "sequence_parallel", "fuse_wgrad_accumulation", "tp_group", "tp_size",
        "get_rng_state_tracker", "rng_tracker_name", "init_method", "bias", "return_bias", "params_dtype",
        "parallel_mode", "parameters_split", "device", "ub_overlap_ag", "ub_overlap_rs", "ub_overlap_rs_dgrad",
        "ub_bulk_dgrad", "ub_bulk_wgrad", "ub_name", "delay_wgrad_compute", "symmetric_ar_type",
        "save_original_input", "name"}),
    # module/layernorm.py and module/rmsnorm.py __init__, plus the **kwargs their ops take (device, dtype, sm_margin)
    "LayerNorm": frozenset({
        "normalized_shape", "eps", "sequence_parallel", "params_dtype", "zero_centered_gamma", "hidden_size",
        "device", "dtype", "sm_margin"}),
    "RMSNorm": frozenset({
        "normalized_shape", "eps", "sequence_parallel", "params_dtype", "zero_centered_gamma", "hidden_size",
        "device", "dtype", "sm_margin"}),
    # attention/dot_product_attention/dot_product_attention.py, DotProductAttention.__init__ (TE 2.20.2)
    "DotProductAttention": frozenset({
        "num_attention_heads", "kv_channels", "num_gqa_groups", "attention_dropout", "qkv_format", "attn_mask_type",
        "window_size", "bottom_right_diagonal", "softcap", "sequence_parallel", "tp_size", "get_rng_state_tracker",
        "tp_group", "layer_number", "attention_type", "cp_group", "cp_global_ranks", "cp_stream", "cp_comm_type",
        "softmax_scale", "softmax_type", "return_max_logit", "name"}),
}
"""Constructor keyword names of the TE 2.20.2 modules fp8launch builds."""

TE_RECIPE_FIELDS: dict[str, frozenset[str]] = {
    "DelayedScaling": frozenset({
        "margin", "fp8_format", "amax_history_len", "amax_compute_algo", "scaling_factor_compute_algo",
        "reduce_amax", "fp8_dpa", "fp8_mha", "backward_override"}),
    "Float8CurrentScaling": frozenset({
        "use_power_2_scales", "fp8_format", "fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad",
        "fp8_dpa", "fp8_mha", "backward_override"}),
    "Float8BlockScaling": frozenset({
        "use_f32_scales", "fp8_format", "x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim",
        "fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad", "fp8_dpa", "fp8_mha", "backward_override"}),
    "MXFP8BlockScaling": frozenset({
        "margin", "fp8_format", "fp8_dpa", "fp8_mha", "backward_override", "enable_2d_quantization"}),
    "NVFP4BlockScaling": frozenset({
        "disable_rht", "disable_stochastic_rounding", "disable_2d_quantization", "row_scaled_activation",
        "nvfp4_4over6", "nvfp4_4over6_e4m3_use_256", "nvfp4_4over6_err_mode", "fp4_format", "fp8_format",
        "fp8_dpa", "fp8_mha", "backward_override"}),
}
"""Constructor keyword names of each TE 2.20.2 recipe class."""

TE_FORMATS = frozenset({"E2M1", "E4M3", "E5M2", "HYBRID"})
"""Members of transformer_engine.common.recipe.Format (TE 2.20.2)."""

TE_CALL_ARGS: dict[str, frozenset[str]] = {
    # quantization.py: class autocast.__init__ (TE 2.20.2); fp8_autocast is its deprecated alias
    "autocast": frozenset({"enabled", "calibrating", "recipe", "amax_reduction_group", "_graph"}),
    "fp8_autocast": frozenset({"enabled", "calibrating", "fp8_recipe", "fp8_group", "_graph"}),
    # quantization.py: quantized_model_init (fp8_model_init: the same, deprecated)
    "quantized_model_init": frozenset({"enabled", "recipe", "preserve_high_precision_init_val"}),
    # distributed.py: checkpoint(function, *args, **kwargs) pops these keywords (the rest go to `function`)
    "checkpoint": frozenset({"use_reentrant", "distribute_saved_activations", "tp_group", "get_rng_state_tracker",
                             "context_fn", "determinism_check", "debug"}),
}
"""Keyword names of the TE 2.20.2 functions fp8launch calls."""

TE_OPTIMIZER_ARGS: dict[str, frozenset[str]] = {
    # optimizers/fused_adam.py, FusedAdam.__init__ (TE 2.20.2): params positional, the rest keywords
    "FusedAdam": frozenset({
        "lr", "betas", "eps", "weight_decay", "amsgrad", "bias_correction", "adam_w_mode", "capturable", "master_weights",
        "master_weight_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "use_decoupled_grad", "store_param_remainders",
        "set_grad_none"}),
}
"""Constructor keyword names of the TE 2.20.2 optimizers fp8launch builds."""

TE_FUSED_ADAM_METHODS = frozenset({"initialize_state", "set_scaled_state", "get_unscaled_state"})
"""FusedAdam methods fp8launch calls to seed the master copy (initialize_state(param, store_param_remainders),
set_scaled_state(param, "master_param", fp32 tensor))."""

TE_MODULE_STATE_METHODS = frozenset({"get_fp8_meta_tensors", "reset_fp8_meta_tensors", "init_fp8_meta_tensors",
                                     "get_extra_state", "set_extra_state"})
"""module/base.py TransformerEngineBaseModule methods fp8launch's checkpoint uses (launcher/train/precision/te_state.py)."""

EXTRA_STATE_REFUSAL = "Refusing to load pickled Transformer Engine extra state"
"""module/_extra_state.py, extra_state_pickle_advisory: how set_extra_state refuses a delayed-scaling pickle."""
UNSAFE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
DELAYED_STATE_KEYS = frozenset({"scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"})
"""The keys DelayedScaling's pickled extra state holds (module/base.py get_extra_state)."""
