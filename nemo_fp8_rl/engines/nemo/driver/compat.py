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

import ast
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED = "NeMo RL v0.7.0 and later (tested against v0.7.0's interfaces and main at 7ea279a)"
INSTALL_HINT = (
    "run it in NeMo RL's environment: on this machine (CPU), `bash scripts/nemo-rl-env.sh "
    "<NeMo RL tree> -- python -m nemo_fp8_rl.train ...` builds it once from a NeMo RL source tree "
    "(git clone -b v0.7.0 https://github.com/NVIDIA-NeMo/RL.git ../nemo-rl, or offline an "
    "unpacked ../shared/vendor/nemo-rl-*.tar.gz); on a cluster, NVIDIA's nemo-rl container or a "
    "NeMo RL checkout set up with uv, with this repository on PYTHONPATH; see docs/cluster.md"
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


def _tree(path: Path) -> ast.Module | None:
    return ast.parse(path.read_text()) if path.is_file() else None


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    nodes = [n for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef)]
    return next((n for n in nodes if n.name == name), None)


def _params(node: ast.AST | None, name: str) -> set[str]:
    """Argument names of function `name` directly inside `node` (a module or class)."""
    for item in getattr(node, "body", []):
        if isinstance(item, ast.FunctionDef) and item.name == name:
            args = item.args
            return {a.arg for a in args.args + args.kwonlyargs + args.posonlyargs}
    return set()


def missing_features(package_dir: Path) -> list[str]:
    """Interfaces the engine needs that the NeMo RL source in `package_dir` lacks.

    Read from the source (no import), so an old or incomplete installation is diagnosed even
    when its own dependencies are missing.
    """
    missing = []
    if not (package_dir / "algorithms" / "loss" / "loss_functions.py").is_file():
        missing.append("nemo_rl.algorithms.loss with log-prob loss input (v0.6.0+)")
    grpo = _tree(package_dir / "algorithms" / "grpo.py")
    master = _class(grpo, "MasterConfig")
    bases = {getattr(b, "id", getattr(b, "attr", "")) for b in (master.bases if master else [])}
    if "BaseModel" not in bases:
        missing.append("pydantic MasterConfig (v0.7.0+)")
    if "policy_factory" not in _params(grpo, "setup"):
        missing.append("grpo.setup(policy_factory=...) (v0.7.0+)")
    if "grpo_train" not in {getattr(n, "name", "") for n in (grpo.body if grpo else [])}:
        missing.append("grpo.grpo_train")
    policy = _class(_tree(package_dir / "models" / "policy" / "lm_policy.py"), "Policy")
    if "worker_extension_cls_fqn" not in _params(policy, "__init__"):
        missing.append("Policy(worker_extension_cls_fqn=...) (v0.6.0+)")
    return missing


def detect() -> NemoRLInfo:
    """Find NeMo RL and check the interfaces the engine needs; never raises on a missing NeMo RL."""
    try:
        nemo_rl = _import("nemo_rl")
    except ImportError:
        return NemoRLInfo(version=None, location=None)
    version = str(getattr(nemo_rl, "__version__", "unknown"))
    location = str(getattr(nemo_rl, "__path__", [None])[0])
    missing = missing_features(Path(location))
    if sys.version_info < (3, 12):
        missing.append("Python >= 3.12 (NeMo RL's config classes need it)")
    if not missing:
        try:
            _import("nemo_rl.algorithms.grpo")
        except ImportError as exc:
            dep = getattr(exc, "name", None) or str(exc)
            missing.append(f"NeMo RL's dependency {dep!r} ({exc}); install NeMo RL's environment")
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
        raise RuntimeError(available()[1])
    return info
