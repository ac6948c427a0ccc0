"""The run's --decode, as the GPU loop resolves it before any slide is read."""

from __future__ import annotations

import pytest

from embed import runner
from embed.runner import decode_mode
from tilestore.errors import TilestoreError


@pytest.mark.parametrize(
    ("option", "cuda", "nvjpeg", "cpus", "want"),
    [
        ("auto", False, True, 16, "cpu"),  # no GPU: nothing else can decode
        ("auto", False, True, 2, "cpu"),
        ("auto", True, True, 16, "auto"),  # decided per slide, by its chunk size
        ("auto", True, True, 3, "gpu"),  # too few CPUs to keep a GPU fed
        ("auto", True, False, 3, "cpu"),  # torchvision cannot decode on this GPU (ROCm)
        ("auto", True, False, 16, "cpu"),
        ("cpu", True, True, 3, "cpu"),  # as asked
        ("gpu", True, True, 16, "gpu"),
    ],
)
def test_decode_mode(monkeypatch, option, cuda, nvjpeg, cpus, want):
    monkeypatch.setattr(runner, "usable_cpus", lambda: cpus)
    assert decode_mode(option, cuda, nvjpeg) == want


def test_bad_decode_options_are_one_line_errors():
    with pytest.raises(TilestoreError, match=r"^--decode nvdec: choose auto, cpu or gpu$"):
        decode_mode("nvdec", True)
    with pytest.raises(TilestoreError, match=r"^--decode gpu needs a CUDA device$"):
        decode_mode("gpu", False)
