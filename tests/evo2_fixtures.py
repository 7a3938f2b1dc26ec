"""Test fixtures for the Evo 2 swap: TE-format extra states and a tiny vortex model.

``te_recipe()`` pickles as Transformer Engine's own ``DelayedScaling`` does: while it is
pickled, modules named ``transformer_engine.common.recipe`` (with a ``Format`` enum whose
values are ``_FormatHelper`` named tuples, and a ``DelayedScaling`` dataclass, as in TE's
``transformer_engine/common/recipe/__init__.py``) stand in sys.modules, so the pickle names
TE's classes exactly as a TE checkpoint does. Transformer Engine itself is never imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import pickle
import sys
import types
from typing import NamedTuple

import torch

from cpemu.evo2 import tiny_config  # noqa: F401 - re-exported for the tests
from cpemu.torch.te_state import write_extra_state


def _te_recipe_module():
    mod = types.ModuleType("transformer_engine.common.recipe")

    class _FormatHelper(NamedTuple):
        max_fwd: float
        max_bwd: float

    class Format(enum.Enum):
        E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
        E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
        HYBRID = _FormatHelper(max_fwd=E4M3.max_fwd, max_bwd=E5M2.max_bwd)

    @dataclasses.dataclass
    class DelayedScaling:
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 1024
        amax_compute_algo: str = "max"
        scaling_factor_compute_algo: object = None
        reduce_amax: bool = True
        fp8_dpa: bool = False
        fp8_mha: bool = False

    for obj in (_FormatHelper, Format, DelayedScaling):
        obj.__module__, obj.__qualname__ = mod.__name__, obj.__name__
        setattr(mod, obj.__name__, obj)
    return mod


@contextlib.contextmanager
def _te_modules():
    names = ("transformer_engine", "transformer_engine.common", "transformer_engine.common.recipe")
    saved = {n: sys.modules.get(n) for n in names}
    rec = _te_recipe_module()
    sys.modules.update({names[0]: types.ModuleType(names[0]), names[1]: types.ModuleType(names[1]), names[2]: rec})
    try:
        yield rec
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:  # pragma: no cover
                sys.modules[n] = m


def te2_extra_state(scale_fwd, amax_history) -> torch.Tensor:
    """A TE >= 2.0 extra state (uint8 pickle bytes) with Evo 2's recipe, as vortex sets it:
    DelayedScaling(Format.HYBRID, amax_history_len=16, amax_compute_algo="max")."""
    with _te_modules() as rec:
        recipe = rec.DelayedScaling(fp8_format=rec.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
        return write_extra_state(scale_fwd, amax_history, fmt="te2", recipe=recipe)


def te1_extra_state(scale_fwd, amax_history):
    """A TE 1.x extra state (io.BytesIO of torch.save, with scale_inv), as Evo 2's checkpoints hold."""
    return write_extra_state(scale_fwd, amax_history, fmt="te1")


def evil_pickle() -> torch.Tensor:
    """Pickle bytes that would run ``os.system`` when loaded by plain pickle."""
    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))
    return torch.frombuffer(bytearray(pickle.dumps({"scale_fwd": Evil()})), dtype=torch.uint8)


def tiny_checkpoint(model, fmt: str = "te2", seed: int = 0) -> dict:
    """The model's state dict plus a TE-format ``_extra_state`` for every projection, with scales
    from each projection's weight amax and a random input amax history (as delayed scaling
    leaves them after training)."""
    from cpemu.torch.linear import delayed_scaling_scale

    g = torch.Generator().manual_seed(seed)
    sd = dict(model.state_dict())
    for name, mod in model.named_modules():
        if type(mod).__name__ != "TELinear":
            continue
        w_amax = mod.weight.detach().abs().max().float()
        hist = torch.rand(16, 3, generator=g) * 4 + 0.5
        hist[:, 1] = w_amax
        amax = hist.max(dim=0).values
        scale = torch.stack([delayed_scaling_scale(a) for a in amax])
        make = te2_extra_state if fmt == "te2" else te1_extra_state
        sd[f"{name}._extra_state"] = make(scale, hist)
    return sd
