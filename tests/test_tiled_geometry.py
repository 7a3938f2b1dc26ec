"""The tiled kernel's geometries (cpemu/cuda/kernels.py TILED_VARIANTS), checked on the CPU:
the launch constants agree with the CUDA sources, and the geometry picked per shape.

That both geometries give the same bits is checked on a GPU (tests/test_cuda_backends.py
runs every tiled test on each geometry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpemu.cuda import kernels

SRC = Path(__file__).resolve().parents[1] / "cuda_src"


def _defines(module: str) -> dict:
    text = (SRC / f"{module}.cu").read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (CPT_\w+) (\d+)", text)}


@pytest.mark.parametrize("module", sorted(kernels.TILED_VARIANTS))
def test_launch_constants_match_the_source(module):
    name, bm, bn, tm, tn, smem = kernels.TILED_VARIANTS[module]
    d = _defines(module)
    assert (d["CPT_BM"], d["CPT_BN"], d["CPT_TM"], d["CPT_TN"], d["CPT_SMEM_BYTES"]) == (bm, bn, tm, tn, smem)
    assert re.search(rf'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*{name}\(',
                     (SRC / f"{module}.cu").read_text())
    # the shared memory the header lays out: per operand tile 328 bytes per row, plus 4096 of tables;
    # with CPT_RZACC (cuda-rzacc) 264 bytes per row, plus 4608 of tables
    if module in kernels.TILED_FAMILIES["cuda-rzacc"]:
        assert "#define CPT_RZACC 1" in (SRC / f"{module}.cu").read_text()
        assert smem == 264 * (bm + bn) + 4608
    else:
        assert smem == 328 * (bm + bn) + 4096
    assert kernels.tiled_threads(module) == (bm // tm) * (bn // tn)
    assert kernels.tiled_threads(module, ("CPT_TM=4",)) == (bm // 4) * (bn // tn)


@pytest.mark.parametrize("M, N, sms, want", [
    (1, 16, 132, "gemm_tiled_small_m"),
    (16, 24576, 132, "gemm_tiled_small_m"),      # Evo 2 40B, M = 16
    (32, 24576, 132, "gemm_tiled_small_m"),
    (33, 24576, 132, "gemm_tiled"),              # 384 blocks of 64 x 64: every SM has one
    (64, 5760, 132, "gemm_tiled_small_m"),       # Evo 2 1B: 90 blocks of 64 x 64 < 132 SMs
    (64, 5760, 24, "gemm_tiled"),                # the same shape on a 24-SM GPU
    (96, 5760, 132, "gemm_tiled"),
    (64, 12288, 132, "gemm_tiled"),              # Evo 2 7B: 192 blocks
    (2048, 5760, 132, "gemm_tiled"),
])
def test_geometry_per_shape(M, N, sms, want):
    assert kernels.tiled_module_for(M, N, sms) == want
    assert kernels.tiled_module_for(M, N, sms, "cuda-rzacc") == want.replace("tiled", "rzacc")
