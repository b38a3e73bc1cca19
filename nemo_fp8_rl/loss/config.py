"""`loss_fn` settings: NeMo RL's `ClippedPGLossConfig` keys plus the project's `calibration`.

Also NeMo RL's loss enums (its own when `nemo_rl` is importable, same-valued copies otherwise).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_fp8_rl.config.project import AblationConfig, CalibrationConfig


class _LossType(enum.Enum):
    """Same members and values as `nemo_rl.algorithms.loss.interfaces.LossType`."""

    TOKEN_LEVEL = "token_level"
    SEQUENCE_LEVEL = "sequence_level"


class _LossInputType(enum.Enum):
    """Same members and values as NeMo RL's `LossInputType`."""

    LOGIT = "logit"
    LOGPROB = "logprob"
    DISTILLATION = "distillation"
    DISTILLATION_CROSS_TOKENIZER = "distillation_cross_tokenizer"
    DRAFT = "draft"


class _MetricNormalizer(enum.Enum):
    """Same members and values as NeMo RL's `MetricNormalizer` (absent before v0.8 sources)."""

    TOKENS = "tokens"
    SEQUENCES = "sequences"
    NONE = "none"


def _nemo_rl_enum(name: str, fallback: type[enum.Enum]) -> type[enum.Enum]:
    """NeMo RL's own enum when importable (its trainers compare by identity), else the copy.

    Each enum is looked up on its own: NeMo RL v0.7.0 has `LossType`/`LossInputType` but no
    `MetricNormalizer`, and must still receive its own `LossInputType`.
    """
    try:
        from nemo_rl.algorithms.loss import interfaces
    except ImportError:
        return fallback
    return getattr(interfaces, name, fallback)


LossType = _nemo_rl_enum("LossType", _LossType)
LossInputType = _nemo_rl_enum("LossInputType", _LossInputType)
MetricNormalizer = _nemo_rl_enum("MetricNormalizer", _MetricNormalizer)


_TIS_TYPES = ("tis", "icepop", "seq-mask-tis")


@dataclass(frozen=True)
class PGLossConfig:
    """NeMo RL `ClippedPGLossConfig` keys (same names and defaults) plus `calibration`."""

    disable_ppo_ratio: bool = False
    token_level_loss: bool = True
    sequence_level_importance_ratios: bool = False
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    ratio_clip_c: float | None = None
    reference_policy_kl_penalty: float = 0.01
    reference_policy_kl_type: str = "k3"
    kl_input_clamp_value: float | None = 20.0
    kl_output_clamp_value: float | None = 10.0
    use_kl_in_reward: bool = False
    use_importance_sampling_correction: bool = False
    truncated_importance_sampling_type: str | None = None
    truncated_importance_sampling_ratio: float | None = None
    truncated_importance_sampling_ratio_min: float | None = None
    use_on_policy_kl_approximation: bool = False
    force_on_policy_ratio: bool = False
    use_cispo: bool = False
    positive_example_nll_weight: float = 0.0
    calibration: CalibrationConfig = CalibrationConfig()
    ablation: AblationConfig = AblationConfig()

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | Any) -> PGLossConfig:
        """Build from a `loss_fn` dict (or a pydantic model); unknown keys are an error."""
        raw = dict(cfg.model_dump() if hasattr(cfg, "model_dump") else cfg)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"loss_fn: unknown key(s) {unknown}; known keys: {sorted(known)}")
        cal = raw.get("calibration")
        if cal is not None and not isinstance(cal, CalibrationConfig):
            raw["calibration"] = CalibrationConfig(**dict(cal))
        elif cal is None:
            raw.pop("calibration", None)
        abl = raw.get("ablation")
        if abl is not None and not isinstance(abl, AblationConfig):
            raw["ablation"] = AblationConfig(**dict(abl))
        elif abl is None:
            raw.pop("ablation", None)
        out = cls(**raw)
        out.validate()
        return out

    def validate(self) -> None:
        """NeMo RL's constructor checks, as errors naming the key and the fix, plus calibration's."""
        errors = []
        if self.ratio_clip_c is not None and self.ratio_clip_c <= 1:
            errors.append(
                f"ratio_clip_c must be > 1 (typically 3) or null, got {self.ratio_clip_c}"
            )
        if self.reference_policy_kl_type not in ("k1", "k2", "k3"):
            errors.append(
                f"reference_policy_kl_type must be k1, k2 or k3, got {self.reference_policy_kl_type!r}"
            )
        if self.sequence_level_importance_ratios and self.token_level_loss:
            errors.append(
                "sequence_level_importance_ratios (GSPO) requires token_level_loss: false"
            )
        if self.use_cispo:
            for key in (
                "disable_ppo_ratio",
                "force_on_policy_ratio",
                "sequence_level_importance_ratios",
            ):
                if getattr(self, key):
                    errors.append(f"use_cispo is incompatible with {key}: set one of them false")
            if self.ratio_clip_c is not None:
                errors.append("use_cispo is incompatible with ratio_clip_c: set ratio_clip_c: null")
            if not self.token_level_loss:
                errors.append("use_cispo requires token_level_loss: true")
        errors += self._tis_errors() + self._calibration_errors()
        if errors:
            raise ValueError("invalid loss_fn config:\n  - " + "\n  - ".join(errors))

    def _tis_errors(self) -> list[str]:
        kind, hi, lo = (
            self.truncated_importance_sampling_type,
            self.truncated_importance_sampling_ratio,
            self.truncated_importance_sampling_ratio_min,
        )
        if kind is None:
            return []
        errors = []
        if kind not in _TIS_TYPES:
            errors.append(
                f"truncated_importance_sampling_type must be one of {_TIS_TYPES} or null, got {kind!r}"
            )
        if not self.use_importance_sampling_correction:
            errors.append(
                "truncated_importance_sampling_type needs use_importance_sampling_correction: true"
            )
        if hi is None or hi <= 0:
            errors.append(
                f"truncated_importance_sampling_ratio must be > 0 when a TIS type is set, got {hi}"
            )
        elif lo is not None and lo > hi:
            errors.append(
                f"truncated_importance_sampling_ratio_min ({lo}) must be <= truncated_importance_sampling_ratio ({hi})"
            )
        if kind in ("icepop", "seq-mask-tis") and lo is None:
            errors.append(f"truncated_importance_sampling_ratio_min must be set for {kind!r}")
        if kind == "seq-mask-tis" and self.sequence_level_importance_ratios:
            errors.append(
                "seq-mask-tis is incompatible with sequence_level_importance_ratios: true"
            )
        return errors

    def _calibration_errors(self) -> list[str]:
        if not self.calibration.enabled:
            return []
        clash = [
            k
            for k in (
                "sequence_level_importance_ratios",
                "use_cispo",
                "disable_ppo_ratio",
                "force_on_policy_ratio",
            )
            if getattr(self, k)
        ]
        return [
            f"calibration.enabled needs token-level PPO ratio clipping; {k}: true disables it "
            f"(set it false or calibration.enabled: false)"
            for k in clash
        ]
