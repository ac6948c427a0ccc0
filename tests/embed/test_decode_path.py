"""Which row source makes a slide's tiles: decided by one function, `decode_path`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tilestore.embed.produce import decode_path


def _reader(jpeg: bool, files: bool, chunk: int = 240):
    return SimpleNamespace(
        is_jpeg=jpeg,
        locations=lambda chunks: [] if files else None,
        chunk_h=chunk,
        chunk_w=chunk,
    )


@pytest.mark.parametrize(
    ("cuda", "decode", "jpeg", "nvjpeg", "processes", "files", "path"),
    [
        (False, "cpu", True, False, None, True, "cut"),  # no GPU: cut on CPU threads
        (False, "cpu", True, True, None, True, "cut"),  # (nvJPEG needs one)
        (True, "gpu", False, False, object(), True, "cut"),  # a zstd level: cut, even on CUDA
        (True, "gpu", True, True, object(), True, "nvjpeg"),
        (True, "both", True, True, object(), True, "both"),  # processes and nvJPEG
        (True, "both", True, True, object(), False, "nvjpeg"),  # no chunk files: nvJPEG alone
        (True, "both", True, True, None, True, "nvjpeg"),  # no decoder processes
        (True, "both", True, False, object(), True, "processes"),  # nvJPEG may not decode it
        (True, "cpu", True, False, object(), True, "processes"),  # chunk files the workers read
        (True, "cpu", True, False, object(), False, "threads"),  # chunks not on disk (in place)
        (True, "cpu", True, False, None, True, "threads"),  # no decoder processes started
    ],
)
def test_decode_path(cuda, decode, jpeg, nvjpeg, processes, files, path):
    settings = SimpleNamespace(cuda=cuda, decode=decode)
    assert decode_path(settings, _reader(jpeg, files), nvjpeg, processes) == path


@pytest.mark.parametrize(("chunk", "path"), [(240, "both"), (256, "both"), (512, "nvjpeg")])
def test_decode_both_leaves_large_chunks_to_the_engines(chunk, path):
    """A row of large chunks would take the few decoder processes seconds: the engines
    alone decode it (measured: 1,024 px chunks, ViT-S 0.69 of its ceiling vs 0.33)."""
    settings = SimpleNamespace(cuda=True, decode="both")
    assert decode_path(settings, _reader(True, True, chunk), True, object()) == path
