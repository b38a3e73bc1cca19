"""The package layout: one folder per stage, documented row for row, no private imports.

The import layers, the independence of the two engines and the absence of cycles are checked by
import-linter (`uv run lint-imports`, contracts in pyproject.toml); this file checks what
import-linter cannot: what the package root holds, that docs/architecture.md's package map lists
exactly the package's folders, and that no module imports another module's `_private` names.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nemo_fp8_rl"
SHIMS = {"__init__.py", "train.py", "eval.py", "recipes.py", "submit.py", "compare.py", "env.py"}
SHIMS |= {"__main__.py"}  # `python -m nemo_fp8_rl <command>`: the dispatcher in cli/commands.py
SHIM_TARGET = {"__main__.py": "commands"}


def top_folders() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def test_package_root_holds_only_folders_and_command_shims() -> None:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules <= SHIMS, f"loose modules at the package root: {sorted(modules - SHIMS)}"
    for name in SHIMS - {"__init__.py"}:
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        target = SHIM_TARGET.get(name, name[:-3])
        assert imported == {f"nemo_fp8_rl.cli.{target}"}, f"{name} is more than a shim"


def test_architecture_map_lists_every_folder() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("## Package map", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([a-z0-9_/]+)` \|", table, flags=re.MULTILINE))
    engines = {f"engines/{p.name}" for p in (PACKAGE / "engines").iterdir() if p.is_dir()}
    engines.discard("engines/__pycache__")
    expected = top_folders() | engines | {"engines/nemo/preflight"}
    assert rows == expected


def private_imports(path: Path, base: Path = ROOT) -> list[str]:
    """`from nemo_fp8_rl.x import _name` in `path`, as 'file:line module._name' (file from `base`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nemo_fp8_rl"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(
                        f"{path.relative_to(base)}:{node.lineno} {node.module}.{alias.name}"
                    )
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in private_imports(path)]
    assert found == []


def test_private_import_check_finds_one(tmp_path: Path) -> None:
    """The check above can fail: a private import in a file under the tree is found."""
    probe = ROOT / "nemo_fp8_rl" / "analysis" / "render.py"
    text = probe.read_text() + "\nfrom nemo_fp8_rl.analysis.report import _run_lines\n"
    copy = tmp_path / "render.py"
    copy.write_text(text)
    hits = [h for h in private_imports(copy, tmp_path) if h.endswith("report._run_lines")]
    assert len(hits) == 1


# What a Ray worker imports without NeMo RL (the loss it unpickles, the shadow controls, the
# trainer-side refit, the vLLM-side checks), and what it must not load with them.
WORKER_SIDE = ("loss", "observations", "shadow_controls", "trainer_refit", "vllm_refit")
DRIVER_ONLY = (
    "nemo_fp8_rl.engines.nemo.driver",
    "nemo_fp8_rl.engines.nemo.preflight",
    "nemo_fp8_rl.engines.nemo.cpu",
    "nemo_fp8_rl.runs",
)


def test_worker_side_loads_nothing_of_the_driver_when_imported() -> None:
    """import-linter checks the worker side's own imports; this checks what importing it loads,
    parent packages' `__init__` included (a Ray worker runs those too)."""
    modules = ", ".join(f"nemo_fp8_rl.engines.nemo.worker.{m}" for m in WORKER_SIDE)
    code = f"import sys, {modules}; print(chr(10).join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert f"nemo_fp8_rl.engines.nemo.worker.{WORKER_SIDE[0]}" in loaded
    assert [m for m in loaded if m.startswith(DRIVER_ONLY)] == []


def test_tiny_kit_imports_only_config() -> None:
    """`tiny/` (the model, task, tokenizer, warm-up, sampling and hand-over every CPU run shares)
    is its own stage: it imports nothing of the package but `config` and itself, at module level
    or inside functions (the import contracts see only the former)."""
    found = []
    for path in sorted((PACKAGE / "tiny").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [
                f"{path.name}: {name}"
                for name in names
                if name.startswith("nemo_fp8_rl")
                and not name.startswith(("nemo_fp8_rl.config", "nemo_fp8_rl.tiny"))
            ]
    assert found == []
    assert (PACKAGE / "tiny" / "handover.py").is_file() and not (
        PACKAGE / "engines" / "local" / "model.py"
    ).exists()
