"""Grid rows of decoded chunks on the GPU, ahead of the producer that cuts their tiles.

Four sources, one interface (`RowSource`): the producer asks for step i's new chunks with
`take(i)` and gets them as CUDA tensors, while the rows after it are read and decoded:

- `ProcessRows`: worker processes decode a row's chunk files (or, read in place, the slide's
  own tiles, by byte range) into shared memory, page-locked once the first batch is out, so
  a row goes to the GPU by DMA (local stores, slides read in place);
- `ThreadRows`: reader threads fetch and decoder threads decode (any store);
- `NvjpegRows`: reader threads fetch the encoded bytes and nvJPEG decodes several rows per
  call on a thread of its own (`tilestore.embed.nvjpeg.RowDecoder`);
- `BothRows`: the processes and nvJPEG side by side, each row to one of them.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import numpy as np
import torch

from tilestore.embed.assemble import decode_row_cpu
from tilestore.embed.nvjpeg import GpuJpeg, RowDecoder, decode_gpu, group_chunks
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.report import Span
from tilestore.embed.settings import Settings
from tilestore.format.chunks import ChunkReader
from tilestore.format.integrity import Located

Coords = list[tuple[int, int]]

# ProcessRows page-locks its blocks once this many batches' tiles have been cut from them, of
# one slide or of many small ones.
PIN_AFTER_BATCHES = 3
# ProcessRows asks a worker for at most this many pixels at a time (about 8 ms of decoding).
PART_PIXELS = 2_000_000
# ProcessRows decodes at most this many bytes of rows ahead (one row per worker if they fit).
AHEAD_BYTES = 1 << 30


class RowSource:
    """Reads and decodes the steps' new chunks in order, a bounded number of rows ahead."""

    def __init__(self, steps: Sequence, settings: Settings, span: Span):
        self.steps, self.device, self.span = steps, settings.device, span
        self._pending: dict[int, tuple[Coords, object]] = {}
        self._next = 0  # the first step not submitted yet
        self.threads = ThreadPoolExecutor(settings.readers, "tilestore-read")

    def take(self, index: int) -> tuple[Coords, list[torch.Tensor]]:
        """Step `index`'s new chunks (coords, (h, w, c) or (c, h, w) device tensors)."""
        while self._next < len(self.steps) and (self._next <= index or self._wants_more(index)):
            coords = [tuple(rc) for rc in self.steps[self._next].load.tolist()]
            pending = self._submit(self._next, coords) if coords else None
            self._pending[self._next] = (coords, pending)
            self._next += 1
        coords, pending = self._pending.pop(index)
        if not coords:
            return coords, []
        with self.span("wait_decode", "wait for decoded rows"):
            chunks = self._result(index, coords, pending)
        return coords, chunks

    @property
    def asked_all(self) -> bool:
        """Whether every step has been submitted (its rows read, or being read)."""
        return self._next == len(self.steps)

    def retire(self, chunks: list[torch.Tensor]) -> None:
        """Chunks the consumer stream has read for the last time (once its kernels run)."""

    def close(self) -> None:
        """Stop reading ahead; rows submitted and never taken are given up."""
        self.threads.shutdown(wait=True, cancel_futures=True)
        for coords, pending in self._pending.values():
            if coords:
                self._abandon(pending)
        self._pending.clear()

    def __enter__(self) -> RowSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wants_more(self, index: int) -> bool:
        raise NotImplementedError

    def _submit(self, index: int, coords: Coords) -> object:
        raise NotImplementedError

    def _result(self, index: int, coords: Coords, pending) -> list[torch.Tensor]:
        raise NotImplementedError

    def _abandon(self, pending) -> None:
        """Free what a row never taken holds."""


class ThreadRows(RowSource):
    """Fetch and decode on threads (imagecodecs frees the GIL); one pageable copy per row."""

    def __init__(self, steps, settings, span, reader: ChunkReader, decoders: Executor):
        super().__init__(steps, settings, span)
        self.reader, self.decoders, self.ahead = reader, decoders, settings.readers

    def _wants_more(self, index: int) -> bool:
        return self._next < index + self.ahead

    def _submit(self, index: int, coords: Coords) -> Future:
        return self.threads.submit(self._load, coords)

    def _load(self, coords: Coords) -> np.ndarray:
        with self.span("read_decode", "read + decode (threads)"):
            return decode_row_cpu(self.reader, coords, self.decoders)

    def _result(self, index, coords, pending: Future) -> list[torch.Tensor]:
        rows = torch.from_numpy(pending.result()).to(self.device, non_blocking=True)
        return list(rows.unbind(0))


class ProcessRows(RowSource):
    """Worker processes decode each row into a shared block; the row goes to the GPU by DMA.

    Rows are split into parts of about `PART_PIXELS` that idle workers take in order, so
    the row the producer waits for is the one decoded first, and every worker stays busy
    while rows are wanted. One whole row per worker left workers idle, later rows done,
    while the oldest was still decoding. Decoding alone on an H100 host (14 workers, two
    runs each, bench/results/ab-rows-parts-populate-h100.json), tiles/s from 240 px chunks:
    whole rows 18,800-24,100, parts 23,800-28,400, parts with the workers' mappings
    populated (`tilestore.embed.procdecode.decode_chunks`) 28,100-28,300; from 512 px chunks:
    10,300-10,400, 21,500-23,100 and 24,300-26,700.

    At most `AHEAD_BYTES` of rows are decoded ahead, so a wide slide holds fewer rows,
    not more memory; a narrower slide after it reads into the same blocks, fewer rows
    ahead, rather than making and page-locking new ones. The rows the first batch needs are
    split among all the workers, and the blocks are page-locked only once three batches'
    tiles are cut from them (of one slide, or of many small ones): each cudaHostRegister
    call holds CUDA's driver lock for ~30 ms, stalling the producer's copies and the GPU
    loop's launches. Started as the first batch's last row was taken, it held that batch's
    cut back 64 ms. On an H100 (ViT-S, a new engine each run,
    3 runs each, interleaved), the first batch came after 0.19-0.49 s that way and
    0.10-0.13 s when pinning starts after 3 batches, at the same tiles/s (medians 16,225
    and 16,333; measured when the count was a slide's own rows, not the tiles cut)."""

    def __init__(
        self,
        steps,
        settings,
        span,
        reader: ChunkReader,
        procs: ProcessDecoder,
        stop,
        early=False,
        located: list[Located] | None = None,
    ):
        super().__init__(steps, settings, span)
        batch = settings.batch_size
        self.reader, self.procs, self.stop = reader, procs, stop
        self.located = located  # each step's new chunks located where it was opened, or None
        self.shape = (reader.chunk_h, reader.chunk_w, reader.channels)
        workers = len(procs.workers)
        row_bytes = self.row_bytes(steps, reader)
        want = min(workers, max(2, AHEAD_BYTES // row_bytes))  # wide slides: fewer rows
        if not early:  # read before its turn: into the blocks there (`early_rows`)
            procs.reserve(want + 2, row_bytes, pin=True, least=4)  # 2 ahead, 2 being copied
        self.ahead = min(want, len(procs.blocks) - 2)
        tiles = np.cumsum([len(s.tiles) for s in steps])
        self.first_rows = int(np.searchsorted(tiles, batch)) + 1
        # a slide's first rows split among all the workers, unless its turn is not come
        self.first_parts = 1 if early else max(1, workers // self.first_rows)
        self.per_part = max(1, PART_PIXELS // (reader.chunk_h * reader.chunk_w))  # chunks
        self.pin_after = PIN_AFTER_BATCHES * batch  # tiles cut from the blocks, of any slides

    @staticmethod
    def row_bytes(steps, reader: ChunkReader) -> int:
        """The bytes of the largest step's new chunks: the size of a block it decodes into."""
        chunk = reader.chunk_h * reader.chunk_w * reader.channels
        return max((len(s.load) for s in steps), default=1) * chunk

    def submit_all(self) -> None:
        """Submit every step now (a slide read before its turn, `early_rows`)."""
        for index in range(self._next, len(self.steps)):
            coords = [tuple(rc) for rc in self.steps[index].load.tolist()]
            self._pending[index] = (coords, self._submit(index, coords) if coords else None)
        self._next = len(self.steps)

    def _wants_more(self, index: int) -> bool:
        return self._next < index + self.ahead

    def _submit(self, index: int, coords: Coords):
        parts = -(-len(coords) // self.per_part)
        if index < self.first_rows:
            parts = max(parts, self.first_parts)
        reader = self.reader
        if self.located is not None:  # made where the slide was opened
            located = self.located[index]
        else:
            located = Located.of(reader.locations(coords))
        return self.procs.submit(
            located,
            list(coords),
            self.shape,
            reader.background,
            self.stop,
            parts,
            checksum=reader.checksum,
            required=reader.every_chunk,
            where=reader.where,
            colorspace=reader.jpeg_colorspace,
            frame=reader.frame,
        )

    def _result(self, index, coords, pending) -> list[torch.Tensor]:
        block, parts = pending
        left = [i for part in parts for i in part.result()]
        view = self.procs.view(block, len(coords), self.shape)
        for i in left:  # a slide's tile not to be spliced: made by the level's reader
            self.reader.decode_into(self.reader.fetch_one(coords[i]), view[i], coords[i])
        rows = torch.from_numpy(view)
        on_device = rows.to(self.device, non_blocking=True)  # pinned: DMA
        copied = torch.cuda.Event()
        copied.record()
        self.procs.release(block, copied)  # reused once the copy is done
        self.procs.tiles_cut += len(self.steps[index].tiles)
        if self.procs.tiles_cut >= self.pin_after:
            # batches are queued: the GPU works through its stalls. Counted across slides: a
            # cohort of small slides (one step each) never reached a slide's third batch, so
            # every row went by a pageable copy, synchronous in the producer (issue 68)
            self.procs.start_pinning()
        return list(on_device.unbind(0))

    def _abandon(self, pending) -> None:
        block, parts = pending
        for part in parts:
            part.exception()  # finished (either way) before the block is reused
        self.procs.release(block)


def early_rows(
    steps, settings, span, reader: ChunkReader, procs: ProcessDecoder, stop, located=None
):
    """A slide's rows, every one asked of the decoder processes now, before its turn, if
    they fit in blocks free now (keeping two for the slide being cut): a small slide's
    decoding then runs beside the GPU's work on those before it. None where they do not
    fit: the slide's rows are then read when its turn comes, as any slide's.

    Only whole slides are read early, and only while the slide being cut has asked for all
    its rows, so no slide waits for a block that a later one holds."""
    if len(procs.blocks) < 4 or not steps:
        return None
    if procs.room(ProcessRows.row_bytes(steps, reader)) < len(steps) + 2:
        return None
    rows = ProcessRows(steps, settings, span, reader, procs, stop, early=True, located=located)
    try:
        rows.submit_all()
    except BaseException:  # its shard index, say: the blocks asked so far are given back
        rows.close()
        raise
    return rows


class NvjpegRows(RowSource):
    """Reader threads fetch the encoded chunks; nvJPEG decodes them, rows grouped per call.

    About three calls' worth of chunks are kept in flight: one being decoded, one gathering,
    one being fetched."""

    def __init__(self, steps, settings, span, reader: ChunkReader, decoder: GpuJpeg) -> None:
        super().__init__(steps, settings, span)
        self.reader = reader
        self.group = group_chunks(reader.chunk_h, reader.chunk_w)
        self._in_flight = 0  # chunks submitted and not taken yet
        device = settings.device
        self.decoder = RowDecoder(
            lambda data: decode_gpu(decoder, reader, data, device), self.group, device, span=span
        )
        self._retired: collections.deque = collections.deque()  # (event, chunks)
        self._consumer = torch.cuda.current_stream(device)  # the producer's, cutting tiles

    def retire(self, chunks: list[torch.Tensor]) -> None:
        """Keep the chunks until the consumer's kernels issued so far have run: nvJPEG
        writes later decodes on a stream of its own, unordered with the consumer's."""
        if chunks:
            done = torch.cuda.Event()
            done.record(self._consumer)
            self._retired.append((done, chunks))
        while self._retired and self._retired[0][0].query():
            self._retired.popleft()

    def close(self) -> None:
        super().close()  # no more fetches
        self.decoder.close()
        self._consumer.synchronize()  # what it reads, retired or not, is then free to reuse
        self._retired.clear()

    def _wants_more(self, index: int) -> bool:
        return self._in_flight < 3 * self.group

    def _submit(self, index: int, coords: Coords) -> Future:
        self._in_flight += len(coords)
        return self.decoder.submit(len(coords), self.threads.submit(self._fetch, coords))

    def _fetch(self, coords: Coords) -> list[bytes | None]:
        with self.span("read"):
            return self.reader.fetch(coords)

    def _result(self, index, coords, pending: Future) -> list[torch.Tensor]:
        chunks, ready = pending.result()
        self._in_flight -= len(coords)
        torch.cuda.current_stream(self.device).wait_event(ready)
        return chunks


class BothRows(RowSource):
    """The decoder processes and the GPU's JPEG engines decode rows side by side, for a job
    with too few CPUs to keep the model fed and a GPU whose engines alone do not either.

    Each row goes to the processes while they have room for it (`ProcessRows.ahead` rows),
    else to nvJPEG: the processes decode at the rate the job's CPUs allow, the engines take
    the rest. Rows come back in order either way, as (c, h, w) tensors (the processes' rows
    as views), so a slide's tiles are cut one way."""

    def __init__(
        self, steps, settings, span, reader: ChunkReader, procs: ProcessDecoder, stop, decoder
    ) -> None:
        super().__init__(steps, settings, span)
        self.cpu = ProcessRows(steps, settings, span, reader, procs, stop)
        self.gpu = NvjpegRows(steps, settings, span, reader, decoder)
        self._cpu_rows = 0  # rows with the processes, not taken yet
        self.rows = {"cpu": 0, "gpu": 0}  # rows each decoded

    def retire(self, chunks: list[torch.Tensor]) -> None:
        self.gpu.retire(chunks)  # the processes' rows are torch's: kept a little longer

    def close(self) -> None:
        try:
            super().close()  # abandons each row where it went
        finally:
            self.cpu.close()
            self.gpu.close()

    def _wants_more(self, index: int) -> bool:
        return self._cpu_rows < self.cpu.ahead or self.gpu._wants_more(index)

    def _submit(self, index: int, coords: Coords) -> tuple[RowSource, object]:
        source = self.cpu if self._cpu_rows < self.cpu.ahead else self.gpu
        if source is self.cpu:
            self._cpu_rows += 1
        self.rows["cpu" if source is self.cpu else "gpu"] += 1
        return source, source._submit(index, coords)

    def _result(self, index, coords, pending) -> list[torch.Tensor]:
        source, inner = pending
        chunks = source._result(index, coords, inner)
        if source is self.cpu:
            self._cpu_rows -= 1
            return [chunk.permute(2, 0, 1) for chunk in chunks]  # (h, w, c) -> (c, h, w)
        return chunks

    def _abandon(self, pending) -> None:
        source, inner = pending
        source._abandon(inner)
