"""Contract with NeMo RL's evaluation tools (`NEMO_RL_SRC`, Python >= 3.12; run with
`scripts/nemo-rl-contract.sh /path/to/nemo-rl`).

For every benchmark of the `math8` suite that the tree can load (plus one from a local file, the
route for the benchmarks NeMo RL lacks), the config `nemo_fp8_rl.eval` writes goes through NeMo
RL's real `examples/run_eval.py` `main()`: NeMo RL's config loader (`defaults:` to its own
`eval.yaml`), its `MasterConfig`, `configure_generation_config`, the data set look-up
(`load_eval_dataset` / the response-dataset registry) and `AllTaskProcessedDataset` with the
tree's prompt file. Replaced, by recorders named as such, is only what needs a GPU, a Ray cluster
or the network: `init_ray`, `setup` (vLLM), `run_env_eval`, `create_env` (a Ray actor), the HF
tokenizer download and the data set classes that download (they return one problem). The
converter's real `main()` runs up to `export_model_from_megatron` (Megatron on a GPU), recorded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.evals import nemo
from nemo_fp8_rl.evals.suites import MATH8, nemo_dataset

SRC = os.environ.get("NEMO_RL_SRC")
pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(
        not SRC or sys.version_info < (3, 12) or importlib.util.find_spec("nemo_rl") is None,
        reason="needs NEMO_RL_SRC and NeMo RL importable on Python >= 3.12 "
        "(scripts/nemo-rl-contract.sh /path/to/nemo-rl)",
    ),
]
RECIPE = "paper-fp8-rl/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-8k-fp8-blockwise"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    """Stands in for a GPU/Ray/network call; records its arguments."""

    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.result(*args, **kwargs) if callable(self.result) else self.result


def _tokenizer():
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tok


def _patch_datasets(monkeypatch, picked: list):
    """Data set classes that would download: recorders returning one problem."""
    from datasets import Dataset
    from nemo_rl.data import processors
    from nemo_rl.data.datasets import eval_datasets
    from nemo_rl.data.interfaces import TaskDataSpec

    class RecordingEvalDataset:
        def __init__(self, variant=None, prompt_file=None, system_prompt_file=None, **kw):
            picked.append((type(self).__name__, variant))
            self.rekeyed_ds = Dataset.from_list(
                [{"problem": "What is 1+1?", "expected_answer": "2"}]
            )
            self.task_spec = TaskDataSpec(
                "math", prompt_file=prompt_file, system_prompt_file=system_prompt_file
            )
            self.processor = processors.math_data_processor

    for cls in ("AIMEDataset", "MathDataset"):
        if hasattr(eval_datasets, cls):
            monkeypatch.setattr(
                eval_datasets, cls, type(f"Recording{cls}", (RecordingEvalDataset,), {})
            )
    try:
        from nemo_rl.data.datasets.raw_dataset import RawDataset
        from nemo_rl.data.datasets.response_datasets import DATASET_REGISTRY
    except ImportError:
        return

    class RecordingAIMEDataset(RawDataset):
        def __init__(self, variant="2024", **kw):
            picked.append(("RecordingAIMEDataset", variant))
            self.task_name = f"AIME{variant}"
            msgs = [
                {"role": "user", "content": "What is 1+1?"},
                {"role": "assistant", "content": "2"},
            ]
            self.dataset = Dataset.from_list([{"messages": msgs, "task_name": self.task_name}])

    for year in ("2024", "2025"):
        if f"AIME{year}" in DATASET_REGISTRY:
            monkeypatch.setitem(
                DATASET_REGISTRY,
                f"AIME{year}",
                lambda *, _y=year, **kw: RecordingAIMEDataset(_y, **kw),
            )


def _benchmarks(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(json.dumps({"problem": "What is 2+3?", "answer": "5"}) + "\n")
    tree = Path(SRC)
    return [b for b in MATH8.benchmarks if nemo_dataset(b, tree) or b.name == "amc23"], data


def test_run_eval_main_accepts_every_suite_config(tmp_path, monkeypatch):
    tree = nemo.nemo_rl_tree()
    run_eval = _load(tree / nemo.RUN_EVAL, "nemo_rl_run_eval")
    run_cfg = load_recipe(RECIPE).config
    benches, data = _benchmarks(tmp_path)
    assert {b.name for b in benches} == {"aime24", "aime25", "math500", "amc23"}
    for bench in benches:
        picked: list = []
        _patch_datasets(monkeypatch, picked)
        cfg = nemo.eval_config(
            tree, run_cfg, tmp_path / "hf", MATH8, bench, tmp_path / bench.name, data
        )
        path = nemo.write_eval_config(cfg, tmp_path / "cfg" / bench.name)
        setup = Recorder(lambda config, tokenizer, dataset: (None, None, config))
        recorders = {
            "init_ray": Recorder(),
            "get_tokenizer": Recorder(lambda *a, **k: _tokenizer()),
            "setup": setup,
            "run_env_eval": Recorder(),
            "create_env": Recorder(),
        }
        for name, rec in recorders.items():
            monkeypatch.setattr(run_eval, name, rec)
        monkeypatch.setattr(sys, "argv", ["run_eval.py", "--config", str(path)])
        run_eval.main()
        ((args, _),) = setup.calls
        master, dataset = args[0], args[2]
        assert master.eval["num_tests_per_prompt"] == bench.samples
        assert master.generation["model_name"] == str(tmp_path / "hf")
        assert master.generation["temperature"] == 0.6 and master.generation["top_p"] == 0.95
        assert master.data["dataset_name"] == cfg["data"]["dataset_name"]
        if bench.name == "amc23":  # the real LocalMathDataset read the local file
            assert picked == []
        else:
            assert picked and not picked[0][0].startswith("LocalMath")
        sample = dataset[0]  # NeMo RL's processor with the recipe's prompt file, real
        assert sample["message_log"] and "extra_env_info" in sample
        assert recorders["run_env_eval"].calls and recorders["create_env"].calls


def test_converter_main_takes_the_arguments(tmp_path, monkeypatch):
    tree = nemo.nemo_rl_tree()
    export = Recorder()
    fake = type(sys)("nemo_rl.models.megatron.community_import")
    fake.export_model_from_megatron = export  # recorder: the export itself needs Megatron on a GPU
    monkeypatch.setitem(sys.modules, "nemo_rl.models.megatron.community_import", fake)
    converter = _load(tree / nemo.CONVERTER, "nemo_rl_converter")
    ckpt = tmp_path / "step_40"
    (ckpt / "policy" / "weights" / "iter_0000040").mkdir(parents=True)
    run_cfg = load_recipe(RECIPE).config
    (ckpt / "config.yaml").write_text(json.dumps({"policy": run_cfg["policy"]}))
    cmd = nemo.convert_command(tree, ckpt, tmp_path / "hf", "Qwen/Qwen3-8B-Base")
    # launched as the converter's docstring says: NeMo RL's environment with its mcore extra
    assert cmd[:5] == ["uv", "run", "--extra", "mcore", "python"]
    assert (tree / cmd[5]).resolve() == (tree / nemo.CONVERTER).resolve()
    monkeypatch.setattr(sys, "argv", cmd[5:])
    converter.main()
    ((_, kwargs),) = export.calls
    assert kwargs["hf_model_name"] == "Qwen/Qwen3-8B-Base"
    assert kwargs["input_path"] == str(ckpt / "policy/weights/iter_0000040")
    assert kwargs["output_path"] == str(tmp_path / "hf")


def test_checkpoint_selection_uses_nemo_rl_checkpoint_manager(tmp_path):
    from nemo_fp8_rl.evals.checkpoints import select_nemo

    for step, acc in {20: 0.30, 40: 0.35, 60: 0.32}.items():
        d = tmp_path / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "training_info.json").write_text(json.dumps({"val:accuracy": acc}))
    cfg = load_recipe(RECIPE).config["checkpointing"]
    assert select_nemo(tmp_path, "best", cfg).step == 40
    assert select_nemo(tmp_path, "last", cfg).step == 60
