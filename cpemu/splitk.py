"""Split-K rules: how many K slices the GPU library's heuristic picks for a call.

A profile's ``split_k`` section says, from recorded cuBLASLt heuristic answers:

* ``kind: "none"``: the library never splits K (within ``domain``);
* ``kind: "rule"``: the laws in ``params["bound"]`` first. The split count ``s`` never exceeds
  ``u = min(ceil(K / k_per_split) - 1, floor((workspace - reserve) / (4 * M * ceil32(N))))``:
  the K bound and the workspace bound (the FP32 partials of ``s`` slices must fit torch's
  cuBLASLt workspace). Where ``u <= 1`` nothing splits. Elsewhere the answer is read from
  the point table (``params["table_file"]``), else from the complete table
  (``params["complete_file"]``, every K of a recorded (M, N) pair, see
  :mod:`cpemu.splitk_complete`; a list of such tables, each of its own range of N and K, is
  read in its order), else the shape is refused with :class:`UnsupportedShape`:
  cpemu does not guess. A complete-table answer is used only where its split count was verified
  for its tile (``params["verified_splits"]``: a largest count, or a list of counts).

The laws' support and violation counts are in the profile's ``source``;
:mod:`cpemu.recording.splitk_rule` counts them on recorded answers (tools/build_splitk_rule.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .splitk_complete import load_complete, lookup

__all__ = ["UnsupportedShape", "SplitKRule", "covered_k", "split_bound", "splits_from_rule", "load_table", "combo_key",
           "no_algorithm", "split_verified", "complete_names", "table_range", "beyond_complete"]


class UnsupportedShape(ValueError):
    """The profile cannot say which schedule its GPU library uses for this shape.

    ``reason`` names the rule that refused it: ``"unrecorded"`` (a split-K count no table
    holds), ``"unverified-split"`` (a split count not checked against GPU outputs for its tile),
    ``"no-algorithm"`` (the library has none; torch raises), ``"maybe-no-algorithm"`` (a region
    where the library has none for most shapes), ``"outside-domain"``, or ``"other"``."""

    REASONS = ("unrecorded", "unverified-split", "no-algorithm", "maybe-no-algorithm", "outside-domain", "other")

    def __init__(self, message: str, reason: str = "other"):
        super().__init__(message)
        if reason not in self.REASONS:
            raise ValueError(f"UnsupportedShape reason must be one of {self.REASONS} (got {reason!r})")
        self.reason = reason


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def split_bound(bound: dict, M: int, N: int, K: int) -> int:
    """The largest split count the library can pick for (M, N, K): ``min(K bound, workspace bound)``."""
    k_bound = -(-K // bound["k_per_split"]) - 1
    per_split = bound["bytes_per_partial"] * M * _ceil_to(N, bound["n_align"])
    return min(k_bound, (bound["workspace_bytes"] - bound["workspace_reserve"]) // per_split)


def combo_key(a_format: str, b_format: str, out_dtype: str, fast_accum: bool) -> str:
    """The key of an option combination in the split-K tables: ``a,b,out,fast|promo``."""
    return f"{a_format},{b_format},{out_dtype},{'fast' if fast_accum else 'promo'}"


def _read_text(name: str, base_dir: str | None) -> str:
    if base_dir is None:
        return resources.files("cpemu.profile_data").joinpath(name).read_text()
    with open(os.path.join(base_dir, name)) as f:
        return f.read()


@lru_cache(maxsize=None)
def load_table(name: str, base_dir: str | None = None):
    """The point table: answers for single shapes, one character per shape and combination."""
    try:
        doc = json.loads(_read_text(name, base_dir))
        index = {tuple(s): i for i, s in enumerate(doc["shapes"])}
        if not isinstance(doc.get("tables"), dict):
            raise TypeError("no 'tables' object")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"profile: split-K point table {name!r} (table_file) is not readable: "
                         f"{type(e).__name__}: {e}") from None
    return doc, index


def _from_points(params: dict, M: int, N: int, K: int, key: str, base_dir) -> str:
    """The point table's character for the shape: a split count in base 36, ``x`` or ``?``."""
    if "table_file" not in params:
        return "?"
    doc, index = load_table(params["table_file"], base_dir)
    i = index.get((M, N, K))
    return doc["tables"].get(key, "")[i] if i is not None and key in doc["tables"] else "?"


def covered_k(K: int, splits: int, granularity: int, tail: dict | None) -> int:
    """How much of K the kernel sums: all of it, except where the profile's ``tail`` rule holds.

    ``tail`` = {"min_splits": m, "align": a}: with at least m slices and K not a multiple of a,
    K rounded down to a multiple of a is what the slices cover when it is a whole number of K
    tiles per slice; the elements beyond it are left out. Otherwise the kernel slices all of K
    (:func:`cpemu.schedule.slices_for`). Measured on the H200's outputs (the profile's
    ``tail.source``); ``tail["verified"]`` lists per tile the split counts where the cut was seen
    (:func:`_verified` refuses the others)."""
    if not tail or splits < tail["min_splits"] or K % tail["align"] == 0:
        return K
    cut = K - K % tail["align"]
    return cut if cut > 0 and cut % (splits * granularity) == 0 else K


def split_verified(params: dict, tile, s: int) -> bool:
    """Whether cpemu's slicing was reproduced bit for bit on the GPU for ``s`` slices with kernel
    tile ``tile``. ``params["verified_splits"]`` maps a tile id to the largest such count (every
    count up to it was checked) or to the list of the counts checked; one slice always is."""
    if s <= 1:
        return True
    v = params.get("verified_splits", {}).get(str(int(tile)), 1)
    return s in v if isinstance(v, list) else s <= v


def _verified(params: dict, config: dict, M: int, N: int, K: int, key: str, tail: dict | None = None,
              granularity: int = 128) -> int:
    """The split count of a recorded configuration, where cpemu's slicing was checked for its tile
    (:func:`split_verified`) and, where the tail rule cuts K (:func:`covered_k`), the cut was seen
    for its tile and count; other counts are refused."""
    s = config["splitk_num"]
    tile = config.get("tile_id")
    if covered_k(K, s, granularity, tail) != K and s not in tail.get("verified", {}).get(str(tile), []):
        raise UnsupportedShape(
            f"cuBLASLt splits K into {s} slices for M={M}, N={N}, K={K} ({key}) with tile id {tile}; with this "
            f"many slices the H200's kernels were seen to leave the last {K % tail['align']} elements of such a K "
            f"out, but not yet with this tile and count", "unverified-split")
    if "verified_splits" not in params or split_verified(params, tile, s):
        return s
    v = params["verified_splits"].get(str(config.get("tile_id")), 1)
    checked = f"up to {v} slices" if not isinstance(v, list) else f"for {', '.join(map(str, v))} slices"
    raise UnsupportedShape(
        f"cuBLASLt splits K into {s} slices for M={M}, N={N}, K={K} ({key}) with tile id {config.get('tile_id')}; "
        f"cpemu's slicing was checked against GPU outputs with this tile only {checked}",
        "unverified-split")


def complete_names(params: dict) -> list[str]:
    """The complete tables of a split rule's params, in the order they are read (``complete_file``:
    one name or a list)."""
    names = params.get("complete_file", [])
    return [names] if isinstance(names, str) else list(names)


def table_range(meta: dict) -> tuple[int, int, int, int]:
    """(n_min, n_max, k_min, k_max) of a complete table's plan (its ``meta``)."""
    return meta.get("n_min", 16), meta["n_max"], meta["k0"], meta["k0"] + meta["k_step"] * (meta["nk"] - 1)


def beyond_complete(params: dict, base_dir: str | None, N: int, K: int) -> str:
    """Where (N, K) lies in no complete table's plan: a clause that says so (else "")."""
    ranges = [table_range(load_complete(name, base_dir).meta) for name in complete_names(params)]
    if not ranges or any(n0 <= N <= n1 and k0 <= K <= k1 for n0, n1, k0, k1 in ranges):
        return ""
    if len(ranges) == 1:
        return f" (the complete table's plan holds N <= {ranges[0][1]} and K <= {ranges[0][3]} only)"
    held = "; ".join(f"N {n0}..{n1} with K {k0}..{k1}" for n0, n1, k0, k1 in ranges)
    return f" (the complete tables' plans hold {held} only)"


def splits_from_rule(params: dict, M: int, N: int, K: int, fast_accum: bool, combo: tuple,
                     base_dir: str | None = None, tail: dict | None = None, granularity: int = 128) -> int:
    u = split_bound(params["bound"], M, N, K)
    if u <= 1:
        return 1
    a_format, b_format, out_dtype = combo
    key = combo_key(a_format, b_format, out_dtype, fast_accum)
    ch = _from_points(params, M, N, K, key, base_dir)
    s = "x" if ch == "x" else (None if ch == "?" else int(ch, 36))
    for name in complete_names(params) if s is None else ():
        s = lookup(name, base_dir, M, N, K, key)
        if s is not None:
            break
    if isinstance(s, dict):
        s = _verified(params, s, M, N, K, key, tail, granularity)
    if s is None:
        # beyond every complete table's plan the split region is outside the recorded domain; inside a plan
        # the shape is one the record has not reached yet
        beyond = beyond_complete(params, base_dir, N, K)
        raise UnsupportedShape(
            f"cuBLASLt may split K for M={M}, N={N}, K={K} ({key}): up to {u} slices fit the K and workspace "
            f"bounds, and this shape's split-K count is not in the profile's recorded tables"
            f"{beyond}; record it on the "
            f"GPU with python -m cpemu.recording.splitk_enum, or state the count with cpemu.gemm(..., split_k=s) "
            f"(cpemu does not guess)", "outside-domain" if beyond else "unrecorded")
    if s == "x":
        raise UnsupportedShape(f"cuBLASLt has no algorithm for M={M}, N={N}, K={K} ({key}); torch raises here",
                               "no-algorithm")
    return s


@dataclass(frozen=True)
class SplitKRule:
    """Which split-K count the library picks, as recorded in a profile.

    ``kind``:
      * ``"none"``  -- never splits (recorded so, or profiles whose library schedule was not
        recorded: the emulator then models an unsplit CUTLASS-style kernel and says so);
      * ``"rule"``  -- the laws and tables of the profile (see :func:`splits_from_rule`).
    Shapes outside ``domain`` are refused, except where ``domain["no_split"]`` (wider ranges of M, N
    and K, with the ``source`` of their evidence) holds them and nothing can split there: the
    split bound is at most 1 (kind ``"rule"``), or the library never splits (kind ``"none"``).
    """

    kind: str
    granularity: int = 128
    domain: dict | None = None  # {"M": [lo, hi], "N": ..., "K": ..., "extra_NK": [[N, K], ...], "no_split": {...}}
    params: dict | None = None
    base_dir: str | None = None  # where the params' table files lie; None: the shipped profiles
    tail: dict | None = None  # where the kernel leaves the end of K out (cpemu.schedule.covered_k)

    def _outside(self, M: int, N: int, K: int) -> str | None:
        """Why (M, N, K) lies outside ``domain``'s ranges, or None."""
        dom = self.domain or {}
        extra = [tuple(x) for x in dom.get("extra_NK", ())]
        for ax, v in (("M", M), ("N", N), ("K", K)):
            lo, hi = dom.get(ax, (1, 1 << 62))
            if not lo <= v <= hi and not (ax in "NK" and (N, K) in extra):
                what = ("for which this profile's split-K choice was recorded" if self.kind == "rule" else
                        "of this profile's stated domain (its schedule is assumed only there)")
                return f"{ax}={v} is outside the range {lo}..{hi} {what}"
        return None

    def splits(self, M: int, N: int, K: int, fast_accum: bool, combo: tuple = ("e4m3", "e4m3", "bfloat16")) -> int:
        """Number of split-K slices; ``combo`` is (a_format, b_format, out_dtype)."""
        why = self._outside(M, N, K)
        if why is not None:
            return self._beyond(why, M, N, K)
        if self.kind == "none":
            return 1
        return splits_from_rule(self.params or {}, M, N, K, fast_accum, combo, self.base_dir, self.tail,
                                self.granularity)


    def _beyond(self, why: str, M: int, N: int, K: int) -> int:
        """A shape outside the domain's ranges: 1 where ``domain["no_split"]`` holds it and nothing
        can split there (kind ``"none"``, or the split bound is at most 1), else refused."""
        ns = (self.domain or {}).get("no_split")
        unknown = "the GPU library's schedule there is unknown"
        if ns is None:
            raise UnsupportedShape(f"{why}; {unknown}", "outside-domain")
        ranges = ", ".join(f"{ax} {ns[ax][0]}..{ns[ax][1]}" for ax in "MNK")
        if not all(ns[ax][0] <= v <= ns[ax][1] for ax, v in (("M", M), ("N", N), ("K", K))):
            raise UnsupportedShape(f"{why}, and outside {ranges}, where shapes that cannot split are answered; "
                                   f"{unknown}", "outside-domain")
        if self.kind == "none":
            return 1
        u = split_bound((self.params or {})["bound"], M, N, K)
        if u <= 1:
            return 1
        raise UnsupportedShape(f"{why}; beyond it (up to {ranges}) only shapes where nothing can split are "
                               f"answered, and up to {u} slices fit the K and workspace bounds here; "
                               f"{unknown}", "outside-domain")


def no_algorithm(spec: dict | None, M: int, N: int, K: int, fast_accum: bool, has_bias: bool,
                 combo: tuple = ("e4m3", "e4m3", "bfloat16"), base_dir: str | None = None) -> tuple[str, str] | None:
    """Why the library has, or may have, no algorithm for this call, as (message, reason), where the
    mode's split-K section records such a region (``no_algorithm``: bias and fast accumulation where
    the split bound :func:`split_bound` is at least ``bound_at_least``); None where it has one.

    Where ``spec["none_below_n"]`` is given, the region's shapes with a smaller N are decided by that
    measured law: no algorithm (``"no-algorithm"``). Where ``spec["complete_file"]`` names tables of
    the region (``splitk_enum run --options rowwise-bias``), a recorded shape is decided: reason
    ``"no-algorithm"`` where the heuristic has none (torch raises), None where it has one. Elsewhere in
    the region the heuristic answers only some shapes and torch raises for the rest; cpemu does not
    guess which (``"maybe-no-algorithm"``)."""
    if not spec or not has_bias or not fast_accum:
        return None
    u = split_bound(spec["bound"], M, N, K)
    if u < spec["bound_at_least"]:
        return None
    key = combo_key(*combo, True)
    none = (f"cuBLASLt has no algorithm for M={M}, N={N}, K={K} ({key}) with bias and fast accumulation in this "
            f"scaling mode{{}}; torch raises CUBLAS_STATUS_NOT_SUPPORTED here")
    if N < spec.get("none_below_n", 0):
        law = f"none below N = {spec['none_below_n']} (a law of the profile's recorded answers)"
        return none.format(f": where K can split it has {law}"), "no-algorithm"
    for name in complete_names(spec):
        got = lookup(name, base_dir, M, N, K, key)
        if got == "x":
            return none.format(""), "no-algorithm"
        if got is not None:
            return None
    return (f"cuBLASLt may have no algorithm for M={M}, N={N}, K={K} with bias and fast accumulation in this "
            f"scaling mode (the split bound is {u} >= {spec['bound_at_least']}): torch raises "
            f"CUBLAS_STATUS_NOT_SUPPORTED for most such shapes, and which ones it answers is not recorded"
            f"{beyond_complete(spec, base_dir, N, K)} (cpemu does not guess)", "maybe-no-algorithm")
