"""A local Hugging Face Hub cache for the preflight: the model's real config, a tiny tokenizer, data.

NeMo RL loads the tokenizer (`AutoTokenizer.from_pretrained(model_name)`) and the model config
(`AutoConfig.from_pretrained(model_name)`, in the vLLM and Megatron workers) from the Hub. The
preflight writes a Hub cache folder holding, for the recipe's model, the model's real
`config.json` (shipped in `model_configs/`, public values of the model card's file; for another
model, the user's: a local folder, the Hugging Face cache, or `$NEMO_FP8_RL_MODEL_CONFIGS`) and a tiny
character tokenizer with a chat template, then points `huggingface_hub` at it in offline mode;
NeMo RL's own calls resolve there unchanged. Hub data sets come from `dataset_sample`: a few
synthetic rows with the real data set's columns, so NeMo RL's own `format_data` and processors run.
"""

from __future__ import annotations

import contextlib
import json
import os
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.user_error import UserError

MODEL_CONFIGS = Path(__file__).parents[1] / "model_configs"
SNAPSHOT = "0" * 40  # the cache's revision name for our files
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class NoLocalCopy(UserError, FileNotFoundError):
    """The preflight has no local copy of something NeMo RL would download: what is missing
    (`what`), how to provide it (`fix`) and the recipe key that names it (`key`)."""

    def __init__(self, what: str, fix: str, key: str | None = None) -> None:
        super().__init__(key or "preflight", what, fix)
        self.key = key


def shipped_models() -> list[str]:
    """Model names whose config.json ships with the package."""
    return sorted(p.stem.replace("--", "/") for p in MODEL_CONFIGS.glob("*.json"))


USER_CONFIGS = "NEMO_FP8_RL_MODEL_CONFIGS"  # a folder of <org>--<name>.json files


def hub_cache() -> Path:
    """The Hugging Face Hub cache folder as `huggingface_hub` resolves it from the environment:
    `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = (
        os.environ.get("HF_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    )
    return Path(home).expanduser() / "hub"


def config_candidates(model_name: str) -> list[Path]:
    """Where `model_name`'s config.json may be, in the order they are tried: the package's
    shipped copy, `model_name` itself as a local folder (NeMo RL loads such a path), the
    Hugging Face cache (`refs/main`'s snapshot first, then any), and `$NEMO_FP8_RL_MODEL_CONFIGS`."""
    flat = f"{model_name.replace('/', '--')}.json"
    found = [MODEL_CONFIGS / flat, Path(model_name).expanduser() / "config.json"]
    repo = hub_cache() / f"models--{model_name.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        found.append(repo / "snapshots" / ref.read_text().strip() / "config.json")
    found += sorted(repo.glob("snapshots/*/config.json"))
    if os.environ.get(USER_CONFIGS):
        found.append(Path(os.environ[USER_CONFIGS]).expanduser() / flat)
    return found


def model_config(model_name: str) -> dict[str, Any]:
    """`model_name`'s config.json from the first of `config_candidates` that holds one
    (NoLocalCopy, saying where it looked and how to provide one, if none does)."""
    for path in config_candidates(model_name):
        if path.is_file():
            return json.loads(path.read_text())
    flat = f"{model_name.replace('/', '--')}.json"
    raise NoLocalCopy(
        f"no config.json for {model_name}: the preflight reads the model's real config.json and "
        f"found none (the package ships {len(shipped_models())} models' configs; "
        f"{model_name} is no local folder and not in the Hugging Face cache {hub_cache()})",
        f"download it, `huggingface-cli download {model_name} config.json` (the cache "
        f"follows HF_HOME or HF_HUB_CACHE), or set policy.model_name to a local folder holding "
        f"config.json, or put the file as {flat} in a folder named by {USER_CONFIGS}",
        "policy.model_name",
    )


def _tiny_tokenizer(config: dict[str, Any]) -> Any:
    """Character tokenizer (printable ASCII + chat markers), with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(string.printable)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
        additional_special_tokens=specials[3:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_model(cache: Path, model_name: str) -> Path:
    """Put `model_name`'s config.json and the tiny tokenizer into the Hub cache `cache`."""
    repo = cache / f"models--{model_name.replace('/', '--')}"
    snap = repo / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    config = model_config(model_name)
    write_atomic(snap / "config.json", json.dumps(config, indent=2))
    _tiny_tokenizer(config).save_pretrained(snap)  # safe-write: private (the preflight's cache)
    (repo / "refs").mkdir(exist_ok=True)
    write_atomic(repo / "refs" / "main", SNAPSHOT)
    return snap


@contextlib.contextmanager
def offline_hub(cache: Path) -> Iterator[Path]:
    """`huggingface_hub` reads `cache`, offline, for the duration (restored afterwards)."""
    from huggingface_hub import constants

    saved = (constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE)
    env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_DATASETS_OFFLINE")}
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = str(cache), True
    os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_DATASETS_OFFLINE="1")
    try:
        yield cache
    finally:
        constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = saved
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _math_rows(n: int) -> list[tuple[str, str]]:
    return [(f"What is {i} + {i + 1}?", str(2 * i + 1)) for i in range(n)]


def _openmathinstruct2(n: int) -> list[dict[str, Any]]:
    return [
        {
            "problem": q,
            "generated_solution": f"\\boxed{{{a}}}",
            "expected_answer": a,
            "problem_source": "synthetic",
        }
        for q, a in _math_rows(n)
    ]


def _dapo(n: int) -> list[dict[str, Any]]:
    return [
        {
            "data_source": "synthetic",
            "prompt": [{"content": q, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(i)},
        }
        for i, (q, a) in enumerate(_math_rows(n))
    ]


def _deepscaler(n: int) -> list[dict[str, Any]]:
    return [{"problem": q, "answer": a, "solution": f"\\boxed{{{a}}}"} for q, a in _math_rows(n)]


def _aime2024(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "problem": q,
            "solution": f"\\boxed{{{a}}}",
            "answer": a,
            "url": "",
            "year": "2024",
        }
        for i, (q, a) in enumerate(_math_rows(n))
    ]


# Columns of the Hub data sets the shipped recipes use (as NeMo RL's format_data reads them).
DATASET_ROWS = {
    "agentica-org/DeepScaleR-Preview-Dataset": _deepscaler,
    "HuggingFaceH4/aime_2024": _aime2024,
    "nvidia/OpenMathInstruct-2": _openmathinstruct2,
    "BytedTsinghua-SIA/DAPO-Math-17k": _dapo,
    "BytedTsinghua-SIA/AIME-2024": _dapo,
}


def dataset_sample(repo: str, rows: int = 512) -> list[dict[str, Any]]:
    """`rows` synthetic rows with the columns of Hub data set `repo` (NoLocalCopy if unknown)."""
    make = DATASET_ROWS.get(repo)
    if make is None:
        raise NoLocalCopy(
            f"the preflight has no local sample of the Hub data set {repo!r}",
            "add its columns to nemo_fp8_rl/engines/nemo/preflight/offline_hub.py DATASET_ROWS",
        )
    return make(rows)
