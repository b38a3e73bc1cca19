"""Benchmark suites: what is evaluated, with which sampling, and what NeMo RL cannot load.

`math8` is the Calibrated Clipping study's eight math benchmarks. NeMo RL's evaluation entry point
(`examples/run_eval.py`) loads three of them by name, spelled differently in the two supported
snapshots: v0.7.0 routes `aime2024`/`aime2025`/`math500` through `load_eval_dataset`; 7ea279a
moved AIME to the response-dataset registry (`AIME2024`, `AIME2025`) and keeps `math500`. The
other five (AMC23, AMC24, Gaokao 2023 En, Minerva Math, OlympiadBench) are in neither snapshot;
`--data-dir D` evaluates them from `D/<name>.jsonl` (`problem`, `answer`) through NeMo RL's
local-file fallback (`LocalMathDataset`), and without the file they are reported as missing.

Sampling (stated in every result): temperature 0.6, top-p 0.95, no top-k, up to the run's own
response length; AIME with 16 samples per problem, the others with 4. The score of a benchmark
is avg@n = mean over problems and samples of the 0/1 reward (NeMo RL's `pass@k` with k = 1 over
`num_tests_per_prompt = n` samples). The study's exact evaluation settings are not public; these
are the common ones for reasoning base models.

`addition` is the embedded engine's suite: held-out two-digit sums (none seen in training or
validation) and three-digit sums (harder than training), same sampling and avg@4.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nemo_fp8_rl.config.user_error import UsageError


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of a suite."""

    name: str
    title: str
    samples: int  # samples per problem (avg@samples)
    v070: str | None = None  # NeMo RL v0.7.0 dataset name (None: not in its registry)
    registry: str | None = None  # NeMo RL 7ea279a+ dataset name
    digits: int = 0  # addition suite: operand digits


@dataclass(frozen=True)
class Sampling:
    """Generation settings of an evaluation."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int | None = None


@dataclass(frozen=True)
class Suite:
    """A named list of benchmarks, evaluated with one sampling setting."""

    name: str
    engine: str  # "nemo" (GPU recipes) or "local" (CPU recipes)
    benchmarks: tuple[Benchmark, ...]
    sampling: Sampling = Sampling()
    num_problems: int = 0  # addition: problems per benchmark
    pass_ks: tuple[int, ...] = (1,)  # pass@k reported for these k (each <= samples per problem)


MATH8 = Suite(
    "math8",
    "nemo",
    (
        Benchmark("aime24", "AIME 2024", 16, "aime2024", "AIME2024"),
        Benchmark("aime25", "AIME 2025", 16, "aime2025", "AIME2025"),
        Benchmark("amc23", "AMC 2023", 4),
        Benchmark("amc24", "AMC 2024", 4),
        Benchmark("math500", "MATH-500", 4, "math500", "math500"),
        Benchmark("gaokao2023en", "Gaokao 2023 En", 4),
        Benchmark("minerva", "Minerva Math", 4),
        Benchmark("olympiadbench", "OlympiadBench", 4),
    ),
)
ADDITION = Suite(
    "addition",
    "local",
    (
        Benchmark("add2-heldout", "2-digit sums not seen in training", 4, digits=2),
        Benchmark("add3", "3-digit sums (harder than training)", 4, digits=3),
    ),
    num_problems=256,
)
SUITES = {s.name: s for s in (MATH8, ADDITION)}
DEFAULT_SUITE = {"nemo": "math8", "local": "addition"}


class SuiteError(UsageError):
    """Unknown suite, or a suite the run's engine cannot evaluate (exit code 2)."""


def get_suite(name: str | None, engine: str) -> Suite:
    """The suite `name` (default: the engine's), checked against the engine."""
    name = name or DEFAULT_SUITE[engine]
    if name not in SUITES:
        raise SuiteError(f"--suite {name}", "unknown suite", f"use one of {', '.join(SUITES)}")
    suite = SUITES[name]
    if suite.engine != engine:
        kind = "CPU (embedded engine)" if engine == "local" else "GPU (NeMo RL)"
        raise SuiteError(
            f"--suite {name}",
            f"is for {suite.engine} runs, but this is a {kind} run",
            f"use --suite {DEFAULT_SUITE[engine]}",
        )
    return suite


def has_response_registry_aime(nemo_rl_src: Path) -> bool:
    """True when the tree's run_eval.py loads AIME from the response registry (7ea279a style)."""
    run_eval = nemo_rl_src / "examples" / "run_eval.py"
    return "load_response_dataset" in run_eval.read_text()


def nemo_dataset(bench: Benchmark, nemo_rl_src: Path) -> str | None:
    """The benchmark's NeMo RL dataset name in this tree, or None when NeMo RL lacks it."""
    return bench.registry if has_response_registry_aime(nemo_rl_src) else bench.v070


def missing_in_nemo_rl(suite: Suite) -> dict[str, list[str]]:
    """Per snapshot, the benchmarks NeMo RL's registry does not have."""
    return {
        "v0.7.0": [b.name for b in suite.benchmarks if b.v070 is None],
        "7ea279a": [b.name for b in suite.benchmarks if b.registry is None],
    }
