"""The embedded engine's sampling: `nemo_fp8_rl.engines.sampling`, shared with the NeMo RL
loop's CPU generation worker (autoregressive sampling with a KV cache, vLLM's log-probs)."""

from nemo_fp8_rl.engines.sampling import Generation, SamplingParams, generate

__all__ = ["Generation", "SamplingParams", "generate"]
