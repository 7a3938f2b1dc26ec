"""Merge ``tools/bench_kernels.py`` records into one markdown table (the benchmarks README).

    python tools/bench_summary.py benchmarks/h200/*.json [--M 2048] [--json summary.json]

One row per (profile, shape, data, M) and one column per backend: TMAC/s, MAC per clock per
SM, from the latest record (by ``started_utc``) that has that point, and its ratio to the
native ``torch._scaled_mm`` measured in the same run ("-" when that run had none); the native
column is the latest record's. Marks: ``h`` host-bound (the GPU
waited for Python), ``*`` single call, ``!`` an exactness check failed. A point is
``exact`` when every check of every kernel on it passed: ``full`` when some kernel was
compared with cuda-simple/cuda-tiled on the full output, ``rows`` when only the
reference's first rows were compared.
"""

from __future__ import annotations

import json
import sys

import click

ORDER = ("cublaslt-tc", "cuda-tiled", "cuda-simple", "reference")


def load_points(paths):
    points: dict = {}
    for path in paths:
        with open(path) as f:
            rec = json.load(f)
        prof = rec["profile"]["name"] if isinstance(rec.get("profile"), dict) else rec["options"]["profile"]
        started = rec.get("started_utc", "")
        ex = {(e["shape"], e["data"], e["M"], e["kernel"]): e for e in rec.get("exactness", [])}
        rows = [r for r in rec.get("results", []) if r.get("status") == "ok"]
        natives = [dict(r, kernel="native") for r in rec.get("native", []) if r.get("status") == "ok"]
        same_run = {(r["shape"], r["data"], r["M"]): r["tmacs"] for r in natives}
        rows += natives
        for r in rows:
            key = (prof, r["shape"], r["data"], r["M"])
            p = points.setdefault(key, {})
            old = p.get(r["kernel"])
            if old is not None and old["started"] > started:
                continue
            e = ex.get((r["shape"], r["data"], r["M"], r["kernel"]), {})
            p[r["kernel"]] = {"started": started, "file": path, "tmacs": r["tmacs"],
                              "mac_clk_sm": r.get("mac_per_clock_per_sm"), "host_bound": bool(r.get("host_bound")),
                              "single": r.get("timing") == "single-call", "ok": e.get("ok"),
                              "native_same_run": same_run.get((r["shape"], r["data"], r["M"])),
                              "full": (e.get("vs_cuda_simple") or {}).get("ok") is True}
    return points


def table(points, m_filter=None) -> str:
    kernels = [k for k in ORDER if any(k in p for p in points.values())]
    head = ["profile", "shape", "data", "M"] + [f"{k} TMAC/s (MAC/clk/SM)" for k in kernels] + ["native TMAC/s"] + \
        [f"{k}/native" for k in kernels] + ["exact"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(points, key=lambda k: (k[0], k[1], k[2], k[3])):
        if m_filter and key[3] not in m_filter:
            continue
        p = points[key]
        nat = p.get("native")
        cells = list(map(str, key))
        for k in kernels:
            r = p.get(k)
            if r is None:
                cells.append("-")
                continue
            mark = ("h" if r["host_bound"] else "") + ("*" if r["single"] else "") + ("!" if r["ok"] is False else "")
            clk = f" ({r['mac_clk_sm']:.3g})" if r["mac_clk_sm"] else ""
            cells.append(f"{r['tmacs']:.3g}{clk}{mark}")
        cells.append(f"{nat['tmacs']:.3g}" if nat else "-")
        for k in kernels:
            r = p.get(k)
            base = r["native_same_run"] if r else None
            cells.append(f"{r['tmacs'] / base:.3f}" if base else "-")
        oks = [r["ok"] for k, r in p.items() if k != "native"]
        exact = "FAIL" if False in oks else ("full" if any(r["full"] for k, r in p.items() if k != "native")
                                            else "rows")
        cells.append(exact)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--M", "m_text", default=None, help="Only these M (comma-separated).")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False), help="Also write the points.")
def main(paths, m_text, json_out):
    """Print the merged markdown table of bench_kernels records."""
    points = load_points(paths)
    m_filter = {int(x) for x in m_text.split(",")} if m_text else None
    click.echo(table(points, m_filter))
    if json_out:
        with open(json_out, "w") as f:
            json.dump([{"profile": k[0], "shape": k[1], "data": k[2], "M": k[3], **v} for k, v in
                       sorted(points.items())], f, indent=1)
    failed = any(r.get("ok") is False for p in points.values() for r in p.values())
    for path in paths:  # a record's own failures: a backend's validation, a kernel error, ...
        with open(path) as f:
            for msg in json.load(f).get("failures") or []:
                click.echo(f"FAIL {path}: {msg}")
                failed = True
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
