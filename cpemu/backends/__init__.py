"""The backend ladder: which implementation computes a call.

Every backend implements one interface (:class:`Backend`): ``available()`` says whether it
can run on this machine, ``supports(call)`` whether it reproduces a
:class:`~cpemu.call.Call`, ``run(call, operands)`` computes it. Each is a small module of
this package, registered in ladder order, fastest first:

* ``cublaslt-tc`` (:mod:`cpemu.backends.tensor_core`): the device's own FP8 tensor cores
  through cuBLASLt with the profile's schedule; Hopper only, device-dependent by nature, so
  used only where validated;
* ``cuda-rzacc``, ``cuda-tiled`` and ``cuda-simple`` (:mod:`cpemu.backends.cuda_kernels`):
  the exact CUDA kernels (integer arithmetic and IEEE-exact FP32 operations only;
  ``cuda-rzacc`` for the Ada and Hopper models);
* ``cpu-fp32`` (:mod:`cpemu.backends.cpu_fp32`): numpy, the specification's schedule with each
  step summed as exact floating-point integers (faster than the integer arithmetic);
* ``reference`` (:mod:`cpemu.backends.reference`): numpy, the specification.

All compute identical bits. ``backend="auto"`` (:func:`select`) takes the first backend that
is available, validated on this device for the profile and supports the call: validation
(:func:`validate`) runs once per (device, backend, profile) and compares a small set of hard
cases bit for bit with the reference. ``backend="<name>"`` forces one: it raises
:class:`BackendUnavailable` when it cannot run here and :class:`CallUnsupported` when it does
not reproduce the call. Fallback never depends on exceptions or message texts.
"""

from __future__ import annotations

import importlib
import threading
from typing import Protocol

import numpy as np

__all__ = ["Backend", "ProbedBackend", "LADDER", "TENSOR_CORE", "EXACT_KERNELS", "BackendUnavailable", "CallUnsupported", "get",
           "available", "validate", "select", "check", "status", "run", "on_host"]

#: The ladder, fastest first: backend name -> the module that defines it (as ``BACKEND``).
_MODULES = {
    "cublaslt-tc": "cpemu.backends.tensor_core",
    "cuda-rzacc": "cpemu.backends.cuda_kernels",
    "cuda-tiled": "cpemu.backends.cuda_kernels",
    "cuda-simple": "cpemu.backends.cuda_kernels",
    "cpu-fp32": "cpemu.backends.cpu_fp32",
    "reference": "cpemu.backends.reference",
}
LADDER = tuple(_MODULES)
TENSOR_CORE = "cublaslt-tc"
EXACT_KERNELS = ("cuda-rzacc", "cuda-tiled", "cuda-simple")


class BackendUnavailable(ValueError):
    """A backend asked for by name cannot run here (the message says why)."""


class CallUnsupported(BackendUnavailable):
    """A backend asked for by name runs here but does not reproduce this call (the message says why)."""


class Backend(Protocol):
    """One implementation of the GEMM (see the module docstring)."""

    name: str
    on_device: bool  # True: run() takes cupy operands on the current CUDA device; False: numpy

    def available(self) -> str | None:
        """None when it can run on this machine, else why not (never raises)."""

    def detail(self) -> str:
        """What it runs on, when available (for ``cpemu info``)."""

    def supports(self, call) -> str | None:
        """None when it reproduces ``call``, else why not (never raises for a valid Call)."""

    def run(self, call, operands, progress=None):
        """The output of ``call`` on ``operands`` (:class:`~cpemu.call.Operands`): numpy, or for a
        device backend a cupy array (float32, or uint16 bits for bfloat16 / float16).
        ``progress``: None or a :class:`cpemu.progress.Progress` told of the products computed
        (a host backend reports; a device backend may ignore it)."""


class ProbedBackend:
    """``available()`` and ``detail()`` of a backend from one probe, ``_status() -> (ok, detail)``."""

    def _status(self) -> tuple[bool, str]:
        raise NotImplementedError

    def available(self) -> str | None:
        ok, why = self._status()
        return None if ok else why

    def detail(self) -> str:
        return self._status()[1]


_lock = threading.Lock()
_available: dict = {}  # name -> (ok, detail), per process
_validated: dict = {}  # (device, name, profile name) -> (ok, detail)
_backends: dict = {}  # name -> Backend


def get(name: str) -> Backend:
    """The registered backend ``name``."""
    b = _backends.get(name)
    if b is None:
        if name not in _MODULES:
            raise BackendUnavailable(f"backend: must be 'auto' or one of {LADDER} (got {name!r})")
        b = _backends[name] = importlib.import_module(_MODULES[name]).BACKENDS[name]
    return b


def on_host(name: str) -> bool:
    """Whether ``name`` is a backend of the ladder that computes on the CPU (numpy operands)."""
    return name in _MODULES and not get(name).on_device


def available(name: str) -> tuple[bool, str]:
    """(available, reason) of a backend on this machine, without running it (cached per process)."""
    with _lock:
        if name in _available:
            return _available[name]
    if name not in _MODULES:
        result = (False, f"unknown backend {name!r}; known: {LADDER}")
    else:
        try:
            b = get(name)
        except Exception as e:  # noqa: BLE001 - a packaging problem is reported as unavailability
            result = (False, f"backend module unavailable: {type(e).__name__}: {e}")
        else:
            why = b.available()
            result = (True, b.detail()) if why is None else (False, why)
    with _lock:
        _available[name] = result
    return result


def _device_id():
    import cupy

    return int(cupy.cuda.runtime.getDevice())


def validate(name: str, profile) -> tuple[bool, str]:
    """Compare ``name`` with the reference on the hard cases (cached per device and profile);
    see :mod:`cpemu.backends.validation`."""
    if name == "reference":
        return True, "the specification"
    key = (_device_id() if get(name).on_device else "host", name, profile.name)
    with _lock:
        if key in _validated:
            return _validated[key]
    from .validation import validate_backend

    result = validate_backend(get(name), profile)
    with _lock:
        _validated[key] = result
    return result


def status(profile) -> list[dict]:
    """Every backend with availability and validation for ``profile`` on this machine."""
    rows = []
    for name in LADDER:
        ok, why = available(name)
        row = {"backend": name, "available": ok, "reason": why, "validated": None}
        if ok:
            row["validated"], row["validation"] = validate(name, profile)
        rows.append(row)
    return rows


def select(backend: str, profile, call=None) -> str:
    """The name of the backend that computes a call of ``profile``.

    ``"auto"`` walks the ladder and takes the first backend that is available, validated for
    ``profile`` on this device and, when ``call`` is given, supports it. A name is checked:
    :class:`BackendUnavailable` when it cannot run here, :class:`CallUnsupported` when it
    does not reproduce ``call``."""
    if isinstance(backend, str) and backend == "auto":
        for name in LADDER:
            if name == "reference":
                return name
            if not available(name)[0] or not validate(name, profile)[0]:
                continue
            if call is None or get(name).supports(call) is None:
                return name
        return "reference"
    if not isinstance(backend, str) or backend not in LADDER:
        raise BackendUnavailable(f"backend: must be 'auto' or one of {LADDER} (got {backend!r})")
    ok, why = available(backend)
    if not ok:
        raise BackendUnavailable(f"backend: {backend!r} cannot run here: {why}")
    if call is not None:
        why = get(backend).supports(call)
        if why is not None:
            raise CallUnsupported(f"backend: {backend!r} does not reproduce this call: {why}")
    return backend


def check(backend, profile) -> None:
    """Raise, before any call, what :func:`select` raises at the first one for ``backend``: a name
    that is neither ``"auto"`` nor a backend's, or a backend asked for by name that cannot run here
    (whether it reproduces a call is known only at that call; ``"auto"`` is walked there too)."""
    if not (isinstance(backend, str) and backend == "auto"):
        select(backend, profile)


def run(name: str, call, operands, on_device: bool, progress=None):
    """``get(name).run(call, operands, progress)`` with the operands moved to where the backend runs:
    host operands go to the current CUDA device for a device backend, device operands to the
    host for a host backend. The result comes back where the operands were: numpy of
    ``call.out_dtype``, or cupy (float32, or uint16 bits for bfloat16 / float16)."""
    from ..call import Operands
    from ..formats import OUT_DTYPES

    b = get(name)
    if b.on_device == on_device:
        y = b.run(call, operands, progress=progress)
        return y if on_device else np.asarray(y).view(OUT_DTYPES[call.out_dtype])
    import cupy

    if b.on_device:  # numpy operands on a device backend
        a, bt = (cupy.asarray(np.ascontiguousarray(x)) for x in (operands.a, operands.bt))
        moved = Operands(a, bt, operands.scale_a, operands.scale_b, operands.bias)
        return cupy.asnumpy(b.run(call, moved, progress=progress)).view(OUT_DTYPES[call.out_dtype])
    host = Operands(np.ascontiguousarray(cupy.asnumpy(operands.a)), np.ascontiguousarray(cupy.asnumpy(operands.bt)),
                    _host(operands.scale_a),
                    _host(operands.scale_b), None if operands.bias is None else _host(operands.bias))
    y = b.run(call, host, progress=progress)
    return cupy.asarray(y.view(np.float32 if call.out_dtype == "float32" else np.uint16))


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)
