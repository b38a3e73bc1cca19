"""The numbers in README.md and docs/study/ are what the committed scripts write from the
committed data: each generated block is regenerated here and compared with the file.

- docs/study/README.md, study tables: `python -m nemo_fp8_rl.study --analyse-only
  --out docs/study/runs` (per-step metrics of every run, `docs/study/runs/`);
- README.md, evidence paragraph: `scripts/readme_evidence.py` (the same runs, the mechanism
  results and the link-B archive);
- README.md, Setup costs: `benchmarks/bench_setup.py table` (`benchmarks/setup/*.json`, each a
  measurement of the two Setup commands on a fresh clone);
- docs/study/README.md, link-B table: `scripts/link_b_sweep.py table` (docs/study/link-b/runs/);
- docs/study/README.md, power table: `scripts/study_power.py` (the same committed runs);
- docs/study/README.md, mechanism table: `scripts/fp8_mechanism.py --table
  docs/study/mechanism.jsonl`;
- docs/launch.md, launches under load: `benchmarks/bench_ray_start.py --table
  benchmarks/launches/*.json` (every launch the benchmark saved);
- docs/study/rescue.md, rescue tables: `scripts/rescue_study.py table --write`
  (docs/study/rescue/runs/);
- README.md holds no single-seed tiny-run table (its runs are not committed);
- the warm-up starting policies the study names are the shipped ones (`data/warmup/`).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.study import main as study_main
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.study.report import BEGIN, END

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_BEGIN, LAUNCH_END = "<!-- launch-table:begin -->", "<!-- launch-table:end -->"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(path: Path, begin: str, end: str) -> str:
    text = path.read_text(encoding="utf-8")
    found = re.findall(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), text, re.DOTALL)
    assert len(found) == 1, f"{path}: one {begin} … {end} block expected"
    return found[0].strip()


@pytest.fixture(scope="module")
def study_report(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("study-report")
    code = invoke(study_main, ["--analyse-only", "--out", str(ROOT / "docs/study/runs"),
                               "--report", str(dest)])  # fmt: skip
    assert code == 0
    return dest


def test_study_tables_in_docs_match_the_committed_runs(study_report):
    generated = (study_report / "tables.md").read_text(encoding="utf-8").strip()
    assert _block(ROOT / "docs/study/README.md", BEGIN, END) == generated


def test_study_results_match_the_committed_runs(study_report):
    results = json.loads((study_report / "results.json").read_text())
    committed = json.loads((ROOT / "docs/study/results.json").read_text())
    assert results == committed


def test_readme_evidence_paragraph_matches_the_committed_runs():
    evidence = _script("readme_evidence")
    assert _block(ROOT / "README.md", evidence.BEGIN, evidence.END) == evidence.paragraph()
    assert BEGIN not in (ROOT / "README.md").read_text(encoding="utf-8")  # no study table


def test_readme_setup_cost_matches_the_saved_measurements():
    spec = importlib.util.spec_from_file_location("setup", ROOT / "benchmarks/bench_setup.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    saved = sorted((ROOT / "benchmarks/setup").glob("*.json"))
    assert saved, "no saved Setup measurement"
    assert _block(ROOT / "README.md", bench.BEGIN, bench.END) == bench.table(saved).strip()


def test_mechanism_table_matches_the_committed_results():
    mech = _script("fp8_mechanism")
    table = mech.table(ROOT / "docs/study/mechanism.jsonl")
    assert _block(ROOT / "docs/study/README.md", mech.BEGIN, mech.END) == table.strip()


def test_power_table_matches_the_committed_runs():
    spec = importlib.util.spec_from_file_location("power", ROOT / "scripts/study_power.py")
    power = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(power)
    assert _block(ROOT / "docs/study/README.md", power.BEGIN, power.END) == power.table().strip()


def test_link_b_table_matches_the_committed_ablation_runs():
    spec = importlib.util.spec_from_file_location("link_b", ROOT / "scripts/link_b_sweep.py")
    link_b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(link_b)
    begin, end = "<!-- link-b-table:begin -->", "<!-- link-b-table:end -->"
    assert _block(ROOT / "docs/study/README.md", begin, end) == link_b.markdown().strip()
    settings = _block(ROOT / "docs/study/README.md", link_b.SETTINGS_BEGIN, link_b.SETTINGS_END)
    assert settings == link_b.settings_markdown()


def test_launch_table_matches_the_committed_launches():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks/bench_ray_start.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    files = sorted((ROOT / "benchmarks/launches").glob("*.json"))
    assert files, "no saved launches"
    table = bench.table(files)
    assert _block(ROOT / "docs/launch.md", LAUNCH_BEGIN, LAUNCH_END) == table.strip()


def test_the_readme_holds_no_table_without_committed_data():
    assert "<!-- tiny-table:begin -->" not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_study_runs_started_from_the_shipped_warmups():
    from nemo_fp8_rl.study.analysis import read_records

    study = load_recipe(ROOT / "recipes/study/grpo-study-bf16.yaml").config["local"]
    shipped = {}
    for meta in (ROOT / "data/warmup").glob("*/meta.json"):
        info = json.loads(meta.read_text())
        if info["config"]["model"] == study["model"] and info["config"]["task"] == study["task"]:
            shipped[info["seed"]] = (info["steps"], info["accuracy"])
    for run in (ROOT / "docs/study/runs").glob("*/seed-*"):
        start = read_records(run)[0]
        seed = int(run.name.split("-")[1])
        assert (start["warmup/steps"], start["warmup/accuracy"]) == pytest.approx(shipped[seed])


def test_rescue_tables_match_the_archived_runs():
    from nemo_fp8_rl.study import rescue, rescue_report

    marks = rescue.BLOCK
    text = rescue.PAGE.read_text(encoding="utf-8")
    body = text.split(marks[0], 1)[1].split(marks[1], 1)[0].strip()
    assert body == rescue_report.markdown().strip()


def test_calibration_cost_table_matches_the_committed_runs():
    cost = _script("calibration_cost")
    assert _block(cost.PAGE, *cost.BLOCK) == cost.table().strip()


def test_rescue_reproducibility_numbers_are_the_recorded_ones():
    from nemo_fp8_rl.study import rescue

    rec = json.loads((rescue.DOCS / "reproducibility.json").read_text(encoding="utf-8"))
    text = rescue.PAGE.read_text(encoding="utf-8")
    assert not rec["identical"]
    assert f"{rec['values_differing']:,} of {rec['values_compared']:,} non-timing values" in text
    assert rec["provenance"]["start"]["commit"][:7] in text
