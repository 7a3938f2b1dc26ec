"""What the tensor-core backend accepts, decided without a GPU (cpemu/cuda/tensorcore.py).

The GPU behaviour is in tests/test_tensorcore.py; here the pure rules: which plans the
cuBLASLt path reproduces, and that a forced ``cublaslt-tc`` on a machine without it fails
with the reason instead of computing something else.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cpemu
from cpemu import backends
from cpemu.cuda import tensorcore as tc
from cpemu.schedule import Plan, slices_for

H, A = tc.HOPPER_MODEL, tc.ADA_MODEL


@pytest.mark.parametrize("K,splits", [(1920, 1), (16384, 6), (12304, 3), (8192, 2), (16, 1)])
@pytest.mark.parametrize("fast", [True, False])
def test_hopper_accepts_cublaslt_slices(K, splits, fast):
    plan = Plan(slices_for(K, splits, 128), None if fast else 4)
    ok, why = tc.supports(H, plan, K, "tensorwise", fast)
    assert ok, why
    assert tc.supports(H, plan, K, "rowwise", fast)[0]


def test_hopper_declines_other_schedules():
    K = 4096
    odd = Plan(((0, 1000), (1000, K)), None)  # not whole 128-element tiles
    ok, why = tc.supports(H, odd, K, "tensorwise", True)
    assert not ok and "K tiles" in why
    ok, why = tc.supports(H, Plan(((0, K),), 8), K, "tensorwise", False)
    assert not ok and "promotion every 8" in why
    ok, why = tc.supports(H, Plan(((0, K),), None), K, "tensorwise", False)
    assert not ok and "fast_accum" in why


def test_ada_rules():
    K = 1920
    assert tc.supports(A, Plan(((0, K),), None), K, "tensorwise", True)[0]
    ok, why = tc.supports(A, Plan(((0, K),), 8), K, "tensorwise", False)
    assert not ok and "promotes every 8 Ada steps" in why
    ok, why = tc.supports(A, Plan(slices_for(16384, 2, 128), None), 16384, "tensorwise", True)
    assert not ok and "unsplit" in why
    ok, why = tc.supports(A, Plan(((0, K),), None), K, "rowwise", True)
    assert not ok and "tensorwise" in why


def test_other_models_declined():
    ok, why = tc.supports("blackwell-sm120-mma-f8f6f4", Plan(((0, 64),), None), 64, "tensorwise", True)
    assert not ok and "instruction model" in why


def test_ladder_order():
    assert backends.LADDER == ("cublaslt-tc", "cuda-rzacc", "cuda-tiled", "cuda-simple", "cpu-fp32", "reference")


def test_forced_backend_without_it_names_the_reason():
    ok, why = backends.available("cublaslt-tc")
    if ok:
        pytest.skip("this machine has the tensor-core path")
    a = np.zeros((16, 32), ml_dtypes.float8_e4m3fn)
    b = np.zeros((32, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(backends.BackendUnavailable, match="cublaslt-tc"):
        cpemu.gemm(a, b, backend="cublaslt-tc")
    assert why  # a reason is given (no cupy, no GPU, not sm_90, no libcublasLt)


class _FakeLt:
    """Stands in for the cuBLASLt binding: counts descriptor creation and destruction."""

    def __init__(self, fail=False):
        import types

        self.created, self.destroyed, self.fail = 0, [], fail
        lt = self

        def build_descs(_lt, case, ptrs, ws):
            lt.created += 1
            return {"desc": lt.created}

        def destroy_descs(_lt, made):
            lt.destroyed.append(made["desc"])

        self.h = types.SimpleNamespace(build_descs=build_descs, destroy_descs=destroy_descs)


def test_descriptor_lifetime(monkeypatch):
    """Evicted descriptor sets are destroyed once, and only when no signature holds them; a failed
    configuration destroys its descriptors once."""
    import gc

    def configure(self, lt, handle, case, splits):
        if lt.fail:
            raise tc.TensorCoreUnsupported("refused")
        return object(), {}, 0

    monkeypatch.setattr(tc._Prepared, "_configure", configure)
    monkeypatch.setitem(tc._state, "plans", {})
    lt = _FakeLt()
    held = tc._prepared(lt, 0, None, ("case", 0), 1)  # a signature keeps this one
    for i in range(1, 300):
        tc._prepared(lt, 0, None, ("case", i), 1)
    gc.collect()
    assert lt.created == 300
    assert held.made == {"desc": 1} and 1 not in lt.destroyed  # evicted from the cache, still alive
    assert len(set(lt.destroyed)) == len(lt.destroyed) and len(lt.destroyed) >= 300 - 257 - 1
    del held
    gc.collect()
    assert lt.destroyed.count(1) == 1
    bad = _FakeLt(fail=True)
    with pytest.raises(tc.TensorCoreUnsupported):
        tc._Prepared(bad, None, ("case", "x"), 1)
    gc.collect()
    assert bad.destroyed == [1]
