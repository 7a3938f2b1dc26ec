"""Turn recorder output folders (tools/record_truth.py) into a committed truth folder.

    python tools/import_truth.py --src RUN1/truth --src RUN2/truth --heur RUN1/heur_truth.json \
        --heur RUN2/heur_splitk2.json --profile hopper-h200-torch --out tests/data/h200

Per case it keeps the recorded parameters, the sha256 of inputs and outputs, and the
output bits: whole outputs up to ``--max-elems`` elements, otherwise the first rows that
fit (``stored: "rows"`` is not used: the sha256 of the whole output is always checked and
the stored rows only serve to print bit patterns). It adds, from the cuBLASLt heuristic
query files, the split-K count the GPU library used for the case. Writes a manifest
validated by schemas/truth.schema.json, atomically.
"""

from __future__ import annotations

import json
import os

import click
import jsonschema
import numpy as np

from cpemu.profile import load_schema
from cpemu.recording.splitk_rule import rows_of
from cpemu.truth import file_sha256


def heur_index(paths):
    """(M, N, K, a, b, out, fast, bias, scaling) -> split count, from heuristic query or table files."""
    idx = {}
    for p in paths:
        for c, M, N, K, ch in rows_of(p):
            if ch not in "x?":
                idx[(M, N, K, c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"], c["bias"],
                     c["scale_mode"])] = int(ch, 36)
    return idx


@click.command()
@click.option("--src", "srcs", multiple=True, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--heur", "heurs", multiple=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--profile", required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False))
@click.option("--max-elems", default=4096, show_default=True)
@click.option("--drop-tag", "drop_tags", multiple=True, help="leave out cases with this tag")
@click.option("--keep-every", default=1, show_default=True,
              help="for suites named by --thin, keep every n-th case (CI time)")
@click.option("--thin", "thin", multiple=True)
def main(srcs, heurs, profile, out_dir, max_elems, drop_tags, keep_every, thin):
    s = build_truth_folder(srcs, heurs, profile, out_dir, max_elems, drop_tags, keep_every, thin)
    click.echo(f"{s['cases']} cases ({s['rejected']} rejected by torch), {s['files']} files, {s['mb']:.2f} MB")


def build_truth_folder(srcs, heurs, profile, out_dir, max_elems=4096, drop_tags=(), keep_every=1, thin=()) -> dict:
    """Write ``out_dir``: the recorded suites' npz files and a validated manifest."""
    os.makedirs(out_dir, exist_ok=True)
    prov = json.load(open(os.path.join(srcs[0], "provenance.json")))
    hidx = heur_index(heurs)
    cases, files = [], {}
    for src in srcs:
        for name in sorted(f[:-5] for f in os.listdir(src) if f.endswith(".json") and f != "provenance.json"):
            doc = json.load(open(os.path.join(src, f"{name}.json")))
            npz = np.load(os.path.join(src, f"{name}.npz"))
            keep = {}
            for i, rec in enumerate(doc["cases"]):
                if any(t in rec.get("tags", []) for t in drop_tags):
                    continue
                if name in thin and i % keep_every:
                    continue
                rec = dict(rec)
                if "error" not in rec:
                    y = npz[rec["id"]]
                    rows = max(1, min(y.shape[0], max_elems // max(1, y.shape[1])))
                    keep[rec["id"]] = y[:rows]
                    rec["stored"] = "bits"
                    rec["stored_rows"] = int(rows)
                    rec["file"] = f"{name}.npz"
                    key = (rec["M"], rec["N"], rec["K"], rec["a_format"], rec["b_format"], rec["out_dtype"],
                           rec["fast_accum"], rec["bias"], "rowwise" if rec["scale"] == "rowwise" else "tensorwise")
                    if key in hidx:
                        rec["splits"] = hidx[key]
                cases.append(rec)
            if keep:
                path = os.path.join(out_dir, f"{name}.npz")
                np.savez_compressed(path, **keep)
                files[f"{name}.npz"] = file_sha256(path)
    man = {"schema_version": 1, "profile": profile,
           "description": "torch._scaled_mm outputs recorded on the GPU named in provenance, for cpemu's designed "
                          "case suites (cpemu/cases.py); inputs are regenerated from the seeds",
           "provenance": {"gpu": prov["gpu"], "driver": prov["driver"], "torch": prov["torch"],
                          "torch_cuda": prov["torch_cuda"], "sm_count": prov["sm_count"],
                          "cublaslt": prov["cublaslt"], "numpy": prov.get("numpy"),
                          "ml_dtypes": prov.get("ml_dtypes")},
           "generator": {"module": "cpemu.cases", "tool": "tools/record_truth.py",
                         "seed_scheme": "PCG64 seeded with sha256('MxNxK:ab:data:seed:salt'); inputs_sha256 guards "
                                        "against generator drift",
                         "command": "python tools/record_truth.py record --out DIR; python tools/import_truth.py ..."},
           "files": files, "cases": cases}
    jsonschema.validate(man, load_schema("truth"))
    tmp = os.path.join(out_dir, "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(man, f, indent=0)
    os.replace(tmp, os.path.join(out_dir, "manifest.json"))
    return {"cases": len(cases), "rejected": sum("error" in c for c in cases), "files": len(files),
            "mb": sum(os.path.getsize(os.path.join(out_dir, f)) for f in files) / 1e6}


if __name__ == "__main__":
    main()
