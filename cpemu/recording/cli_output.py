"""Console and file output of the recording tools: a stderr line, an atomic JSON file, a progress counter."""
from __future__ import annotations

import json
import os
import tempfile
import time

import click


def echo(msg: str) -> None:
    click.echo(msg, err=True)


def write_json_atomic(path: str, obj) -> None:
    d = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Progress:
    """A single counter line on stderr, at most every ``every`` seconds."""

    def __init__(self, total: int, label: str, every: float = 2.0):
        self.total, self.label, self.every = total, label, every
        self.t0 = self.last = time.time()

    def update(self, done: int, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        echo(f"[{self.label}] {done}/{self.total} ({100.0 * done / max(self.total, 1):.1f}%) "
              f"{rate:.0f}/s eta {eta:.0f}s")
