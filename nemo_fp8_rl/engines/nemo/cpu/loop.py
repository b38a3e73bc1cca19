"""The CPU recipe as NeMo RL's loop runs it here: the hand-off config's CPU values and the workers.

A CPU recipe (`cluster.gpus_per_node: 0`) trained with `--engine nemo` runs NeMo RL's
`grpo.setup` and `grpo_train` as shipped (`runner`), with these differences from a GPU run,
each written into the hand-off config (`nemo_rl_config.yaml`) so the run dir says what ran:

* `cluster.gpus_per_node: 1`: one logical GPU (`cluster.start_ray`); generation is colocated
  with training on it, as in NeMo RL's single-GPU recipes. A non-colocated recipe
  (asynchronous GRPO) gets 2: one for training, one for generation
  (`policy.generation.colocated.resources.gpus_per_node: 1`), refitted by NeMo RL's collective
  path over gloo (`collective`) and served by the async CPU worker (`async_generation_worker`);
* `policy.model_name` / `policy.tokenizer.name`: the warm-started tiny checkpoint, and
  `data.{train,validation}.data_path`: the task's JSONL files (`tiny.handover`);
* the policy and generation workers are the CPU ones (`POLICY_WORKER`, `GENERATION_WORKERS`):
  generation on NeMo RL's own vLLM worker over vLLM's CPU build where it can run, else on the
  stand-in (`vllm_choice` decides and says why);
* with real vLLM, `policy.generation.vllm_cfg.enforce_eager: true`: vLLM's torch.compile of the
  model graph (inductor, C++ code generation) takes minutes on 2 cores and changes no value
  a CUDA graph would not; and in block FP8, the fused layers whose parts are not whole 128-row
  blocks kept in BF16 (`vllm_cfg.quantization_ignored_layer_kws`, `fp8_block_fit`: the tiny
  model's q/k/v projections), which vLLM cannot load from NeMo RL's refit otherwise.

`CpuLoop` gives the runner these answers through the driver's platform seam
(`driver.platform.Platform`), so the runner's GPU path is the only one it spells out.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

PACKAGE = "nemo_fp8_rl.engines.nemo.cpu"
POLICY_WORKER = f"{PACKAGE}.policy_worker.CpuMegatronPolicyWorker"
TRAINER_FP8_POLICY_WORKER = f"{PACKAGE}.policy_worker.CpuTrainerFp8MegatronPolicyWorker"
GENERATION_WORKERS = [
    f"{PACKAGE}.generation_worker.CpuGenerationWorker",
    f"{PACKAGE}.generation_worker.CpuTrainerFp8GenerationWorker",
    f"{PACKAGE}.async_generation_worker.CpuAsyncGenerationWorker",
    f"{PACKAGE}.async_generation_worker.CpuTrainerFp8AsyncGenerationWorker",
    *(
        f"{PACKAGE}.vllm_worker.CpuVllm{trainer}{kind}GenerationWorker"
        for trainer in ("", "TrainerFp8")
        for kind in ("", "Async")
    ),
]
# NeMo RL's own actors of asynchronous GRPO, run in this interpreter like the workers (their
# registry entry otherwise builds a `uv` environment from NeMo RL's checkout)
ASYNC_ACTORS = [
    "nemo_rl.algorithms.async_utils.ReplayBuffer",
    "nemo_rl.algorithms.async_utils.AsyncTrajectoryCollector",
]
WORKERS = [POLICY_WORKER, TRAINER_FP8_POLICY_WORKER, *GENERATION_WORKERS, *ASYNC_ACTORS]
LOGICAL_GPUS = 1  # colocated; a non-colocated recipe gets one more (`logical_gpus`)


def colocated(config: dict[str, Any]) -> bool:
    """Whether generation shares the training GPU (`policy.generation.colocated.enabled`)."""
    return bool(config["policy"]["generation"].get("colocated", {}).get("enabled", True))


def logical_gpus(config: dict[str, Any]) -> int:
    """Logical GPUs of the CPU loop: 1 colocated, 2 (train + generation) non-colocated."""
    return LOGICAL_GPUS if colocated(config) else LOGICAL_GPUS + 1


def cpu_config(
    config: dict[str, Any], inputs: dict[str, str], real_vllm: bool = False
) -> dict[str, Any]:
    """The hand-off config with the CPU loop's values (a copy; `inputs` from `tiny.handover`;
    `real_vllm`: generation on real vLLM, `vllm_choice`)."""
    out = copy.deepcopy(config)
    if real_vllm:
        vllm_cfg = out["policy"]["generation"]["vllm_cfg"]
        vllm_cfg["enforce_eager"] = True
        if vllm_cfg.get("precision") == "fp8":
            _keep_misfits_in_bf16(vllm_cfg, inputs["model"])
    out["cluster"]["gpus_per_node"] = logical_gpus(config)
    out["cluster"]["num_nodes"] = 1
    policy = out["policy"]
    policy["model_name"] = inputs["model"]
    policy["tokenizer"]["name"] = inputs["model"]
    train = {k: v for k, v in out["data"]["train"].items() if k != "split_validation_size"}
    out["data"]["train"] = {**train, "data_path": inputs["train"]}
    out["data"]["validation"] = {
        "dataset_name": train.get("dataset_name", "ResponseDataset"),
        "data_path": inputs["validation"],
    }
    return out


def _keep_misfits_in_bf16(vllm_cfg: dict[str, Any], model_dir: str) -> None:
    """Add the model's fused parts that are not whole FP8 blocks to the BF16 keywords, said."""
    from nemo_fp8_rl.engines.nemo.cpu.fp8_block_fit import model_misfits

    kws = list(vllm_cfg.get("quantization_ignored_layer_kws") or [])
    added = [kw for kw in model_misfits(model_dir) if kw not in kws]
    if added:
        vllm_cfg["quantization_ignored_layer_kws"] = kws + added
        print(
            f"generation: {', '.join(added)} served in BF16 (not whole 128-row FP8 blocks; "
            "vLLM cannot load them from NeMo RL's block-FP8 refit)",
            flush=True,
        )


def generation_choice(config: dict[str, Any]) -> Any:
    """Real vLLM or the stand-in for this recipe here (`vllm_choice.choose`), said in one line."""
    from nemo_fp8_rl.engines.nemo.cpu.vllm_choice import choose

    choice = choose(config)
    print(f"generation: {choice.reason}", flush=True)
    return choice


def policy_worker(quantize_on: str) -> str:
    """The CPU policy worker's class path for `refit.quantize_on`."""
    return TRAINER_FP8_POLICY_WORKER if quantize_on == "trainer" else POLICY_WORKER


def check_cpu_recipe(config: dict[str, Any]) -> list[str]:
    """What stops a CPU recipe on NeMo RL's loop here (empty: runnable)."""
    problems = []
    policy = config["policy"]
    if not policy.get("megatron_cfg", {}).get("enabled", False):
        problems.append(
            "policy.megatron_cfg.enabled is false: the CPU loop trains on megatron-core; "
            "set it true (DTensor's worker needs CUDA)"
        )
    generation = policy["generation"]
    if generation.get("backend") != "vllm":
        problems.append(
            f"policy.generation.backend: {generation.get('backend')}: the CPU loop serves "
            "generation behind NeMo RL's VllmGeneration; set vllm"
        )
    if not colocated(config):
        resources = generation["colocated"].get("resources") or {}
        if resources.get("gpus_per_node") != 1 or resources.get("num_nodes") not in (None, 1):
            problems.append(
                "policy.generation.colocated.resources: the CPU loop gives non-colocated "
                "generation one logical GPU; set gpus_per_node: 1 and num_nodes: null"
            )
    data = config.get("data", {})
    if (data.get("default") or {}).get("processor") != "math_hf_data_processor":
        problems.append(
            "data.default.processor is not math_hf_data_processor: this CPU recipe is the "
            "embedded engine's; run it with --engine local, or run NeMo RL's loop on CPU with a "
            "recipe under recipes/tiny-nemo/ (NeMo RL's ResponseDataset and math environment)"
        )
    return problems


class CpuLoop:
    """NeMo RL's loop on this CPU machine, as the runner's platform (`driver.platform`).

    The model and data the run trains on are the tiny kit's hand-over (`tiny.handover.prepare`
    of the recipe's whole config `recipe_config`, whose `local` section the hand-off leaves out;
    written into the run directory with the hand-off; `resume`: a resumed run, whose training
    prompt file must keep its size).
    """

    def __init__(self, recipe_config: dict[str, Any], resume: bool = False) -> None:
        self.recipe_config = recipe_config
        self.resume = resume
        self.real_vllm = False  # decided with the hand-off (`generation_choice`)
        self.reason = "not decided yet (before the hand-off)"

    def problems(self, config: dict[str, Any]) -> list[str]:
        """What stops the recipe on the CPU loop (`check_cpu_recipe`)."""
        return check_cpu_recipe(config)

    def set_environment(self) -> None:
        """`cluster.set_environment` (before NeMo RL is imported)."""
        from nemo_fp8_rl.engines.nemo.cpu import cluster

        cluster.set_environment()

    def handoff(self, config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
        """The hand-off with the CPU loop's values and the inputs written into `run_dir`."""
        from nemo_fp8_rl.tiny import handover

        choice = generation_choice(config)
        self.real_vllm, self.reason = choice.real_vllm, choice.reason
        inputs = handover.prepare(self.recipe_config, run_dir, resume=self.resume)
        return cpu_config(config, inputs, self.real_vllm)

    def served(self) -> dict[str, Any]:
        """The generator that serves this run's rollouts (`vllm_choice.served_record`)."""
        from nemo_fp8_rl.engines.nemo.cpu.vllm_choice import served_record

        return served_record(self.real_vllm, self.reason, "cpu")

    def start_ray(self, config: dict[str, Any]) -> None:
        """A local Ray with the recipe's logical GPUs and the CPU workers registered."""
        from nemo_fp8_rl.engines.nemo.cpu import cluster

        cluster.register_workers(WORKERS)
        resources = cluster.start_ray(logical_gpus(config))
        print(f"Ray on CPU with {resources.get('GPU', 0):.0f} logical GPU(s)", flush=True)

    def stop_ray(self) -> None:
        """Stop the run's local Ray (`cluster.stop_ray`)."""
        from nemo_fp8_rl.engines.nemo.cpu import cluster

        cluster.stop_ray()

    def policy_factory(self, calibrated: bool, quantize_on: str) -> Any:
        """`grpo.setup(policy_factory=...)`: NeMo RL's `Policy` with the CPU policy worker
        (which has the shadow controls whether or not the recipe calibrates)."""
        from nemo_rl.models.policy.lm_policy import Policy

        fqn = policy_worker(quantize_on)

        def make_policy(*args: Any, **kwargs: Any) -> Any:
            print(f"policy worker: {fqn} (CPU, megatron-core)", flush=True)
            return Policy(*args, worker_extension_cls_fqn=fqn, **kwargs)

        return make_policy

    def generation_workers(self, quantize_on: str) -> contextlib.AbstractContextManager[Any]:
        """While `grpo.setup` runs: `VllmGeneration` starts the CPU generation worker (real
        vLLM or the stand-in, as `handoff` chose)."""
        from nemo_fp8_rl.engines.nemo.cpu.worker_choice import cpu_generation_worker

        return cpu_generation_worker(quantize_on, self.real_vllm)
