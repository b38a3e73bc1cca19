# ruff: noqa: F811  (the fixture `trees` is imported from guards_fixtures)
"""The pre-launch guard rails (docs/guard-rails.md): for every check a doomed recipe (a shipped
recipe with the overrides that reproduce the upstream failure) that this check alone refuses,
and the shipped recipes passing them all on both vendored NeMo RL snapshots."""

from __future__ import annotations

import shutil

import pytest
from guards_fixtures import (  # noqa: F401 (the fixture `trees`)
    ROOT,
    only_refused_by,
    report,
    shipped_config,
    trees,
)

from nemo_fp8_rl.config import find_recipes, short_name
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.guards import fp8_active
from nemo_fp8_rl.guards.siblings import family_of, name_key, sibling_for
from nemo_fp8_rl.guards.worker_gpu import parse_sinfo, resolve_worker_gpu

QWEN8 = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-uncalibrated"
QWEN30 = "qwen3-30b-a3b/grpo-qwen3-30b-a3b-2n8g-fp8"
MOON = "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8-uncalibrated"
LLAMA = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8-uncalibrated"
MXFP8 = [
    "policy.megatron_cfg.fp8_cfg.fp8_recipe=mxfp8",
    "~policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
    "policy.generation.vllm_cfg.is_mx=true",
    "policy.generation.vllm_cfg.pow2_weight_scaling_factors=true",
    "policy.generation.vllm_cfg.pow2_activation_scaling_factors=true",
    "refit.bridge=nemo",
]
GPU_RECIPES = [p for p in find_recipes() if not short_name(p).startswith(("tiny", "study"))]
BLACKWELL_RECIPES = [p for p in GPU_RECIPES if "n4g-" in p.name]  # 4-GPU nodes: GB200, B200
HOPPER_RECIPES = [p for p in GPU_RECIPES if p not in BLACKWELL_RECIPES]


# ---- shipped recipes -----------------------------------------------------------------------
@pytest.mark.parametrize("snapshot", ["v0.7.0", "7ea279a"])
def test_shipped_recipes_pass_every_check_on_both_snapshots(trees, snapshot):
    """No shipped recipe is refused (workers' GPU unnamed, and H100 for the Hopper recipes)."""
    for path in find_recipes():
        rep = report(str(path), tree=trees[snapshot])
        if snapshot == "v0.7.0" and path.name == "grpo-qwen3-8b-base-1n8g-fp8-kvcache.yaml":
            # v0.7.0's colocated refit drops the FP8 KV scales (NVIDIA-NeMo/RL PR #3226)
            assert [f.rule for f in rep.errors] == ["kv-scales-refit"], rep.render()
            continue
        assert rep.ok, rep.render()
        assert [r.check for r in rep.results] == [
            "fp8-active",
            "scale-format",
            "alignment",
            "memory",
            "fp8-param-tp",
            "fp8-kv-qk-norm",
            "grouped-experts-mxfp8",
            "kv-scales-refit",
            "hf-overrides",
            "layer-parity",
            "pow2-on-hopper",
            "zero-block-scales",
            "pp-scale-names",
        ]


def test_hopper_recipes_pass_on_h100_and_h200(trees):
    for path in HOPPER_RECIPES:
        for gpu in (
            ("H200",) if "deepseek" in path.name and "bf16" in path.name else ("H100", "H200")
        ):
            rep = report(str(path), tree=trees["7ea279a"], gpu=gpu)
            assert rep.ok, rep.render()


def test_blackwell_recipes_pass_on_b200_and_gb200_and_name_their_sibling_on_hopper(trees):
    """The 4-GPU-node family passes on Blackwell workers; its MXFP8 recipes are refused on
    Hopper workers with the Hopper sibling to use, and its BF16 recipes run anywhere."""
    assert len(BLACKWELL_RECIPES) == 16
    for path in BLACKWELL_RECIPES:
        for gpu in ("B200", "GB200"):
            rep = report(str(path), tree=trees["7ea279a"], gpu=gpu)
            assert rep.ok, rep.render()
        rep = report(str(path), tree=trees["7ea279a"], gpu="H100")
        if path.name.endswith("-bf16.yaml"):
            assert rep.ok, rep.render()
            continue
        assert "scale-format" in {f.rule.split("/")[0] for f in rep.errors}, rep.render()
        assert "1n8g-" in rep.render() or "2n8g-" in rep.render(), rep.render()


# ---- fp8-active: NeMo RL's FP8 patches vs vLLM's executor (NVIDIA-NeMo/RL#3755) ------------
def test_fp8_patches_missing_vllm_executor_is_refused_on_vllm_025(trees):
    """vLLM TP 2 on NeMo RL 7ea279a (vLLM 0.25.1: RayExecutorV2 by default) without the v1
    executor: its fp8.py wraps RayDistributedExecutor only, so the run would not be FP8."""
    doomed = [f"~policy.generation.vllm_cfg.env_vars.{fp8_active.ENV}"]
    rep = report(QWEN30, doomed, tree=trees["7ea279a"])
    assert only_refused_by(rep, "fp8-active") == ["fp8-active/executor"]
    finding = rep.errors[0]
    assert "RayExecutorV2" in finding.what and "RayDistributedExecutor" in finding.what
    assert finding.key == "policy.generation.vllm_cfg.env_vars.VLLM_USE_RAY_V2_EXECUTOR_BACKEND"
    assert "NVIDIA-NeMo/RL#3755" in finding.upstream and "'0'" in finding.fix
    assert report(QWEN30, doomed, tree=trees["v0.7.0"]).ok  # vLLM 0.20: v1 by default
    assert report(QWEN30, tree=trees["7ea279a"]).ok  # the shipped recipe pins the v1 executor


def test_fp8_active_judges_the_trees_source_and_the_engine_path(trees):
    source = (trees["7ea279a"] / fp8_active.FP8_PY).read_text()
    assert fp8_active.patched_executors(source) == {"RayDistributedExecutor"}
    assert fp8_active.selected_executor("0.25.1", None) == "RayExecutorV2"
    assert fp8_active.selected_executor("0.20.0", None) == "RayDistributedExecutor"
    assert fp8_active.selected_executor("0.20.0", "1") == "RayExecutorV2"
    forced_v2 = [f"policy.generation.vllm_cfg.env_vars.{fp8_active.ENV}=1"]
    assert not report(QWEN30, forced_v2, tree=trees["v0.7.0"]).ok
    async_engine = report(
        "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8-uncalibrated",
        [f"~policy.generation.vllm_cfg.env_vars.{fp8_active.ENV}"],
        tree=trees["7ea279a"],
    )
    assert "async engine" in async_engine.result("fp8-active").note
    assert only_refused_by(async_engine, "fp8-active")
    single = report(QWEN8, tree=trees["7ea279a"]).result("fp8-active")  # vLLM TP 1
    assert single.verdict == "pass" and "in-process" in single.note


# ---- scale-format: one format for the workers' GPU ------------------------------------------
def test_a_hopper_recipe_on_blackwell_workers_is_refused(trees):
    rep = report(QWEN8, tree=trees["7ea279a"], gpu="B200")
    rules = only_refused_by(rep, "scale-format")
    assert set(rules) == {"scale-format/fp32-on-blackwell", "scale-format/deepgemm-on-blackwell"}
    assert all("this recipe is for Hopper" in f.what for f in rep.errors)
    assert report(QWEN8, tree=trees["7ea279a"], gpu="H100").ok


def test_a_blackwell_recipe_on_hopper_workers_is_refused(trees):
    rep = report(QWEN8, MXFP8, tree=trees["7ea279a"], gpu="H100")
    assert set(only_refused_by(rep, "scale-format")) == {"scale-format/mxfp8-on-hopper"}
    assert report(QWEN8, MXFP8, tree=trees["7ea279a"], gpu="GB200").ok


def test_mixed_scale_formats_are_refused_with_the_one_setting(trees):
    """Trainer FP32 block scales, rollout power-of-2 weight scales: refused on any GPU."""
    rep = report(
        QWEN8,
        ["policy.generation.vllm_cfg.pow2_weight_scaling_factors=true"],
        tree=trees["7ea279a"],
    )
    assert only_refused_by(rep, "scale-format") == ["scale-format/mixed"]
    assert "powers of 2 everywhere" in rep.errors[0].fix
    all_pow2 = [
        "~policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
        "policy.generation.vllm_cfg.pow2_weight_scaling_factors=true",
        "policy.generation.vllm_cfg.pow2_activation_scaling_factors=true",
    ]
    assert report(QWEN8, all_pow2, tree=trees["7ea279a"], gpu="H100").ok
    assert report(QWEN8, all_pow2, tree=trees["7ea279a"], gpu="B200").ok  # DeepGEMM's E8M0 path


def test_the_sibling_for_the_other_family_is_found_by_the_name_rule(tmp_path):
    """A Blackwell recipe next to a Hopper one (any folder, any cluster token) is named."""
    folder = tmp_path / "qwen3-8b-base"
    folder.mkdir()
    hopper = folder / "grpo-qwen3-8b-base-1n8g-fp8.yaml"
    shutil.copy(ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8.yaml", hopper)
    hopper.write_text(
        hopper.read_text()
        .replace("./grpo-", str(ROOT / "recipes/qwen3-8b-base") + "/grpo-")
        .replace("../../configs", str(ROOT / "configs"))
    )
    blackwell = folder / "grpo-qwen3-8b-base-1n4g-mxfp8.yaml"
    blackwell.write_text(
        f"defaults:\n  - {ROOT}/recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16.yaml\n"
        f"  - {ROOT}/configs/precision/fp8-mxfp8.yaml\n  - {ROOT}/configs/loss/calibrated-clipping.yaml\n"
        "cluster:\n  gpus_per_node: 4\n"
    )
    (folder / "grpo-qwen3-8b-base-1n8g-fp8-uncalibrated.yaml").write_text(f"defaults: {hopper}\n")
    from nemo_fp8_rl.config import load_recipe

    h, b = load_recipe(str(hopper)), load_recipe(str(blackwell))
    assert (family_of(h.config), family_of(b.config)) == ("hopper", "blackwell")
    assert name_key(hopper.name) == name_key(blackwell.name) == ("grpo", "qwen3", "8b", "base")
    assert sibling_for(hopper, h.config, "blackwell") == str(blackwell)
    assert sibling_for(blackwell, b.config, "hopper") == str(hopper)
    rep = report(str(hopper), gpu="B200")
    assert all(f"use {blackwell}" in f.fix for f in rep.errors), rep.render()
    import contextlib
    import io

    from nemo_fp8_rl.cli.recipes import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["show", str(hopper)]) == 0
    assert out.getvalue().splitlines()[0] == f"# GPUs: Hopper only; Blackwell sibling: {blackwell}"


def test_the_workers_gpu_comes_from_flag_recipe_or_partition_never_this_machine():
    cfg = {"slurm": {"gpu": None, "partition": "gpu-b200"}}
    sinfo = "gpu:b200:8(S:0-1)|(null)\ngpu:b200:8(S:0-1)|ib\n"
    assert resolve_worker_gpu(cfg, sinfo=lambda p: sinfo).gpu.name == "B200"
    assert resolve_worker_gpu(cfg, "H100", sinfo=lambda p: sinfo).gpu.name == "H100"
    assert (
        resolve_worker_gpu({"slurm": {"gpu": "gb200"}}, sinfo=lambda p: sinfo).gpu.name == "GB200"
    )
    assert resolve_worker_gpu(cfg, sinfo=lambda p: None) is None  # no sinfo: not decided
    assert parse_sinfo("gpu:8|h100,ib\n") == {"H100"}
    with pytest.raises(UsageError, match="several GPU types"):
        resolve_worker_gpu(cfg, sinfo=lambda p: "gpu:h100:8|\ngpu:gb200:4|\n")
    with pytest.raises(UsageError, match="unknown GPU type 'v100'"):
        resolve_worker_gpu(cfg, "v100")


# ---- alignment: Transformer Engine's divisibility rules --------------------------------------
def test_nemo_rl_1551_token_dimension_after_padding_is_refused():
    """Qwen3-8B-Base, FP8 training with sequence parallelism at TP 4 and dynamic sampling,
    sequences padded to TP x 2 without packing: TE's `dims=[4092, 4096]` assert (NeMo RL #1551)."""
    doomed = [
        "policy.sequence_packing.enabled=false",
        "policy.megatron_cfg.sequence_parallel=true",
        "grpo.use_dynamic_sampling=true",
    ]
    rep = report(QWEN8, doomed)
    assert only_refused_by(rep, "alignment") == ["alignment/tokens"]
    finding = rep.errors[0]
    assert finding.key == "policy.make_sequence_length_divisible_by"
    assert "set policy.make_sequence_length_divisible_by: 32" in finding.fix
    assert report(QWEN8, [*doomed, "policy.make_sequence_length_divisible_by=32"]).ok
    assert report(QWEN8, doomed[1:]).ok  # packing: NeMo RL pads for TE itself


def test_a_gemm_shard_te_cannot_quantize_is_refused_per_scaling():
    """Moonlight's experts (moe_intermediate_size 1408): ETP 16 gives 88-wide shards (not % 16,
    refused for blockwise); ETP 8 gives 176 (% 16, but not % 32: refused for MXFP8 only)."""
    etp16 = report(MOON, ["policy.megatron_cfg.expert_tensor_parallel_size=16"])
    assert set(only_refused_by(etp16, "alignment")) == {"alignment/gemm"}
    assert any("experts.linear_fc2 weight shard [2048, 88]" in f.what for f in etp16.errors)
    etp8 = ["policy.megatron_cfg.expert_tensor_parallel_size=8"]
    assert report(MOON, etp8).result("alignment").verdict == "pass"
    mx = report(MOON, [*etp8, *MXFP8], gpu="B200")
    assert only_refused_by(mx, "alignment") and "not a multiple of 32" in mx.errors[0].what


# ---- memory -----------------------------------------------------------------------------------
def test_a_recipe_over_the_workers_gpu_memory_is_refused():
    doomed = [  # vLLM sized by utilisation alone (the shipped recipe pins its KV cache)
        "~policy.generation.vllm_kwargs.kv_cache_memory_bytes",
        "policy.generation.vllm_cfg.gpu_memory_utilization=0.97",
    ]
    rep = report(QWEN8, doomed, gpu="H100")
    assert only_refused_by(rep, "memory") == ["memory/capacity"]
    assert "generation peak" in rep.errors[0].what
    assert report(QWEN8, doomed, gpu="H200").ok  # the same recipe fits on 141 GB


def test_deepseek_bf16_weights_at_vllm_tp16_exceed_an_h100():
    """The shipped DeepSeek-V3 BF16 recipes serve 671e9 BF16 parameters over vLLM TP 16: about
    78 GiB of weights per GPU, refused on H100 workers, fine on H200."""
    name = "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-bf16"
    assert only_refused_by(report(name, gpu="H100"), "memory")
    assert report(name, gpu="H200").ok


def test_colocated_fp8_sized_by_utilisation_alone_is_warned_on_vllm_025(trees):
    unpinned = ["~policy.generation.vllm_kwargs.kv_cache_memory_bytes"]  # the shipped one pins it
    rep = report(QWEN8, unpinned, tree=trees["7ea279a"])
    (warning,) = [f for f in rep.warnings if f.rule == "memory/kv-sizing"]
    assert "kv_cache_memory_bytes" in warning.fix and "PR #3280" in warning.upstream
    assert not [
        f
        for f in report(QWEN8, unpinned, tree=trees["v0.7.0"]).warnings
        if f.rule == "memory/kv-sizing"
    ]
    assert not [
        f for f in report(QWEN8, tree=trees["7ea279a"]).warnings if f.rule == "memory/kv-sizing"
    ]
    assert not [
        f for f in report(LLAMA, tree=trees["7ea279a"]).warnings if f.rule == "memory/kv-sizing"
    ]


# ---- known upstream bugs as rules -------------------------------------------------------------
def test_fp8_param_with_blockwise_at_tp_above_2_is_refused(trees, tmp_path):
    doomed = ["policy.megatron_cfg.fp8_cfg.fp8_param=true"]
    rep = report(QWEN8, doomed, tree=trees["7ea279a"])
    assert only_refused_by(rep, "fp8-param-tp") == ["fp8-param-tp"]
    assert "NeMo RL v0.7.0 and main 7ea279a" in rep.errors[0].applies_to
    assert report(
        QWEN8, [*doomed, "policy.megatron_cfg.tensor_model_parallel_size=2"], tree=trees["7ea279a"]
    ).ok
    fixed = tmp_path / "fixed-tree"
    shutil.copytree(trees["7ea279a"], fixed)
    init = fixed / "nemo_rl/models/policy/__init__.py"
    init.write_text(init.read_text().replace("issues/1164", "issues/closed"))
    retired = report(QWEN8, doomed, tree=fixed)
    assert retired.ok and "retired" in retired.result("fp8-param-tp").note


def test_fp8_kv_cache_without_qk_norm_is_warned(trees):
    kv = [
        "policy.generation.vllm_cfg.kv_cache_dtype=fp8",
        "policy.megatron_cfg.pipeline_model_parallel_size=1",
    ]
    rep = report(LLAMA, kv, tree=trees["7ea279a"])
    assert rep.ok  # a warning: the outcome depends on the model
    (warning,) = [f for f in rep.warnings if f.rule == "fp8-kv-qk-norm"]
    assert warning.upstream == "verl PR #4435" and "llama" in warning.what
    qwen = report("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache", tree=trees["7ea279a"])
    assert qwen.result("fp8-kv-qk-norm").verdict == "pass"


def test_the_preflight_style_report_lists_every_check_and_verdict():
    import re

    text = report(QWEN8, gpu="H100").render()
    verdicts = dict(
        re.findall(r"^  (pass|warn|fail|skip)\s+([a-z0-9-]+)", text, re.MULTILINE)[::-1]
    )
    found = {
        check: verdict
        for verdict, check in re.findall(
            r"^  (pass|warn|fail|skip)\s+([a-z0-9-]+)", text, re.MULTILINE
        )
    }
    assert found == {
        "fp8-active": "skip",
        "scale-format": "pass",
        "alignment": "pass",
        "memory": "pass",
        "fp8-param-tp": "pass",
        "fp8-kv-qk-norm": "skip",
        "grouped-experts-mxfp8": "skip",
        "kv-scales-refit": "skip",
        "hf-overrides": "skip",
        "layer-parity": "pass",
        "pow2-on-hopper": "pass",
        "zero-block-scales": "skip",
        "pp-scale-names": "skip",
    }, (verdicts, text)
    assert text.startswith("guard rails for grpo-qwen3-8b-base-1n8g-fp8-uncalibrated")


def test_every_gemm_of_every_shipped_model_is_listed():
    from nemo_fp8_rl.guards.model_shapes import count_params, decoder_gemms

    moon = shipped_config("moonshotai/Moonlight-16B-A3B-Instruct")
    names = {g.name for g in decoder_gemms(moon)}
    assert {
        "linear_q_proj",
        "linear_kv_down_proj",
        "linear_kv_up_proj",
        "linear_proj",
        "mlp.linear_fc1",
        "experts.linear_fc1",
        "shared_experts.linear_fc2",
    } <= names
    assert round(count_params(shipped_config("Qwen/Qwen3-8B-Base")).non_embedding / 1e9, 2) == 6.95


# ---- the tools --------------------------------------------------------------------------------
def test_recipes_show_memory_gives_a_breakdown_for_every_gpu_recipe(capsys):
    from nemo_fp8_rl.cli.common import invoke
    from nemo_fp8_rl.cli.recipes import main

    for path in GPU_RECIPES:
        assert invoke(main, ["show", str(path), "--memory"]) == 0, short_name(path)
        out = capsys.readouterr().out
        for gpu in ("H100", "H200", "B200", "GB200"):  # estimated, or said not to run there
            assert f"{gpu} (" in out or f"{gpu}: not estimated: " in out, (short_name(path), out)
        assert "trainer (Megatron rank)" in out and "KV cache" in out and "peaks (GiB)" in out
    hopper = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
    assert invoke(main, ["show", hopper, "--memory", "--gpu", "B200"]) == 0
    out = capsys.readouterr().out
    assert (
        "fits" not in out
        and "B200: not estimated: grpo-qwen3-8b-base-1n8g-fp8 runs on Hopper" in out
    )
    assert "Blackwell sibling: qwen3-8b-base/grpo-qwen3-8b-base-2n4g-fp8-mxfp8" in out
    assert invoke(main, ["show", "tiny/grpo-tiny-qwen3-cpu-fp8", "--memory"]) == 2
    assert "a CPU recipe has no GPU memory estimate" in capsys.readouterr().err


def test_submit_refuses_a_hopper_recipe_for_blackwell_workers_before_sbatch(tmp_path, capsys):
    """Where NeMo RL is not importable (a login node) submit still runs the guard rails, for
    the GPU named by --gpu, and refuses before anything reaches Slurm."""
    from nemo_fp8_rl.cli.common import invoke
    from nemo_fp8_rl.cli.submit import main
    from nemo_fp8_rl.engines.nemo import available

    if available()[0]:
        pytest.skip("NeMo RL is importable here: submit runs the full preflight (contract suite)")
    argv = [
        "--recipe",
        QWEN8,
        "--gpu",
        "B200",
        "--account",
        "a",
        "--partition",
        "p",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    assert invoke(main, argv) == 2
    err = capsys.readouterr().err
    assert "fail  scale-format" in err and "scale-format/fp32-on-blackwell" in err
    assert "not submitted: the guard rails found 2 problem(s)" in err
    assert not (tmp_path / "run" / "slurm").exists()


# ---- no silent skip ---------------------------------------------------------------------------
def test_an_unnamed_gpu_is_assumed_from_the_family_the_recipe_declares():
    """A Hopper-only recipe is checked for the H100 (the smallest Hopper GPU) when nothing
    names the workers' GPU, and says so; the memory-doomed variant is refused there."""
    doomed = [  # vLLM sized by utilisation alone (the shipped recipe pins its KV cache)
        "~policy.generation.vllm_kwargs.kv_cache_memory_bytes",
        "policy.generation.vllm_cfg.gpu_memory_utilization=0.97",
    ]
    rep = report(QWEN8, doomed)
    assert only_refused_by(rep, "memory") == ["memory/capacity"]
    note = rep.result("memory").note
    assert note.startswith("H100 (assumed: the recipe is Hopper-only") and "--gpu" in note
    assert rep.result("scale-format").note.startswith("workers: H100 (assumed:")
    mx = report("qwen3-8b-base/grpo-qwen3-8b-base-2n4g-fp8-mxfp8")
    assert "B200 (assumed: the recipe is Blackwell-only" in mx.result("memory").note
    assert not rep.not_run and not mx.not_run


def test_a_recipe_declaring_no_family_names_the_checks_not_run_and_the_flags():
    rep = report("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16")
    assert rep.not_run.startswith("not run for the workers' GPU") and "memory" in rep.not_run
    for gpu in ("H100", "H200", "B200", "GB200"):
        assert f"--gpu {gpu}" in rep.not_run
    assert rep.not_run in rep.render()
    assert not report("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16", gpu="H100").not_run


def test_dry_runs_refuse_a_hopper_recipe_for_blackwell_workers_as_submit_does(tmp_path, capsys):
    """`train --dry-run` and `submit --dry-run` without NeMo RL run the checks that need only
    the recipe and config.json, and refuse what the real submission refuses (exit 2)."""
    from nemo_fp8_rl.cli import submit, train
    from nemo_fp8_rl.cli.common import invoke
    from nemo_fp8_rl.engines.nemo import available

    if available()[0]:
        pytest.skip("NeMo RL is importable here: the dry runs run the full checks")
    name = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
    assert invoke(train.main, ["--recipe", name, "--dry-run", "--gpu", "B200"]) == 2
    err = capsys.readouterr().err
    assert err.count("scale-format/fp32-on-blackwell") == 1 and "refused (dry run)" in err
    assert "fp8-active: not run: it reads NeMo RL's" in err and "--preflight" in err
    sub = ["--recipe", name, "--gpu", "B200", "--account", "a", "--partition", "p", "--dry-run"]
    assert invoke(submit.main, [*sub, "--run-dir", str(tmp_path / "r")]) == 2
    captured = capsys.readouterr()
    assert "#SBATCH" not in captured.out and "scale-format/deepgemm-on-blackwell" in captured.err
    assert invoke(train.main, ["--recipe", name, "--dry-run"]) == 3  # H100 assumed: valid
    assert "H100 (assumed:" in capsys.readouterr().err


# ---- grouped MoE experts in an MXFP8 refit ------------------------------------------------------
MOE_MX = "qwen3-30b-a3b/grpo-qwen3-30b-a3b-4n4g-fp8-mxfp8-rollout"
DTENSOR = ["policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"]


def test_grouped_expert_slabs_in_an_mxfp8_refit_are_refused_where_the_trainer_sends_them(trees):
    """Megatron-Bridge's Qwen3-MoE bridge sends experts one by one (the shipped recipes pass);
    DTensor sends transformers 5's grouped slabs, which 7ea279a's load_weights refuses in MXFP8,
    unless the rollout keeps the experts BF16; v0.7.0 has no such refusal (retired)."""
    for name in (MOE_MX, "qwen3-30b-a3b/grpo-qwen3-30b-a3b-4n4g-fp8-mxfp8"):
        rep = report(name, tree=trees["7ea279a"])
        assert rep.result("grouped-experts-mxfp8").verdict == "pass", rep.render()
        assert "names qwen3_moe's experts one by one" in rep.result("grouped-experts-mxfp8").note
    doomed = report(MOE_MX, DTENSOR, tree=trees["7ea279a"])
    assert only_refused_by(doomed, "grouped-experts-mxfp8") == ["grouped-experts-mxfp8"]
    (err,) = doomed.errors
    assert "does not support grouped MoE expert weights" in err.what and "fp8.py:505" in err.what
    assert "quantization_ignored_layer_kws" in err.fix and err.key.endswith("is_mx")
    kept = [*DTENSOR, "policy.generation.vllm_cfg.quantization_ignored_layer_kws=[mlp.experts]"]
    assert report(MOE_MX, kept, tree=trees["7ea279a"]).ok
    old = report(MOE_MX, DTENSOR, tree=trees["v0.7.0"]).result("grouped-experts-mxfp8")
    assert old.verdict == "skip" and old.note.startswith("retired")
    assert not report(MOE_MX, DTENSOR).ok  # no NeMo RL tree: applied


# ---- the field's later failure classes (guards.field_checks) -------------------------------------
def test_fp8_kv_scales_dropped_by_the_colocated_refit_are_refused_on_v070(trees):
    name = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache"
    rules = only_refused_by(report(name, tree=trees["v0.7.0"]), "kv-scales-refit")
    assert rules == ["kv-scales-refit"]
    assert report(name, tree=trees["7ea279a"]).result("kv-scales-refit").note.startswith("retired")
    assert (
        report(name, ["policy.generation.colocated.enabled=false"], tree=trees["v0.7.0"])
        .result("kv-scales-refit")
        .verdict
        == "pass"
    )


def test_user_hf_overrides_wiped_or_replacing_fp8s_are_refused(trees):
    kept = ["+policy.generation.vllm_kwargs.hf_overrides={max_position_embeddings: 40960}"]
    wiped = report(QWEN8, kept, tree=trees["v0.7.0"])
    assert only_refused_by(wiped, "hf-overrides") == ["hf-overrides"]
    assert (
        "max_position_embeddings" in wiped.errors[0].what and "PR #2904" in wiped.errors[0].upstream
    )
    assert report(QWEN8, kept, tree=trees["7ea279a"]).ok
    qcfg = [
        "+policy.generation.vllm_kwargs.hf_overrides={quantization_config: {quant_method: fp8}}"
    ]
    replaced = report(QWEN8, qcfg, tree=trees["7ea279a"])
    assert "replaces the one init_fp8 builds" in replaced.errors[0].what


def test_rollout_bf16_layers_the_trainer_runs_in_fp8_are_flagged():
    rep = report(QWEN8, ["policy.generation.vllm_cfg.num_first_layers_in_bf16=1"], gpu="H100")
    (warning,) = [f for f in rep.warnings if f.rule == "layer-parity"]
    assert "different precisions" in warning.what and warning.key.endswith(
        "num_first_layers_in_bf16"
    )
    assert report(QWEN8, gpu="H100").result("layer-parity").verdict == "pass"


def test_power_of_2_scales_on_hopper_are_flagged():
    pow2 = [
        "~policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
        "policy.generation.vllm_cfg.use_deep_gemm=false",
        "policy.generation.vllm_cfg.pow2_weight_scaling_factors=true",
        "policy.generation.vllm_cfg.pow2_activation_scaling_factors=true",
    ]
    rep = report(QWEN8, pow2, gpu="H100")
    (warning,) = [f for f in rep.warnings if f.rule == "pow2-on-hopper"]
    assert "0.0038 -> 0.0059" in warning.what and warning.upstream == "prime-rl PR #3112"
    assert report(QWEN8, pow2, gpu="B200").result("pow2-on-hopper").verdict == "pass"


def test_zero_block_scales_are_judged_from_nemo_rls_quantizer(trees, tmp_path):
    """Both quantizers of 7ea279a map all-zero blocks (retired); a tree without the case is
    refused."""
    assert (
        report(QWEN8, tree=trees["7ea279a"]).result("zero-block-scales").note.startswith("retired")
    )
    mx = "qwen3-8b-base/grpo-qwen3-8b-base-2n4g-fp8-mxfp8"
    assert report(mx, tree=trees["7ea279a"]).result("zero-block-scales").verdict == "skip"
    shutil.copytree(trees["7ea279a"], tmp_path / "tree")
    fp8 = tmp_path / "tree" / "nemo_rl/models/generation/vllm/quantization/fp8.py"
    fp8.write_text(fp8.read_text().replace("torch.where(scale == 0", "torch.where(scale < 0"))
    rep = report(mx, tree=tmp_path / "tree")
    assert only_refused_by(rep, "zero-block-scales") == ["zero-block-scales"]


def test_fp8_params_over_pipeline_stages_are_flagged():
    doomed = [
        "policy.megatron_cfg.fp8_cfg.fp8_param=true",
        "policy.megatron_cfg.tensor_model_parallel_size=2",
        "policy.megatron_cfg.pipeline_model_parallel_size=2",
    ]
    rep = report(QWEN8, doomed, gpu="H100")
    assert [f.rule for f in rep.warnings if f.rule == "pp-scale-names"] == ["pp-scale-names"]
