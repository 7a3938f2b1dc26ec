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
  number of splits, :mod:`cpemu.splitk`);
* the end of K the kernel leaves out (:func:`covered_k`): with many slices, the H200's kernels
  cut K down to a multiple of 32 when that leaves a whole number of K tiles per slice, and the
  last 16 elements then take no part in the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from .splitk import SplitKRule, UnsupportedShape, covered_k  # re-exported: the rules live in cpemu.splitk

__all__ = ["Plan", "covered_k", "kernel_slices", "slices_for", "SplitKRule", "UnsupportedShape"]


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


def kernel_slices(K: int, splits: int, rule: SplitKRule) -> tuple:
    """The slices of K that the kernel sums for ``splits`` slices under a profile's split-K
    ``rule``: :func:`slices_for` of what :func:`covered_k` covers."""
    return slices_for(covered_k(K, splits, rule.granularity, rule.tail), splits, rule.granularity)
