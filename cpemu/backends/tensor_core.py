"""``cublaslt-tc``: the device's own FP8 tensor cores through cuBLASLt, with the profile's
schedule (:mod:`cpemu.cuda.tensorcore`). Hopper only; its bits depend on the device and on
the cuBLASLt build, so the ladder uses it only where it is validated."""

from __future__ import annotations

from . import TENSOR_CORE, ProbedBackend

__all__ = ["BACKENDS"]


class TensorCore(ProbedBackend):
    name = TENSOR_CORE
    on_device = True

    def _status(self) -> tuple[bool, str]:
        try:
            from ..cuda import tensorcore
        except Exception as e:  # noqa: BLE001 - a packaging problem
            return False, f"tensor-core module unavailable: {e}"
        return tensorcore.available()

    def supports(self, call) -> str | None:
        """None when cuBLASLt reproduces ``call`` on the current device (its configured algorithm
        is then prepared and cached), else why not."""
        from ..cuda import tensorcore

        why = tensorcore.static_reason(call)
        if why is not None:
            return why
        import cupy

        return tensorcore.reason(call, int(cupy.cuda.runtime.getDevice()))

    def run(self, call, ops, progress=None):  # device work is short: no progress
        from ..cuda import tensorcore

        return tensorcore.run(call, ops)


BACKENDS = {TENSOR_CORE: TensorCore()}
