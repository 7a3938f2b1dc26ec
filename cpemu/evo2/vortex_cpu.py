"""Loading vortex (PyPI ``vtx``, Evo 2's inference code) where it was not built to load.

vortex 1.1.0 assumes a CUDA machine in three places. This module works around each, for
the duration of an import or a model build only, and changes nothing else:

1. ``vortex.ops`` imports ``triton`` and the flash-attention extension ``flash_attn_2_cuda``
   at import time. Where they are not installed, :func:`vortex_import_shims` puts stand-in
   modules in ``sys.modules`` while vortex imports, and takes them out again. Their kernels
   raise ``RuntimeError`` if called. A model without attention layers and with vortex's
   fused Hyena kernels off (``use_hc*_kernel`` false, the default) never calls them.
2. ``StripedHyena.__init__`` enters ``torch.cuda.device("cpu")`` around each block, and each
   Hyena block's forward enters ``torch.cuda.device(x.device)``; both raise on a CPU
   ("Expected a cuda device"). :func:`cpu_device_calls` makes ``torch.cuda.device`` a no-op
   for non-CUDA devices during a block: :func:`build_model` builds inside it and wraps the
   model's ``forward`` in it (calls of single blocks need it too).
3. Without Transformer Engine vortex refuses FP8 configs (``use_fp8_input_projections``):
   build with it false, then swap the projections (:func:`cpemu.evo2.swap_fp8_projections`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
import types

import torch

__all__ = ["vortex_import_shims", "cpu_device_calls", "import_vortex", "build_model"]

_SHIMMED = ("triton", "triton.language", "flash_attn_2_cuda")


class _Absent:
    """Whatever a stand-in module is asked for: decorators, configs, ``tl.constexpr``."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:  # used as a decorator
            return _AbsentKernel(getattr(args[0], "__name__", self._name), self._name.split(".")[0])
        return _Absent(self._name)

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Absent(f"{self._name}.{key}")

    def __getitem__(self, key):
        return _Absent(self._name)


class _AbsentKernel(_Absent):
    def __init__(self, kernel: str, module: str):
        super().__init__(kernel)
        self._module = module

    def _raise(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: a {self._module} kernel, but {self._module} is not installed "
                           f"(cpemu.evo2 imported vortex with a stand-in module)")

    __call__ = _raise

    def __getitem__(self, key):
        return self._raise


def _stand_in(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, f"stand-in for {name}, which is not installed (cpemu.evo2.vortex_cpu)")

    def __getattr__(key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Absent(f"{name}.{key}")

    mod.__getattr__ = __getattr__
    return mod


def _installed(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def vortex_import_shims():
    """Stand-ins for ``triton`` and ``flash_attn_2_cuda`` where they are missing, during the block only."""
    added = [n for n in _SHIMMED if not _installed(n.split(".")[0]) and n not in sys.modules]
    for n in added:
        sys.modules[n] = _stand_in(n)
    if "triton" in added and "triton.language" in added:
        sys.modules["triton"].language = sys.modules["triton.language"]
    try:
        yield tuple(added)
    finally:
        for n in added:  # torch and others must not find a stand-in later
            sys.modules.pop(n, None)


@contextlib.contextmanager
def cpu_device_calls():
    """``torch.cuda.device(d)`` is a no-op for a non-CUDA ``d`` during the block (see the module docstring)."""
    original = torch.cuda.device

    class _device:
        def __init__(self, device):
            dev = device if isinstance(device, int) else torch.device(device) if device is not None else None
            self._inner = None if isinstance(dev, torch.device) and dev.type != "cuda" else original(device)

        def __enter__(self):
            return None if self._inner is None else self._inner.__enter__()

        def __exit__(self, *exc):
            return False if self._inner is None else self._inner.__exit__(*exc)

    torch.cuda.device = _device
    try:
        yield
    finally:
        torch.cuda.device = original


def import_vortex():
    """``vortex.model.model``, imported with :func:`vortex_import_shims`; ImportError if vtx is absent."""
    if not _installed("vortex"):
        raise ImportError("vortex (PyPI vtx) is not installed: pip install vtx==1.1.0")
    with vortex_import_shims():
        return importlib.import_module("vortex.model.model")


def build_model(config: dict, *, bfloat16: bool = True):
    """A vortex ``StripedHyena`` built from ``config`` (a dict or vortex's dotdict) on this
    machine's default device, with :func:`cpu_device_calls`; in bf16 as vortex's loaders
    leave it (``to_bfloat16_except_pr_lc``) when ``bfloat16``; in eval mode.

    ``use_fp8_input_projections`` must be false (vortex refuses FP8 without Transformer
    Engine); swap the projections afterwards. The model's ``forward`` runs inside
    :func:`cpu_device_calls` (a no-op on CUDA tensors)."""
    if config.get("use_fp8_input_projections", False):
        raise ValueError("config: use_fp8_input_projections must be False here (vortex refuses FP8 without "
                         "Transformer Engine); build without it, then call cpemu.evo2.swap_fp8_projections")
    vm = import_vortex()
    from vortex.model.utils import dotdict  # noqa: PLC0415 - vortex is optional

    with cpu_device_calls():
        model = vm.StripedHyena(dotdict(dict(config)))
    if bfloat16:
        model.to_bfloat16_except_pr_lc()
    model.forward = _in_cpu_device_calls(model.forward)
    return model.eval()


def _in_cpu_device_calls(forward):
    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        with cpu_device_calls():
            return forward(*args, **kwargs)

    wrapped.cpemu_wrapped = "cpemu.evo2.cpu_device_calls"
    return wrapped
