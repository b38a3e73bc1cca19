# ruff: noqa: F811  (the fixtures `nemo` and `checkpoint` are imported from that module)
"""Contract: the served-precision guard rail on NeMo RL's loop on CPU (docs/guard-rails.md).

Runs against a NeMo RL tree (`scripts/nemo-rl-contract.sh /path/to/nemo-rl`): the CPU
generation worker built by NeMo RL's own `init_fp8`, counted as the driver counts every
generation worker actor (`engines.nemo.worker.served_report`), with NeMo RL's patch broken.
"""

from __future__ import annotations

import copy

import pytest
import test_nemo_cpu_generation_worker as nemo_rl
from test_nemo_contract import _skip_reason
from test_nemo_cpu_generation_worker import checkpoint, nemo  # noqa: F401 (fixtures)

from nemo_fp8_rl.guards.served import FP8_BLOCK, ServedCounts, ServedPrecisionError, check_served

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]


def test_cpu_generation_worker_counts_and_a_broken_patch_stops_it(checkpoint, nemo, monkeypatch):
    """The count the driver takes through each actor (`worker.served_report.report_in_actor`) on
    NeMo RL's CPU generation worker: NeMo RL's `init_fp8` patched vLLM's FP8 method (here the
    named stand-in class) and every decoder linear is block FP8. With `apply_fp8_patches`
    broken (what RayExecutorV2 did: the wrapped executor never ran it), the patches are
    missing and the check stops the run; a worker serving BF16 under an FP8 recipe too."""
    from nemo_fp8_rl.engines.nemo.worker.served_report import report_in_actor

    cfg = nemo_rl.gen_config(checkpoint, precision="fp8")
    worker = nemo.gw.CpuGenerationWorkerImpl(copy.deepcopy(cfg), bundle_indices=[0], seed=1)
    (report,) = [ServedCounts.from_dict(r) for r in report_in_actor(worker)]
    assert report.patched is True and report.counts() == {FP8_BLOCK: 7 * nemo_rl.LAYERS}
    assert check_served([report], cfg["vllm_cfg"], "step 0")

    monkeypatch.setattr(nemo.fp8, "apply_fp8_patches", lambda self, fp8_config: None)
    broken = nemo.gw.CpuGenerationWorkerImpl(copy.deepcopy(cfg), bundle_indices=[0], seed=1)
    (unpatched,) = [ServedCounts.from_dict(r) for r in report_in_actor(broken)]
    assert unpatched.patched is False
    with pytest.raises(ServedPrecisionError, match="patches are not in place"):
        check_served([unpatched], cfg["vllm_cfg"], "step 0")
    monkeypatch.undo()

    bf16 = nemo.gw.CpuGenerationWorkerImpl(
        nemo_rl.gen_config(checkpoint), bundle_indices=[0], seed=1
    )
    (served_bf16,) = [ServedCounts.from_dict(r) for r in report_in_actor(bf16)]
    with pytest.raises(ServedPrecisionError, match="served bf16, expected fp8-block"):
        check_served([served_bf16], cfg["vllm_cfg"], "after refit 1")
