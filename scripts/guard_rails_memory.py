"""The memory estimate of the guard rails against every published figure found.

    uv run python scripts/guard_rails_memory.py            # the Markdown table of docs/guard-rails.md
    uv run python scripts/guard_rails_memory.py --health   # the healthy-range table (health_ranges.yaml)

Reads `data/guard_rails/published.yaml` (each figure with its source) and the shipped
`config.json`s, and writes one row per figure: what was published, what the estimate
(`nemo_fp8_rl.guards.model_shapes`, `nemo_fp8_rl.guards.memory_model`) gives, and the error
`(estimate - published) / published`. Deterministic: no run, no download, no randomness.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.config import load_recipe  # noqa: E402
from nemo_fp8_rl.config.gpus import gpu_by_name  # noqa: E402
from nemo_fp8_rl.engines.nemo.driver.guard_rails import model_config  # noqa: E402
from nemo_fp8_rl.guards.memory_model import GIB, kv_bytes_per_token, vllm_parts  # noqa: E402
from nemo_fp8_rl.guards.model_shapes import count_params, embedding_params  # noqa: E402

DATA = ROOT / "data" / "guard_rails" / "published.yaml"
BEGIN, END = "<!-- memory-table:begin -->", "<!-- memory-table:end -->"
HEALTH_BEGIN, HEALTH_END = "<!-- health-table:begin -->", "<!-- health-table:end -->"


def _row(what: str, published: float, estimate: float, unit: str, source: str) -> str:
    error = (estimate - published) / published
    return f"| {what} | {published:,.6g} {unit} | {estimate:,.6g} {unit} | {100 * error:+.1f} % | {source} |"


def parameter_rows(figures: list[dict]) -> list[str]:
    rows = []
    for fig in figures:
        hf = model_config(fig["model"])
        count = count_params(hf)
        emb, head = embedding_params(hf)
        name = fig["model"].split("/")[-1]
        for key, value, label in (
            ("total", count.total, "parameters"),
            ("non_embedding", count.non_embedding, "parameters without embeddings"),
            ("active", count.active, "activated parameters per token"),
            ("active_non_embedding", count.active - emb - head, "activated, without embeddings"),
        ):
            if key in fig:
                rows.append(
                    _row(f"{name}: {label}", fig[key], round(value / 1e9, 3), "B", fig["source"])
                )
    return rows


def kv_token_rows(fig: dict) -> list[str]:
    """FP8 weights free `linear x (2 - 1 - 4/128^2)` bytes for KV; an FP8 KV cache halves a token."""
    cfg = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16").config
    hf = model_config(fig["model"])
    per_token = kv_bytes_per_token(cfg, hf)  # BF16 KV, vLLM TP 1 (the gain is TP-independent)
    freed = count_params(hf).linear * (1 - 4 / 128**2)
    gained = freed / per_token
    return [
        _row(
            "Qwen3-8B: KV tokens gained by FP8 weights",
            fig["fp8_linear"] - fig["bf16"],
            round(gained),
            "tokens",
            fig["source"],
        ),
        _row(
            "Qwen3-8B: KV tokens, FP8 KV cache over BF16 KV",
            fig["fp8_linear_kv"] / fig["fp8_linear"],
            2.0,
            "x",
            fig["source"],
        ),
    ]


def kv_gib_rows(figures: list[dict]) -> list[str]:
    rows = []
    h100 = gpu_by_name("H100")
    for fig in figures:
        recipe = load_recipe(fig["recipe"], fig["overrides"])
        hf = model_config(recipe.config["policy"]["model_name"])
        kv = next(p for p in vllm_parts(recipe.config, hf, h100.memory_gib) if p.name == "KV cache")
        util = recipe.config["policy"]["generation"]["vllm_cfg"]["gpu_memory_utilization"]
        what = f"{recipe.config['policy']['model_name'].split('/')[-1]}: vLLM {fig['vllm']} KV cache at utilization {util:g}, H100"
        rows.append(_row(what, fig["gib"], round(kv.gib, 2), "GiB", fig["source"]))
    return rows


def table() -> str:
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    head = [
        "| figure | published | estimate | error | source |",
        "|---|---|---|---|---|",
    ]
    rows = (
        parameter_rows(data["parameters"])
        + kv_token_rows(data["kv_tokens"])
        + kv_gib_rows(data["kv_gib"])
    )
    return "\n".join(head + rows)


def health_table() -> str:
    """`nemo_fp8_rl/guards/health_ranges.yaml` as a Markdown table: one row per rule and precision."""
    from nemo_fp8_rl.guards.health import PRECISIONS, load_table

    health = load_table()
    head = [
        f"Window: median rules {health.rules['fp8'][0].window} steps, share rules "
        f"{next(r.window for r in health.rules['fp8'] if r.statistic == 'share_above')} steps; "
        f"K = {health.consecutive} consecutive steps outside make one event.",
        "",
        "| metric | statistic | precision | healthy | source |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for i in range(len(health.rules["bf16"])):
        for precision in PRECISIONS:
            r = health.rules[precision][i]
            stat = "median" if r.statistic == "median" else f"share of steps above {r.level:g}"
            healthy = "not judged" if r.limit is None else f"< {r.limit:g}"
            rows.append(f"| `{r.metric}` | {stat} | {precision} | {healthy} | {r.source} |")
    control = health.control
    rows.append(
        f"| `{control['metric']}` | median over the run, FP8 / BF16 control | fp8 vs bf16 | "
        f"< {control['limit']:g}x | {control['source']} |"
    )
    return "\n".join(head + rows)


if __name__ == "__main__":
    print(health_table() if "--health" in sys.argv[1:] else table())
    del GIB
