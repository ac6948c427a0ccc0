"""From store chunks to batches of tiles: decode on CPU threads and cut, row by row.

A plan's tiles lie on one lattice, so the chunks of a grid row (or of a small slide's
several rows) are stitched into one band and every tile in it is cut with a single strided
gather (``unfold`` + index): no Python loop over tiles, on the CPU or on the GPU. Batches
are exactly the plan's batches (block b holds tiles b*B .. b*B+B-1), which is what makes
resuming bitwise exact.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np
import torch

from tilestore.embed.buffers import SlotPool
from tilestore.embed.queues import Stopped
from tilestore.embed.report import Span
from tilestore.format.chunks import ChunkReader
from tilestore.plan.tiles import cut_tile


def decode_row_cpu(
    reader: ChunkReader, coords: Sequence[tuple[int, int]], pool: Executor
) -> np.ndarray:
    """Read and decode chunks on threads (one task each) into one (k, h, w, c) array, ready
    to copy to the GPU in one transfer (the GPU then cuts the tiles: no Python per tile)."""
    out = np.empty((len(coords), reader.chunk_h, reader.chunk_w, reader.channels), np.uint8)

    def one(i: int) -> None:
        reader.decode_into(reader.fetch_one(coords[i]), out[i], coords[i])

    list(pool.map(one, range(len(coords))))
    return out


def cut_tiles(
    cache: dict[tuple[int, int], torch.Tensor],
    ys: np.ndarray,
    xs: np.ndarray,
    read: int,
    stride: int,
    chunk: tuple[int, int],
    channels_first: bool,
) -> torch.Tensor:
    """Return the tiles at (ys[i], xs[i]): windows [y, y+read) x [x, x+read), in that order.

    The chunks the tiles span are stitched into one band (one concatenation per chunk row,
    one across them) and every tile gathered with one strided index: a handful of kernels
    for a grid row, or for the several rows of a small slide (`tilestore.plan.tiles.joined`).
    ys and xs must lie on one lattice of `stride`, as a plan's do. Chunks are (h, w, c), or
    (c, h, w) with channels_first (as nvJPEG decodes them); the tiles are (n, read, read, c)
    either way, so every batch has one layout (and a compiled model one graph). Chunks
    absent from the cache are covered by no tile and stand in as zeros.
    """
    ch, cw = chunk
    y0, x0 = int(ys.min()), int(xs.min())
    down, across = (ys - y0) // stride, (xs - x0) // stride
    if ((down * stride + y0) != ys).any() or ((across * stride + x0) != xs).any():
        raise ValueError(f"tiles off a lattice of stride {stride}: cannot be cut in one gather")
    r0, r1 = y0 // ch, (int(ys.max()) + read - 1) // ch
    c0, c1 = x0 // cw, (int(xs.max()) + read - 1) // cw
    sample = next(iter(cache.values()))
    blank = None
    along_x, along_y = (2, 1) if channels_first else (1, 0)
    bands = []
    for r in range(r0, r1 + 1):
        parts = []
        for c in range(c0, c1 + 1):
            part = cache.get((r, c))
            if part is None:
                blank = torch.zeros_like(sample) if blank is None else blank
                part = blank
            parts.append(part)
        bands.append(torch.cat(parts, dim=along_x) if len(parts) > 1 else parts[0])
    band = torch.cat(bands, dim=along_y) if len(bands) > 1 else bands[0]
    top, left = y0 - r0 * ch, x0 - c0 * cw
    # a pageable copy, but not a blocking one: the producer stream does not stall per step
    at = torch.from_numpy(np.stack([down, across])).to(band.device, non_blocking=True)
    if channels_first:  # (c, H, W) -> (c, ny, nx, read, read) -> (ny, nx, read, read, c)
        windows = band[:, top:, left:].unfold(1, read, stride).unfold(2, read, stride)
        windows = windows.permute(1, 2, 3, 4, 0)
    else:  # (H, W, c) -> (ny, nx, c, read, read) -> (ny, nx, read, read, c)
        windows = band[top:, left:].unfold(0, read, stride).unfold(1, read, stride)
        windows = windows.permute(0, 1, 3, 4, 2)
    return windows[at[0], at[1]]


@dataclass(frozen=True)
class Piece:
    """A plan batch's share of a model batch: rows [start, start + count) are its job's
    batch `block` (whole: a batch is the unit a run writes and resumes by)."""

    job: object
    block: int
    start: int
    count: int


@dataclass
class Batch:
    """One plan batch of uint8 tiles, on the host (pinned) or on the GPU; or, packed
    (`Packer`), the last, partial batches of several slides in one model batch (`parts`)."""

    job: object
    block: int
    count: int
    tiles: torch.Tensor  # (n, h, w, c) uint8
    ready: torch.cuda.Event | None = None  # GPU tiles: when the decode stream has made them
    slot: int | None = None  # host tiles: the pool slot to give back after the copy
    pool: SlotPool | None = None  # host tiles: the pool that slot belongs to
    parts: list[Piece] | None = None  # packed: each slide's batch in it, in row order

    def pieces(self) -> list[Piece]:
        """The plan batches this model batch holds, each with its rows."""
        if self.parts is not None:
            return self.parts
        return [Piece(self.job, self.block, 0, self.count)]


class CpuAssembler:
    """Decode and cut a plan's tiles on thread pools, emitting whole batches in plan order.

    One task per chunk reads and decodes it (imagecodecs frees the GIL); one task per
    (grid row, batch) segment waits for its chunks and copies each tile's pieces once,
    straight into a pinned batch buffer. The two kinds run on separate pools, so a cut never
    waits on work queued behind it. The calling thread keeps a window of segments in flight,
    completes them in order, drops chunks no later row needs, and emits each batch when its
    last tile is cut. Before waiting for a free buffer it completes what is in flight, so a
    buffer is never held by a batch whose tiles are queued behind the wait (no deadlock,
    however many batches a row spans).
    """

    def __init__(
        self,
        reader: ChunkReader,
        decoders: Executor,
        cutters: Executor,
        slots: SlotPool,
        window: int,
        span: Span,
    ) -> None:
        self.reader, self.decoders, self.cutters = reader, decoders, cutters
        self.slots, self.window, self.span = slots, window, span

    def run(
        self,
        job: object,
        plan,
        todo: np.ndarray,
        steps,
        batch: int,
        total: int,
        emit: Callable[[Batch], None],
        stop: threading.Event,
    ) -> None:
        read, chunk = plan.spec.read, (self.reader.chunk_h, self.reader.chunk_w)
        rows, cols = plan.chunk_rows, plan.chunk_cols
        chunks: dict[tuple[int, int], Future] = {}
        slots: dict[int, int] = {}  # batch -> slot holding its tiles
        left: dict[int, int] = {}  # batch -> tiles not cut yet
        flight: collections.deque = collections.deque()

        def finish_oldest() -> None:
            tiles, done, drop = flight.popleft()
            done.result()
            block = int(todo[tiles[0]]) // batch
            left[block] -= len(tiles)
            if left[block] == 0:
                slot = slots.pop(block)
                emit(
                    Batch(
                        job,
                        block,
                        min(batch, total - block * batch),
                        self.slots.buffers[slot],
                        slot=slot,
                        pool=self.slots,
                    )
                )
            for rc in drop:
                chunks.pop(rc, None)

        def slot_for(block: int) -> int:
            while (slot := self.slots.try_acquire()) is None:
                if not flight:
                    slot = self.slots.acquire(stop)
                    break
                finish_oldest()
            left[block] = min(batch, total - block * batch)
            return slot

        for step in steps:
            if stop.is_set():
                raise Stopped
            for rc in map(tuple, step.load.tolist()):
                chunks[rc] = self.decoders.submit(self._load, rc)
            blocks = todo[step.tiles] // batch
            segments = np.split(step.tiles, np.flatnonzero(np.diff(blocks)) + 1)
            for index, tiles in enumerate(segments):
                block = int(todo[tiles[0]]) // batch
                if block not in slots:
                    slots[block] = slot_for(block)
                needed = {
                    (r, c): chunks[(r, c)]
                    for k in tiles
                    for r in range(rows[k, 0], rows[k, 1] + 1)
                    for c in range(cols[k, 0], cols[k, 1] + 1)
                }
                done = self.cutters.submit(
                    self._cut,
                    needed,
                    plan.level_y[tiles],
                    plan.level_x[tiles],
                    read,
                    chunk,
                    self.slots.buffers[slots[block]],
                    todo[tiles] - block * batch,
                )
                drop = list(map(tuple, step.drop.tolist())) if index == len(segments) - 1 else []
                flight.append((tiles, done, drop))
            while len(flight) > self.window:
                finish_oldest()
        while flight:
            finish_oldest()

    def _load(self, coord: tuple[int, int]) -> np.ndarray:
        if not self.reader.is_jpeg:  # other codecs: zarr decodes with the array's own chain
            with self.span("read_decode", "read + decode (zarr)"):
                (pixels,) = self.reader.load([coord])
            return pixels
        with self.span("read"):
            data = self.reader.fetch_one(coord)
        with self.span("decode"):
            return self.reader.decode(data, coord)

    def _cut(
        self,
        needed: dict,
        ys: np.ndarray,
        xs: np.ndarray,
        read: int,
        chunk: tuple[int, int],
        buffer: torch.Tensor,
        offsets: np.ndarray,
    ) -> None:
        cache = {rc: future.result() for rc, future in needed.items()}
        with self.span("cut"):
            out = buffer.numpy()
            for y, x, offset in zip(ys.tolist(), xs.tolist(), offsets.tolist(), strict=True):
                cut_tile(cache, y, x, read, chunk, out[offset])


class BatchBuilder:
    """Collects a job's tiles in plan order and emits each plan batch when it is whole."""

    def __init__(
        self,
        job: object,
        batch_size: int,
        total: int,
        emit: Callable[[Batch], None],
        pool: SlotPool | None,
        device: torch.device,
        stop: threading.Event | None = None,
    ) -> None:
        self.job, self.size, self.total, self.emit, self.stop = job, batch_size, total, emit, stop
        self.pool, self.device = pool, device
        self.block, self.filled, self.buffer, self.slot = None, 0, None, None

    def add(
        self,
        indices: np.ndarray,
        tiles: torch.Tensor | Callable,
        tile_shape: tuple[int, ...] | None = None,
    ) -> None:
        """Add tiles with their global plan indices (ascending, whole batches only).

        tiles: a tensor of tiles, or fill(target, start, stop) writing tiles start..stop
        into target (tile_shape then gives their shape).
        """
        if callable(tiles):
            fill, shape = tiles, tile_shape
        else:
            shape = tiles.shape[1:]

            def fill(target: torch.Tensor, start: int, stop: int) -> None:
                target.copy_(tiles[start:stop], non_blocking=True)

        at = 0
        while at < len(indices):
            block = int(indices[at]) // self.size
            if block != self.block:
                self._open(block, shape)
            count = self._count(block)
            take = min(len(indices) - at, count - self.filled)
            fill(self.buffer[self.filled : self.filled + take], at, at + take)
            self.filled += take
            at += take
            if self.filled == count:
                self._close()

    def _count(self, block: int) -> int:
        return min(self.size, self.total - block * self.size)

    def _open(self, block: int, tile_shape: torch.Size) -> None:
        if self.buffer is not None:
            raise RuntimeError(f"batch {self.block} incomplete when batch {block} began")
        self.block, self.filled = block, 0
        if self.pool is not None:
            self.slot = self.pool.acquire(self.stop)
            self.buffer = self.pool.buffers[self.slot]
        else:
            self.buffer = torch.empty(
                (self.size, *tile_shape), dtype=torch.uint8, device=self.device
            )

    def _close(self) -> None:
        ready = None
        if self.device.type == "cuda" and self.pool is None:
            ready = torch.cuda.Event()
            ready.record()  # on the producer's (decode) stream
        self.emit(
            Batch(self.job, self.block, self.filled, self.buffer, ready, self.slot, self.pool)
        )
        self.block, self.filled, self.buffer, self.slot = None, 0, None, None
