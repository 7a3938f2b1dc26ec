"""Progress of long work on stderr: how much is done and an estimate of the time left.

:class:`Progress` draws one line, ``[label] 37.5 % (detail), 12 s elapsed, about 20 s left``,
redrawn in place. It is shown only when its stream is a terminal, and only once the work has
run :data:`DELAY` seconds, so short calls and redirected output stay quiet. The estimate
assumes the rest runs at the rate so far (the work is counted in units of equal cost, such as
products). ``add`` may be called from worker threads.
"""

from __future__ import annotations

import sys
import threading
import time

__all__ = ["Progress", "is_terminal", "duration", "DELAY"]

#: Seconds of work before a line is first drawn.
DELAY = 1.0
#: Seconds between two redraws.
EVERY = 0.5


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """A progress line for ``total`` units of work (see the module docstring).

    ``terminal_only=False`` writes every redraw as its own line, also when the stream is not a
    terminal (for logs of batch tools), from the first call on."""

    def __init__(self, total: int, label: str, stream=None, terminal_only: bool = True, every: float | None = None,
                 clock=time.monotonic):
        self.total, self.label = max(0, int(total)), label
        self.stream = sys.stderr if stream is None else stream
        self.tty = is_terminal(self.stream) and terminal_only  # redrawn in place
        self.enabled = (self.tty or not terminal_only) and self.total > 0
        self.delay = DELAY if terminal_only else 0.0
        self.every = EVERY if every is None else every
        self.clock = clock
        self.t0 = clock()
        self.last = None
        self.done = 0
        self.shown = False
        self._lock = threading.Lock()

    def add(self, n: int = 1, detail: str = "") -> None:
        """``n`` more units done."""
        with self._lock:
            self.done += n
            self._maybe_draw(detail, False)

    def update(self, done: int, detail: str = "", force: bool = False) -> None:
        """``done`` units done in all; ``force`` draws now (an enabled line, past the delay)."""
        with self._lock:
            self.done = done
            self._maybe_draw(detail, force)

    def line(self, detail: str = "") -> str:
        elapsed = self.clock() - self.t0
        frac = self.done / self.total if self.total else 1.0
        left = elapsed * (self.total - self.done) / self.done if self.done else None
        text = f"[{self.label}] {100 * frac:.1f} %"
        text += f" ({detail})" if detail else ""
        text += f", {duration(elapsed)} elapsed"
        text += f", about {duration(left)} left" if left is not None else ""
        return text

    def _maybe_draw(self, detail: str, force: bool) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if now - self.t0 < self.delay:
            return
        if not force and self.last is not None and now - self.last < self.every and self.done < self.total:
            return
        self.last = now
        if self.tty:
            self.stream.write("\r" + self.line(detail) + "\033[K")
        else:
            self.stream.write(self.line(detail) + "\n")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """End the line (a newline after a drawn terminal line)."""
        with self._lock:
            if self.shown and self.tty:
                self.stream.write("\n")
                self.stream.flush()
            self.shown = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
