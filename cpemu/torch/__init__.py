"""``cpemu.torch``: ``torch._scaled_mm`` with the numerics of a profile's GPU, on torch tensors.

Needs torch (``pip install "cpemu[torch]"``); ``import cpemu`` alone never imports torch.

* :func:`scaled_mm` -- ``torch._scaled_mm``'s signature and argument checks (the same
  exception types and messages as torch on the H200), computed by :func:`cpemu.gemm`:
  the output bits are those the profile's GPU returns.
* :class:`patch` -- a context manager / decorator that replaces ``torch._scaled_mm``
  for a block, so unmodified code (torchao, hand-written FP8 layers) runs with the
  profile's numerics on any machine; the original is restored on exit, also when the
  block raises.
* :class:`FP8Linear` -- the forward FP8 GEMM of a Transformer Engine linear layer under
  delayed scaling (Evo 2's FP8 projections): E4M3 weight with a per-tensor
  ``scale_inv``, input quantised with a given scale, fast accumulation, bf16 output.

Tensors may live on the CPU or on a CUDA device. CPU operands reach :func:`cpemu.gemm`
as numpy views, without copies (DLPack, or ``Tensor.numpy()``); the result comes back
as a tensor sharing the numpy buffer. CUDA operands stay on their device, on torch's
current stream: where the backend ladder picks the tensor-core path (``cublaslt-tc``, a
Hopper GPU), the call goes straight from the tensors' pointers to ``cublasLtMatmul``
(:func:`cpemu.torch.routes._tensor_core_call`); otherwise the FP8 codes are shared with
cupy without a copy and computed by :func:`cpemu.gemm`'s CUDA backends. CUDA tensors need
cupy; without it they are copied to the host and computed by a host backend (``cpu-fp32``,
the reference's bits).

* :class:`dispatch` -- cpemu's kernels for ``aten::_scaled_mm`` (and ``_scaled_mm_v2``)
  in torch's dispatcher for a block: ``torch.ops.aten._scaled_mm``, ``torch.compile``'d
  graphs and torchao's float8 layers, eager and compiled, get the profile's bits.

What ``patch`` does not cover: callers that hold their own reference to the original
function (``from torch import _scaled_mm`` before the block, ``torch.ops.aten._scaled_mm``,
graphs compiled by ``torch.compile``): :class:`dispatch` covers those. Neither covers
libraries that call cuBLASLt from C++ (Transformer Engine's ``te.Linear``); for those use
:class:`FP8Linear`, or :mod:`cpemu.evo2` for a vortex model.
Gradients do not flow through the emulated product (FP8 GEMMs here are for inference
and for checking numerics).

The package, by job: ``api`` (:func:`scaled_mm`: check, then route); ``rules`` (torch's
argument rules, and what cpemu refuses); ``layout`` and ``scaling`` (how torch reads the
operands' strides and the scales); ``routes`` (the tensor-core pointer path, the
exact-kernel route, the general route); ``device`` (cupy, streams, the scale check in stream
order); ``convert`` (tensors as numpy arrays and back); ``dtypes``; ``patching``
(:class:`patch`); ``dispatch`` (:class:`dispatch`); ``chunking`` (row chunks that keep the
bits); ``linear`` (:class:`FP8Linear`); ``te_state`` (Transformer Engine's ``_extra_state``).
A module imports only modules before it in this order: ``dtypes``, ``layout``, ``scaling``,
``rules``, ``convert``, ``device``, ``routes``, ``api``, ``patching``, ``dispatch``,
``chunking``, ``linear``, ``te_state``.
"""

from __future__ import annotations

import torch

from ..profile import DEFAULT_PROFILE
from .api import scaled_mm
from .linear import E4M3_MAX, FP8Linear, delayed_scaling_scale, quantize_e4m3
from .patching import patch
from .dispatch import dispatch

__all__ = ["scaled_mm", "patch", "dispatch", "FP8Linear", "quantize_e4m3", "delayed_scaling_scale", "E4M3_MAX"]


def _check_torch_version():  # pragma: no cover - import-time guard
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 4):
        raise ImportError(f"cpemu.torch needs torch >= 2.4 (found {torch.__version__})")


_check_torch_version()
