"""Cutting tiles out of decoded chunks (a grid row, or a small slide's rows at once), and whole
plan batches in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embed.assemble import BatchBuilder, cut_tiles


@settings(max_examples=80, deadline=None)
@given(
    chunk=st.sampled_from([(32, 32), (40, 24), (64, 48)]),
    read=st.integers(8, 90),
    stride=st.integers(4, 70),
    first=st.tuples(st.integers(0, 6), st.integers(0, 40)),
    keep=st.lists(st.lists(st.booleans(), min_size=1, max_size=8), min_size=1, max_size=4),
    channels_first=st.booleans(),
)
def test_cut_tiles_equals_slicing(chunk, read, stride, first, keep, channels_first):
    """One grid row or several (a small slide's rows joined), tiles absent anywhere: each
    tile is its window of the image, in the order asked, whatever the chunks' layout."""
    ch, cw = chunk
    cells = [(first[0] + r, first[1] + c) for r, row in enumerate(keep) for c, k in enumerate(row)]
    cells = [cell for cell, k in zip(cells, [k for row in keep for k in row], strict=True) if k]
    cells = cells or [first]
    order = np.random.default_rng(len(cells)).permutation(len(cells))  # any order asked
    cells = [cells[i] for i in order]
    ys = np.array([r * stride for r, _ in cells])
    xs = np.array([c * stride for _, c in cells])
    height, width = int(ys.max()) + read + ch, int(xs.max()) + read + cw
    image = np.random.default_rng(read * stride).integers(0, 255, (height, width, 3), np.uint8)
    needed = {
        (r, c)
        for y, x in zip(ys.tolist(), xs.tolist(), strict=True)
        for r in range(y // ch, (y + read - 1) // ch + 1)
        for c in range(x // cw, (x + read - 1) // cw + 1)
    }
    cache = {}
    for r, c in needed:  # only the chunks some tile covers, as a schedule loads them
        block = np.zeros((ch, cw, 3), np.uint8)
        part = image[r * ch : (r + 1) * ch, c * cw : (c + 1) * cw]
        block[: part.shape[0], : part.shape[1]] = part
        tensor = torch.from_numpy(block)
        cache[(r, c)] = tensor.permute(2, 0, 1).contiguous() if channels_first else tensor
    tiles = cut_tiles(cache, ys, xs, read, stride, chunk, channels_first)
    want = np.stack([image[y : y + read, x : x + read] for y, x in zip(ys, xs, strict=True)])
    np.testing.assert_array_equal(tiles.numpy(), want)  # (n, read, read, c) either way


def test_cut_tiles_refuses_tiles_off_the_lattice():
    cache = {(0, 0): torch.zeros((64, 64, 3), dtype=torch.uint8)}
    with pytest.raises(ValueError, match="lattice of stride 16"):
        cut_tiles(cache, np.array([0, 8]), np.array([0, 16]), 16, 16, (64, 64), False)


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
