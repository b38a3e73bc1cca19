"""Launching the embedded engine on a loaded machine: successes and waits, per start-up variant.

Run: `uv run python benchmarks/bench_ray_start.py [--load 12] [--launches 10]
[--variants once retry] [--kind engine|ray] [--json out.json]`. Holds the load average at
`--load` or more with busy-loop processes (`LoadHolder`: only as many as the machine's other
work leaves missing; each ends by itself after `--burn-s` seconds or with this script, and all
are killed at the end), waits until the 1-minute load average reaches it, then launches
`--launches` times per variant (`--concurrent` at a time), each launch in a fresh Python process: Ray started as the
variant says, then (`--kind engine`, the default) the trainer and rollout actors created from
the tiny recipe and both answering `ping`, or (`--kind ray`) one light actor answering, and Ray
shut down. Prints, per variant, successes out of launches and the launch time (min / median /
max over the successful launches) with the 1-minute load average seen at each launch's start;
`--json` also writes every launch.

Variants: `once` is a single `ray.init` as Ray ships it (dashboard off, 2 CPUs), `gcs-wait` is
`once` with the GCS port wait raised to 120 s, `retry` is the engine's `start_ray` (see
`nemo_fp8_rl.runs.ray_start.py`: agent ports known up front, the raylet wait extended,
workers at normal priority, a failed start cleaned up and tried again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nemo_fp8_rl.config.safe_files import write_atomic

VARIANTS = ("once", "gcs-wait", "retry")
BURN = (
    "import os, time\nparent, end = os.getppid(), time.time() + {s}\n"
    "while time.time() < end and os.getppid() == parent:\n    pass\n"
)


class LoadHolder:
    """Holds the machine's load at `target` or more with busy-loop processes, as few as needed:
    every `period_s` it counts the runnable tasks (`/proc/loadavg`, 4th field) that are not its
    own burners and keeps `target - others` burners (at least `floor`). Each burner exits by
    itself after `seconds` or when this process is gone; `stop` kills them all."""

    def __init__(self, target: int, seconds: float, floor: int = 2, period_s: float = 3.0):
        self.target, self.seconds, self.floor, self.period_s = target, seconds, floor, period_s
        self.procs: list[subprocess.Popen] = []
        self.holding = target  # runnable tasks to keep: twice the target while ramping up
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def start(self) -> LoadHolder:
        self._adjust()
        self._thread.start()
        return self

    def _adjust(self) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1
        others = max(running - len(self.procs), 0)
        want = max(self.floor, self.holding - others)
        code = BURN.format(s=self.seconds)
        while len(self.procs) < want:
            self.procs.append(subprocess.Popen([sys.executable, "-c", code]))
        while len(self.procs) > want:
            self.procs.pop().kill()

    def _hold(self) -> None:
        while not self._stop.wait(self.period_s):
            self._adjust()

    def wait_for_load(self, timeout_s: float = 300) -> float:
        """Block until the 1-minute load average reaches `target` (or `timeout_s`); returns it.

        The average only approaches the number of runnable tasks (1 - e^(-t/60) of the way after
        t seconds), so while waiting twice the target is held: it gets there in about 40 s."""
        deadline = time.monotonic() + timeout_s
        self.holding = 2 * self.target
        self._adjust()
        while os.getloadavg()[0] < self.target and time.monotonic() < deadline:
            time.sleep(2)
        self.holding = self.target
        self._adjust()
        return os.getloadavg()[0]

    def stop(self) -> None:
        """Stop adjusting and kill every burner."""
        self._stop.set()
        self._thread.join(timeout=10)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()


class Probe:
    """The light launch's actor: a Ray worker process answering `ping` (no torch import)."""

    def ping(self) -> int:
        return os.getpid()


def ready(kind: str) -> None:
    """After Ray is up: `engine` creates the trainer and rollout actors from the tiny recipe and
    waits for both to answer; `ray` creates one light actor and waits for it."""
    import ray

    if kind == "ray":
        probe = ray.remote(num_cpus=1)(Probe).remote()
        ray.get(probe.ping.remote())
        return
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.engines.local.actors import make_actors

    cfg = load_recipe("tiny/grpo-tiny-qwen3-cpu-bf16").config
    trainer, rollout = make_actors(cfg, None, 1)
    ray.get([trainer.ping.remote(), rollout.ping.remote()])


def child(variant: str, kind: str) -> dict:
    """One launch in this process; returns {ok, seconds, load, attempts, error}."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.pop("RAY_ADDRESS", None)
    if variant == "gcs-wait":
        os.environ["RAY_gcs_server_port_wait_time_s"] = "120"  # noqa: SIM112 (Ray's own name)
    import ray

    from nemo_fp8_rl.runs.ray_start import StartRecord, start_ray

    load = os.getloadavg()[0]
    t0 = time.monotonic()
    record = StartRecord()
    out = {"variant": variant, "kind": kind, "load": load, "ok": False}
    try:
        if variant == "retry":
            start_ray(record=record)
        else:
            ray.init(
                num_cpus=2, include_dashboard=False, log_to_driver=True, configure_logging=False
            )
        out["ray_seconds"] = round(time.monotonic() - t0, 1)
        ready(kind)
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 (a failed launch is a data point)
        out["error"] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    out["seconds"] = time.monotonic() - t0
    out["attempts"] = [round(a, 1) for a in record.attempts] or None
    ray.shutdown()
    return out


def launch(variant: str, timeout_s: float, kind: str = "engine") -> dict:
    """Run `child(variant, kind)` in a fresh interpreter; its JSON line, or a timeout record."""
    cmd = [sys.executable, __file__, "--child", variant, "--kind", kind]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "ok": False, "seconds": time.monotonic() - t0, "error": "hung"}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if not lines:
        return {
            "variant": variant,
            "ok": False,
            "seconds": time.monotonic() - t0,
            "error": f"exit {proc.returncode}: {proc.stderr[-300:]}",
        }
    return json.loads(lines[-1])


def summary(rows: list[dict]) -> str:
    """`retry: 10/10 started; seconds min 12.1 median 20.3 max 61.0; load 12.4-15.0`."""
    ok = [r["seconds"] for r in rows if r["ok"]]
    loads = [r.get("load", 0.0) for r in rows]
    text = f"{rows[0]['variant']}: {len(ok)}/{len(rows)} started"
    if ok:
        text += f"; seconds min {min(ok):.1f} median {statistics.median(ok):.1f} max {max(ok):.1f}"
    retried = sum(1 for r in rows if r.get("attempts") and len(r["attempts"]) > 1)
    if retried:
        text += f"; {retried} needed a second attempt"
    return text + f"; load at start {min(loads):.1f}-{max(loads):.1f}"


def table(paths: list[Path]) -> str:
    """A Markdown table of saved launches (`--json` files), one row per file and variant:
    launches, started, seconds to ready (min / median / max of the started ones), the seconds
    Ray itself took (median), attempts beyond the first, and the 1-minute load at the starts."""
    lines = [
        "| file | kind | variant | started | seconds to ready (min / median / max) "
        "| Ray start, median s | retried | load at start |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        rows = json.loads(path.read_text(encoding="utf-8"))
        for variant in dict.fromkeys(r["variant"] for r in rows):
            mine = [r for r in rows if r["variant"] == variant]
            ok = [r for r in mine if r["ok"]]
            secs = [r["seconds"] for r in ok]
            ray_s = [r["ray_seconds"] for r in mine if r.get("ray_seconds") is not None]
            loads = [r["load"] for r in mine]
            retried = sum(1 for r in mine if r.get("attempts") and len(r["attempts"]) > 1)
            spread = (
                f"{min(secs):.0f} / {statistics.median(secs):.0f} / {max(secs):.0f}"
                if secs
                else "–"
            )
            ray_median = f"{statistics.median(ray_s):.0f}" if ray_s else "–"
            lines.append(
                f"| {path.name} | {mine[0].get('kind', 'engine')} | {variant} "
                f"| {len(ok)}/{len(mine)} | {spread} | {ray_median} | {retried} "
                f"| {min(loads):.1f}–{max(loads):.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=VARIANTS)
    parser.add_argument(
        "--kind",
        choices=("engine", "ray"),
        default="engine",
        help="engine: Ray + trainer and rollout actors; ray: Ray + one light actor",
    )
    parser.add_argument("--load", type=int, default=12, help="load average to hold")
    parser.add_argument("--burn-s", type=float, default=3600)
    parser.add_argument("--launches", type=int, default=10)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="launches started at once (each counts as load, so the holder burns less)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--table", type=Path, nargs="+", help="print saved --json files as a Markdown table"
    )
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.child:
        print(json.dumps(child(args.child, args.kind)), flush=True)
        return
    holder = LoadHolder(args.load, args.burn_s).start()
    rows: list[dict] = []
    try:
        print(f"load {holder.wait_for_load():.1f} (target {args.load})", flush=True)
        for i in range(0, args.launches, args.concurrent):
            for variant in args.variants:  # interleaved: each variant sees the same load
                k = min(args.concurrent, args.launches - i)
                with ThreadPoolExecutor(k) as pool:
                    batch = list(
                        pool.map(launch, [variant] * k, [args.timeout_s] * k, [args.kind] * k)
                    )
                for j, row in enumerate(batch):
                    row["burners"], row["concurrent"] = len(holder.procs), k
                    rows.append(row)
                    print(f"launch {i + j + 1} {json.dumps(row)}", flush=True)
    finally:
        holder.stop()
    for variant in args.variants:
        print(summary([r for r in rows if r["variant"] == variant]))
    if args.json:
        write_atomic(args.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
