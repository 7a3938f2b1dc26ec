"""The Evo 2 demo calls of ``cpemu gemm --demo``, and whether an output is the H200's recorded one.

A demo call is a :class:`~cpemu.cases.Case` on an Evo 2 projection shape with ``gauss40`` data.
The H200 recorded one such call per shape (M = 16, seed 40, 41, 42, random FP32 tensor scales
drawn from the seed, bf16 output, fast accumulation): ``--recorded`` runs it. Their output
sha256 ship with the package (``profile_data/hopper-h200-torch.recorded-demos.json``, copied from
the truth recording), so :func:`verdict` can say whether a demo's output is the H200's.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from .cases import EVO2_SHAPES, Case

__all__ = ["RECORDED_PROFILE", "recorded_demos", "demo_case", "recorded_case", "verdict"]

RECORDED_PROFILE = "hopper-h200-torch"
_FILE = f"{RECORDED_PROFILE}.recorded-demos.json"


@lru_cache(maxsize=1)
def recorded_demos() -> dict:
    """demo name -> (its recorded Case, the sha256 of the H200's output bits)."""
    doc = json.loads(resources.files("cpemu.profile_data").joinpath(_FILE).read_text())
    return {d["demo"]: (Case.from_json(d), d["output_sha256"]) for d in doc["cases"]}


def demo_case(demo: str | None, M: int | None, seed: int, a_format: str | None, b_format: str | None,
              fast_accum: bool = True, out_dtype: str = "bfloat16", scale: str = "unit") -> Case:
    """The Case a demo runs (default ``evo2-1b`` at M = 16)."""
    N, K = EVO2_SHAPES[demo or "evo2-1b"]
    return Case(16 if M is None else M, N, K, data="gauss40", seed=seed, a_format=a_format or "e4m3",
                b_format=b_format or "e4m3", fast_accum=fast_accum, out_dtype=out_dtype, scale=scale)


def recorded_case(demo: str | None) -> Case:
    """The call of ``demo`` that the H200 recorded."""
    return recorded_demos()[demo or "evo2-1b"][0]


def verdict(case: Case, profile: str, manifest_sha256: str) -> dict:
    """Whether the output of ``case`` (its bits' sha256 as a truth manifest writes it) is the
    H200's recorded output: ``{"recorded": bool, "case": id or None, "equal": bool or None,
    "text": one line}``."""
    hit = next(((c, h) for c, h in recorded_demos().values() if c == case), None)
    if hit is None:
        return {"recorded": False, "case": None, "equal": None,
                "text": "not a call the H200 recorded (add --recorded to run the recorded one)"}
    rec, want = hit
    if profile != RECORDED_PROFILE:
        return {"recorded": True, "case": rec.id, "equal": None,
                "text": f"the H200 recorded this call ({rec.id}); profile {profile} models another GPU, "
                        f"so its output is not compared"}
    equal = manifest_sha256 == want
    return {"recorded": True, "case": rec.id, "equal": equal,
            "text": (f"equals the H200's recorded output ({rec.id}, sha256 {want[:16]}...)" if equal else
                     f"DIFFERS from the H200's recorded output ({rec.id}: recorded {want[:16]}..., "
                     f"got {manifest_sha256[:16]}...)")}
