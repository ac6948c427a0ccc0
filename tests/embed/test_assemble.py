"""Cutting a grid row of tiles out of decoded chunks, and whole plan batches in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embed.assemble import BatchBuilder, cut_row


@settings(max_examples=60, deadline=None)
@given(
    chunk=st.sampled_from([(32, 32), (40, 24), (64, 48)]),
    read=st.integers(8, 90),
    stride=st.integers(4, 70),
    y=st.integers(0, 100),
    first=st.integers(0, 40),
    keep=st.lists(st.booleans(), min_size=1, max_size=12),
    channels_first=st.booleans(),
)
def test_cut_row_equals_slicing(chunk, read, stride, y, first, keep, channels_first):
    ch, cw = chunk
    cols = [first + i for i, k in enumerate(keep) if k] or [first]
    xs = np.array([c * stride for c in cols])
    height = y + read + ch
    width = int(xs[-1]) + read + cw
    image = np.random.default_rng(read * stride).integers(0, 255, (height, width, 3), np.uint8)
    cache = {}
    for r in range(height // ch + 1):
        for c in range(width // cw + 1):
            block = np.zeros((ch, cw, 3), np.uint8)
            part = image[r * ch : (r + 1) * ch, c * cw : (c + 1) * cw]
            block[: part.shape[0], : part.shape[1]] = part
            tensor = torch.from_numpy(block)
            cache[(r, c)] = tensor.permute(2, 0, 1).contiguous() if channels_first else tensor
    tiles = cut_row(cache, y, xs, read, stride, chunk, channels_first)
    want = np.stack([image[y : y + read, x : x + read] for x in xs])
    got = tiles.numpy()  # (n, read, read, c) whatever the chunks' layout
    np.testing.assert_array_equal(got, want)


def _tiles(indices):
    return torch.as_tensor(indices, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 2, 2, 3)


def _builder(emitted, total=10):
    return BatchBuilder("job", 4, total, emitted.append, None, torch.device("cpu"))


def test_builder_emits_whole_plan_batches_in_order():
    emitted = []
    builder = _builder(emitted)
    for part in (range(0, 3), range(3, 7), range(7, 10)):  # rows of 3, 4, 3 tiles
        builder.add(np.array(part), _tiles(list(part)))
    assert [(b.block, b.count) for b in emitted] == [(0, 4), (1, 4), (2, 2)]
    assert [b.tiles[: b.count, 0, 0, 0].tolist() for b in emitted] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
    ]


def test_builder_on_resume_skips_done_batches():
    emitted = []
    builder = _builder(emitted)
    builder.add(np.array([0, 1, 2, 3, 8]), _tiles([0, 1, 2, 3, 8]))  # batch 1 was done
    builder.add(np.array([9]), _tiles([9]))
    assert [(b.block, b.count) for b in emitted] == [(0, 4), (2, 2)]
    assert emitted[1].tiles[:2, 0, 0, 0].tolist() == [8, 9]


def test_builder_refuses_a_batch_with_tiles_missing():
    builder = _builder([])
    builder.add(np.array([0, 1]), _tiles([0, 1]))
    with pytest.raises(RuntimeError, match="batch 0 incomplete"):
        builder.add(np.array([4]), _tiles([4]))
