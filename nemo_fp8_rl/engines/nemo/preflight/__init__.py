"""Preflight: a launch rehearsal of a recipe on CPU, through NeMo RL's real driver code.

    result = preflight(recipe)          # NeMo RL importable (scripts/nemo-rl-contract.sh builds one)
    print(result.report()); result.ok

It runs what `nemo_fp8_rl.train` runs on a cluster (`platform.GpuCluster`): the engine's own
`runner._prepare_nemo` (hand-off, `MasterConfig`, tokenizer, `configure_generation_config`, `setup_response_data`) and
`runner._train` (NeMo RL's `grpo.setup()` with the project's policy factory, loss and metrics
tee, and NeMo RL's real `Policy` and `VllmGeneration` constructors), with only the Ray- and
GPU-backed objects replaced by recorders (`stand_ins.DRIVER`), the Hub replaced by a local cache
holding the model's real `config.json` (`offline_hub`). Then the vLLM worker's config path runs
on the generation config the real `VllmGeneration` holds, through NeMo RL's `init_fp8` up to
`vllm.LLM(...)`, and the Megatron worker's config module is imported where it can be
(`worker_rehearsal`); vLLM's and megatron-core's own configuration checks run on what was built
(`engine_checks`).

Every problem is a `LocatedError` from the real traceback. A missing key is recorded, filled
with NeMo RL's exemplar value (`exemplars`) and the rehearsal re-run, so one preflight reports
every missing key at once; any other error ends the rehearsal (nothing after it could run); the
engine checks' findings are all reported.

Runs in the driver's process (`train --preflight`, `submit`), before anything is queued: it
imports the driver (`runner`, `handoff`, `compat`) and the worker side's pure refit checks
(`trainer_refit`, `vllm_refit`, in `refit_check`), and starts no Ray worker, so nothing crosses a
process boundary. `exemplars` and `upstream_recipes` read NeMo RL's own config files, the
yardsticks the contract tests hold every hand-off to.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.temp_files import temporary_folder
from nemo_fp8_rl.engines.nemo.preflight import recorders as rec
from nemo_fp8_rl.engines.nemo.preflight.located import (
    LocatedError,
    locate,
    render_report,
    with_default_fix,
)

MAX_ROUNDS = 60


@dataclass
class Rehearsal:
    """What one run of the driver code recorded."""

    clusters: list[rec.ClusterRecorder] = field(default_factory=list)
    policies: list[Any] = field(default_factory=list)  # NeMo RL's real Policy objects
    generations: list[Any] = field(default_factory=list)  # NeMo RL's real VllmGeneration objects
    worker_groups: list[rec.WorkerGroupRecorder] = field(default_factory=list)
    environments: list[rec.EnvironmentRecorder] = field(default_factory=list)
    train: rec.TrainRecorder = field(default_factory=rec.TrainRecorder)
    datasets: list[str] = field(default_factory=list)
    llm_kwargs: dict[str, Any] | None = None
    megatron_imported: bool | None = None
    unverified_reads: list[str] = field(default_factory=list)
    engine_errors: list[LocatedError] = field(default_factory=list)  # vLLM's and Megatron's checks


@dataclass
class PreflightResult:
    """Outcome of `preflight`: problems (empty = passed), parts not run on CPU, timings."""

    recipe: str
    nemo_rl: str
    errors: list[LocatedError]
    not_run: list[str]
    rehearsal: Rehearsal | None
    seconds: float
    rounds: int
    guards: Any = None  # guards.findings.GuardReport: the pre-launch guard rails' verdicts

    @property
    def ok(self) -> bool:
        return not self.errors and (self.guards is None or self.guards.ok)

    @property
    def problem_count(self) -> int:
        """The rehearsal's problems plus the guard rails' errors."""
        return len(self.errors) + (0 if self.guards is None else len(self.guards.errors))

    def report(self) -> str:
        lines = []
        if self.errors:
            lines.append(render_report(self.recipe, self.errors, Path(self.nemo_rl)))
        else:
            refused = self.guards is not None and not self.guards.ok
            verdict = (
                "launch rehearsal passed; refused by the guard rails below" if refused else "passed"
            )
            lines.append(f"preflight of {self.recipe} against NeMo RL at {self.nemo_rl}: {verdict}")
            lines += self._summary()
        lines.append(f"  ({self.seconds:.1f} s, {self.rounds} rehearsal(s))")
        if self.guards is not None:
            lines.append(self.guards.render())
        if self.not_run:
            lines.append("  not rehearsed on CPU:")
            lines += [f"    - {item}" for item in self.not_run]
        if self.rehearsal and self.rehearsal.unverified_reads:
            lines.append(
                "  read with [] by the Megatron worker's source but absent from its config and "
                "from NeMo RL's exemplars (unverified: the branch may never be taken):"
            )
            lines += [f"    - {item}" for item in self.rehearsal.unverified_reads]
        return "\n".join(lines)

    def _summary(self) -> list[str]:
        r = self.rehearsal
        if r is None:
            return []
        out = [f"  clusters: {[c.kwargs.get('bundle_ct_per_node_list') for c in r.clusters]}"]
        for p in r.policies:
            fqn = p.worker_group.builder.ray_actor_class_fqn
            out.append(f"  policy: {p.cfg['model_name']} ({fqn.rsplit('.', 1)[-1]})")
        if r.llm_kwargs is not None:
            shown = {
                k: r.llm_kwargs.get(k)
                for k in (
                    "model",
                    "tensor_parallel_size",
                    "dtype",
                    "max_model_len",
                    "gpu_memory_utilization",
                )
            }
            out.append(f"  vllm.LLM: {shown}")
        out.append(f"  grpo_train reached: {r.train.called('grpo_train')}")
        if r.train.called("async_grpo_train"):
            out.append("  async_grpo_train reached: True (grpo.async_grpo.enabled)")
        return out


def _nemo_rl_tree() -> Path:
    import nemo_rl

    return Path(nemo_rl.__file__).resolve().parents[1]


def _roots(exc: BaseException) -> dict[str, Any]:
    """The live config sections NeMo RL was reading, from the MasterConfig on the stack."""
    from nemo_rl.algorithms.grpo import MasterConfig

    tb, found = exc.__traceback__, None
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, MasterConfig):
                found = value
        tb = tb.tb_next
    if found is None:
        return {}
    return {k: v for k, v in vars(found).items() if isinstance(v, dict)}


def _replacements(r: Rehearsal, ray: rec.RayRecorder) -> list[tuple[Any, str, Any]]:
    """`stand_ins.DRIVER`'s recorders, plus NeMo RL's real Policy / VllmGeneration kept in `r`."""
    from nemo_rl.algorithms import grpo
    from nemo_rl.models.policy import lm_policy

    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import dataset_sample
    from nemo_fp8_rl.engines.nemo.preflight.stand_ins import driver_replacements, keep

    values = {
        "ClusterRecorder": keep(rec.ClusterRecorder, r.clusters),
        "WorkerGroupRecorder": keep(rec.WorkerGroupRecorder, r.worker_groups),
        "QueueRecorder": rec.QueueRecorder,
        "RayRecorder": ray,
        "RayRecorder.init": ray.init,
        "TrainRecorder": r.train,
        "TrainRecorder.async_grpo_train": rec.signature_checked(
            grpo.async_grpo_train, r.train.async_grpo_train
        ),
        "GpuMonitorRecorder": rec.GpuMonitorRecorder,
        "EnvironmentRecorder": keep(rec.EnvironmentRecorder, r.environments),
        "VenvRecorder": rec.VenvRecorder(),
    }
    hub = rec.HubDatasetRecorder(lambda repo: (r.datasets.append(repo), dataset_sample(repo))[1])
    policy = keep(lm_policy.Policy, r.policies)
    real = [
        (grpo, "Policy", policy),
        (lm_policy, "Policy", policy),
        (grpo, "VllmGeneration", keep(grpo.VllmGeneration, r.generations)),
    ]
    return driver_replacements(values, hub) + real


def _rehearse(recipe: Recipe, work: Path, not_run: list[str], live: dict[str, Any]) -> Rehearsal:
    """One run of the driver code with recorders; raises whatever NeMo RL raises."""
    from nemo_fp8_rl.engines.nemo.driver import runner
    from nemo_fp8_rl.engines.nemo.driver.platform import GpuCluster
    from nemo_fp8_rl.engines.nemo.preflight.engine_checks import megatron_findings, vllm_findings
    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import (
        model_config,
        offline_hub,
        write_model,
    )
    from nemo_fp8_rl.engines.nemo.preflight.refit_check import refit_findings
    from nemo_fp8_rl.engines.nemo.preflight.stand_ins import cuda_arch_list
    from nemo_fp8_rl.engines.nemo.preflight.worker_rehearsal import (
        rehearse_megatron_worker,
        rehearse_vllm_worker,
    )

    policy = recipe.config["policy"]
    cache = work / "hub"
    for name in {policy["model_name"], policy["tokenizer"]["name"]}:
        write_model(cache, name)
    r, tree = Rehearsal(), _nemo_rl_tree()
    with (
        offline_hub(cache),
        rec.installed(_replacements(r, rec.RayRecorder())),
        cuda_arch_list(),
    ):
        cluster = GpuCluster()  # the rehearsal is of the cluster's run, whatever the recipe
        prepared = runner._prepare_nemo(recipe, cluster)
        runner._train(recipe, work / "run", prepared, cluster)
        if r.policies:  # the workers' configs, for locating what the workers miss
            live["policy"] = r.policies[0].cfg
            r.engine_errors += megatron_findings(r.policies[0].cfg, tree)
        if r.generations:
            gen = r.generations[0].cfg
            seed = recipe.config["grpo"]["seed"]  # grpo is a dict in v0.7.0, a model at main
            r.llm_kwargs = rehearse_vllm_worker(gen, seed, not_run)
            r.engine_errors += vllm_findings(r.llm_kwargs, gen["vllm_cfg"], tree)
            hf = model_config(policy["model_name"])
            r.engine_errors += refit_findings(recipe.config, r.llm_kwargs, hf, tree)
    if policy.get("megatron_cfg", {}).get("enabled"):
        r.megatron_imported = rehearse_megatron_worker(not_run)
    return r


def _mx_findings(config: dict[str, Any], tree: Path) -> list[LocatedError]:
    """`mx_support`'s refusals (is_mx unread by this NeMo RL; an MXFP8 MoE backend), located;
    the engine refuses them before it starts, so they come first."""
    from nemo_fp8_rl.engines.nemo.driver.mx_support import mx_problems, num_experts
    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import NoLocalCopy, model_config

    try:
        experts: int | None = num_experts(model_config(config["policy"]["model_name"]))
    except NoLocalCopy:
        experts = None
    return [
        LocatedError(p.key, p.file, p.line, p.what, p.fix)
        for p in mx_problems(config, tree, experts)
    ]


MEGATRON_FILES = (
    "nemo_rl/models/megatron/setup.py",
    "nemo_rl/models/policy/workers/megatron_policy_worker.py",
)


def static_megatron_check(
    tree: Path, policy_config: dict[str, Any], defaults: dict[str, Any]
) -> tuple[list[LocatedError], list[str]]:
    """`[]` reads of the Megatron worker files (not executable here) against the worker's config.

    A key absent from the config that NeMo RL's own exemplar configs have is an error (NeMo RL
    expects it, and its exemplar gives the fix); other absent keys are listed as unverified
    (the scan cannot tell whether their branch is taken).
    """
    from nemo_fp8_rl.config.nemo_defaults import has_key
    from nemo_fp8_rl.engines.nemo.driver.handoff import left_out_reason
    from nemo_fp8_rl.engines.nemo.preflight.config_reads import bracket_reads

    live, errors, unverified = {"policy": policy_config}, [], []
    for rel in MEGATRON_FILES:
        if not (tree / rel).is_file():
            continue
        for read in bracket_reads(tree, rel):
            if has_key(live, read.key) or left_out_reason(read.key) is not None:
                continue
            known = defaults.get(read.key)
            children = [k for k in defaults.values() if k.key.startswith(read.key + ".")]
            if known is None and not children:
                unverified.append(f"{read.key} ({read.file}:{read.line})")
                continue
            err = LocatedError(
                read.key,
                read.file,
                read.line,
                "missing: the Megatron worker reads it with [] (found in its source; not "
                "executed on CPU)",
                f"add the section `{read.key}` as in {children[0].source if children else ''}",
            )
            errors.append(with_default_fix(err, known.value, known.source) if known else err)
    return errors, unverified


def _unlocated(exc: BaseException) -> LocatedError:
    """An error raised outside NeMo RL: located at its innermost frame."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    file, line = (tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb else ("?", 0)
    return LocatedError(
        None,
        file,
        line,
        f"{type(exc).__name__}: {exc}"[:400],
        "outside NeMo RL's code: see the message",
    )


def _set_key(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = copy.deepcopy(value)


def _for_rehearsal(recipe: Recipe, work: Path, config: dict[str, Any]) -> Recipe:
    """The recipe with outputs under `work` (a rehearsal never touches the real run dir)."""
    config = copy.deepcopy(config)
    config["logger"]["log_dir"] = str(work / "run" / "logs")
    config["checkpointing"]["checkpoint_dir"] = str(work / "run" / "checkpoints")
    return dataclasses.replace(recipe, config=config, run_dir=work / "run")


def preflight(recipe: Recipe, workdir: Path | None = None) -> PreflightResult:
    """Rehearse `recipe`'s launch through NeMo RL's real code; every problem located, at once.

    `workdir` is the folder the run would start in (default: the current one; the documented
    launch is from the NeMo RL folder): NeMo RL resolves relative paths such as
    `data.default.prompt_file` against it.
    """
    with contextlib.chdir(workdir or Path.cwd()):
        return _preflight(recipe)


def _preflight(recipe: Recipe) -> PreflightResult:
    from nemo_fp8_rl.engines.nemo.driver.handoff import HandoffError
    from nemo_fp8_rl.engines.nemo.preflight.exemplars import exemplar_keys

    start, tree = time.perf_counter(), _nemo_rl_tree()
    try:
        defaults = exemplar_keys(tree)
    except FileNotFoundError:
        defaults = {}  # an installed NeMo RL without examples/: fixes name no default value
    config, not_run, result = copy.deepcopy(recipe.config), [], None
    errors = _mx_findings(config, tree)
    rounds = 0
    with temporary_folder("preflight") as tmp:
        for rounds in range(1, MAX_ROUNDS + 1):
            work = Path(tmp) / f"r{rounds}"
            not_run = []
            try:
                live: dict[str, Any] = {}
                result = _rehearse(_for_rehearsal(recipe, work, config), work, not_run, live)
                errors += result.engine_errors
                if result.megatron_imported is False and result.policies:
                    found, result.unverified_reads = static_megatron_check(
                        tree, result.policies[0].cfg, defaults
                    )
                    errors += [e for e in found if e.key not in {x.key for x in errors}]
                break
            except HandoffError as exc:
                errors.append(
                    LocatedError(
                        None,
                        "nemo_rl/algorithms/grpo.py",
                        0,
                        str(exc),
                        "fix the keys listed (NeMo RL's names and types)",
                    )
                )
                break
            except Exception as exc:  # noqa: BLE001 - every NeMo RL failure becomes a report
                err = locate(exc, _roots(exc) or live) or _unlocated(exc)
                if getattr(exc, "what", None) and getattr(exc, "fix", None):  # NoLocalCopy
                    key = getattr(exc, "key", None) or err.key
                    err = dataclasses.replace(err, key=key, message=exc.what, fix=exc.fix)
                elif isinstance(exc, FileNotFoundError) and err.key is None:
                    err = dataclasses.replace(
                        err,
                        fix=(
                            f"relative paths resolve against the folder the run starts in "
                            f"({Path.cwd()}): start from the NeMo RL folder, or make the path absolute"
                        ),
                    )
                known = defaults.get(err.key or "")
                if (
                    isinstance(exc, KeyError)
                    and err.key
                    and not err.key.startswith("?")
                    and err.key not in {e.key for e in errors}
                ):
                    errors.append(
                        with_default_fix(err, known.value, known.source) if known else err
                    )
                    _set_key(config, err.key, known.value if known else None)
                    continue
                errors.append(err)
                break
    from nemo_fp8_rl.engines.nemo.driver.guard_rails import pre_launch_report

    guards = pre_launch_report(recipe, tree)
    return PreflightResult(
        recipe.name, str(tree), errors, not_run, result, time.perf_counter() - start, rounds, guards
    )


def run_check(recipe: Recipe, out: Any = print) -> int:
    """CLI helper: 0 passed, 2 problems found, 3 NeMo RL not importable here (`out` gets text)."""
    from nemo_fp8_rl.engines.nemo.driver.compat import available

    ok, why = available()
    if not ok:
        out(f"preflight not run: NeMo RL is not usable here: {why}")
        return 3
    result = preflight(recipe)
    out(result.report())
    return 0 if result.ok else 2
