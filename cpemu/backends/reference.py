"""``reference``: the numpy specification (:mod:`cpemu.reference`) as a backend."""

from __future__ import annotations

from .. import reference as ref

__all__ = ["BACKENDS"]


class Reference:
    """The reference's GEMM (:func:`cpemu.reference.gemm_codes`) with the arithmetic ``arith``:
    the specification's; a host backend with other arithmetic of the same bits subclasses it."""

    name = "reference"
    on_device = False
    arith = ref.SPEC

    def available(self) -> str | None:
        return None

    def detail(self) -> str:
        return "numpy on the CPU"

    def supports(self, call) -> str | None:
        return None

    def run(self, call, ops, progress=None):
        return ref.gemm_codes(ops.a, ops.bt, call.a_format, call.b_format, call.plan, call.model,
                              call.epilogue.spec(), ops.scale_a, ops.scale_b, ops.bias, call.out_dtype,
                              call.epilogue.nan_bits, progress=progress, arith=self.arith)


BACKENDS = {"reference": Reference()}
