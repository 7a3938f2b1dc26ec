"""The backend ladder: which implementation computes a call.

Backends, fastest first: ``cublaslt-tc`` (the device's own FP8 tensor cores through cuBLASLt
with the profile's schedule, :mod:`cpemu.cuda.tensorcore`; Hopper only, device-dependent by
nature, so used only where validated), ``cuda-tiled`` (shared-memory tiled exact kernel),
``cuda-simple`` (one or two outputs per thread), ``reference`` (numpy, the specification). All compute
identical bits: the CUDA kernels use integer arithmetic and IEEE-exact FP32 operations only,
and the tensor-core path is validated against the reference on each device.

``backend="auto"`` takes the first backend that is available on this machine (cupy, a GPU,
a fatbin for its architecture with a valid sha256) and validated on this device for the
profile: validation runs once per (device, backend, profile) and compares a small set of
hard cases bitwise with the reference. ``backend="<name>"`` forces one and raises
:class:`BackendUnavailable` with the reason when it cannot run.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np

from .schedule import UnsupportedShape

__all__ = ["LADDER", "BackendUnavailable", "status", "select", "validate"]

LADDER = ("cublaslt-tc", "cuda-tiled", "cuda-simple", "reference")
TENSOR_CORE = "cublaslt-tc"
_CUDA_KERNELS = ("cuda-tiled", "cuda-simple")  # their modules: cpemu.cuda.kernels.MODULES

_lock = threading.Lock()
_validated: dict = {}


class BackendUnavailable(ValueError):
    """A backend asked for by name cannot run here (the message says why)."""


class CallUnsupported(BackendUnavailable):
    """A backend asked for by name runs here but does not reproduce this call (the message says why)."""


def _device_id():
    import cupy

    return int(cupy.cuda.runtime.getDevice())


_available: dict = {}


def available(name: str) -> tuple[bool, str]:
    """(available, reason) of a backend on this machine, without running it (cached per process)."""
    with _lock:
        if name in _available:
            return _available[name]
    result = _available_uncached(name)
    with _lock:
        _available[name] = result
    return result


def _available_uncached(name: str) -> tuple[bool, str]:
    if name == "reference":
        return True, "numpy on the CPU"
    if name == TENSOR_CORE:
        try:
            from .cuda import tensorcore
        except Exception as e:  # pragma: no cover - packaging problem
            return False, f"tensor-core module unavailable: {e}"
        return tensorcore.available()
    if name not in _CUDA_KERNELS:
        return False, f"unknown backend {name!r}; known: {LADDER}"
    try:
        from .cuda import loader
        from .cuda.kernels import MODULES, modules_status
    except Exception as e:  # pragma: no cover - packaging problem
        return False, f"CUDA loader unavailable: {e}"
    ok, reason = modules_status(loader.module_status, MODULES[name])
    return bool(ok), reason


def _hard_cases():
    """Small cases that exercise every path: long chains, cancellation, exponent spread,
    subnormal-heavy data, NaN, promotion, split slices, odd shapes."""
    from .cases import Case

    return [Case(17, 48, 80, data="spread", seed=1), Case(3, 16, 272, data="cancel", seed=2, fast_accum=False),
            Case(8, 32, 160, data="gauss-tiny", seed=3, out_dtype="float32"),
            Case(5, 16, 96, data="nan", seed=4, out_dtype="float16"),
            Case(4, 64, 512, data="loguniform", seed=5, out_dtype="float32", scale="tensor"),
            Case(9, 32, 64, data="gauss40", seed=6, scale="rowwise", bias=True)]


def _tensor_core_cases():
    """Extra cases for the tensor-core path, whose algorithm changes with the shape: a
    split-K shape of the H200 table (16 x 64 x 16384: 6 slices) and a mid-size GEMM."""
    from .cases import Case

    return [Case(16, 64, 16384, data="gauss40", seed=7, out_dtype="float32"),
            Case(16, 64, 16384, data="spread", seed=8, fast_accum=False),
            Case(128, 256, 1920, data="gauss40", seed=9),
            Case(40, 96, 4096, data="loguniform", seed=10, out_dtype="float16", bias=True, scale="tensor")]


def validate(name: str, profile) -> tuple[bool, str]:
    """Compare ``name`` with the reference on the hard cases (cached per device and profile).

    Cases the backend (or the profile) does not cover are skipped; a backend that runs none of
    them is not validated."""
    if name == "reference":
        return True, "the specification"
    key = (_device_id(), name, profile.name)
    with _lock:
        if key in _validated:
            return _validated[key]
    from . import api
    from .cases import operands
    from .formats import FP8_FORMATS

    cases = _hard_cases() + (_tensor_core_cases() if name == TENSOR_CORE else [])
    ran, declined = 0, []
    result = None
    for case in cases:
        try:
            a, bt, sa, sb, bias = operands(case)
            fa, fb = FP8_FORMATS[case.a_format], FP8_FORMATS[case.b_format]
            if bias is not None:
                bias = bias.view(np.float16 if case.out_dtype == "float16" else ml_dtypes.bfloat16)
            kw = dict(profile=profile, scale_a=sa if sa.size > 1 else sa.reshape(()),
                      scale_b=sb if sb.size > 1 else sb.reshape(()), bias=bias, out_dtype=case.out_dtype,
                      fast_accum=case.fast_accum)
            A, B = a.view(fa.np_dtype), bt.view(fb.np_dtype).T
            want = api.gemm(A, B, backend="reference", **kw)
            got = api.gemm(A, B, backend=name, **kw)
        except CallUnsupported:
            declined.append(case.id)
            continue
        except Exception as e:  # noqa: BLE001 - a failing backend is reported, not raised
            if "does not record" in str(e) or isinstance(e, UnsupportedShape):
                continue  # the profile lacks this feature or shape: nothing to validate
            result = (False, f"{type(e).__name__} on {case.id}: {e}")
            break
        ran += 1
        w = want.view(np.uint32 if want.dtype == np.float32 else np.uint16)
        g = np.asarray(got).view(w.dtype)
        if not np.array_equal(w, g):
            i = np.argwhere(w != g)[0]
            result = (False, f"bits differ from the reference on {case.id} at {tuple(i)}: "
                             f"0x{int(g[tuple(i)]):x} != 0x{int(w[tuple(i)]):x}")
            break
    if result is None:
        result = (True, f"validated on {ran} hard cases" + (f" ({len(declined)} outside this backend)"
                                                            if declined else "")) if ran else \
            (False, "no validation case is within this backend's reach for this profile")
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


def select(backend: str, profile, exclude: tuple = ()) -> str:
    """The backend that computes a call: ``auto`` walks the ladder (less ``exclude``); a name is checked."""
    if backend == "auto":
        for name in LADDER:
            if name in exclude:
                continue
            ok, _ = available(name)
            if ok and validate(name, profile)[0]:
                return name
        return "reference"
    if backend not in LADDER:
        raise BackendUnavailable(f"backend: must be 'auto' or one of {LADDER} (got {backend!r})")
    ok, why = available(backend)
    if not ok:
        raise BackendUnavailable(f"backend: {backend!r} cannot run here: {why}")
    return backend
