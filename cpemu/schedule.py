"""GEMM schedules: everything beyond one instruction that decides the bits.

A profile's schedule turns a call (M, N, K, fast_accum) into a :class:`Plan`:

* the K order: ascending, one T-FDPA step per ``L`` elements;
* fast accumulation (``use_fast_accum=True``): one chain of steps per split-K slice,
  the accumulator fed back unrounded beyond the instruction's own rounding;
* without it: chains of ``promotion_interval`` steps, each from zero, added into an
  FP32 accumulator with round-to-nearest -- CUTLASS ``GmmaFP8Accumulation``
  (``cutlass/gemm/collective/fp8_accumulation.hpp``, ``mma_promotion_interval = 4``),
  confirmed on the H200 for cuBLASLt;
* split-K: ``splits`` contiguous slices of K, each ``ceil(ceil(K/g)/splits)*g``
  elements long except the last (``g``, the granularity, is the kernel's K tile),
  each accumulated from zero; the FP32 partials are added in slice order with
  round-to-nearest FP32 adds (see the profile's ``split_k`` for the source of the
  number of splits).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Plan", "slices_for", "SplitKRule", "UnsupportedShape"]


class UnsupportedShape(ValueError):
    """The profile cannot say which schedule its GPU library uses for this shape."""


@dataclass(frozen=True)
class Plan:
    slices: tuple  # ((k0, k1), ...) contiguous K ranges, ascending
    promotion: int | None  # steps per promoted chain; None = fast accumulation

    @property
    def splits(self) -> int:
        return len(self.slices)


def slices_for(K: int, splits: int, granularity: int) -> tuple:
    """Contiguous split-K slices: ``ceil(ceil(K/g)/splits)`` K tiles each, the last shorter.

    Empty trailing slices (when the rounding leaves nothing for them) are dropped: their
    partial is zero, and adding +0 changes no FP32 value (the sum of slices is never -0:
    every chain returns +0 for a zero sum).
    """
    tiles = -(-K // granularity)
    per = -(-tiles // max(1, splits)) * granularity
    return tuple((k, min(k + per, K)) for k in range(0, K, per))


@dataclass(frozen=True)
class SplitKRule:
    """Which split-K count the library picks, as recorded in a profile.

    ``kind``:
      * ``"none"``  -- never splits (profiles whose library schedule was not recorded:
        the emulator then models an unsplit CUTLASS-style kernel and says so);
      * ``"rule"``  -- the derived rule of the profile (see :meth:`splits`), valid for
        the recorded domain ``domain``; shapes outside it are refused.
    """

    kind: str
    granularity: int = 128
    domain: dict | None = None  # {"M": [lo, hi], "N": [lo, hi], "K": [lo, hi], "extra_NK": [[N, K], ...]}
    params: dict | None = None
    base_dir: str | None = None  # where params["table_file"] lies; None: the shipped profiles

    def splits(self, M: int, N: int, K: int, fast_accum: bool, combo: tuple = ("e4m3", "e4m3", "bfloat16")) -> int:
        """Number of split-K slices; ``combo`` is (a_format, b_format, out_dtype)."""
        dom = self.domain or {}
        extra = [tuple(x) for x in dom.get("extra_NK", ())]
        for ax, v in (("M", M), ("N", N), ("K", K)):
            lo, hi = dom.get(ax, (1, 1 << 62))
            if not lo <= v <= hi and not (ax in "NK" and (N, K) in extra):
                raise UnsupportedShape(
                    f"{ax}={v} is outside the range {lo}..{hi} for which this profile's split-K "
                    f"choice was recorded; the GPU library's schedule there is unknown")
        if self.kind == "none":
            return 1
        from .splitk import splits_from_rule

        return splits_from_rule(self.params or {}, M, N, K, fast_accum, combo, self.base_dir)
