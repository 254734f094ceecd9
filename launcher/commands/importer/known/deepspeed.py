"""DeepSpeed 0.19.8's config keys (the installed package, read by tests/test_import.py): the top-level keys
DeepSpeedConfig looks up in the JSON (it ignores any other), and the sections it builds with DeepSpeedConfigModel,
whose pydantic config forbids extra keys: one of those with an unknown key stops DeepSpeed at initialize()
("Extra inputs are not permitted"). "auto" values are dropped before validation (DeepSpeedConfigModel.__init__)."""

TOP = (
    "activation_checkpointing", "aio", "amp", "autotuning", "bf16", "bfloat16", "checkpoint", "comet", "comms_logger",
    "communication_data_type", "compile", "compression_training", "csv_monitor", "curriculum_learning", "data_efficiency",
    "data_types", "dataloader_drop_last", "datastates_ckpt", "disable_allgather", "disable_python_gc", "dump_state", "eigenvalue",
    "elasticity", "expert_parallel", "flops_profiler", "fp16", "gradient_accumulation_steps", "gradient_allreduce_op",
    "gradient_clipping", "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "log_level",
    "managed_gradient_accumulation", "memory_breakdown", "msamp", "nebula", "optimizer", "pipeline", "prescale_gradients",
    "progressive_layer_drop", "quantize_training", "scheduler", "seq_parallel_communication_data_type", "sparse_attention",
    "sparse_gradients", "steps_per_print", "tensor_parallel", "tensorboard", "timers", "torch_autocast", "train_batch_size",
    "train_micro_batch_size_per_gpu", "use_data_before_expert_parallelism", "vocabulary_size", "wall_clock_breakdown", "wandb",
    "weight_quantization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "zero_optimization",
)
"""The top-level keys DeepSpeedConfig reads (and `msamp`, which MS-AMP's DeepSpeed reads)."""

REMOVED = {
    "amp": "NVIDIA Apex AMP integration", "compression_training": "the DeepSpeed compression library",
    "curriculum_learning": "legacy top-level curriculum_learning", "eigenvalue": "eigenvalue-based Mixture-of-Quantization",
    "elasticity": "elastic training", "graph_harvesting": "graph harvesting", "nebula": "Nebula checkpointing",
    "progressive_layer_drop": "Progressive Layer Dropping", "quantize_training": "Mixture-of-Quantization (quantize_training)",
    "sparse_attention": "DeepSpeed Sparse Attention", "sparse_gradients": "sparse embedding gradients",
    "zero_optimization.mics_shard_size": "MiCS ZeRO-3 sharding", "zero_optimization.mics_hierarchical_params_gather":
    "MiCS ZeRO-3 sharding", "zero_optimization.zeropp_loco_param": "LoCo-Zero++",
}
"""Keys DeepSpeed 0.19.8 refuses at DeepSpeedConfig (runtime/config.py _reject_removed_config_keys: the feature was removed,
DeepSpeedConfigError), with the feature's name."""

WORLD = ("sequence_parallel_size",)
"""Read by DeepSpeedConfig.__init__ itself (runtime/config.py 468, deepspeed.initialize without an mpu, as the HF Trainer
calls it): the data-parallel world is the world / sequence_parallel_size, so train_batch_size counts those ranks."""

STRICT = {
    "zero_optimization": frozenset({
        "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm", "contiguous_gradients",
        "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint", "enable_sanity_checks",
        "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module", "legacy_stage1",
        "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance",
        "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold", "offload_optimizer",
        "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold", "parameter_alignment",
        "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
        "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size", "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
        "zero_hpz_partition_size", "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zero_quantized_weights",
    }),
    "zero_optimization.offload_param": frozenset({
        "buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory",
    }),
    "zero_optimization.offload_optimizer": frozenset({
        "buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path", "pin_memory", "pipeline_read",
        "pipeline_write", "ratio", "super_offload",
    }),
    "bf16": frozenset({
        "bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow", "enabled", "immediate_grad_update",
    }),
    "fp16": frozenset({
        "auto_cast", "consecutive_hysteresis", "enabled", "fp16_master_weights_and_grads", "hysteresis",
        "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale",
    }),
    "tensorboard": frozenset({
        "enabled", "job_name", "output_path",
    }),
    "wandb": frozenset({
        "enabled", "group", "project", "team",
    }),
    "csv_monitor": frozenset({
        "enabled", "job_name", "output_path",
    }),
    "comet": frozenset({
        "api_key", "enabled", "experiment_key", "experiment_name", "mode", "online", "project", "samples_log_interval",
        "workspace",
    }),
    "comms_logger": frozenset({
        "debug", "enabled", "prof_all", "prof_ops", "verbose",
    }),
    "compile": frozenset({
        "autoep_non_moe", "debug_log", "deepcompile", "double_buffer", "free_activation", "free_activation_threshold",
        "keep_all_input_tensors", "keep_int_input_tensors", "offload_activation", "offload_activation_pin_memory",
        "offload_opt_states", "offload_parameters", "passes", "symmetric_memory", "sync_after_allgather", "sync_after_reduce",
        "sync_before_allgather", "sync_before_reduce",
    }),
    "timers": frozenset({
        "enabled", "synchronized",
    }),
}
"""The sections DeepSpeed validates with pydantic models that forbid extra keys (DeepSpeedConfigModel:
extra="forbid")."""
