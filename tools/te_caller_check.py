"""Transformer Engine's forward GEMM against torch's, asked of cuBLASLt's heuristic on this GPU.

For Evo 2's projection shapes (1B 1920 -> 5760, 7B 4096 -> 12288, 20B/40B 8192 -> 24576) at
every M = 16..16384 (multiples of 16), with workspaces of 1, 4, 32 MiB and 32 MiB + 1 KiB,
asks the heuristic twice: with torch's descriptors (cpemu's profile) and with TE's
(:func:`cpemu.recording.te_caller.build_te_descs`, docs/te-caller.md). Writes the verdict
JSON (per model, caller and workspace: the M that split K, the configurations, whether TE's
answer equals torch's 1 MiB answer at every M) with its provenance; ``--rows`` also keeps
every answer. Exit status 1 if TE splits K anywhere (cpemu's unsplit schedule would then
not be TE's there). About 25,000 queries: well under a minute on an H200 host.

    python tools/te_caller_check.py --out cpemu/profile_data/hopper-h200-torch.te-caller.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time

from cpemu.cuda.cublaslt import build_descs
from cpemu.recording import cublaslt_query as cq
from cpemu.recording.cli_output import write_json_atomic
from cpemu.recording.te_caller import EVO2_SHAPES, build_te_descs, cases, m_values, run_check, verdict


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="verdict JSON")
    ap.add_argument("--rows", help="also write every answer here (JSON)")
    ap.add_argument("--m-max", type=int, default=16384)
    ap.add_argument("--m-step", type=int, default=16)
    args = ap.parse_args(argv)
    rt = cq.Runtime()
    rt.open_handle()
    ptrs = rt.pointers(args.m_max, max(n for n, _ in EVO2_SHAPES.values()))

    def ask(caller, case, ws):
        build = build_te_descs if caller == "te" else build_descs
        return cq.query_case(rt.lt, rt.handle, case, ptrs, ws, 1, build=build)

    t0 = time.time()
    rows = run_check(ask, cases(ms=m_values(16, args.m_max, args.m_step)))
    prov = {k: rt.info.get(k) for k in ("device_name", "sm_count", "compute_capability", "cublaslt_version",
                                        "torch_version", "library_path", "pointers", "handle")}
    prov.update(tool="tools/te_caller_check.py", cpemu_commit=_commit(), seconds=round(time.time() - t0, 1),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                te_source="TransformerEngine transformer_engine/common/gemm/cublaslt_gemm.cu (cublas_gemm), "
                          "pytorch/cpp_extensions/gemm.py (get_cublas_workspace_size_bytes), v1.13..v2.18")
    rt.close()
    doc = verdict(rows, prov)
    write_json_atomic(args.out, doc)
    if args.rows:
        write_json_atomic(args.rows, rows)
    print(json.dumps({"te_no_split": doc["te_no_split"], "queries": len(rows), "seconds": prov["seconds"]}))
    return 0 if doc["te_no_split"] else 1


if __name__ == "__main__":
    sys.exit(main())
