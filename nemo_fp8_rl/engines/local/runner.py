"""The embedded engine's driver: warm-up, Ray actors, the GRPO loop, metrics, checkpoints.

Per step k (0-based; metrics are logged at step k+1, the number of completed steps):
prompts of step k -> rollout actor samples `num_generations_per_prompt` responses each ->
exact-match rewards -> GRPO advantages -> trainer actor runs the step -> refit (trainer
masters -> FP8 buckets -> rollout engine) -> validation every `val_period` steps (BF16
generation, plus the rollout engine's own precision when that is FP8) ->
metrics, progress bar, checkpoint every `save_period` steps. All randomness is a function of
(seed, step), and the trainer's state is checkpointed, so `--resume` reproduces an
uninterrupted run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import ray
import torch

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.project import LocalConfig
from nemo_fp8_rl.engines.local import bf16_scoring, faults, precision
from nemo_fp8_rl.engines.local import checkpoint as ckpt
from nemo_fp8_rl.engines.local.actors import make_actors
from nemo_fp8_rl.engines.local.advantages import grpo_advantages
from nemo_fp8_rl.engines.local.backends import open_sinks
from nemo_fp8_rl.engines.local.batch import build_batch, num_tokens
from nemo_fp8_rl.engines.local.metrics import MetricsLogger, ProgressBar, read_metrics
from nemo_fp8_rl.engines.local.recipe_checks import refuse_hand_set_paths as refuse_hand_set_paths
from nemo_fp8_rl.guards.breach import HealthBreach, breach_error, health_table, on_breach
from nemo_fp8_rl.guards.health import HealthEvent, HealthMonitor, precision_of
from nemo_fp8_rl.guards.served import ServedCounts, check_served
from nemo_fp8_rl.runs import lock, rundir
from nemo_fp8_rl.runs.ray_start import start_ray
from nemo_fp8_rl.tiny.model import build_model, quiet_transformers, save_checkpoint
from nemo_fp8_rl.tiny.task import exact_match_reward, train_problems
from nemo_fp8_rl.tiny.tokenizer import build_tokenizer
from nemo_fp8_rl.tiny.warmup import warm_start


def _sampling_seed(seed: int, step: int) -> int:
    """Seed of the rollout sampler at GRPO step `step` (validation uses `step` = -1 - k)."""
    return (seed * 1_000_003 + step * 7_919) % (2**63 - 1)


def prepare_model(recipe: Recipe, run_dir: Path, local: LocalConfig) -> dict[str, Any]:
    """Build the tiny model from the recipe seed, warm-start it, save it as `run_dir/model`."""
    tokenizer = build_tokenizer()
    seed = recipe.config["grpo"]["seed"]
    model = build_model(local.model, tokenizer, seed)
    t0 = time.perf_counter()
    info = warm_start(model, tokenizer, local, seed)
    info["seconds"] = time.perf_counter() - t0
    save_checkpoint(model, tokenizer, run_dir / "model")
    return info


def warmup_metrics(info: dict[str, Any] | None) -> dict[str, float]:
    """Step-0 metrics of the warm-up: `warmup/steps` and, for a band warm-up, `warmup/accuracy`."""
    if not info:
        return {}
    out = {"warmup/steps": float(info["steps"])} if info.get("steps") is not None else {}
    if info.get("accuracy") is not None:
        out["warmup/accuracy"] = float(info["accuracy"])
    return out


class Loop:
    """One run of the GRPO loop against a trainer and a rollout actor."""

    def __init__(self, recipe: Recipe, run_dir: Path, trainer: Any, rollout: Any) -> None:
        """Read the loop's settings from the recipe."""
        cfg = recipe.config
        self.cfg, self.run_dir = cfg, run_dir
        self.name, self.path = recipe.name, getattr(recipe, "path", None) or recipe.name
        self.trainer, self.rollout = trainer, rollout
        grpo = cfg["grpo"]
        self.seed, self.steps = grpo["seed"], grpo["max_num_steps"]
        self.prompts, self.group = grpo["num_prompts_per_step"], grpo["num_generations_per_prompt"]
        self.local = LocalConfig(**cfg["local"])
        self.ckpt_cfg = cfg["checkpointing"]
        self.ckpt_root = run_dir / "checkpoints"
        self.last_val: float | None = None
        self.last_rollout_val: float | None = None
        self.start_metrics: dict[str, float] = {}
        self.refits = 0

    # ---- pieces ----------------------------------------------------------------------------
    def refit(self) -> float:
        """Send the trainer's weights through the refit bridge to the rollout engine, then check
        the precision each layer is served in (`guards.served`); seconds."""
        t0 = time.perf_counter()
        ray.get(self.rollout.apply_refit.remote(self.trainer.refit_buckets.remote()))
        seconds = time.perf_counter() - t0
        self.refits += 1
        served = ServedCounts.from_dict(ray.get(self.rollout.served_precision.remote()))
        when = "step 0" if self.refits == 1 else f"after refit {self.refits - 1}"
        vllm_cfg = self.cfg["policy"]["generation"]["vllm_cfg"]
        lines = check_served([served], vllm_cfg, when, (self.cfg.get("local") or {}).get("fp4"))
        if self.refits == 1:
            say(f"served-precision ({when}): {lines[0]}")
        return seconds

    def validate(self, step: int) -> dict[str, float]:
        """Validation scores of the current weights: with BF16 generation (the primary score,
        `bf16_scoring.BF16_ACCURACY`) and with the rollout engine's own precision."""
        seed = _sampling_seed(self.seed, -1 - step)
        out = ray.get(self.rollout.validate.remote(seed))
        if bf16_scoring.generation_is_bf16(self.cfg):
            out.update(bf16_scoring.as_bf16_scores(out))
        else:
            refit = self.trainer.bf16_refit_buckets.remote()
            out.update(ray.get(self.rollout.validate_bf16.remote(refit, seed)))
        self.last_val = out[bf16_scoring.BF16_ACCURACY]
        self.last_rollout_val = out[bf16_scoring.ROLLOUT_ACCURACY]
        return out

    def rollout_batch(self, step: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Sample the step's responses, score them, and build the training batch."""
        problems = train_problems(self.local.task, step, self.prompts)
        prompts = [p for p in problems.prompts for _ in range(self.group)]
        answers = [a for a in problems.answers for _ in range(self.group)]
        ids, mask, gen, texts = ray.get(
            self.rollout.generate.remote(prompts, _sampling_seed(self.seed, step))
        )
        rewards = exact_match_reward(texts, answers)
        grpo = self.cfg["grpo"]
        adv = grpo_advantages(
            rewards,
            self.group,
            leave_one_out=grpo["use_leave_one_out_baseline"],
            normalize=grpo["normalize_rewards"],
        )
        mixed = (rewards.view(-1, self.group).std(1) > 0).float().mean()
        stats = {
            "train/reward": float(rewards.mean()),
            "train/mixed_group_frac": float(mixed),
            "train/mean_response_length": float(gen.mask.sum(1).mean()),
        }
        return build_batch(ids, mask, gen, adv), stats

    def step(self, k: int) -> dict[str, float]:
        """GRPO step k (0-based): rollout, train, refit, maybe validate."""
        t0 = time.perf_counter()
        batch, metrics = self.rollout_batch(k)
        t_gen = time.perf_counter() - t0
        metrics.update(ray.get(self.trainer.train_step.remote(batch, k)))
        metrics["timing/train/refit"] = self.refit()
        metrics["timing/train/generate"] = t_gen
        total = time.perf_counter() - t0
        metrics["timing/train/total_step_time"] = total
        metrics["throughput/tokens_per_sec"] = num_tokens(batch) / total
        # The machine's 1-minute load average: `compare` judges speed only between runs that
        # ran at a comparable load (on a shared CPU the step time measures the load).
        metrics["system/load_average_1min"] = os.getloadavg()[0]
        done = k + 1
        period = self.cfg["grpo"]["val_period"]
        if (period and done % period == 0) or (
            done == self.steps and self.cfg["grpo"]["val_at_end"]
        ):
            t1 = time.perf_counter()
            metrics.update(self.validate(done))
            metrics["timing/validation/total_validation_time"] = time.perf_counter() - t1
        return metrics

    def save(self, done: int) -> None:
        """Atomic checkpoint after `done` completed steps, then prune to `keep_top_k`."""
        state = {"trainer": ray.get(self.trainer.state_dict.remote()), "rng": torch.get_rng_state()}
        info = {
            bf16_scoring.BF16_ACCURACY: self.last_val,
            bf16_scoring.ROLLOUT_ACCURACY: self.last_rollout_val,
            "recipe": self.cfg["logger"]["wandb"]["name"],
        }
        ckpt.save_checkpoint(self.ckpt_root, done, state, info)
        ckpt.prune_checkpoints(
            self.ckpt_root, self.ckpt_cfg.get("keep_top_k"), bf16_scoring.BF16_ACCURACY
        )

    def resume(self, path: Path) -> int:
        """Load the (verified) checkpoint at `path` into the trainer; returns its step count."""
        state, info = ckpt.load_checkpoint(path)
        ray.get(self.trainer.load_state_dict.remote(state["trainer"]))
        torch.set_rng_state(state["rng"])
        self.last_val = info.get(bf16_scoring.BF16_ACCURACY)
        self.last_rollout_val = info.get(bf16_scoring.ROLLOUT_ACCURACY)
        return int(info["step"])

    # ---- the run ---------------------------------------------------------------------------
    def run(self, *, resume_from: Path | None, progress: bool) -> None:
        """Run (or continue, from checkpoint `resume_from`) the loop to `grpo.max_num_steps`."""
        start = self.resume(resume_from) if resume_from is not None else 0
        self.refit()
        logger = MetricsLogger(
            self.run_dir,
            tensorboard=self.cfg["logger"]["tensorboard_enabled"],
            completed_steps=start,
            sinks=open_sinks(self.cfg, self.run_dir),
        )
        bar = ProgressBar(
            self.steps, start, enabled=progress, name=self.cfg["logger"]["wandb"]["name"]
        )
        try:
            if start == 0 and (self.start_metrics or self.cfg["grpo"]["val_at_start"]):
                first = dict(self.start_metrics)
                if self.cfg["grpo"]["val_at_start"]:
                    first.update(self.validate(0))
                logger.log(0, first)
            save_period = self.ckpt_cfg["save_period"]
            health = HealthMonitor(precision_of(self.cfg), health_table(self.cfg), engine="local")
            health.replay(read_metrics(self.run_dir))  # a resumed run's earlier steps
            for k in range(start, self.steps):
                metrics = self.step(k)
                logger.log(k + 1, metrics)
                events = health.observe(k + 1, metrics)
                for event in events:
                    say(event.line())
                    logger.log_event(event.record())
                bar.update(metrics)
                done = k + 1
                stop = events[0] if events and on_breach(self.cfg) == "stop" else None
                breached = time.perf_counter()
                periodic = done % save_period == 0 or done == self.steps
                if stop is not None or (self.ckpt_cfg["enabled"] and periodic):
                    self.save(done)
                if stop is not None:
                    raise self.breach(stop, time.perf_counter() - breached)
        finally:
            bar.close()
            logger.close()

    def breach(self, event: HealthEvent, seconds: float) -> HealthBreach:
        """The error `health.on_breach: stop` ends the run with (checkpoint already saved,
        `seconds` after the breach was found)."""
        resume = f"nemo_fp8_rl.train --recipe {self.path} --run-dir {self.run_dir} --resume"
        kept = self.ckpt_root / f"step_{event.step}"
        return breach_error(event, self.cfg, self.name, str(kept), resume, seconds)


# environment.json's `generator` of an embedded run: its own rollout actor, never vLLM
GENERATOR = {
    "backend": "embedded",
    "version": None,
    "build": "cpu",
    "reason": "the embedded engine's rollout actor (transformers; FP8 emulated by quantize-dequantize)",
}


def say(line: str) -> None:
    """A line on stdout at once (so that a start-up of a minute is never silent)."""
    print(line, flush=True)


def run(
    recipe: Recipe, *, resume: bool = False, progress: bool = True, overwrite: bool = False
) -> Path:
    """Run a CPU recipe with the embedded engine; returns the run directory.

    The recipe must have `cluster.gpus_per_node: 0`; GPU-only features are reported with the
    key to change. The run directory gets `recipe.yaml`, `environment.json`, `model/`,
    `metrics.jsonl`, `logs/tb/` and `checkpoints/`. Before anything is written the run dir is
    checked (`rundir.check_owner`: --resume continues a run of this recipe, --overwrite starts
    it over) and, on --resume, the checkpoint is verified (`checkpoint.resume_point`).
    """
    cfg = recipe.config
    precision.check_cpu_support(cfg, recipe.name)
    refuse_hand_set_paths(recipe)
    local = LocalConfig(**cfg["local"])
    torch.set_num_threads(local.num_threads)
    quiet_transformers()
    run_dir = Path(recipe.run_dir).resolve()
    rundir.check_owner(run_dir, cfg, resume=resume, overwrite=overwrite)
    lock.hold(run_dir)  # one training process per run dir, until this process ends
    try:
        return _run_locked(recipe, run_dir, local, resume, progress, overwrite)
    finally:
        lock.release(run_dir)


def _run_locked(
    recipe: Recipe,
    run_dir: Path,
    local: LocalConfig,
    resume: bool,
    progress: bool,
    overwrite: bool,
) -> Path:
    """`run` once the run dir is locked: checked again (another process may have written it
    before the lock was taken), prepared, and trained."""
    cfg = recipe.config
    rundir.check_owner(run_dir, cfg, resume=resume, overwrite=overwrite)
    resume_from = (
        ckpt.resume_point(run_dir / "checkpoints", recipe.name, cfg["grpo"]["max_num_steps"])
        if resume
        else None
    )
    rundir.prepare(
        run_dir, cfg, recipe.to_yaml(with_sources=True), resume=resume, overwrite=overwrite
    )
    t0 = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = start_ray()
    t_ray = time.perf_counter()
    try:
        trainer, rollout = make_actors(cfg, None, local.num_threads)
        model_info = None
        if not (resume and (run_dir / "model" / "config.json").exists()):
            say(f"Ray up ({t_ray - t0:.0f} s); building the tiny model and its warm-up ...")
            model_info = prepare_model(recipe, run_dir, local)
        t_model = time.perf_counter()
        say("loading the policy into the trainer and rollout actors (they import torch) ...")
        ray.get(trainer.load_policy.remote(str(run_dir / "model")))
        ray.get(rollout.ping.remote())
        say(f"actors ready ({time.perf_counter() - t0:.0f} s since the start); training")
        extra = {
            "started_at": started_at,
            "num_threads": local.num_threads,
            "warmup": model_info,
            "resume": resume,
            "generator": GENERATOR,
            "seconds": {
                "ray_start": t_ray - t0,
                "model_and_warmup": t_model - t_ray,
                "actors_ready_after_warmup": time.perf_counter() - t_model,
            },
        }
        rundir.write_environment(run_dir, "local", extra)
        loop = Loop(recipe, run_dir, trainer, rollout)
        loop.start_metrics = warmup_metrics(model_info)
        loop.run(resume_from=resume_from, progress=progress and local.progress)
        extra["seconds"]["total"] = time.perf_counter() - t0
        rundir.write_environment(run_dir, "local", extra)
    except Exception as exc:
        fault = faults.located(exc, recipe)  # an actor died or raised: located, resumable
        if fault is None:
            raise
        raise fault from exc
    finally:
        if started:
            ray.shutdown()
    return run_dir
