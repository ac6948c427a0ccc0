"""The tissue mask made beside a conversion (`convert(..., tissue=...)`).

A store's levels are written coarse first (`converter.write_order`), so the level a mask reads
is there long before level 0, most of the bytes, is copied. The mask is computed from that
level as soon as it is written, through the store's record as it will be (its levels, pixel
size, channels and modality: what `compute_tissue` reads), and stored as labels/tissue once
the store's record is complete, before the store appears: the same mask, bit for bit, that
`compute_tissue` makes of the finished store, made while the slide copies.

Where: on a thread of the converting process, or, for a large mask beside a copy, in a
process of its own (`python -m tilestore.conversion.beside`, started with the conversion so
its imports are done by the time the level is written). A copy's threads hold the GIL for
each tile they copy and the mask's steps want it too, so beside a 100,000 px slide's copy the
mask took longer by a third, and the copy with it (bench/RESULTS.md, "A slide costs what its
model costs, eighth session"); in a process of its own it keeps its own time. A small mask is
over before a process would have started, a mask that reads the last level written has
nothing left to overlap, and in place the sidecar's work is short: those stay on the thread.
The process is in a session of its own (a Ctrl-C reaches the conversion, which stops it), is
killed when the conversion ends, and, dying before its answer is whole, leaves the mask to the
thread, which makes it the same.
"""

from __future__ import annotations

import base64
import contextlib
import json
import pickle
import subprocess
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tilestore import workers
from tilestore.errors import TilestoreError
from tilestore.masks.tissue import TissueMask, compute_tissue, levels_read, write_tissue
from tilestore.reading.slide import Slide

# a mask read from a level of at least this many pixels, beside a copy, is made in its own
# process: a 100,000 px slide's mask reads a level of 39 Mpx and takes ~2.5 s alone; one of
# 16 Mpx ~1 s, about what the process's start and a third more on the thread come to
PROCESS_PX = 1 << 24


class TissueBeside:
    """One store's tissue mask: started once every level it reads is `written`, stored into
    the finished store by `store`. A mask that cannot be made (a TilestoreError: no level
    near its resolution...) is not stored: the plan makes it later and says why it cannot.
    folder: where the levels are written as plain files (a copy's build folder), so that
    another process can read them; order: the order they are written in (`write_order`).
    A mask gets a process of its own only where both allow it (`_own_process`)."""

    def __init__(
        self, method: str, slide: Slide, folder: Path | None = None, order: Sequence[int] = ()
    ) -> None:
        self._method, self._slide = method, slide
        self._waiting = set(levels_read(slide, method))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tilestore-tissue")
        self._future: Future[tuple[TissueMask | None, float]] | None = None
        self._closing = False
        self._proc: subprocess.Popen | None = None
        self._request: str | None = None  # the process's one request, a JSON line
        if folder is not None and _own_process(slide, self._waiting, order):
            self._request = json.dumps(
                {
                    "folder": str(folder),
                    "record": slide.record.to_attrs(),
                    "name": slide.name,
                    "method": method,
                }
            )
            self._proc = workers.start("tilestore.conversion.beside", session=True)

    def written(self, level: int) -> None:
        """Told by the conversion that a level can be read now."""
        self._waiting.discard(level)
        if not self._waiting and self._future is None:
            self._future = self._pool.submit(self._in_process if self._proc else self._compute)

    def _compute(self) -> tuple[TissueMask | None, float]:
        started = time.perf_counter()
        try:
            mask = compute_tissue(self._slide, self._method)
        except TilestoreError:
            mask = None
        return mask, time.perf_counter() - started

    def _in_process(self) -> tuple[TissueMask | None, float]:
        """The mask from the process (asked, then waited for on this thread); a process that
        died before its answer was whole (killed, out of memory) leaves it to this thread."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # dead before it was asked: no answer
            proc.stdin.write(f"{self._request}\n")
            proc.stdin.flush()
        line = proc.stdout.readline()
        if self._closing:  # stopped by close(): the conversion failed
            return None, 0.0
        if not line.endswith("\n"):  # none, or cut short
            return self._compute()
        reply = json.loads(line)
        if "bug" in reply:
            raise RuntimeError(f"the tissue mask beside {self._slide.name} failed:\n{reply['bug']}")
        return _unpacked(reply)

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
        """Wait for a mask still being computed on the thread (a conversion that failed),
        unstored; the process, if any, is killed (idle, at work or still importing: it
        writes nothing, and a SIGTERM it may have been given to ignore would keep it) and
        has ended."""
        self._closing = True
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._proc is not None:
            for pipe in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(BrokenPipeError):  # stdin's last line unread
                    pipe.close()


def _own_process(slide: Slide, levels: set[int], order: Sequence[int]) -> bool:
    """Whether a mask reading these levels is made in a process of its own: their largest is
    at least `PROCESS_PX`, and each is written before the last level written (so that the
    mask overlaps that one; a mask reading every level, or the last, overlaps nothing)."""
    if not levels or not order or any(level not in order for level in levels):
        return False
    before_last = max(order.index(level) for level in levels) < len(order) - 1
    return before_last and _pixels(slide, levels) >= PROCESS_PX


def _pixels(slide: Slide, levels: set[int]) -> int:
    """Pixels (y * x) of the largest of these levels."""
    return max((slide.levels[i].shape[1] * slide.levels[i].shape[2] for i in levels), default=0)


def _packed(mask: TissueMask | None, seconds: float) -> dict[str, Any]:
    """A mask as a reply: its bits packed, the rest of it pickled (every field as it is)."""
    if mask is None:
        return {"mask": None, "seconds": seconds}
    bits = replace(mask, mask=np.packbits(mask.mask))
    body = pickle.dumps((bits, mask.mask.shape))
    return {"mask": base64.b64encode(body).decode("ascii"), "seconds": seconds}


def _unpacked(reply: dict[str, Any]) -> tuple[TissueMask | None, float]:
    """The mask and its seconds from a reply (`_packed`'s)."""
    if reply["mask"] is None:
        return None, reply["seconds"]
    bits, shape = pickle.loads(base64.b64decode(reply["mask"]))
    mask = np.unpackbits(bits.mask, count=int(np.prod(shape))).reshape(shape).astype(bool)
    return replace(bits, mask=mask), reply["seconds"]


def _answer(request: dict[str, Any]) -> str:
    """In the process: the mask of the build folder's levels, read by the record given (the
    folder's own is written last), or the traceback of a bug."""
    import zarr

    from tilestore.format.record import StoreRecord

    try:
        name = request["name"]
        group = zarr.open_group(request["folder"], mode="r", zarr_format=3, use_consolidated=False)
        slide = Slide(group, StoreRecord.parse(request["record"], name), name)
        started = time.perf_counter()
        try:
            mask = compute_tissue(slide, request["method"])
        except TilestoreError:
            mask = None
        return json.dumps(_packed(mask, time.perf_counter() - started))
    except Exception:
        return json.dumps({"bug": traceback.format_exc()})


if __name__ == "__main__":
    from scipy import ndimage  # noqa: F401  (what compute_tissue imports: before it is asked)

    workers.serve(_answer)
