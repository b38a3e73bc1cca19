"""The one error vocabulary: `Problem` and its renderer, `UserError`/`ProblemsError` crossing
pickling (Ray) intact, every exception class of the package a `UserError` unless it is an
internal signal named below, and the CLI deciding by `isinstance` alone."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import RecipeError
from nemo_fp8_rl.config.user_error import (
    USAGE,
    Problem,
    ProblemsError,
    UsageError,
    UserError,
    render,
)
from nemo_fp8_rl.guards.served import ServedPrecisionError

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_fp8_rl"
ROOTS = {"UserError"}
# Exceptions that never reach the user as such: each is caught inside the package and turned
# into a Problem or a UserError, or is a signal between two functions.
INTERNAL = {
    "_Refused": "safe_yaml's loader refusal, reported as a RecipeError",
    "InterpolationError": "an interpolation failure, reported as a Problem of the recipe",
    "ParseError": "an interpolation parse failure, reported as a Problem of the recipe",
    "NumberTooLong": "a number past the digit limit, reported as a Problem of the recipe",
    "RayletExited": "the supervisor's retry signal (ray_exit prints the located line)",
    "NonFiniteTensorError": "quantizing NaN/Inf: the refit reports it as a RefitError",
    "MxQuantizeError": "MXFP8 quantizer input checks: a bug if it ever reaches the user",
}


def _exception_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of the package whose base names end in Error/Exception or are a known
    exception class: name -> (file, base names)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                found[node.name] = (str(path.relative_to(PACKAGE)), bases)
    return found


def _is_exception(name: str, classes: dict, seen: frozenset = frozenset()) -> bool:
    if name.endswith(("Error", "Exception", "Exited")) and name not in classes:
        return True  # a builtin or library exception
    if name in seen or name not in classes:
        return False
    return any(_is_exception(b, classes, seen | {name}) for b in classes[name][1])


def _is_user_error(name: str, classes: dict, seen: frozenset = frozenset()) -> bool:
    if name in ROOTS:
        return True
    if name in seen or name not in classes:
        return False
    return any(_is_user_error(b, classes, seen | {name}) for b in classes[name][1])


def test_every_exception_class_is_a_user_error_or_named_internal() -> None:
    classes = _exception_classes()
    errors = [n for n in classes if _is_exception(n, classes)]
    assert len(errors) > 30  # the scan sees the package's exception classes
    stray = [
        f"{classes[n][0]}: {n}"
        for n in errors
        if not _is_user_error(n, classes) and n not in INTERNAL
    ]
    assert not stray, stray
    assert set(INTERNAL) <= set(errors), set(INTERNAL) - set(errors)


def test_one_class_per_name() -> None:
    """No two exception classes of one name (a second CheckpointError was one)."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                seen.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert not {n: f for n, f in seen.items() if len(f) > 1}


def test_fix_is_assembled_only_by_the_renderer() -> None:
    """`. Fix: ` appears in code only in `user_error.render` (docstrings may show the form)."""
    hits = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "Fix: " in node.value
                and id(node) not in docs
            ):
                hits.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    allowed = {"config/user_error.py", "cli/usage.py"}  # the renderer; the help's format line
    assert [h for h in hits if h.split(":")[0] not in allowed] == []


def test_problem_renders_location_rule_and_fix() -> None:
    p = Problem("grpo.x", "too big", "lower it", "recipes/a.yaml", 7, "rule-1")
    assert p.render() == "recipes/a.yaml:7: grpo.x: too big [rule-1]. Fix: lower it"
    assert Problem("grpo.x", "too big", "lower it").render() == "grpo.x: too big. Fix: lower it"
    listed = render("w", "two problems", "fix both", ["a", "b"])
    assert listed == "w: two problems:\n  - a\n  - b\nFix: fix both"
    assert render("w", "many", "", list(range(15))).endswith("  ... and 3 more")


@pytest.mark.parametrize(
    "error",
    [
        UserError("a.yaml", "bad", "fix it"),
        UsageError("--x", "bad", "fix it"),
        ProblemsError("w", "two", [Problem("k", "what", "fix"), "line"], "both", code=USAGE),
        RecipeError("tiny", [Problem("grpo.x", "unknown key", "drop it", "a.yaml")]),
        ServedPrecisionError("policy.generation (step 0)", ["layer: served bf16"], "serve fp8"),
    ],
)
def test_user_errors_survive_pickling(error: UserError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert (back.where, back.what, back.fix, back.code) == (
        error.where,
        error.what,
        error.fix,
        error.code,
    )
    assert getattr(back, "problems", None) == getattr(error, "problems", None)


def test_served_precision_failure_reads_as_a_located_user_error(capsys) -> None:
    """The CPU loop's MXFP8 served-precision refusal: exit 1, located, not an internal error."""

    def main(argv: list[str] | None) -> int:
        raise ServedPrecisionError(
            "policy.generation.vllm_cfg.precision (step 0)",
            ["CPU generation worker: model.layers.0.mlp.up_proj: served fp8-block, expected mxfp8"],
            "check that NeMo RL's FP8 patches reach the engine's workers",
        )

    assert invoke(main, [], prog="nemo_fp8_rl.train") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: policy.generation.vllm_cfg.precision (step 0): the generation")
    assert "internal error" not in err and "Fix: check that NeMo RL's FP8 patches" in err


def test_a_workers_user_error_wrapped_by_ray_is_reported_as_its_cause(capsys) -> None:
    """Ray raises `RayTaskError` holding the worker's exception as `cause`."""

    class RayTaskError(Exception):  # recorder of Ray's wrapper: a message and the cause
        def __init__(self, cause: BaseException) -> None:
            super().__init__(f"ray::Worker.generate() (pid=1)\n{cause!r}")
            self.cause = cause

    def main(argv: list[str] | None) -> int:
        raise RayTaskError(UsageError("policy.generation.top_k", "not a number", "give one"))

    assert invoke(main, [], prog="nemo_fp8_rl.train") == USAGE
    assert capsys.readouterr().err == (
        "error: policy.generation.top_k: not a number. Fix: give one.\n"
    )


def test_anything_else_is_reported_as_a_bug(capsys) -> None:
    def main(argv: list[str] | None) -> int:
        raise KeyError("x")

    assert invoke(main, [], prog="nemo_fp8_rl.train") == 1
    err = capsys.readouterr().err
    assert "internal error (KeyError: 'x'). This is a bug in nemo-fp8-rl" in err
