"""tilestore.embed.primer: CUDA set up on a thread while the run imports, deciding nothing."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from tilestore.embed import primed
from tilestore.embed.settings import resolve_device
from tilestore.errors import TilestoreError


def _primer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tilestore-gpu-primer"]


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda:7", "tpu", "cuda:x"])
def test_the_primer_never_raises_and_is_joined_when_its_block_ends(device):
    """A device the run refuses (none visible, a misspelling) is left to the run, which says
    why (the primer must not swallow that: the same call still raises); its thread has ended
    when the block does."""
    with primed(device, "auto"):
        pass
    assert not _primer_threads()
    try:
        resolve_device(device, "auto")
    except TilestoreError as exc:
        assert device in str(exc)


def test_an_error_in_the_block_comes_out_and_the_thread_is_still_joined():
    with pytest.raises(ValueError, match="in the block"), primed("auto", "auto"):
        raise ValueError("in the block")
    assert not _primer_threads()


PROBE = """
import sys, torch
from tilestore.embed import primed
with primed(sys.argv[1], "auto"):
    pass
print(torch.cuda.is_initialized())
"""


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cuda_is_set_up_by_the_primer_only_where_the_run_would_use_it(device):
    """In a fresh process: after the block, CUDA's context is made exactly where the run
    resolves a CUDA device (device auto on a GPU machine), and never for the CPU."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, device], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    wanted = device == "auto" and torch.cuda.is_available()
    assert out == str(wanted)
