"""`nemo_fp8_rl.recipes list | show R [--sources] | validate [R ...]`."""

from __future__ import annotations

import sys
import time

from nemo_fp8_rl.cli.common import ArgumentParser, run_main
from nemo_fp8_rl.config import RecipeError, find_recipes, load_recipe, short_name


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
    where = (
        "cpu"
        if cluster["gpus_per_node"] == 0
        else f"{cluster['num_nodes']}n{cluster['gpus_per_node']}g"
    )
    calib = "on" if cfg["loss_fn"]["calibration"]["enabled"] else "off"
    return (short_name(ref), cfg["policy"]["model_name"], where, train, rollout, calib)


def cmd_list() -> int:
    """The table of valid recipes; an invalid one is named on stderr (exit code 1), not fatal."""
    rows = [("recipe", "model", "cluster", "training", "rollout", "calibration")]
    invalid = []
    for path in find_recipes():
        try:
            rows.append(_summary(path))
        except RecipeError as exc:
            invalid.append((path, exc))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for path, exc in invalid:
        first = f"{exc.issues[0].key}: {exc.issues[0].problem}" if exc.issues else exc
        print(
            f"error: {path}: invalid recipe, left out of the list ({first}). Fix: run "
            f"`nemo_fp8_rl.recipes validate {path}` for every problem, or move the file out of "
            "recipes/",
            file=sys.stderr,
        )
    return 1 if invalid else 0


def cmd_validate(refs: list[str]) -> int:
    start = time.perf_counter()
    paths = refs or find_recipes()
    failed = 0
    for ref in paths:
        try:
            load_recipe(ref)
            print(f"ok    {short_name(ref) if not isinstance(ref, str) else ref}")
        except RecipeError as exc:
            failed += 1
            print(f"FAIL  {exc}")
    print(f"{len(paths) - failed} valid, {failed} invalid ({time.perf_counter() - start:.2f} s)")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="nemo_fp8_rl.recipes", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every recipe with model, cluster, precision and calibration")
    show = sub.add_parser("show", help="print the resolved recipe as YAML")
    show.add_argument("recipe")
    show.add_argument(
        "--sources", action="store_true", help="annotate each key with the file that set it"
    )
    show.add_argument("overrides", nargs="*", metavar="key=value")
    val = sub.add_parser("validate", help="validate recipes (all when none given)")
    val.add_argument("recipes", nargs="*")
    args, extra = parser.parse_known_args(argv)
    if args.cmd == "show":
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "list":
        return cmd_list()
    if args.cmd == "show":
        sys.stdout.write(
            load_recipe(args.recipe, args.overrides).to_yaml(with_sources=args.sources)
        )
        return 0
    return cmd_validate(args.recipes)


entry = run_main(main)

if __name__ == "__main__":
    entry()
