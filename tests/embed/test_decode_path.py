"""Which row source makes a slide's tiles: decided by one function, `decode_path`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tilestore.embed.produce import decode_path


def _reader(jpeg: bool, files: bool):
    return SimpleNamespace(is_jpeg=jpeg, locations=lambda chunks: [] if files else None)


@pytest.mark.parametrize(
    ("cuda", "jpeg", "nvjpeg", "processes", "files", "path"),
    [
        (False, True, False, None, True, "cut"),  # no GPU: cut on CPU threads
        (False, True, True, None, True, "cut"),  # (nvJPEG needs one)
        (True, False, False, object(), True, "cut"),  # a zstd level: cut, even on CUDA
        (True, True, True, object(), True, "nvjpeg"),
        (True, True, False, object(), True, "processes"),  # chunk files the workers read
        (True, True, False, object(), False, "threads"),  # chunks not on disk (in place)
        (True, True, False, None, True, "threads"),  # no decoder processes started
    ],
)
def test_decode_path(cuda, jpeg, nvjpeg, processes, files, path):
    settings = SimpleNamespace(cuda=cuda)
    assert decode_path(settings, _reader(jpeg, files), nvjpeg, processes) == path
