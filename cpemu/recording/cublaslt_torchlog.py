"""The ``torch-log`` mode: real ``torch._scaled_mm`` in child processes with cuBLASLt's log on.

:func:`run_child` starts a child (the ``_torch-child`` command of
:mod:`cpemu.recording.cublaslt_heuristic`); :func:`child_main` runs the cases there, each
between marker calls, and optionally the same query; :func:`assemble_rows` pairs the
logged algorithm of each case with the query's. :func:`resolve_workspace` reads torch's
workspace size from such a child's log.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

import click

from cpemu.cuda.cublaslt import ALGO_FIELD_NAMES, CUDA_R_32F, DTYPES, Case
from cpemu.recording.cli_output import echo, write_json_atomic
from cpemu.recording.cublaslt_log import (MARK_COLS, MARK_QUERY, MARK_TORCH, parse_heuristic_line, parse_log_lines,
                                          parse_matmul_line)
from cpemu.recording.cublaslt_query import Runtime, mirrored_workspace_bytes, query_case

#: The command-line module whose ``_torch-child`` command the child runs.
CLI_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cublaslt_heuristic.py")
#: The folder holding this ``cpemu`` package: the child imports the same code.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _torch_dtype(torch, name: str):
    return getattr(torch, DTYPES[name][0])


def _run_torch_case(torch, c: Case) -> None:
    """One real torch._scaled_mm with a (M,K) row-major, b (K,N) column-major."""
    dev = torch.device("cuda")
    a = torch.empty(c.M, c.K, dtype=torch.uint8, device=dev).fill_(0x38).view(_torch_dtype(torch, c.a_dtype))
    b = torch.empty(c.N, c.K, dtype=torch.uint8, device=dev).fill_(0x38).view(_torch_dtype(torch, c.b_dtype)).t()
    if c.scale_mode == "rowwise":
        sa = torch.ones(c.M, 1, device=dev, dtype=torch.float32)
        sb = torch.ones(1, c.N, device=dev, dtype=torch.float32)
    else:
        sa = torch.ones((), device=dev, dtype=torch.float32)
        sb = torch.ones((), device=dev, dtype=torch.float32)
    out_dtype = _torch_dtype(torch, c.out_dtype)
    bias = torch.zeros(c.N, device=dev, dtype=out_dtype) if c.bias else None
    torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype, use_fast_accum=c.fast_accum)


def child_main(job_path: str, out_path: str) -> None:
    """Runs inside a child whose environment enables cuBLASLt logging."""
    with open(job_path) as f:
        job = json.load(f)
    cases = [Case(**d) for d in job["cases"]]
    res: dict = {"torch": [], "query": [], "errors": []}
    rt = None
    try:
        rt = Runtime(use_torch="yes", lib=job.get("lib"), handle=job.get("handle", "auto"))
        torch = rt.torch
        res["info"] = rt.info
        lt = rt.lt

        def mark(value: int) -> None:
            lay = ctypes.c_void_p()
            if lt.layout_create(ctypes.byref(lay), CUDA_R_32F, value, MARK_COLS, value) == 0:
                lt.layout_destroy(lay)

        for i, c in enumerate(cases):
            mark(MARK_TORCH + i)
            try:
                _run_torch_case(torch, c)
                torch.cuda.synchronize()
                res["torch"].append({"i": i, "ok": True})
            except Exception as e:  # noqa: BLE001
                res["torch"].append({"i": i, "ok": False, "error": f"{type(e).__name__}: {e}"})
        if job.get("with_query") and job.get("workspace_bytes") is not None:
            rt.open_handle()
            ptrs = rt.pointers(max(c.M for c in cases), max(c.N for c in cases))
            for i, c in enumerate(cases):
                mark(MARK_QUERY + i)
                res["query"].append(query_case(lt, rt.handle, c, ptrs, int(job["workspace_bytes"])))
            res["info"] = rt.info
    except BaseException as e:  # noqa: BLE001 - always leave a result file
        res["errors"].append(f"{type(e).__name__}: {e}")
    finally:
        if rt is not None:
            try:
                rt.close()
            except Exception:  # noqa: BLE001
                pass
        write_json_atomic(out_path, res)


def run_child(cases: list[Case], workdir: str, tag: str, *, with_query: bool,
              workspace_bytes: int | None, lib: str | None, handle: str, log_level: int,
              log_mask: int | None, timeout: float) -> tuple[dict, list[str], dict]:
    """Spawn a logged child; returns (child result, log lines, process info)."""
    job = os.path.join(workdir, f"{tag}.job.json")
    out = os.path.join(workdir, f"{tag}.out.json")
    log = os.path.join(workdir, f"{tag}.cublaslt.log")
    write_json_atomic(job, {"cases": [asdict(c) for c in cases], "with_query": with_query,
                            "workspace_bytes": workspace_bytes, "lib": lib, "handle": handle})
    env = dict(os.environ)
    env.update(CUBLASLT_LOG_LEVEL=str(log_level), CUBLASLT_LOG_FILE=log, PYTHONUNBUFFERED="1")
    if log_mask is not None:
        env["CUBLASLT_LOG_MASK"] = str(log_mask)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, CLI_FILE, "_torch-child", "--job", job, "--out", out]
    t0 = time.time()
    pinfo = {"cmd": cmd, "returncode": None, "seconds": None, "stderr_tail": None}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        pinfo["returncode"] = p.returncode
        pinfo["stderr_tail"] = p.stderr[-4000:]
        stdout = p.stdout
    except subprocess.TimeoutExpired as e:
        pinfo["returncode"] = "timeout"
        stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    pinfo["seconds"] = round(time.time() - t0, 2)
    result = {}
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    lines: list[str] = []
    if os.path.exists(log) and os.path.getsize(log) > 0:
        with open(log, errors="replace") as f:
            lines = f.readlines()
        pinfo["log_source"] = "CUBLASLT_LOG_FILE"
    elif stdout:
        lines = stdout.splitlines()  # file not honoured: cuBLASLt logs to stdout
        pinfo["log_source"] = "child stdout"
    pinfo["log_lines"] = len(lines)
    return result, lines, pinfo


def probe_torch_workspace(workdir: str, lib: str | None, timeout: float) -> tuple[int | None, dict]:
    """Max workspace bytes torch passes to the heuristic, read from its own cuBLASLt log."""
    c = Case(16, 16, 32, "e4m3", "e4m3", "bfloat16", False, False, "tensorwise")
    res, lines, pinfo = run_child([c], workdir, "probe", with_query=False, workspace_bytes=None,
                                  lib=lib, handle="auto", log_level=5, log_mask=None, timeout=timeout)
    found = None
    for ev in parse_log_lines(lines):
        if ev["type"] == "heur":
            found = parse_heuristic_line(ev["raw"])["max_workspace_bytes"]
        elif ev["type"] == "mm" and found is None:
            found = parse_matmul_line(ev["raw"])["torch_workspace_arg"]
    pinfo["child_errors"] = res.get("errors")
    return found, pinfo


def resolve_workspace(spec: str, rt_info: dict, workdir: str, lib: str | None,
                      timeout: float) -> tuple[int, str, dict]:
    """--workspace-bytes: an integer, 'legacy', 'unified' or 'auto' (probe, else legacy)."""
    cc = rt_info.get("compute_capability") or ""
    major = int(cc.split(".")[0]) if cc and cc.split(".")[0].isdigit() else None
    if spec.isdigit():
        return int(spec), "explicit", {}
    if spec in ("legacy", "unified"):
        return mirrored_workspace_bytes(spec, major), f"mirrored torch logic ({spec})", {}
    if spec != "auto":
        raise click.BadParameter("--workspace-bytes must be an integer, auto, legacy or unified")
    detail: dict = {}
    if rt_info.get("torch_version"):
        found, pinfo = probe_torch_workspace(workdir, lib, timeout)
        detail = {"probe": pinfo}
        if found is not None:
            return found, "probed: torch's own cublasLtMatmulAlgoGetHeuristic log", detail
    echo("WARNING: could not probe torch's workspace; falling back to mirrored 'legacy' logic")
    return mirrored_workspace_bytes("legacy", major), "mirrored torch logic (legacy) after failed probe", detail


def _compare_algo(logged: dict, q: dict) -> tuple[bool, list[str]]:
    bad = [k for k in ALGO_FIELD_NAMES if logged.get(k) != q.get(k)]
    return (not bad), bad


def _segments(events: list[dict], res: dict) -> tuple[dict[int, list], dict[int, list]]:
    """Log events per case index: ({i: torch's events}, {i: the query's events})."""
    seg_torch: dict[int, list] = {}
    seg_query: dict[int, list] = {}
    cur = None
    have_marks = any(e["type"] == "mark" for e in events)
    if have_marks:
        for e in events:
            if e["type"] == "mark":
                v = e["value"]
                if MARK_TORCH <= v < MARK_QUERY:
                    cur = seg_torch.setdefault(v - MARK_TORCH, [])
                elif v >= MARK_QUERY:
                    cur = seg_query.setdefault(v - MARK_QUERY, [])
                else:
                    cur = None
            elif cur is not None:
                cur.append(e)
    else:  # no markers: pair heuristic/matmul lines in order
        ok_idx = [t["i"] for t in res.get("torch", []) if t.get("ok")]
        pending, pairs = None, []
        for e in events:
            if e["type"] == "heur":
                pending = e
            elif e["type"] == "mm":
                pairs.append([x for x in (pending, e) if x is not None])
                pending = None
        pairs = pairs[-len(ok_idx):] if ok_idx else []  # drop the loader's warm-up GEMM
        for i, evs in zip(ok_idx, pairs):
            seg_torch[i] = evs
    return seg_torch, seg_query


def assemble_rows(cases: list[Case], res: dict, lines: list[str], keep_raw: bool) -> list[dict]:
    """Per-case rows from the child's markers, heuristic and matmul log lines."""
    seg_torch, seg_query = _segments(parse_log_lines(lines), res)
    torch_status = {t["i"]: t for t in res.get("torch", [])}
    query_rows = res.get("query", [])
    rows = []
    for i, c in enumerate(cases):
        row = asdict(c)
        t = torch_status.get(i, {})
        row["torch_ok"] = t.get("ok")
        if t.get("error"):
            row["torch_error"] = t["error"]
        evs = seg_torch.get(i, [])
        heurs = [e for e in evs if e["type"] == "heur"]
        mms = [e for e in evs if e["type"] == "mm"]
        traces = [e for e in mms if e["kind"] == "Trace"] or mms
        row["status"] = "OK" if (t.get("ok") and traces) else ("TORCH_ERROR" if t.get("ok") is False
                                                               else "NOT_PARSED")
        logged = parse_matmul_line(traces[-1]["raw"]) if traces else {}
        for k in ALGO_FIELD_NAMES:
            row[k] = logged.get(k)
        row["workspace_size"], row["waves_count"] = None, None  # not in the matmul log line
        row["torch_workspace_arg"] = logged.get("torch_workspace_arg")
        row["log_fields_present"] = logged.get("log_fields_present")
        row["algo_fields"] = logged.get("algo_fields")
        th = parse_heuristic_line(heurs[-1]["raw"]) if heurs else None
        row["max_workspace_bytes"] = th["max_workspace_bytes"] if th else None
        row["heuristic_calls"], row["matmul_lines"] = len(heurs), len(traces)
        if i < len(query_rows):
            q = query_rows[i]
            row["query"] = {k: q.get(k) for k in ("status", "status_code", *ALGO_FIELD_NAMES,
                                                  "workspace_size", "waves_count", "names")}
            if traces and q.get("status") == "OK":
                row["algo_match"], row["mismatch_fields"] = _compare_algo(logged, q)
                shown = ["algo_id"] + list(logged.get("log_fields_present") or [])
                row["algo_match_logged_fields"] = all(logged.get(k) == q.get(k) for k in shown)
            qh = [e for e in seg_query.get(i, []) if e["type"] == "heur"]
            if th and qh:
                qd = parse_heuristic_line(qh[-1]["raw"])["descs"]
                keys = sorted(set(th["descs"]) | set(qd))
                diff = [k for k in keys if th["descs"].get(k) != qd.get(k)]
                row["desc_match"], row["desc_diff"] = (not diff), {
                    k: {"torch": th["descs"].get(k), "query": qd.get(k)} for k in diff}
                if keep_raw:
                    row.setdefault("raw", {})["query_heuristic"] = qh[-1]["raw"]
        if keep_raw:
            raw = row.setdefault("raw", {})
            raw["torch_heuristic"] = heurs[-1]["raw"] if heurs else None
            raw["torch_matmul"] = [e["raw"] for e in mms]
        rows.append(row)
    return rows
