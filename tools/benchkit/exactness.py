"""Exactness checks of the benchmarks: output bit patterns, the reference's first rows, and
bitwise comparison."""

from __future__ import annotations

import hashlib

import numpy as np

from benchkit import FMT
from cpemu import reference as ref
from cpemu.formats import FP8_FORMATS, OUT_DTYPES, encode_output


def bits(x: np.ndarray) -> np.ndarray:
    """The bit patterns of an output (uint32 for 4-byte elements, else uint16), C order."""
    x = np.ascontiguousarray(x)
    return x.view(np.uint32) if x.dtype.itemsize == 4 else x.view(np.uint16)


def reference_rows(a, bt, plan, model, mode, sa, sb, out_dtype: str, rows: int) -> np.ndarray:
    """The reference's output bits of the first ``rows`` rows, full width, with the plan of the
    full shape (the split-K schedule depends on M, so cpemu.gemm on the rows alone could differ)."""
    fmt = FP8_FORMATS[FMT]
    a_ops = ref.decode(a[:rows], fmt)
    b_ops = ref.decode(bt, fmt)
    N = bt.shape[0]
    out = np.empty((rows, N), dtype=OUT_DTYPES[out_dtype])
    nan_bits = (mode.get("nan_bits") or {}).get(out_dtype)
    for rb, cb in ref.blocks(rows, N, model.L):
        acc = ref.accumulate(a_ops.rows(rb), b_ops.rows(cb), plan, model)
        y = ref.epilogue(acc, sa, sb, None, mode["epilogue"])
        out[rb, cb] = encode_output(y, out_dtype, nan_bits)
    return bits(out)


def sha256(x: np.ndarray) -> str:
    """sha256 of the raw output bytes (C order)."""
    return hashlib.sha256(np.ascontiguousarray(x).view(np.uint8)).hexdigest()


def compare(got: np.ndarray, want: np.ndarray, limit: int = 8) -> dict:
    """Bitwise comparison of two bit-pattern arrays (got's leading rows against want)."""
    if got.shape[1:] != want.shape[1:] or got.shape[0] < want.shape[0] or got.dtype != want.dtype:
        return {"ok": False, "mismatches": None, "error": f"shape/dtype {got.shape} {got.dtype} vs "
                                                          f"{want.shape} {want.dtype}"}
    g = got[: want.shape[0]]
    bad = g != want
    n = int(np.count_nonzero(bad))
    first = []
    if n:
        width = 8 if g.dtype.itemsize == 4 else 4
        for idx in np.argwhere(bad)[:limit]:
            i = tuple(int(v) for v in idx)
            first.append({"at": list(i), "got": f"0x{int(g[i]):0{width}x}", "want": f"0x{int(want[i]):0{width}x}"})
    return {"ok": n == 0, "compared": int(want.size), "mismatches": n, "first_mismatches": first}
