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
    if module == kernels.RZACC_PRE:  # two stages, no tables (the predecode kernel has them)
        assert "#define CPT_RZACC 1" in (SRC / f"{module}.cu").read_text()
        assert smem == 2 * 264 * (bm + bn) and bm == bn == 64
        assert kernels.PREDECODE[1] == 264 * (bm + bn) + 4608 and kernels.PREDECODE[3] == 260 * bm
        assert "#define CPT_DECODE_SMEM_BYTES (CPT_STAGE_PASS1 ? 38400 : 30208)" in (SRC / "cpemu_tiled.cuh").read_text()
        # the CPT_STAGE_PASS1=0 measurement build: 200 bytes per row (no pass 1 operand), images of 196
        assert kernels.NO_PASS1_SMEM == (2 * 200 * (bm + bn), 200 * (bm + bn) + 4608)
        assert kernels.NO_PASS1_IMAGE_BYTES == 196 * bm
        assert "#define CPT_SMEM_BYTES 51200" in (SRC / f"{module}.cu").read_text()
        assert kernels.tiled_smem(module, ("CPT_PROBE_SKIP=1", "CPT_STAGE_PASS1=0")) == 51200
        assert kernels._image_bytes(130, 100, ("CPT_STAGE_PASS1=0",)) == 3 * 4 * 196 * 64
        assert kernels._image_bytes(130, 100) == 3 * 4 * 260 * 64
        # the CPT_EPROD=1 build: those stages and 32 e_max bytes per thread
        assert kernels.EPROD_SMEM == 2 * 200 * (bm + bn) + 32 * kernels.tiled_threads(module)
        assert kernels.tiled_smem(module, kernels.EPROD_DEFINES) == kernels.EPROD_SMEM
        assert "#define CPT_SMEM_BYTES 55296" in (SRC / f"{module}.cu").read_text()
        # the CPT_PIPE2=1 build (the next step's pass 1 inside this step's pass 2): three full stages
        assert kernels.PIPE2_SMEM == 3 * 264 * (bm + bn)
        assert kernels.tiled_smem(module, (kernels.PIPE2_DEFINE, "CPT_MINBLOCKS=2")) == kernels.PIPE2_SMEM
        assert "#define CPT_SMEM_BYTES 101376" in (SRC / f"{module}.cu").read_text()
        assert "CptStage st[CPT_PIPE2 ? 3 : 2];" in (SRC / "cpemu_tiled.cuh").read_text()
    elif module in kernels.TILED_FAMILIES["cuda-rzacc"]:
        assert "#define CPT_RZACC 1" in (SRC / f"{module}.cu").read_text()
        assert smem == 264 * (bm + bn) + 4608
    else:
        assert smem == 328 * (bm + bn) + 4096
    assert kernels.tiled_threads(module) == (bm // tm) * (bn // tn)
    assert kernels.tiled_threads(module, ("CPT_TM=4",)) == (bm // 4) * (bn // tn)
    assert kernels.tiled_threads(module, ("CPT_KPARTS=4",)) == 4 * (bm // tm) * (bn // tn)


def test_kparts_builds_compile():
    """The small-M design with a step's products over 2 or 4 threads (CPT_KPARTS, cuda-rzacc), and
    gemm_rzacc_pre with pass 1 on tensor cores (CPT_PASS1_MMA) and the stage without pass 1's operand
    (CPT_STAGE_PASS1=0, a ceiling measurement), pass 1 in a tensor-core kernel of its own (CPT_EPROD=1),
    the count without its sign mask (CPT_PROBE_SKIP=4, a ceiling measurement) and the two-step pipeline
    (CPT_PIPE2=1: the next step's pass 1 inside this step's pass 2, three stages) and the leaner per-step
    constants (CPT_LEAN=1, every cuda-rzacc module), build for every architecture with
    the pinned NVRTC (their bits are checked on a GPU: CPEMU_TEST_RZACC_DEFINES); the default
    fatbins do not contain them (build_fatbin --check)."""
    import importlib.util

    pytest.importorskip("nvidia.cuda_nvrtc", reason="the pinned NVRTC (pip install -e '.[test]')")
    spec = importlib.util.spec_from_file_location("cpemu_tools_build_fatbin", SRC.parent / "tools" / "build_fatbin.py")
    bf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bf)
    tc = bf.Toolchain()
    for module, defs in (("gemm_rzacc_small_m", "CPT_KPARTS 4\n#define CPT_MINBLOCKS 2"),
                         ("gemm_rzacc_small_m", "CPT_KPARTS 2\n#define CPT_MINBLOCKS 3"),
                         ("gemm_rzacc_pre", "CPT_PASS1_MMA 1"),
                         ("gemm_rzacc_pre", "CPT_PROBE_SKIP 1\n#define CPT_STAGE_PASS1 0\n#define CPT_MINBLOCKS 4"),
                         ("gemm_rzacc_pre", "CPT_EPROD 1\n#define CPT_STAGE_PASS1 0\n#define CPT_MINBLOCKS 4"),
                         ("gemm_rzacc_pre", "CPT_PROBE_SKIP 4"),
                         ("gemm_rzacc_pre", "CPT_PIPE2 1\n#define CPT_MINBLOCKS 2"),
                         ("gemm_rzacc_pre", "CPT_LEAN 1"), ("gemm_rzacc", "CPT_LEAN 1"),
                         ("gemm_rzacc_small_m", "CPT_LEAN 1")):
        cu = SRC / f"{module}.cu"
        sources = bf.module_sources(SRC, cu)
        headers = {k: v for k, v in sources.items() if k != cu.name}
        for arch in bf.ARCHS:
            cubin, _ = tc.compile(cu.name, f"#define {defs}\n".encode() + sources[cu.name], headers, arch)
            assert cubin[:4] == b"\x7fELF", (module, defs, arch)
    with pytest.raises(Exception, match="CPT_KPARTS: 2 or 4"):
        cu = SRC / "gemm_tiled_small_m.cu"
        sources = bf.module_sources(SRC, cu)
        tc.compile(cu.name, b"#define CPT_KPARTS 2\n" + sources[cu.name],
                   {k: v for k, v in sources.items() if k != cu.name}, "sm_90a")
    with pytest.raises(Exception, match="CPT_PIPE2: gemm_rzacc_pre's exact build"):  # no probe in the pipeline
        cu = SRC / "gemm_rzacc_pre.cu"
        sources = bf.module_sources(SRC, cu)
        tc.compile(cu.name, b"#define CPT_PIPE2 1\n#define CPT_PROBE_SKIP 1\n" + sources[cu.name],
                   {k: v for k, v in sources.items() if k != cu.name}, "sm_90a")


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
