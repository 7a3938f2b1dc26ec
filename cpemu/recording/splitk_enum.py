"""The complete split-K record: every shape the laws leave open, asked of cuBLASLt as torch asks.

The open shapes are the (M, N, K) with split bound ``u >= 2`` (:func:`cpemu.splitk.split_bound`)
inside the plan's domain, K on a grid of ``k_step`` (16: the answer changes on any K step of
16, see tests/data/h200-splitk/measured/README.md). Bias does not change the answer and
rowwise scaling never splits, so the option combinations are the formats x output dtype x fast
accumulation of tensorwise scaling. The unit of work is one (M, N) pair: every K of the grid
for every combination.

    python -m cpemu.recording.splitk_enum run --dir REC --jobs 16 --seconds 540
    python -m cpemu.recording.splitk_enum status --dir REC
    python -m cpemu.recording.splitk_enum merge --dir REC --out hopper-h200-torch.splitk-complete.npz

Ranges beside the default plan (N and K up to 65536) are plans of their own, recorded into tables of
their own, which a profile lists after the first in ``complete_file``:

    python -m cpemu.recording.splitk_enum run --dir REC2 --k-min 65552 --k-max 131072 --n-max 131072
    python -m cpemu.recording.splitk_enum run --dir REC3 --n-min 65552 --n-max 131072

Rowwise scales never split, but with bias and fast accumulation the heuristic may have no algorithm
(torch raises there). ``--options rowwise-bias`` records those 6 combinations instead, into a table of
its own whose answers say only whether an algorithm exists (``NONE`` where it does not):

    python -m cpemu.recording.splitk_enum run --dir REC4 --options rowwise-bias --n-min 8192

``run`` writes ``REC/plan.json`` on the first call; worker ``w`` of ``W`` takes the pairs
``w, w + W, ...`` and appends one line per finished pair to ``REC/part-<w>-of-<W>.jsonl``
(configurations first seen get their own line). Running again continues where each worker
stopped (a line cut off by an interruption is dropped and its pair asked again), with the same
or another number of workers (pairs in any part file are skipped). One worker per CPU core (the heuristic runs on the host; on a host of several GPUs the workers
spread over them, :func:`worker_gpu`): on
the H200 host one process answered about 3,000 queries/s and 16 processes on 16 cores 48,270/s
(with :class:`.splitk_query.Querier`; the workers now ask through its lean form, which checks itself
against it).
``merge`` reads every part file and writes the shipped table
(:mod:`cpemu.splitk_complete`). ``status``, ``merge`` and ``run`` (continuing a record) check
``plan.json`` and every line of the part files first: the last line of a file, cut off by a stopped
worker (it has no newline), is dropped; any other line that is not one the workers write, and a
pair outside the plan, is refused (:class:`click.ClickException` naming the file and the line).

Sentinels (:data:`SENTINEL_EVERY_S`, :func:`sentinels_for`): each worker asks a few recorded answers
again before its first pair, about once a minute and before it stops. Where one is answered otherwise
the worker drops the pairs it wrote since its last passing check, writes a ``sentinel`` line and stops
(``status`` counts them; a later run on a sound host fills the gap). A first rowwise-bias record went
wrong part-way through on one host, with no error (``tests/data/h200-splitk/rowbias/README.md``).

The fast-accumulation law (``run --fast-law``, the default of that command; measured on the H200,
so :func:`run_parallel` and ``cpemu record`` leave it off unless asked): for M <= :data:`FAST_LAW_M_MAX` fast
accumulation changed no answer of the split region in any measurement (see
:data:`FAST_LAW_M_MAX`), so such a pair asks only the fast-accumulation combinations and copies
their answers to the others; every :data:`FAST_LAW_CHECK_EVERY`-th such pair is still asked in
full and compared. A difference is written as a ``violation`` line, the asked answers stand, and
no worker uses the law again on that record; the pairs it derived before are left out of the merge
and asked again.

The K law (``run --k-law``, also that command's default, and also measured on the H200): the
answer depends on K only through ``ceil(K / 128)`` and K's alignment ``min(K & -K, 64)``, so of
the eight K of a 128-wide block only three are asked (:func:`k_law_rep`) and copied to the others;
every :data:`K_LAW_CHECK_EVERY`-th pair is asked at every K and compared, with its own
``violation`` lines (``"law": "k"``).
"""

from __future__ import annotations

import glob
import json
import math
import multiprocessing as mp
import os
import time
from collections import ChainMap
from collections.abc import Mapping

import click
import numpy as np

from ..splitk import combo_key, split_bound
from ..splitk_complete import NONE, column_runs, write_table
from .splitk_query import CONFIG_FIELDS
from .splitk_rule import BOUND
from .splitk_table import combos

#: Fast accumulation changed no answer of the split region for M <= 32: 0 of 48,684 shapes
#: (tests/data/h200-splitk/measured gran.npz and large.npz, every option combination compared) and
#: 0 of 19,676,736 answer pairs of the complete record's first 579 pairs (M <= 19). The smallest M
#: where it changed an answer is 44 (large.npz).
FAST_LAW_M_MAX = 32
#: of the pairs the law decides, every this many-th is asked in full and compared
FAST_LAW_CHECK_EVERY = 8

#: The K law: the answer is the same for every K of one 128-wide block (``ceil(K / 128)``) with the
#: same alignment ``min(K & -K, 64)``: 16, 32, or 64 and more. No answer broke it in the measured
#: dense samples (tests/data/h200-splitk/measured gran.npz: 100,224 shapes, M <= 2030, N <= 12560,
#: K 2576..16384, 30 option combinations with bias and rowwise, in 37,584 groups) or in the complete
#: record's first 579 pairs (10,422 columns of 3,776 K, 1,416 groups each); with a coarser block
#: (256) or without the 64 class, 189 and 535 groups of those samples differ.
K_LAW_BLOCK = 128
K_LAW_ALIGN_CAP = 64
#: of the pairs the K law decides, every this many-th is asked at every K and compared
K_LAW_CHECK_EVERY = 16

#: Sentinels: recorded answers a worker asks again before its first pair, then whenever this many seconds
#: have passed since its last check (between pairs), and once more before it stops. A different answer means
#: the host no longer answers as it did when they were recorded: the worker drops the pairs it wrote since its
#: last passing check, writes a ``sentinel`` line and stops. (A first rowwise-bias record went wrong this way,
#: part-way through, on one host: tests/data/h200-splitk/rowbias/README.md.)
SENTINEL_EVERY_S = 60.0
#: the recorded sentinels (package data): answers of the H200, used where the querier's runtime has the
#: file's device name and cuBLASLt version; elsewhere a worker's first answers to the same questions serve
SENTINEL_FILE = "sentinels-h200.json"

__all__ = ["PLAN_OPTIONS", "FAST_LAW_M_MAX", "FAST_LAW_CHECK_EVERY", "K_LAW_BLOCK", "K_LAW_ALIGN_CAP",
           "K_LAW_CHECK_EVERY", "k_law_rep", "default_plan", "load_plan", "open_pairs", "pair_order", "k_grid",
           "plan_combos", "run_worker", "read_part", "SENTINEL_EVERY_S", "sentinels_for",
           "merge", "status"]



#: the option sets a plan may record (``run --options``): the split count of tensorwise scaling (the
#: default), or whether the heuristic has an algorithm at all for rowwise scales with bias and fast
#: accumulation (rowwise never splits; without bias or fast accumulation it always has one)
PLAN_OPTIONS = ("tensorwise", "rowwise-bias")


def plan_combos(options: str = "tensorwise") -> list[dict]:
    """The combinations whose answers can differ: bias never changes a split count and rowwise never
    splits (``tensorwise``); with ``rowwise-bias``, the rowwise combinations with bias and fast
    accumulation, where the heuristic may have no algorithm (``tests/test_no_algorithm.py``)."""
    if options == "rowwise-bias":
        return [c for c in combos("all") if c["scale_mode"] == "rowwise" and c["bias"] and c["fast_accum"]]
    if options != "tensorwise":
        raise ValueError(f"options must be one of {', '.join(PLAN_OPTIONS)} (got {options!r})")
    return [c for c in combos("all") if c["scale_mode"] == "tensorwise" and not c["bias"]]


def default_plan(n_max: int = 65536, k_max: int = 65536, k_step: int = 16, bound: dict | None = None,
                 n_min: int = 16, k_min: int | None = None, options: str = "tensorwise") -> dict:
    """The plan of a record: every open (M, N) with ``n_min <= N <= n_max``, every K of the grid from
    the first K that can split (or ``k_min``, where that is larger) to ``k_max``.

    A plan with ``n_min`` or ``k_min`` records a range beside the default one (K above 65536, N above
    65536): a table of its own, which the profile lists after the first (``complete_file``).
    ``options`` (:data:`PLAN_OPTIONS`): which combinations (:func:`plan_combos`); a plan of other options
    than tensorwise is a table of its own too."""
    bound = dict(bound or BOUND)
    k0 = k_step * (bound["k_per_split"] * 2 // k_step + 1)  # first K with K bound >= 2
    if k_min is not None:
        k0 = max(k0, k_min)
    plan = {"n_max": n_max, "k0": k0, "k_max": k_max, "k_step": k_step, "bound": bound,
            "combos": plan_combos(options), "order": "M ascending, then N"}
    if options != "tensorwise":  # the default plan's plan.json has no options
        plan["options"] = options
    if n_min != 16:  # the default plan's plan.json has no n_min (16)
        plan["n_min"] = n_min
    return plan


def plan_n_min(plan: dict) -> int:
    """The smallest N of a plan's pairs (16 where the plan does not say)."""
    return plan.get("n_min", 16)


def k_grid(plan: dict) -> list[int]:
    return list(range(plan["k0"], plan["k_max"] + 1, plan["k_step"]))


#: the largest N and K of a plan (``run --n-max``, ``--k-max``)
SIZE_MAX = 131072
#: the most open pairs a plan may hold (the default plan holds 65,320): more would not fit the
#: schedule of a record in memory
PLAN_PAIRS_MAX = 1 << 22


def _is_int(v) -> bool:
    return type(v) is int


def load_plan(rec: str) -> dict:
    """The plan of the record ``rec`` (its ``plan.json``), checked: click.ClickException naming the
    file and what is wrong."""
    path = os.path.join(rec, "plan.json")
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        raise click.ClickException(f"{path}: missing; a record folder holds the plan.json that run writes "
                                   "first") from None
    except json.JSONDecodeError as e:
        raise click.ClickException(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise click.ClickException(f"{path}: not readable ({type(e).__name__}: {e})") from None
    for check in (_check_plan_sizes, _check_plan_bound, _check_plan_combos, _check_plan_pairs):
        why = check(plan)
        if why:
            raise click.ClickException(f"{path}: {why}")
    return plan


def _check_plan_sizes(plan) -> str | None:
    if not isinstance(plan, dict):
        return f"must hold a JSON object, a plan (got {type(plan).__name__})"
    missing = [k for k in ("n_max", "k0", "k_max", "k_step", "bound", "combos") if k not in plan]
    if missing:
        return f"lacks the plan's field(s) {', '.join(missing)}"
    for key, lo, hi in (("n_max", 16, SIZE_MAX), ("k_max", 16, SIZE_MAX), ("k_step", 16, SIZE_MAX),
                        ("k0", 1, plan["k_max"])):
        if not _is_int(plan[key]) or not lo <= plan[key] <= hi:
            return f"{key} must be an integer from {lo} to {hi} (got {plan[key]!r:.100})"
    if plan["k_step"] % 16:
        return f"k_step must be a multiple of 16 (got {plan['k_step']})"
    if plan.get("options", "tensorwise") not in PLAN_OPTIONS:
        return f"options must be one of {', '.join(PLAN_OPTIONS)} where present (got {plan['options']!r:.100})"
    if "n_min" in plan and (not _is_int(plan["n_min"]) or not 16 <= plan["n_min"] <= plan["n_max"]
                            or plan["n_min"] % 16):
        return f"n_min must be a multiple of 16 from 16 to n_max = {plan['n_max']} (got {plan['n_min']!r:.100})"
    return None


def _check_plan_bound(plan) -> str | None:
    b = plan["bound"]
    if not isinstance(b, dict) or set(b) != set(BOUND) or not all(_is_int(v) for v in b.values()):
        return f"bound must be an object of the integers {', '.join(BOUND)} (got {b!r:.200})"
    if min(b[k] for k in ("k_per_split", "bytes_per_partial", "n_align")) < 1 \
            or not 0 <= b["workspace_reserve"] < b["workspace_bytes"]:
        return ("bound: k_per_split, bytes_per_partial and n_align must be positive, and 0 <= workspace_reserve "
                f"< workspace_bytes (got {b})")
    return None


def _check_plan_combos(plan) -> str | None:
    c = plan["combos"]
    types = {"a_dtype": str, "b_dtype": str, "out_dtype": str, "fast_accum": bool}
    if not isinstance(c, list) or not c or not all(
            isinstance(x, dict) and all(isinstance(x.get(k), t) for k, t in types.items()) for x in c):
        return f"combos must be a non-empty list of objects with {', '.join(types)} (got {c!r:.200})"
    return None


def _check_plan_pairs(plan) -> str | None:
    b, n = plan["bound"], 0
    room = b["workspace_bytes"] - b["workspace_reserve"]
    if -(-plan["k_max"] // b["k_per_split"]) - 1 >= 2:  # else no pair splits
        for N in range(plan_n_min(plan), plan["n_max"] + 1, 16):  # the largest M with a split bound >= 2 at this N
            n += room // (2 * b["bytes_per_partial"] * _ceil_to(N, b["n_align"]))
    if n > PLAN_PAIRS_MAX:
        return f"the plan holds {n:,} open pairs, more than a record may hold ({PLAN_PAIRS_MAX:,}; see its bound)"
    return None


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def open_pairs(plan: dict) -> list[tuple[int, int]]:
    """Every (M, N) of the domain whose workspace bound lets K split (u >= 2 at the largest K)."""
    out = []
    for N in range(plan_n_min(plan), plan["n_max"] + 1, 16):
        M = 1
        while split_bound(plan["bound"], M, N, plan["k_max"]) >= 2:
            out.append((M, N))
            M += 1
    out.sort()
    return out


def _part_path(rec: str, w: int, W: int) -> str:
    return os.path.join(rec, f"part-{w:03d}-of-{W:03d}.jsonl")


def read_part(path: str, plan: dict | None = None) -> tuple[dict, dict]:
    """({local id: config tuple}, {(M, N): [runs per combo]}) of one part file; a cut-off last line is dropped.

    Every other line is checked (:class:`click.ClickException` naming the file, the line and what is
    wrong); with ``plan``, also each pair against the plan's domain and its runs against the plan's
    combinations and K grid."""
    configs, done = {}, {}
    if not os.path.exists(path):
        return configs, done
    for n, line in _lines(path):
        d = _json_line(path, n, line)
        if "cfg" in d:
            configs[len(configs)] = _config_line(d, len(configs), path, n)
        elif "violation" in d:
            _violation_line(d, plan, path, n)
        elif "sentinel" in d:
            _sentinel_line(d, path, n)
        else:
            mn = _pair_line(d, len(configs), plan, path, n)
            done[mn] = d["runs"]
    return configs, done


def read_marks(path: str) -> dict:
    """{(M, N): {"fast": mark, "k": mark}} of one part file: how each finished pair used the laws
    (None: asked without the law, "derived", "checked"); a cut-off last line is dropped."""
    out = {}
    if not os.path.exists(path):
        return out
    for n, line in _lines(path):
        if '"runs"' in line:
            head = _pair_head(line, path, n)
            out[(head["M"], head["N"])] = {"fast": head.get("law"), "k": head.get("k_law")}
    return out


def _lines(path: str):
    """(line number, line) of each complete line of a part file; the last line, when an interruption
    cut it off (it has no newline), is left out."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if line.endswith("\n"):
                yield n, line


def _bad(path: str, n: int, what: str) -> click.ClickException:
    return click.ClickException(f"{path}, line {n}: {what}")


def _json_line(path: str, n: int, line: str) -> dict:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise _bad(path, n, f"not valid JSON ({e.msg} at column {e.colno}); only the last line of a part file may "
                            "be cut off (a worker stopped while writing it), and it then has no newline") from None
    if not isinstance(d, dict):
        raise _bad(path, n, f"must be a JSON object: a configuration, a pair or a violation (got {type(d).__name__})")
    return d


def _config_line(d: dict, n_configs: int, path: str, n: int) -> tuple:
    cfg = d["cfg"]
    if set(d) != {"id", "cfg"}:
        raise _bad(path, n, f"a configuration line holds the fields id and cfg only (got {sorted(d)})")
    if not _is_int(d["id"]) or d["id"] != n_configs:
        raise _bad(path, n, f"configuration id {d['id']!r} out of order: the ids of a part file run 0, 1, 2, ... "
                            f"(expected {n_configs})")
    if not isinstance(cfg, list) or len(cfg) != len(CONFIG_FIELDS) or not all(_is_int(v) for v in cfg):
        raise _bad(path, n, f"cfg must be a list of {len(CONFIG_FIELDS)} integers ({', '.join(CONFIG_FIELDS)}) "
                            f"(got {cfg!r:.200})")
    return tuple(cfg)


_MARKS = (None, "derived", "checked")


def _check_head(d: dict, path: str, n: int) -> None:
    """M and N of a pair line are integers, its law marks None, "derived" or "checked"."""
    if not (_is_int(d.get("M")) and _is_int(d.get("N"))):
        raise _bad(path, n, f"a pair line's M and N must be integers (got {d.get('M')!r} and {d.get('N')!r})")
    for field in ("law", "k_law"):
        if d.get(field) not in _MARKS:
            raise _bad(path, n, f"{field} must be 'derived' or 'checked' where present (got {d[field]!r:.100})")


def _pair_head(line: str, path: str, n: int) -> dict:
    """The fields of a pair line before its runs (read without parsing the runs where the line is
    the writer's own); click.ClickException where they are not a pair's."""
    cut = line.find(',"runs"')
    try:
        head = json.loads(line[:cut] + "}") if line.startswith('{"M"') and cut > 0 else None
    except json.JSONDecodeError:
        head = None
    head = _json_line(path, n, line) if head is None else head
    _check_head(head, path, n)
    return head


def _pair_line(d: dict, n_configs: int, plan: dict | None, path: str, n: int) -> tuple[int, int]:
    """(M, N) of a checked pair line."""
    if not {"M", "N", "runs"} <= set(d) <= {"M", "N", "runs", "law", "k_law"}:
        raise _bad(path, n, f"neither a configuration (id, cfg), a pair (M, N, runs, law, k_law) nor a violation "
                            f"line (got the fields {sorted(d)})")
    _check_head(d, path, n)
    mn = (d["M"], d["N"])
    if plan is not None and not _open_pair(plan, *mn):
        raise _bad(path, n, f"pair (M, N) = {mn} is outside the record's plan (its open pairs: M >= 1, N a multiple "
                            f"of 16 from {plan_n_min(plan)} to n_max = {plan['n_max']}, split bound >= 2 at "
                            f"K = k_max = {plan['k_max']})")
    runs = d["runs"]
    n_combos = None if plan is None else len(plan["combos"])
    if not isinstance(runs, list) or n_combos not in (None, len(runs)):
        want = f"a list of {n_combos} columns, one per combination of the plan" if n_combos else "a list of columns"
        got = f"a list of {len(runs)}" if isinstance(runs, list) else type(runs).__name__
        raise _bad(path, n, f"pair {mn}: runs must be {want} (got {got})")
    nk = None if plan is None else len(range(plan["k0"], plan["k_max"] + 1, plan["k_step"]))
    for j, col in enumerate(runs):
        why = _column_error(col, n_configs, nk)
        if why:
            raise _bad(path, n, f"pair {mn}, column {j}: {why}")
    return mn


def _column_error(col, n_configs: int, nk: int | None) -> str | None:
    """Why ``col`` is not the runs [end, id, end, id, ...] of one column (None: it is)."""
    if not isinstance(col, list) or len(col) < 2 or len(col) % 2:
        return "must be a list [end, id, end, id, ...] of even length"
    try:
        a = np.array(col)
    except (ValueError, TypeError, OverflowError):
        a = None
    if a is None or a.ndim != 1 or a.dtype.kind != "i":
        return "must hold integers only"
    ends, ids = a[0::2], a[1::2]
    if ends[0] < 1 or (ends[1:] <= ends[:-1]).any():
        return f"the ends of its runs must increase from 1 (got {ends.tolist()!r:.200})"
    if nk is not None and ends[-1] != nk:
        return f"its runs end at K index {ends[-1]}, not at the end of the plan's K grid ({nk})"
    if ids.min() < -1 or ids.max() >= n_configs:
        bad = int(ids[(ids < -1) | (ids >= n_configs)][0])
        return f"configuration id {bad} is neither -1 (no algorithm) nor one of the {n_configs} defined above it"
    return None


def _violation_line(d: dict, plan: dict | None, path: str, n: int) -> dict:
    """The checked ``violation`` field of a violation line."""
    v = d["violation"]
    if set(d) != {"violation"} or not isinstance(v, dict):
        raise _bad(path, n, "a violation line holds one field, violation, an object")
    if not (_is_int(v.get("M")) and _is_int(v.get("N"))) or v.get("law", "fast") not in ("fast", "k"):
        raise _bad(path, n, f"a violation needs integers M and N, and law 'fast' or 'k' where present (got {v!r:.200})")
    top = None if plan is None else len(plan["combos"])
    combos = v.get("combos")
    if not isinstance(combos, list) or not all(_is_int(j) and 0 <= j and (top is None or j < top) for j in combos):
        raise _bad(path, n, f"a violation's combos must be a list of combination indices (got {combos!r:.200})")
    return v


def _sentinel_line(d: dict, path: str, n: int) -> dict:
    """The checked ``sentinel`` field of a sentinel line (a worker's check that failed)."""
    v = d["sentinel"]
    if set(d) != {"sentinel"} or not isinstance(v, dict) or not all(_is_int(v.get(k)) for k in ("M", "N", "K", "combo")):
        raise _bad(path, n, f"a sentinel line holds one field, sentinel, an object with integers M, N, K and combo "
                            f"(got {d!r:.200})")
    return v


def sentinels_for(plan: dict, runtime: dict | None) -> list[dict]:
    """The questions a worker checks its host with: {M, N, K, combo, answer} (answer: the configuration
    fields, or None for no algorithm). The recorded answers of :data:`SENTINEL_FILE` for the plan's
    options where ``runtime`` (the querier's ``info()``) has its device name and cuBLASLt version;
    elsewhere the same questions without answers (a worker's first answers serve)."""
    from importlib import resources

    doc = json.loads(resources.files(__package__).joinpath(SENTINEL_FILE).read_text())
    if doc["fields"] != list(CONFIG_FIELDS):
        raise ValueError(f"{SENTINEL_FILE}: fields {doc['fields']} are not {list(CONFIG_FIELDS)}")
    options = plan.get("options", "tensorwise")
    if plan["combos"] != plan_combos(options):
        return []
    same = runtime is not None and all(runtime.get(k) == doc["runtime"][k] for k in ("device_name", "cublaslt_version"))
    return [dict(q) if same else {k: q[k] for k in ("M", "N", "K", "combo")} for q in doc["sets"].get(options, [])]


def _sentinel_check(ask, plan: dict, sentinels: list[dict]) -> dict | None:
    """None where every sentinel gets its answer (one without an answer learns it now), else the first
    that does not: {M, N, K, combo, want, got}."""
    for q in sentinels:
        a = ask(q["M"], q["N"], q["K"], plan["combos"][q["combo"]])
        got = None if a is None else [int(v) for v in a[:len(CONFIG_FIELDS)]]
        if "answer" not in q:
            q["answer"] = got
        elif got != q["answer"]:
            return {k: q[k] for k in ("M", "N", "K", "combo")} | {"want": q["answer"], "got": got}
    return None


def sentinel_failures(rec: str) -> list[dict]:
    """The sentinel lines of ``rec``'s part files (checks that failed; the pairs since the worker's last
    passing check were dropped before each was written)."""
    out = []
    for path in _parts(rec):
        for n, line in _lines(path):
            if '"sentinel"' in line:
                out.append(_sentinel_line(_json_line(path, n, line), path, n))
    return out


def _open_pair(plan: dict, M: int, N: int) -> bool:
    """Whether (M, N) is one of :func:`open_pairs` (the split bound falls as M grows)."""
    return (M >= 1 and N % 16 == 0 and plan_n_min(plan) <= N <= plan["n_max"]
            and split_bound(plan["bound"], M, N, plan["k_max"]) >= 2)


def _runs(ids: list[int]) -> list[int]:
    """[end, id, end, id, ...]: run-length form of a column along K."""
    out = []
    for i, v in enumerate(ids):
        if out and out[-1] == v:
            out[-2] = i + 1
        else:
            out += [i + 1, v]
    return out


def pair_order(plan: dict, first_n=()) -> list[tuple[int, int]]:
    """The open pairs in the order they are asked: those whose N is in ``first_n`` (e.g. the output
    widths of public models, whose decode-size calls hit the split region), M ascending, then the
    rest. The order is a schedule of the work only: which pairs are done is read from the part files."""
    pairs = open_pairs(plan)
    first = set(int(n) for n in first_n)
    return [p for p in pairs if p[1] in first] + [p for p in pairs if p[1] not in first]


def fast_partners(combos: list[dict]) -> list[int]:
    """For each combination, the index of the same one with fast accumulation (itself if it has it)."""
    key = [(c["a_dtype"], c["b_dtype"], c["out_dtype"]) for c in combos]
    fast = {k: i for i, (k, c) in enumerate(zip(key, combos)) if c["fast_accum"]}
    return [fast.get(k, i) for i, k in enumerate(key)]


def k_law_rep(K: int) -> int:
    """The K whose answer the K law gives to ``K``: the same 128-wide block, the same alignment class."""
    return (K - 1) // K_LAW_BLOCK * K_LAW_BLOCK + min(K & -K, K_LAW_ALIGN_CAP)


def law_violated(rec: str, law: str = "fast") -> bool:
    """Whether any part file of ``rec`` holds a violation of ``law`` ("fast" or "k"; a violation
    line without a ``law`` field is the fast-accumulation law's)."""
    for path in _parts(rec):
        for n, line in _lines(path):
            if '"violation"' in line:
                if _violation_line(_json_line(path, n, line), None, path, n).get("law", "fast") == law:
                    return True
    return False


def _broken(rec: str) -> list:
    return [law for law in ("fast", "k") if law_violated(rec, law)]


def _derived_under(path: str, broken: list) -> set:
    """The pairs of one part file whose answers were derived under one of the ``broken`` laws."""
    if not broken:
        return set()
    return {mn for mn, m in read_marks(path).items() if any(m[law] == "derived" for law in broken)}


def untrusted(rec: str) -> set:
    """The pairs of ``rec``'s part files whose only answers were derived under a law that a check
    has since broken: they are left out of the merge and asked again."""
    broken = _broken(rec)
    bad, good = set(), set()
    for path in _parts(rec):
        d = _derived_under(path, broken)
        bad |= d
        good |= set(read_marks(path)) - d
    return bad - good


def _law_check_pair(M: int, N: int) -> bool:
    return (M + N // 16) % FAST_LAW_CHECK_EVERY == 0


def _k_law_check_pair(M: int, N: int) -> bool:
    return (3 * M + N // 16) % K_LAW_CHECK_EVERY == 5


def run_worker(rec: str, w: int, W: int, ask, deadline: float | None = None, max_pairs: int | None = None,
               first_n=(), fast_law: bool = False, k_law: bool = False, skip=frozenset(),
               sentinels: list[dict] | None = None, sentinel_every: float = SENTINEL_EVERY_S) -> int:
    """Worker ``w`` of ``W``: ask ``ask(M, N, K, combo) -> FIELDS tuple | None`` for the pairs
    ``w, w + W, ...`` of :func:`pair_order` that no part file holds yet, appending each finished
    pair to its own file; stops at ``deadline`` (time.time()) or after ``max_pairs``. Returns the
    pairs finished. ``fast_law``, ``k_law``: use the fast-accumulation law, the K law (module docstring).
    ``skip``: pairs an earlier table holds (not asked again). ``sentinels`` (:func:`sentinels_for`): asked
    before the first pair, every ``sentinel_every`` seconds and before the worker stops; where one
    answers otherwise, the pairs written since the last passing check are dropped, a ``sentinel`` line
    says which question failed, and the worker stops (the pairs it kept count)."""
    plan = load_plan(rec)
    path = _part_path(rec, w, W)
    configs, done = read_part(path, plan)
    _truncate_to_complete_lines(path)
    for other in _parts(rec):  # pairs finished by any other worker (another order or number of workers)
        if other != path:
            done.update(read_part(other, plan)[1])
    for mn in untrusted(rec):  # derived under a law that a later check broke: asked again
        done.pop(mn, None)
    done.update(dict.fromkeys(skip))
    ids = {c: i for i, c in configs.items()}
    ks = k_grid(plan)
    partner = fast_partners(plan["combos"])
    fast_law = fast_law and not law_violated(rec, "fast")
    k_law = k_law and not law_violated(rec, "k")
    reps = [k_law_rep(K) for K in ks]
    n = 0
    with open(path, "a") as out:
        good = (out.tell(), 0)  # the file's size and the pairs written at the last passing check
        last = time.time()

        def failed() -> bool:
            """Checks the sentinels; where one fails, drops what was written since the last pass."""
            nonlocal good, last
            if not sentinels:
                return False
            bad = _sentinel_check(ask, plan, sentinels)
            out.flush()
            if bad is None:
                good, last = (out.tell(), n), time.time()
                return False
            out.truncate(good[0])
            out.write(json.dumps({"sentinel": bad | {"dropped_pairs": n - good[1]}}) + "\n")
            out.flush()
            return True

        if failed():
            return 0

        def answer(M, N, K, c):
            a = ask(M, N, K, c)
            cfg = None if a is None else tuple(a[:len(CONFIG_FIELDS)])
            if cfg is not None and cfg not in ids:
                ids[cfg] = len(ids)
                out.write(json.dumps({"id": ids[cfg], "cfg": list(cfg)}) + "\n")
            return -1 if cfg is None else ids[cfg]

        def column(M, N, c, law, check, bad):
            """The runs of one combination; under the K law only the block representatives are
            asked (all K when ``check``: then a difference from the law is appended to ``bad``)."""
            if not law or check:
                col = [answer(M, N, K, c) for K in ks]
                if law:
                    got = dict(zip(ks, col))
                    if any(got.get(r, col[i]) != col[i] for i, r in enumerate(reps)):
                        bad.append(c)
                return _runs(col)
            got = {r: answer(M, N, r, c) for r in dict.fromkeys(reps)}
            return _runs([got[r] for r in reps])

        for M, N in pair_order(plan, first_n)[w::W]:
            if (M, N) in done:
                continue
            if (deadline is not None and time.time() >= deadline) or (max_pairs is not None and n >= max_pairs):
                break
            law = fast_law and M <= FAST_LAW_M_MAX
            check = law and _law_check_pair(M, N)
            k_check = k_law and _k_law_check_pair(M, N)
            k_bad = []
            runs = [column(M, N, c, k_law, k_check, k_bad) if not law or check or partner[j] == j else None
                    for j, c in enumerate(plan["combos"])]
            line = {"M": M, "N": N}
            if k_law:
                if k_bad:  # the full columns stand; no worker uses the K law on this record again
                    bad = [plan["combos"].index(c) for c in k_bad]
                    out.write(json.dumps({"violation": {"M": M, "N": N, "law": "k", "combos": bad}}) + "\n")
                    k_law = False
                line["k_law"] = "checked" if k_check else "derived"
            if law:
                derived = [j for j, r in enumerate(runs) if partner[j] != j and (check or r is None)]
                bad = [j for j in derived if runs[j] is not None and runs[j] != runs[partner[j]]]
                if bad:  # the asked answers stand; no worker uses the law on this record again
                    out.write(json.dumps({"violation": {"M": M, "N": N, "combos": bad}}) + "\n")
                    fast_law = False
                runs = [runs[partner[j]] if r is None else r for j, r in enumerate(runs)]
                line["law"] = "checked" if check else "derived"
            line["runs"] = runs
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            out.flush()
            n += 1
            if sentinels and time.time() - last >= sentinel_every and failed():
                return good[1]
        if n > good[1] and failed():
            return good[1]
    return n


def _truncate_to_complete_lines(path: str) -> None:
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            f.truncate(keep)


def _parts(rec: str) -> list[str]:
    return sorted(glob.glob(os.path.join(rec, "part-*-of-*.jsonl")))


def done_pairs(rec: str, plan: dict | None = None) -> set:
    """The (M, N) pairs finished in the part files of ``rec``."""
    done = set()
    for p in _parts(rec):
        done.update(read_part(p, plan)[1])
    return done


def status(rec: str) -> dict:
    plan = load_plan(rec)
    total = len(open_pairs(plan))
    done = len(done_pairs(rec, plan))
    per_pair = len(k_grid(plan)) * len(plan["combos"])
    return {"pairs_total": total, "pairs_done": done, "queries_per_pair": per_pair,
            "queries_total": total * per_pair, "answers_done": done * per_pair, "fast_law": _law_counts(rec),
            "k_law": _law_counts(rec, "k"), "sentinel_failures": len(sentinel_failures(rec))}


def _law_counts(rec: str, law: str = "fast") -> dict:
    """Pairs whose answers were copied (derived) or asked and compared (checked) under ``law``
    (the fast-accumulation law or the K law), and whether a violation was seen."""
    field = "law" if law == "fast" else "k_law"
    counts = {"derived": 0, "checked": 0}
    for p in _parts(rec):
        for _, line in _lines(p):
            for k in counts:
                counts[k] += f'"{field}":"{k}"' in line
    return dict(counts, violated=law_violated(rec, law))


def _table_pairs(table, fields, configs, index, marks) -> "_TablePairs":
    """Every trusted pair of an earlier table (a :class:`cpemu.splitk_complete` table) for the merge:
    its configurations join ``configs`` and ``index``, its marks ``marks``."""
    cols = [table.meta["fields"].index(f) for f in fields]
    to_global = np.full(len(table.configs) + 1, NONE, np.int64)
    for i, cfg in enumerate(table.configs.tolist()):
        cfg = tuple(cfg[c] for c in cols)
        if cfg not in index:
            index[cfg] = len(configs)
            configs.append(cfg)
        to_global[i] = index[cfg]
    pairs = _TablePairs(table, to_global)
    for mn, p in pairs.index.items():
        marks[mn] = {law: (None, "derived", "checked")[int(table.marks[law][p])] for law in ("fast", "k")}
    return pairs


class _TablePairs(Mapping):
    """The trusted pairs of an earlier table as :func:`cpemu.splitk_complete.write_table` reads them,
    {(M, N): {combo key: [end, config id, ...]}} along the K grid with the merge's config ids. A
    pair's runs are made when it is looked up, and only the last pair's are kept (write_table reads
    pair after pair): the whole table expanded to grid runs at once took gigabytes."""

    def __init__(self, table, to_global: np.ndarray):
        self.table, self.to_global = table, to_global
        keep = trusted(table)
        self.index = {(k >> 20, k & 0xFFFFF): p for p, k in enumerate(table.pairs.tolist()) if keep[p]}
        self._last = (None, None)

    def __getitem__(self, mn):
        if self._last[0] != mn:
            self._last = (mn, {k: self._runs(self.index[mn], j) for k, j in self.table.combo.items()})
        return self._last[1]

    def _runs(self, p: int, j: int) -> np.ndarray:
        col = self.table.column(p, j)
        return column_runs(self.to_global[np.where(col == NONE, len(self.table.configs), col)])

    def __contains__(self, mn):
        return mn in self.index

    def __iter__(self):
        return iter(self.index)

    def __len__(self):
        return len(self.index)


def _merge_runs(runs: list, lut: np.ndarray) -> np.ndarray:
    """The runs of one column of a part file with the merge's config ids (``lut[local id + 1]``)."""
    r = np.array(runs, np.int64)
    r[1::2] = lut[r[1::2] + 1]
    return r


def base_table(path: str | None):
    """The earlier table a record continues (None: none)."""
    if path is None:
        return None
    from ..splitk_complete import load_complete

    try:
        return load_complete(os.path.basename(path), os.path.dirname(os.path.abspath(path)))
    except ValueError as e:
        raise click.ClickException(f"--table {path}: {e}") from None


def trusted(table) -> np.ndarray:
    """Per pair of an earlier table: False where its answers were derived under a law the table
    says was broken (left out of a merge, asked again)."""
    from ..splitk_complete import MARK_DERIVED

    keep = np.ones(len(table.pairs), bool)
    for law in ("fast", "k"):
        if _base_violated(table, law):
            keep &= table.marks[law] != MARK_DERIVED
    return keep


def _same_plan(table, plan: dict, path: str) -> None:
    """Refuse a table recorded under another plan than the record's."""
    keys = [combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"]) for c in plan["combos"]]
    same = {k: table.meta.get(k) for k in ("k0", "k_step", "nk", "combos", "bound", "n_max")}
    same["n_min"] = table.meta.get("n_min", 16)
    same["options"] = table.meta.get("options", "tensorwise")
    want = {"k0": plan["k0"], "k_step": plan["k_step"], "nk": len(k_grid(plan)), "combos": keys,
            "bound": plan["bound"], "n_max": plan["n_max"], "n_min": plan_n_min(plan),
            "options": plan.get("options", "tensorwise")}
    if same != want:
        raise click.ClickException(f"{path} is a table of another plan ({same}); the record's plan is {want}")


def _base_violated(table, law: str) -> bool:
    return bool(table is not None and table.meta.get("fast_law" if law == "fast" else "k_law", {}).get("violated"))


def merge(rec: str, out_path: str, provenance: dict | None = None, splits_only: bool = False,
          base: str | None = None) -> dict:
    """Every finished pair of every part file into one complete table (:func:`cpemu.splitk_complete.write_table`),
    with every pair of the table ``base`` (an earlier merge this record continues; its pairs are
    not asked again, see ``run --table``).

    ``splits_only`` keeps only the split count of each configuration (fewer runs); the part files
    keep the whole configuration either way."""
    plan = load_plan(rec)
    keys = [combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"]) for c in plan["combos"]]
    fields = ["splitk_num"] if splits_only else list(CONFIG_FIELDS)
    cols = [CONFIG_FIELDS.index(f) for f in fields]
    configs, index, pairs, marks = [], {}, {}, {}
    old = base_table(base)
    from_base = {}
    counts = {"fast": {"derived": 0, "checked": 0}, "k": {"derived": 0, "checked": 0}}
    if old is not None:
        m = old.meta
        _same_plan(old, plan, base)
        from_base = _table_pairs(old, fields, configs, index, marks)
        for law, name in (("fast", "fast_law"), ("k", "k_law")):
            for k in counts[law]:
                counts[law][k] += int(m.get(name, {}).get(k, 0))
    broken = _broken(rec)
    for path in _parts(rec):
        drop = _derived_under(path, broken)
        local, done = read_part(path, plan)
        lut = np.full(len(local) + 1, NONE, np.int64)  # local id + 1 -> merged id (-1: no algorithm)
        for i, cfg in local.items():
            cfg = tuple(cfg[c] for c in cols)
            if cfg not in index:
                index[cfg] = len(configs)
                configs.append(cfg)
            lut[i + 1] = index[cfg]
        for mn, runs in done.items():
            if mn in drop:
                continue
            if mn in from_base:
                raise click.ClickException(f"pair {mn} is in {base} and in the part files of {rec}")
            pairs[mn] = {k: _merge_runs(r, lut) for k, r in zip(keys, runs)}
        marks.update({mn: m for mn, m in read_marks(path).items() if mn not in drop})
    law = {name: dict({k: counts[short][k] + v for k, v in _law_counts(rec, short).items() if k in counts[short]},
                      violated=_law_counts(rec, short)["violated"] or _base_violated(old, short))
           for short, name in (("fast", "fast_law"), ("k", "k_law"))}
    meta = {"k0": plan["k0"], "k_step": plan["k_step"], "nk": len(k_grid(plan)), "combos": keys,
            "store": "grid" if law["k_law"]["violated"] else "k-law",
            "fields": fields, "bound": plan["bound"], "n_max": plan["n_max"],
            **({"n_min": plan["n_min"]} if "n_min" in plan else {}),
            **({"options": plan["options"]} if "options" in plan else {}),
            "provenance": provenance or (old.meta.get("provenance", {}) if old is not None else {}),
            "fast_law": dict(law["fast_law"], m_max=FAST_LAW_M_MAX, check_every=FAST_LAW_CHECK_EVERY),
            "k_law": dict(law["k_law"], block=K_LAW_BLOCK, align_cap=K_LAW_ALIGN_CAP, check_every=K_LAW_CHECK_EVERY)}
    return write_table(out_path, meta, ChainMap(pairs, from_base), configs, marks)


def _start(rec: str, plan: dict) -> None:
    os.makedirs(rec, exist_ok=True)
    path = os.path.join(rec, "plan.json")
    if os.path.exists(path):
        old = load_plan(rec)
        if old != plan:
            raise click.ClickException(f"{path} holds another plan ({old}); use another --dir or the same options")
    else:
        with open(path + ".tmp", "w") as f:
            json.dump(plan, f, indent=1)
        os.replace(path + ".tmp", path)


def visible_gpus() -> list[str]:
    """The GPUs the workers spread over (worker w on GPU ``w % len``): CUDA_VISIBLE_DEVICES where
    it is set, else every GPU torch counts; [] where there is no torch (the worker's default device)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def worker_gpu(w: int, gpus) -> str | None:
    """The CUDA_VISIBLE_DEVICES of worker ``w`` (one GPU of ``gpus``, round robin), or None to leave it."""
    return gpus[w % len(gpus)] if len(gpus) > 1 else None


def _gpu_worker(args):
    rec, w, W, ws, deadline, first_n, fast_law, k_law, table, gpu = args
    if gpu is not None:  # before the worker's first CUDA call (a spawned process)
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    from .splitk_query import LeanQuerier

    old = base_table(table)
    skip = frozenset() if old is None else frozenset((k >> 20, k & 0xFFFFF) for k in old.pairs[trusted(old)].tolist())
    q = LeanQuerier(ws)
    return run_worker(rec, w, W, q.ask, deadline, first_n=first_n, fast_law=fast_law and not _base_violated(old, "fast"),
                      k_law=k_law and not _base_violated(old, "k"), skip=skip, sentinels=sentinels_for(load_plan(rec), q.info()))


def run_parallel(rec: str, plan: dict, jobs: int, seconds: float, workspace_bytes: int | None = None, echo=print,
                 first_n=(), fast_law: bool = False, k_law: bool = False, table: str | None = None):
    """Start or continue the record with ``jobs`` processes for at most ``seconds``."""
    from .splitk_query import probe_workspace

    _start(rec, plan)
    for path in _parts(rec):  # a record continued: every line of its part files checked before any worker starts
        read_part(path, plan)
    old = base_table(table)
    if old is not None:
        _same_plan(old, plan, table)
    if workspace_bytes is None:
        workspace_bytes, src = probe_workspace()
        echo(f"[splitk-enum] workspace {workspace_bytes} bytes ({src})")
    if workspace_bytes != plan["bound"]["workspace_bytes"]:
        raise click.ClickException(f"torch's cuBLASLt workspace here is {workspace_bytes} bytes, the plan's bound "
                                   f"assumes {plan['bound']['workspace_bytes']}")
    fast_law = fast_law and not all(c["fast_accum"] for c in plan["combos"])  # nothing to derive otherwise
    t0 = time.time()
    deadline = t0 + seconds
    gpus = visible_gpus()
    with mp.get_context("spawn").Pool(jobs) as pool:
        n = sum(pool.map(_gpu_worker, [(rec, w, jobs, workspace_bytes, deadline, tuple(first_n), fast_law, k_law, table,
                                        worker_gpu(w, gpus)) for w in range(jobs)]))
    st = status(rec)
    if old is not None:
        st["pairs_in_table"] = len(old.pairs)
    echo(f"[splitk-enum] {n} pairs in {time.time() - t0:.0f}s; {st['pairs_done']} in the part files"
         + (f" and {len(old.pairs)} in the table" if old is not None else "") + f", of {st['pairs_total']}")
    if st["sentinel_failures"]:
        echo(f"[splitk-enum] {st['sentinel_failures']} sentinel check(s) failed: this host stopped answering as the "
             f"sentinels were recorded (their pairs were dropped); see the sentinel lines of the part files")
    return st


@click.group()
def cli():
    """The complete split-K record (see the module docstring)."""


_REC_DIR = click.Path(file_okay=False)
_OLD_DIR = click.Path(exists=True, file_okay=False)
_TABLE = click.Path(exists=True, dir_okay=False)


@cli.command("run")
@click.option("--dir", "rec", required=True, type=_REC_DIR)
@click.option("--jobs", type=click.IntRange(min=1), default=os.cpu_count() or 1)
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=3600.0,
              help="stop starting new pairs after this long")
@click.option("--n-max", type=click.IntRange(16, SIZE_MAX), default=65536)
@click.option("--k-max", type=click.IntRange(16, SIZE_MAX), default=65536)
@click.option("--k-step", type=click.IntRange(min=16), default=16, help="a multiple of 16")
@click.option("--n-min", type=click.IntRange(16, SIZE_MAX), default=16,
              help="the smallest N (a multiple of 16): a range beside the default plan, "
                   "e.g. --n-min 65552 --n-max 131072")
@click.option("--k-min", type=click.IntRange(16, SIZE_MAX), default=None,
              help="the smallest K (16 above a multiple of 128): a range beside the default plan, e.g. --k-min 65552 "
                   "--k-max 131072 --n-max 131072")
@click.option("--first-n", default="", help="comma list of N whose pairs are asked first (e.g. model widths)")
@click.option("--fast-law/--no-fast-law", default=True, show_default=True,
              help="M <= 32: ask fast accumulation only, copy it, check every 8th pair in full (a law measured "
                   "on the H200; cpemu record on another GPU does not use it)")
@click.option("--k-law/--no-k-law", default=True, show_default=True,
              help="ask 3 of the 8 K of each 128-wide block (one per alignment class 16, 32, 64+), copy them, "
                   "check every 16th pair at every K (a law measured on the H200)")
@click.option("--table", default=None, type=_TABLE,
              help="an earlier merged table this record continues: its pairs are skipped")
@click.option("--options", type=click.Choice(PLAN_OPTIONS), default="tensorwise", show_default=True,
              help="tensorwise: the split count (18 combinations); rowwise-bias: whether an algorithm exists "
                   "for rowwise scales with bias and fast accumulation (6 combinations), a table of its own")
def run_cmd(rec, jobs, seconds, n_max, k_max, k_step, n_min, k_min, first_n, fast_law, k_law, table, options):
    if k_step % 16 or not math.isfinite(seconds):
        raise click.BadParameter("--k-step must be a multiple of 16 and --seconds finite "
                                 f"(got {k_step} and {seconds})")
    if n_min % 16 or n_min > n_max:
        raise click.BadParameter(f"must be a multiple of 16 and at most --n-max = {n_max} (got {n_min})",
                                 param_hint="--n-min")
    if k_min is not None and ((k_min - 16) % 128 or k_min > k_max):
        raise click.BadParameter(f"must be 16 above a multiple of 128 (the K-law blocks of the table) and at most "
                                 f"--k-max = {k_max} (got {k_min})", param_hint="--k-min")
    try:
        first = tuple(int(x) for x in first_n.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"must be a comma list of integers (got {first_n!r})", param_hint="--first-n")
    plan = default_plan(n_max, k_max, k_step, n_min=n_min, k_min=k_min, options=options)
    st = run_parallel(rec, plan, jobs, seconds, echo=lambda m: click.echo(m, err=True),
                      first_n=first, fast_law=fast_law, k_law=k_law, table=table)
    click.echo(json.dumps(st))


@cli.command("status")
@click.option("--dir", "rec", required=True, type=_OLD_DIR)
def status_cmd(rec):
    click.echo(json.dumps(status(rec)))


@cli.command("merge")
@click.option("--dir", "rec", required=True, type=_OLD_DIR)
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False))
@click.option("--splits-only", is_flag=True, help="keep only the split count of each answer")
@click.option("--table", default=None, type=_TABLE,
              help="the earlier merged table the record continues (its pairs are kept)")
def merge_cmd(rec, out_path, splits_only, table):
    click.echo(json.dumps(merge(rec, out_path, splits_only=splits_only, base=table)))


if __name__ == "__main__":
    cli()
