"""Shared by the split-K tests: a made-up heuristic, a small plan, the split bound written out, and a
profile whose complete table holds only part of its plan."""

import atexit
import functools
import json
import os
import shutil
import tarfile
import tempfile

import numpy as np

import cpemu
from cpemu.recording import splitk_enum as se

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "h200-splitk")


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


#: a split-region shape of the complete record's plan (the shipped table answers it: 2 slices for
#: e4m3 x e4m3, bf16 out, fast accumulation) that :func:`partial_profile`'s table does not hold
UNRECORDED = (1, 1536, 7168)


@functools.lru_cache(maxsize=None)
def partial_profile():
    """The shipped hopper-h200-torch profile with a complete table merged from the part files of
    ``complete/rec.txz`` only (149 pairs, all with M >= 3968): every other pair of the plan is in the
    table's plan and not recorded, as in a record that has not finished, so the profile refuses
    such a shape (``UNRECORDED``) as unrecorded."""
    d = tempfile.mkdtemp(prefix="cpemu-partial-")
    atexit.register(shutil.rmtree, d, True)
    with tarfile.open(os.path.join(_DATA, "complete", "rec.txz")) as t:
        t.extractall(d, filter="data")
    se.merge(os.path.join(d, "rec"), os.path.join(d, "partial.npz"))
    data = json.loads(json.dumps(cpemu.get_profile("hopper-h200-torch").data))
    params = data["modes"]["tensorwise"]["split_k"]["params"]
    shutil.copy(os.path.join(os.path.dirname(cpemu.__file__), "profile_data", params["table_file"]), d)
    params["complete_file"] = "partial.npz"
    path = os.path.join(d, "hopper-h200-torch.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return cpemu.get_profile(path)


def bound_u(bound, M, N, K):
    """The split bound in numpy, from a profile's parameters (not cpemu.splitk's code)."""
    n32 = -(-N // bound["n_align"]) * bound["n_align"]
    per = bound["bytes_per_partial"] * M * n32
    return np.minimum(-(-K // bound["k_per_split"]) - 1, (bound["workspace_bytes"] - bound["workspace_reserve"]) // per)
