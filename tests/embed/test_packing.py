"""The Packer: small slides' partial batches packed into model batches, handed on in bundles of
one model batch each, every slide's start before its rows and its end after them."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embed.assemble import Batch
from tilestore.embed.buffers import SlotPool
from tilestore.embed.jobs import JobEnd, JobFailed, JobStart
from tilestore.embed.packing import BUNDLE_MOST, Bundle, Packer

SIZE = 8  # rows a model batch


class _Job:
    def __init__(self, name: int, tiles: int) -> None:
        self.name, self.todo = name, np.arange(tiles)


def _stream(sizes: list[int], fails: list[bool], pool: SlotPool) -> list[object]:
    """What the producer sends for slides of these many tiles: a start, its plan batches
    (each tile's value its slide and index), an end or a failure."""
    items: list[object] = []
    for name, (tiles, failed) in enumerate(zip(sizes, fails, strict=True)):
        job = _Job(name, tiles)
        items.append(JobStart(job))
        for block, first in enumerate(range(0, tiles, SIZE)):
            count = min(SIZE, tiles - first)
            slot = pool.acquire()
            buffer = pool.buffers[slot]
            buffer.zero_()
            buffer[:count, 0, 0, 0] = name
            buffer[:count, 0, 0, 1] = torch.arange(first, first + count, dtype=torch.uint8)
            items.append(Batch(job, block, count, buffer, None, slot, pool))
        items.append(JobFailed(job, None) if failed else JobEnd(job))
    return items


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3 * SIZE), st.booleans()), min_size=1, max_size=30),
)
def test_bundles_keep_each_slides_order_and_rows(slides):
    sizes = [tiles for tiles, _ in slides]
    fails = [failed for _, failed in slides]
    blocks = sum(-(-n // SIZE) for n in sizes)
    pool = SlotPool(blocks + 1, (SIZE, 1, 1, 3), pin=False)
    bundles: list[Bundle] = []
    packer = Packer(SIZE, bundles.append)
    for item in _stream(sizes, fails, pool):
        packer.put(item)
    packer.flush()

    flat = [item for bundle in bundles for item in bundle]
    assert all(isinstance(b, Bundle) and b for b in bundles)
    # at most one model batch a bundle, and it goes as soon as it is made
    for bundle in bundles:
        kinds = [isinstance(item, Batch) for item in bundle]
        assert sum(kinds) <= 1
        assert len(bundle) <= BUNDLE_MOST + SIZE  # the ends a batch releases ride with it
    rows: dict[int, list[tuple[int, int]]] = {}
    state: dict[int, str] = {}  # each slide: started, then rows, then ended
    for item in flat:
        if isinstance(item, JobStart):
            assert item.job.name not in state
            state[item.job.name] = "started"
            continue
        if isinstance(item, JobEnd | JobFailed):
            assert state.get(item.job.name) == "started"
            state[item.job.name] = "ended"
            continue
        assert item.count <= SIZE
        for piece in item.pieces():
            assert state.get(piece.job.name) == "started"  # after its start, before its end
            tiles = item.tiles[piece.start : piece.start + piece.count]
            assert (tiles[:, 0, 0, 0] == piece.job.name).all()  # rows where the piece says
            first = piece.block * SIZE
            expected = np.arange(first, first + piece.count)
            assert tiles[:, 0, 0, 1].numpy().tolist() == expected.tolist()
            rows.setdefault(piece.job.name, []).append((piece.block, piece.count))
    assert state == {name: "ended" for name in range(len(sizes))}
    for name, tiles in enumerate(sizes):  # every row of every slide, once
        assert sum(count for _, count in rows.get(name, [])) == tiles
        assert sorted(block for block, _ in rows.get(name, [])) == list(range(-(-tiles // SIZE)))


def test_before_the_first_batch_each_item_goes_at_once_then_a_bundle_a_batch():
    """The loop warms the model up at the first start: it is not held for the first batch.
    After it, forty slides of 2 tiles (four a model batch) go as ten bundles, not 120 items."""
    pool = SlotPool(41, (SIZE, 1, 1, 3), pin=False)
    bundles: list[Bundle] = []
    packer = Packer(SIZE, bundles.append)
    items = _stream([2] * 40, [False] * 40, pool)
    packer.put(items[0])
    assert bundles == [Bundle([items[0]])]
    for item in items[1:]:
        packer.put(item)
    packer.flush()
    # the first five starts (the fifth slide's rows open the second model batch) alone
    assert [len(b) for b in bundles[:5]] == [1] * 5
    assert all(isinstance(b[0], JobStart) for b in bundles[:5])
    assert [sum(isinstance(i, Batch) for i in b) for b in bundles[5:]] == [1] * 10
    assert len(bundles) == 15


def test_a_large_slides_end_goes_without_waiting_for_the_next_batch():
    pool = SlotPool(4, (SIZE, 1, 1, 3), pin=False)
    bundles: list[Bundle] = []
    packer = Packer(SIZE, bundles.append)
    for item in _stream([2 * SIZE], [False], pool):
        packer.put(item)
    assert isinstance(bundles[-1][-1], JobEnd)  # before any flush


def test_a_slide_of_a_model_batch_or_more_sends_its_start_at_once():
    """Its group is made while its tiles are read, not once its first batch is cut; a small
    slide's start waits for the model batch its rows will join."""
    pool = SlotPool(8, (SIZE, 1, 1, 3), pin=False)
    bundles: list[Bundle] = []
    packer = Packer(SIZE, bundles.append)
    for item in _stream([2] * 5, [False] * 5, pool):  # a batch out, the fifth slide's open
        packer.put(item)
    assert any(isinstance(i, Batch) for b in bundles for i in b)
    sent = len(bundles)
    (small,) = [i for i in _stream([2], [False], pool) if isinstance(i, JobStart)]
    packer.put(small)
    assert len(bundles) == sent
    (large,) = [i for i in _stream([3 * SIZE], [False], pool) if isinstance(i, JobStart)]
    packer.put(large)
    assert len(bundles) == sent + 1 and list(bundles[-1]) == [small, large]
