"""``cpemu.evo2``: Evo 2's FP8 projections with a named GPU's bits, without Transformer Engine.

::

    import torch, cpemu.evo2

    model = cpemu.evo2.build_model(config)            # vortex StripedHyena, FP8 off, on this machine
    ckpt = cpemu.evo2.load_checkpoint(path)           # TE's extra states too, without running code
    model.load_state_dict({k: v for k, v in ckpt.items() if not k.endswith("._extra_state")}, strict=False)
    for entry in cpemu.evo2.swap_fp8_projections(model, ckpt, profile="hopper-h200-torch"):
        print(entry)                                  # "swap blocks.0.projections: 1920 -> 5760, ..."
    logits, _ = model(tokens)                         # projections with the H200's FP8 bits

``swap_fp8_projections(..., dry_run=True)`` lists what it would swap and changes nothing.
By job: ``vortex_cpu`` (importing and building vortex where it expects CUDA, saying what it
works around), ``config`` (a config's fields and sizes, checked before vortex builds it),
``swap`` (the swap and :class:`TEProjection`); the TE scales are read by
:mod:`cpemu.torch.te_state`. Needs torch; vortex (PyPI ``vtx``) only for ``build_model``.
"""

from __future__ import annotations

from ..torch.te_state import load_checkpoint
from .swap import SwapEntry, TEProjection, fp8_projections, is_vortex_telinear, swap_fp8_projections
from .vortex_cpu import (build_model, cpu_device_calls, import_vortex, tiny_config, tiny_model,
                         vortex_import_shims)

__all__ = ["swap_fp8_projections", "SwapEntry", "TEProjection", "fp8_projections", "is_vortex_telinear",
           "build_model", "import_vortex", "cpu_device_calls", "vortex_import_shims", "load_checkpoint",
           "tiny_config", "tiny_model"]
