"""Whether two runs may be given a precision verdict, and what else differs between them.

A verdict such as "FP8: 4.7 points below BF16" reads as the precision's doing; it is only when the
runs differ in nothing but precision and seed. `differences(reference, run)` lists what else
differs, each with the file that records it:

- from each run's `environment.json`: the `engine` (embedded or NeMo RL), the `generator` that
  served the rollouts (backend, vLLM version and build: real vLLM and the CPU loop's stand-in
  score the same weights differently), the NeMo RL version and its tree (git commit where the
  tree is a checkout, else the digest of its Python source, `engines.nemo.driver.served_by`);
- from each run's `recipe.yaml`: every key outside the precision, forced, refit, calibration
  and derived groups (`recipe_diff.group_of`), except the seed (`grpo.seed`).

A field recorded by one run and not the other (a run from before the field existed) is listed by
`unrecorded`, not as a difference: nothing says the two differ, nor that they do not.
`compare` refuses a verdict between runs that differ (`FairnessError`, one located line naming
every difference), or with `--allow-unfair` labels each such verdict (`label`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_fp8_rl.analysis.recipe_diff import ABSENT, diff_configs, precision_of
from nemo_fp8_rl.analysis.rundata import RunData
from nemo_fp8_rl.config.user_error import UsageError

SEED_KEYS = ("grpo.seed",)
FLAG = "--allow-unfair"


def _generator(env: Mapping[str, Any]) -> str | None:
    gen = env.get("generator")
    if not isinstance(gen, Mapping):
        return None
    version = f" {gen['version']}" if gen.get("version") else ""
    return f"{gen.get('backend')}{version} ({gen.get('build')} build)"


def _tree(env: Mapping[str, Any]) -> str | None:
    tree = env.get("nemo_rl_tree")
    if not isinstance(tree, Mapping):
        return None
    if tree.get("commit"):
        return f"commit {str(tree['commit'])[:12]}"
    digest = tree.get("source_sha256")
    return f"source sha256 {str(digest)[:12]}" if digest else None


# environment.json fields a precision verdict needs equal: (name, how it is read)
ENV_FIELDS: tuple[tuple[str, Callable[[Mapping[str, Any]], str | None]], ...] = (
    ("engine", lambda env: env.get("engine")),
    ("generator", _generator),
    ("NeMo RL version", lambda env: env.get("nemo_rl")),
    ("NeMo RL tree", _tree),
)


@dataclass(frozen=True)
class Difference:
    """One thing two runs differ in besides precision and seed: `what` in the file `where`
    (the compared run's), the run's value and the reference's."""

    what: str
    where: str
    value: str
    reference: str

    def text(self, reference_name: str) -> str:
        return f"{self.what} {self.value} here, {self.reference} in {reference_name}"


def _env_fields(run: RunData) -> dict[str, str | None]:
    env = run.environment or {}
    return {name: read(env) for name, read in ENV_FIELDS}


def differences(reference: RunData, run: RunData) -> list[Difference]:
    """What `run` differs from `reference` in besides precision and seed (module docstring)."""
    out = []
    mine, theirs = _env_fields(run), _env_fields(reference)
    env_file = str(run.path / "environment.json")
    for name, _ in ENV_FIELDS:
        if mine[name] is not None and theirs[name] is not None and mine[name] != theirs[name]:
            out.append(Difference(name, env_file, str(mine[name]), str(theirs[name])))
    if reference.config and run.config:
        diff = diff_configs([reference.name, run.name], [reference.config, run.config])
        for entry in diff.entries:
            if entry.group == "other" and entry.key not in SEED_KEYS:
                ref_value, value = (
                    "absent" if v is ABSENT or v == ABSENT else repr(v) for v in entry.values
                )
                out.append(
                    Difference(
                        f"recipe key {entry.key}", str(run.path / "recipe.yaml"), value, ref_value
                    )
                )
    return out


def unrecorded(reference: RunData, run: RunData) -> list[str]:
    """The `ENV_FIELDS` one of the two runs recorded and the other did not."""
    mine, theirs = _env_fields(run), _env_fields(reference)
    return [n for n, _ in ENV_FIELDS if (mine[n] is None) != (theirs[n] is None)]


class FairnessError(UsageError):
    """Two runs differ in more than precision and seed: no precision verdict (exit 2)."""

    def __init__(self, reference: RunData, run: RunData, found: list[Difference]) -> None:
        listed = "; ".join(d.text(str(reference.path)) for d in found)
        super().__init__(
            found[0].where,
            f"{run.name} differs from {reference.name} in more than precision and seed ({listed}), "
            "so a precision verdict between them would measure that too",
            f"compare runs that differ only in precision and seed (rerun one of them like the "
            f"other), or pass {FLAG} to get the table and verdicts labelled as not a precision "
            "comparison",
        )


def label(reference: RunData, run: RunData, found: list[Difference]) -> str:
    """The prefix of a verdict between runs that differ (`--allow-unfair`)."""
    return (
        "NOT A PRECISION COMPARISON (differs from "
        f"{reference.name} in {'; '.join(d.text(reference.name) for d in found)}): "
    )


def reference_of(runs: Sequence[RunData]) -> int:
    """The run the others are checked against: the first BF16 run, else the first run."""
    return next((i for i, r in enumerate(runs) if precision_of(r.config) == "bf16"), 0)


def check(runs: Sequence[RunData], allow: bool) -> dict[str, str]:
    """Each run's verdict label (`label`, or a note on fields only one run recorded), by run
    name; raises `FairnessError` for the first run that differs unless `allow`."""
    ref = reference_of(runs)
    labels = {}
    for i, run in enumerate(runs):
        if i == ref:
            continue
        found = differences(runs[ref], run)
        if found and not allow:
            raise FairnessError(runs[ref], run, found)
        missing = unrecorded(runs[ref], run)
        note = (
            f"(not checked: {', '.join(missing)}, recorded by only one of {run.name} and "
            f"{runs[ref].name}) "
            if missing
            else ""
        )
        if found or note:
            labels[run.name] = (label(runs[ref], run, found) if found else "") + note
    return labels


def labelled(
    verdicts: list[str], names: Sequence[Sequence[str]], labels: Mapping[str, str]
) -> list[str]:
    """`verdicts` with each one's label in front: `names[k]` are the runs verdict k is about
    (one run, or a recipe's seeds); their labels, once each."""
    out = []
    for text, runs in zip(verdicts, names, strict=True):
        prefix = "".join(dict.fromkeys(labels[n] for n in runs if n in labels))
        out.append(prefix + text)
    return out
