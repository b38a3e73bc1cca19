"""Seeds as an axis: one recipe trained over several seeds, each in its own run directory.

Layout (`docs/architecture.md`, "Run directory layout"): the seeds of one recipe live side by
side under the recipe's run directory,

    runs/<recipe name>/seed-<k>/     one complete run directory per seed (recipe.yaml, metrics...)
    runs/<recipe name>/seeds.json    outcome of the last multi-seed launch (seed, exit code, time)

so `nemo_fp8_rl.compare runs/<a> runs/<b>` finds each recipe's seeds by folder, and the recipe
name stays the folder name (and `logger.wandb.name` in each seed's `recipe.yaml`). The seed is
set through the normal override path, `grpo.seed=<k>`, which NeMo RL and the embedded engine
both read (model init, sampling, data shuffling).

Each seed trains in a child process (`python -m nemo_fp8_rl.train --recipe R --run-dir
runs/<name>/seed-<k> ... grpo.seed=<k>`), so a seed that crashes, is killed or runs out of memory
never takes the others down. Up to `parallel` children run at once; their output goes to
`<seed dir>/train.log` and, prefixed with `[seed k]`, to the terminal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.numbers import NumberTooLong, parse_int
from nemo_fp8_rl.config.safe_files import open_nofollow, write_atomic
from nemo_fp8_rl.config.user_error import UsageError, shown

SEED_DIR_PREFIX = "seed-"
SEED_KEY = "grpo.seed"
SUMMARY_NAME = "seeds.json"
# The most seeds one launch (or Slurm job array) takes: each seed is a full training run, and a
# typo such as 1-100000 must fail at once instead of planning 100,000 runs.
MAX_SEEDS = 1000
_ITEM = re.compile(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?")


class SeedSpecError(UsageError, ValueError):
    """A `--seeds` value that does not parse; the message shows the accepted forms."""


def parse_seeds(text: str) -> list[int]:
    """`"1,2,3"`, `"1-5"` or a mix (`"1-3,7"`) -> sorted unique seeds (ranges inclusive).

    Raises:
        SeedSpecError: an empty item, a reversed range, a negative seed, more than `MAX_SEEDS`
            seeds, or anything else.
    """
    seeds: set[int] = set()
    for item in str(text).split(","):
        match = _ITEM.fullmatch(item)
        if not match:
            raise SeedSpecError(
                f"--seeds {text!r}",
                f"{item.strip()!r} is not a seed or a range",
                "give seeds "
                "as a comma-separated list and/or inclusive ranges, e.g. 1,2,3 or 1-5 or 1-3,7",
            )
        try:
            low = parse_int(match.group(1))
            high = parse_int(match.group(2)) if match.group(2) is not None else low
        except NumberTooLong as exc:
            raise SeedSpecError(
                f"--seeds {shown(text)!r}", str(exc), "give seeds below 2**32, e.g. 1-5"
            ) from exc
        if low < 0 or high < low:
            raise SeedSpecError(
                f"--seeds {text!r}",
                f"{item.strip()!r} is not a range of non-negative seeds (low-high, low <= high)",
                "e.g. 1-5",
            )
        if high - low + 1 + len(seeds) > MAX_SEEDS:
            raise SeedSpecError(
                f"--seeds {text!r}",
                f"more than {MAX_SEEDS} seeds in one launch "
                f"({item.strip()!r} alone is {high - low + 1})",
                f"give at most {MAX_SEEDS} seeds, e.g. 1-10, and launch further ranges separately",
            )
        seeds.update(range(low, high + 1))
    return sorted(seeds)


def seed_run_dir(group_dir: Path, seed: int) -> Path:
    """The run directory of one seed: `<group_dir>/seed-<seed>`."""
    return Path(group_dir) / f"{SEED_DIR_PREFIX}{seed}"


def seed_of_dir(path: Path) -> int | None:
    """The seed of a `seed-<k>` folder, or None for any other name."""
    name = Path(path).name
    rest = name.removeprefix(SEED_DIR_PREFIX)
    return int(rest) if name.startswith(SEED_DIR_PREFIX) and rest.isdigit() else None


def seed_dirs(group_dir: Path) -> list[Path]:
    """The `seed-<k>` run directories under `group_dir` that hold metrics, by seed."""
    found = [
        p
        for p in Path(group_dir).glob(f"{SEED_DIR_PREFIX}*")
        if p.is_dir() and seed_of_dir(p) is not None
    ]
    found = [p for p in found if (p / "metrics.jsonl").is_file() or any(p.rglob("events.out.*"))]
    return sorted(found, key=lambda p: seed_of_dir(p) or 0)


def check_overrides(overrides: Sequence[str]) -> None:
    """`--seeds` sets `grpo.seed`; an override of it (`grpo.seed=`, `+grpo.seed=`, `++grpo.seed=`
    or `~grpo.seed`) would contradict it."""
    clash = [o for o in overrides if o.split("=", 1)[0].strip().lstrip("+~") == SEED_KEY]
    if clash:
        raise SeedSpecError(
            "--seeds",
            f"sets {SEED_KEY} for each run, but the overrides also set it ({clash[0]})",
            f"drop the {SEED_KEY} override, or drop --seeds",
        )


@dataclass
class SeedOutcome:
    """How one seed's run ended: exit code (None while running; negative = killed by signal)."""

    seed: int
    run_dir: str
    log: str
    returncode: int | None = None
    wall_s: float = 0.0
    kept: bool = False  # finished by an earlier launch; not run again

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        """`seed 2: FAILED (exit 1) after 12.3 s, log runs/x/seed-2/train.log`."""
        if self.kept:
            return f"seed {self.seed}: ok (finished before, kept), log {self.log}"
        if self.returncode is None:
            state = "NOT RUN"
        elif self.returncode == 0:
            state = "ok"
        elif self.returncode < 0:
            state = f"FAILED (killed by signal {-self.returncode})"
        else:
            state = f"FAILED (exit {self.returncode})"
        return f"seed {self.seed}: {state} after {self.wall_s:.1f} s, log {self.log}"


def seed_overrides(base: Any, seed: int, overrides: Sequence[str]) -> list[str]:
    """`overrides` plus, for each output path set by hand (a NeMo RL config's `log_dir`,
    `checkpoint_dir`), that path's `seed-<k>` subfolder: seeds never share logs or checkpoints."""
    from nemo_fp8_rl.config.recipe import set_by_hand
    from nemo_fp8_rl.config.schema import PATH_KEYS

    out = list(overrides)
    for key in PATH_KEYS:
        if set_by_hand(base, key):
            section, leaf = key.split(".")
            out.append(f"{key}={Path(base.config[section][leaf]) / f'seed-{seed}'}")
    return out


def train_command(
    recipe_path: Path,
    run_dir: Path,
    seed: int,
    overrides: Sequence[str],
    *,
    engine: str = "auto",
    resume: bool = False,
    overwrite: bool = False,
) -> list[str]:
    """The child command that trains one seed (a plain `nemo_fp8_rl.train` invocation)."""
    cmd = [sys.executable, "-m", "nemo_fp8_rl.train", "--recipe", str(recipe_path)]
    cmd += ["--run-dir", str(run_dir), "--engine", engine, "--no-progress"]
    if resume:
        cmd.append("--resume")
    elif overwrite:
        cmd.append("--overwrite")
    return [*cmd, *overrides, f"{SEED_KEY}={seed}"]


def _open_log(path: Path):
    """A seed's log, truncated, opened for writing without following a link."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    return os.fdopen(fd, "w", encoding="utf-8")  # safe-write: fd (open_nofollow)


class _Child:
    """One running seed: the process and a thread copying its output to the log and `echo`."""

    def __init__(self, outcome: SeedOutcome, cmd: list[str], echo: Callable[[str], None]):
        self.outcome = outcome
        self.start = time.monotonic()
        Path(outcome.run_dir).mkdir(parents=True, exist_ok=True)
        self.log = _open_log(Path(outcome.log))  # refused here, before the child starts
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        self.thread = threading.Thread(target=self._pump, args=(echo,), daemon=True)
        self.thread.start()

    def _pump(self, echo: Callable[[str], None]) -> None:
        assert self.proc.stdout is not None
        with self.log as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                echo(f"[seed {self.outcome.seed}] {line.rstrip()}")

    def poll(self) -> bool:
        """True once the process has ended (its outcome is then filled in)."""
        code = self.proc.poll()
        if code is None:
            return False
        self.thread.join(timeout=10)
        self.outcome.returncode = code
        self.outcome.wall_s = time.monotonic() - self.start
        return True

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; records the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.poll()


def run_seeds(
    commands: dict[int, list[str]],
    group_dir: Path,
    *,
    parallel: int = 1,
    echo: Callable[[str], None] = print,
    poll_s: float = 0.2,
    kept: Sequence[int] = (),
) -> list[SeedOutcome]:
    """Run each seed's command (at most `parallel` at a time, in seed order); never stop early.

    Seeds in `kept` finished in an earlier launch: they are recorded as such, not run.

    A seed that fails is recorded and the next one starts. On Ctrl-C or SIGTERM (`kill`,
    `scancel`, `timeout`) the running children are stopped (their seeds recorded as failed, the
    rest as not run) and KeyboardInterrupt is raised after `seeds.json` is written, so no child
    outlives the launcher.
    """
    outcomes = {
        s: SeedOutcome(
            s, str(seed_run_dir(group_dir, s)), str(seed_run_dir(group_dir, s) / "train.log")
        )
        for s in [*commands, *kept]
    }
    for s in kept:
        outcomes[s].returncode, outcomes[s].kept = 0, True
        echo(outcomes[s].describe())
    waiting = sorted(commands)
    running: list[_Child] = []
    previous = raise_on_sigterm()
    try:
        while waiting or running:
            while waiting and len(running) < max(1, parallel):
                seed = waiting.pop(0)
                echo(f"seed {seed}: starting, run dir {outcomes[seed].run_dir}")
                running.append(_Child(outcomes[seed], commands[seed], echo))
            for child in [c for c in running if c.poll()]:
                running.remove(child)
                echo(child.outcome.describe())
            time.sleep(poll_s)
    except KeyboardInterrupt:
        for child in running:
            child.stop()
        write_summary(group_dir, list(outcomes.values()))
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    result = [outcomes[s] for s in sorted(outcomes)]
    write_summary(group_dir, result)
    return result


def raise_on_sigterm():
    """Make SIGTERM raise KeyboardInterrupt (main thread only); returns the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def write_summary(group_dir: Path, outcomes: Sequence[SeedOutcome]) -> Path:
    """`<group_dir>/seeds.json`: one entry per seed (seed, run_dir, log, returncode, wall_s,
    kept). Entries of seeds this launch did not run (an earlier launch's `--seeds 1-3`, now
    `--seeds 2 --resume`) are kept as they were."""
    path = Path(group_dir) / SUMMARY_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = {o.seed for o in outcomes}
    earlier = [e for e in read_summary(group_dir) if e.get("seed") not in mine]
    entries = sorted([*earlier, *(asdict(o) for o in outcomes)], key=lambda e: e["seed"])
    payload = {"seeds": entries, "written_at": time.time()}
    write_atomic(path, json.dumps(payload, indent=1) + "\n")
    return path


def read_summary(group_dir: Path) -> list[dict]:
    """The entries of `<group_dir>/seeds.json` ([] when there is none).

    Raises:
        SummaryError: the file exists but is not a summary this launcher wrote.
    """
    path = Path(group_dir) / SUMMARY_NAME
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["seeds"]
        if not all(isinstance(e, dict) and isinstance(e.get("seed"), int) for e in entries):
            raise TypeError("an entry without an integer seed")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise SummaryError(
            path,
            f"not a seeds summary written by --seeds ({type(exc).__name__}: {exc}); nothing was "
            "written",
            "move it away, or pass --run-dir with another folder",
        ) from None
    return entries


class SummaryError(UsageError):
    """A `seeds.json` that this launcher did not write (it is left as it is)."""


def summary_lines(outcomes: Sequence[SeedOutcome]) -> list[str]:
    """The end-of-launch summary: a count and the failed seeds (each seed's own line was
    printed when it ended, or, for a kept seed, when the launch started)."""
    failed = [o.seed for o in outcomes if not o.ok]
    tail = f"{len(outcomes) - len(failed)} of {len(outcomes)} seeds finished" + (
        f"; failed: {', '.join(map(str, failed))}" if failed else ""
    )
    return [tail]
