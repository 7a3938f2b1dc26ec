"""What identifies a benchmark record: the tool's command line, the start time, the packages,
the git state and a fingerprint of the code that decides the numbers."""

from __future__ import annotations

import datetime
import glob
import hashlib
import importlib.metadata
import os
import shlex
import subprocess
import sys

import numpy as np

import cpemu

#: The repository root (this file is tools/benchkit/provenance.py).
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
#: What decides the numbers a benchmark measures: the package, the CUDA sources and the fatbins.
CODE_GLOBS = ("cpemu/**/*.py", "cpemu/profile_data/*.json", "cuda_src/*", "bin/*.fatbin", "bin/manifest.json")


def utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def package_versions() -> dict:
    out = {}
    for dist in ("cpemu", "numpy", "ml_dtypes", "click", "cupy-cuda13x", "cupy-cuda12x", "cupy", "torch"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - broken metadata must not stop a benchmark
            out[dist] = f"unknown ({type(e).__name__})"
    out["cpemu (imported)"] = getattr(cpemu, "__version__", None)
    out["numpy (imported)"] = np.__version__
    return out


def git_state() -> dict | None:
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], check=False, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        st = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                            check=False, capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip(), "modified_tracked_files": st.stdout.split("\n")[:20]
                if st.stdout.strip() else []}
    except Exception:  # noqa: BLE001 - no git: no record of it
        return None


def code_fingerprint(root: str | None = None) -> dict:
    """sha256 over the files of CODE_GLOBS (path and bytes, sorted by path): identifies the code a
    record was measured with even where the checkout's git metadata is stale or missing."""
    root = root or ROOT
    paths = sorted({os.path.relpath(p, root).replace(os.sep, "/")
                    for g in CODE_GLOBS for p in glob.glob(os.path.join(root, g), recursive=True)
                    if os.path.isfile(p)})
    h = hashlib.sha256()
    for rel in paths:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return {"sha256": h.hexdigest(), "files": len(paths), "globs": list(CODE_GLOBS)}


def record_header(tool: str) -> dict:
    """The first fields of a smaller benchmark tool's record (bench_dropin, bench_tiled_geometry):
    the tool, its command line, the start time, and what identifies the code and packages."""
    return {"tool": tool, "command_line": " ".join(shlex.quote(x) for x in sys.argv), "started_utc": utc(),
            "packages": package_versions(), "git": git_state(), "code": code_fingerprint()}


def reference_threads():
    """The reference backend's default thread count, or why CPEMU_THREADS is refused."""
    from cpemu import reference

    try:
        return reference.threads_default()
    except ValueError as e:  # a bad CPEMU_THREADS: the reference backend would refuse it too
        return str(e)
