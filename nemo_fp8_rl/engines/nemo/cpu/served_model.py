"""The model the CPU generation worker serves: the HF checkpoint as vLLM holds it for NeMo RL.

A transformers Qwen3/Llama model loaded from `config["model_name"]`, whose decoder linear
layers are `ServedLinear` modules (instances of the `LinearBase` NeMo RL's FP8 code tests
with `isinstance`), holding what vLLM's layers hold:

* BF16 layers: a BF16 `weight`;
* FP8 layers (`vllm_cfg.precision: fp8`, every decoder linear NeMo RL's `init_fp8` does not put
  in `ignored_layers`): a float8_e4m3fn `weight` and its float32 `weight_scale_inv` (one per
  128x128 block), exactly as NeMo RL's `fp8.load_weights` produced them (generator side) or the
  trainer sent them (`refit.quantize_on: trainer`);
* MXFP8 layers (`vllm_cfg.is_mx`): a float8_e4m3fn `weight` and its uint8 E8M0
  `weight_scale_from_checkpoint` (one byte per 1x32 block along K), the name and layout NeMo
  RL's `quantize_mxfp8_weight` loads (vLLM keeps a swizzled copy for its kernel; the values are
  the same).

Compute (W8A8 emulation of vLLM's block-FP8 linear, BF16 elsewhere):
`y = bf16(fq_a(bf16(x)) @ (q * scale_inv)^T)` with `fq_a` the dynamic 1x128 activation
quantize-dequantize of `nemo_fp8_rl.fp8` (power-of-2 scales with
`pow2_activation_scaling_factors`); MXFP8 layers `y = bf16(fq_mx(bf16(x)) @ (q * 2^(e-127))^T)`
with `fq_mx` the 1x32 quantize-dequantize by the weights' rule (vLLM's `mxfp8_e4m3_quantize`,
`refit.nemo_mxfp8`); BF16 layers compute `bf16(bf16(x) @ W^T)`. Embeddings,
norms and the LM head keep BF16 values (vLLM `dtype: bfloat16`) in FP32 tensors. FP8 KV
cache (`kv_cache_dtype: fp8`): K/V quantize-dequantized with the per-layer `k_scale`/`v_scale`
the refit sends (`nemo_fp8_rl.fp8.kv_cache`); `q_scale` is stored, not applied.

Weights change transactionally: `load_weights` (what NeMo RL's loaders call) checks each
tensor against the parameter it names and stages a copy; `process_weights_after_loading` (what
NeMo RL's refit calls once the whole stream arrived and matched its manifest) commits them all.
A refit that fails anywhere before that commit leaves the served weights as they were.
NeMo RL sends HF names (`q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj`, never fused), so
the layers keep HF's unfused layout and `packed_modules_mapping` is empty.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nemo_fp8_rl.engines.nemo.cpu.vllm_names import LinearBase
from nemo_fp8_rl.fp8 import FP8Spec, dequantize, fake_quantize
from nemo_fp8_rl.fp8.emulation import round_to_bf16
from nemo_fp8_rl.fp8.kv_cache import FP8KVCacheState, enable_fp8_kv_cache_emulation
from nemo_fp8_rl.refit.errors import RefitMismatch
from nemo_fp8_rl.refit.nemo_mxfp8 import MX_BLOCK, dequantize_mxfp8, reference_quantize

FP8 = torch.float8_e4m3fn
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
BLOCK = 128
SCALE_SUFFIX = "_scale_inv"
MX_SCALE_SUFFIX = "_scale_from_checkpoint"
SCALE_SUFFIXES = (SCALE_SUFFIX, MX_SCALE_SUFFIX)
WEIGHT_SPEC = FP8Spec("e4m3", "blockwise", "fp32")  # dequantize only multiplies by scale_inv
KV_SCALES = ("self_attn.k_scale", "self_attn.v_scale", "self_attn.attn.q_scale")


SERVED = "the refit does not match the served model"
SERVED_FIX = (
    "build the policy and the generation worker from the same model_name and "
    "policy.generation.vllm_cfg (precision, kv_cache_dtype, refit.quantize_on)"
)


def fake_quantize_mx(x: torch.Tensor) -> torch.Tensor:
    """MXFP8 quantize-dequantize of activations along the last dim, by vLLM's rule."""
    q, scales = reference_quantize(x)
    return dequantize_mxfp8(q, scales)


class ServedLinear(LinearBase):
    """A decoder linear layer as vLLM holds it: BF16, FP8 with block scales, or MXFP8 (`mx`)
    with E8M0 bytes (module doc)."""

    def __init__(self, linear: nn.Linear, fp8: bool, act_spec: FP8Spec, mx: bool = False) -> None:
        super().__init__()
        out_features, in_features = linear.weight.shape
        self.in_features, self.out_features = in_features, out_features
        self.fp8, self.act_spec, self.mx = fp8, act_spec, fp8 and mx
        if self.mx:
            if in_features % MX_BLOCK:
                raise ValueError(
                    f"an MXFP8 layer needs in_features a multiple of {MX_BLOCK}, got {in_features}"
                )
            grid = (out_features, in_features // MX_BLOCK)
            self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=FP8), False)
            self.weight_scale_from_checkpoint = nn.Parameter(
                torch.full(grid, 127, dtype=torch.uint8), False
            )
        elif fp8:
            grid = (math.ceil(out_features / BLOCK), math.ceil(in_features / BLOCK))
            self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=FP8), False)
            self.weight_scale_inv = nn.Parameter(torch.ones(grid, dtype=torch.float32), False)
        else:
            self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), False)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16), False)
        self.refresh()

    def refresh(self) -> None:
        """Recompute the FP32 weight the matmul uses from the held weight (after a commit)."""
        if self.mx:
            self._w = dequantize_mxfp8(self.weight.data, self.weight_scale_from_checkpoint.data)
        elif self.fp8:
            self._w = dequantize(self.weight.data, self.weight_scale_inv.data, WEIGHT_SPEC)
        else:
            self._w = self.weight.data.float()
        self._b = None if self.bias is None else self.bias.data.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """W8A8 emulation for FP8 layers, BF16 emulation otherwise (module docstring)."""
        h = round_to_bf16(x.float())
        if self.mx:
            h = fake_quantize_mx(h)
        elif self.fp8:
            h = fake_quantize(h, self.act_spec)
        return round_to_bf16(F.linear(h, self._w, self._b)).to(x.dtype)

    def extra_repr(self) -> str:
        """Shape and precision."""
        kind = f"fp8 act={self.act_spec.granularity}/{self.act_spec.scale}" if self.fp8 else "bf16"
        kind = "mxfp8 (1x32, e8m0)" if self.mx else kind
        return f"in={self.in_features}, out={self.out_features}, {kind}"


def _decoder_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The `nn.Linear` layers inside the decoder layers (not the LM head), by module path."""
    return [
        (fqn, mod)
        for fqn, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and ".layers." in f".{fqn}"
    ]


def _bf16_input(module: nn.Module, args: tuple) -> tuple:
    """The LM head reads BF16 hidden states (vLLM computes it in BF16)."""
    return tuple(round_to_bf16(a) if torch.is_tensor(a) else a for a in args)


def _bf16_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """The LM head's logits are BF16 values."""
    return round_to_bf16(output)


def _expected_dtype_ok(held: torch.dtype, sent: torch.dtype) -> bool:
    """FP8 arrives as FP8, E8M0 bytes as uint8; anything else as a floating dtype, not FP8."""
    if held in (FP8, torch.uint8):
        return sent == held
    return sent.is_floating_point and sent not in (FP8, torch.float8_e5m2)


class ServedModel(nn.Module):
    """The HF model with `ServedLinear` decoder layers, loaded and refit transactionally.

    Parameter names are the HF checkpoint's (`model.layers.0.self_attn.q_proj.weight`, ...),
    plus `<linear>.weight_scale_inv` for FP8 layers (`<linear>.weight_scale_from_checkpoint` for
    MXFP8 ones). The HF model itself is held outside the
    module tree (its submodules `model` and `lm_head` are registered here), so each parameter
    has exactly its HF name.
    """

    packed_modules_mapping: dict[str, list[str]] = {}

    def __init__(
        self,
        hf_model: nn.Module,
        fp8_modules: set[str],
        act_spec: FP8Spec,
        kv_fp8: bool,
        mx: bool = False,
    ) -> None:
        super().__init__()
        object.__setattr__(self, "hf", hf_model)
        self.tied = bool(getattr(hf_model.config, "tie_word_embeddings", False))
        for fqn, linear in _decoder_linears(hf_model):
            parent, _, child = fqn.rpartition(".")
            served = ServedLinear(linear, fqn in fp8_modules, act_spec, mx)
            setattr(hf_model.get_submodule(parent), child, served)
        self.model = hf_model.model
        self.lm_head = hf_model.lm_head
        self.lm_head.register_forward_pre_hook(_bf16_input)
        self.lm_head.register_forward_hook(_bf16_output)
        self.kv_fp8 = kv_fp8
        if kv_fp8:
            enable_fp8_kv_cache_emulation(hf_model)
        self._staged: dict[str, torch.Tensor] = {}
        self.q_scales: dict[str, float] = {}

    # ---- weights ---------------------------------------------------------------------------

    def _params(self) -> dict[str, nn.Parameter]:
        return dict(self.named_parameters())

    def _attention(self, name: str) -> nn.Module | None:
        """The attention module a K/V/Q scale name refers to (vLLM's names), else None."""
        for suffix in KV_SCALES:
            if name.endswith(suffix):
                path = name[: -len(suffix)] + "self_attn"
                try:
                    return self.get_submodule(path)
                except AttributeError:
                    return None
        return None

    def is_kv_scale(self, name: str) -> bool:
        """Whether `name` is one of vLLM's per-layer K/V/Q scale names of this model."""
        return self._attention(name) is not None

    def skipped(self, name: str) -> bool:
        """Names vLLM's loader skips: the LM head of a model with tied embeddings."""
        return self.tied and name == "lm_head.weight"

    def problems(self, name: str, shape: Any, dtype: torch.dtype) -> list[str]:
        """Why a tensor `name` of `shape`/`dtype` cannot be loaded (empty when it can)."""
        if self.skipped(name):
            return []
        if self.is_kv_scale(name):
            if tuple(shape) not in ((), (1,)) or dtype != torch.float32:
                return [f"{name}: a K/V scale is one float32 value, got {list(shape)} {dtype}"]
            return []
        param = self._params().get(name)
        if param is None:
            return [f"{name}: the served model holds no such tensor"]
        problems = []
        if tuple(shape) != tuple(param.shape):
            problems.append(
                f"{name}: shape {list(shape)}, the served model holds {list(param.shape)}"
            )
        if not _expected_dtype_ok(param.dtype, dtype):
            problems.append(f"{name}: dtype {dtype}, the served model holds {param.dtype}")
        return problems

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Check and stage `(name, tensor)` pairs (vLLM's `load_weights`); commit applies them."""
        batch = [(str(n), t) for n, t in weights]
        problems = [p for n, t in batch for p in self.problems(n, t.shape, t.dtype)]
        if problems:
            raise RefitMismatch("CPU generation worker load_weights", SERVED, problems, SERVED_FIX)
        for name, tensor in batch:
            if not self.skipped(name):
                self._staged[name] = tensor.detach().clone()
        return {n for n, _ in batch}

    def discard_staged(self) -> None:
        """Forget staged tensors (a refit that failed before its commit)."""
        self._staged.clear()

    @torch.no_grad()
    def process_weights_after_loading(self) -> None:
        """Commit the staged tensors, then refresh the layers' matmul weights."""
        params = self._params()
        for name, tensor in self._staged.items():
            if self.is_kv_scale(name):
                self._set_scale(name, float(tensor.reshape(-1)[0]))
                continue
            param = params[name]
            if param.dtype in (FP8, torch.uint8) or name.endswith(SCALE_SUFFIXES):
                param.copy_(tensor)
            else:
                param.copy_(round_to_bf16(tensor.float()))  # vLLM holds BF16 values
        self._staged.clear()
        for module in self.modules():
            if isinstance(module, ServedLinear):
                module.refresh()

    def _set_scale(self, name: str, value: float) -> None:
        attention = self._attention(name)
        state: FP8KVCacheState | None = getattr(attention, "fp8_kv_state", None)
        if name.endswith("q_scale"):
            self.q_scales[name] = value
        elif state is not None and name.endswith("k_scale"):
            state.k_scale = value
        elif state is not None:
            state.v_scale = value

    def staged_names(self) -> set[str]:
        """Names staged and not yet committed."""
        return set(self._staged)

    # ---- compute ---------------------------------------------------------------------------

    def forward(self, **kwargs: Any) -> Any:
        """The HF model's forward (logits and KV cache as transformers returns them)."""
        return self.hf(**kwargs)

    @property
    def config(self) -> Any:
        """The HF config."""
        return self.hf.config


def refit_info_problems(
    model: ServedModel, info: dict[str, Any], trainer_quantized: bool
) -> list[str]:
    """Why NeMo RL's refit metadata `{name: (shape, dtype)}` does not fit `model` (empty: it
    does). Generator side: FP8 layers arrive in higher precision and NeMo RL quantizes them
    on receipt; trainer side: they arrive as FP8 pairs with their `_scale_inv` (MXFP8:
    `_scale_from_checkpoint`)."""
    problems: list[str] = []
    held = dict(model.named_parameters())
    for name, (shape, dtype) in info.items():
        param = held.get(name)
        if not trainer_quantized and param is not None and param.dtype == FP8:
            if not dtype.is_floating_point or dtype in FP8_DTYPES:
                problems.append(f"{name}: dtype {dtype} in a refit the generator quantizes")
            problems += model.problems(name, shape, FP8)  # the shape against the FP8 weight
        elif not trainer_quantized and name.endswith(SCALE_SUFFIXES):
            problems.append(f"{name}: a scale in a refit the generator quantizes itself")
        else:
            problems += model.problems(name, shape, dtype)
    expected = {n for n in held if trainer_quantized or not n.endswith(SCALE_SUFFIXES)}
    if model.tied:
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(info))
    problems += [f"{n}: the served model holds it, the refit does not send it" for n in missing]
    return problems
