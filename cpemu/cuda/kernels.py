"""Launch wrappers of cpemu's exact CUDA GEMM kernels (cupy).

Two kernel families compute the same bits as :mod:`cpemu.reference`:

* ``"cuda-simple"`` -- ``cuda_src/gemm_simple.cu``: one or two outputs per thread. Two kernels
  (:data:`SIMPLE_KERNELS`), picked by :func:`simple_kernel_for`: ``"per-output"``, written
  to be read side by side with the reference (integer T-FDPA steps, same function names,
  any instruction model; one output per thread), and, for 11 <= F <= 16 (Ada, Hopper),
  ``"staged"``: the block's outputs share each step's decoded codes in shared memory, each
  thread computes two outputs of one row, and each term is truncated by an exact FP32
  round-toward-zero multiply into the subnormal range;
* ``"cuda-tiled"`` -- ``cuda_src/cpemu_tiled.cuh``: each step's FP8 codes decoded once per
  block into shared memory (the next step's codes load while this one computes); the
  truncated terms of Ada/Hopper (F <= 16) by exact round-toward-zero FP32 fused
  multiply-adds summed as integers, Blackwell's (F = 25) in int64 like the reference. Two
  geometries (:data:`TILED_VARIANTS`), picked by :func:`tiled_module_for`: ``gemm_tiled.cu``
  (64 x 64 outputs per block, 8 x 4 per thread) and, for small M, ``gemm_tiled_small_m.cu``
  (16 x 32 per block, 2 x 4 per thread: no empty rows at M = 16 and four times the threads).
* ``"cuda-rzacc"`` -- the tiled kernel built with ``CPT_RZACC=1`` (``gemm_rzacc.cu``,
  ``gemm_rzacc_small_m.cu``, same two geometries): each step's accumulator is biased so that
  its ulp is the step's truncation grid, each product is one FP32 round-toward-zero fused
  multiply-add into it, and the negative products that lose bits are counted four at a time
  with byte-packed integer operations (``cpt_sum_rzacc``; :mod:`cpemu.rzacc_twin` is its
  arithmetic in numpy, with its claims asserted). Ada and Hopper models only
  (:data:`RZACC_MAX_F`); Blackwell's F = 25 runs on ``cuda-tiled``. A third geometry,
  ``gemm_rzacc_pre.cu``, takes the large one's place where :func:`predecode_limit` allows: each
  operand is decoded once per call into stage images, which the GEMM kernel copies (``cp.async``)
  into two alternating shared-memory stages.

:func:`gemm_cuda` takes the operands as cupy ``uint8`` code matrices (``a`` (M, K), ``bt``
(N, K): B transposed, K contiguous), the :class:`~cpemu.schedule.Plan`, the
:class:`~cpemu.instruction.InstructionModel` and the profile's mode dict (epilogue order,
NaN bit patterns), and returns a cupy array: ``float32`` for float32 output, ``uint16``
bit patterns for bfloat16 and float16 output (view them with :func:`as_numpy` or
``.view``). It launches on cupy's current stream and does not synchronize.

Kernels come from the prebuilt fatbins (``cpemu.cuda.loader.get_function``). With the
environment variable ``CPEMU_CUDA_FROM_SOURCE=1`` they are compiled instead from
``cuda_src/*.cu`` of a source checkout by NVRTC through ``cupy.RawModule`` (for
development and debugging on a GPU machine), with the same IEEE flags as the fatbin build.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import numpy as np

from ..backends import TENSOR_CORE as _TENSOR_CORE
from ..call import Call, Epilogue, Operands, Order
from ..formats import CANONICAL_NAN, OUT_DTYPES, FP8Format, fp8_format
from ..instruction import InstructionModel
from ..schedule import Plan
from . import tensorcore

__all__ = ["FAMILIES", "KERNELS", "MODULES", "TILED_VARIANTS", "TILED_FAMILIES", "RZACC_MAX_F", "TILED_SMALL_M_MAX", "SIMPLE_KERNELS", "TENSOR_CORE",
           "DIRECT", "OUT_KIND", "EPILOGUE_ORDERS", "FROM_SOURCE_ENV", "gemm_cuda", "launch", "limits", "get_kernel", "tiled_module_for",
           "simple_kernel_for", "tiled_threads", "as_numpy", "source_path", "available"]

#: kernel family -> (module = cuda_src/<module>.cu = bin/<module>.fatbin, kernel name) of its
#: default kernel; ``cuda-tiled`` also has the small-M geometry (TILED_VARIANTS)
KERNELS = {
    "cuda-simple": ("gemm_simple", "cpemu_gemm_simple"),
    "cuda-tiled": ("gemm_tiled", "cpemu_gemm_tiled"),
    "cuda-rzacc": ("gemm_rzacc", "cpemu_gemm_rzacc"),
}
#: kernel family -> every module it needs
#: the families built on the tiled body (cpemu_tiled.cuh): family -> (large, small-M) geometry
TILED_FAMILIES = {"cuda-tiled": ("gemm_tiled", "gemm_tiled_small_m"), "cuda-rzacc": ("gemm_rzacc", "gemm_rzacc_small_m")}
#: the large geometry of cuda-rzacc fed from stage images decoded once per call (gemm_rzacc_pre.cu;
#: :func:`predecode_limit` says where it runs in place of gemm_rzacc)
RZACC_PRE = "gemm_rzacc_pre"
MODULES = {"cuda-simple": ("gemm_simple",), "cuda-tiled": TILED_FAMILIES["cuda-tiled"],
           "cuda-rzacc": TILED_FAMILIES["cuda-rzacc"] + (RZACC_PRE,)}
FAMILIES = tuple(KERNELS)
#: the tensor-core backend (cpemu/cuda/tensorcore.py): same call, device-dependent bits
TENSOR_CORE = _TENSOR_CORE
#: every backend gemm_cuda launches
DIRECT = FAMILIES + (TENSOR_CORE,)

#: out_kind argument of the kernels
OUT_KIND = {"float32": 0, "bfloat16": 1, "float16": 2}
#: ep_order argument of the kernels, by the profile's spelling of the order (cpemu.call.Order)
EPILOGUE_ORDERS = {Order.SCALES_FIRST.value: 0, Order.A_THEN_B.value: 1, Order.B_THEN_A.value: 2}

FROM_SOURCE_ENV = "CPEMU_CUDA_FROM_SOURCE"
#: NVRTC options of the development path: the IEEE flags of tools/build_fatbin.py (cupy
#: adds the architecture of the current device itself).
SOURCE_OPTIONS = ("--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")

#: Geometries of the tiled kernel: module (cuda_src/<module>.cu) -> (kernel, CPT_BM, CPT_BN,
#: the default CPT_TM, CPT_TN, CPT_SMEM_BYTES: the decoded stage and the tables). Must match
#: the sources (their static_assert checks the shared memory size).
TILED_VARIANTS = {
    "gemm_tiled": ("cpemu_gemm_tiled", 64, 64, 8, 4, 46080),
    "gemm_tiled_small_m": ("cpemu_gemm_tiled_small_m", 16, 32, 2, 4, 19840),
    "gemm_rzacc": ("cpemu_gemm_rzacc", 64, 64, 8, 4, 38400),
    "gemm_rzacc_small_m": ("cpemu_gemm_rzacc_small_m", 16, 32, 2, 4, 17280),
    RZACC_PRE: ("cpemu_gemm_rzacc_pre", 64, 64, 8, 4, 67584),
}
#: rows of one stage image of gemm_rzacc_pre (the predecode kernel's block of rows, the GEMM's 64 x 64 tile)
IMAGE_ROWS = 64
#: gemm_rzacc_pre's predecode kernel: (name, shared memory bytes, K elements per chunk, bytes of
#: one image: 260 per row)
PREDECODE = ("cpemu_rzacc_predecode", 38400, 32, 260 * IMAGE_ROWS)
#: a ``CPT_STAGE_PASS1=0`` measurement build of gemm_rzacc_pre (with ``CPT_PROBE_SKIP=1``): stages
#: without pass 1's operand, 200 bytes per row: (GEMM, predecode) shared memory, image bytes per block
NO_PASS1_SMEM = (51200, 30208)
NO_PASS1_IMAGE_BYTES = 196 * IMAGE_ROWS
#: a ``CPT_EPROD=1`` measurement build (with ``CPT_STAGE_PASS1=0``): pass 1 by a kernel of its own on
#: tensor cores (cpemu_rzacc_eprod, e4m3 x e4m3), 32 bytes per GEMM thread and step read by the GEMM;
#: the GEMM's shared memory (its stages and those bytes)
EPROD_KERNEL = "cpemu_rzacc_eprod"
EPROD_DEFINES = ("CPT_EPROD=1", "CPT_STAGE_PASS1=0")
EPROD_SMEM = 55296
#: a ``CPT_PIPE2=1`` measurement build of gemm_rzacc_pre: the next step's pass 1 inside this step's pass 2
#: (a two-step software pipeline), three stages of 264 bytes per row of A and B: the GEMM's shared memory
#: (two blocks per SM on Hopper)
PIPE2_DEFINE = "CPT_PIPE2=1"
PIPE2_SMEM = 101376
#: gemm_rzacc_pre runs where both operands' images take at most this many bytes, and at most a
#: quarter of the GPU's free memory (else gemm_rzacc, the same bits)
PREDECODE_MAX_BYTES = 4 << 30
#: ... and where M and N are both at least this: the predecode kernel writes about 8 bytes per
#: operand element, so at M = 256 it costs more than the stages gain (H200: 0.93-1.02x at M = 256,
#: 1.07-1.10x at M = 2048 on the Evo 2 shapes; docs/design-notes.md)
PREDECODE_MIN_MN = 512
#: ``cuda-rzacc`` computes models with F up to this: the biased accumulator's binade holds the
#: step's sum (|c| < 2**(e_max+1), L <= 32 products below 2**(e_max+2) each, so
#: |sum| < 2**(e_max+8) <= 2**(e_max - F + 22)); Ada and Hopper have F = 13
RZACC_MAX_F = 14
#: ``cuda-tiled`` runs GEMMs with M up to this on the small-M geometry.
TILED_SMALL_M_MAX = 32
#: Kernels of ``cuda-simple`` (all in ``cuda_src/gemm_simple.cu``): name -> (kernel, threads
#: per block, outputs per block along N). The per-output kernel: 128 threads, grid-stride over
#: M * N; the staged kernel: blocks of 32 x 32 outputs, two per thread (512 threads; a tuning
#: build with ``CPS_TN=1``: one per thread, 1024 threads), its block size read from the kernel
#: (``max_threads_per_block``).
SIMPLE_KERNELS = {
    "per-output": ("cpemu_gemm_simple", 128, 0),
    "staged": ("cpemu_gemm_simple_staged", None, 32),
}
#: the instruction models (fraction bits F) that the staged kernel computes exactly
SIMPLE_STAGED_F = (11, 16)
#: K, the slice bounds and L must be multiples of this (8-byte loads of codes).
K_ALIGN = 8

_CUPY_HINT = "pip install 'cpemu[cuda12]' or 'cpemu[cuda13]'"
_lock = threading.Lock()
_cache: dict = {}


def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(f"the CUDA backends need cupy ({_CUPY_HINT}): {e}") from None
    return cupy


def source_path(module: str) -> Path:
    """``cuda_src/<module>.cu`` of the source checkout this package lives in."""
    return Path(__file__).resolve().parents[2] / "cuda_src" / f"{module}.cu"


def _from_source() -> bool:
    return os.environ.get(FROM_SOURCE_ENV, "") == "1"


def get_kernel(kernel_family: str, defines: tuple = (), module: str | None = None, kernel: str | None = None):
    """The ``cupy.RawKernel`` of ``kernel_family`` on the current device (cached); ``module``
    picks a tiled geometry (a key of :data:`TILED_VARIANTS`; default: the family's own);
    ``kernel`` a kernel of ``cuda-simple`` (a key of :data:`SIMPLE_KERNELS`; default: its first).

    From the verified fatbin, or compiled from ``cuda_src`` when ``CPEMU_CUDA_FROM_SOURCE=1``
    or when ``defines`` (extra ``-D`` options, for tuning experiments) are given.
    """
    if kernel_family not in KERNELS:
        raise ValueError(f"kernel_family: must be one of {FAMILIES} (got {kernel_family!r})")
    module = module or KERNELS[kernel_family][0]
    if module not in MODULES[kernel_family]:
        raise ValueError(f"module: must be one of {MODULES[kernel_family]} for {kernel_family} (got {module!r})")
    predecode = kernel == "predecode" and module == RZACC_PRE
    eprod = kernel == "eprod" and module == RZACC_PRE
    if kernel is not None and not (predecode or eprod) and (kernel_family != "cuda-simple" or kernel not in SIMPLE_KERNELS):
        raise ValueError(f"kernel: must be None, or for cuda-simple one of {sorted(SIMPLE_KERNELS)} (got {kernel!r})")
    if predecode:
        name = PREDECODE[0]
    elif eprod:
        name = EPROD_KERNEL
    elif kernel is not None:
        name = SIMPLE_KERNELS[kernel][0]
    else:
        name = TILED_VARIANTS[module][0] if module in TILED_VARIANTS else KERNELS[kernel_family][1]
    cupy = _cupy()
    dev = cupy.cuda.Device().id
    src = _from_source() or bool(defines)
    key = (module, name, dev, src, tuple(defines))
    with _lock:
        fn = _cache.get(key)
        if fn is None:
            if src:
                path = source_path(module)
                if not path.is_file():
                    raise FileNotFoundError(
                        f"{FROM_SOURCE_ENV}=1 needs the CUDA sources of a checkout: {path} is missing")
                opts = SOURCE_OPTIONS + (f"-I{path.parent}",) + tuple(f"-D{d}" for d in defines)
                mod = cupy.RawModule(code=path.read_text(), options=opts, name_expressions=None)
                fn = mod.get_function(name)
            else:
                from .loader import get_function

                fn = get_function(module, name)
            if module in TILED_VARIANTS and not eprod:  # its dynamic shared memory (the launch checks the limit)
                fn.max_dynamic_shared_size_bytes = (_predecode_smem(defines) if predecode
                                                    else tiled_smem(module, defines))
            _cache[key] = fn
    return fn


def available(kernel_family: str = "cuda-tiled") -> tuple[bool, str]:
    """``(True, detail)`` if ``kernel_family`` can run here, else ``(False, reason)``; never raises."""
    try:
        cupy = _cupy()
        n = cupy.cuda.runtime.getDeviceCount()
        if n < 1:
            return False, "no CUDA GPU"
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    if kernel_family not in MODULES:
        return False, f"unknown kernel family {kernel_family!r}"
    if _from_source():
        for module in MODULES[kernel_family]:
            p = source_path(module)
            if not p.is_file():
                return False, f"{p} is missing"
        return True, f"compiled from {source_path(MODULES[kernel_family][0]).parent}"
    from .loader import module_status

    return modules_status(module_status, MODULES[kernel_family])


def modules_status(module_status, modules) -> tuple[bool, str]:
    """``module_status`` of every module: the first failure, else the first module's detail."""
    results = [module_status(m) for m in modules]
    for ok, why in results:
        if not ok:
            return False, why
    return True, results[0][1]


# ---------------------------------------------------------------- argument checks


def _fail(arg: str, rule: str, got) -> None:
    raise ValueError(f"{arg}: {rule} (got {got})")


def _codes(x, name: str, cupy, device: int | None):
    if not isinstance(x, cupy.ndarray):
        _fail(name, "must be a cupy array of uint8 FP8 codes", type(x).__name__)
    if x.dtype.char != "B":
        _fail(name, "dtype must be uint8 (FP8 codes; view float8 data as uint8)", x.dtype)
    if x.ndim != 2:
        _fail(name, "must be a 2-D matrix", f"shape {x.shape}")
    if x.strides != (x.shape[1], 1) and not x.flags.c_contiguous:  # the strides of a dense uint8 matrix
        _fail(name, "must be C-contiguous (row-major, K contiguous)", f"strides {x.strides}")
    mem = x.data  # its device_id is the array's device (cheaper than x.device.id, which builds a Device)
    if device is not None and mem.device_id != device:
        _fail(name, f"must be on the same device as a_codes (device {device})", f"device {mem.device_id}")
    return x


def _vector(x, name: str, cupy, device: int, length_ok, what: str):
    """A float32 argument (numpy or cupy) as a contiguous 1-D cupy array on ``device``."""
    if isinstance(x, cupy.ndarray):
        if x.device.id != device:
            _fail(name, f"must be on the same device as a_codes (device {device})", f"device {x.device.id}")
        arr = x
    elif isinstance(x, (np.ndarray, np.floating)):
        arr = np.asarray(x)
    else:
        _fail(name, f"must be a numpy or cupy float32 array ({what})", type(x).__name__)
    if arr.dtype != np.float32:
        _fail(name, f"dtype must be float32 ({what})", arr.dtype)
    if not length_ok(arr.shape):
        _fail(name, f"must have {what}", f"shape {arr.shape}")
    with cupy.cuda.Device(device):
        return cupy.ascontiguousarray(cupy.asarray(arr).reshape(-1))


def _fmt(f, name: str) -> FP8Format:
    fmt = fp8_format(f)
    if fmt is None:
        _fail(name, "must be an FP8 format: 'e4m3' or 'e5m2' (or an FP8Format)", repr(f))
    return fmt


# ---------------------------------------------------------------- the GEMM


@functools.lru_cache(maxsize=512)
def _static_config(a_format, b_format, plan, model, K: int, order_name, out_dtype, nan_raw) -> tuple:
    """gemm_cuda's checks of everything but the arrays (cached per call signature):
    (fa, fb, L, F, R, slices, promotion, epilogue order, NaN bits)."""
    fa, fb = _fmt(a_format, "a_format"), _fmt(b_format, "b_format")
    if not isinstance(model, InstructionModel):
        _fail("model", "must be a cpemu.instruction.InstructionModel", type(model).__name__)
    L, F, R = int(model.L), int(model.F), int(model.result_fraction_bits)
    if L % K_ALIGN or not 0 < L <= 32:
        _fail("model", f"L must be a multiple of {K_ALIGN} between 8 and 32", L)
    if not fa.frac_bits + fb.frac_bits <= F <= 29:
        _fail("model", f"F must lie in [{fa.frac_bits + fb.frac_bits}, 29] for these formats", F)
    if not 0 <= R <= 23:
        _fail("model", "the result rounding must keep 0 to 23 fraction bits", R)
    if not isinstance(plan, Plan):
        _fail("plan", "must be a cpemu.schedule.Plan", type(plan).__name__)
    slices = [(int(k0), int(k1)) for k0, k1 in plan.slices]
    if not slices:
        _fail("plan", "must have at least one slice", plan.slices)
    for k0, k1 in slices:
        if not 0 <= k0 < k1 <= K or k0 % K_ALIGN or k1 % K_ALIGN:
            _fail("plan", f"slices must be non-empty ranges within [0, K={K}] with bounds multiple of {K_ALIGN}",
                  plan.slices)
    promotion = 0 if plan.promotion is None else int(plan.promotion)
    if plan.promotion is not None and promotion <= 0:
        _fail("plan", "promotion must be None (fast accumulation) or a positive number of steps", plan.promotion)
    order = EPILOGUE_ORDERS.get(order_name) if isinstance(order_name, str) else None
    if order is None:
        _fail("mode", f"mode['epilogue']['order'] must be one of {sorted(EPILOGUE_ORDERS)}", repr(order_name))
    if out_dtype not in OUT_KIND:
        _fail("out_dtype", f"must be one of {sorted(OUT_KIND)}", repr(out_dtype))
    nan_bits = CANONICAL_NAN[out_dtype] if nan_raw is None else int(nan_raw)
    return fa, fb, L, F, R, tuple(slices), promotion, order, nan_bits


#: _static_config's answers by the identity of the (immutable) plan and model objects, which
#: each entry keeps alive: a repeated call skips hashing them (kept small; cleared when full)
_config_by_id: dict = {}


def _config(a_format, b_format, plan, model, K, order_name, out_dtype, nan_raw) -> tuple:
    """_static_config, looked up first by the identity of ``plan`` and ``model``."""
    args = (a_format, b_format, plan, model, K, order_name, out_dtype, nan_raw)
    key = (id(plan), id(model)) + args[:2] + args[4:]
    try:  # the checks depend on these arguments only: done once per signature
        hit = _config_by_id.get(key)
        if hit is None or hit[0] is not plan or hit[1] is not model:
            hit = (plan, model, _static_config(*args))
            if len(_config_by_id) >= 256:
                _config_by_id.clear()
            _config_by_id[key] = hit
    except TypeError:  # an unhashable argument: checked (and refused) without a cache
        return _static_config.__wrapped__(*args)
    return hit[2]


def gemm_cuda(kernel_family: str, a_codes, bt_codes, a_format, b_format, plan: Plan, model: InstructionModel,
              mode: dict, scale_a, scale_b, bias_f32, out_dtype: str, *, defines: tuple = (),
              tiled_module: str | None = None, simple_kernel: str | None = None):
    """Exact ``(a @ b) * scales (+ bias)`` on the GPU, bit for bit the reference's: the entry
    for kernel authors and tests, which checks every argument (``cpemu.gemm`` reaches the
    kernels through :func:`launch` with a checked :class:`~cpemu.call.Call` instead).

    ``a_codes`` (M, K) and ``bt_codes`` (N, K): C-contiguous cupy ``uint8`` arrays of FP8
    codes on the current device (``bt`` is B transposed); ``a_format``/``b_format``:
    ``"e4m3"``/``"e5m2"`` or :class:`~cpemu.formats.FP8Format`; ``plan``: the schedule
    (:meth:`cpemu.profile.Profile.plan`); ``model``: the instruction model; ``mode``: the
    profile's mode dict (``mode["epilogue"]["order"]``, optional ``mode["nan_bits"]``);
    ``scale_a``/``scale_b``: numpy or cupy float32 of one element (tensorwise), or of
    shape (M, 1) / (1, N) (rowwise); ``bias_f32``: None or a float32 (N,) array (bf16/fp16
    bias widened exactly); ``out_dtype``: ``"bfloat16"``, ``"float16"`` or ``"float32"``.

    Returns a C-contiguous cupy (M, N) array: ``float32`` for float32 output, ``uint16`` bit
    patterns for bfloat16 and float16 (NaN written as the profile's ``nan_bits``). The kernel
    runs on cupy's current stream; the call does not synchronize. ``defines``: extra macros
    (``"NAME=VALUE"``) to compile the kernel from source with, for tuning experiments only.
    ``tiled_module``: the geometry of ``cuda-tiled`` (a key of :data:`TILED_VARIANTS`);
    default: :func:`tiled_module_for` the shape and the GPU (the bits are the same with either).
    ``simple_kernel``: the kernel of ``cuda-simple`` (a key of :data:`SIMPLE_KERNELS`);
    default: :func:`simple_kernel_for` the model (the bits are the same with either).

    ``kernel_family="cublaslt-tc"`` runs the same call on the device's tensor cores
    (:mod:`cpemu.cuda.tensorcore`, fast accumulation when ``plan.promotion`` is None); it
    raises :class:`~cpemu.cuda.tensorcore.TensorCoreUnsupported` for calls it does not reproduce.
    """
    if kernel_family not in DIRECT:
        _fail("kernel_family", f"must be one of {DIRECT}", repr(kernel_family))
    if tiled_module is not None and (kernel_family not in TILED_FAMILIES or tiled_module not in MODULES[kernel_family]):
        _fail("tiled_module", "must be None, or for " + ", ".join(
            f"{f} one of {list(MODULES[f])}" for f in TILED_FAMILIES), repr(tiled_module))
    if simple_kernel is not None and (kernel_family != "cuda-simple" or simple_kernel not in SIMPLE_KERNELS):
        _fail("simple_kernel", f"must be None, or for cuda-simple one of {sorted(SIMPLE_KERNELS)}",
              repr(simple_kernel))
    cupy = _cupy()
    if not isinstance(a_codes, cupy.ndarray):
        _fail("a_codes", "must be a cupy array of uint8 FP8 codes", type(a_codes).__name__)
    device = a_codes.data.device_id
    a = _codes(a_codes, "a_codes", cupy, None)
    bt = _codes(bt_codes, "bt_codes", cupy, device)
    M, K = a.shape
    N, K2 = bt.shape
    if K2 != K:
        _fail("bt_codes", f"must have shape (N, K) with K = a_codes.shape[1] = {K}", f"shape {bt.shape}")
    if K % 16 or K == 0:
        _fail("a_codes", "K must be a positive multiple of 16", K)
    if N == 0:
        _fail("bt_codes", "N must be positive", N)
    try:
        order_name = mode["epilogue"]["order"]
    except (KeyError, TypeError):
        order_name = None
    nan_raw = (mode.get("nan_bits") or {}).get(out_dtype) if isinstance(mode, dict) else None
    fa, fb, L, F, R, slices, promotion, order, nan_bits = _config(a_format, b_format, plan, model, K, order_name,
                                                                  out_dtype, nan_raw)
    rowwise = tensorcore._size(scale_a) != 1 or tensorcore._size(scale_b) != 1
    call = Call(M, N, K, fa, fb, out_dtype, "rowwise" if rowwise else "tensorwise",
                None if bias_f32 is None else out_dtype, plan.promotion is None, plan, model,
                Epilogue(Order(order_name), nan_bits), "")
    if kernel_family == TENSOR_CORE:  # scales are checked and uploaded (once per value) there
        return tensorcore.run(call, Operands(a, bt, scale_a, scale_b, bias_f32), device)
    sa = _vector(scale_a, "scale_a", cupy, device, lambda s: int(np.prod(s)) == 1 or s == (M, 1),
                 f"one element (tensorwise) or shape (M, 1) = ({M}, 1) (rowwise)")
    sb = _vector(scale_b, "scale_b", cupy, device, lambda s: int(np.prod(s)) == 1 or s == (1, N),
                 f"one element (tensorwise) or shape (1, N) = (1, {N}) (rowwise)")
    bias = None if bias_f32 is None else \
        _vector(bias_f32, "bias_f32", cupy, device, lambda s: s == (N,), f"shape (N,) = ({N},)")
    if simple_kernel == "staged" and simple_kernel_for(F) != "staged":
        _fail("simple_kernel", "'staged' computes instruction models with F in [{}, {}] only".format(
            *SIMPLE_STAGED_F), f"F = {F}")
    with cupy.cuda.Device(device):
        return launch(kernel_family, call, Operands(a, bt, sa, sb, bias), defines=defines, tiled_module=tiled_module,
                      simple_kernel=simple_kernel)


def limits(call, kernel_family: str | None = None) -> str | None:
    """Why the exact kernels (of ``kernel_family``, default any) cannot compute ``call`` (its
    model or plan is beyond them), or None."""
    try:
        _config(call.a_format, call.b_format, call.plan, call.model, call.K, call.epilogue.order.value,
                call.out_dtype, call.epilogue.nan_bits)
    except (ValueError, TypeError) as e:
        return str(e)
    return _family_limit(kernel_family, call.model)


def _family_limit(kernel_family: str | None, model) -> str | None:
    """Why ``kernel_family`` cannot compute ``model`` (beyond the checks every exact kernel shares), or None."""
    if kernel_family == "cuda-rzacc" and model.F > RZACC_MAX_F:
        return (f"cuda-rzacc computes instruction models with F <= {RZACC_MAX_F} (Ada, Hopper); "
                f"{model.name} has F = {model.F}")
    return None


def launch(kernel_family: str, call: Call, ops: Operands, *, defines: tuple = (), tiled_module: str | None = None,
           simple_kernel: str | None = None):
    """One exact kernel of ``kernel_family`` ("cuda-rzacc", "cuda-tiled" or "cuda-simple") for a checked
    ``call`` (within :func:`limits`) on the current device: ``ops`` holds cupy (M, K) and
    (N, K) C-contiguous uint8 codes on it, float32 scales (numpy or cupy; one element, or
    M and N of them) and a float32 (N,) bias or None. Returns the output as :func:`gemm_cuda`
    does, on cupy's current stream."""
    cupy = _cupy()
    M, N, K = call.M, call.N, call.K
    model, plan, ep = call.model, call.plan, call.epilogue
    a, bt = _aligned(ops.a), _aligned(ops.bt)
    sa, sb = _on_device(cupy, ops.scale_a), _on_device(cupy, ops.scale_b)
    bias = cupy.zeros(1, dtype=cupy.float32) if ops.bias is None else _on_device(cupy, ops.bias)
    out = cupy.empty((M, N), dtype=cupy.float32 if call.out_dtype == "float32" else cupy.uint16)
    if M == 0:
        return out
    slices = plan.slices
    promotion = 0 if plan.promotion is None else int(plan.promotion)
    sl = cupy.asarray(np.asarray(slices, dtype=np.int32).reshape(-1))
    i32 = np.int32
    args = [a, bt, i32(M), i32(N), i32(K), i32(call.a_format.name == "e5m2"), i32(call.b_format.name == "e5m2"),
            i32(model.L), i32(model.F), i32(model.result_fraction_bits), i32(model.e_zero), sl, i32(len(slices)),
            i32(promotion), sa, i32(sa.size != 1), sb, i32(sb.size != 1), i32(EPILOGUE_ORDERS[ep.order.value]),
            bias, i32(ops.bias is not None), out, i32(OUT_KIND[call.out_dtype]), np.uint32(ep.nan_bits)]
    if kernel_family == "cuda-simple":
        kernel = simple_kernel_for(model.F) if simple_kernel is None else simple_kernel
        fn = get_kernel(kernel_family, tuple(defines), kernel=kernel)
        threads, bm, bn = simple_geometry(kernel, fn)
        if bm:
            grid = ((N + bn - 1) // bn, (M + bm - 1) // bm, 1)
            if grid[1] > 65535:
                _fail("a_codes", f"M must be at most {65535 * bm} for the staged kernel", M)
        else:
            grid = (min((M * N + threads - 1) // threads, 1 << 20), 1, 1)
        fn(grid, (threads, 1, 1), tuple(args))
        return out
    ws = cupy.empty(2 * M * N if promotion > 0 or len(slices) > 1 else 1, dtype=cupy.float32)
    why = _family_limit(kernel_family, model)
    if why:
        raise ValueError(f"model: {why}")
    module = tiled_module_for(M, N, _sm_count(a.data.device_id), kernel_family) if tiled_module is None \
        else tiled_module
    if module == RZACC_PRE or (tiled_module is None and module == "gemm_rzacc" and min(M, N) >= PREDECODE_MIN_MN):
        why_not = predecode_limit(call, a.data.device_id, defines)
        if module == RZACC_PRE and why_not:
            _fail("tiled_module", f"{RZACC_PRE} cannot run this call: {why_not}", module)
        module = "gemm_rzacc" if why_not else RZACC_PRE
    if module != RZACC_PRE and _defines(defines, PIPE2_DEFINE):
        defines = tuple(d for d in defines if str(d) != PIPE2_DEFINE)  # a build of gemm_rzacc_pre only
    if module == RZACC_PRE and _eprod(defines) and not (call.a_format.name == "e4m3" and call.b_format.name == "e4m3"):
        defines = tuple(d for d in defines if d not in EPROD_DEFINES)  # that build is e4m3 x e4m3 only: the same bits
    fn = get_kernel(kernel_family, tuple(defines), module)
    _, bm, bn = TILED_VARIANTS[module][:3]
    smem = tiled_smem(module, defines)
    grid = ((N + bn - 1) // bn, (M + bm - 1) // bm, 1)
    if grid[1] > 65535:
        _fail("a_codes", f"M must be at most {65535 * bm} for the tiled kernel", M)
    args += [ws] + (_images(call, a, bt, defines) if module == RZACC_PRE else [])
    if module == RZACC_PRE and _eprod(defines):
        args += _eprod_bytes(call, a, bt, defines, grid)
    fn(grid, (tiled_threads(module, defines), 1, 1), tuple(args), shared_mem=smem)
    return out


def predecode_limit(call, device: int, defines=()) -> str | None:
    """Why ``gemm_rzacc_pre`` (built with ``defines``) cannot run ``call`` on ``device`` (then
    gemm_rzacc runs it, the same bits), or None: every step must lie in one 32-element K chunk
    (L divides 32 and every slice starts at a multiple of L), the two operands' stage images must
    fit PREDECODE_MAX_BYTES and a quarter of the free memory, and the SM must hold two blocks'
    shared memory."""
    L, chunk = call.model.L, PREDECODE[2]
    if chunk % L or any(k0 % L for k0, _ in call.plan.slices):
        return f"its steps do not lie in {chunk}-element K chunks (L = {L}, slices {list(call.plan.slices)[:4]})"
    need = _image_bytes(call.M, call.K) + _image_bytes(call.N, call.K)
    free = int(_cupy().cuda.runtime.memGetInfo()[0])
    if need > min(PREDECODE_MAX_BYTES, free // 4):
        return f"its stage images take {need} bytes (at most {PREDECODE_MAX_BYTES} and a quarter of the {free} free)"
    if _smem_per_sm(device) < 2 * tiled_smem(RZACC_PRE, defines):
        return "the SM holds less than two blocks' shared memory"
    return None


def _image_bytes(rows: int, K: int, defines=()) -> int:
    """Bytes of one operand's stage images: 260 per row (rounded up to IMAGE_ROWS rows) and 32 K elements
    (196 in a ``CPT_STAGE_PASS1=0`` measurement build: no pass 1 operand)."""
    per_block = PREDECODE[3] if _stage_pass1(defines) else NO_PASS1_IMAGE_BYTES
    return -(-rows // IMAGE_ROWS) * -(-K // PREDECODE[2]) * per_block


def _defines(defines, macro: str) -> bool:
    """Whether the build's defines hold ``macro`` ("NAME=VALUE")."""
    return macro in tuple(map(str, defines))


def _stage_pass1(defines) -> bool:
    """False for a ``CPT_STAGE_PASS1=0`` measurement build (stages without pass 1's operand)."""
    return not _defines(defines, "CPT_STAGE_PASS1=0")


def _eprod(defines) -> bool:
    """True for a ``CPT_EPROD=1`` measurement build (pass 1 in cpemu_rzacc_eprod)."""
    return _defines(defines, "CPT_EPROD=1")


def _eprod_bytes(call, a, bt, defines, grid) -> list:
    """The e_max bytes of every step for a ``CPT_EPROD=1`` build (cpemu_rzacc_eprod, from the full
    stage images of the shipped predecode kernel) and the number of steps: the GEMM's last two arguments."""
    cupy = _cupy()
    nsteps = -(-call.K // call.model.L)
    need = grid[0] * grid[1] * nsteps * 32 * tiled_threads(RZACC_PRE, defines)
    free = int(cupy.cuda.runtime.memGetInfo()[0])
    if need > free // 2:
        raise ValueError(f"defines: CPT_EPROD=1 needs {need} bytes for its e_max bytes (at most half the {free} free)")
    pa, pb, nchunks = _images(call, a, bt, ())
    ep = cupy.empty(need, dtype=cupy.uint8)
    fn = get_kernel("cuda-rzacc", tuple(defines), RZACC_PRE, kernel="eprod")
    fn(grid, (tiled_threads(RZACC_PRE, defines), 1, 1),
       (pa, pb, nchunks, np.int32(call.K), np.int32(call.model.L), np.int32(nsteps), ep))
    return [ep, np.int32(nsteps)]


def _predecode_smem(defines) -> int:
    return PREDECODE[1] if _stage_pass1(defines) else NO_PASS1_SMEM[1]


@functools.lru_cache(maxsize=None)
def _smem_per_sm(device: int) -> int:
    return int(_cupy().cuda.Device(device).attributes["MaxSharedMemoryPerMultiprocessor"])


def _images(call, a, bt, defines) -> list:
    """The stage images of A and B (cpemu_rzacc_predecode, on the current stream) and the
    number of K chunks: the GEMM kernel's last three arguments."""
    cupy = _cupy()
    smem, chunk = _predecode_smem(defines), PREDECODE[2]
    fn = get_kernel("cuda-rzacc", tuple(defines), RZACC_PRE, kernel="predecode")
    nchunks = -(-call.K // chunk)
    bf_emax = np.int32(call.a_format.name == "e4m3" and call.b_format.name == "e4m3")
    out = []
    for x, rows, fmt in ((a, call.M, call.a_format), (bt, call.N, call.b_format)):
        img = cupy.empty(_image_bytes(rows, call.K, defines), dtype=cupy.uint8)
        fn((nchunks, -(-rows // IMAGE_ROWS), 1), (tiled_threads(RZACC_PRE, defines), 1, 1),
           (x, np.int32(rows), np.int32(call.K), np.int32(fmt.name == "e5m2"), bf_emax, img), shared_mem=smem)
        out.append(img)
    return out + [np.int32(nchunks)]


def _aligned(x):
    """Codes at a 16-byte aligned address (8-byte vector loads of the tiled kernel): a copy if not."""
    return x.copy() if x.data.ptr % 16 else x


def _on_device(cupy, x):
    """A float32 array (numpy, numpy scalar or cupy) as a contiguous 1-D cupy array on the current device."""
    if isinstance(x, cupy.ndarray):
        return x.reshape(-1) if x.flags.c_contiguous else cupy.ascontiguousarray(x).reshape(-1)
    return cupy.asarray(np.ascontiguousarray(np.asarray(x, dtype=np.float32)).reshape(-1))


def simple_kernel_for(F: int) -> str:
    """The kernel ``cuda-simple`` runs a model with ``F`` fraction bits on: ``"staged"`` where
    it is exact (SIMPLE_STAGED_F: Ada, Hopper), else ``"per-output"`` (Blackwell's F = 25)."""
    return "staged" if SIMPLE_STAGED_F[0] <= F <= SIMPLE_STAGED_F[1] else "per-output"


def tiled_module_for(M: int, N: int, sm_count: int, kernel_family: str = "cuda-tiled") -> str:
    """The tiled geometry ``cuda-tiled`` runs an (M, N, K) GEMM on, on a GPU of ``sm_count``
    SMs: the small-M one for M <= TILED_SMALL_M_MAX, and wherever 64 x 64 blocks would not
    give every SM one (on an H200: 1.1-2.7x faster there, slower elsewhere; benchmarks/README.md).
    The bits are the same on either."""
    large, small = TILED_FAMILIES[kernel_family]
    _, bm, bn = TILED_VARIANTS[large][:3]
    if M <= TILED_SMALL_M_MAX or -(-M // bm) * -(-N // bn) < sm_count:
        return small
    return large


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return int(_cupy().cuda.Device(device).attributes["MultiProcessorCount"])


def simple_geometry(kernel: str, fn) -> tuple[int, int, int]:
    """(threads per block, outputs per block along M, along N; 0, 0 for a grid-stride kernel)
    of the ``cuda-simple`` kernel ``fn`` (a ``cupy.RawKernel``): the staged kernel's blocks are
    32 x 32 outputs, its block size its ``max_threads_per_block`` (its __launch_bounds__: 512
    threads with two outputs each, or 1024 with one)."""
    _, threads, bn = SIMPLE_KERNELS[kernel]
    if not bn:
        return threads, 0, 0
    threads = int(fn.max_threads_per_block)
    if threads not in (512, 1024):
        raise RuntimeError(f"the staged kernel declares {threads} threads per block (expected 512 or 1024)")
    return threads, 32, bn


def tiled_smem(module: str, defines=()) -> int:
    """Dynamic shared memory of a tiled geometry's GEMM kernel: TILED_VARIANTS', plus pass 1's
    64 x 64 bytes in a ``CPT_PASS1_MMA=1`` measurement build of gemm_rzacc_pre (and the
    measurement builds' own: CPT_EPROD, CPT_STAGE_PASS1=0, CPT_PIPE2)."""
    if module == RZACC_PRE and _defines(defines, PIPE2_DEFINE):
        return PIPE2_SMEM
    if module == RZACC_PRE and _eprod(defines):
        return EPROD_SMEM
    if module == RZACC_PRE and not _stage_pass1(defines):
        return NO_PASS1_SMEM[0]
    extra = 64 * 64 if module == RZACC_PRE and _defines(defines, "CPT_PASS1_MMA=1") else 0
    return TILED_VARIANTS[module][5] + extra


def tiled_threads(module: str, defines=()) -> int:
    """Threads of a block of a tiled geometry: (CPT_BM / CPT_TM) * (CPT_BN / CPT_TN) * CPT_KPARTS,
    with the source's CPT_TM x CPT_TN and one thread per output group unless a tuning build
    defines them otherwise (CPT_KPARTS: threads sharing one group of outputs, cuda-rzacc)."""
    _, bm, bn, tm, tn = TILED_VARIANTS[module][:5]
    d = dict(str(x).split("=", 1) for x in defines if "=" in str(x))
    return (bm // int(d.get("CPT_TM", tm))) * (bn // int(d.get("CPT_TN", tn))) * int(d.get("CPT_KPARTS", 1))


def as_numpy(result, out_dtype: str) -> np.ndarray:
    """A :func:`gemm_cuda` result copied to the host as a numpy array of ``out_dtype``
    (ml_dtypes bfloat16, float16 or float32), like :func:`cpemu.gemm` returns."""
    host = result.get() if hasattr(result, "get") else np.asarray(result)
    return host.view(OUT_DTYPES[out_dtype])
