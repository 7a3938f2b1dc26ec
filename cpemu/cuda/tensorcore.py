"""``cublaslt-tc``: the device's own FP8 tensor cores, driven with the profile's schedule.

On a Hopper GPU (compute capability 9.0) the FP8 ``wgmma`` instruction *is* the
``hopper-sm90a-wgmma-fp8`` instruction model, so a GEMM on it gives a profile's bits when
everything around the instruction follows the profile: the K order, the promotion, the
split-K slices, the reduction and the epilogue. This backend runs cuBLASLt through its C
API (``ctypes``) with an explicitly configured algorithm:

* the descriptors torch 2.11 builds for ``torch._scaled_mm`` (``at::cuda::blas::scaled_gemm``;
  :func:`cpemu.cuda.cublaslt.build_descs`): cuBLASLt A = ``bt``, B = ``a``,
  TN layout, FP32 compute, fast accumulation as asked, scales through the A/B scale
  pointers (scalars, or outer vectors for rowwise), bias through the BIAS epilogue;
* the algorithm: cuBLASLt's heuristic proposes an algorithm id, tile, stages, cluster and
  swizzle for the shape (performance only); cpemu then sets the split-K count to the
  profile's plan (``CUBLASLT_ALGO_CONFIG_SPLITK_NUM``) and the reduction scheme to
  ``COMPUTE_TYPE`` (FP32 partials added in slice order, the only scheme the H200 recordings
  show) or ``NONE`` for one slice, and checks the result with ``cublasLtMatmulAlgoCheck``.

Profiles:

* ``hopper-sm90a-wgmma-fp8`` models (``hopper-h200-torch``): any plan whose slices are
  cuBLASLt's (``ceil(ceil(K/128)/s)`` K tiles of 128) and whose promotion is none (fast
  accumulation) or 4 steps (cuBLASLt's promotion without fast accumulation);
* ``ada-sm89-mma-fp8`` models (``ada-rtx4060-torch``): ``a`` and ``bt`` are zero-padded so
  that every 32-element K block holds 16 real products and 16 zero products
  (``cuda_src/pad_k16.cu``); a Hopper step on it computes one Ada 16-product step exactly
  (checked on an H200; FACTS of the profile). Unsplit fast-accumulation plans only: the
  Ada profile's promotion every 8 Ada steps would need cuBLASLt to promote every 8 Hopper
  steps, which it does not.

The bits depend on the device and on the cuBLASLt build, unlike the exact CUDA-core
kernels: :mod:`cpemu.backends` only uses this backend where its validation cases match the
reference on the device, and :func:`supports` declines every call outside the list above
(the ladder then takes the next backend).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..backends import TENSOR_CORE
from ..call import Order
from ..schedule import Plan, slices_for

__all__ = ["TensorCoreUnsupported", "available", "supports", "static_reason", "reason", "run", "signature",
           "launch", "describe"]

NAME = TENSOR_CORE
HOPPER_MODEL = "hopper-sm90a-wgmma-fp8"
ADA_MODEL = "ada-sm89-mma-fp8"
#: K tile of cuBLASLt's Hopper FP8 kernels: split-K slices are whole multiples of it.
K_TILE = 128
#: cuBLASLt's promotion interval without fast accumulation, in 32-element steps (H200 recordings).
LT_PROMOTION_STEPS = 4
REDUCTION_NONE, REDUCTION_COMPUTE_TYPE = 0, 2
ALGO_ID, ALGO_SPLITK, ALGO_REDUCTION = 0, 2, 3
#: config fields copied from the heuristic's proposal (performance only): (attr, ctype)
COPIED_FIELDS = ((1, ctypes.c_uint32), (4, ctypes.c_uint32), (5, ctypes.c_uint32), (6, ctypes.c_uint32),
                 (7, ctypes.c_uint16), (8, ctypes.c_uint16))


class TensorCoreUnsupported(ValueError):
    """This call is outside what the tensor-core path reproduces (the message says why)."""


_lock = threading.RLock()
_state: dict = {}  # "lt": the CublasLt binding, "handles": {device: handle}, "plans": {key: _Prepared}


_cupy_module = None


def _cupy():
    global _cupy_module
    if _cupy_module is None:
        import cupy

        _cupy_module = cupy
    return _cupy_module


def _lt():
    """The libcublasLt binding (the instance torch loaded when torch is in the process)."""
    with _lock:
        if "lt" in _state:
            if isinstance(_state["lt"], Exception):
                raise _state["lt"]
            return _state["lt"]
        try:
            from . import cublaslt

            lt = cublaslt.load()
            lt.h = cublaslt  # the binding's module, read through lt.h below
        except Exception as e:  # noqa: BLE001 - reported as unavailability
            err = OSError(f"libcublasLt unusable: {type(e).__name__}: {e}")
            _state["lt"] = err
            raise err from None
        _state["lt"] = lt
        return lt


def _handle(lt, device: int):
    with _lock:
        handles = _state.setdefault("handles", {})
        if device not in handles:
            cupy = _cupy()
            with cupy.cuda.Device(device):
                hd = ctypes.c_void_p()
                st = lt.create(ctypes.byref(hd))
                if st != 0:
                    raise OSError(f"cublasLtCreate -> {st}")
            handles[device] = hd
        return handles[device]


def available() -> tuple[bool, str]:
    """(True, detail) when cupy, a compute-capability 9.0 GPU and libcublasLt are present."""
    try:
        cupy = _cupy()
    except ImportError as e:
        return False, f"cupy is not available ({e}); pip install 'cpemu[cuda12]' or 'cpemu[cuda13]'"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, "no CUDA GPU"
        cc = cupy.cuda.Device().compute_capability
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"
    if cc != "90":
        return False, f"needs a Hopper GPU (compute capability 9.0) for FP8 wgmma; this one is {cc[:-1]}.{cc[-1]}"
    try:
        lt = _lt()
    except OSError as e:
        return False, str(e)
    return True, f"cuBLASLt {lt.version()} ({lt.path}) on sm_90"


def supports(model_name: str, plan: Plan, K: int, scaling: str, fast_accum: bool) -> tuple[bool, str]:
    """Whether the tensor-core path reproduces this profile plan (see the module docstring)."""
    s = plan.splits
    if model_name == HOPPER_MODEL:
        if tuple(plan.slices) != slices_for(K, s, K_TILE):
            return False, f"the plan's split-K slices {plan.slices} are not cuBLASLt's {K_TILE}-element K tiles"
        if plan.promotion not in (None, LT_PROMOTION_STEPS):
            return False, f"promotion every {plan.promotion} steps (cuBLASLt promotes every {LT_PROMOTION_STEPS})"
        if (plan.promotion is None) != bool(fast_accum):
            return False, "the plan's promotion does not match fast_accum"
        return True, "Hopper FP8 wgmma with the profile's split-K and promotion"
    if model_name == ADA_MODEL:
        if s != 1:
            return False, "the Ada path runs unsplit plans only"
        if plan.promotion is not None:
            return False, ("the Ada profile promotes every 8 Ada steps without fast accumulation; cuBLASLt "
                           "promotes every 4 Hopper steps, which is 4 Ada steps on the padded operands")
        if scaling != "tensorwise":
            return False, "the Ada path runs tensorwise scales only"
        return True, "Hopper FP8 wgmma on zero-padded operands (16 real + 16 zero products per step)"
    return False, f"no tensor-core path reproduces the instruction model {model_name!r} on sm_90"


class _Prepared:
    """Descriptors and the configured algorithm of one call signature (kept for reuse)."""

    def __init__(self, lt, handle, case, splits: int):
        h = lt.h
        self.lt, self.case, self.splits = lt, case, splits
        ptrs = {"scale_a": 256, "scale_b": 512, "bias": 768}  # placeholders; set per call
        self.made = h.build_descs(lt, case, ptrs, 1 << 30)
        try:
            self.algo, self.config, self.workspace = self._configure(lt, handle, case, splits)
        except Exception:
            self.close()
            raise

    def _configure(self, lt, handle, case, splits):
        h, m = lt.h, self.made
        results = (h.HeuristicResult * 1)()
        count = ctypes.c_int(0)
        st = lt.get_heuristic(handle, m["desc"], m["A"], m["B"], m["C"], m["D"], m["pref"], 1, results,
                              ctypes.byref(count))
        if st != 0 or count.value < 1:
            raise TensorCoreUnsupported(f"cuBLASLt has no algorithm for this call (heuristic status {st}, "
                                        f"{count.value} results)")
        proposal = lt.read_algo(results[0].algo)
        algo = h.MatmulAlgo()
        ab = h.DTYPES
        out_t = ab[case.out_dtype][1]
        lt._check("cublasLtMatmulAlgoInit",
                  lt.algo_init(handle, h.CUBLAS_COMPUTE_32F, h.CUDA_R_32F, ab[case.b_dtype][1], ab[case.a_dtype][1],
                               out_t, out_t, int(proposal["algo_id"]), ctypes.byref(algo)))

        def put(attr, value):
            lt._check(f"AlgoConfigSetAttribute {attr}",
                      lt.algo_config_set(ctypes.byref(algo), attr, ctypes.byref(value), ctypes.sizeof(value)))

        names = dict((f[1], f[0]) for f in h.ALGO_CONFIG_FIELDS)
        for attr, ctype in COPIED_FIELDS:
            v = proposal.get(names[attr])
            if v is not None:
                put(attr, ctype(v))
        put(ALGO_SPLITK, ctypes.c_int32(splits))
        put(ALGO_REDUCTION, ctypes.c_uint32(REDUCTION_COMPUTE_TYPE if splits > 1 else REDUCTION_NONE))
        res = h.HeuristicResult()
        st = lt.algo_check(handle, m["desc"], m["A"], m["B"], m["C"], m["D"], ctypes.byref(algo), ctypes.byref(res))
        if st != 0:
            raise TensorCoreUnsupported(f"cuBLASLt refuses the configured algorithm (algo {proposal['algo_id']}, "
                                        f"split-K {splits}): cublasLtMatmulAlgoCheck -> {st}")
        config = lt.read_algo(algo)
        if config.get("splitk_num") not in (None, splits):
            raise TensorCoreUnsupported(f"cuBLASLt kept split-K {config.get('splitk_num')}, not {splits}")
        config["heuristic_proposal"] = proposal
        self.algo_ref = ctypes.byref(algo)
        return algo, config, int(res.workspaceSize)

    def close(self):
        made, self.made = self.made, None
        if made is not None:
            self.lt.h.destroy_descs(self.lt, made)

    def __del__(self):  # descriptors are host objects: destroyed once no signature or call holds them
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _prepared(lt, device, handle, case, splits) -> _Prepared:
    key = (device, case, splits)
    with _lock:
        plans = _state.setdefault("plans", {})
        p = plans.get(key)
        if p is None:
            p = _Prepared(lt, handle, case, splits)
            if len(plans) > 256:  # bounded: forget the oldest (destroyed when no call holds it)
                plans.pop(next(iter(plans)))
            plans[key] = p
        return p


def _pad_function(device: int):
    with _lock:
        fns = _state.setdefault("pad", {})
        if device not in fns:
            from .loader import get_function

            fns[device] = get_function("pad_k16", "cpemu_pad_k16_to_k32", device)
        return fns[device]


def _pad_k16(x):
    """(rows, K) uint8 codes -> (rows, 2K): each 16 codes followed by 16 zero codes."""
    cupy = _cupy()
    rows, K = x.shape
    out = cupy.empty((rows, 2 * K), dtype=cupy.uint8)
    if x.flags.c_contiguous and x.data.ptr % 16 == 0:
        pad_k16_pointers(x.device.id, x.data.ptr, out.data.ptr, rows, K)
    elif x.size:
        v = out.reshape(rows, K // 16, 32)
        v[:, :, 16:] = 0
        v[:, :, :16] = x.reshape(rows, K // 16, 16)
    return out


def pad_k16_pointers(device: int, src_ptr: int, dst_ptr: int, rows: int, K: int) -> None:
    """The Ada layout (``cuda_src/pad_k16.cu``) on raw pointers, on cupy's current stream:
    ``src`` (rows, K) C-contiguous codes at a 16-byte aligned address (K a multiple of 16)
    into ``dst`` (rows, 2K)."""
    chunks = rows * K // 16
    if chunks:
        threads = 256
        blocks = min((chunks + threads - 1) // threads, 65535 * 8)
        _pad_function(device)((blocks, 1, 1), (threads, 1, 1), (np.uint64(src_ptr), np.uint64(dst_ptr),
                                                                np.int64(chunks)))


def _scale(x, name: str, cupy, device: int, size: int, what: str):
    """A float32 scale (numpy or cupy) as a contiguous device array of ``size`` elements
    (only its pointer is passed on).

    Tensorwise host scalars are uploaded once per value and device (a small cache), so a
    repeated call does no host-to-device copy."""
    if size == 1 and type(x) is np.float32:  # the common tensorwise call: a cached device copy
        dev = _state.get("scalars", {}).get((device, x.tobytes()))
        if dev is not None:
            return dev
    if isinstance(x, cupy.ndarray):
        if x.dtype != np.float32 or x.size != size:
            raise ValueError(f"{name}: must be float32 with {what} (got {x.dtype}, shape {x.shape})")
        if x.device.id != device:
            raise ValueError(f"{name}: must be on the device of the operands (device {device}; got {x.device.id})")
        return x if size == 1 or x.flags.c_contiguous else cupy.ascontiguousarray(x)
    arr = np.asarray(x)
    if arr.dtype != np.float32 or arr.size != size:
        raise ValueError(f"{name}: must be float32 with {what} (got {arr.dtype}, shape {arr.shape})")
    if size != 1:
        return cupy.asarray(np.ascontiguousarray(arr).reshape(size))
    key = (device, arr.tobytes())
    cache = _state.setdefault("scalars", {})
    dev = cache.get(key)
    if dev is None:
        if len(cache) > 1024:
            cache.clear()
        dev = cache[key] = cupy.asarray(arr.reshape(1))
    return dev


def _workspace_ptr(device: int, stream: int, nbytes: int) -> int:
    """The address of cuBLASLt's workspace for calls on ``stream``: one buffer per (device,
    stream), grown when needed and reused (calls on one stream run in order, as torch does
    per stream).

    The buffer comes from cupy's pool on cupy's current stream, which need not be ``stream``
    (the torch drop-in launches on torch's stream): a buffer is therefore dropped only after
    the work that may still use it is done (the stream, or the device when its buffers
    are cleared), never returned to the pool under a running GEMM."""
    key = (device, stream)
    ws = _state.setdefault("workspaces", {})  # (device, stream) -> (buffer, its size, its address)
    hit = ws.get(key)
    if hit is not None and hit[1] >= nbytes:
        return hit[2]
    cupy = _cupy()
    if hit is not None:
        cupy.cuda.runtime.streamSynchronize(stream)
    mine = [k for k in ws if k[0] == device]
    if len(mine) > 64:  # bounded: this device's buffers go, once its work is done
        cupy.cuda.runtime.deviceSynchronize()
        for k in mine:
            del ws[k]
    buf = cupy.empty(nbytes, dtype=cupy.uint8)
    ws[key] = (buf, nbytes, buf.data.ptr)
    return buf.data.ptr


def _size(x) -> int:
    return x.size if hasattr(x, "size") else int(np.size(x))


class _Signature:
    """Everything about a call signature that is decided once: checks, descriptors, algorithm
    (and, for :func:`launch`, the cuBLASLt handle and the descriptors in call order)."""

    __slots__ = ("prep", "ada", "last", "handle", "descs")

    def __init__(self, prep, ada, handle):
        self.prep, self.ada, self.last, self.handle = prep, ada, None, handle
        m = prep.made
        self.descs = (m["desc"], m["A"], m["B"], m["C"], m["D"])


def static_reason(call) -> str | None:
    """Why the tensor-core path does not reproduce ``call``, as far as it can be told without
    the device (:func:`supports`, the epilogue, the formats, the NaN pattern); None otherwise."""
    ok, why = supports(call.model.name, call.plan, call.K, call.scaling, call.fast_accum)
    if not ok:
        return why
    want = Order.SCALES_FIRST if call.scaling == "tensorwise" else Order.B_THEN_A
    if call.epilogue.order is not want:
        return f"cuBLASLt's {call.scaling} epilogue is {want.value}; the profile says {call.epilogue.order.value}"
    if call.a_format.name == "e5m2" and call.b_format.name == "e5m2":
        return "cuBLASLt has no e5m2 x e5m2 FP8 GEMM"
    if call.epilogue.nan_bits != {"float32": 0x7FFFFFFF}.get(call.out_dtype, 0x7FFF):
        return f"the profile's NaN pattern 0x{call.epilogue.nan_bits:x} is not cuBLASLt's"
    return None


def signature(device: int, call) -> _Signature:
    """The prepared signature of ``call`` (a :class:`~cpemu.call.Call`) on ``device``: checks,
    descriptors, configured algorithm; cached per (device, call), for :func:`launch`. Raises
    :class:`TensorCoreUnsupported` for calls this path does not reproduce. ``.ada``: the
    operands must be zero-padded first (Ada profile)."""
    key = (device, call)
    sigs = _state.setdefault("signatures", {})
    sig = sigs.get(key)
    if sig is not None:
        return sig
    why = static_reason(call)
    if why is not None:
        raise TensorCoreUnsupported(why)
    ada = call.model.name == ADA_MODEL
    lt = _lt()
    from .cublaslt import Case as LtCase

    case = LtCase(call.M, call.N, 2 * call.K if ada else call.K, call.a_format.name, call.b_format.name,
                  call.out_dtype, call.fast_accum, call.has_bias, call.scaling)
    handle = _handle(lt, device)
    prep = _prepared(lt, device, handle, case, call.plan.splits)
    sig = _Signature(prep, ada, handle)
    with _lock:
        if len(sigs) > 256:
            sigs.clear()
        sigs[key] = sig
    return sig


def reason(call, device: int) -> str | None:
    """None when the tensor-core path reproduces ``call`` on ``device`` (its signature is then
    prepared and cached), else why not."""
    try:
        signature(device, call)
    except TensorCoreUnsupported as e:
        return str(e)
    return None


def run(call, ops, device: int | None = None):
    """``call`` (a :class:`~cpemu.call.Call`) on the device's tensor cores: ``ops`` as for the
    exact kernels (cupy (M, K) and (N, K) codes on ``device``, default the operands' device;
    scales numpy or cupy float32, one element each or M and N of them; bias None or float32
    (N,)). Raises :class:`TensorCoreUnsupported` for a call this path does not reproduce.
    Returns a cupy (M, N) array: float32, or uint16 bits for bfloat16/fp16."""
    cupy = _cupy()
    if device is None:
        device = ops.a.data.device_id
    sig = signature(device, call)
    if cupy.cuda.runtime.getDevice() == device:
        return _gemm_tc_here(cupy, sig, device, call, ops)
    with cupy.cuda.Device(device):
        return _gemm_tc_here(cupy, sig, device, call, ops)


def _gemm_tc_here(cupy, sig, device, call, ops):
    """:func:`run` with ``device`` current."""
    M, N, out_dtype = call.M, call.N, call.out_dtype
    rowwise = call.rowwise
    sa = _scale(ops.scale_a, "scale_a", cupy, device, M if rowwise else 1,
                f"shape (M, 1) = ({M}, 1)" if rowwise else "one element")
    sb = _scale(ops.scale_b, "scale_b", cupy, device, N if rowwise else 1,
                f"shape (1, N) = (1, {N})" if rowwise else "one element")
    out = cupy.empty((M, N), dtype=cupy.float32 if out_dtype == "float32" else cupy.uint16)
    if M == 0:
        return out
    a_codes, bt_codes = ops.a, ops.bt
    if sig.ada:
        a_codes, bt_codes = _pad_k16(a_codes), _pad_k16(bt_codes)
    # the heuristic's algorithms assume 256-byte aligned operands (its default preference)
    a_ptr, bt_ptr = a_codes.data.ptr, bt_codes.data.ptr
    if a_ptr % 256:
        a_codes = a_codes.copy()
        a_ptr = a_codes.data.ptr
    if bt_ptr % 256:
        bt_codes = bt_codes.copy()
        bt_ptr = bt_codes.data.ptr
    bias_ptr = None
    if ops.bias is not None:
        b32 = ops.bias if isinstance(ops.bias, cupy.ndarray) else cupy.asarray(np.asarray(ops.bias, np.float32))
        # the bias was widened exactly from bf16/fp16 (the output dtype): narrow it back
        bias = (b32.view(cupy.uint32) >> 16).astype(cupy.uint16) if out_dtype == "bfloat16" else \
            b32.astype(cupy.float16)
        bias_ptr = bias.data.ptr
    launch(sig, device, cupy.cuda.get_current_stream().ptr, a_ptr, bt_ptr, out.data.ptr, sa.data.ptr, sb.data.ptr,
           bias_ptr)
    return out


def launch(sig, device: int, stream: int, a_ptr: int, bt_ptr: int, out_ptr: int, sa_ptr: int, sb_ptr: int,
           bias_ptr: int | None) -> None:
    """One ``cublasLtMatmul`` of a prepared signature on raw device pointers, on ``stream``.

    The caller guarantees what :func:`run` checks: ``a`` (M, K) and ``bt`` (N, K)
    C-contiguous uint8 codes at 256-byte aligned addresses (padded already for an Ada
    signature), ``out`` (M, N) C-contiguous of the signature's output dtype, float32 scales
    of one element each (tensorwise) or M and N contiguous elements (rowwise), and a bias
    of N contiguous elements of the output dtype (bf16/fp16) when the signature has one.
    The call is asynchronous on ``stream``; it needs the device current (the workspace is
    allocated there on first use)."""
    prep = sig.prep
    lt = prep.lt
    desc, lay_a, lay_b, lay_c, lay_d = sig.descs
    ptrs = (sa_ptr, sb_ptr, bias_ptr)
    with _lock:  # the descriptor's pointers are per call
        ws_ptr = _workspace_ptr(device, stream, prep.workspace) if prep.workspace else 0
        if sig.last != ptrs:
            h = lt.h
            # cuBLASLt A is torch's b: its scale is scale_b; B (torch's a) takes scale_a
            lt.set_desc(desc, h.DESC_A_SCALE_POINTER, ctypes.c_void_p(sb_ptr), "set A_SCALE_POINTER")
            lt.set_desc(desc, h.DESC_B_SCALE_POINTER, ctypes.c_void_p(sa_ptr), "set B_SCALE_POINTER")
            if bias_ptr is not None:
                lt.set_desc(desc, h.DESC_BIAS_POINTER, ctypes.c_void_p(bias_ptr), "set BIAS_POINTER")
            sig.last = ptrs
        st = lt.matmul(sig.handle, desc, _ONE, bt_ptr, lay_a, a_ptr, lay_b, _ZERO, out_ptr, lay_c, out_ptr, lay_d,
                       prep.algo_ref, ws_ptr, prep.workspace, stream)
    if st != 0:
        raise lt.h.LtError("cublasLtMatmul", st)


_ONE_F, _ZERO_F = ctypes.c_float(1.0), ctypes.c_float(0.0)
_ONE, _ZERO = ctypes.byref(_ONE_F), ctypes.byref(_ZERO_F)


def describe(M, N, K, a_format, b_format, out_dtype, fast_accum, bias, scaling, splits, ada=False) -> dict:
    """The algorithm configuration this backend runs for a call signature (for records)."""
    cupy = _cupy()
    lt = _lt()
    from .cublaslt import Case as LtCase

    device = cupy.cuda.Device().id
    case = LtCase(M, N, 2 * K if ada else K, a_format, b_format, out_dtype, bool(fast_accum), bool(bias), scaling)
    p = _prepared(lt, device, _handle(lt, device), case, splits)
    return dict(p.config, workspace_bytes=p.workspace, names=lt.h.describe_algo(p.config))
