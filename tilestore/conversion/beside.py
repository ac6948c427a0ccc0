"""The tissue mask made beside a conversion (`convert(..., tissue=...)`).

A store's levels are written coarse first (`converter.write_order`), so the level a mask reads
is there long before level 0, most of the bytes, is copied. The mask is computed on a thread
from that level as soon as it is written, through the store's record as it will be (its
levels, pixel size, channels and modality: what `compute_tissue` reads), and stored as
labels/tissue once the store's record is complete, before the store appears: the same mask,
bit for bit, that `compute_tissue` makes of the finished store, made while the slide copies.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from tilestore.errors import TilestoreError
from tilestore.masks.tissue import TissueMask, compute_tissue, levels_read, write_tissue
from tilestore.reading.slide import Slide


class TissueBeside:
    """One store's tissue mask: started once every level it reads is `written`, stored into
    the finished store by `store`. A mask that cannot be made (a TilestoreError: no level
    near its resolution...) is not stored: the plan makes it later and says why it cannot."""

    def __init__(self, method: str, slide: Slide) -> None:
        self._method, self._slide = method, slide
        self._waiting = set(levels_read(slide, method))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tilestore-tissue")
        self._future: Future[tuple[TissueMask | None, float]] | None = None

    def written(self, level: int) -> None:
        """Told by the conversion that a level can be read now."""
        self._waiting.discard(level)
        if not self._waiting and self._future is None:
            self._future = self._pool.submit(self._compute)

    def _compute(self) -> tuple[TissueMask | None, float]:
        started = time.perf_counter()
        try:
            mask = compute_tissue(self._slide, self._method)
        except TilestoreError:
            mask = None
        return mask, time.perf_counter() - started

    def store(self, finished: Slide) -> str | None:
        """Wait for the mask (started once the last level it reads was written) and store it
        in the finished store; what was done, in words."""
        mask, seconds = self._future.result()
        if mask is None:
            return None
        write_tissue(finished, mask)
        return (
            f"tissue mask computed ({mask.method}, {mask.polarity}) beside the conversion "
            f"in {seconds:.1f} s and stored"
        )

    def close(self) -> None:
        """Wait for a mask still being computed (a conversion that failed), unstored."""
        self._pool.shutdown(wait=True, cancel_futures=True)
