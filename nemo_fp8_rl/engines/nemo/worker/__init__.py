"""The NeMo RL engine's worker side: what NeMo RL's Ray workers and vLLM's processes import."""
