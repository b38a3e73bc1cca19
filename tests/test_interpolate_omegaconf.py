"""Interpolations resolve as OmegaConf resolves them (NeMo RL loads its configs with OmegaConf).

Each case of tests/golden/omegaconf_interpolations.json (recorded from OmegaConf 2.3.0 by
scripts/record_omegaconf_interpolations.py) is a template, the environment it is resolved in,
and OmegaConf's value or error. The project's resolver (`interpolate.resolve_all(env=True)`, what
`recipes import` runs) must give the same value, or an error where OmegaConf raises one. Where
OmegaConf is importable here, each case is also resolved by OmegaConf itself, live.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from nemo_fp8_rl.config.interp_parse import encode_literal, parse
from nemo_fp8_rl.config.interpolate import escape_literals, resolve_all

ROOT = Path(__file__).resolve().parents[1]
RECORD = json.loads((ROOT / "tests/golden/omegaconf_interpolations.json").read_text())
CASES = RECORD["cases"]
sys.path.insert(0, str(ROOT / "scripts"))


def ours(template: str, env: dict[str, str], monkeypatch) -> dict[str, object]:
    for name in ("A", "B"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    resolved, issues = resolve_all({**RECORD["config"], "t": template}, env=True)
    return {"error": issues[0].what} if issues else {"value": resolved["t"]}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_resolves_as_omegaconf_recorded(case, monkeypatch) -> None:
    got = ours(case["template"], case["env"], monkeypatch)
    if "error" in case:
        assert "error" in got, f"OmegaConf raised {case['error']}, we gave {got}"
    else:
        assert got == {"value": case["value"]}
        assert type(got["value"]) is type(case["value"])


@pytest.mark.skipif(importlib.util.find_spec("omegaconf") is None, reason="OmegaConf not installed")
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_resolves_as_omegaconf_live(case, monkeypatch) -> None:
    from record_omegaconf_interpolations import resolve

    live = resolve(case["template"], case["env"])
    got = ours(case["template"], case["env"], monkeypatch)
    assert ("error" in got) == ("error" in live) and got.get("value") == live.get("value")


def test_recorded_by_the_committed_script() -> None:
    from record_omegaconf_interpolations import CASES as SCRIPT_CASES

    assert [(c["id"], c["template"], c["env"]) for c in CASES] == list(SCRIPT_CASES)
    assert RECORD["omegaconf"] == "2.3.0"


@pytest.mark.parametrize(
    "literal", ["${x}", "a\\${x}", "\\\\${x}", "${oc.env:B}", "$${x}}", "plain \\ text", "${"]
)
def test_escaped_literals_read_back_as_themselves(literal) -> None:
    assert parse(encode_literal(literal)) == (literal,)
    resolved, issues = resolve_all({"x": 1, "t": escape_literals({"v": literal})["v"]})
    assert issues == [] and resolved["t"] == literal


def test_environment_value_is_never_parsed_again(monkeypatch) -> None:
    monkeypatch.setenv("A", "${oc.env:B}")
    monkeypatch.delenv("B", raising=False)
    resolved, issues = resolve_all({"t": "${oc.env:A}"}, env=True)
    assert issues == [] and resolved["t"] == "${oc.env:B}"
    assert os.environ["A"] == "${oc.env:B}"


def test_oc_env_is_read_only_on_import() -> None:
    _, issues = resolve_all({"t": "${oc.env:HOME}"})
    assert "unknown resolver 'oc.env'" in issues[0].what
    assert "read when a NeMo RL config is imported" in issues[0].fix
