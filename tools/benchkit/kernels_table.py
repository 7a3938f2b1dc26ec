"""The table ``tools/bench_kernels.py`` prints at the end of a run."""

from __future__ import annotations

import click

from benchkit import host_backend


def _exact(rec: dict) -> dict:
    """Per (shape, data, M): "NO" on any mismatch; "yes" when every output was also compared in
    full; else "rows"."""
    exact = {}
    for e in rec["exactness"]:
        k = (e["shape"], e["data"], e["M"])
        if "ok" not in e:
            continue
        full = e["kernel"] == "cuda-simple" or (e.get("vs_cuda_simple") or {}).get("ok") is True
        now = "NO" if not e["ok"] else ("yes" if full else "rows")
        prev = exact.get(k, "yes")
        exact[k] = "NO" if "NO" in (prev, now) else ("rows" if "rows" in (prev, now) else "yes")
    return exact


def _cell(r):
    if r is None:
        return "-"
    if r.get("status") != "ok":
        return r.get("status", "?")
    s = f"{r['tmacs']:.3g}"
    if r.get("mac_per_clock_per_sm"):
        s += f" ({r['mac_per_clock_per_sm']:.3g})"
    if r.get("timing") == "single-call":
        s += "*"
    if r.get("host_bound"):
        s += "h"
    return s


def _rows(rec: dict, keys: list, kernels: list[str], has_native: bool) -> list[list[str]]:
    res = {(r["kernel"], r["shape"], r["data"], r["M"]): r for r in rec["results"]}
    nat = {(r["shape"], r["data"], r["M"]): r for r in rec["native"]}
    exact = _exact(rec)
    rows = []
    for k in keys:
        row = [k[0], k[1], str(k[2])] + [_cell(res.get((n,) + k)) for n in kernels]
        if has_native:
            row.append(_cell(nat.get(k)))
            for n in kernels:
                if host_backend(n):
                    continue
                v = (res.get((n,) + k) or {}).get("vs_native")
                row.append(f"{v:.3g}" if v else "-")
        row.append(exact.get(k, "-"))
        rows.append(row)
    return rows


def print_table(rec: dict) -> None:
    """One row per (shape, data, M): each backend's TMAC/s (MAC per clock per SM), the native
    TMAC/s and each backend's ratio to it, and whether the outputs were exact."""
    kernels = rec.get("kernels") or []
    keys = list(dict.fromkeys((r["shape"], r["data"], r["M"]) for r in rec["results"] + rec["native"]))
    if not keys:
        click.echo("no results")
        return
    has_native = bool(rec["native"])
    head = ["shape", "data", "M"] + [f"{k} TMAC/s" for k in kernels] + (["native TMAC/s"] if has_native else []) \
        + ([f"{k}/native" for k in kernels if not host_backend(k)] if has_native else []) + ["exact"]
    rows = _rows(rec, keys, kernels, has_native)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    click.echo("TMAC/s (MAC per clock per SM); * single call (not windowed), h host-bound (launch overhead). "
               "exact: yes = outputs equal the reference's first rows and cuda-simple's full output; rows = only the "
               "reference rows were compared (no cuda-simple output).")
