"""Rows of one FP8 GEMM in chunks that keep its bits: :func:`row_chunks`.

Each output row of a GEMM depends on its own input row and on the schedule (the split-K
slices and the promotion). So chunks over M give the one call's bits exactly when every
chunk runs the one call's schedule. cpemu chunks only where that schedule is unsplit:

* every chunk size (the chunk and the shorter last one) has an unsplit plan in the profile;
* the whole M is unsplit: its plan is unsplit where M lies in the profile's domain, and
  beyond it the profile's split-K bound leaves no room for a second slice (the bound falls
  as M grows: the workspace cannot hold two partials, or K is too short to split).

Long contexts (Evo 2 at a million tokens) pass the domain's M; an unsplit projection is
still answered there, chunk by chunk.
"""

from __future__ import annotations

from ..profile import get_profile
from ..splitk import UnsupportedShape, split_bound

__all__ = ["row_chunks", "UnsupportedShape"]


def _m_limit(rule) -> int:
    dom = rule.domain or {}
    return int(dom.get("M", (1, 1 << 62))[1])


def _cannot_split(rule, M: int, N: int, K: int) -> bool:
    """The profile's split-K rule leaves no room for a split at (M, N, K)."""
    if rule.kind == "none":
        return True
    bound = (rule.params or {}).get("bound")
    return bound is not None and split_bound(bound, M, N, K) <= 1


def row_chunks(profile, M: int, N: int, K: int, *, fast_accum: bool = True, out_dtype: str = "bfloat16",
               a_format: str = "e4m3", b_format: str = "e4m3", max_rows: int | None = None) -> list:
    """Row ranges ``[(start, stop), ...]`` whose tensorwise calls give the bits of the one
    (M, N, K) call (see the module docstring). One range where M fits the profile's domain
    and ``max_rows`` is None or at least M. ``max_rows`` (a multiple of 16) caps a chunk.

    Raises :class:`~cpemu.splitk.UnsupportedShape` where the chunks' schedule might not be
    the one call's (a split shape), and ValueError for a bad ``max_rows``."""
    prof = get_profile(profile)
    rule = prof.split_rule("tensorwise")
    limit = _m_limit(rule)
    if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 16 or max_rows % 16):
        raise ValueError(f"max_rows: must be a positive multiple of 16 (got {max_rows!r})")
    cap = min(limit // 16 * 16, max_rows or limit)
    if M <= cap:
        return [(0, M)]
    combo = dict(fast_accum=fast_accum, scaling="tensorwise", a_format=a_format, b_format=b_format,
                 out_dtype=out_dtype)
    for rows in sorted({cap, M % cap or cap}):
        if prof.plan(rows, N, K, **combo).splits != 1:
            raise UnsupportedShape(f"M={M} rows cannot be chunked for N={N}, K={K}: the profile splits K for "
                                   f"a chunk of {rows} rows, so chunks need not have the whole call's schedule")
    whole_unsplit = prof.plan(M, N, K, **combo).splits == 1 if M <= limit else _cannot_split(rule, M, N, K)
    if not whole_unsplit:
        raise UnsupportedShape(f"M={M} rows cannot be chunked for N={N}, K={K}: the whole call may split K "
                               f"(the profile's split-K bound leaves room for more than one slice)")
    return [(i, min(i + cap, M)) for i in range(0, M, cap)]
