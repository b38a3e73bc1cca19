"""Schemas of the config sections this project owns (NeMo RL does not read them).

`loss_fn.calibration` (Calibrated Clipping), `local` (the embedded CPU engine), `refit` (the
weight-refit bridge) and `slurm` (submission). NeMo RL's own sections are checked against the
complete base config instead (see `nemo_fp8_rl.config.schema`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AblationConfig(_Section):
    """Labelled ablations of the loss, for link-by-link experiments (none of them is FP8).

    `negative_gradient_drop_q`: each valid negative-advantage token, independently with
    probability q, gets exactly the lower clip's zero gradient (its PPO term is kept in the loss
    value and the token count, detached), whatever its ratio. It isolates the one link from
    clipped A<0 tokens to the symptoms, in any precision: q = 0 is the unmodified loss, q = 1
    removes every negative gradient. Drawn from the trainer's torch generator (checkpointed).
    """

    negative_gradient_drop_q: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of A<0 tokens given the lower clip's zero gradient at random",
    )


class CalibrationConfig(_Section):
    """Calibrated Clipping: clip bounds re-derived from BF16 shadow passes every `interval` steps.

    Bounds are (L, H) on the ratio itself; nominal ones come from NeMo RL's
    `ratio_clip_min`/`ratio_clip_max` as L0 = 1 - ratio_clip_min, H0 = 1 + ratio_clip_max.
    """

    enabled: bool = False
    interval: int = Field(
        20, ge=1, description="K: calibrate at steps k with k % K == start_step % K"
    )
    start_step: int = Field(0, ge=0)
    mode: Literal["in_loop", "end_of_step"] = "in_loop"
    rho_mode: Literal["active_mass", "surrogate_value"] = "active_mass"
    smoothing: float = Field(0.5, gt=0.0, le=1.0, description="beta: EMA weight of the new target")
    max_step_low: float = Field(
        0.05, gt=0.0, description="delta_L: max change of L per calibration"
    )
    max_step_high: float = Field(
        0.10, gt=0.0, description="delta_H: max change of H per calibration"
    )
    low_floor: float = Field(0.5, gt=0.0, lt=1.0)
    high_max: float = Field(2.0, gt=1.0)
    allow_tighten: bool = False
    high_below_nominal: bool = False
    min_tokens: int = Field(
        1024, ge=1, description="skip the update below this many tokens in N- or N+"
    )
    min_clipped_tokens: int = Field(
        16,
        ge=0,
        description="m_min: L* rests on at least this many BF16-clipped negative-advantage "
        "tokens, pooled over the latest calibration windows; the L update is weighted by "
        "min(1, M / m_min) only while the pool holds fewer (0: one window, no weighting)",
    )
    max_pool_windows: int = Field(
        16,
        ge=1,
        description="W: the calibration windows pooled for L* (the latest W; at most W under "
        "pool_rule until_min_clipped)",
    )
    pool_rule: Literal["fixed_windows", "until_min_clipped"] = Field(
        "fixed_windows",
        description="fixed_windows: the latest max_pool_windows windows, the run's first one "
        "only while it is alone, L* matched without rank bias; until_min_clipped: the latest "
        "windows until their clipped counts reach m_min (an outcome-dependent boundary, biased; "
        "the rule of runs made before fixed_windows existed)",
    )
    rho_tolerance: float = Field(
        0.005,
        ge=0.0,
        lt=1.0,
        description="tau: H* is the smallest H with rho >= (1 - tau) x the best reachable rho",
    )
    init_bounds: tuple[float, float] | None = None
    log_ratio_clamp: float = Field(20.0, gt=0.0)

    @model_validator(mode="after")
    def _init_inside(self) -> CalibrationConfig:
        if self.init_bounds is not None:
            low, high = self.init_bounds
            if not (0.0 < low < 1.0 < high):
                raise ValueError(f"init_bounds must satisfy 0 < L < 1 < H, got [{low}, {high}]")
        return self


class TinyModelConfig(_Section):
    """Architecture of the embedded engine's tiny causal LM (a real transformers model)."""

    arch: Literal["qwen3", "llama"] = "qwen3"
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=8)
    max_position_embeddings: int = Field(64, ge=8)
    tie_word_embeddings: bool = True

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")
        return self


class TaskConfig(_Section):
    """Synthetic verifiable task: n-digit addition with exact-match reward."""

    name: Literal["addition"] = "addition"
    digits: int = Field(2, ge=1, le=6)
    num_validation: int = Field(256, ge=1)
    train_seed: int = Field(1, ge=0, lt=2**32)
    validation_seed: int = Field(1234, ge=0, lt=2**32)


class WarmupConfig(_Section):
    """Supervised warm-up so GRPO starts from a policy that sometimes succeeds (cached per config).

    With `target_accuracy: [lo, hi]` the warm-up runs until the greedy exact-match accuracy on a
    held-out warm-up set (`eval_size` problems, distinct from the validation split) first reaches
    `lo`, checked every `eval_every` steps, and fails with a clear error if `max_steps` pass
    first or the accuracy jumps past `hi` between two checks. Without it, exactly `steps` steps
    run. The tiny Qwen3 goes through a sharp phase transition on two-digit addition (about 0.07
    greedy accuracy at 250 steps, 0.38 at 350 for seed 1, later for some seeds), which a fixed
    count can land on either side of; the band puts every seed past it.
    """

    steps: int = Field(350, ge=0, description="fixed step count, used without target_accuracy")
    batch_size: int = Field(128, ge=1)
    lr: float = Field(2.0e-3, gt=0.0)
    target_accuracy: tuple[float, float] | None = Field(
        None, description="[lo, hi]: stop at the first check with lo <= accuracy (<= hi)"
    )
    max_steps: int = Field(2000, ge=1, description="give up (an error) after this many steps")
    eval_every: int = Field(25, ge=1, description="steps between accuracy checks")
    eval_size: int = Field(256, ge=1, description="held-out problems per accuracy check")

    @model_validator(mode="after")
    def _band(self) -> WarmupConfig:
        if self.target_accuracy is not None:
            lo, hi = self.target_accuracy
            if not (0.0 < lo <= hi <= 1.0):
                raise ValueError(
                    f"target_accuracy must satisfy 0 < lo <= hi <= 1, got [{lo}, {hi}]"
                )
        return self


class LocalConfig(_Section):
    """The embedded CPU engine (`cluster.gpus_per_node: 0`)."""

    num_threads: int = Field(1, ge=1)
    fp4: Literal["nvfp4", "mxfp4"] | None = Field(
        None,
        description="emulate a 4-bit format (W4A4, straight-through gradients) in training and "
        "rollout instead of FP8; this engine only (configs/precision/nvfp4-cpu.yaml)",
    )
    fp4_activation_scale: Literal["tensor", "token"] = Field(
        "tensor",
        description="NVFP4 activations' FP32 second-level scale: one per tensor (Transformer "
        "Engine's NVFP4BlockScaling) or one per token (row)",
    )
    fp4_four_over_six: bool = Field(
        False,
        description="NVFP4 '4/6' adaptive block scaling: each 16-value block scaled to 4 or "
        "to 6, whichever gives the smaller squared error (weights and activations, both sides)",
    )
    model: TinyModelConfig = TinyModelConfig()
    task: TaskConfig = TaskConfig()
    warmup: WarmupConfig = WarmupConfig()
    progress: bool = True

    @model_validator(mode="after")
    def _nvfp4_variants(self) -> LocalConfig:
        variant = self.fp4_activation_scale != "tensor" or self.fp4_four_over_six
        if variant and self.fp4 != "nvfp4":
            raise ValueError(
                "fp4_activation_scale: token and fp4_four_over_six are NVFP4 variants: set "
                "local.fp4: nvfp4, or leave them at tensor / false"
            )
        return self


class RefitConfig(_Section):
    """How trainer weights reach the generation engine each step."""

    bridge: Literal["nemo", "project"] = "nemo"
    bucket_size_mb: int = Field(256, ge=1)
    verify: bool = True
    quantize_on: Literal["generator", "trainer"] = Field(
        "generator",
        description="NeMo RL engine, FP8 rollout: where FP8 weights are quantized at refit. "
        "generator: NeMo RL's vLLM worker quantizes the BF16 weights it receives; trainer: the "
        "Megatron worker sends (E4M3, scale_inv) pairs that vLLM loads as they are",
    )
    precision_split: bool = Field(
        False,
        description="true: training and generation run in different precisions on purpose "
        "(FP8 generation over BF16 training, NeMo RL's FP8-rollout setting); an undeclared "
        "split is refused (config/split_rules.py)",
    )


HEALTH_TABLE = Path(__file__).resolve().parents[1] / "guards" / "health_ranges.yaml"


def median_metrics() -> set[str]:
    """The metrics the committed health table judges by their median (`guards.health`)."""
    raw = yaml.safe_load(HEALTH_TABLE.read_text(encoding="utf-8"))
    return {r["metric"] for r in raw["rules"] if r["statistic"] == "median"}


class HealthConfig(_Section):
    """What a run does when its train/generation mismatch leaves its healthy range for K steps
    (`guards.health`): `warn` prints the line and records the event; `stop` also saves a
    checkpoint and ends the run with the error that names the metric, its statistic, the range,
    its source and the command that resumes. `limits` replaces the published median limit of a
    metric for this recipe (its source then reads "this recipe's health.limits")."""

    on_breach: Literal["warn", "stop"] = "warn"
    limits: dict[str, float] = {}

    @field_validator("limits")
    @classmethod
    def _known_metrics(cls, limits: dict[str, float]) -> dict[str, float]:
        """Each metric one the health table judges by its median."""
        known = median_metrics()
        for name in limits:
            if name not in known:
                raise ValueError(
                    f"{name!r} is not judged by its median; use one of {sorted(known)}"
                )
        return limits


class SlurmConfig(_Section):
    """Defaults for `nemo_fp8_rl.submit` (flags on the command line override them)."""

    account: str | None = None
    partition: str | None = None
    gpu: str | None = Field(
        None,
        description="the workers' GPU type (H100, H200, B200, GB200): FP8 scale formats and the "
        "memory estimate are decided for it; null: read from the partition's GRES (sinfo)",
    )
    time: str = "04:00:00"
    container: str | None = None
    mounts: list[str] = []
    env: dict[str, str | int | float] = {}
    setup_command: str | None = None
    gres_per_node: str | None = Field(
        None, description="e.g. 'gpu:8'; derived from cluster.gpus_per_node when null"
    )
    extra_sbatch_args: list[str] = []
    exclusive: bool = True

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str | None) -> str | None:
        """A GPU type of `config.gpus` (any spelling it knows), stored by its canonical name."""
        from nemo_fp8_rl.config.gpus import find_gpu, unknown_gpu_fix

        if gpu is None:
            return None
        found = find_gpu(gpu)
        if found is None:
            raise ValueError(f"unknown GPU type {gpu!r}; {unknown_gpu_fix(gpu)}")
        return found.name

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, env: object) -> object:
        """Numbers are written as strings (`OMP_NUM_THREADS: 8`); booleans and nested values are
        refused, since `true` would become the string `True`."""
        if isinstance(env, dict):
            for name, value in env.items():
                if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                    raise ValueError(
                        f"slurm.env.{name}: {value!r} is not a string or number; quote it, "
                        f"e.g. {name}: '{str(value).lower()}'"
                    )
        return env
