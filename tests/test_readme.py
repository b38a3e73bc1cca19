"""README is the front door: short, naming what the project builds on, every command line in it
one that runs, its recipe table the recipes on disk, its table of contents every page in docs/;
and the tables of docs/ that restate the code (exit codes, precision overlays) stay true.

The generated blocks (the evidence paragraph, the Setup costs) are regenerated and compared in
tests/test_docs_generated.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from nemo_fp8_rl.cli import recipes as recipes_cli
from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.completion import command_flags
from nemo_fp8_rl.cli.usage import EXIT_CODES
from nemo_fp8_rl.config import find_recipes, resolve_ref, short_name

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _code_lines(text: str) -> list[str]:
    """The command lines of the ```bash blocks, continuation lines joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        joined = block.replace("\\\n", " ")
        lines += [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]
    return lines


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, argv) of every `nemo_fp8_rl.<command>` or `-m nemo_fp8_rl.<command>` line."""
    found = []
    for line in _code_lines(text):
        words = shlex.split(line)
        for i, word in enumerate(words):
            if word.startswith("nemo_fp8_rl."):
                found.append((word.split(".", 1)[1], words[i + 1 :]))
                break
    return found


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 150
    for needed in ("Chen et al.", "arXiv 2609.22870", "NeMo RL's FP8 recipe", "## Setup",
                   "## The first hour", "## Recipes", "## Documentation"):  # fmt: skip
        assert needed in README, needed
    first_hour = README.split("## The first hour", 1)[1].split("\n## ", 1)[0]
    assert len(_code_lines(first_hour)) <= 15
    order = ["recipes cp", "nemo_fp8_rl.train", "nemo_fp8_rl.eval", "nemo_fp8_rl.compare",
             "refit export", "--engine nemo", "submit"]  # fmt: skip
    places = [first_hour.index(step) for step in order]
    assert places == sorted(places), "the first hour's steps are out of order"


@pytest.mark.parametrize("page", ["README.md", "docs/commands.md", "docs/recipes.md"])
def test_every_command_line_names_flags_and_recipes_that_exist(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    commands = _commands(text)
    assert commands, page
    for name, argv in commands:
        if name in ("completion",):
            continue
        flags = set(command_flags(name))
        for word in argv:
            flag = word.strip("[]|").split("=", 1)[0]  # `[--json]` in a usage line
            if flag.startswith("--") and not flag.startswith("---"):
                assert flag in flags, f"{page}: {name} has no {flag}"
        if "--recipe" in argv:
            ref = argv[argv.index("--recipe") + 1]
            placeholder = ref in ("R", "my-fp8.yaml", "my.yaml") or any(c in ref for c in "~$…<")
            if not placeholder:
                assert resolve_ref(ref), f"{page}: no recipe {ref}"


def test_the_first_hour_runs_as_written(tmp_path, monkeypatch, capsys):
    """The steps that need no finished run: the copy, the trainings' dry runs, the Slurm
    script; the others' flags are checked above, and their runs in the slow end-to-end test."""
    monkeypatch.chdir(tmp_path)
    steps = _commands(README.split("## The first hour", 1)[1].split("\n## ", 1)[0])
    for name, argv in steps:
        if name == "recipes":
            assert invoke(recipes_cli.main, argv) == 0, capsys.readouterr().err
        elif name == "train":
            code = invoke(train_cli.main, [*argv, "--dry-run"])
            engine = "--engine" in argv
            assert code == (3 if engine else 0) or code == 0, capsys.readouterr().err
        elif name == "submit":
            assert invoke(submit_cli.main, argv) == 0, capsys.readouterr().err
    assert (tmp_path / "my-fp8.yaml").is_file()


def _expand(pattern: str) -> list[str]:
    """`a-{x,y}` -> [a-x, a-y] (one brace group at most)."""
    found = re.search(r"\{([^}]*)\}", pattern)
    if not found:
        return [pattern]
    return [
        pattern[: found.start()] + v + pattern[found.end() :] for v in found.group(1).split(",")
    ]


@pytest.mark.parametrize(
    ("page", "heading"), [("README.md", "## Recipes"), ("docs/recipes.md", "## The recipes")]
)
def test_the_recipe_table_is_the_recipes_on_disk(page, heading):
    text = (ROOT / page).read_text(encoding="utf-8")
    table = text.split(heading, 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for cell in re.findall(r"^\| [^|]+ \| (.+?) \|", table, re.M):  # the header has no `
        for pattern in re.findall(r"`([^`]+)`", cell):
            if pattern.startswith("paper-fp8-rl/") or pattern.endswith("/"):
                continue  # the paper's set is counted below; `recipes/` is the header's
            if pattern.startswith("…"):
                pattern = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu" + pattern[1:]
            for name in _expand(pattern):
                assert (ROOT / "recipes" / f"{name}.yaml").is_file(), name
                named.add(name)
    on_disk = {short_name(p) for p in find_recipes()}
    left_out = {n for n in on_disk - named if not n.startswith(("study/", "paper-fp8-rl/"))}
    assert left_out == set()
    paper = [n for n in on_disk if n.startswith("paper-fp8-rl/")]
    assert f"({len(paper)} recipes" in table


@pytest.mark.parametrize(
    "page", ["README.md", "docs/recipes.md", "docs/cluster.md", "docs/commands.md"]
)
def test_pages_are_whole(page):
    """Every section starts with a sentence (no paragraph cut mid-sentence after a heading),
    every relative link names a file in the repository (and a heading there, for `#anchor`)."""
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    for first in re.findall(r"^## .*\n\n(.)", text, re.M):
        assert not first.islower(), f"{page}: a section starts mid-sentence ({first!r})"
    for target in re.findall(r"\]\(([^)#:]+)(#[^)]*)?\)", text):
        link, anchor = target
        linked = (path.parent / link).resolve()
        assert linked.exists(), f"{page}: link to {link}, not in the repository"
        if anchor and linked.suffix == ".md":
            slugs = {
                re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", linked.read_text(encoding="utf-8"), re.M)
            }
            assert anchor[1:] in slugs, f"{page}: {link}{anchor}: no such heading"


def test_the_table_of_contents_lists_every_page_of_docs():
    toc = README.split("## Documentation", 1)[1]
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", toc))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert pages | {"docs/study/README.md"} == linked
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_docs_exit_code_table_is_the_code():
    section = (ROOT / "docs/commands.md").read_text().split("## Exit codes", 1)[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section, re.M))
    assert {int(c) for c in rows} == {c for c, _ in EXIT_CODES}


def test_docs_precision_overlay_table_lists_every_overlay():
    section = (ROOT / "docs/recipes.md").read_text().split("## Precision overlays", 1)[1]
    rows = set(re.findall(r"^\| `([\w.-]+\.yaml)` \|", section.split("\n## ")[0], re.M))
    assert rows == {p.name for p in (ROOT / "configs" / "precision").glob("*.yaml")}
