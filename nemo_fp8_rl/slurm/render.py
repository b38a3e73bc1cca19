"""Render an sbatch script from a `JobSpec` and a template in `slurm/`.

The template is plain bash with two placeholders, `@@{sbatch_header}` and `@@{settings}` (the
`@@` delimiter keeps bash's own `$` untouched). The header holds the `#SBATCH` lines; each value
in it is double-quoted, which sbatch's line parser strips (values with `"` or `\\` were rejected
in `spec`). The settings block assigns one shell variable per value, each `shlex.quote`d, so a
value is only ever data: the fixed template code reads the variables, always double-quoted.
Nothing from a recipe or a flag is pasted into the template's code.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from string import Template

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.slurm.spec import JobSpec

TEMPLATE_NAME = "ray-job.sbatch"


class _Template(Template):
    delimiter = "@@"


def default_template() -> Path:
    """The project's `slurm/ray-job.sbatch` (next to `recipes/`, see `config.project_root`)."""
    from nemo_fp8_rl.config import project_root

    return project_root() / "slurm" / TEMPLATE_NAME


def sbatch_header(spec: JobSpec) -> list[str]:
    """`#SBATCH` lines: name, shape, limits, GPUs only when the job has any, log path."""
    opts: list[tuple[str, str | None]] = [("job-name", spec.job_name), ("time", spec.time)]
    if spec.account:
        opts.append(("account", spec.account))
    if spec.partition:
        opts.append(("partition", spec.partition))
    gres = step_gres(spec)
    if gres:
        opts.append(("gres", gres))
    if spec.exclusive:
        opts.append(("exclusive", None))
    if spec.is_array:
        opts.append(("array", array_range(spec.seeds)))
        opts.append(("output", f"{spec.log_root}/slurm-%A_%a.out"))
    else:
        opts.append(("output", f"{spec.log_root}/slurm-%j.out"))
    lines = [f"#SBATCH --{k}" if v is None else f'#SBATCH --{k}="{v}"' for k, v in opts]
    lines[1:1] = [f"#SBATCH --nodes={spec.nodes}", "#SBATCH --ntasks-per-node=1"]
    lines += [f"#SBATCH {_quote_sbatch_arg(a)}" for a in spec.extra_sbatch_args]
    return lines


def array_range(seeds: tuple[int, ...]) -> str:
    """Slurm's `--array` list for sorted seeds, runs compressed: (1, 2, 3, 7) -> "1-3,7"."""
    parts: list[str] = []
    start = prev = seeds[0]
    for seed in (*seeds[1:], None):
        if seed is not None and seed == prev + 1:
            prev = seed
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if seed is not None:
            start = prev = seed
    return ",".join(parts)


def step_gres(spec: JobSpec) -> str:
    """GRES per node: `slurm.gres_per_node`, else `gpu:<cluster.gpus_per_node>`, else none."""
    if spec.gres_per_node:
        return spec.gres_per_node
    return f"gpu:{spec.gpus_per_node}" if spec.gpus_per_node > 0 else ""


def _quote_sbatch_arg(arg: str) -> str:
    flag, sep, value = arg.partition("=")
    return f'{flag}="{value}"' if sep else flag


def container_args(spec: JobSpec) -> list[str]:
    """pyxis flags for every srun step; none at all without a container image."""
    if not spec.container:
        return []
    args = [
        f"--container-image={spec.container}",
        "--container-name=nemo-fp8-rl",
        f"--container-workdir={spec.workdir}",
        "--no-container-mount-home",
    ]
    if spec.mounts:
        args.append(f"--container-mounts={','.join(spec.mounts)}")
    return args


def settings(spec: JobSpec) -> list[str]:
    """Shell assignments, one per value, each quoted; then the job's environment, exported."""
    values = {
        "RUN_DIR": str(spec.run_dir),
        "RECIPE_FILE": str(spec.recipe_file),
        "WORKDIR": str(spec.workdir),
        "NUM_NODES": str(spec.nodes),
        "GPUS_PER_NODE": str(spec.gpus_per_node),
        "STEP_GRES": step_gres(spec),
        "PYTHON_BIN_DIR": str(spec.python_bin_dir or ""),
        "SETUP_COMMAND": spec.setup_command or "",
        "RAY_WAIT_TIMEOUT_S": str(spec.ray_wait_timeout_s),
        "TRAIN_RESUME": "--resume" if spec.resume else ("--overwrite" if spec.overwrite else ""),
        "EVAL_CHECKPOINT": spec.eval_checkpoint,
        "EVAL_SUITE": spec.eval_suite,
        "EVAL_DATA_DIR": spec.eval_data_dir,
        "LOG_ROOT": str(spec.log_root),
        "SEED_ARRAY": "1" if spec.is_array else "",
        "SEED_RESUME": " ".join(map(str, spec.resume_seeds)),
        "SEED_KEYS": " ".join(spec.seed_keys),
    }
    lines = [f"{name}={shlex.quote(value)}" for name, value in values.items()]
    lines.append("export " + " ".join(values))
    lines.append("# shellcheck disable=SC2054  # commas separate pyxis mounts, not array items")
    lines.append(f"CONTAINER_ARGS=({' '.join(shlex.quote(a) for a in container_args(spec))})")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in spec.env]
    return lines


def render_sbatch(spec: JobSpec, template: Path | None = None) -> str:
    """The complete sbatch script for `spec` (bash), from `template` or the project's default."""
    path = Path(template) if template is not None else default_template()
    if not path.is_file():
        raise UserError(
            f"sbatch template {path}",
            "not found",
            "pass --template FILE or set NEMO_FP8_RL_HOME to the project checkout that holds slurm/",
        )
    text = _Template(path.read_text())
    try:
        return text.substitute(
            sbatch_header="\n".join(sbatch_header(spec)), settings="\n".join(settings(spec))
        )
    except (KeyError, ValueError) as err:
        raise ValueError(
            f"sbatch template {path} has an unknown or malformed @@{{...}} placeholder ({err}); "
            "the known ones are @@{sbatch_header} and @@{settings}"
        ) from err
