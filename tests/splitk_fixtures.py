"""Shared by the split-K tests: a made-up heuristic, a small plan and the split bound written out."""

import numpy as np

from cpemu.recording import splitk_enum as se


def fake_answer(M, N, K, c):
    """An answer of the heuristic, made up (None: no algorithm): the configuration fields and the
    workspace size, as the querier returns them."""
    if (M * N + K) % 97 == 0:
        return None
    s = 1 + (M + N + K // 256 + (c["out_dtype"] == "float16") + c["fast_accum"]) % 3
    return (66, 10 + M % 2, 36, 4, s, 2 if s > 1 else 0, 0, 1, 0, 4 * s * M * N + 16)


def small_plan():
    """A plan of a few dozen pairs (N up to 64, K up to 6400, a 16 KiB workspace)."""
    return se.default_plan(n_max=64, k_max=6400, k_step=16, bound=dict(se.BOUND, workspace_bytes=1 << 14))


def checked_split(verified, tile, s):
    """The documented meaning of ``verified_splits``: a tile's largest checked count, or its list of
    checked counts; one slice needs no check."""
    v = verified.get(str(int(tile)), 1)
    return s <= 1 or (s in v if isinstance(v, list) else s <= v)


def tail_cut(K, s):
    """The profile's tail rule, written out on its own: the H200 sums K - 16 where there are 17 or
    more slices, K = 16 mod 32 and K - 16 is a whole number of 128-wide K tiles per slice."""
    return s >= 17 and K % 32 == 16 and K > 16 and (K - 16) % (128 * s) == 0


#: a split-region shape that the complete record reaches last (it asks M ascending, then N), so
#: the shipped tables do not answer it: cpemu refuses it as unrecorded
UNRECORDED = (4000, 16, 5184)


def bound_u(bound, M, N, K):
    """The split bound in numpy, from a profile's parameters (not cpemu.splitk's code)."""
    n32 = -(-N // bound["n_align"]) * bound["n_align"]
    per = bound["bytes_per_partial"] * M * n32
    return np.minimum(-(-K // bound["k_per_split"]) - 1, (bound["workspace_bytes"] - bound["workspace_reserve"]) // per)
