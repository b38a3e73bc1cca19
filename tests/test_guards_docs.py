"""docs/guard-rails.md holds what the code and the committed data say: the catalogue (one row
per check, with its upstream issue), the healthy-range table (`health_ranges.yaml`) and the
memory estimate against the published figures (`scripts/guard_rails_memory.py` over
`data/guard_rails/published.yaml`); README links the page."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from nemo_fp8_rl.guards.catalogue import CATALOGUE

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "guard-rails.md").read_text()


def _script():
    spec = importlib.util.spec_from_file_location("grm", ROOT / "scripts" / "guard_rails_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(begin: str, end: str) -> str:
    return DOC.split(begin, 1)[1].split(end, 1)[0].strip()


def test_catalogue_has_one_row_per_check_with_its_upstream_issue():
    rows = [
        line
        for line in DOC.split("## Catalogue", 1)[1].split("\n## ", 1)[0].splitlines()
        if line.startswith("| `")
    ]
    assert [r.split("`")[1] for r in rows] == [e.check for e in CATALOGUE]
    for row, entry in zip(rows, CATALOGUE, strict=True):
        assert row.rstrip(" |").endswith(entry.upstream), row
        assert f"| {entry.when} |" in row


def test_generated_tables_match_the_committed_data():
    grm = _script()
    assert _block(grm.BEGIN, grm.END) == grm.table()
    assert _block(grm.HEALTH_BEGIN, grm.HEALTH_END) == grm.health_table()


def test_readme_links_the_page():
    assert "(docs/guard-rails.md)" in (ROOT / "README.md").read_text()
