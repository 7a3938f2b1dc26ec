"""Every FP8 projection of a vortex model, swapped for cpemu's delayed-scaling FP8 linear.

Evo 2 runs each Hyena block's ``projections`` (hidden -> 3*hidden, no bias) as a
Transformer Engine ``Linear`` under ``fp8_autocast(DelayedScaling(Format.HYBRID,
amax_history_len=16, amax_compute_algo="max"))`` (``vortex/model/layers.py``, ``TELinear``).
In inference (``torch.no_grad``) TE does not update its scales: ``fp8_autocast`` updates
them on exit only when gradients are enabled (``transformer_engine/pytorch/quantization.py``,
``autocast_exit``; ``fp8.py`` in TE 1.x). So each forward GEMM uses the checkpoint's scales:

1. the weight: ``w8 = e4m3(sat(w * scale_fwd[1]))``, ``w_inv = 1/scale_fwd[1]``;
2. the input: ``x8 = e4m3(sat(x * scale_fwd[0]))``, ``x_inv = 1/scale_fwd[0]``
   (TE's cast kernels write ``scale_inv`` with ``__frcp_rn``, a correctly rounded
   reciprocal: ``transformer_engine/common/utils.cuh`` and ``cast/fp8/quantize_fp8.cuh``);
3. ``y = x8 @ w8^T`` by cuBLASLt with fast accumulation (``_2X_ACC_FPROP = False``; the
   delayed-scaling recipe has no ``fp8_gemm_fprop`` to override it), ``x_inv`` and ``w_inv``
   as the scale pointers, bf16 output, no epilogue.

vortex pads the sequence to a multiple of 16 tokens before the projection and cuts the
output back (``ParallelGatedConvBlock.pad_to_multiple``); :class:`TEProjection` does the
same, so the GEMM sees vortex's M. :func:`swap_fp8_projections` reads the scales from the
checkpoint's ``_extra_state`` (:mod:`cpemu.torch.te_state`), which vortex strips when
Transformer Engine is absent: pass the checkpoint's own state dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import backends
from ..callers import te_schedule
from ..profile import DEFAULT_PROFILE, get_profile
from ..torch.dtypes import _FP8
from ..torch.linear import FP8Linear, quantize_e4m3
from ..torch.te_state import read_extra_state

__all__ = ["TEProjection", "SwapEntry", "swap_fp8_projections", "fp8_projections", "is_vortex_telinear"]


def is_vortex_telinear(module) -> bool:
    """Whether ``module`` is vortex's ``TELinear`` (the TE class, or vortex's fallback without TE)."""
    cls = type(module)
    return cls.__name__ == "TELinear" and cls.__module__.startswith("vortex.")


class TEProjection(torch.nn.Module):
    """A vortex ``TELinear`` under FP8 delayed scaling, with the bits of ``profile``'s GPU.

    ``forward(x)`` takes vortex's (batch, seq, hidden) bf16 input, pads ``seq`` with zeros to
    a multiple of 16 as vortex does in FP8 mode, runs :class:`~cpemu.torch.FP8Linear` on the
    (batch * padded seq) rows, cuts the padding off and returns ``(y, None)`` as ``TELinear``
    does (no bias). ``self.linear`` is the FP8 linear (its buffers hold the quantised weight
    and the scales)."""

    def __init__(self, linear: FP8Linear, name: str = ""):
        super().__init__()
        self.linear = linear
        self.name = name

    @classmethod
    def from_te(cls, weight, state, *, name: str = "", profile=DEFAULT_PROFILE, backend="auto",
                max_rows: int | None = None) -> "TEProjection":
        """From the bf16 (out, in) weight and the layer's :class:`~cpemu.torch.te_state.DelayedScalingState`."""
        w_scale = torch.tensor(state.weight_scale, dtype=torch.float32, device=weight.device)
        w8 = quantize_e4m3(weight.detach(), w_scale)
        return cls(FP8Linear.from_fp8(w8, torch.reciprocal(w_scale), input_scale=state.input_scale,
                                      profile=profile, backend=backend, max_rows=max_rows), name)

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def forward(self, x: torch.Tensor):
        if x.dim() == 3:
            seq = x.shape[1]
            pad = -seq % 16
            y = self.linear(F.pad(x, (0, 0, 0, pad)) if pad else x)
            return (y[:, :seq] if pad else y), None
        return self.linear(x), None


@dataclass(frozen=True)
class SwapEntry:
    """One vortex ``TELinear`` and what the swap does with it: ``action`` is ``"swap"`` or ``"keep"``."""

    name: str
    in_features: int
    out_features: int
    action: str
    reason: str = ""
    input_scale: float | None = None
    weight_scale: float | None = None
    source: str = ""
    schedule: str = ""

    def __str__(self) -> str:
        shape = f"{self.in_features} -> {self.out_features}"
        if self.action == "swap":
            return (f"swap {self.name}: {shape}, input scale {self.input_scale!r}, weight scale "
                    f"{self.weight_scale!r} ({self.source}; {self.schedule})")
        return f"keep {self.name}: {shape} ({self.reason})"


def fp8_projections(model):
    """``(name, module)`` for every vortex ``TELinear`` of ``model``, in module order."""
    return [(n, m) for n, m in model.named_modules() if is_vortex_telinear(m)]


def _entry(name, mod, state_dict, profile) -> tuple:
    key = f"{name}._extra_state"
    size = dict(name=name, in_features=mod.in_features, out_features=mod.out_features)
    if key not in state_dict:
        return SwapEntry(**size, action="keep", reason=f"the state dict has no {key}"), None
    state = read_extra_state(state_dict[key], key)
    if state is None:
        return SwapEntry(**size, action="keep", reason=f"{key} holds no FP8 scales"), None
    if getattr(mod, "bias", None) is not None:
        raise ValueError(f"{name}: has a bias; Evo 2's FP8 projections have none, and the swap covers "
                         f"bias-free TE linears only")
    if state.scale_fwd.numel() < 3:
        raise ValueError(f"{key}: scale_fwd has {state.scale_fwd.numel()} entries; a TE linear has 3 per GEMM")
    for what, v in (("input", state.input_scale), ("weight", state.weight_scale)):
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{key}: the {what} scale (scale_fwd) must be positive and finite (got {v})")
    wkey = f"{name}.weight"
    weight = state_dict[wkey] if wkey in state_dict else mod.weight
    want = (mod.out_features, mod.in_features)
    if not isinstance(weight, torch.Tensor) or not weight.dtype.is_floating_point or weight.dtype in _FP8:
        raise ValueError(f"{wkey}: must be a bf16/fp16/fp32 tensor, quantised here with the checkpoint's scale "
                         f"(got {getattr(weight, 'dtype', type(weight).__name__)})")
    if tuple(weight.shape) != want:
        raise ValueError(f"{wkey}: must have the module's shape (out_features, in_features) = {want} "
                         f"(got {tuple(weight.shape)})")
    source = state.source
    if state.scale_inv_fwd is not None and not torch.equal(state.scale_inv_fwd[:2],
                                                           torch.reciprocal(state.scale_fwd[:2])):
        source += "; its stored scale_inv is not 1/scale: TE's cast recomputes 1/scale, and so does cpemu"
    return SwapEntry(**size, action="swap", input_scale=state.input_scale, weight_scale=state.weight_scale,
                     source=source, schedule=te_schedule(profile, mod.out_features, mod.in_features)), state


def swap_fp8_projections(model, state_dict, *, profile=DEFAULT_PROFILE, backend="auto", dry_run: bool = False,
                         max_rows: int | None = None) -> list:
    """Swap every FP8 projection of a vortex model for a :class:`TEProjection`; returns the
    list of :class:`SwapEntry` (one per vortex ``TELinear``, in module order).

    ``model``: a vortex ``StripedHyena`` built without FP8 (``use_fp8_input_projections``
    false: vortex refuses FP8 without Transformer Engine; see :func:`cpemu.evo2.build_model`).
    ``state_dict``: the checkpoint's own state dict, ``_extra_state`` keys included (in TE
    1.x or 2.x form). A ``TELinear`` whose key is absent or holds no FP8 scales is kept.
    The weight is the checkpoint's ``<name>.weight`` where present, else the module's.
    ``dry_run``: change nothing, only return the list (``print(*entries, sep="\\n")`` shows it).
    ``max_rows``: cap the rows of one GEMM call (see :class:`~cpemu.torch.FP8Linear`)."""
    backends.check(backend, get_profile(profile))  # before any swap, also for a dry run
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: must be a torch.nn.Module, a vortex StripedHyena (got {type(model).__name__})")
    if not hasattr(state_dict, "keys"):
        raise ValueError(f"state_dict: must be a mapping of the checkpoint's keys (got {type(state_dict).__name__})")
    found = fp8_projections(model)
    entries, states = [], {}
    for name, mod in found:
        entry, state = _entry(name, mod, state_dict, profile)
        entries.append(entry)
        states[name] = state
    if dry_run:
        return entries
    modules = dict(model.named_modules())
    for entry, (name, mod) in zip(entries, found):
        if entry.action != "swap":
            continue
        weight = state_dict.get(f"{name}.weight", mod.weight)
        weight = weight.to(device=mod.weight.device)
        new = TEProjection.from_te(weight, states[name], name=name, profile=profile, backend=backend,
                                   max_rows=max_rows)
        parent, _, attr = name.rpartition(".")
        setattr(modules[parent] if parent else model, attr, new)
    return entries
