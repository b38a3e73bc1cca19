"""GPU evaluation of a NeMo RL run with NeMo RL's own tools.

1. Convert: `uv run --extra mcore python examples/converters/convert_megatron_to_hf.py --config
   <ckpt>/config.yaml --hf-model-name <policy.model_name> --megatron-ckpt-path
   <ckpt>/policy/weights/iter_* --hf-ckpt-path runs/<name>/eval/hf/step_<k>` from NeMo RL's
   folder (the same in v0.7.0 and 7ea279a). The converter imports Megatron-Bridge, which NeMo RL's
   environment has only with its `mcore` extra, so it runs the way its own docstring says
   (`convert_launcher` reads the launcher from it), not with this command's interpreter.
2. Evaluate each benchmark: `examples/run_eval.py --config runs/<name>/eval/<suite>/<bench>/
   config.yaml`, a config whose `defaults:` is NeMo RL's `examples/configs/evals/eval.yaml` and
   whose own keys set the checkpoint, the data set, the sampling of the suite and `eval.save_path`.
   NeMo RL writes `evaluation_data.json` (one reward per sample) there; the score is its mean.
3. `results.write_result` writes `runs/<name>/eval/<suite>.json`.

The generation engine is vLLM in BF16 for every run (FP8-trained weights are evaluated as the
BF16 checkpoint the trainer holds), with the tensor-parallel size of the run's rollout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.evals.checkpoints import Selection, megatron_weights
from nemo_fp8_rl.evals.results import BenchmarkScore
from nemo_fp8_rl.evals.suites import Benchmark, Suite, nemo_dataset

CONVERTER = Path("examples/converters/convert_megatron_to_hf.py")
CONVERT_LAUNCHER = ("uv", "run", "--extra", "mcore", "python")  # when its docstring has none
RUN_EVAL = Path("examples/run_eval.py")
EVAL_BASE = Path("examples/configs/evals/eval.yaml")


class NemoEvalError(UserError, RuntimeError):
    """NeMo RL's tree, converter or evaluation could not be used; the message says what to do."""


def nemo_rl_tree() -> Path:
    """The NeMo RL source tree (`NEMO_RL_SRC`, else the one `nemo_rl` is imported from)."""
    src = os.environ.get("NEMO_RL_SRC")
    if not src:
        try:
            import nemo_rl
        except ImportError:
            raise NemoEvalError(
                "NEMO_RL_SRC",
                "not set, and NeMo RL is not importable",
                "run inside NeMo RL's environment, or export NEMO_RL_SRC=/path/to/nemo-rl",
            ) from None
        src = str(Path(nemo_rl.__file__).resolve().parents[1])
    tree = Path(src)
    for rel in (CONVERTER, RUN_EVAL, EVAL_BASE):
        if not (tree / rel).is_file():
            raise NemoEvalError(
                f"{tree / rel}",
                f"not found, so {tree} is not a NeMo RL source tree",
                "point NEMO_RL_SRC at a NeMo RL checkout (v0.7.0 or later)",
            )
    return tree


def convert_launcher(tree: Path) -> list[str]:
    """How NeMo RL's converter says to launch it (its docstring: `uv run --extra mcore python`)."""
    text = (tree / CONVERTER).read_text()
    found = re.search(
        rf"^\s*(uv run [^\n]*?python)\s+{re.escape(CONVERTER.as_posix())}", text, re.M
    )
    return found.group(1).split() if found else list(CONVERT_LAUNCHER)


def convert_command(tree: Path, checkpoint: Path, hf_dir: Path, model_name: str) -> list[str]:
    """The converter's command line for one checkpoint (run from NeMo RL's folder)."""
    return [
        *convert_launcher(tree),
        CONVERTER.as_posix(),
        "--config",
        str(checkpoint / "config.yaml"),
        "--hf-model-name",
        model_name,
        "--megatron-ckpt-path",
        str(megatron_weights(checkpoint)),
        "--hf-ckpt-path",
        str(hf_dir),
    ]


def _prompt_file(tree: Path, value: str | None) -> str | None:
    """A recipe's prompt file as an absolute path (NeMo RL's are relative to its tree)."""
    if not value:
        return None
    path = Path(value)
    return str(path if path.is_absolute() else tree / path)


def eval_config(
    tree: Path,
    run_cfg: dict[str, Any],
    hf_dir: Path,
    suite: Suite,
    bench: Benchmark,
    save_path: Path,
    data_dir: Path | None = None,
) -> dict[str, Any] | None:
    """The run_eval.py config for one benchmark (None when NeMo RL cannot load it)."""
    dataset = nemo_dataset(bench, tree)
    data: dict[str, Any] = {}
    local = data_dir / f"{bench.name}.jsonl" if data_dir else None
    if dataset is None and local is not None and local.is_file():
        dataset = str(local.resolve())  # NeMo RL's LocalMathDataset fallback
        data = {"problem_key": "problem", "solution_key": "answer", "split": "train"}
        data["file_format"] = "json"
    if dataset is None:
        return None
    policy, s = run_cfg["policy"], suite.sampling
    default = run_cfg["data"].get("default") or {}
    math_env = (run_cfg.get("env") or {}).get("math") or {}
    return {
        "defaults": str(tree / EVAL_BASE),
        "eval": {
            "metric": "pass@k",
            "k_value": 1,
            "num_tests_per_prompt": bench.samples,
            "seed": 42,
            "save_path": str(save_path),
        },
        "generation": {
            "model_name": str(hf_dir),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": -1 if s.top_k is None else s.top_k,
            "max_new_tokens": policy["generation"]["max_new_tokens"],
            "vllm_cfg": {
                "precision": "bfloat16",
                "max_model_len": policy["max_total_sequence_length"],
                "tensor_parallel_size": policy["generation"]["vllm_cfg"]["tensor_parallel_size"],
            },
        },
        "tokenizer": {"name": str(hf_dir)},
        "data": {
            "dataset_name": dataset,
            "prompt_file": _prompt_file(tree, default.get("prompt_file")),
            "system_prompt_file": _prompt_file(tree, default.get("system_prompt_file")),
            **data,
        },
        "env": {
            "math": {
                "num_workers": 8,
                **(
                    {"math_verify_impl": math_env["math_verify_impl"]}
                    if "math_verify_impl" in math_env
                    else {}
                ),
            }
        },
        "cluster": {"gpus_per_node": run_cfg["cluster"]["gpus_per_node"], "num_nodes": 1},
    }


def write_eval_config(config: dict[str, Any], folder: Path) -> Path:
    """Write one benchmark's config as `<folder>/config.yaml`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    write_atomic(path, yaml.safe_dump(config, sort_keys=False))
    return path


def read_scores(save_path: Path, samples: int) -> tuple[float, int, list[int]]:
    """(avg@n, problems, correct samples per problem) from NeMo RL's `evaluation_data.json`:
    one entry per sample, the `samples` of a problem consecutive (run_eval repeats each prompt
    with `repeat_interleave`); a reward counts as correct when it is positive."""
    path = save_path / "evaluation_data.json"
    if not path.is_file():
        raise NemoEvalError(
            path,
            "missing, NeMo RL's run_eval.py wrote no results",
            "read its log above for the cause",
        )
    rows = json.loads(path.read_text())["evaluation_data"]
    rewards = [float(r["reward"]) for r in rows]
    correct = [
        sum(r > 0 for r in rewards[i : i + samples]) for i in range(0, len(rewards), samples)
    ]
    return sum(rewards) / max(1, len(rewards)), len(rewards) // max(1, samples), correct


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=cwd)
    if done.returncode:
        raise NemoEvalError(
            what,
            f"failed with exit code {done.returncode} ({' '.join(cmd)})",
            "read its output above for the cause",
        )


def evaluate(
    run_dir: Path,
    config: dict[str, Any],
    selection: Selection,
    suite: Suite,
    data_dir: Path | None = None,
) -> tuple[dict[str, BenchmarkScore], dict[str, Any], dict[str, str]]:
    """Convert the checkpoint, run every benchmark NeMo RL has; (scores, sampling, missing)."""
    tree = nemo_rl_tree()
    hf_dir = (run_dir / "eval" / "hf" / f"step_{selection.step}").resolve()
    if not (hf_dir / "config.json").is_file():
        cmd = convert_command(
            tree, selection.path.resolve(), hf_dir, config["policy"]["model_name"]
        )
        _run(cmd, tree, "checkpoint conversion")
    scores, missing = {}, {}
    for bench in suite.benchmarks:
        folder = (run_dir / "eval" / suite.name / bench.name).resolve()
        cfg = eval_config(tree, config, hf_dir, suite, bench, folder, data_dir)
        if cfg is None:
            missing[bench.name] = (
                f"{bench.title} is not in NeMo RL's data set registry ({tree.name}); "
                f"give --data-dir D with D/{bench.name}.jsonl (problem, answer)"
            )
            continue
        path = write_eval_config(cfg, folder)
        _run([sys.executable, str(tree / RUN_EVAL), "--config", str(path)], tree, "run_eval.py")
        value, n, correct = read_scores(folder, bench.samples)
        dataset = cfg["data"]["dataset_name"]
        scores[bench.name] = BenchmarkScore(
            bench.title, value, n, bench.samples, dataset, correct, suite.pass_ks
        )
    s = suite.sampling
    sampling = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "max_new_tokens": config["policy"]["generation"]["max_new_tokens"],
        "weights": "bfloat16 (vLLM)",
    }
    return scores, sampling, missing
