"""``dispatch``: cpemu's kernels for ``aten::_scaled_mm`` in torch's dispatcher, for a block.

:class:`patch` replaces the Python attribute ``torch._scaled_mm``. :class:`dispatch` goes one
level down: it registers cpemu's kernels with ``torch.library`` for the ``CPU`` and ``CUDA``
dispatch keys of

* ``aten::_scaled_mm`` and ``aten::_scaled_mm.out`` (torch.compile's Inductor calls the
  ``out`` form from its generated code);
* ``aten::_scaled_mm_v2`` and ``aten::_scaled_mm_v2.out`` (``torch.nn.functional.scaled_mm``),
  for tensorwise and rowwise scales, where the torch version has them.

So every caller that reaches the dispatcher gets the profile's bits: ``torch._scaled_mm``
however it was looked up, ``torch.ops.aten._scaled_mm``, torchao's float8 layers in eager
mode and under ``torch.compile``, and graphs compiled before the block whose code calls the
op. On exit the registrations are removed and torch's own kernels run again.

Shapes and dtypes under tracing come from the op's fake (meta) kernel. torch ships one for
each op (``torch/_meta_registrations.py``); where a torch version lacks it, cpemu registers
its own for the ``Meta`` key (:func:`~cpemu.torch.scaled_mm` on meta tensors).
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from .. import backends
from ..profile import DEFAULT_PROFILE, ProfileFeatureError, get_profile
from .api import scaled_mm

__all__ = ["dispatch", "SCALED_MM_OPS"]

#: The ops :class:`dispatch` registers, where the torch version has them.
SCALED_MM_OPS = ("_scaled_mm", "_scaled_mm.out", "_scaled_mm_v2", "_scaled_mm_v2.out")

_TENSORWISE, _ROWWISE = 0, 1  # torch.nn.functional.ScalingType
_NO_SWIZZLE = 0  # torch.nn.functional.SwizzleType


def _has_op(qualified: str) -> bool:
    name, _, overload = qualified.partition(".")
    packet = getattr(torch.ops.aten, name, None)
    return packet is not None and (overload or "default") in packet.overloads()


def _v2_scales(scale, recipe, swizzle, which: str):
    """One tensorwise or rowwise scale tensor of ``_scaled_mm_v2``'s lists; others are refused."""
    if len(scale) != 1 or len(recipe) != 1 or recipe[0] not in (_TENSORWISE, _ROWWISE):
        raise ProfileFeatureError(f"scale_{which}: cpemu emulates one tensorwise or rowwise scale per operand "
                                  f"(got {len(scale)} scales with recipes {list(recipe)})")
    if any(s != _NO_SWIZZLE for s in swizzle):
        raise ProfileFeatureError(f"swizzle_{which}: cpemu emulates unswizzled scales only (got {list(swizzle)})")
    return scale[0], recipe[0]


def _check_v2_scale_shapes(a, b, sa, sb, recipe) -> None:
    """The scales' shapes must be the recipe's: the drop-in infers tensorwise or rowwise from the
    shapes, so a disagreement would compute another call than torch's (which raises there). A
    rowwise recipe whose scales have one element (M or N of 1) would run torch's rowwise epilogue:
    not emulated, refused."""
    if not all(isinstance(t, torch.Tensor) for t in (a, b, sa, sb)) or a.dim() != 2 or b.dim() != 2:
        return  # the drop-in's own checks name these
    M, N = a.shape[0], b.shape[1]
    for t, which, rows in ((sa, "a", (M, 1)), (sb, "b", (1, N))):
        if recipe == _TENSORWISE and t.numel() != 1:
            raise RuntimeError(f"scale_{which} must have 1 Float element for TensorWise scaling "
                               f"(got shape {tuple(t.shape)})")
        if recipe == _ROWWISE:
            if tuple(t.shape) != rows:
                raise RuntimeError(f"scale_{which} must have shape {rows} for RowWise scaling "
                                   f"(got shape {tuple(t.shape)})")
            if t.numel() == 1:
                raise ProfileFeatureError(f"scale_{which}: a RowWise recipe with one-element scales (M or N of 1) "
                                          f"runs torch's rowwise epilogue, which cpemu does not emulate there")


def _kernels(profile, backend) -> dict:
    def mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        return scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                         profile=profile, backend=backend)

    def mm_out(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False,
               *, out):
        return _into(out, mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum))

    def mm_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
              contraction_dim=(), use_fast_accum=False):
        if list(contraction_dim) not in ([], [1, 0]):
            raise ProfileFeatureError(f"contraction_dim: cpemu emulates K as a's dim 1 and b's dim 0 "
                                      f"(got {list(contraction_dim)})")
        sa, ra = _v2_scales(scale_a, recipe_a, swizzle_a, "a")
        sb, rb = _v2_scales(scale_b, recipe_b, swizzle_b, "b")
        if ra != rb:
            raise ProfileFeatureError(f"scale recipes: a's and b's must both be tensorwise or both rowwise "
                                      f"(got {ra} and {rb})")
        _check_v2_scale_shapes(self, mat2, sa, sb, ra)
        return mm(self, mat2, sa, sb, bias, None, out_dtype, use_fast_accum)

    def mm_v2_out(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
                  contraction_dim=(), use_fast_accum=False, *, out):
        return _into(out, mm_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias,
                                out_dtype, contraction_dim, use_fast_accum))

    return {"_scaled_mm": mm, "_scaled_mm.out": mm_out, "_scaled_mm_v2": mm_v2, "_scaled_mm_v2.out": mm_v2_out}


def _into(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dtype != y.dtype:
        raise RuntimeError(f"out: expected dtype {y.dtype} for the result (got {out.dtype})")
    if out.shape != y.shape:
        out.resize_(y.shape)
    return out.copy_(y)


class dispatch(contextlib.ContextDecorator):
    """Register cpemu's ``aten::_scaled_mm`` kernels (see the module docstring) for a block.

    ::

        with cpemu.torch.dispatch(profile="hopper-h200-torch"):
            y = torch.compile(model)(x)          # compiled FP8 GEMMs with the H200's bits

    ``keys``: the dispatch keys to take over (default ``("CPU", "CUDA")``). Blocks nest (the
    innermost profile applies; each exit restores what its entry replaced). The registration
    is process-wide: do not enter it from several threads at once.

    What it cannot reach: GEMMs that never call the op. These are Inductor's own Triton
    templates for ``_scaled_mm`` (``mode="max-autotune"`` on a GPU may pick them), CUDA graphs
    captured before the block (they replay recorded kernels; nor can a graph capture cpemu's
    CUDA route, which waits on the host for each call's scales), and libraries that call
    cuBLASLt from C++ (Transformer Engine: use :mod:`cpemu.evo2` or :class:`FP8Linear`).
    """

    def __init__(self, profile=DEFAULT_PROFILE, backend="auto", keys=("CPU", "CUDA")):
        backends.check(backend, get_profile(profile))  # an unknown profile or backend fails here, not inside the block
        if isinstance(keys, str) or not isinstance(keys, (tuple, list)):
            raise ValueError(f"keys: must be a tuple of dispatch keys among ('CPU', 'CUDA') (got {keys!r})")
        bad = [k for k in keys if k not in ("CPU", "CUDA")]
        if bad or not keys:
            raise ValueError(f"keys: must name dispatch keys among ('CPU', 'CUDA') (got {keys!r})")
        self.profile, self.backend, self.keys = profile, backend, tuple(keys)
        self.ops = tuple(op for op in SCALED_MM_OPS if _has_op(op))
        self._libs = []

    def __enter__(self):
        lib = torch.library.Library("aten", "IMPL")
        kernels = _kernels(self.profile, self.backend)
        try:
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": intended
                warnings.simplefilter("ignore")
                for op in self.ops:
                    for key in self.keys:
                        lib.impl(op, kernels[op], key)
                    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "Meta"):
                        lib.impl(op, kernels[op], "Meta")  # pragma: no cover - torch ships meta kernels
        except Exception:
            lib._destroy()
            raise
        self._libs.append(lib)
        return self

    def __exit__(self, *exc):
        if not self._libs:
            raise RuntimeError("dispatch: __exit__ without a matching __enter__ (use it as "
                               "`with cpemu.torch.dispatch():`)")
        self._libs.pop()._destroy()
        return False
