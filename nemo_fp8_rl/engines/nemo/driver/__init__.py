"""The NeMo RL engine's driver side: what runs in `nemo_fp8_rl.train`'s process."""
