"""Every write goes through the safe-write module (`config.safe_files`), and it loses nothing.

The scan walks the syntax tree of every module of the package, `scripts/` and `benchmarks/`
and lists each call that writes a file: `open`/`Path.open`/`os.fdopen`/`gzip.open` with a
write mode, `write_text`, `write_bytes`, `shutil.copy*`/`copytree`/`move`, `savefig`,
`save_pretrained`, `save_file`, `torch.save`, `os.replace`/`os.rename`/`Path.rename`. Outside
`safe_files` each must carry a `# safe-write: <reason>` comment with a reason of `REASONS`: the
writer fills a folder this process just created (`private`: mkdtemp, a TemporaryDirectory,
`write_folder`'s build), a memory buffer (`buffer`), a descriptor opened without following a link
(`fd`), or renames its own temporary file over a target (`rename`: a rename replaces a link, it
never writes through it); a writer inside `write_atomic_with`'s fill argument writes into its
handle and needs no mark. Anything else is a writer outside the safe path.

The cases then hold the data-loss cases to the real commands and scripts: a link planted where
they write is refused and the file it points to untouched; a user's files in a report folder,
in `logs/` or in `checkpoints/` are never replaced or deleted.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("nemo_fp8_rl", "scripts", "benchmarks")
SAFE_MODULE = ROOT / "nemo_fp8_rl" / "config" / "safe_files.py"
REASONS = ("private", "buffer", "fd", "rename")
WRITE_METHODS = {
    "write_text",
    "write_bytes",
    "savefig",
    "save_pretrained",
    "save_file",
    "copyfile",
    "copy",
    "copy2",
    "copytree",
    "move",
    "replace",
    "rename",
}
OPENERS = {"open", "fdopen", "GzipFile"}


def _mode(call: ast.Call) -> str | None:
    """The constant mode string of an open-like call (second positional or `mode=`)."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
    position = 0 if isinstance(call.func, ast.Attribute) and name == "open" else 1
    if isinstance(call.func, ast.Attribute) and call.func.attr == "open":
        base = call.func.value  # os.open / gzip.open take the path first, Path.open does not
        if isinstance(base, ast.Name) and base.id in ("gzip", "io", "builtins", "codecs"):
            position = 1
        elif isinstance(base, ast.Name) and base.id == "os":
            return None  # os.open: flags, checked through open_nofollow's callers
    args = [
        *call.args[position : position + 1],
        *(k.value for k in call.keywords if k.arg == "mode"),
    ]
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
    return None


def _writes(call: ast.Call) -> bool:
    """Whether `call` writes a file (module docstring's list)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in OPENERS:
        mode = _mode(call)
        return mode is not None and any(c in mode for c in "wax+")
    if name == "save":  # torch.save(obj, path_or_handle)
        return isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "torch"
    if name in ("replace", "rename") and isinstance(func, ast.Attribute):
        # str.replace(a, b) is text: only os.replace / os.rename and Path(...).rename count
        return getattr(func.value, "id", "") == "os" or name == "rename"
    return name in WRITE_METHODS - {"replace", "rename", "copy"} or (
        name == "copy" and getattr(getattr(func, "value", None), "id", "") == "shutil"
    )


def _inside_safe_writers(tree: ast.AST) -> set[int]:
    """The calls inside the arguments of `write_atomic_with(path, fill)`: they write into the
    handle the safe writer gives them (`lambda f: fig.savefig(f)`), never to a path."""
    out: set[int] = set()
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        name = getattr(func, "attr", None) or getattr(func, "id", None)
        if isinstance(node, ast.Call) and name == "write_atomic_with":
            for arg in node.args[1:]:
                out |= {id(n) for n in ast.walk(arg) if isinstance(n, ast.Call)}
    return out


def writer_calls() -> list[tuple[str, int, str]]:
    """(file, line, source) of every writing call without a `# safe-write: <reason>` mark."""
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == SAFE_MODULE:
                continue
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            tree = ast.parse(text)
            inside = _inside_safe_writers(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and _writes(node)) or id(node) in inside:
                    continue
                span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
                marks = [
                    ln.split("# safe-write:", 1)[1].split()[0]
                    for ln in span
                    if "# safe-write:" in ln
                ]
                if not marks or marks[0].rstrip(")(,") not in REASONS:
                    rel = str(path.relative_to(ROOT))
                    found.append((rel, node.lineno, lines[node.lineno - 1].strip()))
    return found


def test_every_file_writing_call_goes_through_the_safe_write_module():
    unsafe = writer_calls()
    assert not unsafe, "writers outside config.safe_files:\n" + "\n".join(
        f"  {f}:{n}: {src}" for f, n, src in unsafe
    )


@pytest.mark.parametrize(
    "source",
    [
        "open(p, 'w')",
        "open(p, mode='a')",
        "p.open('wb')",
        "p.write_text('x')",
        "p.write_bytes(b'x')",
        "shutil.copyfile(a, b)",
        "shutil.copy(a, b)",
        "shutil.copy2(a, b)",
        "fig.savefig(path)",
        "torch.save(obj, path)",
        "os.replace(a, b)",
        "os.fdopen(fd, 'w')",
        "gzip.open(p, 'wb')",
        "model.save_pretrained(d)",
        "save_file(t, p)",
    ],
)
def test_the_scan_sees_each_kind_of_writer(source):
    """The scan is not vacuous: each writer form it names is found in a snippet."""
    (call,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and _writes(n)]
    assert call is not None


@pytest.mark.parametrize(
    "source",
    ["open(p)", "p.open()", "text.replace('a', 'b')", "gzip.open(p, 'rb')", "os.open(p, f)"],
)
def test_the_scan_leaves_reads_alone(source):
    assert not [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and _writes(n)]


# --- the data-loss cases, each through the real command or script -------------------------


def script(name: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def test_fp8_mechanism_out_through_a_link_is_refused_before_anything_runs(tmp_path):
    theirs = tmp_path / "notes.txt"
    theirs.write_text("mine\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(theirs)
    done = script("fp8_mechanism.py", "--only", "blockwise (default)", "--out", str(link))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "symbolic link" in done.stderr
    assert "Traceback" not in done.stderr and "Fix:" in done.stderr
    assert theirs.read_text() == "mine\n"


def test_dose_figure_through_a_link_is_refused_and_the_file_kept(tmp_path):
    from nemo_fp8_rl.config.safe_files import UnsafePath
    from nemo_fp8_rl.study import dose_report

    theirs = tmp_path / "photo.png"
    theirs.write_bytes(b"mine")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "dose_response.png").symlink_to(theirs)
    with pytest.raises(UnsafePath, match="symbolic link"):
        dose_report.figures(out=tmp_path / "out")
    assert theirs.read_bytes() == b"mine"


def test_dose_archive_through_a_link_is_refused_and_the_file_kept(tmp_path):
    from nemo_fp8_rl.config.safe_files import UnsafePath
    from nemo_fp8_rl.study import dose

    archived = sorted(dose.ARCHIVE.glob("grpo-dose-*/seed-*"))[0]
    run = tmp_path / "runs" / archived.parent.name / archived.name
    run.mkdir(parents=True)
    import gzip

    (run / "metrics.jsonl").write_bytes(
        gzip.decompress((archived / "metrics.jsonl.gz").read_bytes())
    )
    for name in dose.ARCHIVED[1:]:
        if (archived / name).exists():
            (run / name).write_bytes((archived / name).read_bytes())
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    (run / "recipe.yaml").write_text(f"grpo:\n  max_num_steps: {last}\n")
    assert dose.finished(run)
    theirs = tmp_path / "notes.txt"
    theirs.write_text("mine")
    target = tmp_path / "dest" / archived.parent.name / archived.name
    target.mkdir(parents=True)
    (target / "metrics.jsonl.gz").symlink_to(theirs)
    with pytest.raises(UnsafePath, match="symbolic link"):
        dose.archive(tmp_path / "runs", tmp_path / "dest")
    assert theirs.read_text() == "mine"
    (target / "metrics.jsonl.gz").unlink()
    dose.archive(tmp_path / "runs", tmp_path / "dest")
    assert (target / "metrics.jsonl.gz").read_bytes() == (
        archived / "metrics.jsonl.gz"
    ).read_bytes()


def test_readme_evidence_write_through_a_link_is_refused(tmp_path):
    theirs = tmp_path / "mine.md"
    theirs.write_text("<!-- evidence:begin -->x<!-- evidence:end -->\n")
    link = tmp_path / "README.md"
    link.symlink_to(theirs)
    done = script("readme_evidence.py", "--write", str(link))
    assert done.returncode == 2 and "symbolic link" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert theirs.read_text() == "<!-- evidence:begin -->x<!-- evidence:end -->\n"


def _study_runs(out: Path) -> None:
    from test_study_cli import SHORT, fake_run

    from nemo_fp8_rl.cli.study import NAMES

    for name in NAMES:
        for seed in (1, 2):
            fake_run(out, name, seed, [SHORT])


def test_study_report_keeps_a_users_files_without_overwrite(tmp_path, capsys):
    from nemo_fp8_rl.cli.common import invoke
    from nemo_fp8_rl.cli.study import main

    _study_runs(tmp_path / "O")
    report = tmp_path / "R"
    report.mkdir()
    (report / "tables.md").write_text("my own tables\n")
    argv = [
        "--analyse-only",
        "--seeds",
        "1-2",
        "--out",
        str(tmp_path / "O"),
        "--report",
        str(report),
    ]
    assert invoke(main, argv, "nemo_fp8_rl.study") == 2
    err = capsys.readouterr().err
    assert "did not write" in err and "tables.md" in err and "--overwrite" in err
    assert (report / "tables.md").read_text() == "my own tables\n"
    assert invoke(main, [*argv, "--overwrite"], "nemo_fp8_rl.study") == 0
    assert (report / "tables.md").read_text().startswith("Seeds 1, 2;")
    # written by the command now: the same report again is not a refusal
    assert invoke(main, argv, "nemo_fp8_rl.study") == 0, capsys.readouterr().err


def test_study_report_refuses_the_home_folder(tmp_path, capsys, monkeypatch):
    from nemo_fp8_rl.cli.common import invoke
    from nemo_fp8_rl.cli.study import main

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    _study_runs(tmp_path / "O")
    argv = ["--analyse-only", "--seeds", "1-2", "--out", str(tmp_path / "O"), "--report", str(home)]
    assert invoke(main, [*argv, "--overwrite"], "nemo_fp8_rl.study") == 2
    assert "home folder" in capsys.readouterr().err and list(home.iterdir()) == []


# --- --overwrite removes only what a run recorded -----------------------------------------


def _run_tree(run: Path) -> None:
    """A run directory as the embedded engine leaves it, plus a user's files in its folders."""
    step = run / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"s")
    (step / "info.json").write_text("{}")
    (step / "manifest.json").write_text(json.dumps({"files": {"state.pt": {}, "info.json": {}}}))
    (run / "checkpoints" / "latest").write_text("step_2\n")
    (run / "checkpoints" / "step_2-keep").mkdir()
    (run / "checkpoints" / "step_2-keep" / "state.pt").write_bytes(b"kept copy")
    (run / "logs" / "tb").mkdir(parents=True)
    (run / "logs" / "tb" / "events.out.tfevents.1").write_bytes(b"e")
    (run / "logs" / "analysis.ipynb").write_text("{}")
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("{}\n")


def test_overwrite_removes_only_recorded_outputs_and_names_what_it_kept(tmp_path):
    from nemo_fp8_rl.runs.outputs import remove_ours

    run = tmp_path / "run"
    _run_tree(run)
    (run / "checkpoints" / "step_2" / "my-notes.txt").write_text("notes")
    kept = remove_ours([run / n for n in ("checkpoints", "logs", "model", "metrics.jsonl")], run)
    assert sorted(p.relative_to(run).as_posix() for p in kept) == [
        "checkpoints/step_2-keep",
        "checkpoints/step_2/my-notes.txt",
        "logs/analysis.ipynb",
    ]
    assert (run / "logs" / "analysis.ipynb").read_text() == "{}"
    assert (run / "checkpoints" / "step_2-keep" / "state.pt").read_bytes() == b"kept copy"
    assert not (run / "logs" / "tb").exists() and not (run / "model").exists()
    assert not (run / "checkpoints" / "step_2" / "state.pt").exists()
    assert not (run / "checkpoints" / "latest").exists() and not (run / "metrics.jsonl").exists()


def test_train_overwrite_keeps_a_users_notebook_and_checkpoint_copy(tmp_path, capsys):
    """The real `train --overwrite` of the tiny recipe (dry run: it clears and checks only up
    to the start) over a run folder holding a user's notebook and a kept checkpoint copy."""
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.runs import rundir

    recipe = load_recipe(ROOT / "recipes" / "tiny" / "grpo-tiny-qwen3-cpu-fp8.yaml")
    run = tmp_path / "run"
    _run_tree(run)
    rundir.atomic_write(run / "recipe.yaml", recipe.to_yaml(with_sources=True))
    rundir.prepare(run, recipe.config, recipe.to_yaml(), resume=False, overwrite=True)
    err = capsys.readouterr().err
    assert "analysis.ipynb" in err and "step_2-keep" in err and "not removed" in err
    assert (run / "logs" / "analysis.ipynb").exists()
    assert (run / "checkpoints" / "step_2-keep" / "state.pt").read_bytes() == b"kept copy"
    assert not (run / "checkpoints" / "step_2").exists()
