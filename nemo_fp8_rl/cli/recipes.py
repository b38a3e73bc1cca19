"""`nemo_fp8_rl.recipes list | show | validate | cp | import`: the recipes, as tables, YAML or
copies, and NeMo RL configs made into recipes."""

from __future__ import annotations

import fnmatch
import json
import shlex
import sys
import time
from pathlib import Path

from nemo_fp8_rl.cli.common import ArgumentParser, run_main
from nemo_fp8_rl.config import RecipeError, find_recipes, load_recipe, resolve_ref, short_name
from nemo_fp8_rl.config.commands import command
from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.config.user_error import UsageError

DESCRIPTION = """\
The recipes under recipes/: list them, show one resolved, validate them, or copy one to edit.

commands:
  list (ls) [PATTERN] [--json]    every recipe (or those whose name matches PATTERN) with model,
                                  cluster, precision and calibration
  show R [--sources] [key=value]  the resolved recipe as YAML (--sources: the file that set each key);
                                  a recipe for one GPU family names its sibling for the other
  show R --memory [--gpu T]       the per-GPU memory estimate, trainer and vLLM, on H100, H200,
                                  B200 and GB200 (or the workers' type T)
  validate [R ...]                load and check recipes (all when none is given)
  cp R FILE.yaml [--overwrite]    copy a recipe to edit it: the whole configuration, every key with
     [--defaults]                 the file that set it (--defaults: the recipe's own lines over its
                                  defaults:, as names that load from any folder)
  import NEMO.yaml [FILE.yaml]    a NeMo RL GRPO config as a recipe, every key kept; --fp8 adds
     [--fp8 [R]] [--calibrated]   FP8, --calibrated calibrated clipping; key=value overrides
     [key=value ...]              apply last (see: nemo_fp8_rl.recipes import --help)"""
COLUMNS = ("recipe", "model", "cluster", "training", "rollout", "calibration")


def _summary(ref) -> tuple[str, ...]:
    cfg = load_recipe(ref).config
    mcore, vllm = cfg["policy"]["megatron_cfg"], cfg["policy"]["generation"]["vllm_cfg"]
    train = (
        f"fp8 {mcore['fp8_cfg']['fp8_recipe']}"
        if mcore["fp8_cfg"]["enabled"]
        else cfg["policy"]["precision"]
    )
    rollout = vllm["precision"] + (" +kv fp8" if vllm["kv_cache_dtype"] != "auto" else "")
    cluster = cfg["cluster"]
    where = "cpu" if on_cpu(cfg) else f"{cluster['num_nodes']}n{cluster['gpus_per_node']}g"
    calib = "on" if cfg["loss_fn"]["calibration"]["enabled"] else "off"
    return (short_name(ref), cfg["policy"]["model_name"], where, train, rollout, calib)


def matches(name: str, pattern: str | None) -> bool:
    """A shell-style pattern (`tiny/*fp8*`) matches the whole name; plain text, any part of it."""
    if pattern is None:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def cmd_list(pattern: str | None = None, as_json: bool = False) -> int:
    """The valid recipes as a table (or a JSON list); an invalid one is named on stderr (exit
    code 1), not fatal. A pattern that matches no recipe is a usage error."""
    paths = [p for p in find_recipes() if matches(short_name(p), pattern)]
    if not paths:
        raise UsageError(
            "recipes list",
            f"no recipe matches {pattern!r}",
            "run nemo_fp8_rl.recipes list for every name",
        )
    rows, invalid = [], []
    for path in paths:
        try:
            rows.append((path, _summary(path)))
        except RecipeError as exc:
            invalid.append((path, exc))
    if as_json:
        records = [
            {
                "name": row[0],
                "path": str(path.resolve()),
                **dict(zip(COLUMNS[1:], row[1:], strict=True)),
            }
            for path, row in rows
        ]
        print(json.dumps(records, indent=2))
    else:
        _print_table([COLUMNS, *(row for _, row in rows)])
    for path, exc in invalid:
        first = f"{exc.issues[0].key}: {exc.issues[0].what}" if exc.issues else exc
        left_out = UsageError(
            str(path),
            f"invalid recipe, left out of the list ({first})",
            f"run `nemo_fp8_rl.recipes validate {path}` for every problem, or move the file out "
            "of recipes/",
        )
        print(f"error: {left_out}", file=sys.stderr)
    return 1 if invalid else 0


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_validate(refs: list[str]) -> int:
    """Load and check each recipe (every recipe when none is named); an invalid one is a
    configuration error (exit code 2), as the exit-code table says."""
    start = time.perf_counter()
    paths = refs or find_recipes()
    failed = 0
    for ref in paths:
        try:
            load_recipe(resolve_ref(ref, where="recipes validate"))
            print(f"ok    {short_name(ref) if not isinstance(ref, str) else ref}")
        except RecipeError as exc:
            failed += 1
            print(f"FAIL  {exc}")
    print(f"{len(paths) - failed} valid, {failed} invalid ({time.perf_counter() - start:.2f} s)")
    if failed:
        raise UsageError(
            "recipes validate",
            f"{failed} of {len(paths)} recipe(s) invalid, each listed above with its problems",
            "fix each problem where its line says (file and key)",
        )
    return 0


def cmd_show(ref: str, overrides: list[str], sources: bool, memory: bool, gpu: str | None) -> int:
    """The resolved recipe (with its other-GPU-family sibling named), or its memory estimate."""
    from nemo_fp8_rl.guards.siblings import sibling_line

    recipe = load_recipe(ref, overrides)
    if memory:
        return _show_memory(recipe, gpu)
    if gpu:
        raise UsageError("--gpu", "goes with --memory", "add --memory, or drop --gpu")
    line = sibling_line(recipe.path, recipe.config)
    sys.stdout.write((f"{line}\n" if line else "") + recipe.to_yaml(with_sources=sources))
    return 0


def _show_memory(recipe, gpu: str | None) -> int:
    from nemo_fp8_rl.config.gpus import MEMORY_TYPES, find_gpu, unknown_gpu_fix
    from nemo_fp8_rl.engines.nemo.driver.guard_rails import model_config
    from nemo_fp8_rl.guards.memory import breakdown

    if recipe.on_cpu:
        raise UsageError(
            recipe.name, "a CPU recipe has no GPU memory estimate", "name a GPU recipe"
        )
    if gpu and find_gpu(gpu) is None:
        raise UsageError("--gpu", f"unknown GPU type {gpu!r}", unknown_gpu_fix(gpu))
    model = recipe.config["policy"]["model_name"]
    hf = model_config(model)
    if hf is None:
        raise UsageError(
            "policy.model_name",
            f"no config.json for {model} here (shipped, a local folder, or the HF cache)",
            "download the model's config.json into the Hugging Face cache, or point "
            "policy.model_name at a folder holding it",
        )
    gpus, other = _runs_on(recipe, [find_gpu(gpu).name] if gpu else list(MEMORY_TYPES))
    print(f"memory estimate of {recipe.name} per GPU:")
    if gpus:
        print(breakdown(recipe.config, hf, gpus))
    print("\n".join(other))
    return 0


def _runs_on(recipe, names: list[str]) -> tuple[list[str], list[str]]:
    """Of the GPU types `names`, those the recipe runs on, and a line for each it does not (a
    recipe for one GPU family is refused on the other, whatever its memory: `guards.siblings`)."""
    from nemo_fp8_rl.config.gpus import find_gpu
    from nemo_fp8_rl.guards.siblings import FAMILY_NAMES, family_of, sibling_line

    family = family_of(recipe.config)
    if family is None:
        return names, []
    keep = [n for n in names if find_gpu(n).family == family]
    sibling = (sibling_line(Path(recipe.path), recipe.config) or "").partition("; ")[2]
    lines = [
        f"  {n}: not estimated: {recipe.name} runs on {FAMILY_NAMES[family]} GPUs only, so it "
        f"does not run on a {n} whatever its memory; {sibling}"
        for n in names
        if n not in keep
    ]
    return keep, lines


def cmd_cp(recipe: str, dest: Path, overwrite: bool, full: bool = False) -> int:
    from nemo_fp8_rl.config.recipe_copy import copy_recipe

    path = copy_recipe(recipe, dest, overwrite=overwrite, full=full)
    what = "the full configuration" if full else "a copy"
    print(f"wrote {path}: {what} of {recipe} to edit; train it with")
    print(f"  {command('train')} --recipe {shlex.quote(str(path))}")
    return 0


def cmd_import(
    source: Path,
    dest: Path | None,
    fp8: str | None,
    calibrated: bool,
    overwrite: bool,
    overrides: list[str] = (),
) -> int:
    """Write NeMo RL's config `source` as a recipe (validated), with `overrides` applied last,
    and say how to train it."""
    from nemo_fp8_rl.config.nemo_import import import_nemo_config, write_imported

    if not source.is_file():
        raise UsageError(
            "recipes import", f"{source}: no such file", "give the path of a NeMo RL config"
        )
    imported = import_nemo_config(source, fp8, calibrated, overrides)
    if dest is None:
        suffix = (f"-fp8-{fp8}" if fp8 else "") + ("-calibrated" if calibrated else "")
        dest = Path(f"{source.stem}{suffix}.yaml")
    path = write_imported(imported, dest, overwrite=overwrite)
    extras = f" with {', '.join(imported.overlays)}" if imported.overlays else ""
    print(
        f"wrote {path}: {source}{extras}; {len(imported.filled)} keys it leaves out "
        "filled from the project's base config"
    )
    for key, value in imported.derived.items():
        print(f"  {key}: NeMo RL's {value!r} derives from the run here (--run-dir DIR moves it)")
    print(f"train it with\n  {command('train')} --recipe {shlex.quote(str(path))}")
    return 0


def _add_import(sub) -> None:
    imp = sub.add_parser(
        "import",
        help="a NeMo RL GRPO config as a recipe (keys kept, project sections filled)",
        examples=[
            "nemo_fp8_rl.recipes import examples/configs/grpo_math_1B_megatron.yaml my.yaml "
            "--fp8 --calibrated"
        ],
    )
    imp.add_argument("source", type=Path, metavar="NEMO.yaml", help="a NeMo RL GRPO config")
    imp.add_argument(
        "dest",
        type=Path,
        nargs="?",
        metavar="FILE.yaml",
        help="the recipe to write (default: NEMO[-fp8-R][-calibrated].yaml here)",
    )
    imp.add_argument(
        "--fp8",
        nargs="?",
        const="blockwise",
        choices=("blockwise", "tensorwise", "mxfp8"),
        help="add FP8 training and rollout (configs/precision/fp8-R.yaml; default blockwise)",
    )
    imp.add_argument(
        "--calibrated",
        action="store_true",
        help="add calibrated clipping (configs/loss/calibrated-clipping.yaml)",
    )
    imp.add_argument("--overwrite", action="store_true", help="replace an existing file")
    imp.add_argument(
        "overrides",
        nargs="*",
        default=[],
        metavar="key=value",
        help="overrides applied last, as train takes them (e.g. "
        "policy.train_global_batch_size=128: several optimiser steps per rollout batch, which "
        "--calibrated needs)",
    )


def _import_args(args) -> tuple[Path | None, list[str]]:
    """(the recipe to write, the overrides): a first `key=value` is an override, not a file."""
    overrides = [*args.overrides]
    dest = args.dest
    if dest is not None and "=" in str(dest) and not str(dest).endswith((".yaml", ".yml")):
        overrides.insert(0, str(dest))
        dest = None
    return dest, overrides


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nemo_fp8_rl.recipes",
        usage="%(prog)s {list,show,validate,cp,import} ...",
        description=DESCRIPTION,
        examples=["nemo_fp8_rl.recipes cp tiny/grpo-tiny-qwen3-cpu-fp8 my-fp8.yaml"],
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{list,show,validate,cp,import}")
    listing = sub.add_parser(
        "list",
        aliases=["ls"],
        help="every recipe with model, cluster, precision and calibration",
        examples=["nemo_fp8_rl.recipes list --json 'tiny/*fp8*'"],
    )
    listing.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help="only recipes whose name contains this text, or matches this shell pattern (*, ?)",
    )
    listing.add_argument("--json", action="store_true", help="a JSON list instead of the table")
    show = sub.add_parser(
        "show",
        help="print the resolved recipe as YAML",
        examples=["nemo_fp8_rl.recipes show tiny/grpo-tiny-qwen3-cpu-fp8 --sources"],
    )
    show.add_argument("recipe", help="recipe path or short name")
    show.add_argument(
        "--sources", action="store_true", help="annotate each key with the file that set it"
    )
    show.add_argument(
        "--memory",
        action="store_true",
        help="the per-GPU memory estimate (trainer and vLLM) instead of the YAML",
    )
    show.add_argument("--gpu", metavar="TYPE", help="with --memory: only this GPU type")
    show.add_argument(
        "overrides",
        nargs="*",
        default=[],
        metavar="key=value|~key",
        help="overrides: dotted.key=value sets a key, ~dotted.key deletes one",
    )
    val = sub.add_parser(
        "validate",
        help="validate recipes (all when none given)",
        examples=["nemo_fp8_rl.recipes validate my-fp8.yaml"],
    )
    val.add_argument("recipes", nargs="*", metavar="R", help="recipe paths or short names")
    cp = sub.add_parser(
        "cp",
        help="copy a recipe to edit it (loads from any folder)",
        examples=["nemo_fp8_rl.recipes cp tiny/grpo-tiny-qwen3-cpu-fp8 my-fp8.yaml"],
    )
    cp.add_argument("recipe", help="recipe path or short name")
    cp.add_argument("dest", type=Path, metavar="FILE.yaml", help="the copy (or a folder for it)")
    cp.add_argument("--overwrite", action="store_true", help="replace an existing file")
    shape = cp.add_mutually_exclusive_group()
    shape.add_argument(
        "--full",
        action="store_true",
        help="write every key of the resolved recipe, each with the file that set it (the default)",
    )
    shape.add_argument(
        "--defaults",
        action="store_true",
        help="write the recipe's own lines over its defaults: instead (the copy then follows "
        "later fixes of the configs it builds on)",
    )
    _add_import(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.cmd in ("show", "import"):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd in ("list", "ls"):
        return cmd_list(args.pattern, args.json)
    if args.cmd == "show":
        return cmd_show(args.recipe, args.overrides, args.sources, args.memory, args.gpu)
    if args.cmd == "cp":
        return cmd_cp(args.recipe, args.dest, args.overwrite, full=not args.defaults)
    if args.cmd == "import":
        dest, overrides = _import_args(args)
        return cmd_import(args.source, dest, args.fp8, args.calibrated, args.overwrite, overrides)
    return cmd_validate(args.recipes)


entry = run_main(main)

if __name__ == "__main__":
    entry()
