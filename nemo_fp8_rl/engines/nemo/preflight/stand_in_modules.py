"""Packages of stand-ins (`vllm`, `megatron.bridge`), for running NeMo RL's code where they are absent.

NeMo RL's vLLM worker imports `vllm` inside `_load_model`, and its FP8 module
(`nemo_rl/models/generation/vllm/quantization/fp8.py`) imports vLLM internals at import time:
layer classes, the Triton namespace, the engine classes whose methods `init_fp8` patches, and
(through `unittest.mock.patch`) the FP8 linear/MoE/KV-cache methods it replaces. None of that
needs vLLM's behaviour to decide what `init_fp8` returns, so `vllm_stand_in()` serves every
`vllm` / `vllm.*` import from a meta-path finder:

- `vllm.LLM` is `LLMRecorder` (the keyword arguments the worker builds are what vLLM would get);
- `vllm.logger.init_logger` is `logging.getLogger`;
- any other name is a `StandIn` class made on first use (attribute reads on it give more
  stand-ins, calls return an instance), so `patch(...)` and `@triton.jit` work on it.

NeMo RL's own code (`init_fp8`, its FP8 validation, its kwargs) runs unchanged. Every module added
(the stand-ins and NeMo RL's modules imported against them) is removed afterwards, so the next
rehearsal imports NeMo RL's FP8 module afresh (it keeps global state) and the machine's real
`vllm`, if any, is untouched.

`megatron_bridge_stand_in()` does the same for Megatron-Bridge (its import needs Transformer
Engine, a CUDA library): NeMo RL's `nemo_rl/models/megatron/data.py` imports one packing helper
from it at import time, and the preflight calls that module's own packing checks.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight.recorders import Recorder


class LLMRecorder(Recorder):
    """`vllm.LLM`: keeps the keyword arguments the worker builds (`kwargs`)."""


class _StandInMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        made = _StandInMeta(name, (StandIn,), {"__module__": cls.__module__})
        setattr(cls, name, made)
        return made


class StandIn(metaclass=_StandInMeta):
    """A vLLM name NeMo RL imports but whose behaviour the rehearsal does not need."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class StandInModule(types.ModuleType):
    """A `vllm.*` module: a missing attribute is a `StandIn` class of that name."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        made = _StandInMeta(name, (StandIn,), {"__module__": self.__name__})
        setattr(self, name, made)
        return made


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the package `root` and every module under it as a `StandInModule`."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = StandInModule(spec.name)
        module.__path__ = []  # a package: submodules resolve through this finder
        if spec.name == "vllm":
            module.LLM = LLMRecorder
        if spec.name == "vllm.logger":
            module.init_logger = logging.getLogger
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextlib.contextmanager
def stood_in(root: str, also_forget: tuple[str, ...] = ()) -> Iterator[None]:
    """Imports of `root` (and below) served by stand-ins inside the block.

    Modules already imported under `root` or a prefix in `also_forget` are hidden for the
    block (so NeMo RL's FP8 module, whose globals and patches the rehearsal sets, is a fresh
    copy bound to the stand-ins, and the process's own copy is left untouched); afterwards
    every module the block added under them is removed and the hidden ones are put back.
    """
    prefixes = (root + ".", *also_forget)

    def mine(name: str) -> bool:
        return name == root or name.startswith(prefixes)

    hidden = {n: m for n, m in sys.modules.items() if mine(n)}
    for name in hidden:
        del sys.modules[name]
    finder = _Finder(root)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if mine(n)]:
            del sys.modules[name]
        sys.modules.update(hidden)
        for name, module in hidden.items():  # parents point at the modules put back
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, module)


def vllm_stand_in() -> contextlib.AbstractContextManager[None]:
    """`vllm` stand-ins; NeMo RL's FP8 module (global state) is forgotten afterwards."""
    return stood_in("vllm", ("nemo_rl.models.generation.vllm.quantization",))


def megatron_bridge_stand_in() -> contextlib.AbstractContextManager[None]:
    """`megatron.bridge` stand-ins; NeMo RL's Megatron modules imported meanwhile are forgotten."""
    return stood_in("megatron.bridge", ("nemo_rl.models.megatron",))
