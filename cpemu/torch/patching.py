"""``patch``: ``torch._scaled_mm`` replaced by :func:`~cpemu.torch.scaled_mm` for a block or a function."""

from __future__ import annotations

import contextlib

import torch

from .. import backends
from ..profile import DEFAULT_PROFILE, get_profile
from .api import scaled_mm


def _replacement(profile, backend):
    def _scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                   use_fast_accum=False):
        return scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                         profile=profile, backend=backend)

    _scaled_mm.__doc__ = (f"torch._scaled_mm emulated by cpemu with profile {getattr(profile, 'name', profile)!r} "
                          f"(installed by cpemu.torch.patch)")
    _scaled_mm.cpemu_profile = getattr(profile, "name", profile)
    return _scaled_mm


class patch(contextlib.ContextDecorator):
    """Replace ``torch._scaled_mm`` by :func:`scaled_mm` with ``profile``, for a block or a function.

    ::

        with cpemu.torch.patch():                 # H200 numerics, on any machine
            y = model(x)                          # every torch._scaled_mm call is emulated

        @cpemu.torch.patch(profile="hopper-h200-torch")
        def evaluate(model, batch): ...

    The previous ``torch._scaled_mm`` is restored on exit, also when the block raises;
    blocks nest (the innermost profile applies; each exit restores what its entry
    replaced), and one ``patch`` object may be re-entered. The replacement is
    process-wide (it is a module attribute), so do not patch from several threads at
    once. Code that looked the function up before the block (``from torch import
    _scaled_mm``), ``torch.ops.aten._scaled_mm`` and compiled graphs are not affected:
    :class:`~cpemu.torch.dispatch` reaches those.
    """

    def __init__(self, profile=DEFAULT_PROFILE, backend="auto"):
        backends.check(backend, get_profile(profile))  # an unknown profile or backend fails here, not inside the block
        self.profile = profile
        self.backend = backend
        self._saved = []

    def __enter__(self):
        self._saved.append(torch._scaled_mm)
        torch._scaled_mm = _replacement(self.profile, self.backend)
        return self

    def __exit__(self, *exc):
        if not self._saved:
            raise RuntimeError("patch: __exit__ without a matching __enter__ (use it as `with cpemu.torch.patch():`)")
        torch._scaled_mm = self._saved.pop()
        return False
