"""Decoding store chunks on the GPU with nvJPEG, several grid rows per batched call.

Two decoders, one interface (`GpuJpeg`): our own binding of nvJPEG's batched decoder
(`tilestore.embed.nvjpeglib`, the GPU's JPEG engine where it has one), and torchvision's
`decode_jpeg`, used where no libnvjpeg can be loaded. Ours decodes on the caller's stream,
into one tensor per call, and reads RGB-coded chunks (Aperio's) as coded, where torchvision's
hardware path colour-converts them (wrongly: nvJPEG ignores their Adobe marker).

A batched call pays a fixed set-up and waits on the host, so `RowDecoder` decodes on a
thread and CUDA stream of its own, gathering the grid rows waiting for it until one call
holds about `group_chunks(...)` chunks, while the producer cuts the tiles of rows already
decoded. The consumer reads the decoded chunks on another stream: a chunk's memory may go to
a later decode only once the consumer's kernels that read it have run, so the consumer keeps
chunks it has done with until then (`tilestore.embed.rows.NvjpegRows.retire`, one event per row).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np
import torch

from tilestore.embed.nvjpeglib import BatchedDecoder, NvjpegUnavailable
from tilestore.embed.report import Span, no_span
from tilestore.format.chunks import ChunkReader

# Pixels one decode call aims for: 16.8 Mpx (256 chunks of 256 x 256), about 50 MB decoded.
GROUP_PIXELS = 256 * 256 * 256


def gpu_decodes(mode: str, reader: ChunkReader) -> bool:
    """Whether a slide's level is decoded with nvJPEG (alone or beside the CPU) under
    decode=`mode` (cpu, gpu or both, as `tilestore.embed.settings.resolve` resolved it):
    colour JPEG chunks only."""
    return mode in ("gpu", "both") and reader.is_jpeg and reader.channels == 3


def group_chunks(chunk_h: int, chunk_w: int) -> int:
    """Chunks one decode call gathers for chunks of this size."""
    return max(1, GROUP_PIXELS // (chunk_h * chunk_w))


class GpuJpeg(Protocol):
    """Decodes a store level's encoded chunks into (3, h, w) uint8 tensors on its device, on
    the calling thread's current CUDA stream (ready once that stream's work so far is)."""

    name: str

    def decode(self, reader: ChunkReader, data: Sequence[bytes]) -> list[torch.Tensor]: ...

    def close(self) -> None:
        """Release what the decoder holds on the GPU (it is not used again)."""


class OwnNvjpeg:
    """nvJPEG's batched decoder through `tilestore.embed.nvjpeglib`: one call, one output tensor."""

    def __init__(self, device: torch.device, hardware: bool = True) -> None:
        self.decoder = BatchedDecoder(device, hardware=hardware)
        self.engines = self.decoder.engines  # (JPEG engines, cores each); (0, 0): CUDA
        self.name = "nvJPEG, " + ("the JPEG engines" if self.decoder.hardware else "CUDA")

    def decode(self, reader: ChunkReader, data: Sequence[bytes]) -> list[torch.Tensor]:
        rgb = reader.color_space != "rgb"  # RGB-coded: the components as coded are R, G, B
        return list(self.decoder.decode(data, reader.chunk_h, reader.chunk_w, rgb).unbind(0))

    def close(self) -> None:
        self.decoder.close()


class TorchvisionNvjpeg:
    """torchvision's `decode_jpeg` on CUDA: one decode at a time per process (a lock), on an
    internal stream the current one is made to wait for."""

    name = "torchvision"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def close(self) -> None:
        """torchvision keeps its decoder for the process: nothing of ours to release."""

    def decode(self, reader: ChunkReader, data: Sequence[bytes]) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        # its hardware path decodes UNCHANGED as RGB: RGB-coded chunks come out wrong, which
        # `gpu_decode_agrees` catches before a slide is decoded this way
        mode = ImageReadMode.UNCHANGED if reader.color_space == "rgb" else ImageReadMode.RGB
        return decode_jpeg(_encoded(data), mode=mode, device=self.device)


# tried in order: the first that starts on the device decodes
GPU_DECODERS: tuple[type, ...] = (OwnNvjpeg, TorchvisionNvjpeg)


def open_decoder(device: torch.device, required: bool = True) -> GpuJpeg | None:
    """The first decoder of `GPU_DECODERS` that decodes a small JPEG on `device` (which also
    starts the JPEG engine now rather than at the first row). Where none can (a build
    without nvJPEG, as on ROCm), raise if `required`, else return None."""
    import imagecodecs

    tiny = imagecodecs.jpeg8_encode(np.zeros((16, 16, 3), np.uint8), level=90)
    reader = _Tiny()
    failures = []
    for kind in GPU_DECODERS:
        decoder = None
        try:
            decoder = kind(device)
            decoder.decode(reader, [tiny])
            torch.cuda.synchronize(device)
            return decoder
        except (RuntimeError, OSError) as exc:  # OSError: a libnvjpeg that will not load
            failures.append(f"{kind.__name__}: {exc}")
            if decoder is not None:  # started, but cannot decode: release what it holds
                decoder.close()
    if required:
        raise NvjpegUnavailable("no nvJPEG decoder works on this GPU (" + "; ".join(failures) + ")")
    return None


class _Tiny:
    """The reader facts `GpuJpeg.decode` uses, for open_decoder's 16 x 16 test image."""

    chunk_h = chunk_w = 16
    color_space = "ycbcr"


class GpuDecodeFailed(Exception):
    """nvJPEG could not decode a batch of a level's chunks. The producer decodes the rest of
    that slide on the CPU, which names a chunk that is bad; `decoder_fault` says the decoder
    failed rather than the data (nvJPEG is then not used again in the run)."""

    def __init__(self, where: str, cause: BaseException) -> None:
        super().__init__(f"{where}: {cause}")
        self.cause = cause
        self.decoder_fault = not (
            isinstance(cause, ValueError) or getattr(cause, "data_fault", False)
        )


def decode_gpu(
    decoder: GpuJpeg, reader: ChunkReader, data: Sequence[bytes | None], device: torch.device
) -> list[torch.Tensor]:
    """Decoded chunks as (c, h, w) uint8 CUDA tensors, with one batched call; chunks never
    written (None) are the level's background. GpuDecodeFailed where nvJPEG fails."""
    present = [d for d in data if d is not None]
    try:
        decoded = iter(decoder.decode(reader, present) if present else [])
    except (RuntimeError, ValueError) as exc:  # torchvision's and ours, streams or decoder
        raise GpuDecodeFailed(reader.where, exc) from exc
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
    decoder: GpuJpeg,
    reader: ChunkReader,
    coords: Sequence[tuple[int, int]],
    device: torch.device,
) -> float:
    """Mean |difference| between the GPU's and libjpeg's decode of a sample chunk.

    nvJPEG and libjpeg differ by rounding (well under 1 level on average); a decoder that
    colour-converted RGB-coded chunks would differ by tens of levels.
    """
    for coord in coords:
        (data,) = reader.fetch([coord])
        if data is not None:
            cpu = torch.from_numpy(np.ascontiguousarray(reader.decode(data, coord)))
            cpu = cpu.permute(2, 0, 1).float()
            gpu = decode_gpu(decoder, reader, [data], device)[0].float().cpu()
            return float((cpu - gpu).abs().mean())
    return 0.0


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
        span: Span = no_span,
    ) -> None:
        self._decode, self.group, self._span = decode, group, span
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._todo: queue.Queue = queue.Queue()
        self._closing = False
        self._failed: BaseException | None = None  # the first failed call's error
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
        if self._failed is not None:  # rows queued behind a failed call are not decoded:
            for *_, row in rows:  # the slide goes on without nvJPEG, which is not asked again
                row.set_exception(self._failed)
            return
        try:
            data = [d for _, fetched, _ in rows for d in fetched.result()]
        except BaseException as exc:  # a read failed: those rows fail, the decoder goes on
            for *_, row in rows:
                row.set_exception(exc)
            return
        try:
            with self._span("decode", "decode (nvJPEG)"):
                chunks = self._decode(data) if data else []
                ready = None
                if self._cuda:
                    ready = torch.cuda.Event()
                    ready.record(self._stream)
            self.calls.append(len(data))
        except BaseException as exc:  # each row's consumer raises it
            self._failed = exc
            for *_, row in rows:
                row.set_exception(exc)
            return
        at = 0
        for count, _, row in rows:
            row.set_result((chunks[at : at + count], ready))
            at += count
