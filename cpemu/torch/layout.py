"""Memory layouts as torch and c10 decide them: dense tensors and cuBLASLt's row/column-major test."""

from __future__ import annotations


def _non_overlapping_and_dense(t) -> bool:
    """c10's ``compute_non_overlapping_and_dense`` for a tensor of any rank."""
    sizes, strides = t.shape, t.stride()
    if len(sizes) == 2:
        return _dense_2d(sizes[0], sizes[1], strides[0], strides[1])
    return _dense_any(list(sizes), list(strides))


def _dense_2d(s0: int, s1: int, t0: int, t1: int) -> bool:
    """:func:`_dense_any` for rank 2, without the sort (the drop-in's per-call path)."""
    if s0 < 2:
        return s1 < 2 or t1 == 1
    if s1 < 2:
        return t0 == 1
    if t1 < t0:  # dims sorted by stride (stable): the inner one must have stride 1, the outer its size
        return t1 == 1 and t0 == s1
    return t0 == 1 and t1 == s0


def _dense_any(sizes: list, strides: list) -> bool:
    if len(sizes) == 1:
        return sizes[0] < 2 or strides[0] == 1
    perm = sorted(range(len(sizes)), key=lambda d: (sizes[d] < 2, strides[d] if sizes[d] >= 2 else 0))
    require = 1
    for d in perm:
        if sizes[d] < 2:
            return True
        if strides[d] != require:
            return False
        require *= sizes[d]
    return True


def _cublas_transposed(t) -> bool:
    """``transpose_tensor`` of ATen's ``prepare_matrix_for_cublas`` (True: row-major-like)."""
    if _non_overlapping_and_dense(t):
        return t.is_contiguous()
    (s0, _), (t0, t1) = t.shape, t.stride()
    # column-major-like -> False; row-major-like, or cloned to contiguous by ATen -> True
    return not (t0 == 1 and t1 >= max(1, s0))
