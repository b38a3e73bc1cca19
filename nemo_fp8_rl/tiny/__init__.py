"""The tiny-model kit every CPU run shares: the model (`model`: tiny Qwen3/Llama, built from a
seed and saved as a real Hugging Face checkpoint), the task (`task`: n-digit addition with an
exact-match reward), the character tokenizer (`tokenizer`), the supervised warm-up and its
store (`warmup`, `warmup_store`), KV-cache sampling with vLLM's log-probs (`sampling`) and the
hand-over to NeMo RL's loop on CPU (`handover`: the warm-started model and the task's JSONL
files in `<run dir>/nemo-inputs/`).

The embedded engine (`engines.local`), NeMo RL's loop on CPU (`engines.nemo.cpu`), `evals`,
`study` and `cli` all use it; it imports only `config` (the import contracts in
pyproject.toml hold it there), so none of them reaches into another's engine for it.
"""

INPUTS = "nemo-inputs"  # the hand-over's folder in a run of NeMo RL's loop on CPU
