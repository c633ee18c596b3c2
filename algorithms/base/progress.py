"""Progress of a long command, readable wherever its output goes.

On a terminal (or in Jupyter) it is a rich progress bar. Anywhere else (a log file, a pipe, CI,
`nohup`) a bar would stay invisible until the end, so it prints a plain line instead: at the
first update, then at most every `every_s` seconds, and at the last. Work that finishes in
batches (episodes generated together) can leave minutes without an update: a line then comes
every `every_s` seconds all the same, with the count unchanged and the time gone on.

    >>> import io
    >>> out = io.StringIO()
    >>> bar = Progress("train", total=4, stream=out, every_s=0)
    >>> bar.update(1, "reward=0.5"); bar.advance(); bar.close()
    >>> print(out.getvalue().split("\\n")[0].split(" elapsed")[0])
    train 1/4 (25%)
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """`update(completed, stats)` / `advance(n)` as work finishes; `close()` at the end.

    `completed` starts where a resumed run starts; the time left is estimated from the rate since
    this object was made, so a resumed run's earlier steps do not skew it, and shown once a tenth
    of the work is done (episodes finish in batches: the first one says little of the rest).
    `transient` bars vanish from a terminal when closed (plain lines stay: a log keeps them).
    """

    def __init__(self, label: str, total: int, completed: int = 0, *, transient: bool = False,
                 every_s: float = 30.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from rich.console import Console

        self.label, self.total, self.completed = label, total, completed
        self.every_s, self._clock = every_s, clock
        self._stream = stream or sys.stdout
        self._start, self._start_count = clock(), completed
        self._printed_at: float | None = None
        self._printed_count = completed
        self._stats = ""
        self._lock = threading.Lock()  # the heartbeat thread prints too
        self._stop = threading.Event()
        console = Console(file=self._stream)
        self._bar = None
        if console.is_terminal or console.is_jupyter:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
                                     console=console, transient=transient)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, completed=completed, stats="")
        elif every_s > 0:
            threading.Thread(target=_heartbeat, args=(weakref.ref(self), self._stop, every_s),
                             name=f"progress-{label}", daemon=True).start()

    def update(self, completed: int, stats: str = "") -> None:
        self.completed, self._stats = completed, stats
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, stats=stats)
            return
        with self._lock:
            now = self._clock()
            if self._printed_at is None or now - self._printed_at >= self.every_s or completed >= self.total:
                self._print(now)

    def advance(self, n: int = 1) -> None:
        self.update(self.completed + n, self._stats)

    def close(self) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            return
        with self._lock:
            if self.completed != self._printed_count:
                self._print(self._clock())  # the last word on where it stopped

    def _beat(self) -> float:
        """A line when none came for `every_s` seconds (the work goes on, no update says so);
        returns the seconds until the next one is due."""
        with self._lock:
            now = self._clock()
            quiet = now - (self._start if self._printed_at is None else self._printed_at)
            if quiet >= self.every_s and not self._stop.is_set():
                self._print(now)
                quiet = 0.0
        return min(max(self.every_s - quiet, self.every_s / 10), self.every_s)

    def _print(self, now: float) -> None:
        self._printed_at, self._printed_count = now, self.completed
        elapsed = now - self._start
        done = self.completed - self._start_count
        line = f"{self.label} {self.completed}/{self.total} ({100 * self.completed // max(self.total, 1)}%) " \
               f"elapsed {_duration(elapsed)}"
        # work that finishes in batches (episodes) gives no rate to trust until a tenth is done
        if done > 0 and done * 10 >= self.total - self._start_count and self.completed < self.total:
            line += f", left ~{_duration(elapsed / done * (self.total - self.completed))}"
        if self._stats:
            line += f"  {self._stats}"
        print(line, file=self._stream, flush=True)


def _heartbeat(progress: weakref.ref[Progress], stop: threading.Event, every_s: float) -> None:
    # a weak reference: a Progress dropped without `close()` ends its thread instead of keeping
    # itself alive through it
    wait = every_s
    while not stop.wait(wait):
        bar = progress()
        if bar is None:
            return
        try:
            wait = bar._beat()
        except (ValueError, OSError):  # its stream was closed under it (a finished test's capture)
            return
        del bar


__all__ = ["Progress"]
