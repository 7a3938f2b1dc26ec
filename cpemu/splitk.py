"""Split-K rules: how many K slices the GPU library's heuristic picks for a shape.

Filled from the recorded cuBLASLt heuristic tables (tools/cublaslt_heuristic.py).
"""

from __future__ import annotations

from .schedule import UnsupportedShape

__all__ = ["splits_from_rule"]


def splits_from_rule(params: dict, M: int, N: int, K: int, fast_accum: bool) -> int:
    kind = params.get("kind", "table-only")
    raise UnsupportedShape(
        f"shape M={M}, N={N}, K={K} is not in this profile's recorded split-K table (rule kind {kind!r})")
