"""Import a NeMo RL GRPO config as a recipe: every key NeMo RL's file sets, kept as it resolves.

A NeMo RL config (`examples/configs/grpo_math_1B.yaml`, a recipe under
`examples/configs/recipes/llm/`, or the user's own) is composed with NeMo RL's `defaults:`
semantics (`nemo_defaults.compose`), and its interpolations are resolved as
OmegaConf resolves them, `${oc.env:VAR[,default]}` read from the environment (`interpolate`); a
literal `${` left in a value (an environment variable's) is written escaped, so it stays literal. The result is laid over
the project's base config, which fills the keys NeMo RL's file leaves out and the project's own
sections (`local`, `refit`, `slurm`, `loss_fn.calibration`) with their defaults. `--fp8` lays an
FP8 overlay (`configs/precision/fp8-*.yaml`) on top, `--calibrated` the calibrated clipping
(`configs/loss/calibrated-clipping.yaml`). The recipe written is self-contained (no `defaults:`)
and is validated with `load_recipe` before it is kept; a combination that cannot work is refused
with the key and file that make it so.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config.errors import Problem, RecipeError
from nemo_fp8_rl.config.interpolate import escape_literals, resolve_all
from nemo_fp8_rl.config.loader import apply_overrides, leaf_sources, load_chain, merge, read_yaml
from nemo_fp8_rl.config.locations import base_config_path, configs_dir
from nemo_fp8_rl.config.nemo_defaults import compose, has_key
from nemo_fp8_rl.config.recipe import Recipe, load_recipe
from nemo_fp8_rl.config.safe_files import refuse_link, write_atomic
from nemo_fp8_rl.config.schema import DERIVED, PATH_KEYS, source_of
from nemo_fp8_rl.config.split_rules import precision_split
from nemo_fp8_rl.config.temp_files import temporary_folder
from nemo_fp8_rl.config.user_error import UsageError

FP8_OVERLAYS = ("blockwise", "tensorwise", "mxfp8")
CALIBRATION_OVERLAY = "loss/calibrated-clipping"
FP8_IS_SOURCE = "--fp8 (NeMo RL asserts importance-sampling correction for FP8 rollouts)"
# Keys the base config sets on where NeMo RL, when a config leaves them out, has them off: a
# config without them keeps NeMo RL's behaviour (ClippedPGLossConfig: NotRequired, None = no TIS).
ABSENT_IN_NEMO_RL: dict[str, Any] = {"loss_fn.truncated_importance_sampling_type": None}


@dataclass
class Imported:
    """An imported config: the recipe's keys, the file that set each, and what was changed."""

    source: Path
    config: dict
    provenance: dict[str, str]
    overlays: list[str] = field(default_factory=list)
    filled: list[str] = field(default_factory=list)
    derived: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)  # the NeMo RL file and its parents


def is_nemo_rl_config(path: Path) -> bool:
    """A GRPO config that is NeMo RL's rather than a recipe: it has `grpo:` and none of the
    project's own sections anywhere in its chain."""
    try:
        config, _ = load_chain(Path(path))
    except RecipeError:
        return False
    return "grpo" in config and not {"local", "refit"} & set(config)


def load_nemo_config(path: Path, files: list[Path] | None = None) -> tuple[dict, dict[str, str]]:
    """`path` composed and resolved as NeMo RL's `load_config` + OmegaConf would do it; every
    file of its `defaults:` chain is appended to `files`."""
    path = Path(path).resolve()
    config, prov = compose(path, (), None, files)
    if "grpo" not in config:
        issue = Problem(
            "grpo",
            "not a GRPO config (no grpo: section after its defaults: chain)",
            "import a GRPO config such as NeMo RL's examples/configs/grpo_math_1B.yaml",
            str(path),
        )
        raise RecipeError(str(path), [issue])
    issues = shape_issues(config, prov)
    if issues:
        raise RecipeError(str(path), issues)
    resolved, interp = resolve_all(config, env=True)
    issues = [Problem(i.key, i.what, i.fix, source_of(prov, i.key)) for i in interp]
    if issues:
        raise RecipeError(str(path), issues)
    return escape_literals(resolved), prov


# Sections the import reads as mappings: every top-level section of NeMo RL's master config,
# and the policy's sub-sections `_refusals` and `_translate` look into (null: absent).
SECTIONS = ("grpo", "loss_fn", "policy", "data", "env", "logger", "cluster", "checkpointing")
SUBSECTIONS = ("policy.generation", "policy.dtensor_cfg", "policy.megatron_cfg")


def shape_issues(config: dict, prov: dict[str, str]) -> list[Problem]:
    """A section written as something other than a mapping (`grpo: null`, `policy: [1, 2]`),
    located at the file that wrote it; NeMo RL's own code would stop on it with a traceback."""
    out = []
    for key in (*SECTIONS, *SUBSECTIONS):
        parent, _, leaf = key.rpartition(".")
        node = config.get(parent) if parent else config
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node[leaf]
        if isinstance(value, dict) or (parent and value is None):
            continue
        shown = "null" if value is None else f"a {type(value).__name__} ({_short(value)})"
        out.append(
            Problem(
                key,
                f"expected a section (key: value lines under it), got {shown}",
                f"write {key} as a mapping, or remove it to take NeMo RL's defaults",
                source_of(prov, key),
            )
        )
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def import_nemo_config(
    path: Path, fp8: str | None = None, calibrated: bool = False, overrides: list[str] = ()
) -> Imported:
    """NeMo RL's config at `path` over the project's base, with the chosen overlays on top and
    the `overrides` (Hydra syntax, as `train` takes them) last."""
    files: list[Path] = []
    nemo, nemo_prov = load_nemo_config(path, files)
    refusals = _refusals(nemo, nemo_prov, fp8, calibrated)
    if refusals:
        raise RecipeError(str(path), refusals)
    derived = {
        key: _pop(nemo, key) for key in DERIVED if key not in PATH_KEYS and has_key(nemo, key)
    }
    changed = _translate(nemo)
    base, base_prov = _base()
    for key, value in ABSENT_IN_NEMO_RL.items():
        if not has_key(nemo, key):
            _set(base, key, value)
    config, prov = merge(base, base_prov, nemo, nemo_prov)
    filled = sorted(k for k, src in prov.items() if src == "base")
    overlays = [f"precision/fp8-{fp8}"] if fp8 else []
    overlays += [CALIBRATION_OVERLAY] if calibrated else []
    for name in overlays:
        overlay_path = configs_dir() / f"{name}.yaml"
        data = read_yaml(overlay_path)
        config, prov = merge(config, prov, data, leaf_sources(data, str(overlay_path)))
    if fp8:
        # NeMo RL's grpo.setup asserts importance-sampling correction for FP8 rollouts.
        fix = {"loss_fn": {"use_importance_sampling_correction": True}}
        config, prov = merge(config, prov, fix, leaf_sources(fix, FP8_IS_SOURCE))
    if precision_split(config, prov):  # the NeMo RL config's own split, kept as NeMo RL runs it
        declared = {"refit": {"precision_split": True}}
        config, prov = merge(config, prov, declared, leaf_sources(declared, SPLIT_SOURCE))
    issues = apply_overrides(config, list(overrides), prov)
    if issues:
        raise RecipeError(str(path), issues)
    source = Path(path).resolve()
    return Imported(source, config, prov, overlays, filled, derived, changed, files)


# The NeMo RL config trains and generates in different precisions (its FP8-rollout recipes do):
# the import declares that split, which NeMo RL runs as written (config/split_rules.py).
SPLIT_SOURCE = "the NeMo RL config's own train/rollout precision split (config/split_rules.py)"

WHY_CHANGED = {
    "grpo.val_period": "the same: validation off",
    "data_plane.enabled": (
        "the NeMo RL engine runs NeMo RL's legacy data path, not the TransferQueue data plane, "
        "which moves the same batches"
    ),
    "checkpointing.model_save_format": (
        "NeMo RL's Policy.save_checkpoint refuses a format outside DTensor v2 at the first save"
    ),
}


def _translate(nemo: dict) -> dict[str, tuple[Any, Any]]:
    """NeMo RL values the project spells otherwise, or that would stop the run (NeMo RL's own
    checks, or the NeMo RL engine's: its data path): key -> (NeMo RL's value, the recipe's);
    `WHY_CHANGED` says why, and the recipe's header says what changed."""
    changed: dict[str, tuple[Any, Any]] = {}
    grpo = nemo["grpo"]
    if isinstance(grpo.get("val_period"), int) and grpo["val_period"] < 0:
        # NeMo RL validates only when val_period > 0; the project's spelling of "off" is 0.
        changed["grpo.val_period"], grpo["val_period"] = (grpo["val_period"], 0), 0
    ckpt, dtensor = (
        nemo.get("checkpointing") or {},
        (nemo.get("policy") or {}).get("dtensor_cfg") or {},
    )
    plane = nemo.get("data_plane")
    if isinstance(plane, dict) and plane.get("enabled") is True:
        changed["data_plane.enabled"], plane["enabled"] = (True, False), False
    v2 = dtensor.get("enabled") and dtensor.get("_v2")
    if ckpt.get("enabled") and ckpt.get("model_save_format") is not None and not v2:
        changed["checkpointing.model_save_format"] = (ckpt["model_save_format"], None)
        ckpt["model_save_format"] = None
    return changed


def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def _pop(tree: dict, dotted: str) -> Any:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree[part]
    return tree.pop(last)


def _base() -> tuple[dict, dict[str, str]]:
    """The project's base config, resolved, every leaf marked as coming from `base`."""
    config, _ = load_chain(base_config_path())
    resolved, _ = resolve_all(config)
    return resolved, leaf_sources(resolved, "base")


def _refusals(nemo: dict, prov: dict[str, str], fp8: str | None, calibrated: bool) -> list[Problem]:
    """Overlays that cannot work on this config, each located at the key that rules it out."""
    if fp8 is not None and fp8 not in FP8_OVERLAYS:
        return [Problem("--fp8", f"unknown FP8 recipe {fp8!r}", f"use one of {FP8_OVERLAYS}", "")]
    policy = nemo.get("policy", {})
    backend = (policy.get("generation") or {}).get("backend", "vllm")
    if fp8 and backend != "vllm":
        return [
            Problem(
                "policy.generation.backend",
                f"is {backend!r}: --fp8 quantises the rollout in vLLM (vllm_cfg.precision: fp8)",
                "import a config that generates with vLLM, or set policy.generation.backend: vllm",
                source_of(prov, "policy.generation.backend"),
            )
        ]
    dtensor = (policy.get("dtensor_cfg") or {}).get("enabled", False)
    megatron = (policy.get("megatron_cfg") or {}).get("enabled", False)
    if (fp8 or calibrated) and (dtensor or not megatron):
        what = "--fp8 trains in FP8 with Megatron-Core" if fp8 else "--calibrated"
        why = (
            f"{what}, and calibrated clipping runs in the Megatron policy's loss"
            if calibrated and not fp8
            else f"{what} (Transformer Engine); this config trains with DTensor"
        )
        key = "policy.dtensor_cfg.enabled" if dtensor else "policy.megatron_cfg.enabled"
        return [
            Problem(
                key,
                f"is {bool(dtensor) if dtensor else bool(megatron)}: {why}",
                "import a Megatron config (NeMo RL's *megatron*.yaml), or set "
                "policy.dtensor_cfg.enabled: false and policy.megatron_cfg.enabled: true in it",
                source_of(prov, key),
            )
        ]
    return []


def to_recipe_text(imported: Imported) -> str:
    """The recipe file: a header naming the source and overlays, then every key."""
    head = [
        f"# Imported from the NeMo RL config {imported.source}",
        "# (nemo_fp8_rl.recipes import): every key it sets, resolved, over the project's base",
        f"# config, which filled {len(imported.filled)} keys it leaves out.",
    ]
    for key, value in imported.derived.items():
        head.append(f"# NeMo RL's {key} was {value!r}: here it derives from the run (--run-dir).")
    kept = [k for k in PATH_KEYS if has_key(imported.config, k)]
    if kept:
        head.append(
            f"# {' and '.join(kept)} are NeMo RL's, kept: the NeMo RL engine writes there (the "
            "embedded engine and --seeds refuse them; remove them to put outputs under --run-dir)."
        )
    for key, (old, new) in imported.changed.items():
        head.append(f"# NeMo RL's {key}: {old!r} is written {new!r} ({WHY_CHANGED[key]}).")
    if imported.overlays:
        head.append(f"# Overlays: {', '.join(f'configs/{o}.yaml' for o in imported.overlays)}")
    overridden = sorted(k for k, src in imported.provenance.items() if src == "override")
    if overridden:
        head.append(f"# Set on the import command: {', '.join(overridden)}")
    if imported.provenance.get("refit.precision_split") == SPLIT_SOURCE:
        head.append(f"# refit.precision_split: true, set by {SPLIT_SOURCE}")
    if any(src == FP8_IS_SOURCE for src in imported.provenance.values()):
        head.append(f"# loss_fn.use_importance_sampling_correction: true, set by {FP8_IS_SOURCE}")
    body = yaml.safe_dump(imported.config, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(head) + "\n" + body


def write_imported(imported: Imported, dest: Path, overwrite: bool = False) -> Path:
    """Write the recipe to `dest` once it loads; an invalid result is refused, each problem
    located at the NeMo RL file, overlay or base key that caused it, and nothing is written.

    Written with `safe_files.write_atomic` (never through a link; a full disk keeps the file it
    was to replace), the complete temporary file loaded as a recipe before it replaces `dest`.
    `dest` is never the NeMo RL config being imported nor one of its parents.
    """
    dest = destination(imported, Path(dest), overwrite)
    if not dest.parent.is_dir():
        raise UsageError(dest.parent, "no such folder", f"create it first (mkdir -p {dest.parent})")

    def loads(trial: Path) -> None:
        try:
            load_recipe(trial)
        except RecipeError as exc:
            issues = [_relocate(i, trial, imported.provenance) for i in exc.issues]
            raise RecipeError(str(imported.source), issues) from None

    write_atomic(dest, to_recipe_text(imported), check=loads)
    return dest


def destination(imported: Imported, dest: Path, overwrite: bool) -> Path:
    """The file `write_imported` writes (a folder gets the source's file name), checked: a
    .yaml name, not a symbolic link, not the NeMo RL config or a parent of it, and not an
    existing file unless `overwrite`."""
    if dest.is_dir():  # a folder (or a link to one) the user named: the file goes in it
        dest = dest / imported.source.name
    refuse_link(dest)
    if dest.suffix not in (".yaml", ".yml"):
        raise UsageError(
            dest, "not a .yaml file name", "end the name in .yaml (its runs are named after it)"
        )
    resolved = dest.resolve()
    if resolved in {Path(f).resolve() for f in (imported.source, *imported.files)}:
        what = "being imported" if resolved == imported.source else "a parent of the one imported"
        raise UsageError(
            dest,
            f"is the NeMo RL config {what}; nothing was written",
            f"give another FILE.yaml (e.g. {imported.source.stem}-recipe.yaml)",
        )
    if dest.exists() and not overwrite:
        raise RecipeError(
            str(dest),
            [Problem("<file>", "already exists", "pass --overwrite or another FILE", str(dest))],
        )
    return dest


def _relocate(issue: Problem, dest: Path, prov: dict[str, str]) -> Problem:
    """An issue found in the written file, located where its key came from instead."""
    if issue.file not in (str(dest), str(dest.resolve())):
        return issue
    source = source_of(prov, issue.key)
    shown = "the project's base config" if source == "base" else source
    return Problem(issue.key, issue.what, issue.fix, shown)


def load_recipe_or_import(
    ref: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    run_dir: Path | None = None,
    announce: bool = True,
) -> Recipe:
    """`load_recipe`, except that a NeMo RL GRPO config is imported first (no overlays), as
    `nemo_fp8_rl.recipes import` would write it, so `train --recipe` takes NeMo RL's files
    (`announce`: say so on stderr, once per command)."""
    try:
        return load_recipe(ref, overrides, run_dir=run_dir)
    except RecipeError:
        path = Path(ref)
        if not (path.is_file() and is_nemo_rl_config(path)):
            raise
    with temporary_folder("import") as folder:
        dest = write_imported(import_nemo_config(path), folder / path.name)
        if announce:
            print(
                f"# {path} is a NeMo RL config: imported as a recipe (as `nemo_fp8_rl.recipes "
                f"import {path} FILE.yaml` writes it, to keep a copy to edit)",
                file=sys.stderr,
            )
        try:
            recipe = load_recipe(dest, overrides, run_dir=run_dir)
        except RecipeError as exc:  # named at the user's file, not the temporary copy
            raise RecipeError(str(path), [_at_source(p, dest, path) for p in exc.issues]) from None
    # The temporary copy is gone: keys set by it are named at the NeMo RL file they came from.
    prov = {k: v.replace(str(dest), str(path)) for k, v in recipe.provenance.items()}
    return dataclasses.replace(recipe, path=path, provenance=prov, ref=str(ref))


def _at_source(problem: Problem, copy: Path, source: Path) -> Problem:
    """`problem` with the temporary imported copy's path replaced by the user's file."""
    if problem.file and str(copy) in problem.file:
        return dataclasses.replace(problem, file=problem.file.replace(str(copy), str(source)))
    return problem
