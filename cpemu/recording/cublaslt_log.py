"""cuBLASLt's API log (CUBLASLT_LOG_LEVEL / _MASK / _FILE), parsed.

Markers written by the ``torch-log`` child, torch's heuristic calls (their descriptors)
and executed matmuls (the algorithm: id, tile, stages, cluster, split-K, reduction).
"""
from __future__ import annotations

import re

from cpemu.cuda.cublaslt import CLUSTER_NAMES, INNER_SHAPE_NAMES, REDUCTION_NAMES, STAGES_NAMES, TILE_NAMES

LOG_LINE_RE = re.compile(r"\[cublasLt\]\[(?P<pid>\d+)\]\[(?P<kind>[A-Za-z]+)\]\[(?P<fn>[A-Za-z0-9_]+)\]\s?(?P<msg>.*)")
BRACKET_RE = re.compile(r"(\w+)=\[([^\]]*)\]")
HEX_RE = re.compile(r"0[xX][0-9a-fA-F]+")
MARK_COLS = 7777  # layouts of this width are position markers written by the child
MARK_TORCH, MARK_QUERY = 100_000_000, 200_000_000  # int32-safe row counts
MARK_RE = re.compile(r"rows=(\d+) cols=%d\b" % MARK_COLS)


def parse_log_lines(lines) -> list[dict]:
    """Events: markers, heuristic API calls and executed matmuls, in log order."""
    events = []
    for raw in lines:
        m = LOG_LINE_RE.search(raw)
        if not m:
            continue
        fn, kind, msg = m.group("fn"), m.group("kind"), m.group("msg")
        if fn == "cublasLtMatrixLayoutCreate":
            mk = MARK_RE.search(msg)
            if mk:
                events.append({"type": "mark", "value": int(mk.group(1))})
            continue
        if fn.endswith("AlgoGetHeuristic") and kind == "Api" and "Adesc=" in msg:
            events.append({"type": "heur", "kind": kind, "fn": fn, "raw": raw.rstrip("\n")})
        elif fn.endswith("Matmul") and "algo=[" in msg:
            events.append({"type": "mm", "kind": kind, "fn": fn, "raw": raw.rstrip("\n")})
    return events


def parse_heuristic_line(raw: str) -> dict:
    """Bracketed descriptors of a heuristic API line, pointers normalized."""
    msg = LOG_LINE_RE.search(raw).group("msg")
    descs = {k: HEX_RE.sub("PTR", v).strip() for k, v in BRACKET_RE.findall(msg)}
    ws = re.search(r"maxWorkspaceSizeinBytes=(\d+)", msg, re.I)
    return {"descs": descs, "max_workspace_bytes": int(ws.group(1)) if ws else None}


_ALGO_LOG_DEFAULTS = {"tile_id": 0, "stages_id": 0, "splitk_num": 1, "reduction_scheme": 0,
                      "cta_swizzling": 0, "custom_option": 0, "inner_shape_id": 0, "cluster_shape_id": 0}


def _lookup(table, text: str, prefix: str):
    name = text[len(prefix):] if text.startswith(prefix) else text
    if isinstance(table, list):
        return table.index(name) if name in table else None
    for k, v in table.items():
        if v == name:
            return k
    return int(name) if name.lstrip("-").isdigit() else None


def parse_matmul_line(raw: str) -> dict:
    """Algo fields of an executed cublasLtMatmul log line (omitted fields take defaults)."""
    msg = LOG_LINE_RE.search(raw).group("msg")
    m = re.search(r"algo=\[([^\]]*)\]", msg)
    fields = dict(re.findall(r"(\w+)=(\S+)", m.group(1))) if m else {}
    out, present = dict(_ALGO_LOG_DEFAULTS), []
    out["algo_id"] = None
    for key, val in fields.items():
        kl = key.lower()
        try:
            if kl == "algoid":
                out["algo_id"], f = int(val), "algo_id"
            elif kl == "tile":
                out["tile_id"], f = _lookup(TILE_NAMES, val, "MATMUL_TILE_"), "tile_id"
            elif kl == "stages":
                out["stages_id"], f = _lookup(STAGES_NAMES, val, "MATMUL_STAGES_"), "stages_id"
            elif kl.startswith("cluster"):
                out["cluster_shape_id"], f = _lookup(CLUSTER_NAMES, val, "CLUSTER_SHAPE_"), "cluster_shape_id"
            elif kl.startswith("inner"):
                out["inner_shape_id"], f = _lookup(INNER_SHAPE_NAMES, val, "MATMUL_INNER_SHAPE_"), "inner_shape_id"
            elif kl.startswith("customoption"):
                out["custom_option"], f = int(val), "custom_option"
            elif "split" in kl:
                out["splitk_num"], f = int(val), "splitk_num"
            elif kl.startswith("reduction"):
                out["reduction_scheme"], f = _lookup(REDUCTION_NAMES, val, "REDUCTION_SCHEME_"), "reduction_scheme"
            elif "swizzl" in kl:
                out["cta_swizzling"], f = int(val), "cta_swizzling"
            else:
                continue
            present.append(f)
        except (ValueError, TypeError):
            continue
    ws = re.search(r"workSpaceSizeInBytes=(\d+)", msg)
    out.update(algo_fields=fields, log_fields_present=present,
               torch_workspace_arg=int(ws.group(1)) if ws else None)
    return out
