"""Model batches that span slides: the partial last batches of small slides packed together.

A slide's tiles go to the model in its plan batches (batch b holds tiles b*B .. b*B+B-1:
the unit a run writes, marks done and resumes by). A slide of 45 tiles is one partial batch;
the model still computes a whole batch of B rows for it (a compiled graph has one shape),
so a cohort of biopsies at B = 256 cost the GPU five times its tiles (issue 68). The
`Packer` stands between the producer and the GPU loop: whole batches pass as they are;
a partial batch is copied into a model batch with the partial batches of the slides after
it, as many as fit, each keeping its rows (`Piece`); a slide's `JobEnd` waits behind the
model batch that holds its last rows. Each row is computed as it would be alone (the model
sees one batch shape either way); only which rows share a batch changes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilestore.embed.assemble import Batch, Piece
from tilestore.embed.jobs import JobEnd, JobFailed

# the most starts and ends a bundle waits with for a batch (slides with nothing to compute)
BUNDLE_MOST = 64


class Bundle(tuple):
    """Items the GPU loop takes in order as one: at most one model batch, the starts before
    it and the ends after it."""


class Packer:
    """Takes the producer's items in order and hands them on (`put`) in bundles, packing
    partial batches of the same tile shape and place (GPU tiles, or host tiles of a pool)
    into shared model batches of `size` rows.

    A bundle goes once it holds a batch; before the run's first batch each item goes at
    once (the loop warms the model up at the first start); an end whose slide has no rows
    waiting takes the items before it along at once (a large slide's finish waits for no
    other slide's batch), and so does the start of a slide of a model batch or more (its group
    is made while its tiles are read)."""

    def __init__(self, size: int, put: Callable[[Bundle], None]) -> None:
        self.size, self._put = size, put
        self._open: Batch | None = None  # the model batch being packed
        self._held: list[object] = []  # JobEnds waiting behind it
        self._jobs: set[int] = set()  # the jobs with rows in it
        self._out: list[object] = []  # the next bundle, in order
        self._batches = 0  # batches handed on

    def put(self, item: object) -> None:
        """Take `item`: a whole batch at once, a partial batch into the open model batch
        (handed on once the next does not fit), a job's end once its rows are handed on."""
        job = getattr(item, "job", None)
        if isinstance(item, Batch) and item.parts is None and item.count < self.size:
            self._pack(item)
        elif isinstance(item, Batch):
            self._hand(item)
        elif job is not None and id(job) in self._jobs:
            self._held.append(item)  # its rows wait in the open batch: so does its end
        else:
            self._hand(item, now=isinstance(item, JobEnd | JobFailed) or not self._joins(job))

    def _joins(self, job: object) -> bool:
        """Whether a slide whose start comes now will be packed (fewer tiles than a model
        batch) while a packed batch is open: its start then waits for the next bundle. Any
        other slide's start goes at once, so its group is made while its tiles are read."""
        todo = getattr(job, "todo", None)
        return self._open is not None and todo is not None and len(todo) < self.size

    def flush(self) -> None:
        """Hand on the open model batch, the ends behind it and what waits with them (the
        producer's end)."""
        self._close()
        self._send()

    def _close(self) -> None:
        """The open model batch and the ends behind it into the bundle, which goes."""
        batch, held = self._open, self._held
        self._open, self._held, self._jobs = None, [], set()
        self._out.extend(([batch] if batch is not None else []) + held)
        if batch is not None:
            self._batches += 1
            self._send()

    def _hand(self, item: object, now: bool = False) -> None:
        self._out.append(item)
        if isinstance(item, Batch):
            self._batches += 1
            now = True
        if now or not self._batches or len(self._out) >= BUNDLE_MOST:
            self._send()

    def _send(self) -> None:
        if self._out:
            bundle, self._out = Bundle(self._out), []
            self._put(bundle)

    def _pack(self, batch: Batch) -> None:
        opened = self._open
        if opened is not None and not _fits(opened, batch, self.size):
            self._close()
            opened = None
        if opened is None:  # the first partial batch's tiles hold the model batch's rows
            piece = Piece(batch.job, batch.block, 0, batch.count)
            self._open = Batch(
                batch.job,
                batch.block,
                batch.count,
                batch.tiles,
                batch.ready,
                batch.slot,
                batch.pool,
                parts=[piece],
            )
            self._jobs.add(id(batch.job))
            return
        start = opened.count
        into = opened.tiles[start : start + batch.count]
        if batch.pool is None:  # on the GPU: after its tiles are made, on this stream
            stream = torch.cuda.current_stream(batch.tiles.device)
            if batch.ready is not None:
                stream.wait_event(batch.ready)
            into.copy_(batch.tiles[: batch.count], non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
            opened.ready = ready
        else:  # pinned host tiles: copied, and the slot given back to its pool
            into.copy_(batch.tiles[: batch.count])
            batch.pool.release(batch.slot)
        opened.parts.append(Piece(batch.job, batch.block, start, batch.count))
        opened.count += batch.count
        self._jobs.add(id(batch.job))


def _fits(opened: Batch, batch: Batch, size: int) -> bool:
    """Whether `batch` can join the model batch `opened`: rows left for it, tiles of one
    shape, and on the same side (the GPU, or the host)."""
    return (
        opened.count + batch.count <= size
        and opened.tiles.shape[1:] == batch.tiles.shape[1:]
        and opened.tiles.device == batch.tiles.device
        and (opened.pool is None) == (batch.pool is None)
    )
