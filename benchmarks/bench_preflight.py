"""Preflight time per GPU recipe, after NeMo RL's imports, and the share its engine checks take.

Run in the contract environment against a NeMo RL tree (scripts/nemo-rl-contract.sh builds it):

    NEMO_RL_SRC=/path/to/nemo-rl PYTHONPATH=.:$NEMO_RL_SRC \\
        ~/.cache/nemo-fp8-rl/nemo-rl-env/bin/python benchmarks/bench_preflight.py [--json out.json]

Imports NeMo RL (`nemo_rl.algorithms.grpo`) first, untimed, then runs `preflight` once per GPU
recipe (every recipe outside tiny/ and study/), in one process, in the catalogue's order: the
first recipe also pays the lazy imports of the rehearsal (tokenizers, data sets, vLLM and
megatron-core stand-ins), so it is reported apart. Per recipe: wall seconds, passed or not, and
the 1-minute load average at its start. Summary: first, then min / median / max of the rest, and
the engine checks' share (vLLM's and Megatron's checks timed inside the same runs, as a ratio of
the preflight time in the same process).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time
from pathlib import Path

from nemo_fp8_rl.config.safe_files import write_atomic


def _timed_engine_checks(spent: list[float]) -> contextlib.AbstractContextManager:
    """Wrap the engine-check entry points so their time is added to `spent`."""
    from nemo_fp8_rl.engines.nemo.preflight import engine_checks
    from nemo_fp8_rl.engines.nemo.preflight.recorders import installed

    def timed(fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)

        return run

    return installed(
        [
            (engine_checks, n, timed(getattr(engine_checks, n)))
            for n in ("vllm_findings", "megatron_findings")
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every recipe's timing here")
    args = parser.parse_args()
    import nemo_rl.algorithms.grpo  # noqa: F401 - imported before timing

    from nemo_fp8_rl.config import find_recipes, load_recipe, short_name
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    tree = Path(os.environ["NEMO_RL_SRC"])
    names = [
        short_name(p) for p in find_recipes() if not short_name(p).startswith(("tiny/", "study/"))
    ]
    rows = []
    for name in names:
        recipe, spent, load = load_recipe(name), [], os.getloadavg()[0]
        start = time.perf_counter()
        with _timed_engine_checks(spent), contextlib.redirect_stdout(io.StringIO()):
            result = preflight(recipe, workdir=tree)
        seconds = time.perf_counter() - start
        rows.append(
            {"recipe": name, "s": seconds, "checks_s": sum(spent), "ok": result.ok, "load": load}
        )
        print(
            f"{seconds:7.2f} s  checks {sum(spent):5.2f} s  ok={result.ok}  load {load:5.1f}  {name}",
            flush=True,
        )
    rest = [r["s"] for r in rows[1:]]
    share = sum(r["checks_s"] for r in rows[1:]) / max(sum(rest), 1e-9)
    print(
        f"NeMo RL {tree}: {len(rows)} recipes, {sum(r['ok'] for r in rows)} passed; first "
        f"{rows[0]['s']:.1f} s; the other {len(rest)}: min {min(rest):.1f} / median "
        f"{statistics.median(rest):.1f} / max {max(rest):.1f} s; engine checks "
        f"{100 * share:.0f}% of that time; load average {min(r['load'] for r in rows):.1f}-"
        f"{max(r['load'] for r in rows):.1f} (1 min)"
    )
    if args.json:
        write_atomic(args.json, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
