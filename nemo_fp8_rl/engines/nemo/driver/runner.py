"""`run(recipe)`: a recipe as a NeMo RL GRPO run with the project's loss and calibrator.

The sequence is NeMo RL's own `examples/run_grpo.py` (config → Ray → tokenizer → data →
`setup` → `grpo_train`, or `async_grpo_train` with `grpo.async_grpo.enabled`: `async_loop`), with
four substitutions:

1. the config is the hand-off (`handoff.to_nemo_config`), validated by `MasterConfig`;
2. with calibration on, the policy is built with `ShadowMegatronPolicyWorker` through
   `setup(policy_factory=...)`, and `grpo_train` receives a `ShadowPolicy` around it; with
   `refit.quantize_on: trainer` both refit ends are the project's workers (`refit_workers`);
3. the loss `setup` built (`ClippedPGLossFn`) is replaced by `NemoCalibratedLoss`; its
   calibrator state is restored from the checkpoint NeMo RL resumes from;
4. the logger also writes `metrics.jsonl` into the run directory.

Everything else (rollouts with vLLM, FP8 refit, checkpoints, validation) is NeMo RL's. Where the
run is placed (a GPU cluster, or NeMo RL's loop on this CPU machine) is asked of one
`platform.Platform` (`platform.platform_for`): its recipe checks, hand-off values, Ray start and
stop, and the policy and generation workers.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.placement import placement
from nemo_fp8_rl.engines.nemo.driver import compat, worker_faults
from nemo_fp8_rl.engines.nemo.driver.async_loop import training_loop
from nemo_fp8_rl.engines.nemo.driver.checkpoint import load_calibrator_state
from nemo_fp8_rl.engines.nemo.driver.handoff import (
    to_nemo_config,
    validate_with_nemo_rl,
    write_handoff,
)
from nemo_fp8_rl.engines.nemo.driver.metrics_log import BreachStop, MetricsTee, health_monitor
from nemo_fp8_rl.engines.nemo.driver.platform import Platform, platform_for
from nemo_fp8_rl.engines.nemo.driver.recipe_checks import (
    EngineConfigError as EngineConfigError,
)
from nemo_fp8_rl.engines.nemo.driver.recipe_checks import (
    check_recipe,
)
from nemo_fp8_rl.engines.nemo.driver.recipe_checks import (
    gpu_issues as gpu_issues,
)
from nemo_fp8_rl.engines.nemo.driver.served_guard import served_guard
from nemo_fp8_rl.engines.nemo.driver.worker_env import WORKER_FQN as WORKER_FQN  # re-exported
from nemo_fp8_rl.engines.nemo.driver.worker_env import export_package_path
from nemo_fp8_rl.engines.nemo.worker.loss import NemoCalibratedLoss
from nemo_fp8_rl.guards.breach import on_breach
from nemo_fp8_rl.runs import lock, outputs, rundir
from nemo_fp8_rl.runs.resume import keep_completed_rows, train_command


def _refuse_mx_problems(recipe: Recipe, info: compat.NemoRLInfo) -> None:
    """MXFP8 rollout settings the NeMo RL in use would not run as written (`mx_support`)."""
    from nemo_fp8_rl.engines.nemo.driver.mx_support import mx_problems

    if info.location is None:
        return
    problems = mx_problems(recipe.config, Path(info.location).parent)
    if problems:
        raise EngineConfigError(recipe.name, f"cannot run on {info.describe()}", problems)


def prepare_run_dir(recipe: Recipe, resume: bool, overwrite: bool = False) -> Path:
    """Check the run dir (`rundir.check_owner`) and resume vs existing checkpoints, clear the old
    run on --overwrite, then write recipe.yaml and the hand-off config."""
    run_dir = Path(recipe.run_dir)
    try:
        rundir.check_owner(run_dir, recipe.config, resume=resume, overwrite=overwrite)
    except rundir.RunDirError as exc:
        raise EngineConfigError(exc.where, exc.what, fix=exc.fix) from exc
    outputs.check_hand_set(recipe, resume=resume, overwrite=overwrite)  # the user's folders
    ckpt = Path(recipe.config["checkpointing"]["checkpoint_dir"])
    existing = sorted(ckpt.glob("step_*")) if ckpt.is_dir() else []
    if existing and not resume and not overwrite:
        raise EngineConfigError(
            str(ckpt),
            f"already holds checkpoints ({existing[-1].name})",
            fix="pass --resume to continue that run, --overwrite to start it over, or --run-dir "
            "to start a new one",
        )
    if resume and not existing:
        raise EngineConfigError(
            "--resume",
            f"given but {ckpt} holds no step_* checkpoint",
            fix="drop --resume to start the run, or pass the run dir that holds its checkpoints",
        )
    if overwrite and not resume:
        _clear_outputs(recipe, ckpt, existing)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write(run_dir / "recipe.yaml", recipe.to_yaml())
    write_handoff(recipe, run_dir)
    return run_dir


def write_environment(
    run_dir: Path,
    info: compat.NemoRLInfo,
    where: str,
    seconds: dict[str, float] | None = None,
    served: dict[str, Any] | None = None,
) -> None:
    """environment.json: versions, host, engine, where the run was placed (`where`: `cpu` for
    NeMo RL's loop on this machine, `gpu`), which NeMo RL ran (version, folder, and its
    tree's commit and source digest, `served_by.tree_revision`), which generator served
    (`served`, once the hand-off decided it), and (once known) the seconds of each stage of
    the run (`seconds`: the hand-off (on the CPU loop: the model and its warm-up), Ray's start,
    tokenizer and data, NeMo RL's setup and training, total), as the embedded engine records them."""
    from nemo_fp8_rl.engines.nemo.driver.served_by import tree_revision

    extra: dict[str, Any] = {
        "nemo_rl": info.version,
        "nemo_rl_location": info.location,
        "nemo_rl_tree": tree_revision(info.location),
    }
    if served is not None:
        extra["generator"] = served
    if seconds is not None:
        extra["seconds"] = seconds
    rundir.write_environment(run_dir, "nemo", extra, placement=where)


def _call_with_supported(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `fn` with only the keyword arguments its signature has (they differ across versions)."""
    params = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


@dataclass
class _Prepared:
    master_config: Any
    tokenizer: Any
    data: tuple[Any, Any, Any, Any]
    seconds: dict[str, float]  # per stage (`write_environment`)


def _prepare_nemo(recipe: Recipe, platform: Platform) -> _Prepared:
    """MasterConfig, Ray, tokenizer, generation config and data, as `run_grpo.py` does, with
    the hand-off and the Ray cluster of `platform` (a changed hand-off is written to the run dir)."""
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.data.utils import setup_response_data
    from nemo_rl.models.generation import configure_generation_config

    t0 = time.perf_counter()
    handed = to_nemo_config(recipe)
    placed = platform.handoff(handed, Path(recipe.run_dir))
    if placed != handed:
        write_handoff(recipe, Path(recipe.run_dir), placed)
    config = validate_with_nemo_rl(placed)
    t_handoff = time.perf_counter()
    platform.start_ray(recipe.config)
    t_ray = time.perf_counter()
    tokenizer = get_tokenizer(config.policy["tokenizer"])
    megatron_cfg = config.policy.get("megatron_cfg") or {}
    config.policy["generation"] = _call_with_supported(
        configure_generation_config,
        config.policy["generation"],
        tokenizer,
        has_refit_draft_weights=bool((config.policy.get("draft") or {}).get("enabled")),
        trains_mtp=bool(megatron_cfg.get("mtp_num_layers")),
    )
    data = setup_response_data(tokenizer, config.data, config.env)
    seconds = {
        "handoff": t_handoff - t0,
        "ray_start": t_ray - t_handoff,
        "tokenizer_and_data": time.perf_counter() - t_ray,
    }
    return _Prepared(config, tokenizer, data, seconds)


def _clear_outputs(recipe: Recipe, ckpt: Path, existing: list[Path]) -> None:
    """--overwrite: remove the run's logs and checkpoints where they are ours to delete
    (`runs.outputs.ours_to_delete`: derived from the run dir). A path set by hand (a NeMo RL
    config's `checkpoint_dir`, `log_dir`) is the user's and is never removed: NeMo RL writes
    each run to a new `exp_N` there, and `check_hand_set` refused one holding checkpoints."""
    mine = outputs.hand_set_paths(recipe)
    derived = [p for p in (ckpt, Path(recipe.config["logger"]["log_dir"])) if p not in mine]
    kept = outputs.remove_ours(derived, recipe.run_dir, mine)
    if kept:
        print(f"note: {recipe.run_dir}: {outputs.kept_note(kept)}", file=sys.stderr)


def checkpoint_step(path: str | Path | None) -> int:
    """The step of NeMo RL's checkpoint folder `step_<N>` (0: none, the run starts over)."""
    name = Path(path).name if path else ""
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else 0


def _total_steps(state: Any) -> int:
    """NeMo RL's saved step count (a dataclass at 7ea279a, a TypedDict in v0.7.0)."""
    if isinstance(state, dict):
        return int(state.get("total_steps", 0))
    return int(getattr(state, "total_steps", 0))


def build_loss(recipe: Recipe, checkpoint_path: str | None) -> NemoCalibratedLoss:
    """The project's loss from the recipe's `loss_fn` section, calibrator restored if saved."""
    cfg = recipe.config
    megatron = cfg["policy"].get("megatron_cfg") or {}  # as NeMo RL's setup() decides it
    fused = bool(megatron.get("enabled") and megatron.get("use_fused_linear_logprobs"))
    loss_fn = NemoCalibratedLoss(recipe.section("loss_fn"), use_fused_linear_logprobs=fused)
    if loss_fn.calibrator is not None:
        rollout = cfg["grpo"]["num_prompts_per_step"] * cfg["grpo"]["num_generations_per_prompt"]
        loss_fn.calibrator.set_updates_per_step(
            max(1, rollout // cfg["policy"]["train_global_batch_size"])
        )
        if load_calibrator_state(loss_fn.calibrator, checkpoint_path):
            print(
                f"calibrator state restored from {checkpoint_path}: bounds {loss_fn.calibrator.bounds}"
            )
    return loss_fn


def _wrap_policy(policy: Any, loss_fn: NemoCalibratedLoss, recipe: Recipe, state: Any) -> Any:
    """`ShadowPolicy` around NeMo RL's policy (shadow passes only when calibrating).

    Without calibration the worker controls are never called (no calibration step), so the
    plain `MegatronPolicyWorker` is enough; the wrapper still adds the per-sign clip fractions.
    """
    from nemo_fp8_rl.engines.nemo.driver.shadow import (
        ShadowPolicy,
        worker_precision_switch,
        worker_schedule_hold,
    )

    return ShadowPolicy(
        policy,
        loss_fn,
        start_step=_total_steps(state),
        global_batch_size=recipe.config["policy"]["train_global_batch_size"],
        switch=worker_precision_switch(policy),
        hold_schedule=worker_schedule_hold(policy),
    )


@contextlib.contextmanager
def _located_faults(recipe: Recipe, *owners: Any) -> Iterator[None]:
    """A worker's death or exception inside NeMo RL as one located error (`worker_faults`),
    naming the actor of `owners`' worker groups that died, when one did."""
    try:
        yield
    except Exception as exc:
        dead = worker_faults.dead_workers(owners) if worker_faults.is_fault(exc) else []
        fault = worker_faults.located(
            exc,
            recipe.name,
            recipe.config["checkpointing"]["checkpoint_dir"],
            train_command(recipe, "nemo"),
            train_command(recipe, "nemo", "--overwrite"),
            dead,
        )
        if fault is None:
            raise
        raise fault from exc


def _train(recipe: Recipe, run_dir: Path, prepared: _Prepared, platform: Platform) -> None:
    """NeMo RL `setup` with `platform`'s workers, the substitutions, then `grpo_train`; shuts
    generation down at the end."""
    from nemo_rl.algorithms import grpo

    calibrated = bool(recipe.config["loss_fn"].get("calibration", {}).get("enabled"))
    quantize_on = recipe.config.get("refit", {}).get("quantize_on", "generator")
    dataset, val_dataset, task_to_env, val_task_to_env = prepared.data
    with platform.generation_workers(quantize_on), _located_faults(recipe):
        setup = grpo.setup(
            prepared.master_config,
            prepared.tokenizer,
            dataset,
            val_dataset,
            policy_factory=platform.policy_factory(calibrated, quantize_on),
        )
    (
        policy,
        policy_generation,
        _gym,
        _clusters,
        dataloader,
        val_dataloader,
        _nemo_loss,
        logger,
        checkpointer,
        grpo_state,
        master_config,
        *_rest,
    ) = setup
    latest = checkpointer.get_latest_checkpoint_path()
    loss_fn = build_loss(recipe, latest)
    train_policy = _wrap_policy(policy, loss_fn, recipe, grpo_state)
    jsonl = run_dir / "metrics.jsonl"
    keep_completed_rows(jsonl, checkpoint_step(latest))  # the steps after it train again
    resume = train_command(recipe, "nemo")
    stop = (
        BreachStop(recipe.config, recipe.name, resume)
        if on_breach(recipe.config) == "stop"
        else None
    )
    logger = MetricsTee(logger, jsonl, health_monitor(recipe.config, jsonl), stop)
    # the vLLM config NeMo RL runs with: the platform's hand-off may keep more layers BF16
    # (the CPU loop on real vLLM: the fused parts that are not whole FP8 blocks)
    vllm_cfg = prepared.master_config.policy["generation"]["vllm_cfg"]
    try:
        with (
            _located_faults(recipe, policy_generation, policy),
            checkpointer if hasattr(checkpointer, "__enter__") else contextlib.nullcontext(),
            served_guard(grpo, vllm_cfg, policy_generation),
        ):
            training_loop(grpo, recipe.config, setup)(
                train_policy,
                policy_generation,
                dataloader,
                val_dataloader,
                prepared.tokenizer,
                loss_fn,
                task_to_env,
                val_task_to_env,
                logger,
                checkpointer,
                grpo_state,
                master_config,
            )
        logger.finish()  # a row logged after the last finished step
    finally:
        shutdown = getattr(grpo, "shutdown_environments", None)
        if shutdown is not None:
            shutdown(task_to_env, val_task_to_env)
        worker_faults.shut_down_workers(policy_generation, policy)


def run(
    recipe: Recipe,
    *,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Run `recipe` on NeMo RL (GRPO, Megatron-Core policy, vLLM generation); returns the run dir.

    A CPU recipe runs NeMo RL's loop on this machine (`platform_for`), trained on the tiny kit's
    hand-over (`tiny.handover.prepare`), written once the run dir is set up.
    Raises EngineConfigError (recipe problems, all listed) or RuntimeError (no supported NeMo
    RL) before anything is started, and `lock.RunDirBusy` while another process trains in the
    run dir (the lock is held until this returns). `progress` is accepted for symmetry with
    the embedded engine; NeMo RL prints its own progress.
    """
    platform = platform_for(recipe.config, resume)
    problems = check_recipe(recipe, platform)
    if problems:
        raise EngineConfigError(recipe.name, "cannot run on the NeMo RL engine", problems)
    locked = Path(recipe.run_dir).resolve()
    lock.hold(locked)  # one training process per run dir, as on the embedded engine
    try:
        platform.set_environment()  # before NeMo RL is imported
        info = compat.require_supported()
        _refuse_mx_problems(recipe, info)
        run_dir = prepare_run_dir(recipe, resume, overwrite)
        write_environment(run_dir, info, placement(recipe.config))
        export_package_path(run_dir)
        print(f"{info.describe()}; run dir {run_dir}", flush=True)
        t0 = time.perf_counter()
        prepared = _prepare_nemo(recipe, platform)
        write_environment(run_dir, info, placement(recipe.config), served=platform.served())
        t_prepared = time.perf_counter()
        _train(recipe, run_dir, prepared, platform)
        end = time.perf_counter()
        seconds = {**prepared.seconds, "setup_and_training": end - t_prepared, "total": end - t0}
        write_environment(run_dir, info, placement(recipe.config), seconds, platform.served())
    finally:
        platform.stop_ray()
        lock.release(locked)
    return run_dir
