"""What Transformer Engine 2.20.2 accepts, read from its Python source (the `transformer_engine` wheel,
`pip download --no-deps transformer-engine==2.20.2`): the keyword names fp8launch's calls are checked
against where TE cannot be installed (tests/train/test_precision_te.py); tests/gpu checks the installed TE's."""

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
