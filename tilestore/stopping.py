"""A stop asked of a long run from outside, taken where nothing computed is lost.

SIGUSR1 means "the time limit is near": what a SLURM job asks for with
``#SBATCH --signal=B:USR1@60`` (its batch script passing it on to `tilestore`;
docs/how-to/cohort-slurm.md). A run embedding batches (`tilestore.embed.runner`) takes it
at its next batch: the batch in flight is finished and written, the shard it belongs to
written even where it is only partly filled and its batches marked done, and the run stops
as an interrupted one does (exit 128 + SIGUSR1 = 138: `tilestore.cli.main`). Anywhere else
(loading the model, converting a slide) it stops at once, as SIGTERM does. SIGUSR2 is left
alone: one signal, one meaning.

The command's signal handler asks `ask_stop`; the engine marks the span where it can stop
at a batch (`at_batches`), checks `asked` between batches and records what it kept
(`kept`); the command says it (`kept_at_stop`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["TIME_LIMIT", "Stopped", "ask_stop", "asked", "at_batches", "kept", "kept_at_stop"]

TIME_LIMIT = signal.SIGUSR1  # "the time limit is near"

_lock = threading.Lock()
_runs = 0  # runs now inside `at_batches`
_asked: int | None = None  # the signal a stop was asked with
_kept: list[str] = []  # what the stopped runs kept, as they said it


class Stopped(KeyboardInterrupt):
    """Raised by a run at a batch once a stop was asked: every `finally` of an interrupted
    run runs (batches written, locks released), then the command says what was kept."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (TIME_LIMIT.name,)))  # the signal's name, as SIGTERM's


def ask_stop(signum: int) -> bool:
    """A stop is asked with `signum`: True where a run will take it at its next batch (the
    caller returns), False where none can (the caller interrupts at once)."""
    global _asked
    with _lock:
        _asked = signum
        return _runs > 0


def asked() -> bool:
    """Whether a stop at the next batch was asked."""
    return _asked is not None


@contextlib.contextmanager
def at_batches() -> Iterator[None]:
    """The span in which a run takes a stop at its next batch (`ask_stop` returns True)."""
    global _runs
    with _lock:
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1


def kept(line: str) -> None:
    """What a stopped run kept, in a line for the command to say."""
    _kept.append(line)


def kept_at_stop() -> list[str]:
    return list(_kept)


def reset() -> None:
    """Forget a stop asked (a test's, or a long-lived process running again)."""
    global _asked
    with _lock:
        _asked = None
        _kept.clear()
