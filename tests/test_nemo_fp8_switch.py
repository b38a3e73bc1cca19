"""Switching Megatron-Core's FP8 compute off for the BF16 shadow pass, on a real GPTModel (CPU).

Which Megatron-Core: NeMo RL takes it from Megatron-Bridge's Megatron-LM submodule. NeMo RL main
7ea279a pins Megatron-Bridge 8c46dc4, whose Megatron-LM is 14346b65 (main of 2026-08-12, version
0.20.0 in development); v0.7.0 pins a Megatron-Bridge fork commit (151168f, Megatron-Bridge
554c7b9 with a Megatron-LM bump) whose base Megatron-LM is 00225507 (0.19.0 in development).
Neither is on PyPI; the contract environment (scripts/nemo-rl-contract.sh) installs
megatron-core 0.19.2, whose FP8 forward path is the same code as at 14346b65:
`transformer/transformer_block.py` is identical, `fp8_utils.get_fp8_context` and
`get_fp8_recipe` are identical (also at 00225507), and the remaining differences on the GPTModel
forward are an optional output-layer `logit_dtype` (gpt_model.py), a new, uncalled
`get_fp8_disabled_context` (fp8_utils.py) and `get_inner_quantization_context`, used only by
the fine-grained MoE overlap schedule (transformer_layer.py). 00225507's transformer_block.py
differs from 0.19.2's by two lines (CUDA-graph layer annotation, `cuda_graph_impl: local` only).
The main environment's megatron-core 0.16.1 shares the same `get_fp8_context`.

Transformer Engine is not installed on CPU, so `TransformerEngineRecorder` stands in for it where
megatron-core enters it; the FP8 decisions (`TransformerBlock.forward`, the TE branch of
`get_fp8_context`, `is_first_last_bf16_layer`) are megatron-core's own code. The BF16-vs-FP8
numerics on a GPU are tests/test_nemo_fp8_switch_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from megatron_fixture import TinyGPT, build_megatron_gpt, cpu_megatron, megatron_logits

from nemo_fp8_rl.engines.nemo.worker.fp8_switch import Fp8ComputeSwitch, transformer_configs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gpt():
    """A real megatron-core GPTModel; the tests run inside its single-process CPU setup."""
    with cpu_megatron():
        model = build_megatron_gpt(TinyGPT(num_layers=2))
        yield model


def test_switch_turns_fp8_off_everywhere_and_restores_it(gpt) -> None:
    configs = transformer_configs([gpt])  # NeMo RL holds a list of model chunks
    assert configs and all(c is gpt.config for c in configs)  # modules share one config
    gpt.config.fp8 = "e4m3"
    switch = Fp8ComputeSwitch()
    assert switch.set(gpt, enabled=False) == len(configs)
    assert switch.fp8_off and all(c.fp8 is None for c in configs)
    assert switch.set(gpt, enabled=False) == 0  # idempotent: the saved value stays "e4m3"
    tokens = torch.randint(0, 256, (2, 8))
    assert torch.isfinite(megatron_logits(gpt, tokens)).all()  # the BF16 forward runs
    assert switch.set(gpt, enabled=True) == len(configs)
    assert gpt.config.fp8 == "e4m3" and not switch.fp8_off
    assert switch.set(gpt, enabled=True) == 0
    gpt.config.fp8 = None


def test_fp8_parameters_have_no_bf16_reference(gpt) -> None:
    gpt.config.fp8, gpt.config.fp8_param = "e4m3", True
    try:
        with pytest.raises(RuntimeError, match="fp8_param: false"):
            Fp8ComputeSwitch().set(gpt, enabled=False)
        assert gpt.config.fp8 == "e4m3"  # nothing changed
    finally:
        gpt.config.fp8, gpt.config.fp8_param = None, False


def test_modules_without_config_are_ignored() -> None:
    assert transformer_configs(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []


# ---- FP8 contexts per forward, on megatron-core's own code path ------------------------------


class TransformerEngineRecorder:
    """Recorder for Transformer Engine at the point megatron-core enters it (TE is not on CPU).

    `get_fp8_context` (its TE branch) calls `transformer_engine.pytorch.fp8_autocast(enabled=True,
    fp8_recipe=..., fp8_group=...)` for each FP8 region; this records every context entered, and
    stands in for TE's recipe objects (`get_fp8_recipe` builds TE classes).
    """

    class DelayedScaling:  # the type `get_fp8_context` checks the recipe against
        pass

    def __init__(self) -> None:
        self.entered: list[dict] = []
        self.pytorch = self  # transformer_engine.pytorch.fp8_autocast

    def fp8_autocast(self, **kwargs):
        recorder = self

        class _Context:
            def __enter__(self):
                recorder.entered.append(kwargs)

            def __exit__(self, *exc):
                return False

        return _Context()

    def fp8_model_init(self, **kwargs):  # pragma: no cover - only with fp8_param: true
        raise AssertionError("fp8_model_init entered: parameters would be stored in FP8")

    def get_fp8_recipe(self, config):
        return self.DelayedScaling() if config.fp8_recipe == "delayed" else ("recipe", config.fp8)


def _defines(node, name: str) -> bool:
    import ast

    return isinstance(node, ast.FunctionDef) and node.name == name


def megatron_te_get_fp8_context(recorder: TransformerEngineRecorder):
    """megatron-core's TE-branch `get_fp8_context`, compiled from the installed fp8_utils.py.

    Without TE, fp8_utils defines only the stub that returns a null context; the TE branch (the
    function NeMo RL's workers run) is taken from the same file, unchanged, and bound to the
    module's globals with the recorder as `transformer_engine`.
    """
    import ast
    from pathlib import Path

    import megatron.core.fp8_utils as fp8_utils

    source = Path(fp8_utils.__file__).read_text()
    te_branches = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "HAVE_TE"
    ]
    [branch] = [b for b in te_branches if any(_defines(i, "get_fp8_context") for i in b.body)]
    [definition] = [item for item in branch.body if _defines(item, "get_fp8_context")]
    # The branch's own megatron imports (parallel_state) run for real; TE and megatron's TE
    # wrappers (TEDelayedScaling) are the recorder's.
    megatron_imports = [
        item
        for item in branch.body
        if isinstance(item, ast.ImportFrom)
        and (item.module or "").startswith("megatron")
        and "transformer_engine" not in item.module
    ]
    namespace = {
        **vars(fp8_utils),
        "transformer_engine": recorder,
        "get_fp8_recipe": recorder.get_fp8_recipe,
        "TEDelayedScaling": recorder.DelayedScaling,
    }
    body = [*megatron_imports, definition]
    exec(compile(ast.Module(body=body, type_ignores=[]), fp8_utils.__file__, "exec"), namespace)
    return namespace["get_fp8_context"]


@pytest.fixture
def te_recorder(monkeypatch) -> TransformerEngineRecorder:
    """The recorder, with the TE `get_fp8_context` where TransformerBlock looks it up."""
    import megatron.core.fp8_utils as fp8_utils
    import megatron.core.transformer.transformer_block as transformer_block

    recorder = TransformerEngineRecorder()
    te_context = megatron_te_get_fp8_context(recorder)
    monkeypatch.setattr(transformer_block, "get_fp8_context", te_context)
    monkeypatch.setattr(fp8_utils, "get_fp8_context", te_context)
    return recorder


@pytest.mark.parametrize(
    ("recipe", "scope"),
    [
        ("blockwise", "per layer"),
        ("tensorwise", "per layer"),
        ("delayed", "whole block"),
        ("blockwise", "first layer in BF16"),
    ],
)
def test_fp8_contexts_per_forward_follow_the_switch(gpt, te_recorder, recipe, scope):
    """FP8 regions entered per forward: one per layer (one around the block for delayed
    scaling) with FP8 on, none during the shadow pass, the same again after it."""
    from megatron.core.enums import Fp8Recipe

    per_forward = {"per layer": gpt.config.num_layers, "whole block": 1}.get(
        scope, gpt.config.num_layers - 1
    )

    tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    cfg = gpt.config
    settings = {"fp8": "hybrid", "fp8_recipe": Fp8Recipe(recipe)}
    if scope == "first layer in BF16":  # megatron-core's is_first_last_bf16_layer decides
        settings |= {
            "first_last_layers_bf16": True,
            "num_layers_at_start_in_bf16": 1,
            "num_layers_at_end_in_bf16": 0,
        }
    saved = {key: getattr(cfg, key) for key in settings}
    for key, value in settings.items():
        setattr(cfg, key, value)
    switch = Fp8ComputeSwitch()
    counts = []
    try:
        for enabled in (True, False, True):
            switch.set(gpt, enabled=enabled)
            before = len(te_recorder.entered)
            megatron_logits(gpt, tokens)
            counts.append(len(te_recorder.entered) - before)
    finally:
        switch.set(gpt, enabled=True)
        for key, value in saved.items():
            setattr(cfg, key, value)
    assert counts == [per_forward, 0, per_forward]  # FP8 on, BF16 shadow pass, FP8 again
    assert all(kw["enabled"] is True for kw in te_recorder.entered)
    if recipe != "delayed":
        assert all(kw["fp8_recipe"] == ("recipe", "hybrid") for kw in te_recorder.entered)
