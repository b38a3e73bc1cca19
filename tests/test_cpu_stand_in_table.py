"""Every patch NeMo RL's loop on CPU applies is declared in the stand-in table (docs/cluster.md).

The patch sites are read from the source of `engines/nemo/cpu/`: an environment variable it sets
(`os.environ[...] = ...`, `os.environ.setdefault(...)`, the keys of `cluster.ENV_DEFAULTS`) and
an attribute of an imported module it assigns (`torch.cuda.current_stream = ...`,
`packed_tensor.get_target_packed_tensor_size = ...`). Each must be named, as written, in a row of
`cpu.stand_ins.CPU_LOOP_STAND_INS`, whose table the page holds (tests/test_preflight_checks.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

from nemo_fp8_rl.engines.nemo.cpu import cluster
from nemo_fp8_rl.engines.nemo.cpu.stand_ins import markdown

CPU = Path(cluster.__file__).parent


def _imported(tree: ast.AST) -> set[str]:
    """The names a module binds by import (module aliases and imported names)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
    return out


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def patch_sites(source: str) -> set[str]:
    """Environment variables set and imported modules' attributes assigned in `source`."""
    tree = ast.parse(source)
    modules, out = _imported(tree), set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "os.environ":
                out.add(ast.literal_eval(target.slice))
            root = _root(target)
            attribute = isinstance(target, ast.Attribute) and isinstance(root, ast.Name)
            if attribute and root.id in modules:
                out.add(ast.unparse(target))
        call = node if isinstance(node, ast.Call) else None
        if call is not None and ast.unparse(call.func) == "os.environ.setdefault":
            key = call.args[0]
            if isinstance(key, ast.Constant):
                out.add(key.value)
    return out


def named(site: str, table: str) -> bool:
    """`site` as written, or its attribute under its module's full path (`policy_utils.x` is
    named by `nemo_rl.models.policy.utils.x`)."""
    return site in table or ("." in site and "." + site.rsplit(".", 1)[1] in table)


def all_patch_sites() -> dict[str, set[str]]:
    found = {p.name: patch_sites(p.read_text(encoding="utf-8")) for p in sorted(CPU.glob("*.py"))}
    found["cluster.py"] |= set(cluster.ENV_DEFAULTS)
    return found


def test_every_patch_of_the_cpu_loop_has_a_row() -> None:
    table = markdown()
    sites = all_patch_sites()
    assert sum(len(v) for v in sites.values()) >= 15  # the scan finds the patches it is for
    missing = {f: sorted(s for s in v if not named(s, table)) for f, v in sites.items()}
    assert {f: v for f, v in missing.items() if v} == {}


def test_the_scan_finds_an_undeclared_patch() -> None:
    source = (
        "import os\nimport torch\nfrom nemo_rl.models import packed_tensor as pt\n"
        "os.environ['NEW_KNOB'] = '1'\nos.environ.setdefault('OTHER_KNOB', '2')\n"
        "torch.cuda.synchronize = lambda: None\npt.new_size = lambda: 1\nlocal = {}\nlocal.x = 1\n"
    )
    sites = patch_sites(source)
    assert sites == {"NEW_KNOB", "OTHER_KNOB", "torch.cuda.synchronize", "pt.new_size"}
    assert not [site for site in sites if named(site, markdown())]
