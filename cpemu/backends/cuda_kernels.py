"""``cuda-rzacc``, ``cuda-tiled`` and ``cuda-simple``: the exact CUDA kernels (:mod:`cpemu.cuda.kernels`) as backends.

Device-independent bits: integer arithmetic and IEEE-exact FP32 operations only. Available
where cupy finds a GPU and the fatbins of its architecture pass their pinned sha256
(:func:`cpemu.cuda.loader.module_status`)."""

from __future__ import annotations

from . import ProbedBackend

__all__ = ["BACKENDS"]


class CudaKernel(ProbedBackend):
    on_device = True

    def __init__(self, name: str):
        self.name = name

    def _status(self) -> tuple[bool, str]:
        try:
            from ..cuda import loader
            from ..cuda.kernels import MODULES, modules_status
        except Exception as e:  # noqa: BLE001 - a packaging problem
            return False, f"CUDA loader unavailable: {e}"
        ok, why = modules_status(loader.module_status, MODULES[self.name])
        return bool(ok), why

    def supports(self, call) -> str | None:
        from ..cuda.kernels import limits

        return limits(call, self.name)

    def run(self, call, ops, progress=None):  # device work is short: no progress
        from ..cuda.kernels import launch

        return launch(self.name, call, ops)


BACKENDS = {name: CudaKernel(name) for name in ("cuda-rzacc", "cuda-tiled", "cuda-simple")}
