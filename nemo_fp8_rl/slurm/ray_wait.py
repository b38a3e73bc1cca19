"""Wait until a Ray cluster has a given number of live nodes (run inside a Slurm job).

The job script starts this on the head node after the head's readiness file appears; it returns
once every worker has joined, so training never starts on a partial cluster. Usage:
`python -m nemo_fp8_rl.slurm.ray_wait --nodes N [--address HOST:PORT] [--timeout S]`
(address default: `RAY_ADDRESS`). Exit code 0 when all joined, 1 on timeout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def wait_for_nodes(address: str, num_nodes: int, timeout_s: float, poll_s: float = 1.0) -> int:
    """Connect to the cluster at `address` and poll until `num_nodes` nodes are alive.

    Returns the number of live nodes; raises `TimeoutError` after `timeout_s` seconds.
    """
    import ray

    deadline = time.monotonic() + timeout_s
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        while True:
            alive = sum(1 for node in ray.nodes() if node.get("Alive"))
            if alive >= num_nodes:
                return alive
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {alive} of {num_nodes} Ray nodes joined {address} within {timeout_s:.0f} s"
                )
            time.sleep(poll_s)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Command line: wait for `--nodes` live Ray nodes, print how long it took."""
    parser = argparse.ArgumentParser(prog="python -m nemo_fp8_rl.slurm.ray_wait")
    parser.add_argument("--nodes", type=int, required=True, help="live nodes to wait for")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="HOST:PORT")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds")
    args = parser.parse_args(argv)
    if not args.address:
        parser.error("no Ray address: pass --address HOST:PORT or set RAY_ADDRESS")
    start = time.monotonic()
    try:
        alive = wait_for_nodes(args.address, args.nodes, args.timeout)
    except TimeoutError as err:
        print(f"ray_wait: {err}", file=sys.stderr)
        return 1
    print(
        f"ray_wait: {alive} Ray node(s) alive at {args.address} after {time.monotonic() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
