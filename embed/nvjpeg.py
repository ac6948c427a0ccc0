"""Decoding store chunks on the GPU with nvJPEG (`torchvision.io.decode_jpeg`, batched).

torchvision runs one batched decode at a time (a process-wide lock) and waits for it on the
host; each call also pays a fixed set-up (headers parsed on the host, the batched decoder
initialised). So `RowDecoder` decodes on a thread and CUDA stream of its own, gathering
the grid rows waiting for it until one call holds about `group_chunks(...)` chunks, while
the producer cuts the tiles of rows already decoded.

torchvision writes the decoded images on its own internal stream, which no other stream is
ordered with: a decoded chunk's memory may go to a later decode only once the consumer's
kernels that read it have run, so the consumer keeps chunks it has done with until then
(`embed.rows.NvjpegRows.retire`). That costs one event per row, where marking every chunk
(`record_stream`) cost a torch call per chunk: each call releases the GIL and must win it
back, which beside the engine's other threads is what limits this decoder.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np
import torch

from tilestore.chunks import ChunkReader

# Pixels one decode call aims for: 16.8 Mpx (256 chunks of 256 x 256), about 50 MB decoded.
GROUP_PIXELS = 256 * 256 * 256

# nvJPEG's cost is mostly per image, not per pixel: on an H100 it decoded the same tissue
# in 256 px chunks at 1.3-1.9 Gpx/s and in 512 px chunks at 3.2-5.5 (bench/nvjpeg.py, two
# runs). From this chunk size on, `--decode auto` decodes a slide with nvJPEG, which then
# beat 14 CPU decoder processes (ViT-S 15,602 vs 10,779 tiles/s on a 512 px store).
AUTO_GPU_CHUNK_PIXELS = 512 * 512


def gpu_decodes(mode: str, reader: ChunkReader) -> bool:
    """Whether a slide's level is decoded with nvJPEG under --decode `mode` (cpu, gpu, auto)."""
    if not reader.is_jpeg or mode == "cpu":
        return False
    return mode == "gpu" or reader.chunk_h * reader.chunk_w >= AUTO_GPU_CHUNK_PIXELS


def group_chunks(chunk_h: int, chunk_w: int) -> int:
    """Chunks one decode call gathers for chunks of this size."""
    return max(1, GROUP_PIXELS // (chunk_h * chunk_w))


def decode_gpu(
    reader: ChunkReader, data: Sequence[bytes | None], device: torch.device
) -> list[torch.Tensor]:
    """Decoded chunks as (c, h, w) uint8 CUDA tensors, with one batched nvJPEG call.

    nvJPEG ignores the Adobe marker that says "no colour transform", so RGB-coded chunks
    (Aperio) are decoded as raw components (UNCHANGED), which for them are R, G, B.
    Runs on the calling thread's current CUDA stream; absent chunks are the background.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.UNCHANGED if reader.color_space == "rgb" else ImageReadMode.RGB
    present = [d for d in data if d is not None]
    decoded = iter(decode_jpeg(_encoded(present), mode=mode, device=device) if present else [])
    return [
        next(decoded)
        if d is not None
        else torch.full(
            (reader.channels, reader.chunk_h, reader.chunk_w),
            reader.background,
            dtype=torch.uint8,
            device=device,
        )
        for d in data
    ]


def _encoded(data: Sequence[bytes]) -> list[torch.Tensor]:
    """The streams as uint8 tensors: views of one buffer, so one copy for all of them."""
    joined = torch.frombuffer(bytearray().join(data), dtype=torch.uint8)
    return list(joined.split([len(d) for d in data]))


def gpu_decode_agrees(
    reader: ChunkReader, coords: Sequence[tuple[int, int]], device: torch.device
) -> float:
    """Mean |difference| between nvJPEG's and libjpeg's decode of a sample chunk.

    nvJPEG and libjpeg differ by rounding (well under 1 level on average); a decoder that
    ignored the Adobe marker of RGB-coded chunks would differ by tens of levels.
    """
    for coord in coords:
        (data,) = reader.fetch([coord])
        if data is not None:
            cpu = torch.from_numpy(np.ascontiguousarray(reader.decode(data)))
            cpu = cpu.permute(2, 0, 1).float()
            gpu = decode_gpu(reader, [data], device)[0].float().cpu()
            return float((cpu - gpu).abs().mean())
    return 0.0


def warm_up(device: torch.device, required: bool = True) -> bool:
    """Make torchvision's decoder now (the hardware backend takes a while to start), not at
    the first row of the first slide. Where it cannot run on this device (a build without
    nvJPEG, as on ROCm), raise if `required`, else return False."""
    from torchvision.io import decode_jpeg, encode_jpeg

    tiny = encode_jpeg(torch.zeros((3, 16, 16), dtype=torch.uint8))
    try:
        decode_jpeg([tiny], device=device)
        torch.cuda.synchronize(device)
    except RuntimeError:
        if required:
            raise
        return False
    return True


class RowDecoder:
    """Decodes grid rows' chunks, in the order submitted, several rows per nvJPEG call.

    decode(list of encoded chunks or None) -> decoded tensors runs on this decoder's own
    thread and stream. A row's future gives (its decoded chunks, a CUDA event); the
    consumer stream must wait for the event before it reads them, and keep them until its
    reads are done (see the module's note).
    """

    def __init__(
        self,
        decode: Callable[[list[bytes | None]], list[torch.Tensor]],
        group: int,
        device: torch.device,
        timed: Callable[[str, float], None] = lambda name, seconds: None,
    ) -> None:
        self._decode, self.group, self._timed = decode, group, timed
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._todo: queue.Queue = queue.Queue()
        self._closing = False
        self.calls: list[int] = []  # chunks per decode call
        self._thread = threading.Thread(target=self._loop, name="tilestore-nvjpeg", daemon=True)
        self._thread.start()

    def submit(self, count: int, fetched: Future) -> Future:
        """Decode a row of `count` chunks once `fetched` gives their encoded bytes."""
        row: Future = Future()
        self._todo.put((count, fetched, row))
        return row

    def close(self) -> None:
        """Stop after the call under way; rows not decoded yet are cancelled."""
        self._closing = True
        self._todo.put(None)
        self._thread.join()

    def __enter__(self) -> RowDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        with torch.cuda.stream(self._stream) if self._cuda else contextlib.nullcontext():
            last = False
            while not last:
                first = self._todo.get()
                if first is None:
                    return
                rows, total = [first], first[0]
                while total < self.group:
                    try:
                        item = self._todo.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        last = True
                        break
                    rows.append(item)
                    total += item[0]
                self._run(rows)

    def _run(self, rows: list[tuple[int, Future, Future]]) -> None:
        if self._closing:
            for *_, row in rows:
                row.cancel()
            return
        try:
            data = [d for _, fetched, _ in rows for d in fetched.result()]
            t0 = time.perf_counter()
            chunks = self._decode(data) if data else []
            ready = None
            if self._cuda:
                ready = torch.cuda.Event()
                ready.record(self._stream)
            self._timed("decode", time.perf_counter() - t0)
            self.calls.append(len(data))
        except BaseException as exc:  # each row's consumer raises it
            for *_, row in rows:
                row.set_exception(exc)
            return
        at = 0
        for count, _, row in rows:
            row.set_result((chunks[at : at + count], ready))
            at += count
