"""One GEMM call, described once: what every backend computes from.

A :class:`Call` holds everything that decides the output bits of one call signature:
the shape, the operand formats, the output dtype, the scaling mode, the bias dtype, the
schedule (:class:`~cpemu.schedule.Plan`), the instruction model
(:class:`~cpemu.instruction.InstructionModel`) and the :class:`Epilogue`. The profile
builds it (:meth:`cpemu.profile.Profile.call`), once per signature, and checks the call
against what it records while doing so. A Call is frozen: a backend reads it and never
checks it again.

:class:`Operands` carries the arrays of one call: FP8 codes, scales and bias, on the host
(numpy) or on a CUDA device (cupy), checked by the entry that received them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .formats import CANONICAL_NAN, FP8Format
from .instruction import InstructionModel
from .schedule import Plan

__all__ = ["Order", "Epilogue", "Call", "Operands"]


class Order(str, enum.Enum):
    """The order of the FP32 multiplications that apply the scales to the accumulator."""

    SCALES_FIRST = "acc*(sa*sb)"  # one FP32 product of the scales, then one multiply
    A_THEN_B = "(acc*sa)*sb"
    B_THEN_A = "(acc*sb)*sa"

    @classmethod
    def parse(cls, spelled, arg: str = "epilogue order") -> "Order":
        """The order a profile spells (``"acc*(sa*sb)"`` ...); a clear ValueError otherwise."""
        try:
            return cls(spelled)
        except ValueError:
            raise ValueError(f"{arg}: must be one of {[o.value for o in cls]} (got {spelled!r})") from None


@dataclass(frozen=True)
class Epilogue:
    """What follows the accumulation: the scales in ``order`` (FP32 round-to-nearest), the
    bias added after them with one FP32 round-to-nearest add, the output conversion (round
    to nearest even) writing NaN as ``nan_bits``."""

    order: Order
    nan_bits: int

    @classmethod
    def from_mode(cls, mode: dict, out_dtype: str) -> "Epilogue":
        """The epilogue of a profile's mode dict (``mode["epilogue"]["order"]``, optional
        ``mode["nan_bits"][out_dtype]``; the canonical NaN pattern when it is absent)."""
        try:
            spelled = mode["epilogue"]["order"]
        except (KeyError, TypeError):
            spelled = None
        order = Order.parse(spelled, "mode['epilogue']['order']")
        raw = (mode.get("nan_bits") or {}).get(out_dtype) if isinstance(mode, dict) else None
        return cls(order, CANONICAL_NAN[out_dtype] if raw is None else int(raw))

    def spec(self) -> dict:
        """The epilogue as :func:`cpemu.reference.epilogue` reads it."""
        return {"order": self.order.value}


@dataclass(frozen=True)
class Call:
    """One call signature with its schedule, instruction model and epilogue (see the module
    docstring). ``scaling`` is ``"tensorwise"`` or ``"rowwise"``; ``bias_dtype`` None,
    ``"bfloat16"`` or ``"float16"``; ``profile`` the name of the profile that built it."""

    M: int
    N: int
    K: int
    a_format: FP8Format
    b_format: FP8Format
    out_dtype: str
    scaling: str
    bias_dtype: str | None
    fast_accum: bool
    plan: Plan
    model: InstructionModel
    epilogue: Epilogue
    profile: str

    @property
    def rowwise(self) -> bool:
        return self.scaling == "rowwise"

    @property
    def has_bias(self) -> bool:
        return self.bias_dtype is not None


@dataclass(frozen=True)
class Operands:
    """The arrays of one call, all on the host (numpy) or all on one CUDA device (cupy):
    ``a`` (M, K) and ``bt`` (N, K) uint8 FP8 codes (``bt`` is B transposed, K contiguous);
    ``scale_a`` and ``scale_b`` float32, one element each (tensorwise) or (M, 1) and (1, N)
    (rowwise); ``bias`` None or (N,) float32 (a bf16/fp16 bias widened exactly)."""

    a: object
    bt: object
    scale_a: object
    scale_b: object
    bias: object = None
