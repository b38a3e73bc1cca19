"""NeMo RL's Megatron policy worker with an FP8 on/off switch for BF16 shadow passes.

Imported only inside NeMo RL's Megatron worker environment (and by NeMo RL's worker builder):
it subclasses `MegatronPolicyWorkerImpl` exactly as NeMo RL's own `MegatronPolicyWorker` does,
with the same Ray runtime environment, and adds one method. The engine passes this class's
dotted name as `Policy(worker_extension_cls_fqn=...)` and registers it with NeMo RL's actor
environment registry under the interpreter NeMo RL resolves for `MegatronPolicyWorker`
(`worker_env`), so its already built environment is reused.

`TrainerFp8MegatronPolicyWorker` (`TRAINER_FP8_WORKER_FQN`, for `refit.quantize_on: trainer`) is
the same worker whose refit stream carries FP8 pairs (`trainer_refit.QuantizeOnTrainer`).
"""

from __future__ import annotations

import ray
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker
from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

from nemo_fp8_rl.engines.nemo.worker.shadow_controls import ShadowControls
from nemo_fp8_rl.engines.nemo.worker.trainer_refit import QuantizeOnTrainer

__all__ = ["ShadowMegatronPolicyWorker", "TrainerFp8MegatronPolicyWorker"]
RUNTIME_ENV = get_runtime_env_for_policy_worker("megatron_policy_worker")


class ShadowWorkerImpl(ShadowControls, MegatronPolicyWorkerImpl):
    """`MegatronPolicyWorker` plus the two controls the shadow passes need.

    `set_fp8_compute` around `get_logprobs` gives the BF16 pass; `hold_lr_schedule` keeps the
    LR schedule to one tick per GRPO step when a calibration step is split into several
    `train` calls.
    """


@ray.remote(runtime_env=RUNTIME_ENV)  # pragma: no cover
class ShadowMegatronPolicyWorker(ShadowWorkerImpl):
    """The shadow worker as a Ray actor (`WORKER_FQN`)."""


@ray.remote(runtime_env=RUNTIME_ENV)  # pragma: no cover
class TrainerFp8MegatronPolicyWorker(QuantizeOnTrainer, ShadowWorkerImpl):
    """The shadow worker whose refit sends FP8 pairs (`TRAINER_FP8_WORKER_FQN`)."""
