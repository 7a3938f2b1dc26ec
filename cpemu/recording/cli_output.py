"""Console and file output of the recording tools: a stderr line, an atomic JSON file, a progress counter."""
from __future__ import annotations

import json
import os
import tempfile
import time

import click

from ..progress import Progress as _Progress


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


class Progress(_Progress):
    """A counter line on stderr at most every ``every`` seconds, also when stderr is not a terminal
    (the tools' logs): done/total, the share, the time elapsed and an estimate of the time left."""

    def __init__(self, total: int, label: str, every: float = 2.0):
        super().__init__(total, label, terminal_only=False, every=every, clock=time.time)

    def update(self, done: int, force: bool = False) -> None:
        super().update(done, f"{done}/{self.total}", force)
