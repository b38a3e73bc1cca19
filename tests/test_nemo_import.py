"""`recipes import` on every GRPO config of a real NeMo RL tree (`NEMO_RL_SRC`).

Every config under `examples/configs/` and `examples/configs/recipes/llm/` that NeMo RL's own
loader resolves to a GRPO config (a `grpo:` section) is imported: it becomes a recipe that
`load_recipe` validates and that holds every leaf NeMo RL's loader gives it, with NeMo RL's value,
or it is refused for a reason NeMo RL's own code asserts too. Each FP8 variant (`--fp8`, and
`--fp8 --calibrated`) is written or refused with a located reason from a known set; a fixed
sample of FP8 variants passes the preflight; `train --dry-run` runs on imported configs.
Run with scripts/nemo-rl-contract.sh on each snapshot.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache
from pathlib import Path

import pytest

from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import RecipeError, load_recipe
from nemo_fp8_rl.config.nemo_import import import_nemo_config, write_imported
from nemo_fp8_rl.config.nemo_rl_keys import NEMO_RL_KEYS, SET_BY_CONFIGS_ONLY
from nemo_fp8_rl.config.schema import DERIVED

SRC = os.environ.get("NEMO_RL_SRC")
pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(not SRC, reason="NEMO_RL_SRC is not set (scripts/nemo-rl-contract.sh)"),
]
# NeMo RL's own checks refuse these too: ClippedPGLossFn asserts a positive truncation ratio and
# importance-sampling correction for TIS; lm_policy.Policy asserts equal micro-batch sizes at TP>=4.
NEMO_RL_ASSERTS = {
    "loss_fn.truncated_importance_sampling_ratio",
    "loss_fn.truncated_importance_sampling_type",
    "policy.logprob_batch_size",
}
# Why an FP8 variant cannot work: DTensor (or no Megatron) training, a non-vLLM rollout, and
# calibration with one optimiser step per rollout batch (the ratio stays 1, nothing clips).
FP8_REASONS = {
    "policy.dtensor_cfg.enabled",
    "policy.megatron_cfg.enabled",
    "policy.generation.backend",
    "policy.train_global_batch_size",
}
VARIANTS = {"fp8": ("blockwise", False), "fp8-calibrated": ("blockwise", True)}
# FP8 variants of configs whose models the preflight ships a config.json for (model_configs/).
PREFLIGHT_SAMPLE = (
    "grpo_math_8B_megatron_fp8.yaml",
    "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml",
)


@pytest.fixture(autouse=True, scope="module")
def _hf_home(tmp_path_factory):
    """Some configs read `${oc.env:HF_HOME}`; NeMo RL needs it set as much as the import does."""
    old = os.environ.get("HF_HOME")
    os.environ.setdefault("HF_HOME", str(tmp_path_factory.mktemp("hf")))
    yield
    if old is None:
        os.environ.pop("HF_HOME", None)


@lru_cache(maxsize=1)
def grpo_configs() -> dict[Path, dict]:
    """Every GRPO config of the tree, as NeMo RL's own loader resolves it."""
    from nemo_fp8_rl.engines.nemo.preflight.exemplars import load_exemplar

    folder = Path(str(SRC)) / "examples" / "configs"
    out = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("recipes/llm/*.yaml")]):
        config = load_exemplar(path)
        if "grpo" in config:
            out[path] = config
    return out


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def _get(tree: dict, dotted: str) -> object:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return KeyError
        tree = tree[part]
    return tree


def _import(path: Path, dest: Path, fp8: str | None = None, calibrated: bool = False):
    """The written recipe's path, or the refusal's issues."""
    try:
        return write_imported(import_nemo_config(path, fp8, calibrated), dest), []
    except RecipeError as exc:
        return None, exc.issues


def test_every_grpo_config_imports_with_its_keys(tmp_path):
    configs = grpo_configs()
    assert len(configs) >= 100
    refused, lost = {}, []
    for path, nemo in configs.items():
        written, issues = _import(path, tmp_path / f"{path.stem}.yaml")
        if written is None:
            refused[path.name] = issues
            continue
        cfg = load_recipe(written).config
        for key, value in _leaves(nemo).items():
            if (
                key in DERIVED
                or key.endswith("._override_")
                or (key == "grpo.val_period" and value == -1)
                # written false: the engine runs the legacy data path (nemo_import.WHY_CHANGED)
                or (key == "data_plane.enabled" and value is True)
                # written null: NeMo RL's Policy.save_checkpoint refuses it (nemo_import.WHY_CHANGED)
                or (key == "checkpointing.model_save_format" and _get(cfg, key) is None)
            ):
                continue
            if _get(cfg, key) != value:
                lost.append(f"{path.name}: {key}: NeMo RL {value!r}, recipe {_get(cfg, key)!r}")
    assert lost == []
    for name, issues in refused.items():
        assert {i.key for i in issues} <= NEMO_RL_ASSERTS, (name, [str(i) for i in issues])
        assert all(str(Path(str(SRC)).resolve()) in i.file for i in issues), name
    assert len(refused) <= 3, sorted(refused)
    print(f"\n{len(configs) - len(refused)} of {len(configs)} imported; refused: {sorted(refused)}")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_fp8_variant_is_written_or_refused_with_its_reason(tmp_path, variant):
    fp8, calibrated = VARIANTS[variant]
    written, reasons = 0, {}
    for path in grpo_configs():
        out, issues = _import(path, tmp_path / f"{path.stem}.yaml", fp8, calibrated)
        if out is not None:
            cfg = load_recipe(out).config
            assert cfg["policy"]["megatron_cfg"]["fp8_cfg"]["enabled"] is True
            assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
            assert cfg["loss_fn"]["calibration"]["enabled"] is calibrated
            written += 1
            continue
        assert issues and {i.key for i in issues} <= FP8_REASONS | NEMO_RL_ASSERTS, path.name
        assert all(i.file not in ("", "?") for i in issues), path.name
        for issue in issues:
            reasons[issue.key] = reasons.get(issue.key, 0) + 1
    assert written >= 5
    print(f"\n{variant}: {written} written, refused by key: {reasons}")


def test_nemo_rl_keys_are_fields_or_reads_of_nemo_rl():
    """Each extra key the schema accepts, where this tree's configs use it, names a field that a
    class of this NeMo RL tree annotates (a TypedDict or dataclass field) or a key its code reads
    by name, or is listed as one that only NeMo RL's example configs set."""
    names: set[str] = set()
    for source in (Path(str(SRC)) / "nemo_rl").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    used = {
        k for nemo in grpo_configs().values() for k in NEMO_RL_KEYS if _get(nemo, k) is not KeyError
    }
    assert len(used) >= 40
    unread = sorted(k for k in used if k.rsplit(".", 1)[-1] not in names)
    assert [k for k in unread if k not in SET_BY_CONFIGS_ONLY] == []


@pytest.mark.parametrize("name", PREFLIGHT_SAMPLE)
def test_fp8_import_passes_the_preflight(tmp_path, name):
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    path = Path(str(SRC)) / "examples" / "configs" / name
    out, issues = _import(path, tmp_path / Path(name).name, "blockwise")
    assert issues == []
    recipe = load_recipe(out)
    result = preflight(recipe, workdir=Path(str(SRC)))
    if _refused_for_dropped_kv_scales(result, recipe.config, Path(str(SRC))):
        return
    assert result.ok, result.report()


def test_train_dry_run_on_imported_and_on_nemo_rl_config(tmp_path, capsys):
    path = Path(str(SRC)) / "examples" / "configs" / "grpo_math_1B_megatron.yaml"
    out, _ = _import(path, tmp_path / "mine.yaml", "blockwise")
    for recipe in (out, path):
        code = invoke(train_cli.main, ["--recipe", str(recipe), "--dry-run"])
        shown = capsys.readouterr().out
        assert "fp8_recipe: blockwise" in shown or recipe == path
        assert "# engine: nemo" in shown and code == 0, shown[-2000:]


def _refused_for_dropped_kv_scales(result, cfg: dict, src: Path) -> bool:
    """True when this tree's colocated refit drops FP8 KV scales and the preflight refused the
    recipe's FP8 KV cache for it (the kv-scales-refit guard rail: v0.7.0, NeMo RL PR #3226)."""
    from nemo_fp8_rl.guards.field_checks import tree_drops_kv_scales

    vllm = cfg["policy"]["generation"]["vllm_cfg"]
    if (
        vllm.get("kv_cache_dtype") != "fp8"
        or not cfg["policy"]["generation"]["colocated"]["enabled"]
    ):
        return False
    if not tree_drops_kv_scales(src):
        return False
    assert not result.ok and "kv_scales" in result.report(), result.report()
    return True
