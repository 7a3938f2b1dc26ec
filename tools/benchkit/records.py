"""Writing benchmark records: atomic JSON, and the end of a tool (exit 1 on a failure)."""

from __future__ import annotations

import json
import os
import sys

import click
import numpy as np


def json_default(x):
    """JSON for what json.dump does not know: numpy scalars and arrays, bytes, else str()."""
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (bytes, bytearray)):
        return x.decode(errors="replace")
    return str(x)


def write_json(rec: dict, path: str) -> None:
    """Write a record atomically: a temporary file beside ``path``, then a rename."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(rec, fh, indent=1, default=json_default)
    os.replace(tmp, path)


def finish(rec: dict, path: str) -> None:
    """The end of a benchmark tool: write the record, say where, and exit 1 after printing
    its failures (``rec["failures"]``) if it has any."""
    write_json(rec, path)
    click.echo(f"wrote {path}")
    if rec["failures"]:
        for msg in rec["failures"]:
            click.echo(f"FAIL: {msg}", err=True)
        sys.exit(1)
