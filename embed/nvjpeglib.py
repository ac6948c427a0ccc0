"""nvJPEG's batched decoder, driven through ctypes on the caller's CUDA stream.

Against torchvision's `decode_jpeg` on CUDA (H100, 64 chunks of 512 px per call, one
thread): the same pixels, 19,100-20,700 chunks/s alone where torchvision gave 16,600-17,900
(three probes); one output tensor per call from torch's caching allocator, made and written
on the caller's stream, where torchvision allocates per image and decodes on an internal
stream; no process-wide lock; and RGB-coded chunks (Aperio's, whose Adobe marker nvJPEG
ignores) read as coded, where torchvision's hardware path colour-converts them.

Neither escapes what limits nvJPEG beside a model: with the GPU kept full of the model's
work, each batched call waits on the host per image, and decodes fall to a few hundred
chunks/s (any backend, stream priority, pinned or device-side input, 1 to 8 decoders), while
a small kernel or copy on another stream still starts within 0.03 ms.

The library is the one torchvision ships (or NVIDIA's wheel, or the CUDA toolkit's).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from collections.abc import Sequence

import torch

from tilestore.format.jpeg import BASELINE_FRAMES, frame_header

# nvjpegBackend_t, nvjpegOutputFormat_t and nvjpegStatus_t (nvjpeg.h)
BACKEND_DEFAULT, BACKEND_HARDWARE = 0, 3
OUTPUT_YUV, OUTPUT_RGB = 1, 3
STATUS = {
    1: "not initialised",
    2: "invalid parameter",
    3: "bad JPEG",
    4: "JPEG not supported",
    5: "allocator failure",
    6: "execution failed",
    7: "architecture mismatch",
    8: "internal error",
    9: "implementation not supported",
    10: "incomplete bitstream",
}
MAX_COMPONENT = 4
ALLOCATOR_FAILURE = 5


class NvjpegImage(ctypes.Structure):
    """nvjpegImage_t: one plane pointer and pitch per component."""

    _fields_ = [
        ("channel", ctypes.c_void_p * MAX_COMPONENT),
        ("pitch", ctypes.c_size_t * MAX_COMPONENT),
    ]


class NvjpegUnavailable(RuntimeError):
    """No libnvjpeg found, or it cannot decode on this GPU."""


class NvjpegError(RuntimeError):
    """nvJPEG could not decode a batch: a bad or unsupported stream (status 3, 4), or the
    decoder itself failing (an allocator failure, an internal error: other statuses)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def data_fault(self) -> bool:
        """The streams' fault (bad or unsupported JPEG), not the decoder's."""
        return self.status in (3, 4)


def find_library() -> str | None:
    """Path of a libnvjpeg: torchvision's own copy, NVIDIA's pip wheel, or the system's."""
    import torchvision

    site = os.path.dirname(os.path.dirname(torchvision.__file__))
    for pattern in ("torchvision.libs/libnvjpeg*.so*", "nvidia/nvjpeg/lib/libnvjpeg.so*"):
        found = sorted(glob.glob(os.path.join(site, pattern)))
        if found:
            return found[0]
    return ctypes.util.find_library("nvjpeg")


def jpeg_size(data: bytes) -> tuple[int, int, int]:
    """(height, width, components) from a JPEG's frame header
    (`tilestore.format.jpeg.frame_header`). Only 8-bit baseline or extended Huffman frames:
    what the batched decoder writes as uint8."""
    frame = frame_header(data)
    if frame is None:
        raise ValueError("no JPEG frame header")
    marker, bits, height, width, components = frame
    if marker not in BASELINE_FRAMES:
        raise ValueError(f"JPEG frame type 0x{marker:02X} (not baseline Huffman)")
    if bits != 8:
        raise ValueError(f"JPEG samples of {bits} bits (not 8)")
    return height, width, components


def check_sizes(data: Sequence[bytes], height: int, width: int) -> list[bytes]:
    """The streams as bytes, each checked on its header to be a 3-component 8-bit baseline
    JPEG of exactly height x width (a GPU decoder writing into a tensor of that size would
    otherwise write past it). ValueError names what a stream is instead."""
    data = [d if isinstance(d, bytes) else bytes(d) for d in data]
    for d in data:
        size = jpeg_size(d)
        if size != (height, width, 3):
            raise ValueError(
                f"nvJPEG: a chunk is {size[0]} x {size[1]} px with {size[2]} components, "
                f"not {height} x {width} x 3"
            )
    return data


class BatchedDecoder:
    """Decodes lists of JPEG streams of one size into (n, 3, h, w) uint8 CUDA tensors.

    Uses the GPU's JPEG engine where it has one (A100, H100), else nvJPEG's CUDA decoder.
    `rgb`=False returns the streams' components as coded (no colour transform): for chunks
    coded in RGB (Aperio's, with an Adobe marker that nvJPEG ignores) those are R, G, B.
    rgb=False is for 4:4:4 streams (RGB-coded ones are). Threads take turns on one decoder.
    """

    def __init__(
        self, device: torch.device, library: str | None = None, hardware: bool = True
    ) -> None:
        path = library or find_library()
        if path is None:
            raise NvjpegUnavailable("no libnvjpeg found (torchvision's, NVIDIA's or the system's)")
        self.device = device
        self.lib = lib = ctypes.CDLL(path)
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        lib.nvjpegCreateEx.argtypes = [ctypes.c_int, ptr, ptr, ctypes.c_uint, ctypes.POINTER(ptr)]
        lib.nvjpegJpegStateCreate.argtypes = [ptr, ctypes.POINTER(ptr)]
        lib.nvjpegJpegStateDestroy.argtypes = [ptr]
        lib.nvjpegDestroy.argtypes = [ptr]
        lib.nvjpegDecodeBatchedInitialize.argtypes = [
            ptr,
            ptr,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.nvjpegDecodeBatched.argtypes = [
            ptr,
            ptr,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(size),
            ctypes.POINTER(NvjpegImage),
            ptr,
        ]
        with torch.cuda.device(device):
            self.handle, self.hardware = ptr(), hardware
            status = 1
            if hardware:
                status = lib.nvjpegCreateEx(
                    BACKEND_HARDWARE, None, None, 0, ctypes.byref(self.handle)
                )
            if status:  # no JPEG engine on this GPU (or not asked for): nvJPEG's CUDA decoder
                self.hardware = False
                status = lib.nvjpegCreateEx(
                    BACKEND_DEFAULT, None, None, 0, ctypes.byref(self.handle)
                )
            _check(status, "create a decoder", NvjpegUnavailable)
            self.state = ptr()
            status = lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state))
            _check(status, "create its state", NvjpegUnavailable)
        self.engines = self._engines() if self.hardware else (0, 0)
        self._batch: tuple[int, int] | None = None  # (count, output format) initialised for
        self._lock = threading.Lock()  # one decode at a time on the handle's state
        self._last: torch.cuda.Event | None = None  # the end of the last call's decode

    def _engines(self) -> tuple[int, int]:
        """(JPEG engines, cores per engine) nvJPEG reports on this GPU ((0, 0) where this
        libnvjpeg cannot tell: before CUDA 11.4). An H100 reports (7, 1)."""
        info = getattr(self.lib, "nvjpegGetHardwareDecoderInfo", None)
        if info is None:
            return 0, 0
        engines, cores = ctypes.c_uint(), ctypes.c_uint()
        count = ctypes.POINTER(ctypes.c_uint)
        info.argtypes = [ctypes.c_void_p, count, count]
        if info(self.handle, ctypes.byref(engines), ctypes.byref(cores)):
            return 0, 0
        return engines.value, cores.value

    def close(self) -> None:
        """Release the state and the handle (and the buffers nvJPEG holds for them) once the
        last decode is done; before, every Embedder's decoder stayed for the process's life
        (a Dask worker or a test process opens many)."""
        with self._lock:
            if self.handle is None:
                return
            if self._last is not None:
                self._last.synchronize()
            self.lib.nvjpegJpegStateDestroy(self.state)
            self.lib.nvjpegDestroy(self.handle)
            self.handle = self.state = None

    def decode(
        self, data: Sequence[bytes], height: int, width: int, rgb: bool = True
    ) -> torch.Tensor:
        """The streams decoded into one (n, 3, height, width) tensor, on the current stream.

        Every stream must be a 3-component baseline JPEG of exactly height x width (checked
        on its header: the decoder would otherwise write past the tensor)."""
        data = check_sizes(data, height, width)
        n = len(data)
        out = torch.empty((n, 3, height, width), dtype=torch.uint8, device=self.device)
        if not n:
            return out
        fmt = OUTPUT_RGB if rgb else OUTPUT_YUV
        images = (NvjpegImage * n)()
        base, plane = out.data_ptr(), height * width
        for i, image in enumerate(images):
            for c in range(3):
                image.channel[c] = base + (3 * i + c) * plane
                image.pitch[c] = width
        streams = (ctypes.c_char_p * n)(*data)
        lengths = (ctypes.c_size_t * n)(*map(len, data))
        current = torch.cuda.current_stream(self.device)
        with self._lock:
            if self.handle is None:
                raise NvjpegError("nvJPEG decoder used after close")
            # the state's buffers go to the next call only once the last call is done with
            # them: back to back, an H100 hung in the second call (one core spinning)
            if self._last is not None:
                self._last.synchronize()
            if self._batch != (n, fmt):
                status = self._with_room(
                    self.lib.nvjpegDecodeBatchedInitialize, self.handle, self.state, n, 1, fmt
                )
                self._check(status, "set up a batch")
                self._batch = (n, fmt)
            status = self._with_room(
                self.lib.nvjpegDecodeBatched,
                *(self.handle, self.state, streams, lengths, images, current.cuda_stream),
            )
            self._check(status, "decode a batch")
            self._last = torch.cuda.Event()
            self._last.record(current)
        return out

    def _with_room(self, call, *args) -> int:
        """`call(*args)`'s status, asked again once after torch's caching allocator gave
        back the blocks it keeps unused: nvJPEG allocates with cudaMalloc, and after a
        model's batches torch may hold most of the GPU (on an H100, a test process's late
        nvJPEG calls failed with "allocator failure" this way, whichever test came late)."""
        status = call(*args)
        if status == ALLOCATOR_FAILURE and torch.cuda.memory_reserved(self.device):
            torch.cuda.empty_cache()
            status = call(*args)
        return status

    def _check(self, status: int, doing: str) -> None:
        if status == ALLOCATOR_FAILURE:  # allocator statistics only: no CUDA call here, which
            # could report the failed cudaMalloc's error (seen on an H100) in place of nvJPEG's
            reserved = torch.cuda.memory_reserved(self.device) / 2**30
            doing += f" (torch holds {reserved:.1f} GiB of the GPU)"
        _check(status, doing, NvjpegError)


def _check(status: int, doing: str, error: type[RuntimeError]) -> None:
    if status:
        message = f"nvJPEG could not {doing}: {STATUS.get(status, 'error')} (status {status})"
        raise error(message, status) if error is NvjpegError else error(message)
