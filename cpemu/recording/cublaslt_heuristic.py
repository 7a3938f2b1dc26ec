#!/usr/bin/env python3
"""Ask cuBLASLt's heuristic which algorithm ``torch._scaled_mm`` gets on CUDA.

Split-K and tile choices made by ``cublasLtMatmulAlgoGetHeuristic`` change the
output bits of an FP8 GEMM, so this tool rebuilds, through ``ctypes``, the exact
descriptors that torch builds in ``at::cuda::blas::scaled_gemm``
(aten/src/ATen/cuda/CUDABlas.cpp) for the operands prepared by
``cublasCommonArgs`` (aten/src/ATen/native/cuda/cuBlasCommonArgs.h) and
``_scaled_mm_out_cuda`` / ``_scaled_gemm`` (aten/src/ATen/native/cuda/ScaledBlas.cpp),
then asks the heuristic for its top-1 answer, as torch does.

Subcommands:
  query      heuristic answers for a grid or list of shapes (no GEMM is run).
  torch-log  runs real ``torch._scaled_mm`` in child processes with cuBLASLt's
             API log enabled, parses the algorithm torch really used, and (by
             default) compares it with a ``query`` made in the same process.
  grids      lists the built-in grids.
  selftest   checks struct layouts, enum tables and, if a libcublasLt is found,
             that every descriptor attribute is accepted (no GPU needed).

Nothing touches CUDA at import time. See tools/CUBLASLT_HEURISTIC.md.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import json
import os
import re
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import click

TOOL = "cublaslt_heuristic"
TOOL_VERSION = 1

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
SCALE_MODE_SCALAR_32F = 0  # cublasLtMatmulMatrixScale_t
SCALE_MODE_OUTER_VEC_32F = 3
PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t, uint64_t
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
_TILE_NAMES = """\
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
_STAGES_NAMES = _pairs("""\
0:UNDEFINED 1:16x1 2:16x2 3:16x3 4:16x4 5:16x5 6:16x6 7:32x1 8:32x2 9:32x3 10:32x4 11:32x5 12:32x6
13:64x1 14:64x2 15:64x3 16:64x4 17:64x5 18:64x6 19:128x1 20:128x2 21:128x3 22:128x4 23:128x5
24:128x6 25:32x10 26:8x4 27:16x10 28:8x5 31:8x3 32:8xAUTO 33:16xAUTO 34:32xAUTO 35:64xAUTO
36:128xAUTO 37:256xAUTO 38:768xAUTO
""")
_CLUSTER_NAMES = _pairs("""\
0:AUTO 2:1x1x1 3:2x1x1 4:4x1x1 5:1x2x1 6:2x2x1 7:4x2x1 8:1x4x1 9:2x4x1 10:4x4x1 11:8x1x1 12:1x8x1
13:8x2x1 14:2x8x1 15:16x1x1 16:1x16x1 17:3x1x1 18:5x1x1 19:6x1x1 20:7x1x1 21:9x1x1 22:10x1x1
23:11x1x1 24:12x1x1 25:13x1x1 26:14x1x1 27:15x1x1 28:3x2x1 29:5x2x1 30:6x2x1 31:7x2x1 32:1x3x1
33:2x3x1 34:3x3x1 35:4x3x1 36:5x3x1 37:3x4x1 38:1x5x1 39:2x5x1 40:3x5x1 41:1x6x1 42:2x6x1 43:1x7x1
44:2x7x1 45:1x9x1 46:1x10x1 47:1x11x1 48:1x12x1 49:1x13x1 50:1x14x1 51:1x15x1
""")
_INNER_SHAPE_NAMES = _pairs("""\
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
OUT_DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
                     "half": "float16", "float16": "float16", "fp32": "float32",
                     "float": "float32", "float32": "float32"}
IN_DTYPE_PAIRS = ("e4m3,e4m3", "e4m3,e5m2", "e5m2,e4m3")
SCALE_MODES = ("tensorwise", "rowwise")

# ---------------------------------------------------------------------------
# Built-in grids
# ---------------------------------------------------------------------------
_WIDE_M = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
           2048, 3072, 4096, 6144, 8192, 12288, 16384]
_WIDE_NK = [16, 32, 64, 128, 256, 512, 1024, 1920, 2048, 4096, 5760, 8192, 12288, 16384]
_DENSE_M = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512]
_DENSE_N = [16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
_DENSE_K = [512, 1024, 1536, 1920, 2048, 2560, 3072, 4096, 5120, 5760, 6144, 8192, 10240,
            12288, 14336, 16384]
EVO2_NK = [(5760, 1920), (12288, 4096)]  # (N, K) of the Evo 2 projections in scope
_SMOKE = [(m, n, k) for m in (1, 16, 128, 1024, 8192) for n, k in EVO2_NK] + [
    (16, 16, 32), (64, 256, 16384), (32, 128, 8192), (4096, 4096, 4096)]

GRIDS = {
    "smoke": "Evo 2 (N,K) pairs at five M plus four probes (14 shapes).",
    "wide": "M in 24 values 1..16384, N and K in 14 values 16..16384 incl. 1920/5760/12288.",
    "dense-splitk": "small M (1..512) x small N (16..2048) x large K (512..16384).",
}


def grid_shapes(name: str) -> list[tuple[int, int, int]]:
    """Shapes (M, N, K) of a built-in grid, in a stable order."""
    if name == "smoke":
        return list(_SMOKE)
    if name == "wide":
        return [(m, n, k) for m in _WIDE_M for n in _WIDE_NK for k in _WIDE_NK]
    if name == "dense-splitk":
        return [(m, n, k) for m in _DENSE_M for n in _DENSE_N for k in _DENSE_K]
    raise click.BadParameter(f"unknown grid {name!r}; known: {', '.join(GRIDS)}")


def load_shapes_file(path: str) -> list[tuple[int, int, int]]:
    """A JSON list of [M, N, K] triples or of {"M":..,"N":..,"K":..} objects."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "shapes" in data:
        data = data["shapes"]
    out = []
    for item in data:
        if isinstance(item, dict):
            m, n, k = item["M"], item["N"], item["K"]
        else:
            m, n, k = item
        m, n, k = int(m), int(n), int(k)
        if min(m, n, k) <= 0:
            raise click.BadParameter(f"non-positive shape {item!r} in {path}")
        out.append((m, n, k))
    return out


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
    """Thin ctypes wrapper over the libcublasLt entry points this tool needs."""

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
    return {"tile": pick(_TILE_NAMES, "tile_id"), "stages": pick(_STAGES_NAMES, "stages_id"),
            "cluster_shape": pick(_CLUSTER_NAMES, "cluster_shape_id"),
            "inner_shape": pick(_INNER_SHAPE_NAMES, "inner_shape_id"),
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


EMPTY_ALGO = {name: None for name in ALGO_FIELD_NAMES}


def query_case(lt: CublasLt, handle: ctypes.c_void_p, c: Case, ptrs: dict,
               workspace_bytes: int, top: int = 1) -> dict:
    """One heuristic query; returns a JSON row (status recorded, never raises)."""
    row = asdict(c)
    row.update({"status": None, "status_code": None, "returned_count": None, **EMPTY_ALGO,
                "workspace_size": None, "waves_count": None, "result_state": None})
    reject = c.torch_rejects()
    if reject:
        row["torch_rejects"] = reject
    made = None
    try:
        made = build_descs(lt, c, ptrs, workspace_bytes)
        n = max(1, int(top))
        results = (HeuristicResult * n)()
        count = ctypes.c_int(0)
        st = lt.get_heuristic(handle, made["desc"], made["A"], made["B"], made["C"], made["D"],
                              made["pref"], n, results, ctypes.byref(count))
        row["status_code"], row["returned_count"] = int(st), int(count.value)
        if st != 0:
            row["status"] = f"HEURISTIC_{CUBLAS_STATUS_NAMES.get(st, st)}"
            return row
        if count.value <= 0:
            row["status"] = "NO_ALGO"  # torch raises CUBLAS_STATUS_NOT_SUPPORTED here
            return row
        ranked = []
        for i in range(min(count.value, n)):
            r = results[i]
            item = lt.read_algo(r.algo)
            item.update(workspace_size=int(r.workspaceSize), waves_count=float(r.wavesCount),
                        result_state=int(r.state), names=describe_algo(item))
            ranked.append(item)
        row.update(ranked[0])
        row["status"] = "OK" if ranked[0]["result_state"] == 0 else \
            f"STATE_{CUBLAS_STATUS_NAMES.get(ranked[0]['result_state'], ranked[0]['result_state'])}"
        if n > 1:
            row["alternatives"] = ranked[1:]
    except LtError as e:
        row["status"], row["status_code"], row["error"] = "DESC_ERROR", e.code, str(e)
    except Exception as e:  # noqa: BLE001
        row["status"], row["error"] = "EXCEPTION", f"{type(e).__name__}: {e}"
    finally:
        if made is not None:
            destroy_descs(lt, made)
    return row


# ---------------------------------------------------------------------------
# Finding the library, the device and device pointers
# ---------------------------------------------------------------------------
LT_NAMES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


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


def _candidate_paths(names: tuple[str, ...], subdirs: tuple[str, ...]) -> list[str]:
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
    for p in _candidate_paths(LT_NAMES, ("nvidia/cu13/lib", "nvidia/cublas/lib", "torch/lib")):
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


def _force_torch_cublaslt(torch) -> str | None:
    """Make torch load its cuBLAS/cuBLASLt (tiny FP8 GEMM); returns an error text or None."""
    err = None
    try:
        dev = torch.device("cuda")
        a = torch.zeros(16, 32, device=dev).to(torch.float8_e4m3fn)
        b = torch.zeros(16, 32, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev, dtype=torch.float32)
        torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
        try:
            x = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
            torch.matmul(x, x)
        except Exception as e2:  # noqa: BLE001
            err += f"; bf16 matmul: {e2}"
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass
    return err


class Cudart:
    """Minimal libcudart binding (cudaMalloc/cudaFree/attributes) for the no-torch path."""

    def __init__(self):
        cands = _candidate_paths(CUDART_NAMES, ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib",
                                                "torch/lib"))
        cands += [n for n in [ctypes.util.find_library("cudart")] if n] + list(CUDART_NAMES)
        self.lib, self.path = None, None
        for p in cands:
            try:
                self.lib, self.path = ctypes.CDLL(p), p
                break
            except OSError:
                continue
        if self.lib is None:
            raise OSError("libcudart not found")
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                                    ctypes.c_int]

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        st = self.lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
        if st != 0:
            raise OSError(f"cudaMalloc({nbytes}) -> {st}")
        return int(p.value)

    def attr(self, attr: int) -> int | None:
        v = ctypes.c_int(0)
        return v.value if self.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, 0) == 0 else None

    def device_name(self) -> str | None:
        buf = ctypes.create_string_buffer(16384)  # far larger than any cudaDeviceProp
        for fn in ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"):
            f = getattr(self.lib, fn, None)
            if f is not None and f(buf, 0) == 0:
                return buf.value.decode(errors="replace")  # name[256] is the first member
        return None


class Runtime:
    """Library, device info, handle and small device buffers for queries."""

    def __init__(self, use_torch: str = "auto", lib: str | None = None, handle: str = "auto",
                 pointers: str = "auto"):
        self.torch = None
        self.info: dict = {"torch_version": None, "torch_force_load_error": None}
        if use_torch in ("auto", "yes"):
            try:
                import torch  # noqa: PLC0415 - optional, GPU machine only
                if not torch.cuda.is_available():
                    raise RuntimeError("torch.cuda.is_available() is False")
                self.torch = torch
                self.info["torch_version"] = torch.__version__
                self.info["torch_cuda_version"] = torch.version.cuda
                self.info["torch_force_load_error"] = _force_torch_cublaslt(torch)
            except Exception as e:  # noqa: BLE001
                if use_torch == "yes":
                    raise click.ClickException(f"torch requested but unusable: {e}")
                self.info["torch_unusable"] = f"{type(e).__name__}: {e}"
                self.torch = None
        path, how, tried = find_cublaslt(lib)
        self.lt = CublasLt(path)
        self.info.update(library_path=os.path.realpath(path) if os.path.exists(path) else path,
                         library_found_by=how, cublaslt_version=self.lt.version(),
                         cublaslt_cudart_version=self.lt.cudart_version(),
                         loaded_cublaslt_in_process=loaded_libs("libcublasLt.so"))
        if tried:
            self.info["library_search_tried"] = tried
        distinct = {os.path.realpath(p) for p in self.info["loaded_cublaslt_in_process"]}
        if len(distinct) > 1:
            _echo(f"WARNING: several libcublasLt are mapped in this process: {sorted(distinct)}")
        self.cudart = None
        if self.torch is not None:
            props = self.torch.cuda.get_device_properties(self.torch.cuda.current_device())
            self.info.update(device_name=props.name, sm_count=props.multi_processor_count,
                             compute_capability=f"{props.major}.{props.minor}")
        else:
            try:
                self.cudart = Cudart()
                self.info.update(cudart_path=self.cudart.path, device_name=self.cudart.device_name(),
                                 sm_count=self.cudart.attr(16),  # cudaDevAttrMultiProcessorCount
                                 compute_capability=f"{self.cudart.attr(75)}.{self.cudart.attr(76)}")
            except OSError as e:
                self.info.update(device_name=None, sm_count=None, cudart_error=str(e))
        self._handle_mode, self._pointer_mode = handle, pointers
        self.handle, self._own_handle = None, False
        self._keep: list = []
        self._ptrs: dict | None = None

    def open_handle(self) -> None:
        """torch's own cuBLAS handle (valid as a cublasLtHandle_t) or a fresh cublasLtCreate one."""
        # Only safe when our libcublasLt is the instance torch itself loaded.
        torch_lib = self.info["library_found_by"].startswith("/proc")
        want_torch = self._handle_mode == "torch" or (
            self._handle_mode == "auto" and self.torch is not None and torch_lib)
        if want_torch:
            if self.torch is None or not torch_lib:
                raise click.ClickException("--handle torch needs torch and torch's own libcublasLt")
            try:
                self.handle = ctypes.c_void_p(int(self.torch.cuda.current_blas_handle()))
                self.info["handle"] = "torch.cuda.current_blas_handle() (getCurrentCUDABlasLtHandle on CUDA)"
                return
            except Exception as e:  # noqa: BLE001
                if self._handle_mode == "torch":
                    raise click.ClickException(f"torch.cuda.current_blas_handle() failed: {e}")
                self.info["torch_handle_error"] = f"{type(e).__name__}: {e}"
        h = ctypes.c_void_p()
        st = self.lt.create(ctypes.byref(h))
        if st != 0:
            raise click.ClickException(f"cublasLtCreate failed: {st} ({CUBLAS_STATUS_NAMES.get(st, '?')}); "
                                       "is a GPU visible?")
        self.handle, self._own_handle = h, True
        self.info["handle"] = "cublasLtCreate"

    def pointers(self, max_m: int, max_n: int) -> dict:
        """Device pointers for the A/B scales and the bias (>=256-byte aligned)."""
        if self._ptrs is not None:
            return self._ptrs
        sizes = {"scale_a": 4 * max(1, max_n), "scale_b": 4 * max(1, max_m), "bias": 4 * max(1, max_n)}
        sizes = {k: (v + 511) // 512 * 512 for k, v in sizes.items()}
        mode = self._pointer_mode
        ptrs = {}
        if mode in ("auto", "torch") and self.torch is not None:
            for k, nbytes in sizes.items():
                t = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
                self._keep.append(t)
                ptrs[k] = int(t.data_ptr())
            self.info["pointers"] = "torch caching allocator"
        elif mode in ("auto", "cudart"):
            try:
                cr = self.cudart or Cudart()
                for k, nbytes in sizes.items():
                    ptrs[k] = cr.malloc(nbytes)
                self.info["pointers"] = "cudaMalloc"
            except OSError as e:
                if mode == "cudart":
                    raise click.ClickException(str(e))
                ptrs = {}
        if not ptrs:
            # The heuristic never dereferences these; it only reads their alignment
            # (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER note).
            base = 0x7F0000000000
            ptrs = {k: base + i * 0x1000000 for i, k in enumerate(sizes)}
            self.info["pointers"] = "synthetic 256-byte-aligned addresses (no allocator available)"
        self.info["pointer_alignment"] = {k: _alignment(v) for k, v in ptrs.items()}
        self._ptrs = ptrs
        return ptrs

    def close(self) -> None:
        if self._own_handle and self.handle is not None:
            self.lt.destroy(self.handle)
        self.handle = None


def _alignment(addr: int) -> int:
    """Largest power of two <= 256 dividing addr (CUDABlas.cpp _getAlignment)."""
    a = 256
    while a > 1 and addr % a:
        a //= 2
    return a


# ---------------------------------------------------------------------------
# Workspace size
# ---------------------------------------------------------------------------
def _check_env_true(name: str) -> bool | None:
    """c10::utils::check_env: None if unset, True/False for 1/0-like values."""
    v = os.environ.get(name)
    if v is None:
        return None
    return v.strip().lower() in ("1", "true", "yes", "on", "y")


def mirrored_workspace_bytes(policy: str, cc_major: int | None) -> int:
    """getCUDABlasLtWorkspaceSize (CublasHandlePool.cpp), two revisions.

    'legacy': parseCUDABlasLtWorkspaceSize default 1024 KiB (CUBLASLT_WORKSPACE_SIZE in
    KiB), clamped to the cuBLAS workspace when unified (default on outside FBCODE).
    'unified': later revision where the unified default is the cuBLAS workspace
    (parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG, else 32 MiB on sm_90).
    """
    sm90 = cc_major == 9
    cublas = 4096 * 8 * 1024 if sm90 else 4096 * 1024 * 2 + 16 * 1024 * 8
    cfg = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if cfg:
        pairs = re.findall(r":([0-9]+):([0-9]+)", cfg)
        if pairs:
            cublas = sum(int(s) * 1024 * int(c) for s, c in pairs)
    unified_env = _check_env_true("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    unified = unified_env is None or unified_env is True
    lt_kib = (cublas // 1024) if (policy == "unified" and unified) else 1024
    if os.environ.get("CUBLASLT_WORKSPACE_SIZE"):
        try:
            lt_kib = int(os.environ["CUBLASLT_WORKSPACE_SIZE"])
        except ValueError:
            pass
    size = lt_kib * 1024
    if unified and cublas < size:
        size = cublas
    return size


# ---------------------------------------------------------------------------
# cuBLASLt log parsing (CUBLASLT_LOG_LEVEL / _MASK / _FILE)
# ---------------------------------------------------------------------------
LOG_LINE_RE = re.compile(r"\[cublasLt\]\[(?P<pid>\d+)\]\[(?P<kind>[A-Za-z]+)\]\[(?P<fn>[A-Za-z0-9_]+)\]\s?(?P<msg>.*)")
BRACKET_RE = re.compile(r"(\w+)=\[([^\]]*)\]")
HEX_RE = re.compile(r"0[xX][0-9a-fA-F]+")
MARK_COLS = 7777  # layouts of this width are position markers written by the child
MARK_TORCH, MARK_QUERY = 100_000_000, 200_000_000  # int32-safe row counts
MARK_RE = re.compile(r"rows=(\d+) cols=%d\b" % MARK_COLS)


def parse_log_lines(lines) -> list[dict]:
    """Events: markers, heuristic API calls and executed matmuls, in log order."""
    events = []
    for raw in lines:
        m = LOG_LINE_RE.search(raw)
        if not m:
            continue
        fn, kind, msg = m.group("fn"), m.group("kind"), m.group("msg")
        if fn == "cublasLtMatrixLayoutCreate":
            mk = MARK_RE.search(msg)
            if mk:
                events.append({"type": "mark", "value": int(mk.group(1))})
            continue
        if fn.endswith("AlgoGetHeuristic") and kind == "Api" and "Adesc=" in msg:
            events.append({"type": "heur", "kind": kind, "fn": fn, "raw": raw.rstrip("\n")})
        elif fn.endswith("Matmul") and "algo=[" in msg:
            events.append({"type": "mm", "kind": kind, "fn": fn, "raw": raw.rstrip("\n")})
    return events


def parse_heuristic_line(raw: str) -> dict:
    """Bracketed descriptors of a heuristic API line, pointers normalized."""
    msg = LOG_LINE_RE.search(raw).group("msg")
    descs = {k: HEX_RE.sub("PTR", v).strip() for k, v in BRACKET_RE.findall(msg)}
    ws = re.search(r"maxWorkspaceSizeinBytes=(\d+)", msg, re.I)
    return {"descs": descs, "max_workspace_bytes": int(ws.group(1)) if ws else None}


_ALGO_LOG_DEFAULTS = {"tile_id": 0, "stages_id": 0, "splitk_num": 1, "reduction_scheme": 0,
                      "cta_swizzling": 0, "custom_option": 0, "inner_shape_id": 0, "cluster_shape_id": 0}


def _lookup(table, text: str, prefix: str):
    name = text[len(prefix):] if text.startswith(prefix) else text
    if isinstance(table, list):
        return table.index(name) if name in table else None
    for k, v in table.items():
        if v == name:
            return k
    return int(name) if name.lstrip("-").isdigit() else None


def parse_matmul_line(raw: str) -> dict:
    """Algo fields of an executed cublasLtMatmul log line (omitted fields take defaults)."""
    msg = LOG_LINE_RE.search(raw).group("msg")
    m = re.search(r"algo=\[([^\]]*)\]", msg)
    fields = dict(re.findall(r"(\w+)=(\S+)", m.group(1))) if m else {}
    out, present = dict(_ALGO_LOG_DEFAULTS), []
    out["algo_id"] = None
    for key, val in fields.items():
        kl = key.lower()
        try:
            if kl == "algoid":
                out["algo_id"], f = int(val), "algo_id"
            elif kl == "tile":
                out["tile_id"], f = _lookup(_TILE_NAMES, val, "MATMUL_TILE_"), "tile_id"
            elif kl == "stages":
                out["stages_id"], f = _lookup(_STAGES_NAMES, val, "MATMUL_STAGES_"), "stages_id"
            elif kl.startswith("cluster"):
                out["cluster_shape_id"], f = _lookup(_CLUSTER_NAMES, val, "CLUSTER_SHAPE_"), "cluster_shape_id"
            elif kl.startswith("inner"):
                out["inner_shape_id"], f = _lookup(_INNER_SHAPE_NAMES, val, "MATMUL_INNER_SHAPE_"), "inner_shape_id"
            elif kl.startswith("customoption"):
                out["custom_option"], f = int(val), "custom_option"
            elif "split" in kl:
                out["splitk_num"], f = int(val), "splitk_num"
            elif kl.startswith("reduction"):
                out["reduction_scheme"], f = _lookup(REDUCTION_NAMES, val, "REDUCTION_SCHEME_"), "reduction_scheme"
            elif "swizzl" in kl:
                out["cta_swizzling"], f = int(val), "cta_swizzling"
            else:
                continue
            present.append(f)
        except (ValueError, TypeError):
            continue
    ws = re.search(r"workSpaceSizeInBytes=(\d+)", msg)
    out.update(algo_fields=fields, log_fields_present=present,
               torch_workspace_arg=int(ws.group(1)) if ws else None)
    return out


# ---------------------------------------------------------------------------
# Child process for torch-log (and the workspace probe)
# ---------------------------------------------------------------------------
def _torch_dtype(torch, name: str):
    return getattr(torch, DTYPES[name][0])


def _run_torch_case(torch, c: Case) -> None:
    """One real torch._scaled_mm with a (M,K) row-major, b (K,N) column-major."""
    dev = torch.device("cuda")
    a = torch.empty(c.M, c.K, dtype=torch.uint8, device=dev).fill_(0x38).view(_torch_dtype(torch, c.a_dtype))
    b = torch.empty(c.N, c.K, dtype=torch.uint8, device=dev).fill_(0x38).view(_torch_dtype(torch, c.b_dtype)).t()
    if c.scale_mode == "rowwise":
        sa = torch.ones(c.M, 1, device=dev, dtype=torch.float32)
        sb = torch.ones(1, c.N, device=dev, dtype=torch.float32)
    else:
        sa = torch.ones((), device=dev, dtype=torch.float32)
        sb = torch.ones((), device=dev, dtype=torch.float32)
    out_dtype = _torch_dtype(torch, c.out_dtype)
    bias = torch.zeros(c.N, device=dev, dtype=out_dtype) if c.bias else None
    torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype, use_fast_accum=c.fast_accum)


def child_main(job_path: str, out_path: str) -> None:
    """Runs inside a child whose environment enables cuBLASLt logging."""
    with open(job_path) as f:
        job = json.load(f)
    cases = [Case(**d) for d in job["cases"]]
    res: dict = {"torch": [], "query": [], "errors": []}
    rt = None
    try:
        rt = Runtime(use_torch="yes", lib=job.get("lib"), handle=job.get("handle", "auto"))
        torch = rt.torch
        res["info"] = rt.info
        lt = rt.lt

        def mark(value: int) -> None:
            lay = ctypes.c_void_p()
            if lt.layout_create(ctypes.byref(lay), CUDA_R_32F, value, MARK_COLS, value) == 0:
                lt.layout_destroy(lay)

        for i, c in enumerate(cases):
            mark(MARK_TORCH + i)
            try:
                _run_torch_case(torch, c)
                torch.cuda.synchronize()
                res["torch"].append({"i": i, "ok": True})
            except Exception as e:  # noqa: BLE001
                res["torch"].append({"i": i, "ok": False, "error": f"{type(e).__name__}: {e}"})
        if job.get("with_query") and job.get("workspace_bytes") is not None:
            rt.open_handle()
            ptrs = rt.pointers(max(c.M for c in cases), max(c.N for c in cases))
            for i, c in enumerate(cases):
                mark(MARK_QUERY + i)
                res["query"].append(query_case(lt, rt.handle, c, ptrs, int(job["workspace_bytes"])))
            res["info"] = rt.info
    except BaseException as e:  # noqa: BLE001 - always leave a result file
        res["errors"].append(f"{type(e).__name__}: {e}")
    finally:
        if rt is not None:
            try:
                rt.close()
            except Exception:  # noqa: BLE001
                pass
        _write_json_atomic(out_path, res)


def run_child(cases: list[Case], workdir: str, tag: str, *, with_query: bool,
              workspace_bytes: int | None, lib: str | None, handle: str, log_level: int,
              log_mask: int | None, timeout: float) -> tuple[dict, list[str], dict]:
    """Spawn a logged child; returns (child result, log lines, process info)."""
    job = os.path.join(workdir, f"{tag}.job.json")
    out = os.path.join(workdir, f"{tag}.out.json")
    log = os.path.join(workdir, f"{tag}.cublaslt.log")
    _write_json_atomic(job, {"cases": [asdict(c) for c in cases], "with_query": with_query,
                             "workspace_bytes": workspace_bytes, "lib": lib, "handle": handle})
    env = dict(os.environ)
    env.update(CUBLASLT_LOG_LEVEL=str(log_level), CUBLASLT_LOG_FILE=log, PYTHONUNBUFFERED="1")
    if log_mask is not None:
        env["CUBLASLT_LOG_MASK"] = str(log_mask)
    cmd = [sys.executable, os.path.abspath(__file__), "_torch-child", "--job", job, "--out", out]
    t0 = time.time()
    pinfo = {"cmd": cmd, "returncode": None, "seconds": None, "stderr_tail": None}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        pinfo["returncode"] = p.returncode
        pinfo["stderr_tail"] = p.stderr[-4000:]
        stdout = p.stdout
    except subprocess.TimeoutExpired as e:
        pinfo["returncode"] = "timeout"
        stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    pinfo["seconds"] = round(time.time() - t0, 2)
    result = {}
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    lines: list[str] = []
    if os.path.exists(log) and os.path.getsize(log) > 0:
        with open(log, errors="replace") as f:
            lines = f.readlines()
        pinfo["log_source"] = "CUBLASLT_LOG_FILE"
    elif stdout:
        lines = stdout.splitlines()  # file not honoured: cuBLASLt logs to stdout
        pinfo["log_source"] = "child stdout"
    pinfo["log_lines"] = len(lines)
    return result, lines, pinfo


def probe_torch_workspace(workdir: str, lib: str | None, timeout: float) -> tuple[int | None, dict]:
    """Max workspace bytes torch passes to the heuristic, read from its own cuBLASLt log."""
    c = Case(16, 16, 32, "e4m3", "e4m3", "bfloat16", False, False, "tensorwise")
    res, lines, pinfo = run_child([c], workdir, "probe", with_query=False, workspace_bytes=None,
                                  lib=lib, handle="auto", log_level=5, log_mask=None, timeout=timeout)
    found = None
    for ev in parse_log_lines(lines):
        if ev["type"] == "heur":
            found = parse_heuristic_line(ev["raw"])["max_workspace_bytes"]
        elif ev["type"] == "mm" and found is None:
            found = parse_matmul_line(ev["raw"])["torch_workspace_arg"]
    pinfo["child_errors"] = res.get("errors")
    return found, pinfo


def resolve_workspace(spec: str, rt_info: dict, workdir: str, lib: str | None,
                      timeout: float) -> tuple[int, str, dict]:
    """--workspace-bytes: an integer, 'legacy', 'unified' or 'auto' (probe, else legacy)."""
    cc = rt_info.get("compute_capability") or ""
    major = int(cc.split(".")[0]) if cc and cc.split(".")[0].isdigit() else None
    if spec.isdigit():
        return int(spec), "explicit", {}
    if spec in ("legacy", "unified"):
        return mirrored_workspace_bytes(spec, major), f"mirrored torch logic ({spec})", {}
    if spec != "auto":
        raise click.BadParameter("--workspace-bytes must be an integer, auto, legacy or unified")
    detail: dict = {}
    if rt_info.get("torch_version"):
        found, pinfo = probe_torch_workspace(workdir, lib, timeout)
        detail = {"probe": pinfo}
        if found is not None:
            return found, "probed: torch's own cublasLtMatmulAlgoGetHeuristic log", detail
    _echo("WARNING: could not probe torch's workspace; falling back to mirrored 'legacy' logic")
    return mirrored_workspace_bytes("legacy", major), "mirrored torch logic (legacy) after failed probe", detail


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _write_json_atomic(path: str, obj) -> None:
    d = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Progress:
    """A single counter line on stderr, at most every ``every`` seconds."""

    def __init__(self, total: int, label: str, every: float = 2.0):
        self.total, self.label, self.every = total, label, every
        self.t0 = self.last = time.time()

    def update(self, done: int, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        _echo(f"[{self.label}] {done}/{self.total} ({100.0 * done / max(self.total, 1):.1f}%) "
              f"{rate:.0f}/s eta {eta:.0f}s")


def build_cases(shapes, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
                include_invalid: bool) -> tuple[list[Case], int]:
    fa = [False, True] if fast_accum is None else [bool(fast_accum)]
    bs = {"none": [False], "present": [True], "both": [False, True]}[bias]
    outs = list(dict.fromkeys(OUT_DTYPE_ALIASES[o.lower()] for o in out_dtypes))
    scale_modes = list(dict.fromkeys(scale_modes))
    in_dtypes = list(dict.fromkeys(in_dtypes))
    cases, skipped = [], 0
    for (m, n, k) in shapes:
        for pair in in_dtypes:
            a_t, b_t = pair.split(",")
            for o in outs:
                for f in fa:
                    for bb in bs:
                        for sm in scale_modes:
                            c = Case(m, n, k, a_t, b_t, o, f, bb, sm)
                            if c.torch_rejects() and not include_invalid:
                                skipped += 1
                                continue
                            cases.append(c)
    return cases, skipped


def gather_shapes(shapes_file, grid, shape_opts) -> list[tuple[int, int, int]]:
    shapes: list[tuple[int, int, int]] = []
    if shapes_file:
        shapes += load_shapes_file(shapes_file)
    if grid:
        shapes += grid_shapes(grid)
    for s in shape_opts or ():
        parts = [int(x) for x in re.split(r"[,x ]+", s.strip()) if x]
        if len(parts) != 3:
            raise click.BadParameter(f"--shape wants M,N,K; got {s!r}")
        shapes.append(tuple(parts))
    if not shapes:
        raise click.UsageError("give --shapes-file, --grid or --shape")
    seen, out = set(), []
    for s in shapes:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def case_options(f):
    """Options shared by query and torch-log."""
    opts = [
        click.option("--shapes-file", type=click.Path(exists=True, dir_okay=False),
                     help="JSON list of [M,N,K] (or {M,N,K} objects)."),
        click.option("--grid", type=click.Choice(sorted(GRIDS)), help="Built-in grid."),
        click.option("--shape", "shape_opts", multiple=True, help="Extra shape 'M,N,K' (repeatable)."),
        click.option("--in-dtypes", multiple=True, type=click.Choice(IN_DTYPE_PAIRS),
                     default=("e4m3,e4m3",), show_default=True, help="'a,b' torch operand dtypes (repeatable)."),
        click.option("--out-dtype", "out_dtypes", multiple=True, default=("bfloat16",), show_default=True,
                     type=click.Choice(sorted(OUT_DTYPE_ALIASES), case_sensitive=False),
                     help="Output dtype (repeatable)."),
        click.option("--fast-accum/--no-fast-accum", default=None,
                     help="use_fast_accum value; both when omitted."),
        click.option("--bias", type=click.Choice(["none", "present", "both"]), default="none",
                     show_default=True),
        click.option("--scale-mode", "scale_modes", multiple=True, type=click.Choice(SCALE_MODES),
                     default=("tensorwise",), show_default=True, help="Repeatable."),
        click.option("--include-invalid", is_flag=True, help="Also query combos torch rejects."),
        click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
                     help="Output JSON (written atomically)."),
        click.option("--workspace-bytes", default="auto", show_default=True,
                     help="int | auto (probe torch's log; else legacy) | legacy | unified."),
        click.option("--lib", type=click.Path(dir_okay=False), help="libcublasLt to load."),
        click.option("--handle", type=click.Choice(["auto", "torch", "own"]), default="auto",
                     show_default=True, help="torch's cuBLAS handle or a cublasLtCreate one."),
        click.option("--probe-timeout", type=float, default=300.0, show_default=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Reproduce cuBLASLt's algorithm choice for torch._scaled_mm (FP8, CUDA)."""


@cli.command()
def grids() -> None:
    """List built-in grids and their shape counts."""
    for name, text in GRIDS.items():
        click.echo(f"{name:14s} {len(grid_shapes(name)):6d} shapes  {text}")


@cli.command()
@case_options
@click.option("--top", type=int, default=1, show_default=True,
              help="requestedAlgoCount; rank 0 is what torch uses, the rest go to 'alternatives'.")
@click.option("--use-torch", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True)
@click.option("--pointers", type=click.Choice(["auto", "torch", "cudart", "synthetic"]), default="auto",
              show_default=True, help="Where scale/bias device pointers come from.")
def query(shapes_file, grid, shape_opts, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
          include_invalid, out_path, workspace_bytes, lib, handle, probe_timeout, top, use_torch,
          pointers) -> None:
    """Ask the heuristic (top-1, like torch) for every shape x option combination."""
    shapes = gather_shapes(shapes_file, grid, shape_opts)
    cases, skipped = build_cases(shapes, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
                                 include_invalid)
    _echo(f"[query] {len(shapes)} shapes -> {len(cases)} cases ({skipped} skipped: torch rejects them)")
    t_start = time.time()
    rt = Runtime(use_torch=use_torch, lib=lib, handle=handle, pointers=pointers)
    _echo(f"[query] libcublasLt {rt.info['library_path']} version {rt.info['cublaslt_version']} "
          f"({rt.info['library_found_by']}); torch {rt.info.get('torch_version')}")
    with tempfile.TemporaryDirectory(prefix="cublaslt-probe-") as wd:
        ws, ws_source, ws_detail = resolve_workspace(workspace_bytes, rt.info, wd, lib, probe_timeout)
    _echo(f"[query] workspace {ws} bytes ({ws_source})")
    rt.open_handle()
    ptrs = rt.pointers(max(c.M for c in cases), max(c.N for c in cases))
    rows: list[dict] = []
    prog = Progress(len(cases), "query")
    t0 = time.time()
    for i, c in enumerate(cases):
        rows.append(query_case(rt.lt, rt.handle, c, ptrs, ws, top))
        if i + 1 == min(20, len(cases)):
            dt = time.time() - t0
            rate = (i + 1) / max(dt, 1e-9)
            _echo(f"[query] rate {rate:.0f} queries/s; estimated {len(cases) / rate:.1f}s for all")
        prog.update(i + 1)
    prog.update(len(cases), force=True)
    rt.close()
    status_counts: dict[str, int] = {}
    for r in rows:
        status_counts[r["status"]] = status_counts.get(r["status"], 0) + 1
    doc = {"tool": TOOL, "tool_version": TOOL_VERSION, "mode": "query",
           "cublaslt_version": rt.info["cublaslt_version"], "library_path": rt.info["library_path"],
           "torch_version": rt.info.get("torch_version"), "device_name": rt.info.get("device_name"),
           "sm_count": rt.info.get("sm_count"), "workspace_bytes": ws,
           "workspace_source": ws_source, "workspace_detail": ws_detail, "runtime": rt.info,
           "config": {**CONFIG_DESCRIPTION, "requestedAlgoCount": top},
           "status_counts": status_counts, "seconds": round(time.time() - t_start, 2),
           "rows": rows}
    _write_json_atomic(out_path, doc)
    _echo(f"[query] wrote {out_path}: {len(rows)} rows, status {status_counts}")


def _compare_algo(logged: dict, q: dict) -> tuple[bool, list[str]]:
    bad = [k for k in ALGO_FIELD_NAMES if logged.get(k) != q.get(k)]
    return (not bad), bad


def _assemble_rows(cases: list[Case], res: dict, lines: list[str], keep_raw: bool) -> list[dict]:
    """Per-case rows from the child's markers, heuristic and matmul log lines."""
    events = parse_log_lines(lines)
    seg_torch: dict[int, list] = {}
    seg_query: dict[int, list] = {}
    cur = None
    have_marks = any(e["type"] == "mark" for e in events)
    if have_marks:
        for e in events:
            if e["type"] == "mark":
                v = e["value"]
                if MARK_TORCH <= v < MARK_QUERY:
                    cur = seg_torch.setdefault(v - MARK_TORCH, [])
                elif v >= MARK_QUERY:
                    cur = seg_query.setdefault(v - MARK_QUERY, [])
                else:
                    cur = None
            elif cur is not None:
                cur.append(e)
    else:  # no markers: pair heuristic/matmul lines in order
        ok_idx = [t["i"] for t in res.get("torch", []) if t.get("ok")]
        pending, pairs = None, []
        for e in events:
            if e["type"] == "heur":
                pending = e
            elif e["type"] == "mm":
                pairs.append([x for x in (pending, e) if x is not None])
                pending = None
        pairs = pairs[-len(ok_idx):] if ok_idx else []  # drop the loader's warm-up GEMM
        for i, evs in zip(ok_idx, pairs):
            seg_torch[i] = evs
    torch_status = {t["i"]: t for t in res.get("torch", [])}
    query_rows = res.get("query", [])
    rows = []
    for i, c in enumerate(cases):
        row = asdict(c)
        t = torch_status.get(i, {})
        row["torch_ok"] = t.get("ok")
        if t.get("error"):
            row["torch_error"] = t["error"]
        evs = seg_torch.get(i, [])
        heurs = [e for e in evs if e["type"] == "heur"]
        mms = [e for e in evs if e["type"] == "mm"]
        traces = [e for e in mms if e["kind"] == "Trace"] or mms
        row["status"] = "OK" if (t.get("ok") and traces) else ("TORCH_ERROR" if t.get("ok") is False
                                                               else "NOT_PARSED")
        logged = parse_matmul_line(traces[-1]["raw"]) if traces else {}
        for k in ALGO_FIELD_NAMES:
            row[k] = logged.get(k)
        row["workspace_size"], row["waves_count"] = None, None  # not in the matmul log line
        row["torch_workspace_arg"] = logged.get("torch_workspace_arg")
        row["log_fields_present"] = logged.get("log_fields_present")
        row["algo_fields"] = logged.get("algo_fields")
        th = parse_heuristic_line(heurs[-1]["raw"]) if heurs else None
        row["max_workspace_bytes"] = th["max_workspace_bytes"] if th else None
        row["heuristic_calls"], row["matmul_lines"] = len(heurs), len(traces)
        if i < len(query_rows):
            q = query_rows[i]
            row["query"] = {k: q.get(k) for k in ("status", "status_code", *ALGO_FIELD_NAMES,
                                                  "workspace_size", "waves_count", "names")}
            if traces and q.get("status") == "OK":
                row["algo_match"], row["mismatch_fields"] = _compare_algo(logged, q)
                shown = ["algo_id"] + list(logged.get("log_fields_present") or [])
                row["algo_match_logged_fields"] = all(logged.get(k) == q.get(k) for k in shown)
            qh = [e for e in seg_query.get(i, []) if e["type"] == "heur"]
            if th and qh:
                qd = parse_heuristic_line(qh[-1]["raw"])["descs"]
                keys = sorted(set(th["descs"]) | set(qd))
                diff = [k for k in keys if th["descs"].get(k) != qd.get(k)]
                row["desc_match"], row["desc_diff"] = (not diff), {
                    k: {"torch": th["descs"].get(k), "query": qd.get(k)} for k in diff}
                if keep_raw:
                    row.setdefault("raw", {})["query_heuristic"] = qh[-1]["raw"]
        if keep_raw:
            raw = row.setdefault("raw", {})
            raw["torch_heuristic"] = heurs[-1]["raw"] if heurs else None
            raw["torch_matmul"] = [e["raw"] for e in mms]
        rows.append(row)
    return rows


@cli.command("torch-log")
@case_options
@click.option("--with-query/--no-query", default=True, show_default=True,
              help="Also run this tool's query in the same child and compare.")
@click.option("--chunk", type=int, default=1000, show_default=True, help="Cases per child process.")
@click.option("--every", type=int, default=1, show_default=True, help="Keep every n-th case.")
@click.option("--limit", type=int, default=0, help="Keep at most this many cases (0: all).")
@click.option("--log-level", type=int, default=5, show_default=True, help="CUBLASLT_LOG_LEVEL.")
@click.option("--log-mask", type=int, default=19, show_default=True,
              help="CUBLASLT_LOG_MASK (19 = error|trace|API trace; negative: unset).")
@click.option("--child-timeout", type=float, default=900.0, show_default=True)
@click.option("--raw/--no-raw", "keep_raw", default=True, show_default=True,
              help="Keep the parsed raw log lines per row.")
@click.option("--keep-logs", type=click.Path(file_okay=False), default=None,
              help="Directory to keep child jobs and cuBLASLt logs in.")
def torch_log(shapes_file, grid, shape_opts, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
              include_invalid, out_path, workspace_bytes, lib, handle, probe_timeout, with_query, chunk,
              every, limit, log_level, log_mask, child_timeout, keep_raw, keep_logs) -> None:
    """Run real torch._scaled_mm under cuBLASLt logging and parse the algo it used."""
    shapes = gather_shapes(shapes_file, grid, shape_opts)
    cases, skipped = build_cases(shapes, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
                                 include_invalid)
    cases = cases[::max(1, every)]
    if limit > 0:
        cases = cases[:limit]
    _echo(f"[torch-log] {len(cases)} cases ({skipped} skipped: torch rejects them)")
    t_start = time.time()
    wd_ctx = None
    if keep_logs:
        os.makedirs(keep_logs, exist_ok=True)
        wd = keep_logs
    else:
        wd_ctx = tempfile.TemporaryDirectory(prefix="cublaslt-torchlog-")
        wd = wd_ctx.name
    try:
        ws, ws_source, ws_detail = None, "not needed (--no-query)", {}
        if not with_query:
            pass
        elif workspace_bytes.isdigit():
            ws, ws_source = int(workspace_bytes), "explicit"
        elif workspace_bytes in ("legacy", "unified"):
            ws, ws_source = mirrored_workspace_bytes(workspace_bytes, 9), f"mirrored ({workspace_bytes}, sm_90)"
        else:
            ws, pinfo = probe_torch_workspace(wd, lib, probe_timeout)
            ws_source, ws_detail = "probed: torch's own heuristic log", {"probe": pinfo}
            if ws is None:
                ws = mirrored_workspace_bytes("legacy", 9)
                ws_source = "mirrored (legacy, sm_90) after failed probe"
                _echo(f"WARNING: workspace probe failed ({pinfo}); using {ws}")
        _echo(f"[torch-log] query workspace {ws} bytes ({ws_source})")
        rows: list[dict] = []
        info: dict = {}
        children = []
        prog = Progress(len(cases), "torch-log", every=0.0)
        for ci in range(0, len(cases), max(1, chunk)):
            part = cases[ci:ci + max(1, chunk)]
            res, lines, pinfo = run_child(part, wd, f"chunk{ci // max(1, chunk):04d}", with_query=with_query,
                                          workspace_bytes=ws, lib=lib, handle=handle, log_level=log_level,
                                          log_mask=None if log_mask < 0 else log_mask, timeout=child_timeout)
            pinfo["child_errors"] = res.get("errors")
            children.append(pinfo)
            info = info or res.get("info", {})
            if res.get("errors") or pinfo["returncode"] != 0:
                _echo(f"[torch-log] child problem: rc={pinfo['returncode']} errors={res.get('errors')}\n"
                      f"{(pinfo.get('stderr_tail') or '')[-1500:]}")
            rows += _assemble_rows(part, res, lines, keep_raw)
            prog.update(min(ci + len(part), len(cases)), force=True)
        summary = {
            "rows": len(rows),
            "torch_ok": sum(1 for r in rows if r.get("torch_ok")),
            "parsed": sum(1 for r in rows if r["status"] == "OK"),
            "algo_match": sum(1 for r in rows if r.get("algo_match") is True),
            "algo_mismatch": sum(1 for r in rows if r.get("algo_match") is False),
            "desc_match": sum(1 for r in rows if r.get("desc_match") is True),
            "desc_mismatch": sum(1 for r in rows if r.get("desc_match") is False),
            "torch_max_workspace_bytes": sorted({r["max_workspace_bytes"] for r in rows
                                                 if r.get("max_workspace_bytes") is not None}),
        }
        doc = {"tool": TOOL, "tool_version": TOOL_VERSION, "mode": "torch-log",
               "cublaslt_version": info.get("cublaslt_version"), "library_path": info.get("library_path"),
               "torch_version": info.get("torch_version"), "device_name": info.get("device_name"),
               "sm_count": info.get("sm_count"), "workspace_bytes": ws, "workspace_source": ws_source,
               "workspace_detail": ws_detail, "runtime": info, "children": children,
               "config": {**CONFIG_DESCRIPTION, "log": {"CUBLASLT_LOG_LEVEL": log_level,
                                                        "CUBLASLT_LOG_MASK": log_mask}},
               "summary": summary, "seconds": round(time.time() - t_start, 2), "rows": rows}
        _write_json_atomic(out_path, doc)
        _echo(f"[torch-log] wrote {out_path}: {summary}")
    finally:
        if wd_ctx is not None:
            wd_ctx.cleanup()


@cli.command("_torch-child", hidden=True)
@click.option("--job", required=True, type=click.Path(exists=True))
@click.option("--out", "out_path", required=True, type=click.Path())
def torch_child(job, out_path) -> None:
    """Internal: runs in a child process with cuBLASLt logging enabled."""
    child_main(job, out_path)


@cli.command()
@click.option("--lib", type=click.Path(dir_okay=False), help="libcublasLt to check (else searched).")
def selftest(lib) -> None:
    """Offline checks: layouts, tables, grids and (if a library loads) every descriptor attribute."""
    ok = True

    def check(cond, text):
        nonlocal ok
        ok &= bool(cond)
        click.echo(f"{'ok  ' if cond else 'FAIL'} {text}")

    check(ctypes.sizeof(MatmulAlgo) == 64, f"sizeof(cublasLtMatmulAlgo_t) = {ctypes.sizeof(MatmulAlgo)}")
    check(ctypes.sizeof(HeuristicResult) == 96,
          f"sizeof(cublasLtMatmulHeuristicResult_t) = {ctypes.sizeof(HeuristicResult)}")
    check(HeuristicResult.workspaceSize.offset == 64 and HeuristicResult.state.offset == 72
          and HeuristicResult.wavesCount.offset == 76, "result field offsets 64/72/76")
    check(_TILE_NAMES[20] == "128x128" and _STAGES_NAMES[36] == "128xAUTO" and _CLUSTER_NAMES[2] == "1x1x1",
          "tile/stages/cluster tables")
    check(len(grid_shapes("wide")) > 0 and len(grid_shapes("dense-splitk")) > 0, "grids build")
    check(all(n <= 16384 for s in grid_shapes("wide") for n in s[1:]), "wide grid keeps N, K <= 16384")
    sample = parse_matmul_line("[2025-01-01][cublasLt][1][Trace][cublasLtMatmul] A=0X1 algo=[algoId=66 "
                               "tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_128xAUTO customOption=3 "
                               "clusterShape=CLUSTER_SHAPE_1x1x1 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE "
                               "numSplitsK=4] workSpace=0X0 workSpaceSizeInBytes=1048576 beta=0")
    check(sample["algo_id"] == 66 and sample["tile_id"] == 20 and sample["stages_id"] == 36
          and sample["cluster_shape_id"] == 2 and sample["splitk_num"] == 4 and sample["reduction_scheme"] == 2
          and sample["custom_option"] == 3 and sample["torch_workspace_arg"] == 1048576, "matmul log parser")
    try:
        path, how, _ = find_cublaslt(lib)
        lt = CublasLt(path)
        click.echo(f"info libcublasLt {path} ({how}) version {lt.version()}")
    except Exception as e:  # noqa: BLE001
        click.echo(f"skip library checks: {e}")
        raise SystemExit(0 if ok else 1)
    fake = {"scale_a": 0x7F0000000000, "scale_b": 0x7F0000001000, "bias": 0x7F0000002000}
    for c in (Case(16, 5760, 1920, "e4m3", "e4m3", "bfloat16", True, True, "rowwise"),
              Case(1, 16, 32, "e4m3", "e5m2", "float32", False, False, "tensorwise"),
              Case(8, 12288, 4096, "e5m2", "e4m3", "float16", False, True, "tensorwise")):
        try:
            made = build_descs(lt, c, fake, 1 << 20)
            destroy_descs(lt, made)
            check(True, f"descriptors accepted for {c}")
        except LtError as e:
            check(False, f"descriptors for {c}: {e}")
    algo = MatmulAlgo()
    cfg = lt.read_algo(algo)
    check(all(v is not None for v in cfg.values()), f"AlgoConfigGetAttribute on a zero algo: {cfg}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    cli()
