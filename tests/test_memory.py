"""The reference backend's memory stays bounded (a 4096^3 product must fit in about 1 GiB).

Peak Python-heap memory (tracemalloc sees numpy's buffers) of a 2048 x 2048 x 64 product is
compared with the budget model: decoded operands (9 bytes per element), the output and its
FP32 accumulator, plus block temporaries that do not grow with the shape (one set per worker
thread of the reference). The same model
gives the 4096 x 4096 x 4096 bound printed in the assertion message.
"""

import tracemalloc

import ml_dtypes
import numpy as np

import cpemu
from cpemu import reference as ref

DECODED_BYTES = 9  # sign int8, significand int32, exponent int16, nan + inf flags


def budget(M, N, K, threads=None):
    threads = ref.threads_default() if threads is None else threads
    blocks = ref.BLOCK_ELEMS * 64 * threads  # a few int32/int64 temporaries of one step, per worker thread
    return DECODED_BYTES * (M + N) * K + M * N * (4 + 4) + blocks


def test_peak_memory_is_bounded():
    M, N, K = 2048, 2048, 64
    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x7E, (M, K), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    b = rng.integers(0, 0x7E, (K, N), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    tracemalloc.start()
    cpemu.gemm(a, b, out_dtype="float32")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    big = budget(4096, 4096, 4096, threads=32)  # the most worker threads by default
    assert peak <= budget(M, N, K), f"peak {peak / 2**20:.1f} MiB > budget {budget(M, N, K) / 2**20:.1f} MiB"
    assert big < 1.1 * 2**30, f"4096^3 budget {big / 2**30:.2f} GiB"


def test_peak_memory_single_thread():
    M, N, K = 1024, 2048, 64
    rng = np.random.default_rng(1)
    a = rng.integers(0, 0x7E, (M, K), dtype=np.uint8)
    bt = rng.integers(0, 0x7E, (N, K), dtype=np.uint8)
    from cpemu.formats import E4M3
    from cpemu.profile import get_profile

    prof = get_profile("hopper-h200-torch")
    plan = prof.plan(M, N, K, True)
    tracemalloc.start()
    ref.gemm_codes(a, bt, E4M3, E4M3, plan, prof.instruction, prof.mode("tensorwise")["epilogue"],
                   np.float32(1), np.float32(1), None, "float32", threads=1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak <= budget(M, N, K, threads=1), f"peak {peak / 2**20:.1f} MiB > {budget(M, N, K, 1) / 2**20:.1f} MiB"
