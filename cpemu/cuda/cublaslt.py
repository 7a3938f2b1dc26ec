"""The runtime's cuBLASLt binding: ``ctypes`` types, constants, the library search and the calls.

Used by the tensor-core backend (:mod:`cpemu.cuda.tensorcore`) and by the recording tools
(:mod:`cpemu.recording.cublaslt_heuristic`). It holds:

* the enum values and struct layouts of the cuBLASLt C API;
* :class:`Case` (one ``torch._scaled_mm`` call) and :func:`torch_lt_plan`, the cuBLASLt
  problem torch 2.11 builds for it;
* :func:`find_cublaslt` (the library torch loaded wins) and :class:`CublasLt`, the
  entry points the runtime and the recorders call;
* :func:`build_descs` / :func:`destroy_descs`: the descriptors exactly as torch's
  ``at::cuda::blas::scaled_gemm`` makes them (aten/src/ATen/cuda/CUDABlas.cpp);
* :meth:`CublasLt.read_algo` and :func:`describe_algo`: an algorithm's configuration.

Nothing touches CUDA at import time; loading the library needs no GPU.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import site
import sys
from dataclasses import dataclass

import click


# ---------------------------------------------------------------------------
# Enum values, all from the cuBLAS 12.9 / 13.x headers (identical for every
# value used here): cublasLt.h, cublas_api.h, library_types.h.
# ---------------------------------------------------------------------------
CUBLAS_STATUS_NAMES = {  # cublasStatus_t, cublas_api.h
    0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE",
    8: "ARCH_MISMATCH", 11: "MAPPING_ERROR", 13: "EXECUTION_FAILED",
    14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR",
}
CUBLAS_COMPUTE_32F = 68  # cublasComputeType_t, cublas_api.h
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1  # cublasOperation_t, cublas_api.h
# cudaDataType_t, library_types.h
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2 = 0, 2, 14, 28, 29
# cublasLtMatmulDescAttributes_t, cublasLt.h (value type in the trailing comment)
DESC_TRANSA = 3  # int32_t (cublasOperation_t)
DESC_TRANSB = 4  # int32_t
DESC_EPILOGUE = 7  # uint32_t (cublasLtEpilogue_t)
DESC_BIAS_POINTER = 8  # const void *
DESC_A_SCALE_POINTER = 17  # const void *
DESC_B_SCALE_POINTER = 18  # const void *
DESC_FAST_ACCUM = 25  # int8_t
DESC_BIAS_DATA_TYPE = 26  # int32_t (cudaDataType)
DESC_A_SCALE_MODE = 31  # int32_t (cublasLtMatmulMatrixScale_t)
DESC_B_SCALE_MODE = 32  # int32_t
CUBLASLT_EPILOGUE_BIAS = 4  # cublasLtEpilogue_t
CUBLASLT_EPILOGUE_DEFAULT = 1  # cublasLtEpilogue_t (what TE sets without bias)
SCALE_MODE_SCALAR_32F = 0  # cublasLtMatmulMatrixScale_t
SCALE_MODE_OUTER_VEC_32F = 3
PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t, uint64_t
PREF_MIN_ALIGNMENT_BYTES = {"A": 5, "B": 6, "C": 7, "D": 8}  # uint32_t each (cublasLt.h)
# cublasLtMatmulAlgoConfigAttributes_t: (json field, value, signed?)
ALGO_CONFIG_FIELDS = (
    ("algo_id", 0, True),  # CUBLASLT_ALGO_CONFIG_ID, int32_t
    ("tile_id", 1, False),  # TILE_ID, uint32_t
    ("splitk_num", 2, True),  # SPLITK_NUM, int32_t
    ("reduction_scheme", 3, False),  # REDUCTION_SCHEME, uint32_t
    ("cta_swizzling", 4, False),  # CTA_SWIZZLING, uint32_t
    ("custom_option", 5, False),  # CUSTOM_OPTION, uint32_t
    ("stages_id", 6, False),  # STAGES_ID, uint32_t
    ("inner_shape_id", 7, False),  # INNER_SHAPE_ID, uint16_t
    ("cluster_shape_id", 8, False),  # CLUSTER_SHAPE_ID, uint16_t
)
ALGO_FIELD_NAMES = tuple(f[0] for f in ALGO_CONFIG_FIELDS)
REDUCTION_NAMES = {0: "NONE", 1: "INPLACE", 2: "COMPUTE_TYPE", 4: "OUTPUT_TYPE"}


def _pairs(text: str) -> dict[int, str]:
    """Parse 'id:NAME id:NAME ...' into a dict."""
    out = {}
    for tok in text.split():
        k, v = tok.split(":", 1)
        out[int(k)] = v
    return out


# cublasLtMatmulTile_t (contiguous from 0), cublasLtMatmulStages_t,
# cublasLtClusterShape_t, cublasLtMatmulInnerShape_t: names without their
# CUBLASLT_MATMUL_TILE_ / _STAGES_ / CUBLASLT_CLUSTER_SHAPE_ / _INNER_SHAPE_
# prefix, from cublasLt.h of cuBLAS 13.10 (enum values only ever get appended).
TILE_NAMES = """\
UNDEFINED 8x8 8x16 16x8 8x32 16x16 32x8 8x64 16x32 32x16 64x8 32x32 32x64 64x32 32x128 64x64 128x32
64x128 128x64 64x256 128x128 256x64 64x512 128x256 256x128 512x64 64x96 96x64 96x128 128x160 160x128
192x128 128x192 128x96 32x256 256x32 8x128 8x192 8x256 8x320 8x384 8x448 8x512 8x576 8x640 8x704
8x768 16x64 16x128 16x192 16x256 16x320 16x384 16x448 16x512 16x576 16x640 16x704 16x768 24x64
24x128 24x192 24x256 24x320 24x384 24x448 24x512 24x576 24x640 24x704 24x768 32x192 32x320 32x384
32x448 32x512 32x576 32x640 32x704 32x768 40x64 40x128 40x192 40x256 40x320 40x384 40x448 40x512
40x576 40x640 40x704 40x768 48x64 48x128 48x192 48x256 48x320 48x384 48x448 48x512 48x576 48x640
48x704 48x768 56x64 56x128 56x192 56x256 56x320 56x384 56x448 56x512 56x576 56x640 56x704 56x768
64x192 64x320 64x384 64x448 64x576 64x640 64x704 64x768 72x64 72x128 72x192 72x256 72x320 72x384
72x448 72x512 72x576 72x640 80x64 80x128 80x192 80x256 80x320 80x384 80x448 80x512 80x576 88x64
88x128 88x192 88x256 88x320 88x384 88x448 88x512 96x192 96x256 96x320 96x384 96x448 96x512 104x64
104x128 104x192 104x256 104x320 104x384 104x448 112x64 112x128 112x192 112x256 112x320 112x384
120x64 120x128 120x192 120x256 120x320 120x384 128x320 128x384 136x64 136x128 136x192 136x256
136x320 144x64 144x128 144x192 144x256 144x320 152x64 152x128 152x192 152x256 152x320 160x64 160x192
160x256 168x64 168x128 168x192 168x256 176x64 176x128 176x192 176x256 184x64 184x128 184x192 184x256
192x64 192x192 192x256 200x64 200x128 200x192 208x64 208x128 208x192 216x64 216x128 216x192 224x64
224x128 224x192 232x64 232x128 232x192 240x64 240x128 240x192 248x64 248x128 248x192 256x192 264x64
264x128 272x64 272x128 280x64 280x128 288x64 288x128 296x64 296x128 304x64 304x128 312x64 312x128
320x64 320x128 328x64 328x128 336x64 336x128 344x64 344x128 352x64 352x128 360x64 360x128 368x64
368x128 376x64 376x128 384x64 384x128 392x64 400x64 408x64 416x64 424x64 432x64 440x64 448x64 456x64
464x64 472x64 480x64 488x64 496x64 504x64 520x64 528x64 536x64 544x64 552x64 560x64 568x64 576x64
584x64 592x64 600x64 608x64 616x64 624x64 632x64 640x64 648x64 656x64 664x64 672x64 680x64 688x64
696x64 704x64 712x64 720x64 728x64 736x64 744x64 752x64 760x64 768x64 64x16 64x24 64x40 64x48 64x56
64x72 64x80 64x88 64x104 64x112 64x120 64x136 64x144 64x152 64x160 64x168 64x176 64x184 64x200
64x208 64x216 64x224 64x232 64x240 64x248 64x264 64x272 64x280 64x288 64x296 64x304 64x312 64x328
64x336 64x344 64x352 64x360 64x368 64x376 64x392 64x400 64x408 64x416 64x424 64x432 64x440 64x456
64x464 64x472 64x480 64x488 64x496 64x504 64x520 64x528 64x536 64x544 64x552 64x560 64x568 64x584
64x592 64x600 64x608 64x616 64x624 64x632 64x648 64x656 64x664 64x672 64x680 64x688 64x696 64x712
64x720 64x728 64x736 64x744 64x752 64x760 128x8 128x16 128x24 128x40 128x48 128x56 128x72 128x80
128x88 128x104 128x112 128x120 128x136 128x144 128x152 128x168 128x176 128x184 128x200 128x208
128x216 128x224 128x232 128x240 128x248 128x264 128x272 128x280 128x288 128x296 128x304 128x312
128x328 128x336 128x344 128x352 128x360 128x368 128x376 128x392 128x400 128x408 128x416 128x424
128x432 128x440 128x448 128x456 128x464 128x472 128x480 128x488 128x496 128x504 128x512 192x8 192x16
192x24 192x32 192x40 192x48 192x56 192x72 192x80 192x88 192x96 192x104 192x112 192x120 192x136
192x144 192x152 192x160 192x168 192x176 192x184 192x200 192x208 192x216 192x224 192x232 192x240
192x248 192x264 192x272 192x280 192x288 192x296 192x304 192x312 192x320 192x328 192x336 256x8 256x16
256x24 256x40 256x48 256x56 256x72 256x80 256x88 256x96 256x104 256x112 256x120 256x136 256x144
256x152 256x160 256x168 256x176 256x184 256x200 256x208 256x216 256x224 256x232 256x240 256x248
256x256 320x8 320x16 320x24 320x32 320x40 320x48 320x56 320x72 320x80 320x88 320x96 320x104 320x112
320x120 320x136 320x144 320x152 320x160 320x168 320x176 320x184 320x192 320x200 384x8 384x16 384x24
384x32 384x40 384x48 384x56 384x72 384x80 384x88 384x96 384x104 384x112 384x120 384x136 384x144
384x152 384x160 384x168 448x8 448x16 448x24 448x32 448x40 448x48 448x56 448x72 448x80 448x88 448x96
448x104 448x112 448x120 448x128 448x136 448x144 512x8 512x16 512x24 512x32 512x40 512x48 512x56
512x72 512x80 512x88 512x96 512x104 512x112 512x120 512x128 576x8 576x16 576x24 576x32 576x40 576x48
576x56 576x72 576x80 576x88 576x96 576x104 576x112 640x8 640x16 640x24 640x32 640x40 640x48 640x56
640x72 640x80 640x88 640x96 704x8 704x16 704x24 704x32 704x40 704x48 704x56 704x72 704x80 704x88
768x8 768x16 768x24 768x32 768x40 768x48 768x56 768x72 768x80 256x512 256x1024 512x512 512x1024 4x1
8x1 16x1 24x1 32x1 40x1 48x1 64x1 128x1 192x1 256x1
""".split()
STAGES_NAMES = _pairs("""\
0:UNDEFINED 1:16x1 2:16x2 3:16x3 4:16x4 5:16x5 6:16x6 7:32x1 8:32x2 9:32x3 10:32x4 11:32x5 12:32x6
13:64x1 14:64x2 15:64x3 16:64x4 17:64x5 18:64x6 19:128x1 20:128x2 21:128x3 22:128x4 23:128x5
24:128x6 25:32x10 26:8x4 27:16x10 28:8x5 31:8x3 32:8xAUTO 33:16xAUTO 34:32xAUTO 35:64xAUTO
36:128xAUTO 37:256xAUTO 38:768xAUTO
""")
CLUSTER_NAMES = _pairs("""\
0:AUTO 2:1x1x1 3:2x1x1 4:4x1x1 5:1x2x1 6:2x2x1 7:4x2x1 8:1x4x1 9:2x4x1 10:4x4x1 11:8x1x1 12:1x8x1
13:8x2x1 14:2x8x1 15:16x1x1 16:1x16x1 17:3x1x1 18:5x1x1 19:6x1x1 20:7x1x1 21:9x1x1 22:10x1x1
23:11x1x1 24:12x1x1 25:13x1x1 26:14x1x1 27:15x1x1 28:3x2x1 29:5x2x1 30:6x2x1 31:7x2x1 32:1x3x1
33:2x3x1 34:3x3x1 35:4x3x1 36:5x3x1 37:3x4x1 38:1x5x1 39:2x5x1 40:3x5x1 41:1x6x1 42:2x6x1 43:1x7x1
44:2x7x1 45:1x9x1 46:1x10x1 47:1x11x1 48:1x12x1 49:1x13x1 50:1x14x1 51:1x15x1
""")
INNER_SHAPE_NAMES = _pairs("""\
0:UNDEFINED 1:MMA884 2:MMA1684 3:MMA1688 4:MMA16816
""")

# Element types: torch dtype name, cudaDataType_t, bytes per element.
DTYPES = {
    "e4m3": ("float8_e4m3fn", CUDA_R_8F_E4M3, 1),
    "e5m2": ("float8_e5m2", CUDA_R_8F_E5M2, 1),
    "bfloat16": ("bfloat16", CUDA_R_16BF, 2),
    "float16": ("float16", CUDA_R_16F, 2),
    "float32": ("float32", CUDA_R_32F, 4),
}
CUDA_TYPE_LOG_NAMES = {CUDA_R_32F: "R_32F", CUDA_R_16F: "R_16F", CUDA_R_16BF: "R_16BF",
                       CUDA_R_8F_E4M3: "R_8F_E4M3", CUDA_R_8F_E5M2: "R_8F_E5M2"}


# ---------------------------------------------------------------------------
# Cases and torch's mapping onto cuBLASLt
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One torch._scaled_mm call: a (M,K) row-major, b (K,N) column-major."""

    M: int
    N: int
    K: int
    a_dtype: str
    b_dtype: str
    out_dtype: str
    fast_accum: bool
    bias: bool
    scale_mode: str

    def torch_rejects(self) -> str | None:
        """Reason torch 2.11 refuses this call (_scaled_mm_out_cuda checks), else None."""
        if self.K % 16 or self.N % 16:
            return "K and N must be multiples of 16"
        if self.a_dtype == "e5m2" and self.b_dtype == "e5m2":
            return "e5m2 x e5m2 is not supported"
        if self.bias and self.out_dtype == "float32":
            return "bias is not supported with float32 output"
        return None


def torch_lt_plan(c: Case) -> dict:
    """The cuBLASLt problem torch builds for ``c``.

    cublasCommonArgs: out (M,N) is contiguous, so transpose_result=true and the
    GEMM runs as out^T = b^T a^T: cuBLASLt A is torch's mat2 (b), B is mat1 (a);
    transa='t', transb='n', m=N, n=M, k=K, lda=b.stride(1)=K, ldb=a.stride(0)=K,
    ldc=out.stride(0)=N; scale pointers are swapped the same way.
    scaled_gemm: Adesc(type(b), m, k, lda, t) -> layout (rows=K, cols=N, ld=K);
    Bdesc(type(a), k, n, ldb) -> (K, M, K); Cdesc(bias dtype, or out dtype when
    there is no bias) and Ddesc(out dtype) -> (N, M, N).
    """
    m, n, k = c.N, c.M, c.K
    out_t = DTYPES[c.out_dtype][1]
    # _scaled_gemm: bias ? bias->scalar_type() : isFloat8(out) ? Half : out;
    # torch requires bias dtype == out dtype for bf16/fp16 output.
    c_t = out_t
    return {
        "transa": CUBLAS_OP_T, "transb": CUBLAS_OP_N, "m": m, "n": n, "k": k,
        "A": (DTYPES[c.b_dtype][1], k, m, k),
        "B": (DTYPES[c.a_dtype][1], k, n, k),
        "C": (c_t, m, n, m),
        "D": (out_t, m, n, m),
        # get_scale_mode (CUDABlas.cpp): TensorWise -> SCALAR_32F, RowWise -> OUTER_VEC_32F;
        # rowwise: cuBLASLt A scale = torch scale_b (N floats), B scale = scale_a (M floats).
        "scale_mode": SCALE_MODE_OUTER_VEC_32F if c.scale_mode == "rowwise" else SCALE_MODE_SCALAR_32F,
        "bias_type": out_t if c.bias else None,
    }


#: What :func:`build_descs` sets, in words (written into the recording tool's JSON files).
CONFIG_DESCRIPTION = {
    "source": "torch 2.11 at::cuda::blas::scaled_gemm (CUDABlas.cpp) fed by cublasCommonArgs "
              "(cuBlasCommonArgs.h) from _scaled_mm_out_cuda/_scaled_gemm (ScaledBlas.cpp)",
    "operands": "torch a=(M,K) row-major, b=(K,N) column-major (b = b_t.t()), out=(M,N) row-major",
    "matmul_desc_create": {"computeType": "CUBLAS_COMPUTE_32F (68)", "scaleType": "CUDA_R_32F (0)"},
    "mapping": {"transa": "CUBLAS_OP_T", "transb": "CUBLAS_OP_N", "m": "N", "n": "M", "k": "K",
                "lda": "K", "ldb": "K", "ldc": "N",
                "A": "torch b: type(b), rows=K cols=N ld=K",
                "B": "torch a: type(a), rows=K cols=M ld=K",
                "C": "type(bias) if bias else type(out), rows=N cols=M ld=N",
                "D": "type(out), rows=N cols=M ld=N"},
    "desc_attributes_in_order": [
        "TRANSA(3)=int32 OP_T", "TRANSB(4)=int32 OP_N",
        "A_SCALE_POINTER(17)=device ptr (torch scale_b)", "B_SCALE_POINTER(18)=device ptr (torch scale_a)",
        "FAST_ACCUM(25)=int8 0|1",
        "if bias: BIAS_POINTER(8)=device ptr, EPILOGUE(7)=uint32 BIAS(4), BIAS_DATA_TYPE(26)=int32 cudaDataType",
        "A_SCALE_MODE(31), B_SCALE_MODE(32)=int32 SCALAR_32F(0) tensorwise | OUTER_VEC_32F(3) rowwise"],
    "not_set": ["D_SCALE_POINTER (only with an fp8 output scale)", "AMAX_D_POINTER", "POINTER_MODE",
                "SM_COUNT_TARGET (only with the SM carveout knob)", "EPILOGUE without bias",
                "preference MIN_ALIGNMENT_* (scaled_gemm sets none; bgemm does)",
                "preference REDUCTION_SCHEME_MASK"],
    "preference": "MAX_WORKSPACE_BYTES(1)=uint64 getCUDABlasLtWorkspaceSize()",
    "heuristic": "cublasLtMatmulAlgoGetHeuristic(..., Cdesc, Ddesc, pref, requestedAlgoCount=1); "
                 "torch uses result[0].algo",
}


# ---------------------------------------------------------------------------
# ctypes binding of libcublasLt
# ---------------------------------------------------------------------------
class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: opaque uint64_t data[8] (cublasLt.h)."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (cublasLt.h)."""

    _fields_ = [("algo", MatmulAlgo), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


class LtError(Exception):
    """A cuBLASLt call returned a non-success status."""

    def __init__(self, step: str, code: int):
        super().__init__(f"{step} -> {code} ({CUBLAS_STATUS_NAMES.get(code, '?')})")
        self.step, self.code = step, code


class CublasLt:
    """Thin ctypes wrapper over the libcublasLt entry points that cpemu and its recorders call."""

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path)
        vp, sz, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        pvp = ctypes.POINTER(ctypes.c_void_p)
        b = self._bind
        self.get_version = b("cublasLtGetVersion", sz, [])
        self.get_cudart_version = b("cublasLtGetCudartVersion", sz, [], optional=True)
        self.create = b("cublasLtCreate", i32, [pvp])
        self.destroy = b("cublasLtDestroy", i32, [vp])
        self.desc_create = b("cublasLtMatmulDescCreate", i32, [pvp, i32, i32])
        self.desc_destroy = b("cublasLtMatmulDescDestroy", i32, [vp])
        self.desc_set = b("cublasLtMatmulDescSetAttribute", i32, [vp, i32, vp, sz])
        self.layout_create = b("cublasLtMatrixLayoutCreate", i32,
                               [pvp, i32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64])
        self.layout_destroy = b("cublasLtMatrixLayoutDestroy", i32, [vp])
        self.pref_create = b("cublasLtMatmulPreferenceCreate", i32, [pvp])
        self.pref_destroy = b("cublasLtMatmulPreferenceDestroy", i32, [vp])
        self.pref_set = b("cublasLtMatmulPreferenceSetAttribute", i32, [vp, i32, vp, sz])
        self.get_heuristic = b("cublasLtMatmulAlgoGetHeuristic", i32,
                               [vp, vp, vp, vp, vp, vp, vp, i32,
                                ctypes.POINTER(HeuristicResult), ctypes.POINTER(ctypes.c_int)])
        self.algo_config_get = b("cublasLtMatmulAlgoConfigGetAttribute", i32,
                                 [ctypes.POINTER(MatmulAlgo), i32, vp, sz, ctypes.POINTER(sz)])
        palgo = ctypes.POINTER(MatmulAlgo)
        self.matmul = b("cublasLtMatmul", i32, [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, palgo,
                                                vp, sz, vp])
        self.algo_init = b("cublasLtMatmulAlgoInit", i32, [vp, i32, i32, i32, i32, i32, i32, i32, palgo])
        self.algo_config_set = b("cublasLtMatmulAlgoConfigSetAttribute", i32, [palgo, i32, vp, sz])
        self.algo_check = b("cublasLtMatmulAlgoCheck", i32,
                            [vp, vp, vp, vp, vp, vp, palgo, ctypes.POINTER(HeuristicResult)])

    def _bind(self, name, restype, argtypes, optional=False):
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            if optional:
                return None
            raise
        fn.restype, fn.argtypes = restype, argtypes
        return fn

    def version(self) -> int:
        return int(self.get_version())

    def cudart_version(self) -> int | None:
        return int(self.get_cudart_version()) if self.get_cudart_version else None

    @staticmethod
    def _check(step: str, code: int) -> None:
        if code != 0:
            raise LtError(step, code)

    def set_desc(self, desc, attr: int, value: ctypes._SimpleCData, step: str) -> None:
        self._check(step, self.desc_set(desc, attr, ctypes.byref(value), ctypes.sizeof(value)))

    def new_layout(self, spec: tuple[int, int, int, int], step: str) -> ctypes.c_void_p:
        dtype, rows, cols, ld = spec
        lay = ctypes.c_void_p()
        self._check(step, self.layout_create(ctypes.byref(lay), dtype, rows, cols, ld))
        return lay

    def read_algo(self, algo: MatmulAlgo) -> dict:
        """All CUBLASLT_ALGO_CONFIG_* values of ``algo``; None where a query fails."""
        out = {}
        for name, attr, signed in ALGO_CONFIG_FIELDS:
            try:
                need = ctypes.c_size_t(0)
                st = self.algo_config_get(ctypes.byref(algo), attr, None, 0, ctypes.byref(need))
                size = need.value if st == 0 and 0 < need.value <= 8 else (2 if attr >= 7 else 4)
                buf = (ctypes.c_uint8 * size)()
                written = ctypes.c_size_t(0)
                st = self.algo_config_get(ctypes.byref(algo), attr, buf, size, ctypes.byref(written))
                out[name] = int.from_bytes(bytes(buf), "little", signed=signed) if st == 0 else None
            except Exception:  # noqa: BLE001 - record, never crash
                out[name] = None
        return out


def describe_algo(cfg: dict) -> dict:
    """Readable names for the id fields of an algo config."""
    def pick(table, key):
        v = cfg.get(key)
        if v is None:
            return None
        if isinstance(table, list):
            return table[v] if 0 <= v < len(table) else f"#{v}"
        return table.get(v, f"#{v}")
    return {"tile": pick(TILE_NAMES, "tile_id"), "stages": pick(STAGES_NAMES, "stages_id"),
            "cluster_shape": pick(CLUSTER_NAMES, "cluster_shape_id"),
            "inner_shape": pick(INNER_SHAPE_NAMES, "inner_shape_id"),
            "reduction": pick(REDUCTION_NAMES, "reduction_scheme")}


def build_descs(lt: CublasLt, c: Case, ptrs: dict, workspace_bytes: int) -> dict:
    """Create desc, layouts and preference exactly as scaled_gemm does; caller destroys."""
    p = torch_lt_plan(c)
    made = {"desc": None, "A": None, "B": None, "C": None, "D": None, "pref": None}
    try:
        desc = ctypes.c_void_p()
        lt._check("MatmulDescCreate", lt.desc_create(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F))
        made["desc"] = desc
        lt.set_desc(desc, DESC_TRANSA, ctypes.c_int32(p["transa"]), "set TRANSA")
        lt.set_desc(desc, DESC_TRANSB, ctypes.c_int32(p["transb"]), "set TRANSB")
        lt.set_desc(desc, DESC_A_SCALE_POINTER, ctypes.c_void_p(ptrs["scale_a"]), "set A_SCALE_POINTER")
        lt.set_desc(desc, DESC_B_SCALE_POINTER, ctypes.c_void_p(ptrs["scale_b"]), "set B_SCALE_POINTER")
        lt.set_desc(desc, DESC_FAST_ACCUM, ctypes.c_int8(1 if c.fast_accum else 0), "set FAST_ACCUM")
        for key in ("A", "B", "C", "D"):
            made[key] = lt.new_layout(p[key], f"MatrixLayoutCreate {key}")
        if c.bias:
            lt.set_desc(desc, DESC_BIAS_POINTER, ctypes.c_void_p(ptrs["bias"]), "set BIAS_POINTER")
            lt.set_desc(desc, DESC_EPILOGUE, ctypes.c_uint32(CUBLASLT_EPILOGUE_BIAS), "set EPILOGUE")
            lt.set_desc(desc, DESC_BIAS_DATA_TYPE, ctypes.c_int32(p["bias_type"]), "set BIAS_DATA_TYPE")
        lt.set_desc(desc, DESC_A_SCALE_MODE, ctypes.c_int32(p["scale_mode"]), "set A_SCALE_MODE")
        lt.set_desc(desc, DESC_B_SCALE_MODE, ctypes.c_int32(p["scale_mode"]), "set B_SCALE_MODE")
        pref = ctypes.c_void_p()
        lt._check("MatmulPreferenceCreate", lt.pref_create(ctypes.byref(pref)))
        made["pref"] = pref
        ws = ctypes.c_uint64(workspace_bytes)
        lt._check("set MAX_WORKSPACE_BYTES",
                  lt.pref_set(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), ctypes.sizeof(ws)))
    except Exception:
        destroy_descs(lt, made)
        raise
    return made


def destroy_descs(lt: CublasLt, made: dict) -> None:
    """Destroy whatever build_descs created (errors ignored)."""
    for key in ("A", "B", "C", "D"):
        if made.get(key) is not None:
            lt.layout_destroy(made[key])
    if made.get("pref") is not None:
        lt.pref_destroy(made["pref"])
    if made.get("desc") is not None:
        lt.desc_destroy(made["desc"])


# ---------------------------------------------------------------------------
# Finding the library
# ---------------------------------------------------------------------------
LT_NAMES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")


def _site_dirs() -> list[str]:
    dirs = []
    try:
        dirs += site.getsitepackages()
    except Exception:  # noqa: BLE001
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:  # noqa: BLE001
        pass
    dirs += [p for p in sys.path if p]
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def candidate_paths(names: tuple[str, ...], subdirs: tuple[str, ...]) -> list[str]:
    """Existing files named ``names`` in torch/lib, ``subdirs`` of the site folders, CUDA_HOME, CUDA_PATH."""
    roots = []
    try:
        spec = importlib.util.find_spec("torch") if "torch" not in sys.modules else None
    except (ImportError, ValueError):
        spec = None
    torch_dir = (os.path.dirname(sys.modules["torch"].__file__) if "torch" in sys.modules
                 else (os.path.dirname(spec.origin) if spec and spec.origin else None))
    if torch_dir:
        roots.append(os.path.join(torch_dir, "lib"))
    for d in _site_dirs():
        roots += [os.path.join(d, s) for s in subdirs]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots.append(os.path.join(os.environ[env], "lib64"))
    roots.append("/usr/local/cuda/lib64")
    out = []
    for r in roots:
        for n in names:
            p = os.path.join(r, n)
            if os.path.exists(p) and p not in out:
                out.append(p)
    return out


def loaded_libs(fragment: str) -> list[str]:
    """Paths of mapped shared objects whose file name contains ``fragment``."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and fragment in os.path.basename(parts[-1]):
                    if parts[-1] not in out:
                        out.append(parts[-1])
    except OSError:
        pass
    return out


def find_cublaslt(explicit: str | None) -> tuple[str, str, list[str]]:
    """(path, how found, tried) of the libcublasLt to load; already-loaded wins."""
    tried = []
    if explicit:
        return explicit, "--lib", tried
    loaded = loaded_libs("libcublasLt.so")
    if loaded:
        return loaded[0], "/proc/self/maps (already loaded by torch)", tried
    for p in candidate_paths(LT_NAMES, ("nvidia/cu13/lib", "nvidia/cublas/lib", "torch/lib")):
        tried.append(p)
        try:
            ctypes.CDLL(p)
            return p, "search path", tried
        except OSError:
            continue
    for n in [ctypes.util.find_library("cublasLt")] + list(LT_NAMES):
        if not n:
            continue
        tried.append(n)
        try:
            ctypes.CDLL(n)
            return n, "dlopen by name", tried
        except OSError:
            continue
    raise click.ClickException(f"no libcublasLt could be loaded; tried {tried}")


def load(explicit: str | None = None) -> CublasLt:
    """The binding of the libcublasLt :func:`find_cublaslt` picks (torch's own when torch loaded one)."""
    path, _how, _tried = find_cublaslt(explicit)
    return CublasLt(path)

