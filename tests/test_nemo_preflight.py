"""Preflight and hand-off completeness against a real NeMo RL tree (`NEMO_RL_SRC`, Python >= 3.12).

Run with `scripts/nemo-rl-contract.sh /path/to/nemo-rl` (both v0.7.0 and main are supported).
The preflight runs NeMo RL's real `grpo.setup()` with recorders for the Ray/GPU objects only
(nemo_fp8_rl/engines/nemo/preflight/recorders.py names each); these tests check it reaches the training
loop for every GPU recipe, that a key removed from the hand-off is reported with its key path and
the NeMo RL file that reads it, and that every key of NeMo RL's exemplar configs is in the
hand-off (or in the commented allow-list `handoff.LEFT_OUT`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_nemo_contract import _skip_reason

from nemo_fp8_rl.config import find_recipes, load_recipe, short_name
from nemo_fp8_rl.engines.nemo.driver.handoff import LEFT_OUT, to_nemo_config

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]

SRC = Path(os.environ.get("NEMO_RL_SRC", "."))
CPU_FOLDERS = ("tiny/", "tiny-nemo/", "study/")  # CPU recipes (cluster.gpus_per_node: 0)
GPU_RECIPES = [p for p in find_recipes() if not short_name(p).startswith(CPU_FOLDERS)]
IDS = [short_name(p) for p in GPU_RECIPES]
# The large-scale families rehearse one recipe each by default (their BF16 / FP8 variants share
# everything but precision; each rehearsal costs about 20 s); the others run under -m slow.
SCALE_FAMILIES = (
    "deepseek-v3/",
    "moonlight-16b-a3b/",
    "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g",
)
# (the Llama async recipe is rehearsed by tests/test_nemo_async.py)
SCALE_DEFAULT = {
    "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8",
    "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8",
}
# The Blackwell families (4-GPU nodes) rehearse their two is_mx variants by default (full MXFP8
# and MXFP8 rollout: every parallel setting of the family, and the refusal on a NeMo RL that does
# not read is_mx); the BF16 and uncalibrated ones, which differ from those only in precision or
# the loss, run under -m slow.
BLACKWELL_SLOW = re.compile(r"-\d+n4g-(bf16|fp8-mxfp8-uncalibrated)$")


def _slow(i: str) -> bool:
    return (i.startswith(SCALE_FAMILIES) and i not in SCALE_DEFAULT) or bool(
        BLACKWELL_SLOW.search(i)
    )


PREFLIGHT_CASES = [
    pytest.param(p, id=i, marks=[pytest.mark.slow] if _slow(i) else [])
    for p, i in zip(GPU_RECIPES, IDS, strict=True)
]


@pytest.fixture(scope="module")
def exemplar() -> dict:
    from nemo_fp8_rl.engines.nemo.preflight.exemplars import exemplar_keys

    return exemplar_keys(SRC)


def _preflight(recipe):
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    return preflight(recipe, workdir=SRC)


def test_gpu_recipes_are_all_the_non_cpu_ones() -> None:
    """Every recipe outside the CPU folders asks for GPUs, and every one inside asks for none."""
    gpus = {p: load_recipe(p).config["cluster"]["gpus_per_node"] for p in find_recipes()}
    assert GPU_RECIPES and all(gpus[p] > 0 for p in GPU_RECIPES)
    assert all(gpus[p] == 0 for p in gpus if p not in GPU_RECIPES)


@pytest.mark.parametrize("path", GPU_RECIPES, ids=IDS)
def test_handoff_has_every_key_of_nemo_rl_exemplars(path, exemplar) -> None:
    from nemo_fp8_rl.engines.nemo.preflight.exemplars import missing_from_handoff

    missing = missing_from_handoff(to_nemo_config(load_recipe(path)), exemplar)
    assert not missing, "\n".join(f"{k.key} (= {k.value!r} in {k.source})" for k in missing)


def test_allow_list_entries_are_real_nemo_rl_keys(exemplar) -> None:
    """Every allow-listed key is (or heads) a key some exemplar has, or NeMo RL's code reads it
    (`freeze_config` is in main's exemplars only): no stale entries."""
    code = "\n".join(p.read_text() for p in (SRC / "nemo_rl").rglob("*.py"))
    for key in LEFT_OUT:
        in_exemplar = any(k == key or k.startswith(key + ".") for k in exemplar)
        assert in_exemplar or re.search(rf"\b{key.rsplit('.', 1)[-1]}\b", code), key


def _reads_is_mx() -> bool:
    from nemo_fp8_rl.engines.nemo.driver.mx_support import FP8_FILE, READS_IS_MX

    return READS_IS_MX in (SRC / FP8_FILE).read_text()


@pytest.mark.parametrize("path", PREFLIGHT_CASES)
def test_preflight_runs_nemo_rl_setup_to_the_training_loop(path) -> None:
    recipe = load_recipe(path)
    result = _preflight(recipe)
    vllm = recipe.config["policy"]["generation"]["vllm_cfg"]
    if vllm["precision"] == "fp8" and vllm["is_mx"] and not _reads_is_mx():
        # v0.7.0: refused with the reason, first (the engine refuses it before it starts); the
        # rehearsal goes on and reports what else v0.7.0 would do with the recipe (its
        # apply_fp8_patches raises on pow2_activation_scaling_factors, fp8.py:143)
        assert not result.ok
        first = result.errors[0]
        assert first.key == "policy.generation.vllm_cfg.is_mx", result.report()
        assert "does not read is_mx" in first.message and first.file.endswith("fp8.py")
        return
    if _refused_for_dropped_kv_scales(result, recipe.config, SRC):
        return
    assert result.ok, result.report()
    r = result.rehearsal
    cfg = recipe.config
    colocated = cfg["policy"]["generation"]["colocated"]
    loop = "async_grpo_train" if cfg["grpo"]["async_grpo"]["enabled"] else "grpo_train"
    assert r.train.loop() == loop  # grpo.setup() returned and the runner went on
    (policy,) = r.policies  # NeMo RL's real Policy, built by its own constructor
    assert policy.cfg["model_name"] == cfg["policy"]["model_name"]
    assert policy.cfg["megatron_cfg"]["train_iters"] >= 1  # set by setup()
    calibrated = cfg["loss_fn"]["calibration"]["enabled"]
    fqn = policy.worker_group.builder.ray_actor_class_fqn
    assert ("Shadow" in fqn) == calibrated, fqn
    gpus, nodes = cfg["cluster"]["gpus_per_node"], cfg["cluster"]["num_nodes"]
    gen_nodes = 0 if colocated["enabled"] else colocated["resources"]["num_nodes"]
    worlds = [gpus * (nodes - gen_nodes)] + ([gpus * gen_nodes] if gen_nodes else [])
    assert [c.world_size() for c in r.clusters] == worlds  # train (and generation) clusters
    (generation,) = r.generations  # NeMo RL's real VllmGeneration
    vllm = cfg["policy"]["generation"]["vllm_cfg"]
    tp = vllm["tensor_parallel_size"]
    assert generation.worker_group.dp_size == worlds[-1] // tp
    assert r.llm_kwargs["model"] == cfg["policy"]["model_name"]
    assert r.llm_kwargs["tensor_parallel_size"] == tp
    assert r.llm_kwargs["max_model_len"] == vllm["max_model_len"]
    assert r.llm_kwargs["gpu_memory_utilization"] == vllm["gpu_memory_utilization"]
    fp8 = vllm["precision"] == "fp8"  # NeMo RL's real init_fp8 added the FP8 arguments
    assert (r.llm_kwargs.get("quantization") == "fp8") == fp8
    qcfg = r.llm_kwargs.get("hf_overrides", {}).get("quantization_config", {})
    if fp8 and vllm["is_mx"]:  # ModelOpt MXFP8, the layers the recipe keeps BF16 ignored
        assert qcfg["quant_algo"] == "MXFP8"
        kws = vllm["quantization_ignored_layer_kws"]
        assert all(any(k in name for k in kws) for name in qcfg.get("ignore", []))
    else:
        assert not fp8 or qcfg["weight_block_size"]
    assert any("megatron/setup.py" in item for item in result.not_run)


# Recipes a GPU launch refuses (schema-valid): (recipe, overrides, key path, upstream file, line
# text in NeMo RL's file or None for a vLLM file, a word of the fix).
REFUSED = {
    "vllm-fp8-dense-block": (
        "qwen3-4b/grpo-qwen3-4b-1n8g-fp8",
        ["policy.generation.vllm_cfg.tensor_parallel_size=8"],
        "policy.generation.vllm_cfg.tensor_parallel_size",
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py",
        None,
        "[1, 2, 4]",
    ),
    "vllm-fp8-moe-block": (
        "qwen3-30b-a3b/grpo-qwen3-30b-a3b-2n8g-fp8",
        ["policy.generation.vllm_cfg.tensor_parallel_size=4"],
        "policy.generation.vllm_cfg.tensor_parallel_size",
        "vllm/model_executor/layers/quantization/fp8.py",
        None,
        "[1, 2]",
    ),
    "vllm-max-model-len": (
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8",
        ["policy.max_total_sequence_length=65536"],
        "policy.generation.vllm_cfg.max_model_len",
        "vllm/config/model.py",
        None,
        "32768",
    ),
    "nemo-rl-vllm-pipeline-needs-async": (
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8",
        ["policy.generation.vllm_cfg.pipeline_parallel_size=2"],
        "policy.generation.vllm_cfg.async_engine",
        "nemo_rl/models/generation/vllm/vllm_generation.py",
        "async_engine",
        "async_engine",
    ),
    "nemo-rl-megatron-packing": (
        "paper-fp8-rl/qwen2.5-32b/grpo-qwen2.5-32b-4n8g-8k-fp8-blockwise",
        ["policy.make_sequence_length_divisible_by=4"],
        "policy.make_sequence_length_divisible_by",
        "nemo_rl/models/megatron/data.py",
        "minimum_pad_factor",
        "multiple of 8",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_preflight_refuses_what_a_gpu_launch_refuses(case) -> None:
    """Each recipe passes the schema and fails on a GPU; the preflight names key, file:line, fix."""
    name, overrides, key, file, line_text, fix_word = REFUSED[case]
    result = _preflight(load_recipe(name, overrides))
    assert not result.ok
    (err,) = [e for e in result.errors if e.key == key]
    assert err.file == file and err.line > 0, result.report()
    if line_text is not None:  # a NeMo RL file: the line is the failing check
        source = (SRC / file).read_text().splitlines()
        assert line_text in "\n".join(source[err.line - 3 : err.line + 1]), result.report()
    assert fix_word in err.fix, err.fix
    rendered = result.report()
    assert key in rendered and f"{file}:{err.line}" in rendered and "fix:" in rendered


def test_vllm_checks_cite_the_vllm_version_nemo_rl_pins() -> None:
    from nemo_fp8_rl.engines.nemo.preflight.vllm_checks import CITED, pinned_vllm

    version = pinned_vllm(SRC)
    assert version is not None and all(version in lines for _, lines in CITED.values())


# Keys of the exemplars that NeMo RL's driver or vLLM worker reads with [] on this path.
REMOVABLE = [
    "data.use_multiple_dataloader",
    "data.num_workers",
    "policy.generation.colocated",
    "policy.generation.vllm_cfg.enforce_eager",
    "policy.generation.vllm_cfg.max_model_len",
    "logger.gpu_monitoring",
]


def _drop(config: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        config = config[part]
    del config[leaf]


@pytest.mark.parametrize("key", REMOVABLE)
def test_removed_key_is_reported_with_key_path_and_nemo_rl_file(key, exemplar) -> None:
    assert key in exemplar or any(k.startswith(key + ".") for k in exemplar), key
    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    _drop(recipe.config, key)
    result = _preflight(recipe)
    assert not result.ok
    hits = [e for e in result.errors if key in (e.key or "") or key in e.message]
    assert hits, result.report()
    assert all(e.file.startswith("nemo_rl/") for e in hits), result.report()
    assert key in result.report()


def test_several_missing_keys_are_reported_at_once(exemplar) -> None:
    recipe = load_recipe("llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8")
    for key in ("data.use_multiple_dataloader", "policy.generation.vllm_cfg.enforce_eager"):
        _drop(recipe.config, key)
    result = _preflight(recipe)
    found = {e.key: e for e in result.errors}
    assert set(found) == {
        "data.use_multiple_dataloader",
        "policy.generation.vllm_cfg.enforce_eager",
    }
    assert found["data.use_multiple_dataloader"].file == "nemo_rl/algorithms/grpo.py"
    src_line = (
        (SRC / "nemo_rl/algorithms/grpo.py")
        .read_text()
        .splitlines()[found["data.use_multiple_dataloader"].line - 1]
    )
    assert 'data_config["use_multiple_dataloader"]' in src_line
    assert "vllm_worker.py" in found["policy.generation.vllm_cfg.enforce_eager"].file
    assert "False" in found["data.use_multiple_dataloader"].fix  # NeMo RL's own default


def test_a_failing_assertion_is_located_in_nemo_rl() -> None:
    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    recipe.config["loss_fn"]["use_importance_sampling_correction"] = False
    recipe.config["loss_fn"]["truncated_importance_sampling_type"] = None  # else the loss asserts
    result = _preflight(recipe)
    (err,) = result.errors
    assert err.file == "nemo_rl/algorithms/grpo.py" and "Importance sampling" in err.message


def test_relative_prompt_file_resolves_against_the_run_folder(tmp_path) -> None:
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    recipe = load_recipe("qwen3-4b/grpo-qwen3-4b-1n8g-fp8")
    assert recipe.config["data"]["default"]["prompt_file"] == "examples/prompts/cot.txt"
    result = preflight(recipe, workdir=tmp_path)  # not the NeMo RL folder
    assert not result.ok and "NeMo RL folder" in result.errors[0].fix


def test_submit_refuses_a_recipe_that_fails_preflight(monkeypatch, capsys) -> None:
    from nemo_fp8_rl.cli.submit import preflight_gate
    from nemo_fp8_rl.config.user_error import UsageError

    monkeypatch.chdir(SRC)  # the job's working folder: the NeMo RL folder
    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    _drop(recipe.config, "data.use_multiple_dataloader")
    with pytest.raises(UsageError, match="not submitted"):
        preflight_gate(recipe, skip=False)
    assert "data.use_multiple_dataloader" in capsys.readouterr().err
    assert preflight_gate(recipe, skip=True) is None


def test_a_model_without_a_shipped_config_is_read_from_the_hugging_face_cache(
    tmp_path, monkeypatch
) -> None:
    """A model the package ships no config.json for: refused at `policy.model_name` with the
    ways to provide one (not a relative-path fix), then found in the Hugging Face cache as
    `huggingface-cli download` lays it out, and the rehearsal goes on past it."""
    import json

    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("NEMO_FP8_RL_MODEL_CONFIGS", raising=False)
    monkeypatch.chdir(SRC)
    overrides = [
        "policy.model_name=Qwen/Qwen3-8B-Base-copy",
        "policy.tokenizer.name=Qwen/Qwen3-8B-Base",
    ]
    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", overrides)
    (err,) = _preflight(recipe).errors
    assert err.key == "policy.model_name" and "huggingface-cli download" in err.fix
    assert "relative paths" not in err.fix
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-8B-Base-copy" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(model_config("Qwen/Qwen3-8B-Base")))
    assert _preflight(load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", overrides)).ok


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
