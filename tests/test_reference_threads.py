"""The reference GEMM computes the same bits with any number of worker threads, and so does
cpu-fp32 (the reference's GEMM with its own arithmetic), whose blocks also change size with the
thread count.

Its blocks are independent (reference.blocks); the shapes here have 2 to 12 blocks, so
threads really split the work. The bits themselves are checked against the H200 recordings
in tests/test_truth.py (through the default thread count).
"""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest

from cpemu import reference as ref
from cpemu.backends import cpu_fp32
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS
from cpemu.profile import get_profile

CASES = [Case(40, 512, 256, data="spread", seed=11), Case(24, 1024, 384, data="nan", seed=12, out_dtype="float16"),
         Case(33, 768, 512, data="gauss40", seed=13, fast_accum=False, scale="rowwise", bias=True),
         Case(20, 640, 4096, data="loguniform", seed=14, out_dtype="float32", scale="tensor")]


def _run(case: Case, profile: str, threads: int, arith=ref.SPEC) -> str:
    prof = get_profile(profile)
    a, bt, sa, sb, bias = operands(case)
    scaling = "rowwise" if case.scale == "rowwise" else "tensorwise"
    if scaling not in prof.data["modes"]:
        pytest.skip(f"{profile} does not record {scaling} scaling")
    plan = prof.plan(case.M, case.N, case.K, case.fast_accum, scaling, case.a_format, case.b_format,
                     case.out_dtype)
    mode = prof.mode(scaling)
    b32 = None
    if bias is not None:
        b32 = bias.view(np.float16 if case.out_dtype == "float16" else ml_dtypes.bfloat16).astype(np.float32)
    y = ref.gemm_codes(a, bt, FP8_FORMATS[case.a_format], FP8_FORMATS[case.b_format], plan, prof.instruction,
                       mode["epilogue"], sa.reshape(()) if sa.size == 1 else sa, sb.reshape(()) if sb.size == 1
                       else sb, b32, case.out_dtype, mode.get("nan_bits", {}).get(case.out_dtype), threads=threads,
                       arith=arith)
    assert len(list(ref.blocks(case.M, case.N, prof.instruction.L))) >= 2
    return hashlib.sha256(y.tobytes()).hexdigest()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("profile", ["hopper-h200-torch", "ada-rtx4060-torch"])
def test_same_bits_with_any_thread_count(case, profile):
    one = _run(case, profile, 1)
    assert _run(case, profile, 3) == one
    assert _run(case, profile, 8) == one
    for threads in (1, 3, 8):  # cpu-fp32: blocks of 2**17 to 2**20 pairs by the thread count; the reference's bits
        assert _run(case, profile, threads, cpu_fp32.ARITHMETIC) == one, threads


def test_thread_count_from_the_environment(monkeypatch):
    monkeypatch.setenv(ref.THREADS_ENV, "3")
    assert ref.threads_default() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(ref.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=rf"^{ref.THREADS_ENV}: must be a positive integer"):
            ref.threads_default()
    monkeypatch.delenv(ref.THREADS_ENV)
    assert 1 <= ref.threads_default() <= 32


def test_a_failing_block_raises(monkeypatch):
    class Boom(Exception):
        pass

    def bad_accumulate(*args, **kwargs):
        raise Boom("block failed")

    monkeypatch.setattr(ref, "accumulate", bad_accumulate)
    with pytest.raises(Boom):
        _run(CASES[0], "hopper-h200-torch", 4)
