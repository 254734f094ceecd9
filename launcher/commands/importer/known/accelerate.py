"""Accelerate 1.15's config keys (the installed package, read by tests/test_import.py). `accelerate launch`
loads the file with load_config_from_file: a top-level key its ClusterConfig (or SageMakerConfig) lacks raises
"The config file at ... had unknown keys"; the keys of the nested tables become launch arguments
(commands/launch.py), and one no argument has is set and never read."""

CLUSTER = (
    "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type", "downcast_bf16",
    "dynamo_backend", "dynamo_config", "enable_cpu_affinity", "fp16", "fp8_config", "fsdp_config", "gpu_ids", "machine_rank",
    "main_process_ip", "main_process_port", "main_training_function", "megatron_lm_config", "mixed_precision", "mpirun_config",
    "num_machines", "num_processes", "parallelism_config", "rdzv_backend", "same_network", "tpu_env", "tpu_name",
    "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu",
)
"""ClusterConfig's fields, and fp16 / dynamo_backend, which process_config converts."""

SAGEMAKER = (
    "additional_args", "base_job_name", "compute_environment", "debug", "distributed_type", "dynamo_backend", "dynamo_config",
    "ec2_instance_type", "enable_cpu_affinity", "fp16", "gpu_ids", "iam_role_name", "image_uri", "mixed_precision",
    "num_machines", "profile", "py_version", "pytorch_version", "region", "sagemaker_inputs_file", "sagemaker_metrics_file",
    "transformers_version", "use_cpu",
)
"""SageMakerConfig's fields (compute_environment AMAZON_SAGEMAKER)."""

LAUNCH = (
    "aws_access_key_id", "aws_secret_access_key", "config_file", "cpu", "debug", "deepspeed_config_file",
    "deepspeed_exclusion_filter", "deepspeed_hostfile", "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names",
    "deepspeed_multinode_launcher", "downcast_bf16", "dynamo_backend", "dynamo_mode", "dynamo_use_dynamic",
    "dynamo_use_fullgraph", "dynamo_use_regional_compilation", "enable_cpu_affinity", "env", "fp8_amax_compute_algo",
    "fp8_amax_history_len", "fp8_backend", "fp8_enable_fsdp_float8_all_gather", "fp8_format", "fp8_interval", "fp8_margin",
    "fp8_opt_level", "fp8_override_linear_precision", "fp8_pad_inner_dim", "fp8_use_autocast_during_eval",
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload", "fsdp_auto_wrap_policy", "fsdp_backward_prefetch",
    "fsdp_cpu_ram_efficient_loading", "fsdp_forward_prefetch", "fsdp_min_num_params", "fsdp_offload_params",
    "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_state_dict_type", "fsdp_sync_module_states",
    "fsdp_transformer_layer_cls_to_wrap", "fsdp_use_orig_params", "fsdp_version", "gpu_ids", "gradient_accumulation_steps",
    "gradient_clipping", "help", "log_dir", "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
    "max_restarts", "megatron_lm_attention_backend", "megatron_lm_attention_dropout", "megatron_lm_attention_softmax_in_fp32",
    "megatron_lm_calculate_per_token_loss", "megatron_lm_context_parallel_size", "megatron_lm_decoder_last_pipeline_num_layers",
    "megatron_lm_eod_mask_loss", "megatron_lm_expert_model_parallel_size", "megatron_lm_expert_tensor_parallel_size",
    "megatron_lm_gradient_clipping", "megatron_lm_hidden_dropout", "megatron_lm_no_load_optim", "megatron_lm_no_save_optim",
    "megatron_lm_num_micro_batches", "megatron_lm_optimizer_cpu_offload", "megatron_lm_overlap_cpu_optimizer_d2h_h2d",
    "megatron_lm_pp_degree", "megatron_lm_recompute_activations", "megatron_lm_recompute_granularity",
    "megatron_lm_recompute_method", "megatron_lm_recompute_num_layers", "megatron_lm_sequence_parallelism",
    "megatron_lm_tp_degree", "megatron_lm_use_custom_fsdp", "megatron_lm_use_distributed_optimizer",
    "megatron_lm_use_precision_aware_optimizer", "megatron_lm_use_rotary_position_embeddings", "mixed_precision", "module",
    "monitor_interval", "mpirun_hostfile", "multi_gpu", "no_python", "num_cpu_threads_per_process", "num_machines",
    "num_processes", "offload_optimizer_device", "offload_optimizer_nvme_path", "offload_param_device", "offload_param_nvme_path",
    "parallelism_config_cp_backend", "parallelism_config_cp_comm_strategy", "parallelism_config_cp_size",
    "parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size", "parallelism_config_sp_attn_implementation",
    "parallelism_config_sp_backend", "parallelism_config_sp_seq_length", "parallelism_config_sp_seq_length_is_variable",
    "parallelism_config_sp_size", "parallelism_config_tp_size", "quiet", "rdzv_backend", "rdzv_conf", "role", "same_network",
    "tee", "tpu", "tpu_use_cluster", "tpu_use_sudo", "training_script", "training_script_args", "use_deepspeed", "use_fsdp",
    "use_megatron_lm", "use_parallelism_config", "vm", "zero3_init_flag", "zero3_save_16bit_model", "zero_stage",
)
"""The arguments of `accelerate launch` (launch_command_parser): a nested key K of fsdp_config, fp8_config,
dynamo_config, deepspeed_config, ... sets the argument K (fsdp_K, fp8_K, dynamo_K where K lacks the prefix)."""
