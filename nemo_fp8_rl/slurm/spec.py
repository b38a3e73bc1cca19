"""What one Slurm job needs, gathered from a recipe and command-line flags, and checked.

`JobSpec` is the only input of the renderer. Every value in it that came from a recipe or a flag
has been checked here: control characters (newlines above all) are rejected everywhere, since a
newline in a value could start a new `#SBATCH` line or a new shell command; values that go into
`#SBATCH` lines additionally may not hold `"` or `\\`, which sbatch's own line parser treats
specially. Everything else reaches the script quoted (see `nemo_fp8_rl.slurm.render`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.user_error import UsageError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+|UNLIMITED|INFINITE", re.IGNORECASE)


class JobSpecError(UsageError, ValueError):
    """A value cannot be put into an sbatch script; the message says which, why and how to fix it."""


@dataclass(frozen=True)
class JobSpec:
    """Everything the sbatch template needs for one job (paths absolute)."""

    job_name: str
    nodes: int
    gpus_per_node: int
    run_dir: Path
    recipe_file: Path
    workdir: Path
    time: str = "04:00:00"
    account: str | None = None
    partition: str | None = None
    container: str | None = None
    mounts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    setup_command: str | None = None
    gres_per_node: str | None = None
    extra_sbatch_args: tuple[str, ...] = ()
    exclusive: bool = True
    python_bin_dir: Path | None = None
    ray_wait_timeout_s: int = 1800
    resume: bool = False
    eval_checkpoint: str = (
        ""  # set: the job evaluates the run (nemo_fp8_rl.eval) instead of training
    )
    eval_suite: str = ""
    eval_data_dir: str = ""
    seeds: tuple[int, ...] = ()
    overwrite: bool = False
    resume_seeds: tuple[int, ...] = ()  # the array tasks that continue their seed's run
    seed_keys: tuple[str, ...] = ("grpo.seed",)  # the keys an array task sets to its seed

    @property
    def log_root(self) -> Path:
        """Where the job's script, frozen recipe and logs live: `<run_dir>/slurm`."""
        return self.run_dir / "slurm"

    @property
    def is_array(self) -> bool:
        """A job array, one task per seed (`run_dir` is then the recipe's folder of seeds)."""
        return bool(self.seeds)


def reject_control(value: str, where: str) -> str:
    """Return `value` unchanged, or raise if it holds a newline or another control character."""
    match = _CONTROL.search(value)
    if match:
        raise JobSpecError(
            where,
            f"value {value!r} contains the control character {match.group()!r} "
            f"at position {match.start()}; newlines and control characters cannot be passed to a "
            "job script",
            "remove it from the recipe or flag",
        )
    return value


def check_header_value(value: str, where: str) -> str:
    """A value for an `#SBATCH` line: no control characters, no `"` or `\\` (sbatch parses them)."""
    reject_control(value, where)
    if not value:
        raise JobSpecError(where, "empty value", "give a value or leave the setting unset")
    bad = sorted({c for c in value if c in '"\\'})
    if bad:
        raise JobSpecError(
            where,
            f"value {value!r} contains {' and '.join(bad)}, which sbatch's #SBATCH parser "
            "treats as quoting",
            "remove those characters",
        )
    return value


def check_time(value: str, where: str = "slurm.time") -> str:
    """A Slurm time limit: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH[:MM[:SS]]` or `UNLIMITED`."""
    check_header_value(value, where)
    if not _TIME.fullmatch(value):
        raise JobSpecError(
            where, f"{value!r} is not a Slurm time limit", "use HH:MM:SS, D-HH:MM:SS or minutes"
        )
    return value


def check_mount(mount: str, where: str) -> str:
    """One pyxis mount, `SRC[:DST[:FLAGS]]`: no commas (the list separator), no control characters."""
    reject_control(mount, where)
    if not mount or "," in mount or mount.count(":") > 2 or not mount.split(":")[0]:
        raise JobSpecError(
            where,
            f"{mount!r} is not a mount of the form SRC[:DST[:FLAGS]]",
            "one mount per "
            "list item (or comma-separated on the command line), with no empty items or sources",
        )
    return mount


def check_env(env: Mapping[str, Any], where: str = "slurm.env") -> tuple[tuple[str, str], ...]:
    """Environment for every step: names must be shell identifiers; values become strings."""
    items = []
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise JobSpecError(
                where,
                f"{name!r} is not a valid environment variable name",
                "use letters, digits and underscores, not starting with a digit",
            )
        text = "" if value is None else str(value)
        items.append((name, reject_control(text, f"{where}.{name}")))
    return tuple(items)


def check_sbatch_arg(arg: str, where: str) -> str:
    """An extra sbatch option, `--flag` or `--flag=value` (value rules as for other header values)."""
    check_header_value(arg, where)
    flag = arg.split("=", 1)[0]
    if not _SBATCH_FLAG.fullmatch(flag):
        raise JobSpecError(
            where, f"{arg!r} is not an sbatch option", "write it as --name or --name=value"
        )
    return arg


def split_mounts(text: str) -> tuple[str, ...]:
    """`--mounts a:b,c:d` -> ("a:b", "c:d"); each item is checked with `check_mount`."""
    return tuple(check_mount(m, "--mounts") for m in text.split(","))


def _positive_int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise JobSpecError(
            where,
            f"expected an integer >= {minimum}, got {value!r}",
            f"give a whole number >= {minimum}",
        )
    return value


def build_job_spec(
    recipe: Any,
    recipe_file: Path,
    *,
    flags: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
    python_bin_dir: Path | None = None,
) -> JobSpec:
    """A checked `JobSpec` from a loaded `Recipe`, its frozen copy and command-line flags.

    Flags (`account`, `partition`, `time`, `container`, `mounts`, `job_name`, `resume`,
    `overwrite`) override the recipe's `slurm` section; a `seeds` flag (a list) makes the job an
    array, one task per seed, and `resume_seeds` (a subset) names the tasks that continue their
    seed's run (an array resumes per seed, so `resume` is refused with `seeds`). Nodes and GPUs come from `cluster`; the `nodes` flag may ask for
    more nodes than `cluster.num_nodes` for a CPU recipe (to spread the embedded engine's Ray
    actors over several nodes), never fewer, and never more for a GPU recipe (`_job_nodes`).
    Without a container the job puts the submitting interpreter's directory first on PATH
    (`python_bin_dir`, default: this Python's).
    """
    cfg = dict(recipe.config.get("slurm") or {})
    for name, value in (flags or {}).items():
        if isinstance(value, str) and not value.strip():
            flag = "--" + name.replace("_", "-")
            raise JobSpecError(
                flag,
                "empty value",
                f"give a value, or leave {flag} out to use the "
                f"recipe's slurm.{name} (or the default)",
            )
    cfg.update({k: v for k, v in (flags or {}).items() if v is not None})
    cluster = recipe.config.get("cluster") or {}
    container = cfg.get("container")
    if python_bin_dir is None and not container:
        python_bin_dir = Path(sys.executable).parent
    mounts = tuple(
        check_mount(m, f"slurm.mounts[{i}]") for i, m in enumerate(cfg.get("mounts") or ())
    )
    if mounts and not container:  # pyxis mounts exist only inside a container
        raise JobSpecError(
            "slurm.mounts / --mounts",
            "mounts are set but no container, and without one the job "
            "runs on the node's own file system, which mounts nothing",
            "add --container IMAGE (or slurm.container), or drop the mounts",
        )
    spec = JobSpec(
        job_name=check_header_value(str(cfg.get("job_name") or recipe.name), "job name"),
        nodes=_job_nodes(
            cfg.get("nodes"), cluster.get("num_nodes", 1), cluster.get("gpus_per_node", 0)
        ),
        gpus_per_node=_positive_int(cluster.get("gpus_per_node", 0), "cluster.gpus_per_node", 0),
        run_dir=Path(recipe.run_dir).absolute(),
        recipe_file=Path(recipe_file).absolute(),
        workdir=(workdir or Path.cwd()).absolute(),
        time=check_time(str(cfg.get("time") or "04:00:00")),
        account=_optional_header(cfg.get("account"), "slurm.account / --account"),
        partition=_optional_header(cfg.get("partition"), "slurm.partition / --partition"),
        container=_optional(container, "slurm.container / --container"),
        mounts=mounts,
        env=check_env(cfg.get("env") or {}),
        setup_command=_optional(cfg.get("setup_command"), "slurm.setup_command"),
        gres_per_node=_optional_header(cfg.get("gres_per_node"), "slurm.gres_per_node"),
        extra_sbatch_args=_sbatch_args(cfg.get("extra_sbatch_args") or ()),
        exclusive=bool(cfg.get("exclusive", True)),
        python_bin_dir=python_bin_dir,
        resume=bool(cfg.get("resume", False)),
        eval_checkpoint=_eval_value(cfg.get("eval_checkpoint"), "--checkpoint"),
        eval_suite=_eval_value(cfg.get("eval_suite"), "--suite"),
        eval_data_dir=_eval_value(cfg.get("eval_data_dir"), "--data-dir"),
        seeds=_array_seeds(cfg.get("seeds") or ()),
        overwrite=bool(cfg.get("overwrite", False)),
        resume_seeds=tuple(sorted(set(cfg.get("resume_seeds") or ()))),
        seed_keys=tuple(cfg.get("seed_keys") or ("grpo.seed",)),
    )
    return check_resume(check_paths(spec))


MAX_ARRAY_INDEX = 1000  # Slurm's default MaxArraySize is 1001: task ids 0..1000


def _array_seeds(seeds: Iterable[int]) -> tuple[int, ...]:
    """Seeds as array task ids (each task's seed is its SLURM_ARRAY_TASK_ID): 0..1000."""
    out = tuple(sorted({_positive_int(s, "--seeds", 0) for s in seeds}))
    if out and out[-1] > MAX_ARRAY_INDEX:
        raise JobSpecError(
            "--seeds",
            f"seed {out[-1]} cannot be a Slurm array task id (Slurm's default "
            f"MaxArraySize allows 0-{MAX_ARRAY_INDEX})",
            f"use seeds up to {MAX_ARRAY_INDEX}",
        )
    return out


def check_resume(spec: JobSpec) -> JobSpec:
    """An array resumes the seeds in `resume_seeds` only (each one of its tasks); a single job
    resumes with `resume`."""
    if spec.is_array and spec.resume:
        raise JobSpecError(
            "--resume",
            "a job array resumes per seed",
            "name the seeds to resume in resume_seeds (nemo_fp8_rl.submit --seeds --resume does)",
        )
    stray = sorted(set(spec.resume_seeds) - set(spec.seeds))
    if stray:
        raise JobSpecError(
            "resume_seeds",
            f"seed(s) {', '.join(map(str, stray))} are not array tasks "
            f"(--seeds {', '.join(map(str, spec.seeds)) or 'not given'})",
            "resume only seeds of the array",
        )
    return spec


def _job_nodes(flag: Any, num_nodes: Any, gpus_per_node: Any) -> int:
    """Nodes to allocate: `--nodes`, else `cluster.num_nodes`; never fewer than the recipe needs.

    More than `cluster.num_nodes` only for the embedded engine (CPU recipes), whose Ray actors
    go wherever the job's Ray cluster has room. NeMo RL trains on `cluster.num_nodes` nodes of
    the cluster, so for a GPU recipe extra nodes would sit idle: refused, with the override
    that makes the recipe use them.
    """
    needed = _positive_int(num_nodes, "cluster.num_nodes", 1)
    if flag is None:
        return needed
    nodes = _positive_int(flag, "--nodes", 1)
    if nodes < needed:
        raise JobSpecError(
            f"--nodes {nodes}",
            f"fewer than the recipe's cluster.num_nodes={needed}; training would wait forever for "
            "the missing nodes",
            "raise --nodes or lower cluster.num_nodes",
        )
    if nodes > needed and gpus_per_node != 0:
        raise JobSpecError(
            f"--nodes {nodes}",
            f"the recipe trains on cluster.num_nodes={needed} node(s); NeMo RL "
            f"would leave {nodes - needed} allocated node(s) idle",
            f"add the override "
            f"cluster.num_nodes={nodes} (the recipe's parallel sizes are checked against it), or "
            "leave --nodes out",
        )
    return nodes


def check_paths(spec: JobSpec) -> JobSpec:
    """Paths end up in `#SBATCH --output` and in the script: same rules as other values."""
    check_header_value(str(spec.log_root), "run directory (--run-dir)")
    for name in ("recipe_file", "workdir", "python_bin_dir"):
        value = getattr(spec, name)
        if value is not None:
            reject_control(str(value), name)
    return spec


def _eval_value(value: Any, where: str) -> str:
    return "" if value in (None, "") else reject_control(str(value), where)


def _optional(value: Any, where: str) -> str | None:
    return None if value in (None, "") else reject_control(str(value), where)


def _optional_header(value: Any, where: str) -> str | None:
    return None if value in (None, "") else check_header_value(str(value), where)


def _sbatch_args(args: Iterable[str]) -> tuple[str, ...]:
    return tuple(
        check_sbatch_arg(str(a), f"slurm.extra_sbatch_args[{i}]") for i, a in enumerate(args)
    )
