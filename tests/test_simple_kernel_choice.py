"""cuda-simple's two kernels (cpemu/cuda/kernels.py SIMPLE_KERNELS), checked on the CPU: which
kernel a model runs on, the staged kernel's geometry read back from the kernel, and the
constants shared with cuda_src/gemm_simple.cu.

That both kernels give the same bits is checked on a GPU (tests/test_cuda_backends.py runs every
cuda-simple test on each, and on the staged kernel's one-output-per-thread build through
CPEMU_TEST_SIMPLE_DEFINES)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from cpemu.cuda import kernels
from cpemu.instruction import ADA_SM89, BLACKWELL_SM120, HOPPER_SM90A

SRC = (Path(__file__).resolve().parents[1] / "cuda_src" / "gemm_simple.cu").read_text()


@pytest.mark.parametrize("model,want", [(HOPPER_SM90A, "staged"), (ADA_SM89, "staged"),
                                        (BLACKWELL_SM120, "per-output")], ids=lambda x: getattr(x, "name", x))
def test_kernel_per_model(model, want):
    assert kernels.simple_kernel_for(model.F) == want


def test_staged_range_edges():
    lo, hi = kernels.SIMPLE_STAGED_F
    assert (lo, hi) == (11, 16)  # the kernel's comment: F <= 16 keeps every partial sum below 2**-125
    assert [kernels.simple_kernel_for(F) for F in (lo - 1, lo, hi, hi + 1)] == \
        ["per-output", "staged", "staged", "per-output"]


@pytest.mark.parametrize("threads,want", [(512, (512, 32, 32)), (1024, (1024, 32, 32))])
def test_staged_geometry_from_the_kernel(threads, want):
    assert kernels.simple_geometry("staged", SimpleNamespace(max_threads_per_block=threads)) == want


@pytest.mark.parametrize("threads", [256, 768, 2048])
def test_staged_geometry_refuses_other_block_sizes(threads):
    with pytest.raises(RuntimeError, match="threads per block"):
        kernels.simple_geometry("staged", SimpleNamespace(max_threads_per_block=threads))


def test_per_output_geometry_ignores_the_kernel():
    assert kernels.simple_geometry("per-output", None) == (128, 0, 0)


def test_constants_match_the_source():
    for name, threads, bn in kernels.SIMPLE_KERNELS.values():
        assert re.search(rf'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s*{name}\(', SRC), name
    assert re.search(r"#define CPS_BN 32\b", SRC)
    # the constants tests/test_simple_staged_arithmetic.py re-implements the kernel with
    assert re.search(r"#define CPS_SHIFT 58\b", SRC)
    assert re.search(r"#define CPS_EBIAS 112\b", SRC)
    assert re.search(r"#define CPS_EMAX_FLOOR \(-64\)", SRC)
    assert kernels.SIMPLE_KERNELS["staged"][2] == 32
    # the geometry simple_geometry assumes: 32 x 32 outputs per block on every architecture,
    # CPS_TN per thread (2; a tuning build's 1), 1024 / CPS_TN threads
    assert re.search(r"#define CPS_BM 32\b", SRC)
    assert re.search(r"#define CPS_TN 2\b", SRC)
    assert re.search(r"#define CPS_THREADS \(CPS_BM \* CPS_BN / CPS_TN\)", SRC)
    assert "__CUDA_ARCH__ != 800" not in SRC  # no per-architecture geometry
