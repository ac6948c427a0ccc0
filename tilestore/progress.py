"""Progress as lines for a log (a SLURM job's output, nohup, a Dask script): every `every`
seconds, what is done, the rate and the time left, so a log shows a run is alive. The
command's progress bar falls back to it where stderr is not a terminal; the cohort runner
uses it as its own progress when it is given none."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["AtLeast", "LogLines", "to_stderr"]


class AtLeast(int):
    """A progress total still growing: the tiles known so far, with more to come from
    `stores` inputs not planned yet. Shown as "N+", with no time left guessed from it."""

    stores: int

    def __new__(cls, value: int, stores: int) -> AtLeast:
        made = super().__new__(cls, value)
        made.stores = stores
        return made


def to_stderr(line: str) -> None:
    """A line on stderr, now (a log file is block-buffered)."""
    print(line, file=sys.stderr, flush=True)


class LogLines:
    """Progress as lines: `update` takes what a rich Progress takes.

    status: more to say on each line (e.g. the workers alive). write: where lines go."""

    def __init__(
        self,
        label: str,
        every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        status: Callable[[], str] | None = None,
        write: Callable[[str], None] = to_stderr,
    ) -> None:
        self.label, self.every, self.clock = label, every, clock
        self.status, self.write = status, write
        self.done, self.total = 0, None
        self.started = self.last = clock()

    def update(self, task: int = 0, advance: int = 0, total: int | None = None) -> None:
        self.done += advance
        self.total = total if total is not None else self.total
        if self.clock() - self.last >= self.every:
            self._line()

    def say(self, line: str) -> None:
        """A line of what the job does (compiling, waiting for a compile), at once."""
        self.write(line)

    def __call__(self, advance: int, total: int | None) -> None:
        """As a `progress(n, total)` callback of the library's runs."""
        self.update(advance=advance, total=total)

    def finish(self) -> None:
        """The closing line, where the job was long enough to have had one before (a short
        one's result lines say all)."""
        if self.done and self.last > self.started:
            self._line()

    def _line(self) -> None:
        self.last = now = self.clock()
        seconds = now - self.started
        rate = self.done / seconds if seconds > 0 else 0.0
        growing = isinstance(self.total, AtLeast)
        of = f" of {self.total:,}{'+' if growing else ''}" if self.total else ""
        left = ""
        if self.total and rate and self.done < self.total and not growing:
            left = f", about {(self.total - self.done) / rate:,.0f} s left"
        if growing:
            left = f", {self.total.stores} store(s) not planned yet"
        more = f"; {self.status()}" if self.status else ""
        self.write(
            f"{self.label}: {self.done:,}{of} done in {seconds:,.0f} s ({rate:,.1f}/s){left}{more}"
        )
