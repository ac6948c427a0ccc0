"""Many slides converted at once: each slide's conversion as `convert` does it, the slides
spread over worker processes (issue 68: 400 biopsies one after another left 15 of a node's
16 CPUs idle).

A conversion is the same call in a worker as in the caller, so its store is the same, bit
for bit, and so are its refusals: each slide's outcome (its report, or its error) comes back
in the order the slides were given.
"""

from __future__ import annotations

import builtins
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from tilestore.cpus import usable_cpus
from tilestore.errors import TilestoreError
from tilestore.options import Opt, checked
from tilestore.sources.remote import given, is_url
from tilestore.workers import Calls

AtOnce = Annotated[
    int | Literal["auto"],
    Opt(
        "Slides converted at once, each in a process of its own ('auto': one per CPU for "
        "small slide files, else one per 2 CPUs; no more than the slides).",
        low=1,
        high=1024,
        metavar="N|auto",
    ),
]


@dataclass(frozen=True)
class Converted:
    """One slide's outcome: its report, or the error that refused it (never both)."""

    source: Path
    series: str | None
    report: Any = None  # ConversionReport
    error: TilestoreError | None = None
    # the warnings its conversion gave in a worker, (class name, message), said again here
    warned: tuple[tuple[str, str], ...] = ()


# 'auto' converts a slide a CPU where the slide files are this small on average (a biopsy,
# a core, a crop): a small slide's conversion is one thread's work (CMU-1-Small-Region's:
# 0.28 s of CPU in 0.24 s here). 400 of them on 16 CPUs took 14.9-20.7 s a slide a CPU,
# 25.9 s a slide per 2 CPUs (bench/RESULTS.md, issue 68)
SMALL_SLIDE_BYTES = 32 * 2**20


def slides_at_once(
    slides: int,
    at_once: int | Literal["auto"] = "auto",
    cpus: int | None = None,
    sizes: Sequence[int | None] = (),
) -> int:
    """How many slides convert at once: as asked, or 'auto': a process for every CPU where
    the slide files' `sizes` (bytes; None: not known, a URL) are known and small on average
    (`SMALL_SLIDE_BYTES`), else one for every 2 CPUs (a larger slide's conversion keeps a
    second thread busy: its decoder or its mask beside); at most the number of slides and
    at least 1."""
    if at_once == "auto":
        cpus = cpus or usable_cpus()
        known = [size for size in sizes if size is not None]
        small = bool(sizes) and len(known) == len(sizes)
        small = small and sum(known) <= SMALL_SLIDE_BYTES * len(known)
        at_once = max(1, cpus if small else cpus // 2)
    return max(1, min(int(at_once), slides))


def file_sizes(paths: Sequence[str | os.PathLike]) -> list[int | None]:
    """Each slide file's size in bytes (`slides_at_once`); None for a URL or a path that
    cannot be read (its conversion says why)."""
    out: list[int | None] = []
    for path in paths:
        try:
            out.append(None if is_url(path) else os.stat(path).st_size)
        except OSError:
            out.append(None)
    return out


@checked
def convert_many(
    slides: list[tuple[str | os.PathLike, str | None]],
    output: Callable[[Path], str | os.PathLike],
    *,
    at_once: AtOnce = "auto",
    done: Callable[[Converted], None] | None = None,
    **options: Any,
) -> Iterator[Converted]:
    """Convert each (slide file, series) with `convert(**options)` into `output(slide)`,
    `at_once` slides at a time in worker processes (one at a time: here, in this process),
    yielding each slide's `Converted` in the order given. Each worker's conversion gets an
    equal share of the CPUs as its threads (`workers`), unless the options say.

    `done` hears each slide as it finishes (in any order): a cohort's progress line."""
    from tilestore.conversion.converter import convert

    count = slides_at_once(len(slides), at_once, sizes=file_sizes([p for p, _ in slides]))
    if count == 1:
        for path, series in slides:
            outcome = _convert_one(convert, given(path), series, output(given(path)), options)
            if done is not None:
                done(outcome)
            yield outcome
        return
    shared = dict(options)
    shared.setdefault("workers", max(1, usable_cpus() // count))
    shared.pop("progress", None)  # a chunk count per slide means nothing across processes
    calls = Calls(count)  # `python -m` workers: a caller's script is never imported again

    def one(path: Path, series: str | None) -> Converted:
        outcome = calls(_in_worker, path, series, output(path), shared)
        if done is not None:
            done(outcome)
        return outcome

    threads = ThreadPoolExecutor(count, "tilestore-convert")
    futures = [threads.submit(one, given(path), series) for path, series in slides]
    try:
        for future in futures:
            outcome = future.result()
            _said_again(outcome.warned)
            if isinstance(outcome.error, _Said):
                outcome = Converted(outcome.source, outcome.series, error=outcome.error.raised())
            yield outcome
    finally:  # stopped early (an interrupt): the slides not begun are not
        for future in futures:
            future.cancel()
        threads.shutdown(wait=False, cancel_futures=True)
        calls.close()


def _in_worker(
    path: Path, series: str | None, target: str | os.PathLike, options: dict[str, Any]
) -> Converted:
    from tilestore.conversion.converter import convert

    with warnings.catch_warnings(record=True) as caught:  # said by the caller, as its own
        warnings.simplefilter("always")
        outcome = _convert_one(convert, path, series, target, options)
    warned = tuple((w.category.__name__, str(w.message)) for w in caught)
    if outcome.error is not None:  # its class by name: not every error pickles with its args
        return Converted(
            path,
            series,
            error=_Said(type(outcome.error).__name__, str(outcome.error)),
            warned=warned,
        )
    return replace(outcome, warned=warned)


def _said_again(warned: tuple[tuple[str, str], ...]) -> None:
    """A worker's warnings, said in this process (where the command shows them its way)."""
    import tilestore.errors

    for kind, message in warned:
        category = getattr(tilestore.errors, kind, None) or getattr(builtins, kind, UserWarning)
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        warnings.warn(message, category, stacklevel=3)


@dataclass(frozen=True)
class _Said:
    """An error as a worker sends it back: its class's name and its line."""

    kind: str
    message: str

    def raised(self) -> TilestoreError:
        import tilestore.errors

        kind = getattr(tilestore.errors, self.kind, TilestoreError)
        try:
            return kind(self.message)
        except TypeError:  # a class made with more than its line
            return TilestoreError(self.message)


def _convert_one(
    convert: Callable[..., Any],
    path: Path,
    series: str | None,
    target: str | os.PathLike,
    options: dict[str, Any],
) -> Converted:
    try:
        return Converted(path, series, report=convert(path, target, series=series, **options))
    except TilestoreError as exc:
        return Converted(path, series, error=exc)
