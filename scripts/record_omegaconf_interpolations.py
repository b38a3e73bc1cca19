"""Record what OmegaConf makes of the interpolations `config/interpolate.py` resolves.

    uv run --no-project --with omegaconf==2.3.0 python scripts/record_omegaconf_interpolations.py

writes tests/golden/omegaconf_interpolations.json: for each case (a config of three keys, `t`
the template under test, and the environment variables set while resolving) the value
OmegaConf's `to_container(resolve=True)` gives `t`, or the name of the error it raises. NeMo RL
loads its configs with OmegaConf (2.3.0 is the version hydra-core 1.3, which NeMo RL's
environment installs, allows) after registering its resolvers `add`, `mul`, `div` and `max`;
this script registers the same ones. tests/test_interpolate_omegaconf.py holds the project's
resolver to these answers (and, where OmegaConf is importable, to OmegaConf itself).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nemo_fp8_rl.config.safe_files import write_atomic

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "omegaconf_interpolations.json"
A, B = "/data/a", "/data/b"
# (id, template, environment)
CASES: list[tuple[str, str, dict[str, str]]] = [
    ("env-default-env-a-set", "${oc.env:A,${oc.env:B}}", {"A": A, "B": B}),
    ("env-default-env-only-b", "${oc.env:A,${oc.env:B}}", {"B": B}),
    ("env-default-env-only-a", "${oc.env:A,${oc.env:B}}", {"A": A}),
    ("env-default-env-none", "${oc.env:A,${oc.env:B}}", {}),
    ("env-default-env-default", "${oc.env:A,${oc.env:B,dflt}}", {}),
    ("env-value-holds-interpolation", "${oc.env:A}", {"A": "${x}"}),
    ("env-value-holds-env-interpolation", "${oc.env:A}", {"A": "${oc.env:B}", "B": B}),
    ("env-value-in-text", "pre-${oc.env:A}-post", {"A": "${x}"}),
    ("env-value-with-backslash", "${oc.env:A}", {"A": "a\\${x}"}),
    ("env-unset", "${oc.env:A}", {}),
    ("env-empty", "${oc.env:A}", {"A": ""}),
    ("env-default-int", "${oc.env:A,5}", {}),
    ("env-default-float", "${oc.env:A,1.5}", {}),
    ("env-default-bool", "${oc.env:A,true}", {}),
    ("env-default-null", "${oc.env:A,null}", {}),
    ("env-default-path", "${oc.env:A,/tmp/data}", {}),
    ("env-default-single-quoted", "${oc.env:A,'/tmp/data'}", {}),
    ("env-default-double-quoted-comma", '${oc.env:A,"a,b"}', {}),
    ("env-default-escaped-comma", "${oc.env:A,a\\,b}", {}),
    ("env-default-spaces", "${oc.env:A,  spaced value  }", {}),
    ("env-default-empty", "${oc.env:A,}", {}),
    ("env-default-reference", "${oc.env:A,${x}}", {}),
    ("env-default-quoted-reference", "${oc.env:A,'v${x}'}", {}),
    ("env-set-int-text", "${oc.env:A}", {"A": "5"}),
    ("env-name-spaces", "${oc.env: A }", {"A": A}),
    ("escaped-interpolation", "\\${x}", {}),
    ("escaped-backslash-then-interpolation", "\\\\${x}", {}),
    ("escaped-backslash-then-escaped", "\\\\\\${x}", {}),
    ("backslash-elsewhere", "a\\b", {}),
    ("reference-typed", "${x}", {}),
    ("reference-in-text", "v${x}", {}),
    ("reference-spaces", "${ x }", {}),
    ("reference-relative", "${.u}", {}),
    ("mul-reference", "${mul:${x},2}", {}),
    ("mul-float", "${mul:${x}, 2.5}", {}),
    ("unclosed", "${x", {}),
    ("dollar-alone", "cost: $5", {}),
    ("brace-text", "{a} ${x}", {}),
]


def resolve(template: str, env: dict[str, str]) -> dict[str, object]:
    """OmegaConf's value of `t` (or its error) in {x: 1, u: 3, t: template} under `env`, with
    NeMo RL's resolvers registered (as `nemo_rl.utils.config.register_omegaconf_resolvers`)."""
    from omegaconf import OmegaConf

    for name, fn in (
        ("add", lambda a, b: a + b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("max", lambda a, b: max(a, b)),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)

    saved = {k: os.environ.get(k) for k in ("A", "B")}
    for k in ("A", "B"):
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        cfg = OmegaConf.create({"x": 1, "u": 3, "t": template})
        value = OmegaConf.to_container(cfg, resolve=True)["t"]
        return {"value": value}
    except Exception as exc:  # noqa: BLE001 (the error's name is the answer)
        return {"error": type(exc).__name__}
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def main() -> None:
    import omegaconf

    cases = [{"id": cid, "template": t, "env": env, **resolve(t, env)} for cid, t, env in CASES]
    record = {"omegaconf": omegaconf.__version__, "config": {"x": 1, "u": 3}, "cases": cases}
    write_atomic(OUT, json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} cases (OmegaConf {omegaconf.__version__})")


if __name__ == "__main__":
    main()
