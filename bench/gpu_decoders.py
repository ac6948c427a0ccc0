"""GPU JPEG decoders the benchmarks compare with the engine's own (not used by tilestore).

`NvImageCodec`: NVIDIA's nvImageCodec on the GPU's JPEG engines only (its HW_GPU_ONLY
backend, which spreads a batch over every engine and parses on host threads of its own),
behind the engine's `tilestore.embed.nvjpeg.GpuJpeg` interface. On an H100 (bench/RESULTS.md,
"GPU JPEG engines") it decoded the copied store's 240 px chunks at 16,900 chunks/s alone
where our nvJPEG binding did 29,000, and fed ViT-S 0.39-0.43 of its ceiling where ours fed
0.52-0.57: tilestore does not use it. Needs `nvidia-nvimgcodec-cu13` and `nvidia-nvjpeg`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tilestore.embed.nvjpeglib import NvjpegError, NvjpegUnavailable, check_sizes
from tilestore.format.chunks import ChunkReader


class NvImageCodec:
    """nvImageCodec's JPEG engines: the chunks decoded as planes, stacked into one tensor
    per call on the caller's stream. RGB-coded chunks (Aperio's) read as coded
    (UNCHANGED), YCbCr ones converted to RGB. A chunk the engines cannot take fails the call
    as bad data."""

    name = "nvImageCodec, the JPEG engines"

    def __init__(self, device: torch.device, threads: int = 0) -> None:
        try:
            from nvidia import nvimgcodec
        except ImportError as exc:
            raise NvjpegUnavailable(f"nvImageCodec is not installed ({exc})") from None
        self.codec, self.device = nvimgcodec, device
        self.decoder = nvimgcodec.Decoder(
            device_id=device.index if device.index is not None else torch.cuda.current_device(),
            max_num_cpu_threads=threads,
            backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)],
        )

        def params(color, layout):
            return nvimgcodec.DecodeParams(
                apply_exif_orientation=False, color_spec=color, sample_format=layout
            )

        self.params = {  # by "convert to RGB"
            True: params(nvimgcodec.ColorSpec.SRGB, nvimgcodec.SampleFormat.P_RGB),
            False: params(nvimgcodec.ColorSpec.UNCHANGED, nvimgcodec.SampleFormat.P_UNCHANGED),
        }

    def decode(self, reader: ChunkReader, data: Sequence[bytes]) -> list[torch.Tensor]:
        data = check_sizes(data, reader.chunk_h, reader.chunk_w)
        if self.decoder is None:
            raise NvjpegError("nvImageCodec decoder used after close")
        stream = torch.cuda.current_stream(self.device)
        images = self.decoder.decode(
            [self.codec.CodeStream(d) for d in data],
            params=self.params[reader.color_space != "rgb"],
            cuda_stream=stream.cuda_stream,
        )
        failed = [i for i, image in enumerate(images) if image is None]
        if failed:
            raise NvjpegError(
                f"nvImageCodec could not decode {len(failed)} of {len(data)} chunks", status=4
            )
        planes = [torch.from_dlpack(image) for image in images]
        return list(torch.stack(planes).unbind(0)) if planes else []

    def close(self) -> None:
        self.decoder = None


def gpu_decoder(name: str):
    """A decoder class by name: tilestore's (`tilestore.embed.nvjpeg`) or one of this module's."""
    from tilestore.embed import nvjpeg

    return getattr(nvjpeg, name, None) or globals()[name]
