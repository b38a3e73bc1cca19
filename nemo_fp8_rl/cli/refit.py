"""`nemo_fp8_rl.refit export SRC OUT [--recipe R] [options] [key=value ...]`.

Converts a BF16 Hugging Face checkpoint directory into the generation engine's FP8 layout
(safetensors + `quantization_config`), exactly as the refit bridge sends it. The scheme comes
from the recipe's NeMo RL keys (`policy.generation.vllm_cfg.*`); without a recipe, block FP8;
flags override either.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_fp8_rl.cli.common import ArgumentParser, run_main
from nemo_fp8_rl.cli.refit_source import HF, classify
from nemo_fp8_rl.config.safe_files import located_disk_full
from nemo_fp8_rl.config.temp_files import sibling_prefix, sweep_siblings
from nemo_fp8_rl.config.user_error import UsageError, UserError

DESCRIPTION = """\
export: convert a BF16 Hugging Face checkpoint folder into the generation engine's FP8 layout
(safetensors plus quantization_config), exactly as the refit bridge sends it to vLLM. The
scheme comes from a recipe's policy.generation.vllm_cfg keys (--recipe); without one, 128x128
block FP8; the flags override either. The export is built beside OUT and swapped in only when
complete and verified."""
EXAMPLES = ["nemo_fp8_rl.refit export ~/models/Qwen3-8B-Base qwen3-8b-fp8 --scheme block"]
_QUANT = {"block": "fp8_per_block", "tensor": "fp8_per_tensor", "channel": "compressed-tensors"}


def _base_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.recipe:
        from nemo_fp8_rl.config import load_recipe

        config = load_recipe(args.recipe, args.overrides).config
    elif args.overrides:
        raise UsageError(
            " ".join(args.overrides), "key=value overrides need --recipe", "add --recipe R"
        )
    else:
        config = {}
    generation = config.setdefault("policy", {}).setdefault("generation", {})
    vllm = generation.setdefault("vllm_cfg", {})
    if not args.recipe:
        vllm["precision"] = "fp8"
    if args.scheme:
        vllm["precision"] = "fp8"
        generation.setdefault("vllm_kwargs", {})
        generation["vllm_kwargs"] = {
            **(generation["vllm_kwargs"] or {}),
            "quantization": _QUANT[args.scheme],
        }
    if args.pow2:
        vllm["pow2_weight_scaling_factors"] = True
    if args.first_bf16 is not None:
        vllm["num_first_layers_in_bf16"] = args.first_bf16
    if args.last_bf16 is not None:
        vllm["num_last_layers_in_bf16"] = args.last_bf16
    if args.ignore:
        vllm["quantization_ignored_layer_kws"] = list(args.ignore)
    return config


@contextlib.contextmanager
def _hf_source(kind: str, src: Path, out: Path) -> Iterator[Path]:
    """The Hugging Face folder to convert: `src` itself, or for a trained checkpoint of the
    embedded engine a BF16 folder of its weights, written beside `out` and removed after."""
    if kind == HF:
        yield src
        return
    from nemo_fp8_rl.engines.local.hf_export import write_hf_folder

    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_siblings(out, "trained")  # what a killed export (SIGKILL) left
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=sibling_prefix(out, "trained")))
    kept = "the earlier export is kept" if out.exists() else "nothing was written"
    try:
        print(f"exporting the trained weights of {src}")
        with located_disk_full(out, kept):  # the BF16 folder is written beside `out`
            hf = write_hf_folder(src, tmp / "hf")
        yield hf
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # ours: made by mkdtemp above


def cmd_export(args: argparse.Namespace) -> int:
    """Convert `args.src` into `args.out`; print what was written. The source and the recipe
    are checked before torch and the refit bridge are imported (a wrong path fails at once)."""
    start = time.perf_counter()
    kind, src = classify(Path(args.src))
    config = _base_config(args)
    from nemo_fp8_rl.refit.export import convert_checkpoint

    try:
        with _hf_source(kind, src, Path(args.out)) as hf:
            plan = convert_checkpoint(hf, args.out, config, shard_bytes=args.shard_size_mb * 2**20)
    except UserError:
        raise
    except (FileNotFoundError, ValueError) as exc:  # a file of the source missing or unreadable
        raise UsageError(
            str(getattr(exc, "filename", None) or args.src),
            str(exc),
            "pass a Hugging Face checkpoint folder (config.json and *.safetensors) or a run",
        ) from exc
    print(
        f"wrote {args.out}: scheme {plan.scheme} ({plan.scale} scales), {len(plan.fp8_names)} FP8 "
        f"weights, {len(plan.bf16_names)} BF16 tensors, {len(plan.ignored_layers)} ignored layers "
        f"({time.perf_counter() - start:.1f} s)"
    )
    print("next:")
    print(
        f"  vllm serve {shlex.quote(str(args.out))}   # in vLLM's environment, on a GPU: vLLM reads "
        "its quantization_config (NeMo RL's generation loads the same layout)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run the subcommand; returns the exit code."""
    parser = ArgumentParser(
        prog="nemo_fp8_rl.refit",
        usage="%(prog)s export SRC OUT [--recipe R] [options] [key=value|~key ...]",
        description=DESCRIPTION,
        examples=EXAMPLES,
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="export")
    exp = sub.add_parser(
        "export",
        help="convert a BF16 HF checkpoint to the engine's FP8 layout",
        description=DESCRIPTION,
        examples=EXAMPLES,
    )
    exp.add_argument(
        "src",
        help="BF16 Hugging Face checkpoint directory (config.json + safetensors), or a "
        "checkpoint of the embedded engine (runs/<name>/checkpoints/step_N) or its run folder",
    )
    exp.add_argument("out", help="output directory")
    exp.add_argument("--recipe", help="take the scheme from this recipe's vllm_cfg keys")
    exp.add_argument(
        "--scheme", choices=sorted(_QUANT), help="block 128x128, per-tensor, per-channel"
    )
    exp.add_argument("--pow2", action="store_true", help="power-of-2 scales")
    exp.add_argument("--first-bf16", type=int, help="num_first_layers_in_bf16")
    exp.add_argument("--last-bf16", type=int, help="num_last_layers_in_bf16")
    exp.add_argument("--ignore", nargs="+", metavar="KW", help="quantization_ignored_layer_kws")
    exp.add_argument("--shard-size-mb", type=int, default=4096, help="max safetensors shard size")
    exp.add_argument(
        "overrides",
        nargs="*",
        default=[],
        metavar="key=value|~key",
        help="recipe overrides (with --recipe)",
    )
    if list(sys.argv[1:] if argv is None else argv) in (["-h"], ["--help"]):
        # one subcommand: its flags belong in the command's help too (`refit export --help`)
        head, _, tail = parser.format_help().partition("\noptions:\n")
        own = exp.format_help().split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
        own = "\n".join(line for line in own.splitlines() if not line.startswith("  -h, "))
        print(f"{head}\nexport options:\n{own}\n\noptions:\n{tail}", end="")
        return 0
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if ("=" not in a and not a.startswith("~")) or a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*args.overrides, *extra]
    if args.shard_size_mb < 1:
        parser.error("--shard-size-mb must be >= 1")
    return cmd_export(args)


entry = run_main(main)

if __name__ == "__main__":
    entry()
