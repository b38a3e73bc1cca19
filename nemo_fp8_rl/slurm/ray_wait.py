"""Wait until a Ray cluster has a given number of live nodes (run inside a Slurm job).

The job script starts this on the head node after the head's readiness file appears; it returns
once every worker has joined, so training never starts on a partial cluster. Usage:
`python -m nemo_fp8_rl.slurm.ray_wait --nodes N [--gpus G] [--address HOST:PORT] [--timeout S]`
(address default: `RAY_ADDRESS`). Exit code 0 when all joined, 1 on timeout.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


def wait_for_nodes(
    address: str, num_nodes: int, timeout_s: float, num_gpus: int = 0, poll_s: float = 1.0
) -> dict[str, float]:
    """Connect to the cluster at `address` and poll until `num_nodes` nodes are alive and the
    cluster offers at least `num_gpus` GPUs (the job passes `gpus_per_node * nodes`).

    Returns `{"nodes": ..., "CPU": ..., "GPU": ...}`; raises `TimeoutError` after `timeout_s`.
    """
    import ray

    deadline = time.monotonic() + timeout_s
    _connect(address, deadline, poll_s)
    try:
        while True:
            resources = ray.cluster_resources()
            seen = {
                "nodes": float(sum(1 for node in ray.nodes() if node.get("Alive"))),
                "CPU": float(resources.get("CPU", 0.0)),
                "GPU": float(resources.get("GPU", 0.0)),
            }
            if seen["nodes"] >= num_nodes and seen["GPU"] >= num_gpus:
                return seen
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"after {timeout_s:.0f} s the Ray cluster at {address} has {seen['nodes']:.0f} of "
                    f"{num_nodes} nodes and {seen['GPU']:.0f} of {num_gpus} GPUs"
                )
            time.sleep(poll_s)
    finally:
        ray.shutdown()


def _connect(address: str, deadline: float, poll_s: float) -> None:
    """`ray.init(address)`, retried while `deadline` has not passed (one attempt may block for
    Ray's own connection timeout): the GCS port may open before the GCS serves."""
    import ray

    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            return
        except ConnectionError as err:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not connect to the Ray cluster at {address}: {err}"
                ) from err
            time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    """Command line: wait for `--nodes` live Ray nodes (and `--gpus` GPUs), print how long it took."""
    parser = argparse.ArgumentParser(prog="python -m nemo_fp8_rl.slurm.ray_wait")
    parser.add_argument("--nodes", type=int, required=True, help="live nodes to wait for")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="HOST:PORT")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to wait for, in total")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        parser.error(f"--timeout {args.timeout}: give a finite number of seconds > 0")
    if not args.address:
        parser.error("no Ray address: pass --address HOST:PORT or set RAY_ADDRESS")
    start = time.monotonic()
    try:
        seen = wait_for_nodes(args.address, args.nodes, args.timeout, num_gpus=args.gpus)
    except TimeoutError as err:
        print(f"ray_wait: {err}", file=sys.stderr)
        return 1
    print(
        f"ray_wait: {seen['nodes']:.0f} Ray node(s) alive at {args.address} after "
        f"{time.monotonic() - start:.1f} s (CPU {seen['CPU']:g}, GPU {seen['GPU']:g})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
