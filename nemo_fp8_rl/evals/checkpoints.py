"""Which checkpoint of a run to evaluate: `last`, `best` (by validation accuracy) or `step_N`.

Embedded engine: `checkpoints/step_<k>/info.json` holds `validation/bf16_accuracy` (the last
BF16-generation score measured when the checkpoint was written; checkpoints written before it
existed hold only `validation/accuracy`, the rollout engine's score, and are ranked by that) and `checkpoints/latest` names the newest; `step_0` is
the warm-started policy before any GRPO step (`model/`). NeMo RL: `checkpoints/step_<k>/
training_info.json` holds the checkpointing metric (`checkpointing.metric_name`, e.g.
`val:accuracy`), and the Megatron weights are in `policy/weights/iter_*`; NeMo RL's own
`CheckpointManager` picks last and best there when it is importable.

Best-checkpoint selection bias: `best` is the maximum over the kept checkpoints of a noisy
validation score, so its benchmark scores are optimistic, most of all on a benchmark that is also
the validation set (AIME 2024 in the DeepScaleR and DAPO recipes). `Selection.bias` says so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.numbers import MAX_INT_DIGITS
from nemo_fp8_rl.config.user_error import USAGE, CheckpointError, shown
from nemo_fp8_rl.runs import scores as run_scores
from nemo_fp8_rl.tiny import INPUTS

_STEP = re.compile(rf"step_(\d{{1,{MAX_INT_DIGITS}}})")  # longer numbers cannot be printed
BIAS = (
    "best = the highest validation score among {n} kept checkpoint(s) (metric {metric}); the "
    "maximum of noisy scores is biased upward, so its benchmark scores are optimistic, most on "
    "benchmarks that overlap the validation set ({overlap}). Compare last with last."
)


def refused(where: object, what: str, fix: str) -> CheckpointError:
    """No such checkpoint, or none that can be chosen (a usage error); the message lists what the
    run has."""
    return CheckpointError(str(where), what, fix, code=USAGE)


@dataclass(frozen=True)
class Selection:
    """The checkpoint picked, how, and the caveat that comes with it."""

    selector: str  # last | best | step_N
    step: int
    path: Path
    metric: str | None = None
    value: float | None = None
    candidates: int = 0
    bias: str | None = None
    scores: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The `checkpoint` entry of an evaluation result."""
        return {
            "selector": self.selector,
            "step": self.step,
            "path": str(self.path),
            "metric": self.metric,
            "value": self.value,
            "candidates": self.candidates,
            "selection_bias": self.bias,
            "validation_by_step": {str(k): v for k, v in sorted(self.scores.items())},
        }


def _steps(root: Path, info_file: str) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """`{step: info}` of the complete `step_<k>` directories under `root`, and `{step: what is
    wrong}` for those whose info file does not read as a JSON object."""
    out: dict[int, dict[str, Any]] = {}
    bad: dict[int, str] = {}
    for d in root.glob("step_*") if root.is_dir() else []:
        m = _STEP.fullmatch(d.name)
        if not (m and (d / info_file).is_file()):
            continue
        try:
            info = json.loads((d / info_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            bad[int(m.group(1))] = f"not valid JSON ({exc})"
            continue
        if isinstance(info, dict):
            out[int(m.group(1))] = info
        else:
            bad[int(m.group(1))] = f"not a JSON object (got {type(info).__name__})"
    return out, bad


def _refuse_unreadable(
    selector: str, infos: dict[int, dict[str, Any]], bad: dict[int, str], root: Path, info: str
) -> None:
    """A selection that depends on an unreadable info file is refused, naming the file."""
    have = ", ".join(f"step_{s}" for s in sorted(infos)) or "none"
    fix = f"restore the file, or pick a readable checkpoint with --checkpoint step_N (has: {have})"
    m = _STEP.fullmatch(selector)
    if m and int(m.group(1)) in bad:
        step = int(m.group(1))
        raise refused(root / f"step_{step}" / info, bad[step], fix)
    if selector == "last" and bad and max(bad) > max(infos, default=-1):
        step = max(bad)
        what = f"{bad[step]}; it is the newest checkpoint, so last cannot be chosen"
        raise refused(root / f"step_{step}" / info, what, fix)
    if selector == "best" and bad:
        step = min(bad)
        what = f"cannot rank the checkpoints: step_{step}/{info} is {bad[step]}"
        raise refused(root, what, fix)


def _scores(infos: dict[int, dict[str, Any]], metric: str) -> dict[int, float]:
    """`{step: score}` of the checkpoints whose `metric` is a finite number: a NaN (a diverged
    validation) or a non-number is no score, so `best` can never choose it."""
    out = {}
    for step, info in infos.items():
        value = info.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[step] = float(value)
    return out


def _pick(
    selector: str, infos: dict[int, dict[str, Any]], metric: str, root: Path, overlap: str
) -> tuple[int, float | None, str | None]:
    """(step, metric value, bias note) for `selector` over `infos`."""
    have = ", ".join(f"step_{s}" for s in sorted(infos)) or "none"
    if selector == "last":
        if not infos:
            raise refused(
                root, "no complete checkpoint (step_*) to evaluate", "train the run first"
            )
        step = max(infos)
        return step, infos[step].get(metric), None
    if selector == "best":
        scored = _scores(infos, metric)
        if not scored:
            raise refused(
                root,
                f"no checkpoint records {metric} (checkpoints: {have})",
                "use --checkpoint last, or validate on save steps (grpo.val_period)",
            )
        step = max(scored, key=lambda s: (scored[s], s))  # NeMo RL's tie-break: latest
        return step, scored[step], BIAS.format(n=len(scored), metric=metric, overlap=overlap)
    m = _STEP.fullmatch(selector)
    if not m:
        raise refused(
            f"--checkpoint {shown(selector)}",
            f"expected last, best or step_N (N at most {MAX_INT_DIGITS} digits)",
            "e.g. --checkpoint step_100",
        )
    step = int(m.group(1))
    if step not in infos:
        raise refused(
            f"--checkpoint {selector}",
            f"{root} has no {selector} (has: {have})",
            "pick one of the checkpoints it has, or last or best",
        )
    return step, infos[step].get(metric), None


def select_local(run_dir: Path, selector: str) -> Selection:
    """A checkpoint of an embedded-engine run (`step_0`: the policy before GRPO, `model/`)."""
    root = run_dir / "checkpoints"
    infos, bad = _steps(root, "info.json")
    metric = run_scores.accuracy_key(infos.values())
    if selector == "step_0" and 0 not in infos and 0 not in bad:
        if not (run_dir / "model" / "config.json").is_file():
            raise refused(
                run_dir / "model", "no initial policy (was the run started?)", "train the run"
            )
        return Selection("step_0", 0, run_dir / "model", metric)
    _refuse_unreadable(selector, infos, bad, root, "info.json")
    step, value, bias = _pick(selector, infos, metric, root, "the validation split")
    scores = _scores(infos, metric)
    return Selection(
        selector, step, root / f"step_{step}", metric, value, len(scores), bias, scores
    )


def select_nemo(run_dir: Path, selector: str, checkpointing: dict[str, Any]) -> Selection:
    """A checkpoint of a NeMo RL run; last and best through NeMo RL's `CheckpointManager`."""
    root = run_dir / "checkpoints"  # derived from the run dir, unless the recipe set a path
    if not root.is_dir() and checkpointing.get("checkpoint_dir"):
        root = Path(checkpointing["checkpoint_dir"])
    metric = checkpointing.get("metric_name") or "val:accuracy"
    infos, bad = _steps(root, "training_info.json")
    _refuse_unreadable(selector, infos, bad, root, "training_info.json")
    step, value, bias = _pick(selector, infos, metric, root, "AIME 2024 in these recipes")
    if selector in ("last", "best"):
        try:
            from nemo_rl.utils.checkpoint import CheckpointManager
        except ImportError:
            pass
        else:
            manager = CheckpointManager({**checkpointing, "checkpoint_dir": str(root)})
            chosen = (
                manager.get_latest_checkpoint_path()
                if selector == "last"
                else manager.get_best_checkpoint_path()
            )
            found = _STEP.fullmatch(Path(chosen).name)
            # NeMo RL ranks a NaN score too; ours stands when its pick has no finite score.
            if found and (selector == "last" or int(found.group(1)) in _scores(infos, metric)):
                step = int(found.group(1))
                value = infos[step].get(metric)
    scores = _scores(infos, metric)
    return Selection(
        selector, step, root / f"step_{step}", metric, value, len(scores), bias, scores
    )


def select_nemo_cpu(run_dir: Path, selector: str, checkpointing: dict[str, Any]) -> Selection:
    """A checkpoint of a run of NeMo RL's loop on CPU; `step_0` is the handed-over model."""
    if selector == "step_0":
        model = run_dir / INPUTS / "model"
        return Selection("step_0", 0, model, checkpointing.get("metric_name") or "val:accuracy")
    return select_nemo(run_dir, selector, checkpointing)


def best_note(run_dir: Path, selection: Selection) -> str | None:
    """For `--checkpoint best`, the line the terminal shows: `best` is chosen among the kept
    checkpoints only, and the run's best validation step (from `metrics.jsonl`) may be one
    that was not kept."""
    if selection.selector != "best":
        return None
    from nemo_fp8_rl.runs.summary import read_records

    kept = ", ".join(f"step_{k} {v:.3f}" for k, v in sorted(selection.scores.items()))
    line = (
        f"best = step_{selection.step}: the highest {selection.metric} among the "
        f"{selection.candidates} kept checkpoint(s) ({kept}), not among every validation step"
    )
    records = read_records(run_dir)
    key = run_scores.accuracy_key(records)
    scored = [
        (float(r[key]), int(r["step"]))
        for r in records
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and "step" in r
    ]
    if scored:
        value, step = max(scored, key=lambda vs: (vs[0], vs[1]))
        if step != selection.step:
            line += f"; the run's best validation ({key}) was {value:.3f} at step {step}, not kept"
    return line


def megatron_weights(checkpoint: Path) -> Path:
    """`<checkpoint>/policy/weights/iter_*` (the converter's `--megatron-ckpt-path`)."""
    weights = checkpoint / "policy" / "weights"
    iters = sorted(weights.glob("iter_*"))
    if not iters:
        raise refused(
            weights,
            "no iter_* directory (a Megatron checkpoint)",
            "evaluate a run trained with policy.megatron_cfg.enabled: true",
        )
    return iters[-1]
