"""What `embed` is given: stores as they are, and source slides, converted on the way in.

A slide file (SVS, NDPI, DICOM, ...) becomes a store in the staging folder first, by the
same conversion as `tilestore convert` (JPEG tiles copied where they can be). Conversions
run on one background thread, one slide ahead of the engine: the next slide is converted
while the GPU embeds the current one, so a cohort given as slides costs its conversions
only once, at the start. A slide whose store is already there (a complete store of a source
with the same name and size: an earlier run, or one killed after converting) is not
converted again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tilestore.conversion import convert
from tilestore.errors import StoreError, TilestoreError
from tilestore.slide import open_slide
from tilestore.store import is_store, store_name


@dataclass(frozen=True)
class Staged:
    """One input as the engine takes it: a store, or why it could not become one."""

    given: Path
    store: Path | None
    converted: dict | None = None  # {slide, store, seconds, levels: "copy"/"re-encode"...}
    error: TilestoreError | None = None


def as_staged(stores: Iterable[str | os.PathLike] | Stager) -> Iterable[Staged]:
    """Staged items for a Stager, or for a list of store paths (taken as they are)."""
    if isinstance(stores, Stager):
        return stores
    return [Staged(Path(s), Path(s)) for s in stores]


class Stager:
    """Each input in order as a `Staged` store: stores as given, slides converted into
    `into` on a background thread, `ahead` slides before they are asked for. The first
    conversions start when the Stager is made, so they overlap the model's loading."""

    def __init__(self, inputs: list[Path], into: Path, ahead: int = 1) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="stage")
        self._queue = iter(map(Path, inputs))
        self._pending: list[tuple[Path, Future | None]] = []
        self._into, self._ahead = into, ahead
        self._refill()

    def _refill(self) -> None:
        while sum(f is not None for _, f in self._pending) < self._ahead + 1:
            path = next(self._queue, None)
            if path is None:
                return
            slide = not is_store(path) and path.exists()  # a missing path fails as a store
            future = self._pool.submit(_convert, path, self._into) if slide else None
            self._pending.append((path, future))

    def __iter__(self) -> Iterator[Staged]:
        try:
            while self._pending:
                self._refill()  # `ahead` slides convert while this one is embedded
                path, future = self._pending.pop(0)
                yield Staged(path, path) if future is None else future.result()
        finally:
            self.close()

    def close(self) -> None:
        """Stop: conversions not started are dropped; one running finishes (its store is
        complete or absent, never partial)."""
        for _, future in self._pending:
            if future is not None:
                future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)


def _convert(slide: Path, into: Path) -> Staged:
    target = into / store_name(slide)
    try:
        if is_store(target):
            _check_reusable(target, slide)
            return Staged(
                slide, target, {"slide": str(slide), "store": str(target), "reused": True}
            )
        started = time.perf_counter()
        report = convert(slide, target)
        paths = sorted({level.write for level in report.levels})
        return Staged(
            slide,
            report.store,
            {
                "slide": str(slide),
                "store": str(report.store),
                "seconds": round(time.perf_counter() - started, 3),
                "codec": report.codec,
                "levels": paths,
            },
        )
    except TilestoreError as exc:
        return Staged(slide, None, error=exc)


def _check_reusable(target: Path, slide: Path) -> None:
    """A store already at the target may stand for the slide only if it is complete and was
    made from a file of the same name and size; anything else is an error, never reused."""
    source = open_slide(target).attrs.get("source", {})  # StoreError if incomplete
    size = slide.stat().st_size if slide.is_file() else None
    if source.get("name") != slide.name or (size is not None and source.get("size") != size):
        raise StoreError(
            f"{target}: already holds another slide ({source.get('name')}, "
            f"{source.get('size')} bytes), not {slide.name}; move it or choose another "
            "--into folder"
        )
