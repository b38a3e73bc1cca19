"""What README's two Setup commands cost on a fresh clone: wall time, the machine's load, disk.

    uv run python benchmarks/bench_setup.py run CLONE --label quiet   # measure; writes
                                                                      # benchmarks/setup/quiet.json
    uv run python benchmarks/bench_setup.py table [--write README.md] # README's setup-cost block

`run` takes a fresh clone (`git clone -b <branch> <repo> CLONE`, no `.venv`) and runs, in it, the
two commands exactly as README gives them: `uv run nemo_fp8_rl.train --recipe
recipes/tiny/grpo-tiny-qwen3-cpu-fp8.yaml` (which first creates `.venv` from `uv.lock`), then
`uv run pytest`. For each it records the wall time and the 1-minute load average sampled every
5 s while it ran (mean and maximum), and for the whole the size of `.venv` (`du -sk`), of its
CUDA-only part (`nvidia/` and `triton/` under site-packages), whether uv downloaded anything
while creating it (its own output says; the growth of uv's shared cache is recorded too, but
other work on the machine moves it) and pytest's summary line. `--label` names the condition (quiet or loaded: the load
comes from whatever else the machine runs, and the JSON records it). `table` renders every saved
measurement as the README block; `tests/test_docs_generated.py` regenerates it and compares.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from nemo_fp8_rl.config.safe_files import open_nofollow, write_atomic

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "setup"
BEGIN, END = "<!-- setup-cost:begin -->", "<!-- setup-cost:end -->"
COMMANDS = (  # exactly as README gives them (without a terminal the run prints plain lines)
    ("train", ["uv", "run", "nemo_fp8_rl.train", "--recipe",
               "recipes/tiny/grpo-tiny-qwen3-cpu-fp8.yaml"]),
    ("pytest", ["uv", "run", "pytest"]),
)  # fmt: skip


def _open_log(path: Path):
    """`path` truncated for writing, never through a link (`safe_files.open_nofollow`)."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    return os.fdopen(fd, "w")  # safe-write: fd


def _kib(path: Path) -> int:
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else 0


def _uv_cache() -> Path:
    done = subprocess.run(["uv", "cache", "dir"], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


class LoadSampler:
    """The 1-minute load average every `period` seconds while a command runs."""

    def __init__(self, period: float = 5.0) -> None:
        self.period, self.samples = period, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def run_command(clone: Path, argv: list[str], log: Path) -> dict:
    """Run `argv` in `clone`; its wall time, exit code, load samples and last output line."""
    start = time.perf_counter()
    with LoadSampler() as load, _open_log(log) as out:
        done = subprocess.run(argv, cwd=clone, stdout=out, stderr=subprocess.STDOUT, check=False)
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return {
        "argv": argv,
        "returncode": done.returncode,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "load_mean": round(sum(load.samples) / len(load.samples), 2),
        "load_max": round(max(load.samples), 2),
        "last_line": lines[-1] if lines else "",
    }


def uv_report(log: str) -> dict:
    """What uv said while creating `.venv` (the first command's first lines): whether it
    downloaded anything, and its "Installed N packages in T" line."""
    lines = [x.strip() for x in log.splitlines()]
    installed = next((x for x in lines if x.startswith("Installed ") and " packages in " in x), "")
    return {"downloaded": any(x.startswith(("Downloading", "Downloaded")) for x in lines),
            "uv_installed": installed}  # fmt: skip


def measure(clone: Path, label: str) -> dict:
    """Both Setup commands on the fresh clone `clone` (refused if it already has a `.venv`)."""
    if (clone / ".venv").exists():
        raise SystemExit(f"error: {clone}/.venv exists. Fix: measure a fresh clone")
    cache = _uv_cache()
    cache_before = _kib(cache)
    record: dict = {"label": label, "cpus": os.cpu_count(), "platform": platform.platform()}
    record["commit"] = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"],
                                      capture_output=True, text=True).stdout.strip()  # fmt: skip
    logs = clone / ".setup-logs"  # the commands' output, kept with the clone
    logs.mkdir(parents=True, exist_ok=True)
    for name, argv in COMMANDS:
        record[name] = run_command(clone, argv, logs / f"{label}-{name}.log")
        print(f"{name}: {record[name]}", flush=True)
    record.update(uv_report((logs / f"{label}-train.log").read_text(errors="replace")))
    venv = clone / ".venv"
    site = next(venv.glob("lib/python*/site-packages"), venv)
    record["venv_kib"] = _kib(venv)
    record["venv_cuda_kib"] = sum(
        _kib(site / d) for d in ("nvidia", "triton") if (site / d).exists()
    )
    record["uv_cache_grew_kib"] = max(0, _kib(cache) - cache_before)
    return record


def _gb(kib: int) -> str:
    return f"{kib / 2**20:.1f} GB"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60))} s"


def _counts(line: str) -> str:
    found = re.findall(r"(\d+) (passed|skipped|failed|errors?)", line)
    return ", ".join(f"{n} {what}" for n, what in found) or line


def table(saved: list[Path]) -> str:
    """README's block: disk, then one line per saved measurement (condition, times, load)."""
    records = [json.loads(p.read_text()) for p in saved]
    if not records:
        return ""
    first = records[0]
    lines = [
        f"The first `uv run` creates `.venv` from `uv.lock`: {_gb(first['venv_kib'])} (`du -sk .venv`), "
        f"{_gb(first['venv_cuda_kib'])} of it PyPI torch's CUDA libraries (`nvidia/`, `triton/`, used "
        "only on a GPU); a first install also downloads them (`uv sync --no-dev` leaves out the test "
        "tools, megatron-core, wandb and mlflow). The first command trains 150 steps into "
        "`runs/grpo-tiny-qwen3-cpu-fp8/`; the second runs the suite, the GPU, vLLM, Slurm and NeMo RL "
        "tests skipped with their reasons. Measured on a fresh clone "
        f"(`benchmarks/bench_setup.py`, {first['cpus']} CPUs, uv's package cache already filled):",
        "",
    ]
    for r in records:
        download = "with a download" if r.get("downloaded") else "no download"
        if r.get("uv_installed"):
            download += f"; uv: {r['uv_installed']}"
        lines.append(
            f"- {r['label']} (1-minute load average {r['train']['load_mean']:.1f} and "
            f"{r['pytest']['load_mean']:.1f} on average, at most {max(r['train']['load_max'], r['pytest']['load_max']):.1f}; "
            f"{download}): the first command {_minutes(r['train']['wall_seconds'])} wall, creating "
            f"`.venv` included; the second {_minutes(r['pytest']['wall_seconds'])} "
            f"({_counts(r['pytest']['last_line'])} at commit {r['commit'][:7]})."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["run", "table"])
    ap.add_argument("clone", nargs="?", type=Path, help="a fresh clone (run)")
    ap.add_argument("--label", default="measured", help="the condition: quiet or loaded")
    ap.add_argument("--write", type=Path, help="table: replace the block in this file (README.md)")
    args = ap.parse_args(argv)
    if args.what == "table":
        block = table(sorted(SAVED.glob("*.json")))
        if args.write is None:
            print(block)
            return 0
        text = args.write.read_text(encoding="utf-8")
        if text.count(BEGIN) != 1 or text.count(END) != 1:
            raise SystemExit(f"error: {args.write}: needs one {BEGIN} and one {END}")
        head, rest = text.split(BEGIN)
        write_atomic(args.write, f"{head}{BEGIN}\n{block}\n{END}{rest.split(END)[1]}")
        return 0
    if args.clone is None:
        ap.error("run needs the fresh clone's folder")
    record = measure(args.clone.resolve(), args.label)
    SAVED.mkdir(parents=True, exist_ok=True)
    path = SAVED / f"{args.label}.json"
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0 if all(record[n]["returncode"] == 0 for n, _ in COMMANDS) else 1


if __name__ == "__main__":
    sys.exit(main())
