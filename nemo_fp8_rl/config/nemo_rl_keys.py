"""Keys NeMo RL's own config classes define that the project's base config leaves out.

NeMo RL's GRPO configs (`examples/configs/`) set keys for features this project's engines do not
drive (DTensor training, SGLang/TRT-LLM generation, multi-dataset data, quantised rollouts): an
imported config keeps them, so the schema accepts them with the type NeMo RL gives them (a value
of null is accepted too: NeMo RL declares them `NotRequired` or `... | None`). A mapping listed
here is free-form below (NeMo RL passes it to another library or to its own sub-config).
Every key's last name is a field of a NeMo RL config class (tests/test_nemo_import.py checks it
against the NeMo RL source); a key that is in neither list nor the base config stays an error.
"""

from __future__ import annotations

from typing import Any

# dotted key -> type NeMo RL reads it as (`float` accepts integers).
NEMO_RL_KEYS: dict[str, type] = {
    "async_rl": dict,
    "cluster.master_port_range_high": int,
    "cluster.master_port_range_low": int,
    "data.add_system_prompt": bool,
    "data.custom_dataloader": str,
    "data.default.dataset_name": str,
    "data.num_prompts_per_dataloader": int,
    "data.train.data_path": str,
    "data.train.split": str,
    "grpo.adv_estimator.reward_weights": list,
    "grpo.debug_payload_metrics": bool,
    "grpo.deduplicate_multimodal_data": bool,
    "grpo.invalid_tool_call_strategy": str,
    "grpo.num_val_generations_per_prompt": int,
    "grpo.penalize_invalid_tool_call": bool,
    "grpo.penalize_malformed_thinking": bool,
    "policy.activation_checkpointing_enabled": bool,
    "policy.disable_modelopt_layer_spec": bool,
    "policy.dtensor_cfg._v2": bool,
    "policy.dtensor_cfg.activation_checkpointing": bool,
    "policy.dtensor_cfg.automodel_kwargs": dict,
    "policy.dtensor_cfg.clear_cache_every_n_steps": int,
    "policy.dtensor_cfg.context_parallel_size": int,
    "policy.dtensor_cfg.cpu_offload": bool,
    "policy.dtensor_cfg.custom_parallel_plan": str,
    "policy.dtensor_cfg.env_vars": dict,
    "policy.dtensor_cfg.expert_parallel_size": int,
    "policy.dtensor_cfg.lora_cfg": dict,
    "policy.dtensor_cfg.moe_parallelizer": dict,
    "policy.dtensor_cfg.sequence_parallel": bool,
    "policy.dtensor_cfg.tensor_parallel_size": int,
    "policy.generation.dynamo_cfg": dict,
    "policy.generation.mcore_generation_config": dict,
    "policy.generation.port_range_high": int,
    "policy.generation.port_range_low": int,
    "policy.generation.quant_cfg": str,
    "policy.generation.real_quant": bool,
    "policy.generation.real_quant_ignore": list,
    "policy.generation.refit_cfg.sparse": dict,
    "policy.generation.sglang_cfg": dict,
    "policy.generation.trtllm_cfg": dict,
    "policy.generation.trtllm_kwargs": dict,
    "policy.generation.use_async_rollouts": bool,
    "policy.generation.vllm_cfg.enable_expert_parallel": bool,
    "policy.generation.vllm_cfg.enable_prefix_caching": bool,
    "policy.generation.vllm_cfg.enable_thinking": bool,
    "policy.generation.vllm_cfg.enforce_monotonicity": bool,
    "policy.generation.vllm_cfg.expose_http_server": bool,
    "policy.generation.vllm_cfg.http_server_serving_chat_kwargs": dict,
    "policy.generation.vllm_cfg.limit_mm_per_prompt": dict,
    "policy.generation.vllm_cfg.reasoning_parser_plugin": str,
    "policy.generation.vllm_cfg.skip_tokenizer_init": bool,
    "policy.megatron_cfg.attention_backend": str,
    "policy.megatron_cfg.calculate_per_token_loss": bool,
    "policy.megatron_cfg.converter_type": str,
    "policy.megatron_cfg.cp_normalize": bool,
    "policy.megatron_cfg.distributed_data_parallel_config.average_in_collective": bool,
    "policy.megatron_cfg.do_not_average_loss": bool,
    "policy.megatron_cfg.freeze_config": dict,
    "policy.megatron_cfg.moe_aux_loss_coeff": float,
    "policy.megatron_cfg.moe_flex_dispatcher_backend": str,
    "policy.megatron_cfg.moe_hybridep_num_sms": int,
    "policy.megatron_cfg.moe_router_enable_expert_bias": bool,
    "policy.megatron_cfg.scale_loss_by_dp_cp_size": bool,
    "policy.megatron_cfg.scheduler.override_opt_param_scheduler": bool,
    "policy.megatron_cfg.track_moe_metrics": bool,
    "policy.megatron_cfg.train_iters": int,
    "policy.quant_batch_size": int,
    "policy.quant_calib_data": str,
    "policy.quant_calib_size": int,
    "policy.quant_cfg": str,
    "policy.quant_sequence_length": int,
    "policy.refit_buffer_size_gb": int,
    "policy.router_replay": dict,
}
# Keys of `NEMO_RL_KEYS` that NeMo RL's own example configs set but that no class or code of
# NeMo RL (main 7ea279a) names: accepted so that those configs load (NeMo RL ignores them).
SET_BY_CONFIGS_ONLY = frozenset(
    {
        "grpo.invalid_tool_call_strategy",
        "policy.generation.vllm_cfg.limit_mm_per_prompt",  # v0.7.0 only; main reads it
        "policy.megatron_cfg.moe_aux_loss_coeff",  # v0.7.0 only; main reads it
        "grpo.num_val_generations_per_prompt",
        "grpo.penalize_invalid_tool_call",
        "grpo.penalize_malformed_thinking",
        "policy.activation_checkpointing_enabled",
        "policy.generation.vllm_cfg.enable_expert_parallel",
        "policy.generation.vllm_cfg.enforce_monotonicity",
        "policy.megatron_cfg.calculate_per_token_loss",
        "policy.megatron_cfg.converter_type",
        "policy.megatron_cfg.cp_normalize",
        "policy.megatron_cfg.distributed_data_parallel_config.average_in_collective",
        "policy.megatron_cfg.do_not_average_loss",
        "policy.megatron_cfg.moe_router_enable_expert_bias",
        "policy.megatron_cfg.scale_loss_by_dp_cp_size",
        "policy.megatron_cfg.scheduler.override_opt_param_scheduler",
        "policy.megatron_cfg.track_moe_metrics",
    }
)
# Keys the base config holds with a narrower type than NeMo RL's: key -> accepted types.
WIDER_TYPES: dict[str, tuple[type, ...]] = {
    "grpo.batch_multiplier": (int, float),  # GRPOConfig: float
    "data.train": (dict, list),  # DataConfig.train: one dataset or a list of them
}
# Keys the base config holds with a value that NeMo RL also allows to be null.
NULLABLE_IN_NEMO_RL = frozenset(
    {
        "data.max_input_seq_length",
        "grpo.max_val_samples",
        "grpo.val_batch_size",
        "grpo.async_grpo",
        "data_plane",
        "loss_fn.kl_input_clamp_value",
        "loss_fn.kl_output_clamp_value",
        "loss_fn.truncated_importance_sampling_ratio",
        "policy.megatron_cfg.scheduler.lr_decay_iters",
    }
)


def nemo_rl_type_ok(path: str, value: Any) -> bool:
    """`value` has the type NeMo RL gives the extra key `path` (null always allowed)."""
    kind = NEMO_RL_KEYS[path]
    if value is None or kind is object:
        return True
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)
