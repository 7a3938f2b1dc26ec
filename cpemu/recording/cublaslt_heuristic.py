#!/usr/bin/env python3
"""Ask cuBLASLt's heuristic which algorithm ``torch._scaled_mm`` gets on CUDA.

Split-K and tile choices made by ``cublasLtMatmulAlgoGetHeuristic`` change the
output bits of an FP8 GEMM, so this tool rebuilds, through ``ctypes``, the exact
descriptors that torch builds in ``at::cuda::blas::scaled_gemm``
(aten/src/ATen/cuda/CUDABlas.cpp) for the operands prepared by
``cublasCommonArgs`` (aten/src/ATen/native/cuda/cuBlasCommonArgs.h) and
``_scaled_mm_out_cuda`` / ``_scaled_gemm`` (aten/src/ATen/native/cuda/ScaledBlas.cpp),
then asks the heuristic for its top-1 answer, as torch does.

Subcommands:
  query      heuristic answers for a grid or list of shapes (no GEMM is run).
  torch-log  runs real ``torch._scaled_mm`` in child processes with cuBLASLt's
             API log enabled, parses the algorithm torch really used, and (by
             default) compares it with a ``query`` made in the same process.
  grids      lists the built-in grids.
  selftest   checks struct layouts, enum tables and, if a libcublasLt is found,
             that every descriptor attribute is accepted (no GPU needed).

This module is the command line. The work lives in modules with one job each:

* :mod:`cpemu.cuda.cublaslt` -- the cuBLASLt binding, torch's descriptors, the library search;
* :mod:`.cublaslt_grids` -- built-in grids, shape files, the cases of the options;
* :mod:`.cublaslt_query` -- library, device, handle and pointers; torch's workspace size; one query;
* :mod:`.cublaslt_log` -- the cuBLASLt log parser;
* :mod:`.cublaslt_torchlog` -- the ``torch-log`` child processes and their rows;
* :mod:`.cli_output` -- stderr lines, atomic JSON files, progress.

Their names stay importable from here. Nothing touches CUDA at import time.
See tools/CUBLASLT_HEURISTIC.md.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
import time

import click

from cpemu.cuda.cublaslt import (  # noqa: F401 - re-exported: the binding's names stay importable here
    ALGO_CONFIG_FIELDS, ALGO_FIELD_NAMES, CLUSTER_NAMES, CONFIG_DESCRIPTION, CUBLAS_COMPUTE_32F, CUBLAS_OP_N,
    CUBLAS_OP_T, CUBLAS_STATUS_NAMES, CUBLASLT_EPILOGUE_BIAS, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF,
    CUDA_R_16F, CUDA_R_32F, CUDA_TYPE_LOG_NAMES, DESC_A_SCALE_MODE, DESC_A_SCALE_POINTER, DESC_B_SCALE_MODE,
    DESC_B_SCALE_POINTER, DESC_BIAS_DATA_TYPE, DESC_BIAS_POINTER, DESC_EPILOGUE, DESC_FAST_ACCUM, DESC_TRANSA,
    DESC_TRANSB, DTYPES, INNER_SHAPE_NAMES, LT_NAMES, PREF_MAX_WORKSPACE_BYTES, REDUCTION_NAMES,
    SCALE_MODE_OUTER_VEC_32F, SCALE_MODE_SCALAR_32F, STAGES_NAMES, TILE_NAMES, Case, CublasLt, HeuristicResult,
    LtError, MatmulAlgo, build_descs, candidate_paths, describe_algo, destroy_descs, find_cublaslt, loaded_libs,
    torch_lt_plan)
from cpemu.recording.cli_output import Progress, echo, write_json_atomic
from cpemu.recording.cublaslt_grids import (  # noqa: F401 - re-exported
    EVO2_NK, GRIDS, IN_DTYPE_PAIRS, OUT_DTYPE_ALIASES, SCALE_MODES, build_cases, gather_shapes, grid_shapes,
    load_shapes_file)
from cpemu.recording.cublaslt_log import (  # noqa: F401 - re-exported
    BRACKET_RE, HEX_RE, LOG_LINE_RE, MARK_COLS, MARK_QUERY, MARK_RE, MARK_TORCH, parse_heuristic_line,
    parse_log_lines, parse_matmul_line)
from cpemu.recording.cublaslt_query import (  # noqa: F401 - re-exported
    CUDART_NAMES, EMPTY_ALGO, Cudart, Runtime, mirrored_workspace_bytes, query_case)
from cpemu.recording.cublaslt_torchlog import (  # noqa: F401 - re-exported
    assemble_rows, child_main, probe_torch_workspace, resolve_workspace, run_child)

TOOL = "cublaslt_heuristic"
TOOL_VERSION = 1

_echo, _write_json_atomic = echo, write_json_atomic  # their former names here (splitk_table uses one)


def case_options(f):
    """Options shared by query and torch-log."""
    opts = [
        click.option("--shapes-file", type=click.Path(exists=True, dir_okay=False),
                     help="JSON list of [M,N,K] (or {M,N,K} objects)."),
        click.option("--grid", type=click.Choice(sorted(GRIDS)), help="Built-in grid."),
        click.option("--shape", "shape_opts", multiple=True, help="Extra shape 'M,N,K' (repeatable)."),
        click.option("--in-dtypes", multiple=True, type=click.Choice(IN_DTYPE_PAIRS),
                     default=("e4m3,e4m3",), show_default=True, help="'a,b' torch operand dtypes (repeatable)."),
        click.option("--out-dtype", "out_dtypes", multiple=True, default=("bfloat16",), show_default=True,
                     type=click.Choice(sorted(OUT_DTYPE_ALIASES), case_sensitive=False),
                     help="Output dtype (repeatable)."),
        click.option("--fast-accum/--no-fast-accum", default=None,
                     help="use_fast_accum value; both when omitted."),
        click.option("--bias", type=click.Choice(["none", "present", "both"]), default="none",
                     show_default=True),
        click.option("--scale-mode", "scale_modes", multiple=True, type=click.Choice(SCALE_MODES),
                     default=("tensorwise",), show_default=True, help="Repeatable."),
        click.option("--include-invalid", is_flag=True, help="Also query combos torch rejects."),
        click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
                     help="Output JSON (written atomically)."),
        click.option("--workspace-bytes", default="auto", show_default=True,
                     help="int | auto (probe torch's log; else legacy) | legacy | unified."),
        click.option("--lib", type=click.Path(dir_okay=False), help="libcublasLt to load."),
        click.option("--handle", type=click.Choice(["auto", "torch", "own"]), default="auto",
                     show_default=True, help="torch's cuBLAS handle or a cublasLtCreate one."),
        click.option("--probe-timeout", type=float, default=300.0, show_default=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Reproduce cuBLASLt's algorithm choice for torch._scaled_mm (FP8, CUDA)."""


@cli.command()
def grids() -> None:
    """List built-in grids and their shape counts."""
    for name, text in GRIDS.items():
        click.echo(f"{name:14s} {len(grid_shapes(name)):6d} shapes  {text}")


@cli.command()
@case_options
@click.option("--top", type=int, default=1, show_default=True,
              help="requestedAlgoCount; rank 0 is what torch uses, the rest go to 'alternatives'.")
@click.option("--use-torch", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True)
@click.option("--pointers", type=click.Choice(["auto", "torch", "cudart", "synthetic"]), default="auto",
              show_default=True, help="Where scale/bias device pointers come from.")
def query(shapes_file, grid, shape_opts, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
          include_invalid, out_path, workspace_bytes, lib, handle, probe_timeout, top, use_torch,
          pointers) -> None:
    """Ask the heuristic (top-1, like torch) for every shape x option combination."""
    shapes = gather_shapes(shapes_file, grid, shape_opts)
    cases, skipped = build_cases(shapes, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
                                 include_invalid)
    echo(f"[query] {len(shapes)} shapes -> {len(cases)} cases ({skipped} skipped: torch rejects them)")
    t_start = time.time()
    rt = Runtime(use_torch=use_torch, lib=lib, handle=handle, pointers=pointers)
    echo(f"[query] libcublasLt {rt.info['library_path']} version {rt.info['cublaslt_version']} "
          f"({rt.info['library_found_by']}); torch {rt.info.get('torch_version')}")
    with tempfile.TemporaryDirectory(prefix="cublaslt-probe-") as wd:
        ws, ws_source, ws_detail = resolve_workspace(workspace_bytes, rt.info, wd, lib, probe_timeout)
    echo(f"[query] workspace {ws} bytes ({ws_source})")
    rt.open_handle()
    ptrs = rt.pointers(max(c.M for c in cases), max(c.N for c in cases))
    rows: list[dict] = []
    prog = Progress(len(cases), "query")
    t0 = time.time()
    for i, c in enumerate(cases):
        rows.append(query_case(rt.lt, rt.handle, c, ptrs, ws, top))
        if i + 1 == min(20, len(cases)):
            dt = time.time() - t0
            rate = (i + 1) / max(dt, 1e-9)
            echo(f"[query] rate {rate:.0f} queries/s; estimated {len(cases) / rate:.1f}s for all")
        prog.update(i + 1)
    prog.update(len(cases), force=True)
    rt.close()
    status_counts: dict[str, int] = {}
    for r in rows:
        status_counts[r["status"]] = status_counts.get(r["status"], 0) + 1
    doc = {"tool": TOOL, "tool_version": TOOL_VERSION, "mode": "query",
           "cublaslt_version": rt.info["cublaslt_version"], "library_path": rt.info["library_path"],
           "torch_version": rt.info.get("torch_version"), "device_name": rt.info.get("device_name"),
           "sm_count": rt.info.get("sm_count"), "workspace_bytes": ws,
           "workspace_source": ws_source, "workspace_detail": ws_detail, "runtime": rt.info,
           "config": {**CONFIG_DESCRIPTION, "requestedAlgoCount": top},
           "status_counts": status_counts, "seconds": round(time.time() - t_start, 2),
           "rows": rows}
    write_json_atomic(out_path, doc)
    echo(f"[query] wrote {out_path}: {len(rows)} rows, status {status_counts}")


@cli.command("torch-log")
@case_options
@click.option("--with-query/--no-query", default=True, show_default=True,
              help="Also run this tool's query in the same child and compare.")
@click.option("--chunk", type=int, default=1000, show_default=True, help="Cases per child process.")
@click.option("--every", type=int, default=1, show_default=True, help="Keep every n-th case.")
@click.option("--limit", type=int, default=0, help="Keep at most this many cases (0: all).")
@click.option("--log-level", type=int, default=5, show_default=True, help="CUBLASLT_LOG_LEVEL.")
@click.option("--log-mask", type=int, default=19, show_default=True,
              help="CUBLASLT_LOG_MASK (19 = error|trace|API trace; negative: unset).")
@click.option("--child-timeout", type=float, default=900.0, show_default=True)
@click.option("--raw/--no-raw", "keep_raw", default=True, show_default=True,
              help="Keep the parsed raw log lines per row.")
@click.option("--keep-logs", type=click.Path(file_okay=False), default=None,
              help="Directory to keep child jobs and cuBLASLt logs in.")
def torch_log(shapes_file, grid, shape_opts, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
              include_invalid, out_path, workspace_bytes, lib, handle, probe_timeout, with_query, chunk,
              every, limit, log_level, log_mask, child_timeout, keep_raw, keep_logs) -> None:
    """Run real torch._scaled_mm under cuBLASLt logging and parse the algo it used."""
    shapes = gather_shapes(shapes_file, grid, shape_opts)
    cases, skipped = build_cases(shapes, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
                                 include_invalid)
    cases = cases[::max(1, every)]
    if limit > 0:
        cases = cases[:limit]
    echo(f"[torch-log] {len(cases)} cases ({skipped} skipped: torch rejects them)")
    t_start = time.time()
    wd_ctx = None
    if keep_logs:
        os.makedirs(keep_logs, exist_ok=True)
        wd = keep_logs
    else:
        wd_ctx = tempfile.TemporaryDirectory(prefix="cublaslt-torchlog-")
        wd = wd_ctx.name
    try:
        ws, ws_source, ws_detail = None, "not needed (--no-query)", {}
        if not with_query:
            pass
        elif workspace_bytes.isdigit():
            ws, ws_source = int(workspace_bytes), "explicit"
        elif workspace_bytes in ("legacy", "unified"):
            ws, ws_source = mirrored_workspace_bytes(workspace_bytes, 9), f"mirrored ({workspace_bytes}, sm_90)"
        else:
            ws, pinfo = probe_torch_workspace(wd, lib, probe_timeout)
            ws_source, ws_detail = "probed: torch's own heuristic log", {"probe": pinfo}
            if ws is None:
                ws = mirrored_workspace_bytes("legacy", 9)
                ws_source = "mirrored (legacy, sm_90) after failed probe"
                echo(f"WARNING: workspace probe failed ({pinfo}); using {ws}")
        echo(f"[torch-log] query workspace {ws} bytes ({ws_source})")
        rows: list[dict] = []
        info: dict = {}
        children = []
        prog = Progress(len(cases), "torch-log", every=0.0)
        for ci in range(0, len(cases), max(1, chunk)):
            part = cases[ci:ci + max(1, chunk)]
            res, lines, pinfo = run_child(part, wd, f"chunk{ci // max(1, chunk):04d}", with_query=with_query,
                                          workspace_bytes=ws, lib=lib, handle=handle, log_level=log_level,
                                          log_mask=None if log_mask < 0 else log_mask, timeout=child_timeout)
            pinfo["child_errors"] = res.get("errors")
            children.append(pinfo)
            info = info or res.get("info", {})
            if res.get("errors") or pinfo["returncode"] != 0:
                echo(f"[torch-log] child problem: rc={pinfo['returncode']} errors={res.get('errors')}\n"
                      f"{(pinfo.get('stderr_tail') or '')[-1500:]}")
            rows += assemble_rows(part, res, lines, keep_raw)
            prog.update(min(ci + len(part), len(cases)), force=True)
        summary = {
            "rows": len(rows),
            "torch_ok": sum(1 for r in rows if r.get("torch_ok")),
            "parsed": sum(1 for r in rows if r["status"] == "OK"),
            "algo_match": sum(1 for r in rows if r.get("algo_match") is True),
            "algo_mismatch": sum(1 for r in rows if r.get("algo_match") is False),
            "desc_match": sum(1 for r in rows if r.get("desc_match") is True),
            "desc_mismatch": sum(1 for r in rows if r.get("desc_match") is False),
            "torch_max_workspace_bytes": sorted({r["max_workspace_bytes"] for r in rows
                                                 if r.get("max_workspace_bytes") is not None}),
        }
        doc = {"tool": TOOL, "tool_version": TOOL_VERSION, "mode": "torch-log",
               "cublaslt_version": info.get("cublaslt_version"), "library_path": info.get("library_path"),
               "torch_version": info.get("torch_version"), "device_name": info.get("device_name"),
               "sm_count": info.get("sm_count"), "workspace_bytes": ws, "workspace_source": ws_source,
               "workspace_detail": ws_detail, "runtime": info, "children": children,
               "config": {**CONFIG_DESCRIPTION, "log": {"CUBLASLT_LOG_LEVEL": log_level,
                                                        "CUBLASLT_LOG_MASK": log_mask}},
               "summary": summary, "seconds": round(time.time() - t_start, 2), "rows": rows}
        write_json_atomic(out_path, doc)
        echo(f"[torch-log] wrote {out_path}: {summary}")
    finally:
        if wd_ctx is not None:
            wd_ctx.cleanup()


@cli.command("_torch-child", hidden=True)
@click.option("--job", required=True, type=click.Path(exists=True))
@click.option("--out", "out_path", required=True, type=click.Path())
def torch_child(job, out_path) -> None:
    """Internal: runs in a child process with cuBLASLt logging enabled."""
    child_main(job, out_path)


@cli.command()
@click.option("--lib", type=click.Path(dir_okay=False), help="libcublasLt to check (else searched).")
def selftest(lib) -> None:
    """Offline checks: layouts, tables, grids and (if a library loads) every descriptor attribute."""
    ok = True

    def check(cond, text):
        nonlocal ok
        ok &= bool(cond)
        click.echo(f"{'ok  ' if cond else 'FAIL'} {text}")

    check(ctypes.sizeof(MatmulAlgo) == 64, f"sizeof(cublasLtMatmulAlgo_t) = {ctypes.sizeof(MatmulAlgo)}")
    check(ctypes.sizeof(HeuristicResult) == 96,
          f"sizeof(cublasLtMatmulHeuristicResult_t) = {ctypes.sizeof(HeuristicResult)}")
    check(HeuristicResult.workspaceSize.offset == 64 and HeuristicResult.state.offset == 72
          and HeuristicResult.wavesCount.offset == 76, "result field offsets 64/72/76")
    check(TILE_NAMES[20] == "128x128" and STAGES_NAMES[36] == "128xAUTO" and CLUSTER_NAMES[2] == "1x1x1",
          "tile/stages/cluster tables")
    check(len(grid_shapes("wide")) > 0 and len(grid_shapes("dense-splitk")) > 0, "grids build")
    check(all(n <= 16384 for s in grid_shapes("wide") for n in s[1:]), "wide grid keeps N, K <= 16384")
    sample = parse_matmul_line("[2025-01-01][cublasLt][1][Trace][cublasLtMatmul] A=0X1 algo=[algoId=66 "
                               "tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_128xAUTO customOption=3 "
                               "clusterShape=CLUSTER_SHAPE_1x1x1 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE "
                               "numSplitsK=4] workSpace=0X0 workSpaceSizeInBytes=1048576 beta=0")
    check(sample["algo_id"] == 66 and sample["tile_id"] == 20 and sample["stages_id"] == 36
          and sample["cluster_shape_id"] == 2 and sample["splitk_num"] == 4 and sample["reduction_scheme"] == 2
          and sample["custom_option"] == 3 and sample["torch_workspace_arg"] == 1048576, "matmul log parser")
    try:
        path, how, _ = find_cublaslt(lib)
        lt = CublasLt(path)
        click.echo(f"info libcublasLt {path} ({how}) version {lt.version()}")
    except Exception as e:  # noqa: BLE001
        click.echo(f"skip library checks: {e}")
        raise SystemExit(0 if ok else 1)
    fake = {"scale_a": 0x7F0000000000, "scale_b": 0x7F0000001000, "bias": 0x7F0000002000}
    for c in (Case(16, 5760, 1920, "e4m3", "e4m3", "bfloat16", True, True, "rowwise"),
              Case(1, 16, 32, "e4m3", "e5m2", "float32", False, False, "tensorwise"),
              Case(8, 12288, 4096, "e5m2", "e4m3", "float16", False, True, "tensorwise")):
        try:
            made = build_descs(lt, c, fake, 1 << 20)
            destroy_descs(lt, made)
            check(True, f"descriptors accepted for {c}")
        except LtError as e:
            check(False, f"descriptors for {c}: {e}")
    algo = MatmulAlgo()
    cfg = lt.read_algo(algo)
    check(all(v is not None for v in cfg.values()), f"AlgoConfigGetAttribute on a zero algo: {cfg}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    cli()
