"""Split-K rules: how many K slices the GPU library's heuristic picks for a call.

A profile's ``split_k`` section (``kind: "rule"``) says, from recorded cuBLASLt
heuristic answers (``tools/splitk_table.py``, ``tools/build_splitk_rule.py``):

* no split when ``K <= k_max_nosplit`` or ``M*N >= mn_min_nosplit`` (predicates checked
  with zero violations on the recorded and held-out queries listed in the table file's
  ``rule.checks``);
* otherwise the recorded answer for exactly this shape and option combination
  ``a_format,b_format,out_dtype,fast|promo`` from the table file;
* otherwise :class:`~cpemu.schedule.UnsupportedShape`: cpemu does not guess.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources

from .schedule import UnsupportedShape

__all__ = ["splits_from_rule", "load_table"]


@lru_cache(maxsize=None)
def load_table(name: str, base_dir: str | None = None):
    if base_dir is None:
        text = resources.files("cpemu.profile_data").joinpath(name).read_text()
    else:
        with open(os.path.join(base_dir, name)) as f:
            text = f.read()
    doc = json.loads(text)
    index = {tuple(s): i for i, s in enumerate(doc["shapes"])}
    return doc, index


def splits_from_rule(params: dict, M: int, N: int, K: int, fast_accum: bool, combo: tuple,
                     base_dir: str | None = None) -> int:
    if K <= params["k_max_nosplit"] or M * N >= params["mn_min_nosplit"]:
        return 1
    doc, index = load_table(params["table_file"], base_dir)
    a_format, b_format, out_dtype = combo
    key = f"{a_format},{b_format},{out_dtype},{'fast' if fast_accum else 'promo'}"
    i = index.get((M, N, K))
    ch = doc["tables"].get(key, "")[i] if i is not None and key in doc["tables"] else "?"
    if ch == "?":
        raise UnsupportedShape(
            f"cuBLASLt may split K for M={M}, N={N}, K={K} ({key}): K > {params['k_max_nosplit']} and "
            f"M*N < {params['mn_min_nosplit']}, and this shape's split-K count is not in the profile's "
            f"recorded table; record it on the GPU with tools/splitk_table.py (cpemu does not guess)")
    if ch == "x":
        raise UnsupportedShape(f"cuBLASLt has no algorithm for M={M}, N={N}, K={K} ({key}); torch raises here")
    return int(ch, 36)
