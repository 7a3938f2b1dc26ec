"""cpemu.gemm on cupy arrays: same bits as on numpy arrays, cupy result on the same device."""

import numpy as np
import pytest

import cpemu
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS

cupy = pytest.importorskip("cupy", reason="needs cupy")
pytestmark = pytest.mark.gpu


def _has_gpu():
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["auto", "cublaslt-tc", "cuda-rzacc", "cuda-tiled", "cuda-simple", "reference"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
def test_cupy_inputs_match_numpy(backend, out_dtype):
    from cpemu.backends import available

    ok, why = available(backend) if backend != "auto" else (True, "")
    if not ok:
        pytest.skip(f"{backend}: {why}")
    case = Case(17, 48, 272, data="spread", seed=3, out_dtype=out_dtype, scale="tensor")
    a, bt, sa, sb, _ = operands(case)
    fa = FP8_FORMATS["e4m3"]
    want = cpemu.gemm(a.view(fa.np_dtype), bt.view(fa.np_dtype).T, scale_a=sa.reshape(()), scale_b=sb.reshape(()),
                      out_dtype=out_dtype, backend="reference")
    with cupy.cuda.Stream(non_blocking=True):
        got = cpemu.gemm(cupy.asarray(a), cupy.asarray(bt).T, a_format="e4m3", b_format="e4m3",
                         scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=out_dtype, backend=backend)
        got = cupy.asnumpy(got)
    # cupy results: float32 for float32 output, uint16 bit patterns for bf16 / fp16
    assert got.dtype == (np.float32 if out_dtype == "float32" else np.uint16)
    w = want.view(np.uint32 if out_dtype == "float32" else np.uint16)
    assert np.array_equal(got.view(w.dtype), w)


@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU")
def test_cupy_operand_errors():
    a = cupy.zeros((16, 32), cupy.uint8)
    bt = cupy.zeros((16, 32), cupy.uint8)
    with pytest.raises(ValueError, match="a_format"):
        cpemu.gemm(a, bt.T, b_format="e4m3")
    with pytest.raises(ValueError, match="^b: a cupy operand must be a column-major"):
        cpemu.gemm(a, cupy.ascontiguousarray(bt.T), a_format="e4m3", b_format="e4m3")
    with pytest.raises(ValueError, match="^b: a and b must both be numpy or both be cupy"):
        cpemu.gemm(a, np.zeros((32, 16), np.uint8), a_format="e4m3", b_format="e4m3")
