"""Which NeMo RL tree a run ran, for `environment.json`.

`tree_revision(package_dir)`: the git commit of the NeMo RL checkout when it is one (`git clone`),
and always `source_sha256`, the SHA-256 over the paths and bytes of its `nemo_rl/**/*.py` in
sorted order (an unpacked archive has no commit; two trees with the same digest run the same
Python). `compare` refuses a precision verdict between runs whose trees differ
(`analysis.fairness`).

The generator record (which backend served the rollouts, and why) is `cpu.vllm_choice.served_record`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from nemo_fp8_rl.runs import provenance


def tree_revision(package_dir: str | Path | None) -> dict[str, Any]:
    """`{"commit": <git HEAD or None>, "source_sha256": <digest or None>}` of the NeMo RL tree
    whose `nemo_rl` package is at `package_dir`."""
    if package_dir is None:
        return {"commit": None, "source_sha256": None}
    package = Path(package_dir)
    digest = hashlib.sha256()
    files = sorted(package.rglob("*.py"))
    for path in files:
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes())
    return {
        "commit": _git_head(package.parent),
        "source_sha256": digest.hexdigest() if files else None,
    }


def _git_head(tree: Path) -> str | None:
    """The commit checked out in `tree` (None: not a git checkout, or git is absent)."""
    if not (tree / ".git").exists():
        return None
    head = provenance.git(tree, "rev-parse", "HEAD")
    return head if head and len(head) == 40 else None
