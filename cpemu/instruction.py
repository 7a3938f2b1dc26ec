"""Instruction models: what one FP8 tensor-core step computes (the description only).

Every FP8 instruction model here is a truncated fused dot-product-add (T-FDPA)
of ``L`` products plus the accumulator ``c``, as published by MMA-Sim
(Xu et al., arXiv:2511.10909; PyPI ``mmasim`` 2.1.1, ``arithmetic/fdpa.py``:
``t_fdpa``, ``truncated_fused_sum``, ``ldexp_and_normalize``; parameters in
``nv_ptx/sim.py``) and independently by Khattak & Mikaitis (arXiv:2512.07004):

1. each operand is split into a significand in [1, 2) (subnormals keep the
   minimum exponent) and an exponent; a product keeps ``s_a*s_b`` in [1, 4) and
   exponent ``e_a+e_b`` (not renormalised); a zero product, and a zero ``c``,
   take the exponent ``e_zero``;
2. ``e_max`` is the largest exponent of the ``L + 1`` terms;
3. every term is truncated toward zero (sign-magnitude) to ``F`` fraction bits
   below ``2**e_max``; the truncated terms are summed exactly;
4. the sum is rounded to the result format (``rounding``): ``RZ-E8M13`` keeps 13
   fraction bits, ``RZ-FP32`` 23, both round toward zero with the subnormal
   floor at 2**-126; NaN gives 0x7FFFFFFF, -0 gives +0.

The arithmetic lives in :mod:`cpemu.reference`; this module only names the
parameters of each instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InstructionModel", "ADA_SM89", "HOPPER_SM90A", "BLACKWELL_SM120", "INSTRUCTIONS"]

#: Fraction bits kept by each result rounding (FP32 has 23).
RESULT_FRACTION_BITS = {"RZ-E8M13": 13, "RZ-FP32": 23}


@dataclass(frozen=True)
class InstructionModel:
    """Parameters of one T-FDPA step (see module docstring)."""

    name: str
    ptx: str  # the PTX instruction it models
    L: int  # products per step
    F: int  # fraction bits kept below 2**e_max
    rounding: str  # "RZ-E8M13" or "RZ-FP32"
    e_zero: int  # exponent given to zero products and a zero accumulator
    source: str  # where the parameters come from

    def __post_init__(self):
        if self.rounding not in RESULT_FRACTION_BITS:
            raise ValueError(f"rounding must be one of {sorted(RESULT_FRACTION_BITS)}, got {self.rounding!r}")
        if self.L <= 0 or self.F <= 0:
            raise ValueError("L and F must be positive")

    @property
    def result_fraction_bits(self) -> int:
        return RESULT_FRACTION_BITS[self.rounding]

    def to_json(self) -> dict:
        return {"name": self.name, "ptx": self.ptx, "L": self.L, "F": self.F,
                "rounding": self.rounding, "e_zero": self.e_zero, "source": self.source}

    @classmethod
    def from_json(cls, d: dict) -> "InstructionModel":
        return cls(d["name"], d["ptx"], int(d["L"]), int(d["F"]), d["rounding"], int(d["e_zero"]), d["source"])


ADA_SM89 = InstructionModel(
    name="ada-sm89-mma-fp8",
    ptx="mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32 (two 16-product steps per instruction)",
    L=16, F=13, rounding="RZ-E8M13", e_zero=-132,
    source="mmasim 2.1.1 nv_ptx/sim.py (Ada Lovelace: L_max 16 bytes, FP8 special case F=13, RZ-E8M13, "
           "e_zero -132); Khattak & Mikaitis arXiv:2512.07004 (L40S: 16-term fused)",
)

HOPPER_SM90A = InstructionModel(
    name="hopper-sm90a-wgmma-fp8",
    ptx="wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2}",
    L=32, F=13, rounding="RZ-E8M13", e_zero=-133,
    source="MMA-Sim arXiv:2511.10909 (Hopper FP8 wgmma: 32-term T-FDPA, F=13, RZ to E8M13, e_zero -133); "
           "confirmed bit for bit against torch._scaled_mm on an H200 (fast accumulation, unit scales)",
)

BLACKWELL_SM120 = InstructionModel(
    name="blackwell-sm120-mma-f8f6f4",
    ptx="mma.sync.aligned.kind::f8f6f4.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32",
    L=32, F=25, rounding="RZ-FP32", e_zero=-133,
    source="mmasim 2.1.1 nv_ptx/sim.py (RTX Blackwell: L_max 32 bytes, F=25, RZ-FP32, e_zero -133)",
)

INSTRUCTIONS = {m.name: m for m in (ADA_SM89, HOPPER_SM90A, BLACKWELL_SM120)}
