"""Tensors as numpy arrays and results back as tensors, without copies where the memory allows."""

from __future__ import annotations

import numpy as np
import torch

from .dtypes import _FP8


def _host_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (DLPack, else ``Tensor.numpy()``); CUDA tensors are copied to the host.

    The dtype must be one numpy knows (callers reinterpret FP8/bf16 as uint8/int16 first).
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # scales and bias (small); CUDA operands stay on the device (_gemm_on_device)
    try:
        return np.from_dlpack(t)
    except (TypeError, RuntimeError, BufferError, AttributeError):
        return t.numpy()


def _fp8_numpy(t) -> np.ndarray:
    np_dtype = _FP8[t.dtype][0]
    return _host_numpy(t.view(torch.uint8)).view(np_dtype)


def _to_torch(y: np.ndarray, out_dtype, device) -> torch.Tensor:
    if out_dtype == torch.bfloat16:
        out = torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(y)
    return out if device.type == "cpu" else out.to(device)


def _as_torch(cupy, y, out_dt, device):
    """A result of the CUDA kernels (cupy float32, or uint16 bf16/fp16 bits) as a tensor of
    ``out_dt`` on ``device``, without a copy."""
    out = torch.as_tensor(y if out_dt == torch.float32 else y.view(cupy.int16), device=device)
    return out if out_dt == torch.float32 else out.view(out_dt)

