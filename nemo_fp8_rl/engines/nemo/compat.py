"""Which NeMo RL is installed, and whether this engine can drive it.

The engine needs four NeMo RL interfaces, all present from v0.7.0 on:

- `nemo_rl.algorithms.loss.loss_functions` with log-prob loss input (`next_token_logprobs`);
  up to v0.5 the loss received logits and the module lived elsewhere;
- `MasterConfig` as a pydantic model (v0.7.0; a `TypedDict` up to v0.6.0), which validates
  the hand-off config and is what `grpo_train` reads with attribute access;
- `setup(..., policy_factory=...)` (v0.7.0), through which the policy is built with the shadow
  worker extension;
- `Policy(..., worker_extension_cls_fqn=...)` (v0.6.0).

The version string alone cannot decide: NeMo RL's main branch reported `0.6.0` long after
v0.7.0 was tagged. So support is decided by these features, and the version is only reported.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass, field

SUPPORTED = "NeMo RL v0.7.0 and later (tested against v0.7.0's interfaces and main at 7ea279a)"
INSTALL_HINT = (
    "install this package into a NeMo RL environment: clone NVIDIA-NeMo/RL (v0.7.0 or later) with "
    "--recursive, then from its root run `uv pip install -e /path/to/nemo-fp8-rl` (or put this "
    "repository on PYTHONPATH) and launch with `uv run python -m nemo_fp8_rl.train ...`; "
    "see docs/cluster.md"
)


@dataclass(frozen=True)
class NemoRLInfo:
    """What was found: version string, source folder, and the missing interfaces (empty = supported)."""

    version: str | None
    location: str | None
    missing: tuple[str, ...] = field(default_factory=tuple)

    @property
    def supported(self) -> bool:
        return self.version is not None and not self.missing

    def describe(self) -> str:
        """One line for logs and error messages."""
        if self.version is None:
            return "NeMo RL is not importable"
        where = f" at {self.location}" if self.location else ""
        if not self.missing:
            return f"NeMo RL {self.version}{where}"
        return f"NeMo RL {self.version}{where} lacks: " + "; ".join(self.missing)


def _import(name: str):
    return importlib.import_module(name)


def _missing_features() -> list[str]:
    """Interfaces this engine uses that the importable NeMo RL lacks (imports NeMo RL modules)."""
    missing = []
    try:
        _import("nemo_rl.algorithms.loss.loss_functions")
        interfaces = _import("nemo_rl.algorithms.loss.interfaces")
        if not hasattr(interfaces.LossInputType, "LOGPROB"):
            missing.append("log-prob loss input (LossInputType.LOGPROB, v0.6.0+)")
    except ImportError as exc:
        missing.append(f"nemo_rl.algorithms.loss (v0.6.0+): {exc}")
        return missing
    grpo = _import("nemo_rl.algorithms.grpo")
    from pydantic import BaseModel

    if not (isinstance(grpo.MasterConfig, type) and issubclass(grpo.MasterConfig, BaseModel)):
        missing.append("pydantic MasterConfig (v0.7.0+)")
    if "policy_factory" not in inspect.signature(grpo.setup).parameters:
        missing.append("grpo.setup(policy_factory=...) (v0.7.0+)")
    lm_policy = _import("nemo_rl.models.policy.lm_policy")
    if "worker_extension_cls_fqn" not in inspect.signature(lm_policy.Policy).parameters:
        missing.append("Policy(worker_extension_cls_fqn=...) (v0.6.0+)")
    return missing


def detect() -> NemoRLInfo:
    """Import NeMo RL and check the interfaces the engine needs; never raises on a missing NeMo RL."""
    try:
        nemo_rl = _import("nemo_rl")
    except ImportError:
        return NemoRLInfo(version=None, location=None)
    version = str(getattr(nemo_rl, "__version__", "unknown"))
    location = str(getattr(nemo_rl, "__path__", [None])[0])
    if sys.version_info < (3, 12):
        return NemoRLInfo(version, location, ("Python >= 3.12 (NeMo RL's config classes need it)",))
    try:
        missing = _missing_features()
    except ImportError as exc:
        missing = [f"an importable nemo_rl.algorithms.grpo ({exc.__class__.__name__}: {exc})"]
    return NemoRLInfo(version, location, tuple(missing))


def available() -> tuple[bool, str]:
    """(True, description) when a supported NeMo RL imports; else (False, what is missing + how to fix)."""
    info = detect()
    if info.supported:
        return True, info.describe()
    return False, f"{info.describe()}. This engine supports {SUPPORTED}. To fix: {INSTALL_HINT}"


def require_supported() -> NemoRLInfo:
    """The detected NeMo RL, or RuntimeError naming what is missing and how to install it."""
    info = detect()
    if not info.supported:
        ok, why = available()
        raise RuntimeError(why)
    return info
