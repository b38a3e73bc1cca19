"""What `eval` and `submit --eval` check before any work starts: the run's saved recipe, the
suite, the checkpoint and the data folder. Each problem is a located error (exit code 2), found
before a model is loaded, a converter runs or a job is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.errors import RecipeError
from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.config.safe_yaml import load_yaml_file
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.evals.checkpoints import Selection, select_local, select_nemo, select_nemo_cpu
from nemo_fp8_rl.evals.nemo_cpu import is_nemo_cpu_run
from nemo_fp8_rl.evals.suites import Suite, get_suite

# Keys of the saved recipe an evaluation reads, per engine.
_NEEDED = {
    "local": ("grpo.max_num_steps", "grpo.num_prompts_per_step", "local.task.digits"),
    "nemo": (
        "checkpointing",
        "policy.model_name",
        "policy.max_total_sequence_length",
        "policy.generation.max_new_tokens",
        "policy.generation.vllm_cfg.tensor_parallel_size",
        "data",
    ),
}


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved recipe (`recipe.yaml`, written by both engines when the run starts)."""
    path = run_dir / "recipe.yaml"
    fix = f"pass a run directory of nemo_fp8_rl.train, or restore {path.name} from a backup"
    if not path.is_file():
        raise UsageError(
            path,
            f"not found: {run_dir} is not a run directory"
            + ("" if run_dir.is_dir() else " (no such folder here)"),
            "pass the folder of a run: train writes runs/<recipe name> under the folder it runs "
            f"in (here {Path.cwd()}); ls runs/ lists them",
        )
    try:
        config = load_yaml_file(path)
    except RecipeError as exc:
        raise UsageError(path, f"not a readable recipe ({exc.issues[0].what})", fix) from exc
    if not isinstance(config, dict):
        what = "empty" if config is None else f"not a mapping (a {type(config).__name__})"
        raise UsageError(path, f"{what}: the run's saved recipe is lost", fix)
    try:
        gpus = _lookup(config, "cluster.gpus_per_node")
    except KeyError:
        raise UsageError(path, "has no cluster.gpus_per_node", fix) from None
    missing = [k for k in _NEEDED["local" if gpus == 0 else "nemo"] if not _has(config, k)]
    if missing:
        raise UsageError(path, f"has no {', '.join(missing)}", fix)
    return config


def _has(config: dict[str, Any], dotted: str) -> bool:
    try:
        _lookup(config, dotted)
    except KeyError:
        return False
    return True


def engine_of(config: dict[str, Any]) -> str:
    """`local` (CPU recipe: the embedded engine) or `nemo` (GPU recipe: NeMo RL's tools)."""
    return "local" if on_cpu(config) else "nemo"


def extra_benchmarks(suite: Suite) -> list[str]:
    """Benchmarks some supported NeMo RL snapshot lacks: `--data-dir` supplies their JSONL."""
    return [b.name for b in suite.benchmarks if b.v070 is None or b.registry is None]


def check_data_dir(data_dir: Path | None, engine: str, suite: Suite) -> Path | None:
    """`--data-dir`: a folder holding at least one `<benchmark>.jsonl` of the suite, GPU runs only."""
    if data_dir is None:
        return None
    where = f"--data-dir {data_dir}"
    if not data_dir.is_dir():
        what = "is a file, not a folder" if data_dir.exists() else "no such folder"
        raise UsageError(where, what, "give the folder that holds <benchmark>.jsonl files")
    if engine == "local":
        raise UsageError(
            where,
            f"CPU runs evaluate the {suite.name} suite, which reads no data files",
            "leave --data-dir out",
        )
    wanted = [f"{name}.jsonl" for name in extra_benchmarks(suite)]
    if wanted and not any((data_dir / name).is_file() for name in wanted):
        raise UsageError(
            where,
            f"holds none of the files it is for ({', '.join(wanted)})",
            "put the benchmarks' JSONL files (problem, answer) there, or leave --data-dir out",
        )
    return data_dir


@dataclass(frozen=True)
class EvalRequest:
    """A checked evaluation: the run's recipe, its engine, the suite and the checkpoint."""

    run_dir: Path
    config: dict[str, Any]
    engine: str
    suite: Suite
    selection: Selection
    data_dir: Path | None


def check_request(
    run_dir: Path, checkpoint: str, suite_name: str | None, data_dir: Path | None
) -> EvalRequest:
    """Every argument of an evaluation checked, in the order a user reads them."""
    config = read_run_config(run_dir)
    engine = engine_of(config)
    suite = get_suite(suite_name, engine)
    data = check_data_dir(data_dir, engine, suite)
    if engine == "local" and is_nemo_cpu_run(run_dir):  # NeMo RL's loop on CPU
        selection = select_nemo_cpu(run_dir, checkpoint, config["checkpointing"])
    elif engine == "local":
        selection = select_local(run_dir, checkpoint)
    else:
        selection = select_nemo(run_dir, checkpoint, config["checkpointing"])
    return EvalRequest(run_dir, config, engine, suite, selection, data)
