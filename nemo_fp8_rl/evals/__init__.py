"""Evaluation of trained runs: benchmark suites, checkpoint selection, the two evaluators, results.

`nemo_fp8_rl.eval --run runs/<name> [--checkpoint last|best|step_N] [--suite S]` picks a
checkpoint of the run (`checkpoints`), evaluates it on a suite (`suites`) with the embedded engine
(`local`, CPU recipes) or NeMo RL's converter and `examples/run_eval.py` (`nemo`, GPU recipes), and
writes `runs/<name>/eval/<suite>.json` (`results`). `table` reads those files for `compare`.
"""
