"""NeMo RL's own exemplar configs, loaded with NeMo RL's own loader: the yardstick of the hand-off.

The exemplars are the GRPO configs NeMo RL ships for the path this engine drives (GRPO, Megatron
policy, vLLM generation): `examples/configs/grpo_math_1B_megatron.yaml` (which inherits
`grpo_math_1B.yaml`), `grpo_math_1B.yaml` itself, and the FP8 recipes under
`examples/configs/recipes/llm/`. Each is composed by `nemo_rl.utils.config.load_config` (its
`defaults:` chain) and resolved by OmegaConf with NeMo RL's resolvers, exactly as
`examples/run_grpo.py` does. Every leaf key of any of them must be in a GPU recipe's hand-off
unless `handoff.LEFT_OUT` says why not; the value of `grpo_math_1B_megatron.yaml` (then
`grpo_math_1B.yaml`) is what NeMo RL itself would use, so it is the fix a report suggests.

The exemplars are composed by NeMo RL's loader, not the project's (`config.nemo_defaults`): they
are the reference that composer is held to (tests/test_nemo_import.py), and the dotted keys of
the result are walked with the composer's `leaves` and `has_key`.

Needs a NeMo RL source tree (its `nemo_rl` importable, `examples/` next to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.nemo_defaults import has_key, leaves
from nemo_fp8_rl.engines.nemo.driver.handoff import left_out_reason

# In order of authority: the first file that has a key gives NeMo RL's default for it.
BASE_EXEMPLARS = ("grpo_math_1B_megatron.yaml", "grpo_math_1B.yaml")
FP8_GLOB = "recipes/llm/*fp8*.yaml"


@dataclass(frozen=True)
class ExemplarKey:
    """One leaf key of the exemplars: NeMo RL's value for it and the file it came from."""

    key: str
    value: Any
    source: str


def exemplar_paths(src: Path) -> list[Path]:
    """The exemplar files of the NeMo RL tree `src` (base configs first, then FP8 recipes)."""
    configs = Path(src) / "examples" / "configs"
    paths = [configs / name for name in BASE_EXEMPLARS]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"NeMo RL exemplar config(s) not found: {missing}")
    return paths + sorted(configs.glob(FP8_GLOB))


def load_exemplar(path: Path) -> dict[str, Any]:
    """`path` composed and resolved by NeMo RL's loader (defaults chain, `${mul:...}` resolvers)."""
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    register_omegaconf_resolvers()
    return OmegaConf.to_container(load_config(str(path)), resolve=True)


def exemplar_keys(src: Path) -> dict[str, ExemplarKey]:
    """Every leaf key of every exemplar, with the most authoritative value for it."""
    keys: dict[str, ExemplarKey] = {}
    for path in exemplar_paths(src):
        rel = str(path.relative_to(Path(src)))
        for key, value in leaves(load_exemplar(path)).items():
            keys.setdefault(key, ExemplarKey(key, value, rel))
    return keys


def missing_from_handoff(
    handoff: dict[str, Any], keys: dict[str, ExemplarKey]
) -> list[ExemplarKey]:
    """Exemplar keys absent from `handoff` and not covered by the allow-list `handoff.LEFT_OUT`."""
    return [
        k for k in keys.values() if not has_key(handoff, k.key) and left_out_reason(k.key) is None
    ]


def nemo_default(keys: dict[str, ExemplarKey], dotted: str) -> ExemplarKey | None:
    """NeMo RL's exemplar value for `dotted` (None when no exemplar has the key)."""
    return keys.get(dotted)
